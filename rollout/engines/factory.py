"""Building an engine from its config: the backend's registered class (:data:`~memrl.rollout.engines.base.ENGINES`;
a built-in backend's module, with its heavy dependencies, is imported when it is first built)."""

from __future__ import annotations

import inspect

from memrl.data.schemas import ScriptedPolicy
from memrl.rollout.engines.base import Engine, engine_registration
from memrl.rollout.engines.config import EngineConfig
from memrl.rollout.engines.sticky import StickyEngine

__all__ = ["build_engine", "build_sticky_engine"]


def build_engine(cfg: EngineConfig, policy: ScriptedPolicy | None = None) -> Engine:
    """Build the engine ``cfg`` describes (its backend's registered class, :data:`~memrl.rollout.engines.base.ENGINES`);
    ``policy`` supplies the scripted backend's agent programmatically."""
    engine_class = engine_registration(cfg.backend).obj
    takes_policy = "policy" in inspect.signature(engine_class.from_config).parameters
    if policy is not None and not takes_policy:
        raise ValueError(f"a policy object only applies to the scripted backend, not {cfg.backend!r}")
    if cfg.backend in ("vllm", "hf") and cfg.model:
        from memrl.data.checks import check_model_ref

        check_model_ref(cfg.model, f"engine {cfg.engine_name}: model")  # a missing path is named, never sent to the hub
    return engine_class.from_config(cfg, policy) if takes_policy else engine_class.from_config(cfg)


def build_sticky_engine(cfg: EngineConfig) -> Engine:
    """:func:`build_engine`, except that an ``openai`` engine with several endpoints becomes a :class:`StickyEngine`
    of one engine per endpoint (the per-endpoint client settings are kept)."""
    if cfg.backend != "openai" or len(cfg.endpoints) < 2:
        return build_engine(cfg)
    engines = [build_engine(cfg.model_copy(update={"endpoints": [endpoint]})) for endpoint in cfg.endpoints]
    return StickyEngine(engines, cfg.engine_name)
