"""Pivot turns of the proactive memory agent ("Remember When It Matters: Proactive Memory Agent for Long-Horizon
Agents", section 4.5): offline labelled rollouts, pivot detection by counterfactual resampling, and pivot-turn groups.

**Labelled rollouts** (:func:`label_rollouts`). The current memory agent (any engine) runs with the frozen action
agent over training tasks; every model call of the run is recorded in order (:class:`RecordedCall`: text, token ids,
log-probs, usage), together with an index of the memory steps (:class:`LabelledStep`: where the step's Phase 1 and
Phase 2 calls sit in that record, the decision taken, the pre-filters that fired, and, when the task knows it, the
planted pivot at that point). Any memory step is re-entered by :func:`restore`: the task is rebuilt from its spec and
the recorded prefix is replayed through a :class:`ReplayEngine` (no model is called), which reproduces the rollout's
state exactly (messages, bank, environment, token accounting, call seeds), pending at the step's call. In memory, a
rollout deep-copied at its pending call is the same snapshot; the stored record makes it durable and shareable.

**Pivot detection** (:func:`detect_pivots`). Cheap pre-filters (:class:`PrefilterConfig`) pick candidate steps: before
a state-changing command, after a tool error, before a repeated command. Each candidate is restored and given
distinct Phase 2 decisions, in this order: the recorded one (its outcome is the labelled rollout's), silence, a
reminder restating each bank entry (every one: the detector cannot tell which entry the next action needs, and a
pivot the student could have caught must not be missed because its entry went untried), then fresh samples of the
memory engine; at most ``alternatives`` of them (the budget; what it cuts is counted in the returned stats and
logged). Every alternative continues with the
frozen action agent to the end of the task, and the step is a pivot when the outcomes differ by at least
``min_spread``. Siblings keep the rollout's id, so they share the seeds of every later call (common random numbers:
their outcomes differ through the decision, not through sampling noise). The labels and outcome spreads of all
candidates, pivots or not, are :class:`PivotRecord` s (JSONL through :mod:`memrl.data.io`).

**Pivot-turn groups** (:func:`sample_pivot_groups`). At each pivot (and, with ``non_pivots_per_iteration``, at some
candidates the detector labelled non-pivots: there a per-reminder cost makes silence the better decision, which keeps
updates at pivots from teaching the agent to remind everywhere), G outputs of the memory engine are sampled from
the one restored state (Phase 2 by default; ``phases: phase1+2`` samples Phase 1 and lets each sample's own Phase 2
follow), every sample continues to the end, and the raw results (:class:`PivotGroupResult`) go to
:mod:`memrl.rewards.pivot` for rewards and group advantages. All pivots' samples are one engine call; all continuations
run through :func:`~memrl.rollout.loop.run_rollouts` wavefronts (one engine call per engine and wavefront).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import re
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, field_validator

from memrl.data.config import ConfigModel
from memrl.data.formats import parse_intervention, render_intervention
from memrl.data.schemas import EnvSpec, FiniteFloat, JsonDict, MemoryCall, Record, TokenUsage
from memrl.data.tasks import ProactiveTask, make_task
from memrl.data.tasks.proactive import fact_value, find_pivot
from memrl.rollout.agents import build_proactive_rollout
from memrl.rollout.engines.base import (
    Completion,
    Engine,
    EngineError,
    GenerationRequest,
    GenerationResult,
    Usage,
    sample_seed,
)
from memrl.rollout.loop import EngineSet, PendingCall, Rollout, run_rollouts
from memrl.rollout.memory.base import RoleSampling
from memrl.rollout.memory.proactive import ProactiveConfig, ProactiveMemory
from memrl.rollout.memory.workflow import action_of

__all__ = [
    "Alternative",
    "DetectConfig",
    "LabelledRollout",
    "LabelledStep",
    "PivotGroupConfig",
    "PivotGroupResult",
    "PivotRecord",
    "PivotSample",
    "PrefilterConfig",
    "RecordedCall",
    "ReplayEngine",
    "detect_pivots",
    "detection_scores",
    "every_turn",
    "fatal_misses",
    "label_rollouts",
    "restore",
    "rollout_from_record",
    "sample_pivot_groups",
    "state_digest",
]

logger = logging.getLogger(__name__)

DECISION_ROLE = "intervene"
EDIT_ROLE = "bank_edit"


# ----------------------------------------------------------------------------------------------------------------
# Records


class RecordedCall(Record):
    """One model call of a labelled rollout, as the engine answered it (enough to replay it exactly)."""

    kind: Literal["memory", "reasoner"]
    role: str
    step: int = Field(ge=0)
    text: str
    response_ids: list[int] = []
    logprobs: list[FiniteFloat] = []
    finish_reason: str = "stop"
    prompt_ids: list[int] = []
    prompt_tokens: int = Field(0, ge=0)
    completion_tokens: int = Field(0, ge=0)
    cached_prompt_tokens: int = Field(0, ge=0)
    engine: str = ""
    policy_version: int = 0

    @classmethod
    def from_result(cls, call: PendingCall, result: GenerationResult, step: int, keep_prompt_ids: bool) -> RecordedCall:
        """Record sample 0 of ``result`` (rollouts take one sample per call)."""
        completion = result.completions[0]
        return cls(
            kind=call.kind, role=call.role, step=step, text=completion.text,
            response_ids=list(completion.response_ids), logprobs=list(completion.logprobs),
            finish_reason=completion.finish_reason,
            prompt_ids=list(result.prompt_ids) if keep_prompt_ids or call.kind == "memory" else [],
            prompt_tokens=result.usage.prompt_tokens, completion_tokens=result.usage.completion_tokens,
            cached_prompt_tokens=result.usage.cached_prompt_tokens, engine=result.engine,
            policy_version=result.policy_version,
        )

    def as_result(self) -> GenerationResult:
        """The engine answer this record replays."""
        return GenerationResult(
            prompt_ids=list(self.prompt_ids),
            completions=[Completion(list(self.response_ids), list(self.logprobs), self.text, self.finish_reason)],
            usage=Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                        cached_prompt_tokens=self.cached_prompt_tokens),
            engine=self.engine, policy_version=self.policy_version,
        )


class LabelledStep(Record):
    """One memory step of a labelled rollout: where its calls sit in the record and what happened there."""

    step: int = Field(ge=0)
    phase1_index: int | None = None  # index of the step's Phase 1 call in LabelledRollout.calls
    phase2_index: int  # index of the step's Phase 2 (decision) call
    decision: str  # the recorded Phase 2 output
    reminder: str | None = None
    filters: list[str] = []  # pre-filters that fired (empty: not a candidate)
    planted: JsonDict | None = None  # the task's ground-truth pivot at this point, if the task knows it


class LabelledRollout(Record):
    """One offline labelled rollout: the task spec, the memory configuration, every call in order, the steps."""

    record_id: str = Field(min_length=1)
    task_id: str
    env: EnvSpec
    seed: int
    rollout_id: str
    memory: JsonDict  # the resolved ProactiveConfig
    reasoner: JsonDict = {}  # the action agent's RoleSampling
    policy_version: int = 0
    calls: list[RecordedCall]
    steps: list[LabelledStep]
    outcome: FiniteFloat
    reasoner_usage: TokenUsage = TokenUsage()
    stats: dict[str, int] = {}


class Alternative(Record):
    """One counterfactual Phase 2 decision at a candidate step and the outcome of its continuation."""

    source: Literal["recorded", "silence", "policy", "bank"]
    text: str
    reminder: str | None = None  # what reaches the action agent (a citation restated; None: silence)
    outcome: FiniteFloat


class PivotRecord(Record):
    """A candidate step with its label: the pivot dataset (negatives included)."""

    pivot_id: str = Field(min_length=1)
    record_id: str
    task_id: str
    step: int = Field(ge=0)
    phase1_index: int | None = None
    phase2_index: int
    filters: list[str] = []
    alternatives: list[Alternative]
    spread: FiniteFloat  # max - min outcome over the alternatives
    is_pivot: bool
    best_reminder: str | None = None  # the decision of the best alternative (None: silence)
    planted: JsonDict | None = None
    policy_version: int = 0


# ----------------------------------------------------------------------------------------------------------------
# Configs


_STATE_CHANGE = (
    r"(?i)^\s*(rm|mv|cp|ln|mkdir|touch|chmod|chown|tee|truncate|sed\s+-i|pip3?\s+install|apt(-get)?\s+install"
    r"|python[\d.]*\s+\S+\.py|git\s+(commit|push|checkout|reset|merge|rebase|apply)|load|make|black)\b|>"
)
_TOOL_ERROR = r"(?im)^(error|fatal|traceback)\b|command not found|cannot stat|no such file|refused|failed"


class PrefilterConfig(ConfigModel):
    """Cheap pre-filters that pick candidate steps before any counterfactual is run."""

    state_change: bool = Field(True, description="the step precedes a state-changing command")
    tool_error: bool = Field(True, description="the step follows a tool error")
    repeat: bool = Field(True, description="the step precedes a command the window already holds")
    every_step: bool = Field(False, description="every memory step is a candidate (no pre-filter)")
    state_change_pattern: str = _STATE_CHANGE  # regex of a state-changing command
    error_pattern: str = _TOOL_ERROR  # regex of an observation that is a tool error

    @field_validator("state_change_pattern", "error_pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        return pattern


class DetectConfig(ConfigModel):
    """Counterfactual resampling at candidate steps."""

    prefilter: PrefilterConfig = PrefilterConfig()
    alternatives: int = Field(
        12, ge=2, description="the budget: distinct decisions continued per candidate at most (the recorded one "
        "too); tried in the order recorded, silence, every bank entry, policy samples; what it cuts is logged")
    silence: bool = Field(True, description="always try <no_intervention/>")
    policy_samples: int = Field(2, ge=0, description="fresh samples of the memory engine per candidate")
    bank_reminders: bool = Field(True, description="try a reminder restating each bank entry, every one of them")
    min_spread: float = Field(0.5, gt=0, description="outcome spread that marks a pivot")
    max_candidates_per_rollout: int | None = Field(None, ge=1)  # first N candidate steps per rollout; None: all


class PivotGroupConfig(ConfigModel):
    """Pivot-turn groups: G samples per pivot from the restored state."""

    at: Literal["pivots", "all_turns"] = Field(
        "pivots", description="where groups are sampled: detected pivots (plus non_pivots_per_iteration labelled "
        "non-pivots), or all_turns: any memory step of the labelled rollouts, no detection (the ablation of pivot "
        "focus; it draws pivots_per_iteration + non_pivots_per_iteration steps)")
    group_size: int = Field(8, ge=2)  # G: samples per pivot
    phases: Literal["phase2", "phase1+2"] = "phase2"  # sample Phase 2, or Phase 1 with each sample's own Phase 2
    pivots_per_iteration: int = Field(16, ge=1)  # pivots drawn from the pool per iteration
    non_pivots_per_iteration: int = Field(
        0, ge=0, description="labelled non-pivot candidates grouped too: with a per-reminder cost they teach silence "
        "where a reminder changes no outcome (0: pivots only)")
    temperature: float | None = Field(None, ge=0, description="sampling temperature at the pivot (None: the role's)")


# ----------------------------------------------------------------------------------------------------------------
# Replay


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


# ----------------------------------------------------------------------------------------------------------------
# Labelled rollouts


def _turns(memory: ProactiveMemory, upto: int) -> list[tuple[str, str]]:
    """(action, observation) pairs of steps 0..upto (the statement is step 0)."""
    return [(action_of(reply) if step > 0 else "", obs) for step, reply, obs, _ in memory.turns if step <= upto]


def planted_pivot(rollout: Rollout, step: int) -> dict[str, Any] | None:
    """The task's ground-truth pivot at memory step ``step`` of this rollout (proactive tasks), else None."""
    if not isinstance(rollout.env, ProactiveTask) or not isinstance(rollout.memory, ProactiveMemory):
        return None
    return find_pivot(_turns(rollout.memory, step), rollout.env.params.window)


