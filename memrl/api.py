"""The names a user's own components import: the registration decorators, the bases of a memory system and its
config, and an episode's :class:`Outcome` (docs/own_agent.md walks through them).

A Gym-style environment and an HTTP agent need nothing from here (they are plain Python / any language); an episode
function may return an :class:`Outcome` or a number. Registering is needed to give a component a short name or a
config model; a component named by import path in YAML (``entry: "mypkg.env:MyTextGame"``) is found either way.
"""

from memrl.data.envs.gym import GymEnv, ReplayMismatchError
from memrl.data.registry import ComponentError, register_reasoner, register_task
from memrl.data.tasks.external import Outcome, TaskInfo
from memrl.rewards.terms import RewardTerm, register_reward
from memrl.rollout.memory.base import (
    MemoryConfigBase,
    MemoryRequest,
    MemorySystem,
    RoleSampling,
    ToolResult,
    Turn,
    register_memory,
)

__all__ = [
    "ComponentError",
    "GymEnv",
    "MemoryConfigBase",
    "MemoryRequest",
    "MemorySystem",
    "Outcome",
    "ReplayMismatchError",
    "RewardTerm",
    "RoleSampling",
    "TaskInfo",
    "ToolResult",
    "Turn",
    "register_memory",
    "register_reasoner",
    "register_reward",
    "register_task",
]
