"""Pivot-turn groups: G samples of the policy at each pivot, each continued to the end of its episode
(:func:`sample_pivot_groups`); :func:`memrl.rewards.groups.pivot_groups` turns them into trainer groups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memrl.data.schemas import MemoryCall, TokenUsage
from memrl.rollout.loop import EngineSet, Rollout, run_rollouts
from memrl.rollout.pivots.config import PivotGroupConfig
from memrl.rollout.pivots.records import LabelledRollout, PivotRecord
from memrl.rollout.pivots.replay import restore, state_digest
from memrl.rollout.pivots.sampling import generate_grouped, resampled_request, sibling_fork

__all__ = ["PivotGroupResult", "PivotSample", "sample_pivot_groups"]


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
    tasks: Mapping[str, Any] | None = None,
) -> list[PivotGroupResult]:
    """Sample G memory-engine outputs at each pivot, continue every one to the end; one engine call for all pivots'
    samples and run_rollouts wavefronts for all continuations. ``salt`` varies the samples between iterations;
    ``tasks``: the run's tasks by id, for records of tasks without a spec (a Gym-style environment)."""
    cfg = cfg or PivotGroupConfig()
    bases: list[tuple[PivotRecord, Rollout]] = []
    for pivot in pivots:
        index = pivot.phase2_index
        if cfg.phases == "phase1+2":
            if pivot.phase1_index is None:
                continue
            index = pivot.phase1_index
        task = tasks.get(pivot.task_id) if tasks is not None else None
        bases.append((pivot, restore(records[pivot.record_id], index, task)))
    if not bases:
        return []
    pending = [base.pending() for _, base in bases]
    calls = [p for p in pending if p is not None]
    requests = [resampled_request(p, cfg.group_size, 7919 + salt, cfg.temperature) for p in calls]
    results = generate_grouped(engines, calls, requests)
    forks: list[tuple[int, Rollout, str]] = []
    for b, ((_, base), result) in enumerate(zip(bases, results, strict=True)):
        for k in range(len(result.completions)):
            fork = sibling_fork(base)
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
            samples.append(
                PivotSample(
                    index=k,
                    call=call,
                    followup=followup,
                    reminder=decision.metadata.get("reminder"),
                    outcome=float(fork.outcome or 0.0),
                    reminders_after=fork.memory.stats.get("reminders_injected", 0) - reminded,
                    usage=fork.reasoner_usage - base.reasoner_usage,
                    fingerprint=fingerprint,
                )
            )
        groups.append(
            PivotGroupResult(
                pivot_id=pivot.pivot_id,
                task_id=pivot.task_id,
                role=samples[0].call.role,
                prompt_ids=list(result.prompt_ids),
                messages=list(request.messages or []),
                state=state_digest(base),
                samples=samples,
                metadata={
                    "step": pivot.step,
                    "is_pivot": pivot.is_pivot,
                    "planted": pivot.planted is not None,
                    "spread": pivot.spread,
                },
            )
        )
    return groups