def fatal_misses(rollout: Rollout) -> list[bool]:
    """For each fatal pivot on a finished proactive rollout's path (a planted pivot whose fact is a requirement), in
    order: whether the memory agent missed it, i.e. its Phase 2 decision there delivered no reminder stating the
    needed value. The miss rate m of a policy is the fraction of True over its rollouts."""
    missed = []
    for call in rollout.memory_calls:
        planted = planted_pivot(rollout, call.step) if call.role == DECISION_ROLE else None
        if planted is not None and planted["requirement"]:
            needed = fact_value(planted["fact"], planted["reminder"])
            missed.append(fact_value(planted["fact"], str(call.metadata.get("reminder") or "")) != needed)
    return missed


def _filters(memory: ProactiveMemory, step: int, cfg: PrefilterConfig) -> list[str]:
    by_step = {s: (action_of(reply) if s > 0 else "", obs) for s, reply, obs, _ in memory.turns}
    fired = ["every_step"] if cfg.every_step else []
    nxt = by_step.get(step + 1, ("", ""))[0]
    if cfg.state_change and nxt and re.search(cfg.state_change_pattern, nxt):
        fired.append("state_change")
    if cfg.tool_error and step > 0 and re.search(cfg.error_pattern, by_step.get(step, ("", ""))[1]):
        fired.append("tool_error")
    window = memory.config.window
    earlier = {by_step[s][0] for s in range(max(1, step + 1 - window), step + 1) if s in by_step}
    if cfg.repeat and nxt and nxt in earlier:
        fired.append("repeat")
    return fired


