"""The environment interface, the token counter, the registry and trajectory generation.

Every environment has a latent state, an executable transition function ``step(action) -> observation`` (an
action that is impossible fails with a diagnostic and leaves the state unchanged), ``snapshot()`` / ``restore()``,
an optimal policy over the true state, and a ``view()`` of the state that QA answers are checked against. It is
built from an :class:`~memrl.data.schemas.EnvSpec` (registered name, difficulty parameters, seed), so any episode can be
rebuilt and replayed.

Token counts use :func:`count_tokens`, a deterministic approximation: one token per run of letters, per run of
digits, per newline and per other non-space character. The project's tiny tokenizer is trained on the environments' text
(:mod:`memrl.data.corpus`), so their words and numbers are single tokens and this count tracks it closely
(``benchmarks/synth_speed.py`` prints the measured ratio).
"""

from __future__ import annotations

import abc
import copy
import random
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from memrl.data.config import ConfigModel
from memrl.data.schemas import EnvSpec, Turn

__all__ = [
    "REGISTRY",
    "Env",
    "Event",
    "Trajectory",
    "count_tokens",
    "generate_trajectory",
    "make_env",
    "register",
    "turn_tokens",
]

_TOKEN_RE = re.compile(r"[A-Za-z]+|[0-9]+|[^\sA-Za-z0-9]|\n")


def count_tokens(text: str) -> int:
    """Approximate token count: runs of letters, runs of digits, newlines and single other non-space characters
    each count one."""
    return len(_TOKEN_RE.findall(text))


def turn_tokens(action: str, observation: str) -> int:
    """Tokens of one trajectory turn (its action plus its observation)."""
    return count_tokens(action) + count_tokens(observation)


@dataclass(frozen=True)
class Event:
    """Something that happened in a step, in machine-readable form (QA generation reads these).

    ``kind`` is one of: ``see`` (obj, loc), ``enter`` (room), ``move`` (obj, src, dst), ``unlock`` (target, key),
    ``open`` (container), ``fail`` (action, reason), ``goal`` (goal text), ``goal_done`` (goal text),
    ``goal_step`` (goal text, text of the chain step just done; not for a goal's last step),
    ``see_lock`` (locked target shown), ``hint`` (key, container it opens).
    """

    kind: str
    args: tuple[str, ...] = ()


