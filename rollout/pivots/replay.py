"""Re-entering a recorded memory step exactly: the task rebuilt (from its spec, or, for a task without one such as a
user's Gym-style environment, a fresh copy of the run's task), the recorded prefix replayed through a
:class:`ReplayEngine` (no model is called), and a digest of a rollout's state.

This is the replay re-entry of :mod:`memrl.data.envs.gym` applied to a durable record: every replayed request must
have the digest the labelled run recorded, and every observation the environment gives must be the logged one, step
by step; the first difference raises :class:`~memrl.data.envs.gym.ReplayMismatchError` naming the episode, the step
and both observations (or both request digests), never a silently wrong state. Branching a restored step
(:func:`~memrl.rollout.pivots.sampling.sibling_fork`) goes through ``Rollout.fork``: a Gym environment re-enters
there by its own snapshot/restore, or by replaying its logged actions with the same checks.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from collections import deque
from collections.abc import Iterable
from typing import Any

from memrl.data.envs.gym import GymTask, ReplayMismatchError, observation_digest
from memrl.data.schemas import EnvSpec
from memrl.data.tasks import make_task
from memrl.rollout.agents import task_rollout
from memrl.rollout.engines.base import (
    Engine,
    EngineError,
    GenerationRequest,
    GenerationResult,
)
from memrl.rollout.episode_calls import request_digest
from memrl.rollout.loop import Rollout
from memrl.rollout.memory.base import RoleSampling
from memrl.rollout.memory.proactive import ProactiveConfig
from memrl.rollout.pivots.records import LabelledRollout, RecordedCall

__all__ = ["ReplayEngine", "observations", "restore", "rollout_from_record", "state_digest"]


class ReplayEngine(Engine):
    """Answers requests with recorded calls, in order. A request of another role than the next record, or (when the
    record holds its digest) with other messages, is a :class:`~memrl.data.envs.gym.ReplayMismatchError`: the replay
    diverged from the recording (``episode`` names it in the error)."""

    name = "replay"

    def __init__(self, calls: Iterable[RecordedCall], episode: str = "replay") -> None:
        self.queue: deque[RecordedCall] = deque(calls)
        self.episode = episode
        self.answered = 0

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """The next recorded answer for each request."""
        out = []
        for request in requests:
            if not self.queue:
                raise EngineError(f"{self.episode}: replay: no recorded call left")
            record = self.queue.popleft()
            role = request.metadata.get("role")
            where = f"replay of {self.episode} diverged at call {self.answered} (step {record.step})"
            if role != record.role:
                raise ReplayMismatchError(f"{where}: the rollout asks for {role!r}, the record has {record.role!r}")
            if record.request:
                digest = request_digest(record.kind, record.role, list(request.messages or []))
                if digest != record.request:
                    raise ReplayMismatchError(
                        f"{where}: the {record.role} request differs from the logged one (digest {digest[:12]} "
                        f"against {record.request[:12]}): the task or the memory system is not deterministic given "
                        f"its seed and the recorded answers"
                    )
            self.answered += 1
            out.append(record.as_result())
        return out


_TASKS: dict[str, Any] = {}


def _task(env: EnvSpec, task_id: str) -> Any:
    """The task of a spec, fresh (built once per process and spec, then deep-copied: building runs a reference)."""
    key = json.dumps([env.model_dump(mode="json"), task_id], sort_keys=True)
    if key not in _TASKS:
        if len(_TASKS) > 4096:
            _TASKS.clear()
        _TASKS[key] = make_task(env, task_id)  # type: ignore[assignment]
    return copy.deepcopy(_TASKS[key])


def rollout_from_record(record: LabelledRollout, task: Any = None) -> Rollout:
    """A fresh rollout of the record's task with its memory configuration, seed and rollout id: the task rebuilt from
    the record's spec, else a fresh copy of ``task`` (the run's task of that id: a Gym-style environment has no
    spec)."""
    if record.env is not None:
        task = _task(record.env, record.task_id)
    elif task is None:
        raise ValueError(
            f"{record.record_id}: task {record.task_id!r} has no spec (a Gym-style environment): "
            f"re-entering it needs the run's task of that id (tasks=...)"
        )
    elif getattr(task, "task_id", None) != record.task_id:
        raise ValueError(
            f"{record.record_id}: given task {getattr(task, 'task_id', None)!r}, the record's is {record.task_id!r}"
        )
    sampling = RoleSampling.model_validate(record.reasoner) if record.reasoner else None
    return task_rollout(
        task,
        ProactiveConfig.model_validate(record.memory),
        seed=record.seed,
        rollout_id=record.rollout_id,
        reasoner_sampling=sampling,
        copy_task=record.env is None,
    )


def observations(rollout: Rollout) -> list[str]:
    """The environment's observation after each action of ``rollout``, in order (what a replay must reproduce)."""
    return [e.observation for e in rollout.events if e.kind == "act"]


