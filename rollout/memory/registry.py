"""Every memory system by name: one config type (:data:`MemoryConfig`, a union discriminated by ``name``) and one
factory (:func:`build_memory`), so a YAML ``memory: {name: sam, page_tokens: 512}`` selects and configures a system.

Names: ``sam``, ``long_context``, ``bm25``, ``embedding``, ``mage``, ``memma``, ``ama_agent``, ``proactive``. Mage,
MemMA and AMA-Agent keep their own config classes; the ``*MemoryConfig`` subclasses here only add the ``name``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from memrl.rollout.memory.ama_agent import AMAConfig, AMAMemory
from memrl.rollout.memory.base import MemorySystem
from memrl.rollout.memory.baselines import (
    BM25Config,
    BM25Memory,
    EmbeddingConfig,
    EmbeddingMemory,
    LongContextConfig,
    LongContextMemory,
)
from memrl.rollout.memory.embedders import Embedder
from memrl.rollout.memory.mage import MageConfig, MageMemory
from memrl.rollout.memory.memma import MemMAConfig, MemMAMemory
from memrl.rollout.memory.proactive import ProactiveConfig, ProactiveMemory
from memrl.rollout.memory.sam import SamConfig, SamMemory, TokenCounter

__all__ = [
    "MEMORY_NAMES",
    "AMAMemoryConfig",
    "MageMemoryConfig",
    "MemMAMemoryConfig",
    "MemoryConfig",
    "build_memory",
    "parse_memory_config",
]


class MageMemoryConfig(MageConfig):
    """:class:`~memrl.rollout.memory.mage.MageConfig` selectable by ``name: mage``."""

    name: Literal["mage"] = "mage"  # selects this memory system


class MemMAMemoryConfig(MemMAConfig):
    """:class:`~memrl.rollout.memory.memma.MemMAConfig` selectable by ``name: memma``."""

    name: Literal["memma"] = "memma"  # selects this memory system


class AMAMemoryConfig(AMAConfig):
    """:class:`~memrl.rollout.memory.ama_agent.AMAConfig` selectable by ``name: ama_agent``."""

    name: Literal["ama_agent"] = "ama_agent"  # selects this memory system


MemoryConfig = Annotated[
    SamConfig
    | LongContextConfig
    | BM25Config
    | EmbeddingConfig
    | MageMemoryConfig
    | MemMAMemoryConfig
    | AMAMemoryConfig
    | ProactiveConfig,
    Field(discriminator="name"),
]
"""The config of any memory system, chosen by its ``name``."""

MEMORY_NAMES = ("sam", "long_context", "bm25", "embedding", "mage", "memma", "ama_agent", "proactive")

_ADAPTER: TypeAdapter[Any] = TypeAdapter(MemoryConfig)


def parse_memory_config(data: Any) -> MemoryConfig:
    """Validate a mapping (``{"name": "sam", ...}``) into the config of the system it names."""
    return _ADAPTER.validate_python(data)


def build_memory(
    cfg: MemoryConfig | dict[str, Any],
    *,
    count_tokens: TokenCounter | None = None,
    embedder: Embedder | None = None,
) -> MemorySystem:
    """A fresh memory system for ``cfg``. ``count_tokens`` (SAM and the baselines; default the approximate counter)
    and ``embedder`` (embedding retrieval, MemMA, AMA-Agent; default the one their config names) are shared
    dependencies; systems that do not use one ignore it."""
    if isinstance(cfg, dict):
        cfg = parse_memory_config(cfg)
    if isinstance(cfg, SamConfig):
        return SamMemory(cfg, count_tokens=count_tokens)
    if isinstance(cfg, LongContextConfig):
        return LongContextMemory(cfg, count_tokens=count_tokens)
    if isinstance(cfg, BM25Config):
        return BM25Memory(cfg, count_tokens=count_tokens)
    if isinstance(cfg, EmbeddingConfig):
        return EmbeddingMemory(cfg, count_tokens=count_tokens, embedder=embedder)
    if isinstance(cfg, MageMemoryConfig):
        return MageMemory(cfg)
    if isinstance(cfg, MemMAMemoryConfig):
        return MemMAMemory(cfg, embedder=embedder)
    if isinstance(cfg, AMAMemoryConfig):
        return AMAMemory(cfg, embedder=embedder)
    if isinstance(cfg, ProactiveConfig):
        return ProactiveMemory(cfg)
    raise TypeError(f"not a memory config: {type(cfg).__name__}")
