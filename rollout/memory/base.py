"""The memory-system interface: what the agent loop asks of SAM, the proactive agent, Mage, MemMA, AMA-Agent and the
baselines.

A memory system owns the frozen reasoner's context. The loop tells it what happened (:meth:`MemorySystem.on_turn`),
asks it for the reasoner's messages, hands it the reasoner's memory tool calls, and before every reasoner call asks
whether it needs the memory model first (:meth:`MemorySystem.next_memory_request`). Memory work that takes several
model calls (page-by-page recall, Phase 1 then Phase 2) is an explicit state machine over plain data, so a rollout
can be deep-copied at any pending memory call: that is how memory-call trees branch.

Memory systems are registered components (:data:`MEMORY_SYSTEMS`, ``@register_memory(name, config=...)``): a config
``memory: {name: sam, ...}`` selects a registered system, ``memory: {entry: "mypkg.memory:Notes", ...}`` a user's
(:mod:`memrl.rollout.memory.registry` parses and builds them).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from memrl.data.config import ConfigModel
from memrl.data.formats import ToolCall
from memrl.data.registry import ComponentError, Registry, check_protocol
from memrl.data.schemas import MemoryCall, Message

__all__ = [
    "MEMORY_SYSTEMS",
    "MemoryConfigBase",
    "MemoryRequest",
    "MemorySystem",
    "RoleSampling",
    "ToolResult",
    "Turn",
    "register_memory",
]


class RoleSampling(ConfigModel):
    """Sampling settings of one memory role (or of the reasoner)."""

    temperature: float = Field(1.0, ge=0, le=100)  # sampling temperature (0: greedy)
    top_p: float = Field(1.0, gt=0, le=1)  # nucleus sampling mass
    max_tokens: int = Field(128, ge=1, le=10**6)  # max generated tokens per call
    stop: list[str] = []  # extra stop strings


@dataclass
class Turn:
    """One reasoner step as the memory system sees it: the reasoner's raw reply and what came back."""

    step: int
    action_text: str
    observation: str
    role: str = "tool"  # the role of the message that carries the observation back


@dataclass
class MemoryRequest:
    """A memory-model call the system needs: its role, the exact messages, and sampling settings."""

    role: str
    messages: list[Message]
    sampling: RoleSampling
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class ToolResult:
    """What a memory tool returns to the reasoner (``error`` set for a malformed or impossible call)."""

    content: str
    error: str | None = None


class MemorySystem(abc.ABC):
    """Per-episode memory state and logic. Instances must survive ``copy.deepcopy`` (trees fork them)."""

    name: str = "memory"
    tools: tuple[str, ...] = ()  # reasoner tool names this system answers (e.g. "memory")

    def __init__(self) -> None:
        self.stats: dict[str, int] = {}

    def count(self, key: str, n: int = 1) -> None:
        """Increment a run statistic (errors, calls, ...)."""
        self.stats[key] = self.stats.get(key, 0) + n

    @abc.abstractmethod
    def reset(self, task: str, metadata: dict[str, Any]) -> None:
        """Start a new episode with the task statement."""

    @abc.abstractmethod
    def on_turn(self, turn: Turn) -> None:
        """Record one reasoner step (the reply and the observation it produced)."""

    @abc.abstractmethod
    def reasoner_messages(self, system_prompt: str) -> list[Message]:
        """The reasoner's active context for its next call."""

    def after_reasoner_call(self) -> None:  # noqa: B027 - optional hook
        """Called once the reasoner has consumed :meth:`reasoner_messages` (transient context is dropped here)."""

    def next_memory_request(self) -> MemoryRequest | None:
        """The memory-model call needed before the loop may go on, or None."""
        return None

    def on_memory_result(self, request: MemoryRequest, call: MemoryCall) -> None:  # noqa: B027
        """Consume the memory model's answer to :meth:`next_memory_request` (``call.text`` may be garbage)."""

    def on_tool_call(self, call: ToolCall, step: int) -> None:
        """Start the memory tool the reasoner called; its result is ready when :meth:`tool_result` is not None."""
        raise NotImplementedError(f"{self.name} has no tool {call.name!r}")

    def tool_result(self) -> ToolResult | None:
        """The finished result of the tool started by :meth:`on_tool_call` (taken once), or None if still working."""
        return None

    def active_context_tokens(self, count_tokens: Any) -> int:
        """Tokens of the reasoner's active context, for the context-scaling benchmark."""
        return sum(count_tokens(m.content) for m in self.reasoner_messages(""))


class MemoryConfigBase(ConfigModel):
    """The base of a user's memory-system config: ``name`` (the registered name), ``entry`` (the import path it was
    named by, kept so every process of a run imports the same module) and per-role ``sampling``. Subclass it and add
    your own fields; the built-in systems' configs have the same ``name`` and ``sampling`` keys."""

    name: str  # the registered name of the memory system
    entry: str | None = None  # "package.module:Class" it was named by (None: a built-in name)
    sampling: dict[str, RoleSampling] = {}  # sampling of each memory role (temperature 1 for a trained role)


def _check_memory(obj: Any) -> None:
    label = f"memory system {getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', obj)}"
    check_protocol(obj, "memory system", methods=("reset", "on_turn", "reasoner_messages"))
    if not (isinstance(obj, type) and issubclass(obj, MemorySystem)):
        raise ComponentError(f"{label} must subclass memrl.api.MemorySystem")
    if missing := sorted(getattr(obj, "__abstractmethods__", ())):
        raise ComponentError(
            f"{label} does not implement the memory system protocol: missing method"
            f"{'s' if len(missing) > 1 else ''} {', '.join(repr(m) for m in missing)}"
        )


MEMORY_SYSTEMS: Registry[Any] = Registry("memory system", _check_memory)
"""Memory systems by name: sam, long_context, bm25, embedding, mage, memma, ama_agent, proactive, and a user's."""


def register_memory(name: str, *, config: type | None = None) -> Any:
    """Class decorator: a :class:`MemorySystem` selectable by ``memory: {name: NAME}`` (or by its import path as
    ``entry``), configured by ``config`` (a config model with a ``name`` field; default :class:`MemoryConfigBase`).
    The system is constructed as ``cls(config)`` plus the shared dependencies its ``__init__`` accepts
    (``count_tokens``, ``embedder``)."""
    cfg = config or MemoryConfigBase
    if "name" not in getattr(cfg, "model_fields", {}):
        raise ComponentError(
            f"memory config {cfg.__qualname__} needs a 'name' field (subclass memrl.api.MemoryConfigBase)"
        )
    return MEMORY_SYSTEMS.decorator(name, config=cfg)
