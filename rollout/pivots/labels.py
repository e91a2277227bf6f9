"""Labelled rollouts: the current memory agent runs with the frozen action agent and every call is recorded
(:func:`label_rollouts`); the planted pivots and the fatal misses a rollout shows (:func:`fatal_misses`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from memrl.data.formats import parse_intervention
from memrl.data.tasks import ProactiveTask
from memrl.data.tasks.proactive import fact_value, find_pivot
from memrl.rollout.agents import task_rollout
from memrl.rollout.engines.base import (
    GenerationResult,
)
from memrl.rollout.loop import EngineSet, PendingCall, Rollout, run_rollouts
from memrl.rollout.memory.base import RoleSampling
from memrl.rollout.memory.proactive import ProactiveConfig, ProactiveMemory
from memrl.rollout.memory.workflow import action_of
from memrl.rollout.pivots.config import PrefilterConfig
from memrl.rollout.pivots.records import DECISION_ROLE, EDIT_ROLE, LabelledRollout, LabelledStep, RecordedCall
from memrl.rollout.pivots.replay import observations

__all__ = ["fatal_misses", "label_rollouts", "planted_pivot"]


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
    """Run the memory agent (``engines``) over ``tasks`` (tasks of any family: a proactive task, its Episode, a
    user's Gym-style environment, ...) and record every call, memory step and observation. ``keep_prompt_ids`` also
    keeps the action agent's prompt ids (the memory calls' are always kept)."""
    prefilter = prefilter or PrefilterConfig()
    rollouts = [
        task_rollout(t, memory, seed=seed, rollout_id=rollout_id, reasoner_sampling=reasoner_sampling) for t in tasks
    ]
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
                steps.append(
                    LabelledStep(
                        step=rec.step,
                        phase1_index=phase1.get(rec.step),
                        phase2_index=index,
                        decision=rec.text,
                        reminder=parse_intervention(rec.text)[0],
                        filters=_filters(rollout.memory, rec.step, prefilter),
                        planted=planted_pivot(rollout, rec.step),
                    )
                )
        task = rollout.env
        versions = [r.policy_version for r in recorded if r.kind == "memory" and r.role == DECISION_ROLE]
        out.append(
            LabelledRollout(
                record_id=f"{task.task_id}/{rollout.rollout_id}/v{max(versions, default=0)}/s{seed}",
                task_id=task.task_id,
                env=getattr(task, "spec", None),
                seed=seed,
                rollout_id=rollout.rollout_id,
                memory=rollout.memory.config.model_dump(mode="json"),
                reasoner=rollout.reasoner_sampling.model_dump(mode="json"),
                policy_version=max(versions, default=0),
                calls=recorded,
                steps=steps,
                outcome=float(rollout.outcome or 0.0),
                reasoner_usage=rollout.reasoner_usage,
                stats={**rollout.memory.stats, **rollout.stats},
                observations=observations(rollout),
            )
        )
    return out