def label_rollouts(
    tasks: Sequence[Any],
    engines: EngineSet,
    memory: ProactiveConfig,
    *,
    prefilter: PrefilterConfig | None = None,
    seed: int = 0,
    rollout_id: str = "label",
    reasoner_sampling: RoleSampling | None = None,
    keep_prompt_ids: bool = False,
    progress: str | None = None,
) -> list[LabelledRollout]:
    """Run the memory agent (``engines``) over ``tasks`` (ProactiveTask or Episode) and record every call and memory
    step. ``keep_prompt_ids`` also keeps the action agent's prompt ids (the memory calls' are always kept)."""
    prefilter = prefilter or PrefilterConfig()
    rollouts = [build_proactive_rollout(copy.deepcopy(t) if isinstance(t, ProactiveTask) else t, memory, seed=seed,
                                        rollout_id=rollout_id, reasoner_sampling=reasoner_sampling) for t in tasks]
    calls: dict[int, list[RecordedCall]] = {id(r): [] for r in rollouts}

    def record(rollout: Rollout, call: PendingCall, result: GenerationResult) -> None:
        calls[id(rollout)].append(RecordedCall.from_result(call, result, rollout.step, keep_prompt_ids))

    run_rollouts(rollouts, engines, progress=progress, on_result=record)
    out = []
    for rollout in rollouts:
        recorded = calls[id(rollout)]
        assert isinstance(rollout.memory, ProactiveMemory)
        steps = []
        phase1: dict[int, int] = {}
        for index, rec in enumerate(recorded):
            if rec.kind != "memory":
                continue
            if rec.role == EDIT_ROLE:
                phase1[rec.step] = index
            elif rec.role == DECISION_ROLE:
                steps.append(LabelledStep(
                    step=rec.step, phase1_index=phase1.get(rec.step), phase2_index=index, decision=rec.text,
                    reminder=parse_intervention(rec.text)[0], filters=_filters(rollout.memory, rec.step, prefilter),
                    planted=planted_pivot(rollout, rec.step),
                ))
        task = rollout.env
        versions = [r.policy_version for r in recorded if r.kind == "memory" and r.role == DECISION_ROLE]
        out.append(LabelledRollout(
            record_id=f"{task.task_id}/{rollout.rollout_id}/v{max(versions, default=0)}/s{seed}",
            task_id=task.task_id, env=task.spec, seed=seed, rollout_id=rollout.rollout_id,
            memory=rollout.memory.config.model_dump(mode="json"),
            reasoner=rollout.reasoner_sampling.model_dump(mode="json"), policy_version=max(versions, default=0),
            calls=recorded, steps=steps, outcome=float(rollout.outcome or 0.0),
            reasoner_usage=rollout.reasoner_usage, stats={**rollout.memory.stats, **rollout.stats},
        ))
    return out