class Env(abc.ABC):
    """A synthetic environment with an executable backend (see the module docstring)."""

    name: ClassVar[str]
    params_model: ClassVar[type[ConfigModel]]
    state_model: ClassVar[type]  # the dataclass of the latent state ``s`` (with its own ``rng``)

    def __init__(self, params: dict[str, Any] | ConfigModel | None = None, seed: int = 0) -> None:
        if isinstance(params, ConfigModel):
            self.params = params
        else:
            self.params = self.params_model.model_validate(params or {})
        self.seed = seed
        self.events: list[Event] = []
        self.s: Any = self.state_model()

    @classmethod
    def from_spec(cls, spec: EnvSpec) -> Env:
        """Build the environment an :class:`EnvSpec` describes."""
        return cls(spec.params, spec.seed)

    @property
    def spec(self) -> EnvSpec:
        """The spec that rebuilds this environment. A parameter marked ``omit_if_default`` is left out while it has
        its default, so knobs added later do not change the episodes (and files) written without them."""
        params = self.params.model_dump(mode="json")
        for name, info in type(self.params).model_fields.items():
            extra = info.json_schema_extra
            if isinstance(extra, dict) and extra.get("omit_if_default") and params.get(name) == info.default:
                del params[name]
        return EnvSpec(name=self.name, seed=self.seed, params=params)

    def _advance_goal(self, lines: list[str]) -> bool:
        """The current chain step is met: move to the next one (a step already met counts at once); when the chain
        is done, count the goal and draw a new one. Returns whether the whole goal was done. For worlds whose state
        ``s`` has ``chain``, ``chain_pos``, ``goal``, ``goals_done`` and that define ``step_met``, ``step_text``,
        ``goal_text`` and ``_new_goal``."""
        s = self.s
        world: Any = self
        while s.chain_pos + 1 < len(s.chain):
            text = world.step_text(s.chain[s.chain_pos])
            s.chain_pos += 1
            s.goal = s.chain[s.chain_pos]
            self.events.append(Event("goal_step", (self.goal_text(), text)))
            lines.append(f"goal step {s.chain_pos} of {len(s.chain)} done: {text}")
            if not world.step_met(s.goal):
                return False
        text = self.goal_text()
        s.goals_done += 1
        self.events.append(Event("goal_done", (text,)))
        lines.append(f"goal done: {text}")
        lines += world._new_goal()
        return True

    def goal_text(self) -> str:
        """The current goal (the whole chain, each step as ``step_text`` writes it) as text."""
        assert self.s.goal is not None
        world: Any = self
        return ", then ".join(world.step_text(g) for g in self.s.chain)

    def _progress(self) -> str:
        """`` (step i of k)`` while a goal chain is under way (empty for single-step goals)."""
        s = self.s
        return f" (step {s.chain_pos + 1} of {len(s.chain)})" if len(s.chain) > 1 else ""

    @abc.abstractmethod
    def reset(self) -> str:
        """Build the initial state from the seed; return the first observation (the answer to ``look``)."""

    def _seeded_state(self) -> tuple[random.Random, Any]:
        """For :meth:`reset`: the seed's generator, and a fresh state whose own ``rng`` (the world's randomness after
        the build) is drawn from it."""
        rng = random.Random(self.seed)
        return rng, self.state_model(rng=random.Random(rng.getrandbits(64)))

    def step(self, action: str) -> str:
        """Apply ``action``; return the observation. ``self.events`` then holds what happened; an impossible action
        fails with a diagnostic and leaves the state unchanged. A met goal-chain step advances the chain; at
        verbosity 2 the observation ends with what the agent carries and the goal."""
        s = self.s
        world: Any = self
        self.events = []
        s.last_failure = None
        lines = self._act(action.strip())
        if isinstance(lines, str):
            return lines
        done = s.goal is not None and world.step_met(s.goal) and self._advance_goal(lines)
        if not done and self.params.verbosity >= 2:  # type: ignore[attr-defined]
            lines += [self._carry_line(), f"goal: {self.goal_text()}{self._progress()}"]
        return "\n".join(lines)

    @abc.abstractmethod
    def _act(self, action: str) -> list[str] | str:
        """The observation lines of ``action`` applied to the state, or (a str) the diagnostic of an impossible
        action (:meth:`_fail`)."""

    @abc.abstractmethod
    def _carry_line(self) -> str:
        """What the agent carries, as the line verbose observations end with."""

    def _fail(self, action: str, reason: str) -> str:
        """Record a failed action (``last_failure``, a ``fail`` event); its diagnostic observation."""
        self.s.last_failure = reason
        self.events.append(Event("fail", (action, reason)))
        return f"you cannot {action}: {reason}." if self.params.verbosity else f"failed: {reason}"  # type: ignore[attr-defined]

    @abc.abstractmethod
    def optimal_action(self) -> str:
        """The optimal policy's next action for the current goal (it sees the true state)."""

    @abc.abstractmethod
    def random_action(self, rng: random.Random) -> str:
        """A plausible action drawn at random (the action-noise knob)."""

    @abc.abstractmethod
    def view(self) -> dict[str, Any]:
        """The queryable latent state: ``locations`` {object: place}, ``carrying`` [objects], ``room``,
        ``locked`` [names], ``visited`` [rooms], ``visible`` [objects], ``goals_done`` int, ``last_failure``."""

    def snapshot(self) -> Any:
        """A copy of the whole latent state (including the environment's own random generator)."""
        return copy.deepcopy(self.s)

    def restore(self, snap: Any) -> None:
        """Return to a state taken by :meth:`snapshot`."""
        self.s = copy.deepcopy(snap)


REGISTRY: dict[str, type[Env]] = {}


def register(cls: type[Env]) -> type[Env]:
    """Class decorator: make ``cls`` buildable from an :class:`EnvSpec` by its ``name``."""
    REGISTRY[cls.name] = cls
    return cls


def make_env(spec: EnvSpec) -> Env:
    """Rebuild the registered environment ``spec`` names (not yet reset)."""
    if spec.name not in REGISTRY:
        raise KeyError(f"unknown environment {spec.name!r}; registered: {sorted(REGISTRY)}")
    return REGISTRY[spec.name].from_spec(spec)


@dataclass
class Trajectory:
    """A generated trajectory: the turns, the events of each turn and the token count."""

    turns: list[Turn] = field(default_factory=list)
    events: list[list[Event]] = field(default_factory=list)
    tokens: int = 0


def generate_trajectory(
    env: Env, target_tokens: int, *, noise: float = 0.0, seed: int = 0, max_turns: int = 1_000_000
) -> Trajectory:
    """Reset ``env`` and act with its optimal policy (a random action with probability ``noise``) until the
    trajectory holds at least ``target_tokens`` tokens. Turn 0 is ``look`` with the first observation.

    The overshoot is at most one turn, so every bin from 4K tokens up lands well inside 10% of its target.
    """
    rng = random.Random(seed)
    out = Trajectory()
    first = env.reset()
    out.turns.append(Turn(turn_idx=0, action="look", observation=first))
    out.events.append(list(env.events))
    out.tokens = turn_tokens("look", first)
    while out.tokens < target_tokens and len(out.turns) < max_turns:
        action = env.random_action(rng) if noise > 0 and rng.random() < noise else env.optimal_action()
        observation = env.step(action)
        out.turns.append(Turn(turn_idx=len(out.turns), action=action, observation=observation))
        out.events.append(list(env.events))
        out.tokens += turn_tokens(action, observation)
    return out
