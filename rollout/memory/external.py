"""The memory of an episode function or an HTTP agent: the user's own code, which calls the memory model through the
client memrl hands it (:mod:`memrl.rollout.episodes`) or the endpoint memrl serves (:mod:`memrl.rollout.http_agent`).

``memory: {name: external, sampling: {note: {temperature: 1.0, max_tokens: 32}}}`` configures those calls: the sampling
of each memory role (a role not listed gets :class:`~memrl.rollout.memory.base.RoleSampling`'s defaults: temperature
1, 128 tokens). The system itself never runs inside memrl's agent loop.
"""

from __future__ import annotations

from typing import Any, Literal

from memrl.data.registry import ComponentError
from memrl.rollout.memory.base import MemoryConfigBase, MemorySystem, RoleSampling, Turn, register_memory

__all__ = ["ExternalMemory", "ExternalMemoryConfig"]


class ExternalMemoryConfig(MemoryConfigBase):
    """The sampling of the memory-model calls an episode function or an HTTP agent makes."""

    name: Literal["external"] = "external"  # selects this memory system
    sampling: dict[str, RoleSampling] = {}  # per memory role (absent: temperature 1, 128 tokens)

    def role(self, role: str) -> RoleSampling:
        """The sampling of ``role``."""
        return self.sampling.get(role, RoleSampling())


@register_memory("external", config=ExternalMemoryConfig)
class ExternalMemory(MemorySystem):
    """Placeholder of the user's own memory code (module docstring): refuses to run inside memrl's agent loop."""

    name = "external"

    def __init__(self, config: ExternalMemoryConfig) -> None:
        super().__init__()
        self.config = config

    def _refuse(self) -> None:
        raise ComponentError(
            "memory: external is the memory of an episode function or an HTTP agent (their own "
            "code); a task of memrl's agent loop or a Gym environment runs a memory system such as "
            "sam, or your own by entry"
        )

    def reset(self, task: str, metadata: dict[str, Any]) -> None:
        """Refused (see the class docstring)."""
        self._refuse()

    def on_turn(self, turn: Turn) -> None:
        """Refused."""
        self._refuse()

    def reasoner_messages(self, system_prompt: str) -> list[Any]:
        """Refused."""
        self._refuse()
        return []
