"""Pivot turns of the proactive memory agent ("Remember When It Matters: Proactive Memory Agent for Long-Horizon
Agents", section 4.5): offline labelled rollouts, pivot detection by counterfactual resampling, and pivot-turn groups.

**Labelled rollouts** (:func:`label_rollouts`). The current memory agent (any engine) runs with the frozen action
agent over training tasks; every model call of the run is recorded in order (:class:`RecordedCall`: text, token ids,
log-probs, usage), together with an index of the memory steps (:class:`LabelledStep`: where the step's Phase 1 and
Phase 2 calls sit in that record, the decision taken, the pre-filters that fired, and, when the task knows it, the
planted pivot at that point). Any memory step is re-entered by :func:`restore`: the task is rebuilt from its spec (or,
for a user's Gym-style environment, which has none, from the run's task of that id) and the recorded prefix is
replayed through a :class:`ReplayEngine` (no model is called), which reproduces the rollout's state exactly (messages,
bank, environment, token accounting, call seeds), pending at the step's call. The replay is checked as
:mod:`memrl.data.envs.gym` checks its own: every request must have its recorded digest and every observation must be
the logged one, so an environment that does not replay raises
:class:`~memrl.data.envs.gym.ReplayMismatchError` naming the episode, the step and both observations. In memory, a
rollout forked at its pending call is the same snapshot (a Gym environment re-enters there by its snapshot/restore,
or by replaying its logged actions, checked the same way); the stored record makes it durable and shareable. Tasks
are of any family of memrl's task interface or a user's Gym-style environment; the memory system is the proactive
agent (:mod:`memrl.rollout.memory.proactive`) and the action agent any frozen reasoner engine.

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

One concept a module: :mod:`.records`, :mod:`.config`, :mod:`.replay`, :mod:`.labels`, :mod:`.sampling` (branching a
restored step), :mod:`.detect`, :mod:`.groups`; this package exports their public names.
"""

from memrl.rollout.pivots.config import DetectConfig, PivotGroupConfig, PrefilterConfig
from memrl.rollout.pivots.detect import detect_pivots, detection_scores, every_turn
from memrl.rollout.pivots.groups import PivotGroupResult, PivotSample, sample_pivot_groups
from memrl.rollout.pivots.labels import fatal_misses, label_rollouts
from memrl.rollout.pivots.records import Alternative, LabelledRollout, LabelledStep, PivotRecord, RecordedCall
from memrl.rollout.pivots.replay import ReplayEngine, restore, rollout_from_record, state_digest

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
