"""Pivot detection by counterfactual resampling (:func:`detect_pivots`): at each candidate memory step the recorded
decision, silence, every bank entry that could be the needed one (within a logged budget) and policy samples are
continued to the end, and a step whose alternatives change the outcome is a pivot.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memrl.data.formats import parse_intervention, render_intervention
from memrl.data.schemas import TokenUsage
from memrl.rollout.engines.base import Completion, GenerationResult, Usage
from memrl.rollout.loop import EngineSet, Rollout, run_rollouts
from memrl.rollout.memory.proactive import ProactiveMemory
from memrl.rollout.pivots.config import DetectConfig
from memrl.rollout.pivots.records import Alternative, LabelledRollout, LabelledStep, PivotRecord
from memrl.rollout.pivots.replay import restore
from memrl.rollout.pivots.sampling import generate_grouped, resampled_request, sibling_fork

__all__ = ["detect_pivots", "detection_scores", "every_turn"]

logger = logging.getLogger(__name__)


def _text_result(text: str) -> GenerationResult:
    return GenerationResult(
        prompt_ids=[], completions=[Completion([], [], text, "stop")], usage=Usage(), engine="counterfactual"
    )


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
    tasks: Mapping[str, Any] | None = None,
) -> tuple[list[PivotRecord], dict[str, float]]:
    """Label the pre-filtered steps of ``records`` by counterfactual resampling (see the module docstring). Each
    candidate is re-entered by :func:`~memrl.rollout.pivots.replay.restore` (``tasks``: the run's tasks by id, for
    records of tasks without a spec, e.g. a Gym-style environment), its alternatives by forking it.

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
            task = tasks.get(record.task_id) if tasks is not None else None
            candidates.append(_Candidate(record, step, restore(record, step.phase2_index, task)))
    samples: list[GenerationResult] = []
    if cfg.policy_samples and candidates:
        pending = [c.base.pending() for c in candidates]
        assert all(p is not None for p in pending)
        requests = [resampled_request(p, cfg.policy_samples, salt) for p in pending if p is not None]
        samples = generate_grouped(engines, [p for p in pending if p is not None], requests)
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
            fork = sibling_fork(cand.base)
            fork.advance(_text_result(text))
            cand.forks.append(fork)
            forks.append(fork)
    run_rollouts(forks, engines, progress=progress)
    out = []
    tokens = TokenUsage()
    for cand in candidates:
        outcomes = [cand.record.outcome] + [float(f.outcome or 0.0) for f in cand.forks]
        for fork in cand.forks:
            tokens = tokens + (fork.reasoner_usage - cand.base.reasoner_usage)
        alternatives = [
            Alternative(source=s, text=t, reminder=r, outcome=o)
            for (s, t, r), o in zip(cand.alternatives, outcomes, strict=True)
        ]
        spread = max(outcomes) - min(outcomes)
        best = max(alternatives, key=lambda a: (a.outcome, a.source == "recorded"))
        out.append(
            _pivot_record(
                cand.record,
                cand.step,
                alternatives=alternatives,
                spread=spread,
                is_pivot=spread >= cfg.min_spread,
                best_reminder=best.reminder,
            )
        )
    stats = {
        "candidates": float(len(candidates)),
        "continuations": float(len(forks)),
        "pivots": float(sum(p.is_pivot for p in out)),
        "action_tokens": float(tokens.spent),
        "budget": float(cfg.alternatives),
        **{k: float(v) for k, v in budget.items()},
    }
    if budget["bank_over_budget"]:
        logger.warning(
            "pivot detection: the budget (detect.alternatives=%d) left %d of %d bank entries untried",
            cfg.alternatives,
            budget["bank_over_budget"],
            budget["bank_entries"],
        )
    return out, stats


def detection_scores(
    records: Sequence[LabelledRollout],
    pivots: Sequence[PivotRecord],
    which: Callable[[dict[str, Any]], bool] | None = None,
) -> dict[str, float]:
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
    return [
        _pivot_record(record, step, alternatives=[], spread=0.0, is_pivot=False)
        for record in records
        for step in record.steps
    ]


def _pivot_record(record: LabelledRollout, step: LabelledStep, **label: Any) -> PivotRecord:
    """The :class:`PivotRecord` of one memory step of ``record``, with the detection's ``label`` fields."""
    return PivotRecord(
        pivot_id=f"{record.record_id}/t{step.step}",
        record_id=record.record_id,
        task_id=record.task_id,
        step=step.step,
        phase1_index=step.phase1_index,
        phase2_index=step.phase2_index,
        filters=list(step.filters),
        planted=step.planted,
        policy_version=record.policy_version,
        **label,
    )