# ----------------------------------------------------------------------------------------------------------------
# Detection


def _fork(base: Rollout) -> Rollout:
    """``base.fork`` keeping the rollout id (siblings share the seeds of every later call: common random numbers), with
    the recorded history shared rather than deep-copied (its records are never modified once made)."""
    calls, events = base.memory_calls, base.events
    base.memory_calls, base.events = [], []
    try:
        twin = base.fork(base.rollout_id)
    finally:
        base.memory_calls, base.events = calls, events
    twin.memory_calls, twin.events = list(calls), list(events)
    return twin


def _text_result(text: str) -> GenerationResult:
    return GenerationResult(prompt_ids=[], completions=[Completion([], [], text, "stop")], usage=Usage(),
                            engine="counterfactual")


def _resampled(call: PendingCall, n: int, salt: int, temperature: float | None = None) -> GenerationRequest:
    """The pending request asking for ``n`` samples under a derived seed (fresh samples, reproducible)."""
    base = call.request.sampling.seed if call.request.sampling.seed is not None else 0
    sampling = dataclasses.replace(call.request.sampling, n=n, seed=sample_seed(base, salt))
    if temperature is not None:
        sampling = dataclasses.replace(sampling, temperature=temperature)
    return GenerationRequest(messages=call.request.messages, prompt_ids=call.request.prompt_ids, sampling=sampling,
                             metadata=dict(call.request.metadata))


