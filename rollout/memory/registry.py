"""Every memory system by name: one open config type (:data:`MemoryConfig`: the config model of the system a mapping
names) and one factory (:func:`build_memory`), so a YAML ``memory: {name: sam, page_tokens: 512}`` selects and
configures a registered system and ``memory: {entry: "mypkg.memory:Notes", window: 4}`` a user's.

Systems register with ``@register_memory(name, config=...)`` (:mod:`memrl.rollout.memory.base`); the built-ins are
``sam``, ``long_context``, ``bm25``, ``embedding``, ``mage``, ``memma``, ``ama_agent`` and ``proactive``, plus
``external`` (the sampling of an episode function's or an HTTP agent's own memory calls); importing this module
registers them all.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

from pydantic import BeforeValidator

from memrl.data.config import ConfigModel
from memrl.data.registry import ComponentError, Registration, is_entry
from memrl.rollout.memory import ama_agent as _ama_agent  # noqa: F401 - registers ama_agent
from memrl.rollout.memory import baselines as _baselines  # noqa: F401 - registers long_context, bm25, embedding
from memrl.rollout.memory import external as _external  # noqa: F401 - registers external
from memrl.rollout.memory import mage as _mage  # noqa: F401 - registers mage
from memrl.rollout.memory import memma as _memma  # noqa: F401 - registers memma
from memrl.rollout.memory import proactive as _proactive  # noqa: F401 - registers proactive
from memrl.rollout.memory import sam as _sam  # noqa: F401 - registers sam
from memrl.rollout.memory.ama_agent import AMAConfig
from memrl.rollout.memory.base import MEMORY_SYSTEMS, MemoryConfigBase, MemorySystem, register_memory
from memrl.rollout.memory.embedders import Embedder
from memrl.rollout.memory.mage import MageConfig
from memrl.rollout.memory.memma import MemMAConfig
from memrl.rollout.memory.sam import TokenCounter

__all__ = [
    "MEMORY_SYSTEMS",
    "AMAConfig",
    "MageConfig",
    "MemMAConfig",
    "MemoryConfig",
    "MemoryConfigBase",
    "RegisteredConfig",
    "build_memory",
    "family_memory",
    "memory_names",
    "memory_registration",
    "parse_memory_config",
    "register_memory",
]


def memory_names(builtin_only: bool = False) -> list[str]:
    """The registered memory systems' names (with ``builtin_only``, memrl's own: not those a user's module
    registered in this process)."""
    if builtin_only:
        return sorted(r.name for r in MEMORY_SYSTEMS.items() if r.entry.startswith("memrl."))
    return MEMORY_SYSTEMS.names()


def family_memory(family: Registration[Any], key: str = "memory") -> str:
    """The memory system a task family runs when the config names none: ``external`` for an episode function or an
    HTTP agent (its loop owns its memory), else the family's registered default (``@register_task(memory=...)``). A
    family without one is a :class:`ComponentError` naming ``key`` and the choices: memrl never picks a system that
    leaves the memory model uncalled for the user."""
    if family.extra.get("kind") in ("episode", "http"):
        return "external"
    default = family.extra.get("memory")
    if default:
        return str(default)
    label = repr(family.name) if family.name else f"{family.entry!r}"
    choices = [n for n in memory_names() if n != "external"]
    raise ComponentError(
        f"task family {label} has no default memory system, so the config must name one: {key}: {{name: "
        f"NAME}} with NAME one of {', '.join(choices)}, or your own as {key}: {{entry: 'package.module:Class'}} "
        f"(long_context keeps the whole history in the reasoner's context and never calls the memory model)"
    )


def memory_registration(cfg: Any) -> Registration[Any]:
    """The registration behind a memory config (or a mapping with ``name`` / ``entry``)."""
    data = cfg.model_dump() if isinstance(cfg, ConfigModel) else cfg
    if not isinstance(data, dict):
        raise ComponentError(f"memory: expected a mapping with 'name' (or 'entry'), got {type(data).__name__}")
    entry, name = data.get("entry"), data.get("name")
    if entry is None and isinstance(name, str) and is_entry(name):
        entry = name
    if entry is not None:
        reg = MEMORY_SYSTEMS.get(str(entry))
        if not reg.name:
            raise ComponentError(
                f"memory entry {entry!r}: register it with @register_memory(name, config=...) "
                f"(memrl.api) so its settings can be validated"
            )
        return reg
    if not isinstance(name, str):
        raise ComponentError(
            f"memory: a 'name' (one of {', '.join(memory_names())}) or an 'entry' ('package.module:Class') is required"
        )
    return MEMORY_SYSTEMS.get(name)


def parse_memory_config(data: Any) -> Any:
    """Validate a mapping (``{"name": "sam", ...}`` or ``{"entry": "pkg.mod:Class", ...}``) into the config of the
    system it names (a config instance is returned as it is)."""
    if isinstance(data, ConfigModel):
        return data
    reg = memory_registration(data)
    values = dict(data)
    named_by_path = values.get("entry") is not None or is_entry(str(values.get("name", "")))
    values["name"] = reg.name
    if named_by_path:
        values["entry"] = reg.entry
        if "entry" not in reg.config.model_fields:
            raise ComponentError(
                f"memory config {reg.config.__qualname__} of {reg.entry} is named by import path: it "
                f"needs an 'entry' field (subclass memrl.api.MemoryConfigBase)"
            )
    return reg.config.model_validate(values)


class RegisteredConfig:
    """Marks a config field whose type is "the config model of the registered component the mapping names" (the
    config reference lists the registered built-ins' sections)."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry

    def sections(self) -> list[type]:
        """The registered config models, in registration order."""
        return [r.config for r in self.registry.items() if r.config is not None]


MemoryConfig = Annotated[Any, BeforeValidator(parse_memory_config), RegisteredConfig(MEMORY_SYSTEMS)]
"""The config of any registered memory system, chosen by its ``name`` (or ``entry``)."""


def build_memory(
    cfg: Any,
    *,
    count_tokens: TokenCounter | None = None,
    embedder: Embedder | None = None,
) -> MemorySystem:
    """A fresh memory system for ``cfg`` (a config or a mapping). ``count_tokens`` (SAM and the baselines; default
    the approximate counter) and ``embedder`` (embedding retrieval, MemMA, AMA-Agent; default the one their config
    names) are shared dependencies, passed to the systems whose ``__init__`` takes them."""
    cfg = parse_memory_config(cfg)
    reg = memory_registration(cfg)
    params = inspect.signature(reg.obj).parameters
    deps = {k: v for k, v in (("count_tokens", count_tokens), ("embedder", embedder)) if k in params}
    takes_config = any(
        p.name not in deps and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params.values()
    )
    return reg.obj(cfg, **deps) if takes_config else reg.obj(**deps)
