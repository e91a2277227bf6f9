"""Building an engine from its config: the one place that knows every backend (each imports its heavy dependencies
only when built), so a backend module never imports this one and the config module imports none of them."""

from __future__ import annotations

from memrl.data.schemas import ScriptedPolicy
from memrl.rollout.engines.base import Engine
from memrl.rollout.engines.config import EngineConfig, load_scripted_policy
from memrl.rollout.engines.sticky import StickyEngine

__all__ = ["build_engine", "build_sticky_engine"]


def build_engine(cfg: EngineConfig, policy: ScriptedPolicy | None = None) -> Engine:
    """Build the engine ``cfg`` describes; ``policy`` supplies the scripted backend's agent programmatically."""
    if cfg.backend == "scripted":
        from memrl.rollout.engines.scripted import ScriptedEngine

        if policy is None:
            if not cfg.scripted_policy:
                raise ValueError("backend 'scripted' needs 'scripted_policy' in the config or a policy argument")
            policy = load_scripted_policy(cfg.scripted_policy, cfg.scripted_kwargs)
        return ScriptedEngine.from_config(cfg, policy)
    if policy is not None:
        raise ValueError(f"a policy object only applies to the scripted backend, not {cfg.backend!r}")
    if cfg.backend in ("vllm", "hf") and cfg.model:
        from memrl.data.checks import check_model_ref

        check_model_ref(cfg.model, f"engine {cfg.engine_name}: model")  # a missing path is named, never sent to the hub
    if cfg.backend == "vllm":
        from memrl.rollout.engines.vllm_engine import VLLMEngine

        return VLLMEngine.from_config(cfg)
    if cfg.backend == "hf":
        from memrl.rollout.engines.hf_engine import HFEngine

        return HFEngine.from_config(cfg)
    from memrl.rollout.engines.openai_engine import OpenAIEngine

    return OpenAIEngine.from_config(cfg)


def build_sticky_engine(cfg: EngineConfig) -> Engine:
    """:func:`build_engine`, except that an ``openai`` engine with several endpoints becomes a :class:`StickyEngine`
    of one engine per endpoint (the per-endpoint client settings are kept)."""
    if cfg.backend != "openai" or len(cfg.endpoints) < 2:
        return build_engine(cfg)
    engines = [build_engine(cfg.model_copy(update={"endpoints": [endpoint]})) for endpoint in cfg.endpoints]
    return StickyEngine(engines, cfg.engine_name)