def _generate_grouped(engines: EngineSet, calls: list[PendingCall], requests: list[GenerationRequest]
                      ) -> list[GenerationResult]:
    """One engine call per engine for all ``requests`` (results in request order)."""
    results: list[GenerationResult | None] = [None] * len(requests)
    batches: dict[int, tuple[Engine, list[int]]] = {}
    for i, call in enumerate(calls):
        engine = engines.for_call(call)
        batches.setdefault(id(engine), (engine, []))[1].append(i)
    for engine, indices in batches.values():
        for i, result in zip(indices, engine.generate([requests[i] for i in indices]), strict=True):
            results[i] = result
    return [r for r in results if r is not None]


@dataclass
class _Candidate:
    record: LabelledRollout
    step: LabelledStep
    base: Rollout
    alternatives: list[tuple[str, str, str | None]] = field(default_factory=list)  # (source, text, reminder)
    forks: list[Rollout] = field(default_factory=list)


def detect_pivots(
    records: Sequence[LabelledRollout],
    engines: EngineSet,
    cfg: DetectConfig | None = None,
    *,
    salt: int = 1,
    progress: str | None = None,
) -> tuple[list[PivotRecord], dict[str, float]]:
    """Label the pre-filtered steps of ``records`` by counterfactual resampling (see the module docstring).

    Returns every candidate's :class:`PivotRecord` and the detection's cost: candidates, continuations, the action
    agent's tokens spent on them, the budget (``alternatives``), the bank entries at the candidates, how many were
    tried, and the distinct decisions (bank entries among them) the budget cut."""
    cfg = cfg or DetectConfig()
    candidates: list[_Candidate] = []
    for record in records:
        chosen = [s for s in record.steps if s.filters]
        if cfg.max_candidates_per_rollout is not None:
            chosen = chosen[: cfg.max_candidates_per_rollout]
        for step in chosen:
            candidates.append(_Candidate(record, step, restore(record, step.phase2_index)))
    samples: list[GenerationResult] = []
    if cfg.policy_samples and candidates:
        pending = [c.base.pending() for c in candidates]
        assert all(p is not None for p in pending)
        requests = [_resampled(p, cfg.policy_samples, salt) for p in pending if p is not None]
        samples = _generate_grouped(engines, [p for p in pending if p is not None], requests)
    forks: list[Rollout] = []
    budget = {"bank_entries": 0, "bank_tried": 0, "bank_over_budget": 0, "over_budget": 0}
    for i, cand in enumerate(candidates):
        options: list[tuple[str, str]] = [("recorded", cand.step.decision)]
        if cfg.silence:
            options.append(("silence", render_intervention(None)))
        memory = cand.base.memory
        if cfg.bank_reminders and isinstance(memory, ProactiveMemory):
            # every entry could be the one the next action needs: the detector cannot know which (the bank does not
            # say), so it tries them all before any policy sample, within the budget
            options += [("bank", render_intervention(e.content)) for e in memory.bank.entries]
            budget["bank_entries"] += len(memory.bank.entries)
        if samples:
            options += [("policy", c.text) for c in samples[i].completions]
        seen: set[str | None] = set()
        for source, text in options:
            # distinct by what reaches the action agent (a citation and the entry it restates are one decision)
            reminder = memory.delivered(text)[0] if isinstance(memory, ProactiveMemory) else parse_intervention(text)[0]
            if reminder in seen:
                continue
            seen.add(reminder)
            if len(cand.alternatives) >= cfg.alternatives:
                budget["over_budget"] += 1
                budget["bank_over_budget"] += source == "bank"
                continue
            cand.alternatives.append((source, text, reminder))
            budget["bank_tried"] += source == "bank"
        for _, text, _ in cand.alternatives[1:]:  # the recorded decision's continuation is the record itself
            fork = _fork(cand.base)
            fork.advance(_text_result(text))
            cand.forks.append(fork)
            forks.append(fork)
    run_rollouts(forks, engines, progress=progress)
    out = []
    tokens = TokenUsage()
    for cand in candidates:
        outcomes = [cand.record.outcome] + [float(f.outcome or 0.0) for f in cand.forks]
        for fork in cand.forks:
            tokens = tokens + _minus(fork.reasoner_usage, cand.base.reasoner_usage)
        alternatives = [Alternative(source=s, text=t, reminder=r, outcome=o)
                        for (s, t, r), o in zip(cand.alternatives, outcomes, strict=True)]
        spread = max(outcomes) - min(outcomes)
        best = max(alternatives, key=lambda a: (a.outcome, a.source == "recorded"))
        out.append(_pivot_record(cand.record, cand.step, alternatives=alternatives, spread=spread,
                                 is_pivot=spread >= cfg.min_spread, best_reminder=best.reminder))
    stats = {
        "candidates": float(len(candidates)),
        "continuations": float(len(forks)),
        "pivots": float(sum(p.is_pivot for p in out)),
        "action_tokens": float(tokens.spent),
        "budget": float(cfg.alternatives),
        **{k: float(v) for k, v in budget.items()},
    }
    if budget["bank_over_budget"]:
        logger.warning("pivot detection: the budget (detect.alternatives=%d) left %d of %d bank entries untried",
                       cfg.alternatives, budget["bank_over_budget"], budget["bank_entries"])
    return out, stats