def restore(record: LabelledRollout, index: int, task: Any = None) -> Rollout:
    """The record's rollout replayed up to call ``index``: pending at that call, in exactly the recorded state.
    ``task``: the run's task of the record's id, for a task without a spec (:func:`rollout_from_record`). A replay
    that does not reproduce the record (module docstring) raises
    :class:`~memrl.data.envs.gym.ReplayMismatchError`."""
    if not 0 <= index < len(record.calls):
        raise IndexError(f"{record.record_id}: call index {index} outside 0..{len(record.calls) - 1}")
    rollout = rollout_from_record(record, task)
    episode = f"episode {record.record_id!r}"
    engine = ReplayEngine(record.calls[:index], episode)
    logged, seen = record.observations, 0
    while engine.queue:
        call = rollout.pending()
        if call is None:
            raise ReplayMismatchError(f"replay of {episode}: the episode ended before call {index}")
        before_events = len(rollout.events)
        rollout.advance(engine.generate([call.request])[0])
        if logged and call.kind == "reasoner":
            for event in rollout.events[before_events:]:
                if event.kind != "act":
                    continue
                if seen >= len(logged) or observation_digest(event.observation) != observation_digest(logged[seen]):
                    was = logged[seen] if seen < len(logged) else "(none: the logged episode had ended)"
                    raise ReplayMismatchError(
                        f"replay of {episode} diverged at step {event.step} (action "
                        f"{record.calls[engine.answered - 1].text[:200]!r}): the logged observation was "
                        f"{was[:300]!r} but the replay gave {event.observation[:300]!r}. Re-entering a state by "
                        f"replay needs the environment to be deterministic given its seed and the actions"
                    )
                seen += 1
    call = rollout.pending()
    if call is None or call.role != record.calls[index].role:
        raise ReplayMismatchError(
            f"replay of {episode}: after the replay the rollout does not wait for call "
            f"{index} ({record.calls[index].role})"
        )
    return rollout


def _canonical(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (set, frozenset)):
        return sorted((_canonical(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True, default=str))
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    return value


def state_digest(rollout: Rollout) -> str:
    """A hash of everything the rollout's future depends on: the pending request (messages, sampling, seed), the
    memory system's state, the environment's state, the step and call counters."""
    call = rollout.pending()
    memory = {k: v for k, v in vars(rollout.memory).items() if k not in ("_error_re",)}
    env = rollout.env
    if isinstance(env, GymTask):  # a user's environment: its state is its seed and what it logged since reset
        env_state: Any = {
            "seed": env.seed,
            "first": env.first,
            "log": env.log,
            "rewards": env.rewards,
            "over": env.over,
            "final": env.final,
            "failure": env.failure,
        }
    else:
        env_state = env.snapshot() if hasattr(env, "snapshot") else vars(env)
    blob = {
        "pending": None
        if call is None
        else {
            "kind": call.kind,
            "role": call.role,
            "messages": _canonical(call.request.messages),
            "sampling": _canonical(call.request.sampling),
        },
        "memory": _canonical(memory),
        "env": _canonical(env_state),
        "step": rollout.step,
        "calls_made": rollout._calls_made,  # the seed counter is part of the state
        "events": _canonical(rollout.events),
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:16]
