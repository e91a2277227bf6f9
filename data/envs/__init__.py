"""Synthetic environments with executable backends (AMA-Bench's synthetic recipe): a grid/room world and a
text-adventure world, registered by name so an :class:`~memrl.data.schemas.EnvSpec` rebuilds either."""

from memrl.data.envs.base import (
    REGISTRY,
    Env,
    Event,
    Trajectory,
    count_tokens,
    generate_trajectory,
    make_env,
    turn_tokens,
)
from memrl.data.envs.gridworld import GridWorldEnv, GridWorldParams
from memrl.data.envs.textworld import TextWorldEnv, TextWorldParams

__all__ = [
    "REGISTRY",
    "Env",
    "Event",
    "GridWorldEnv",
    "GridWorldParams",
    "TextWorldEnv",
    "TextWorldParams",
    "Trajectory",
    "count_tokens",
    "generate_trajectory",
    "make_env",
    "turn_tokens",
]