def _minus(a: TokenUsage, b: TokenUsage) -> TokenUsage:
    return TokenUsage(prompt_tokens=a.prompt_tokens - b.prompt_tokens,
                      cached_prompt_tokens=a.cached_prompt_tokens - b.cached_prompt_tokens,
                      completion_tokens=a.completion_tokens - b.completion_tokens, calls=a.calls - b.calls)


def detection_scores(records: Sequence[LabelledRollout], pivots: Sequence[PivotRecord],
                     which: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, float]:
    """Recall and precision of the detected pivots against the planted ones (steps whose ``planted`` is set and
    passes ``which``), counted over every memory step of ``records``. A planted step that the pre-filters skipped
    counts as missed."""
    which = which or (lambda planted: True)
    planted = {(r.record_id, s.step) for r in records for s in r.steps if s.planted is not None and which(s.planted)}
    found = {(p.record_id, p.step) for p in pivots if p.is_pivot}
    hits = len(planted & found)
    return {
        "planted": float(len(planted)),
        "detected": float(len(found)),
        "true_positives": float(hits),
        "recall": hits / len(planted) if planted else 0.0,
        "precision": hits / len(found) if found else 0.0,
    }


def every_turn(records: Sequence[LabelledRollout]) -> list[PivotRecord]:
    """Every memory step of ``records`` as an unlabelled :class:`PivotRecord` (no alternatives, ``is_pivot`` false,
    the planted pivot kept for analysis): the group sites of ``at: all_turns``, which skips detection."""
    return [_pivot_record(record, step, alternatives=[], spread=0.0, is_pivot=False)
            for record in records for step in record.steps]


def _pivot_record(record: LabelledRollout, step: LabelledStep, **label: Any) -> PivotRecord:
    """The :class:`PivotRecord` of one memory step of ``record``, with the detection's ``label`` fields."""
    return PivotRecord(pivot_id=f"{record.record_id}/t{step.step}", record_id=record.record_id, task_id=record.task_id,
                       step=step.step, phase1_index=step.phase1_index, phase2_index=step.phase2_index,
                       filters=list(step.filters), planted=step.planted, policy_version=record.policy_version, **label)


