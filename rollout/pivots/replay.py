"""Re-entering a recorded memory step exactly: the task rebuilt from its spec, the recorded prefix replayed through a
:class:`ReplayEngine` (no model is called), and a digest of a rollout's state to check that a replay matches.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from collections import deque
from collections.abc import Iterable
from typing import Any

from memrl.data.schemas import EnvSpec
from memrl.data.tasks import ProactiveTask, make_task
from memrl.rollout.agents import build_proactive_rollout
from memrl.rollout.engines.base import (
    Engine,
    EngineError,
    GenerationRequest,
    GenerationResult,
)
from memrl.rollout.loop import Rollout
from memrl.rollout.memory.base import RoleSampling
from memrl.rollout.memory.proactive import ProactiveConfig
from memrl.rollout.pivots.records import LabelledRollout, RecordedCall

__all__ = ["ReplayEngine", "restore", "rollout_from_record", "state_digest"]


class ReplayEngine(Engine):
    """Answers requests with recorded calls, in order; a request of another role than the next record is an error
    (the replay diverged from the recording)."""

    name = "replay"

    def __init__(self, calls: Iterable[RecordedCall]) -> None:
        self.queue: deque[RecordedCall] = deque(calls)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """The next recorded answer for each request."""
        out = []
        for request in requests:
            if not self.queue:
                raise EngineError("replay: no recorded call left")
            record = self.queue.popleft()
            role = request.metadata.get("role")
            if role != record.role:
                raise EngineError(f"replay diverged: the rollout asks for {role!r}, the record has {record.role!r}")
            out.append(record.as_result())
        return out


_TASKS: dict[str, ProactiveTask] = {}


def _task(env: EnvSpec, task_id: str) -> Any:
    """The task of a spec, fresh (built once per process and spec, then deep-copied: building runs a reference)."""
    key = json.dumps([env.model_dump(mode="json"), task_id], sort_keys=True)
    if key not in _TASKS:
        if len(_TASKS) > 4096:
            _TASKS.clear()
        _TASKS[key] = make_task(env, task_id)  # type: ignore[assignment]
    return copy.deepcopy(_TASKS[key])


def rollout_from_record(record: LabelledRollout) -> Rollout:
    """A fresh rollout of the record's task with its memory configuration, seed and rollout id."""
    task = _task(record.env, record.task_id)
    sampling = RoleSampling.model_validate(record.reasoner) if record.reasoner else None
    return build_proactive_rollout(task, ProactiveConfig.model_validate(record.memory), seed=record.seed,
                                   rollout_id=record.rollout_id, reasoner_sampling=sampling)


def restore(record: LabelledRollout, index: int) -> Rollout:
    """The record's rollout replayed up to call ``index``: pending at that call, in exactly the recorded state."""
    if not 0 <= index < len(record.calls):
        raise IndexError(f"{record.record_id}: call index {index} outside 0..{len(record.calls) - 1}")
    rollout = rollout_from_record(record)
    engine = ReplayEngine(record.calls[:index])
    while engine.queue:
        call = rollout.pending()
        if call is None:
            raise EngineError(f"{record.record_id}: the replay ended before call {index}")
        rollout.advance(engine.generate([call.request])[0])
    call = rollout.pending()
    if call is None or call.role != record.calls[index].role:
        raise EngineError(f"{record.record_id}: after the replay the rollout does not wait for call {index}")
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
    env_state = rollout.env.snapshot() if hasattr(rollout.env, "snapshot") else vars(rollout.env)
    blob = {
        "pending": None if call is None else {
            "kind": call.kind, "role": call.role, "messages": _canonical(call.request.messages),
            "sampling": _canonical(call.request.sampling),
        },
        "memory": _canonical(memory),
        "env": _canonical(env_state),
        "step": rollout.step,
        "calls_made": rollout._calls_made,  # the seed counter is part of the state
        "events": _canonical(rollout.events),
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:16]
