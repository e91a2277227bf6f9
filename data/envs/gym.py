"""Gym-style environments as memrl tasks: the adapter between a user's ``reset/step`` class and the agent loop.

The protocol a user implements (plain Python, no memrl import; :class:`GymEnv`)::

    class MyTextGame:
        task = "find the treasure"                  # optional: the instruction heading the reasoner's context
        def reset(self, seed: int) -> str: ...      # the first observation (or (observation, info), as Gymnasium)
        def step(self, action: str) -> tuple[str, float, bool, dict]: ...   # observation, reward, done, info
        def snapshot(self) -> Any: ...              # optional: the state, restored by restore()
        def restore(self, state: Any) -> None: ...  # optional

Conventions of ``info``: ``info["admissible_actions"]: list[str]`` when the environment knows them (shown to the
reasoner beside the current observation as transient context, never stored in the turn the memory system keeps);
``info["outcome"]: float in [0, 1]`` when the environment knows how well the episode went; ``info["won"]`` when it
knows whether it was won.

**Outcome semantics.** Three things are kept apart: ``won`` (the environment's ``info["won"]``; without it, an
episode the environment ended with outcome 1), ``outcome`` in [0, 1] and ``truncated`` (the episode ended before the
environment said ``done``: memrl's step limit ``max_steps``, or the reasoner's ``answer``). An episode the
environment ended scores its latest ``info["outcome"]``, else the sum of its rewards clipped to [0, 1]. A truncated
episode scores the environment's latest ``info["outcome"]`` when it gave one, else 0, unless the task set asks for
partial credit (``partial_credit: true``: the sum of the rewards so far, clipped). ``partial_outcome`` is that partial
credit whatever the setting, so an evaluation reports both. The run's stats count ``env_won`` and
``env_truncated``; metrics report ``success`` (won) and ``mean_outcome`` apart.

**Re-entry** (a memory-call tree samples the memory model K times at one state, so every sibling needs its own copy
of the environment in that state; :meth:`GymTask.__deepcopy__`, which :meth:`memrl.rollout.loop.Rollout.fork` calls):
with ``snapshot``/``restore`` a new instance is constructed, ``reset(seed)`` and ``restore(snapshot())``; without
them the new instance is ``reset(seed)`` and the logged actions are replayed, and the observation digests are compared
step by step: a replay that diverges raises :class:`ReplayMismatchError` naming the episode, the step and both
observations, never a silently wrong tree. ``reentry: replay`` forces replay even when the environment snapshots (the
benchmark and the tests compare the two).

**Failures.** Every call into the environment (its constructor, ``reset``, ``step``, ``snapshot``, ``restore``) runs
on a thread of its own (:class:`~memrl.data.user_code.UserThread`), bounded by what is left of the episode's
``episode_timeout_s``. An exception raised by ``reset`` or ``step`` ends that episode as failed (outcome 0, counted in
the run's stats as ``env_errors``, its traceback in the run's log; the tree and the run go on), and so does a call
that outlives its time (``env_timeouts``). A constructor that raises, a return value of the wrong shape and a
``restore()`` after which ``snapshot()`` is not the state restored stop the run (a
:class:`~memrl.data.errors.UserCodeError` or a :class:`ReplayMismatchError` naming the class, the method and the
episode): every episode would meet them.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import math
import pickle
import time
import weakref
from typing import Any, Literal, Protocol, runtime_checkable

from memrl.data.errors import UserCodeError, UserError
from memrl.data.formats import render_admissible_actions
from memrl.data.registry import ComponentError, entry_of, import_entry
from memrl.data.user_code import CallTimeout, UserThread, describe, log_user_traceback, user_code_error

__all__ = ["GymEnv", "GymFactory", "GymTask", "ReentryMode", "ReplayMismatchError", "observation_digest"]

log = logging.getLogger(__name__)

ReentryMode = Literal["auto", "snapshot", "replay"]
"""How a state is re-entered: ``auto`` snapshot/restore when the environment has both, else replay."""

DEFAULT_MAX_STEPS = 50


@runtime_checkable
class GymEnv(Protocol):
    """The Gym-style environment protocol (module docstring); ``snapshot``/``restore`` are optional."""

    def reset(self, seed: int) -> str:
        """Start an episode; the first observation."""
        ...

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply ``action``: (observation, reward, done, info)."""
        ...