# ----------------------------------------------------------------------------------------------------------------
# Pivot-turn groups


@dataclass
class PivotSample:
    """One of the G samples at a pivot and what its continuation achieved."""

    index: int
    call: MemoryCall  # the sampled output (Phase 2, or Phase 1 in phase1+2 mode)
    followup: MemoryCall | None  # phase1+2: the sample's own Phase 2 call
    reminder: str | None
    outcome: float
    reminders_after: int  # reminders injected from the pivot to the end (this sample's included)
    usage: TokenUsage  # the action agent's tokens spent on the continuation
    fingerprint: str  # state_digest of the fork right before the sample was applied


@dataclass
class PivotGroupResult:
    """The G samples of one pivot from its one restored state (rewards come from :mod:`memrl.rewards.pivot`)."""

    pivot_id: str
    task_id: str
    role: str
    prompt_ids: list[int]
    messages: list[Any]
    state: str  # state_digest of the restored rollout
    samples: list[PivotSample]
    metadata: dict[str, Any] = field(default_factory=dict)


def sample_pivot_groups(
    pivots: Sequence[PivotRecord],
    records: dict[str, LabelledRollout],
    engines: EngineSet,
    cfg: PivotGroupConfig | None = None,
    *,
    salt: int = 0,
    progress: str | None = None,
) -> list[PivotGroupResult]:
    """Sample G memory-engine outputs at each pivot, continue every one to the end; one engine call for all pivots'
    samples and run_rollouts wavefronts for all continuations. ``salt`` varies the samples between iterations."""
    cfg = cfg or PivotGroupConfig()
    bases: list[tuple[PivotRecord, Rollout]] = []
    for pivot in pivots:
        index = pivot.phase2_index
        if cfg.phases == "phase1+2":
            if pivot.phase1_index is None:
                continue
            index = pivot.phase1_index
        bases.append((pivot, restore(records[pivot.record_id], index)))
    if not bases:
        return []
    pending = [base.pending() for _, base in bases]
    calls = [p for p in pending if p is not None]
    requests = [_resampled(p, cfg.group_size, 7919 + salt, cfg.temperature) for p in calls]
    results = _generate_grouped(engines, calls, requests)
    forks: list[tuple[int, Rollout, str]] = []
    for b, ((_, base), result) in enumerate(zip(bases, results, strict=True)):
        for k in range(len(result.completions)):
            fork = _fork(base)
            forks.append((b, fork, state_digest(fork)))
            fork.advance(result, sample=k)
    starts = [(len(base.memory_calls), base.memory.stats.get("reminders_injected", 0)) for _, base in bases]
    run_rollouts([f for _, f, _ in forks], engines, progress=progress)
    groups: list[PivotGroupResult] = []
    for b, ((pivot, base), result, request) in enumerate(zip(bases, results, requests, strict=True)):
        samples = []
        n_calls, reminded = starts[b]
        for k, (_, fork, fingerprint) in enumerate(f for f in forks if f[0] == b):
            call = fork.memory_calls[n_calls]
            followup = fork.memory_calls[n_calls + 1] if cfg.phases == "phase1+2" else None
            decision = followup if followup is not None else call
            samples.append(PivotSample(
                index=k, call=call, followup=followup, reminder=decision.metadata.get("reminder"),
                outcome=float(fork.outcome or 0.0),
                reminders_after=fork.memory.stats.get("reminders_injected", 0) - reminded,
                usage=_minus(fork.reasoner_usage, base.reasoner_usage), fingerprint=fingerprint,
            ))
        groups.append(PivotGroupResult(
            pivot_id=pivot.pivot_id, task_id=pivot.task_id, role=samples[0].call.role,
            prompt_ids=list(result.prompt_ids), messages=list(request.messages or []),
            state=state_digest(base), samples=samples,
            metadata={"step": pivot.step, "is_pivot": pivot.is_pivot, "planted": pivot.planted is not None,
                      "spread": pivot.spread},
        ))
    return groups