class ReplayMismatchError(UserError):
    """A replayed episode did not reproduce its logged observations: the environment is not deterministic given its
    seed and the actions, so a state cannot be re-entered by replay."""


def observation_digest(text: str) -> str:
    """The digest replay compares (sha256 of the observation's UTF-8 text)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _same_state(a: Any, b: Any) -> bool:
    """Whether two snapshots are the same state: equal by ``==``, or pickled to the same bytes (an object without
    value equality, such as a ``random.Random``); True when neither can tell."""
    try:
        if (a == b) is True:
            return True
    except Exception:  # an array's ambiguous truth value, a comparison that raises
        pass
    try:
        return pickle.dumps(a) == pickle.dumps(b)  # dumps only: nothing is unpickled
    except Exception:
        return True


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class GymFactory:
    """Builds the user's environment: the class an import path names (or a class), called with ``params`` as keyword
    arguments. Picklable (it travels to rollout workers by its import path)."""

    def __init__(self, entry: str | type, params: dict[str, Any] | None = None) -> None:
        self.entry = entry if isinstance(entry, str) else entry_of(entry)
        self.params = dict(params or {})
        self._cls: type | None = entry if isinstance(entry, type) else None

    @property
    def cls(self) -> type:
        """The environment class."""
        if self._cls is None:
            self._cls = import_entry(self.entry, "Gym-style environment")
        return self._cls

    def __call__(self) -> Any:
        """A new environment instance; a constructor that raises is a :class:`UserCodeError` (every episode would
        fail the same way)."""
        cls = self.cls
        try:
            return cls(**self.params)
        except Exception as exc:
            raise user_code_error(
                f"Gym-style environment {self.entry!r}: its constructor {cls.__qualname__}(**{self.params}) raised, "
                f"so every episode would fail the same way",
                exc,
            ) from None

    def __getstate__(self) -> dict[str, Any]:
        return {"entry": self.entry, "params": self.params, "_cls": None}


class GymTask:
    """memrl's task interface (``reset() -> str``, ``step(action) -> (observation, done)``, ``finish(answer) ->
    outcome``, ``transient_context()``) over a Gym-style environment, with re-entry on ``copy.deepcopy`` (module
    docstring). ``env_steps`` counts the environment steps this copy ran (its own and those of its re-entry),
    ``reentries`` how it was re-entered."""

    def __init__(
        self,
        make: GymFactory,
        *,
        seed: int,
        task_id: str,
        family: str = "gym",
        max_steps: int | None = None,
        reentry: ReentryMode = "auto",
        params: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        partial_credit: bool = False,
    ):
        self.make = make
        self.seed = seed
        self.task_id = task_id
        self.family = family
        self.max_steps = max_steps or int(getattr(make.cls, "max_steps", 0) or DEFAULT_MAX_STEPS)
        self.reentry: ReentryMode = reentry
        self.params = dict(params if params is not None else make.params)
        self.env: Any = None
        self.started = False
        self.first = ""  # the first observation
        self.log: list[tuple[str, str]] = []  # (action, observation) of every step since reset
        self.rewards: list[float] = []
        self.info: dict[str, Any] = {}
        self.over = False
        self.final: float | None = None  # info["outcome"] of the latest step that gave one
        self.won: bool | None = None  # info["won"] of the latest step that gave one
        self.partial_credit = partial_credit
        self.truncated = False  # set by finish(): the episode ended before the environment said done
        self.failure: str | None = None
        self.env_steps = 0
        self.env_resets = 0
        self.reentries = {"snapshot": 0, "replay": 0}
        self.timeout_s = timeout_s  # the time the environment's calls of one episode may take in all (None: no limit)
        self.env_time = 0.0  # seconds spent in the environment's calls so far
        self.timed_out = False
        self._thread = self._new_thread()  # every call into this copy's environment instance runs there
        self.last_reentry: dict[str, Any] | None = None  # how this copy re-entered its state (None: it did not)

    # ----------------------------------------------------------------------------------------------------- helpers
    @property
    def label(self) -> str:
        """The environment class's import path (for errors)."""
        return self.make.entry

    def _instance(self) -> Any:
        if self.env is None:
            self.env = self._call(self.make, what=f"{self.label}(**{self.params})")
        return self.env

    def _new_thread(self) -> UserThread:
        """A thread for this copy's environment, ended when the copy is garbage (a task never run to its end)."""
        thread = UserThread(self.task_id)
        weakref.finalize(self, thread.close)
        return thread

    def _call(self, fn: Any, *args: Any, what: str) -> Any:
        """``fn(*args)`` on this copy's environment thread, bounded by what is left of ``timeout_s``."""
        left = None if self.timeout_s is None else self.timeout_s - self.env_time
        started = time.monotonic()
        try:
            return self._thread.call(fn, *args, timeout=left, what=what)
        finally:
            self.env_time += time.monotonic() - started

    @property
    def task(self) -> str:
        """The instruction heading the reasoner's context: the environment's ``task`` attribute, or empty."""
        value = getattr(self.make.cls, "task", None)
        if not isinstance(value, str):
            try:
                value = getattr(self._instance(), "task", "")
            except Exception:  # the constructor's failure is reported by reset() (the episode fails)
                value = ""
        return str(value or "")

    @property
    def reasoner_system(self) -> str | None:
        """The frozen reasoner's system prompt when the environment class sets one (``reasoner_system``, a string),
        else None: the memory system's own (SAM's memory tool) applies."""
        value = getattr(self.make.cls, "reasoner_system", None)
        return value if isinstance(value, str) and value else None

    def _reset(self, env: Any) -> tuple[str, dict[str, Any]]:
        out = self._call(env.reset, self.seed, what=f"{self.label}.reset({self.seed})")
        self.env_resets += 1
        info: dict[str, Any] = {}
        if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict):
            out, info = out
        if not isinstance(out, str):
            raise UserCodeError(
                f"{self.label}.reset(seed) returned {type(out).__name__} (episode {self.task_id!r}); the protocol is "
                f"reset(seed) -> str (the first observation) or (str, dict)"
            )
        return out, info

    def _step(self, env: Any, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        out = self._call(env.step, action, what=f"{self.label}.step({_short(action, 80)!r})")
        self.env_steps += 1
        if not (isinstance(out, tuple) and len(out) == 4):
            raise UserCodeError(
                f"{self.label}.step(action) returned {type(out).__name__} (episode {self.task_id!r}); the protocol is "
                f"step(action) -> (observation: str, reward: float, done: bool, info: dict)"
            )
        obs, reward, done, info = out
        if (
            not isinstance(obs, str)
            or not isinstance(info, dict)
            or isinstance(reward, bool)
            or not isinstance(reward, (int, float))
            or not math.isfinite(reward)
        ):
            raise UserCodeError(
                f"{self.label}.step(action) returned ({type(obs).__name__}, {reward!r}, {type(done).__name__}, "
                f"{type(info).__name__}) (episode {self.task_id!r}); expected (observation: str, reward: finite "
                f"float, done: bool, info: dict)"
            )
        return obs, float(reward), bool(done), info

    def _fail(self, where: str, exc: BaseException) -> str:
        self.failure = f"{where}: {describe(exc)}"
        self.over = True
        self._thread.close()
        if isinstance(exc, CallTimeout):
            self.timed_out = True
            log.warning(
                f"episode {self.task_id!r}: {exc} (the episode's environment calls may take episode_timeout_s "
                f"{self.timeout_s:g} s in all; counted as failed, env_timeouts)"
            )
            return "error: the environment did not answer in time"
        log.warning(f"episode {self.task_id!r}: {self.label} raised in {self.failure} (counted as failed, env_errors)")
        log_user_traceback(f"episode {self.task_id!r}: {self.label} raised in {where}", exc)
        return f"error: the environment failed ({type(exc).__name__})"

    # --------------------------------------------------------------------------------------------- task interface
    def reset(self) -> str:
        """Construct the environment and start the episode; the first observation."""
        try:
            env = self._instance()
            self.first, self.info = self._reset(env)
        except (ComponentError, UserCodeError):
            raise
        except Exception as exc:  # the environment's own failure: this episode fails, the run goes on
            return self._fail("reset", exc)
        self.started = True
        return self.first

    def step(self, action: str) -> tuple[str, bool]:
        """Apply ``action``; (observation, whether the episode is over)."""
        if self.over:
            return "the episode is over", True
        if not self.started:
            raise RuntimeError(f"episode {self.task_id!r}: step() before reset()")
        try:
            obs, reward, done, info = self._step(self.env, action)
        except (ComponentError, UserCodeError):
            raise
        except Exception as exc:
            return self._fail(f"step {len(self.log) + 1} ({action!r})", exc), True
        self.log.append((action, obs))
        self.rewards.append(reward)
        self.info = info
        if "won" in info:
            self.won = bool(info["won"])
        if "outcome" in info:
            outcome = info["outcome"]
            if isinstance(outcome, bool) or not isinstance(outcome, (int, float)) or not 0 <= outcome <= 1:
                raise UserCodeError(
                    f"{self.label}.step: info['outcome'] must be a number in [0, 1], got {outcome!r} (episode "
                    f"{self.task_id!r})"
                )
            self.final = float(outcome)
        if done:
            self.over = True
            self._thread.close()
        return obs, done

    def finish(self, answer: str | None) -> float:
        """The episode's outcome in [0, 1] (module docstring, "Outcome semantics"): 0 after a failure; the
        environment's ``info["outcome"]``; else, when the environment ended the episode or partial credit is asked
        for, the sum of rewards clipped to [0, 1]; else 0. Ending here without ``done`` marks it ``truncated``
        (``answer`` is not used: a Gym environment ends by ``done``)."""
        self.truncated = self.failure is None and not self.over
        return self.outcome

    @property
    def outcome(self) -> float:
        """The outcome :meth:`finish` returns."""
        if self.failure is not None:
            return 0.0
        if self.final is not None:
            return self.final
        return self.partial_outcome if (self.over or self.partial_credit) else 0.0

    @property
    def partial_outcome(self) -> float:
        """The sum of the rewards so far, clipped to [0, 1] (0 after a failure)."""
        return 0.0 if self.failure is not None else min(max(sum(self.rewards), 0.0), 1.0)

    @property
    def episode_won(self) -> bool:
        """Whether the episode was won: the environment's ``info["won"]``, else ended by it with outcome 1."""
        if self.failure is not None:
            return False
        if self.won is not None:
            return self.won
        return self.over and self.outcome >= 1.0

    def transient_context(self) -> str | None:
        """The admissible actions of the current state (``info["admissible_actions"]``), for the reasoner's next call
        only; None when the environment gave none."""
        actions = self.info.get("admissible_actions")
        if not actions or self.over:
            return None
        return render_admissible_actions(actions)

    @property
    def stats(self) -> dict[str, int]:
        """Counts for the run's metrics."""
        failed = self.failure is not None
        out = {"env_steps": self.env_steps, "env_errors": int(failed and not self.timed_out)}
        if self.timed_out:
            out["env_timeouts"] = 1
        out.update({f"env_reentry_{k}": v for k, v in self.reentries.items() if v})
        if self.started:
            out["env_won"] = int(self.episode_won)
            out["env_truncated"] = int(self.truncated)
        return out

    # -------------------------------------------------------------------------------------------------- re-entry
    @property
    def can_snapshot(self) -> bool:
        """Whether the environment has both ``snapshot`` and ``restore``."""
        cls = self.make.cls
        return callable(getattr(cls, "snapshot", None)) and callable(getattr(cls, "restore", None))

    def mode(self) -> Literal["snapshot", "replay"]:
        """How this task re-enters a state."""
        if self.reentry == "snapshot" and not self.can_snapshot:
            raise ComponentError(f"reentry: snapshot, but {self.label} has no snapshot()/restore()")
        if self.reentry == "replay" or not self.can_snapshot:
            return "replay"
        return "snapshot"

    def __deepcopy__(self, memo: dict[int, Any]) -> GymTask:
        twin = copy.copy(self)
        memo[id(self)] = twin
        twin.log, twin.rewards = list(self.log), list(self.rewards)
        twin.info, twin.reentries = copy.deepcopy(self.info, memo), dict(self.reentries)
        twin.env = None
        twin._thread = twin._new_thread()
        twin.last_reentry = None
        if not self.started or self.over:
            return twin  # nothing to re-enter: a fresh task, or a finished one (its outcome is copied)
        mode = self.mode()
        try:
            env = twin._call(self.make, what=f"{self.label}(**{self.params})")
            if mode == "snapshot":
                state = copy.deepcopy(self._call(self.env.snapshot, what=f"{self.label}.snapshot()"))
                twin._reset(env)
                twin._call(env.restore, state, what=f"{self.label}.restore(state)")
                twin._check_restored(env, state)
            else:
                twin._replay(env)
        except (ComponentError, UserError):
            raise
        except Exception as exc:  # the environment failed (or blocked) while re-entering: the copy's episode fails
            twin._fail(f"re-entry by {mode}", exc)
            return twin
        finally:
            twin.env_time = self.env_time  # re-entry is bounded by the time left, not charged to the episode
        twin.env = env
        twin.reentries[mode] += 1
        replayed = len(self.log) if mode == "replay" else 0
        twin.last_reentry = {"mode": mode, "replayed_steps": replayed}
        return twin

    def _check_restored(self, env: Any, state: Any) -> None:
        """After ``restore(state)`` the environment's own ``snapshot()`` must give ``state`` back (equal, or pickled
        to the same bytes): a ``restore()`` that leaves part of the state behind would build a wrong tree silently."""
        again = self._call(env.snapshot, what=f"{self.label}.snapshot()")
        if _same_state(state, again):
            return
        raise ReplayMismatchError(
            f"snapshot/restore of episode {self.task_id!r} (seed {self.seed}, {self.label}) at step {len(self.log)}: "
            f"after restore(state) on a new instance its snapshot() is {_short(repr(again))!r}, not the state "
            f"restored {_short(repr(state))!r}. restore() must bring back the whole state snapshot() gave (fix it, "
            f"or set reentry: replay)"
        )

    def _replay(self, env: Any) -> None:
        """Reset ``env`` and replay the logged actions, comparing observation digests step by step."""
        first, _ = self._reset(env)
        self._check(0, None, self.first, first)
        for i, (action, logged) in enumerate(self.log, start=1):
            obs = self._step(env, action)[0]
            self._check(i, action, logged, obs)

    def _check(self, step: int, action: str | None, logged: str, replayed: str) -> None:
        if observation_digest(logged) != observation_digest(replayed):
            what = "reset(seed)" if action is None else f"step {step} (action {action!r})"
            raise ReplayMismatchError(
                f"replay of episode {self.task_id!r} (seed {self.seed}, {self.label}) diverged at {what}: the logged "
                f"observation was {_short(logged)!r} but the replay gave {_short(replayed)!r}. Re-entering a state "
                f"by replay needs reset(seed) and step(action) to be deterministic; make them so, or implement "
                f"snapshot()/restore() (set reentry: snapshot)"
            )
