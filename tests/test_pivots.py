"""Pivot turns: offline labelled rollouts replay into exactly the recorded state, restored environments continue
identically, pre-filters, the counterfactual detector against planted pivots, and pivot-turn groups that share one
restored state."""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import pytest

from benchmarks.pivot_learning import flippable
from memrl.data.envs.gym import ReplayMismatchError
from memrl.data.experts import ProactiveOracle
from memrl.data.io import read_jsonl, write_jsonl
from memrl.data.schemas import Message
from memrl.data.tasks import ActionAgent, ProactiveTask
from memrl.rollout.agents import build_proactive_rollout
from memrl.rollout.engines.scripted import ScriptedEngine
from memrl.rollout.loop import EngineSet, Rollout, run_rollouts
from memrl.rollout.memory.base import Turn
from memrl.rollout.memory.proactive import ProactiveConfig, ProactiveMemory
from memrl.rollout.pivots import (
    DetectConfig,
    LabelledRollout,
    PivotGroupConfig,
    PivotRecord,
    PrefilterConfig,
    ReplayEngine,
    detect_pivots,
    detection_scores,
    every_turn,
    fatal_misses,
    label_rollouts,
    restore,
    sample_pivot_groups,
    state_digest,
)

REQUIRED = ("interpreter", "output", "protected")


def tasks(n: int, start: int = 0, **params: Any) -> list[ProactiveTask]:
    return [ProactiveTask({"n_subtasks": 12, **params}, seed=start + s) for s in range(n)]


def engines(ts: list[ProactiveTask], tokenizer: Any = None, **oracle: Any) -> EngineSet:
    truths = {t.task_id: t.truth() for t in ts}
    return EngineSet(
        reasoner=ScriptedEngine(ActionAgent(), tokenizer=tokenizer),
        memory=ScriptedEngine(ProactiveOracle(oracle, truths=truths), tokenizer=tokenizer),
    )


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from memrl.rollout.models import load_tokenizer

    return load_tokenizer(tiny_model_dir)


def snapshots(
    task: ProactiveTask, eng: EngineSet, memory: ProactiveConfig, seed: int, rollout_id: str
) -> tuple[dict[int, Rollout], Rollout]:
    """The in-memory snapshots: the rollout deep-copied at every pending Phase 2 call, and the finished rollout."""
    rollout = build_proactive_rollout(copy.deepcopy(task), memory, seed=seed, rollout_id=rollout_id)
    snaps = {}
    while (call := rollout.pending()) is not None:
        if call.role == "intervene":
            snaps[rollout.step] = copy.deepcopy(rollout)
        rollout.advance(eng.for_call(call).generate([call.request])[0])
    return snaps, rollout


# ---------------------------------------------------------------------------------------------------- replay
def test_replay_recreates_the_recorded_state_exactly(tokenizer: Any) -> None:
    ts = tasks(2, start=3)
    memory = ProactiveConfig()
    noise = {"miss_rate": 0.3, "false_alarm_rate": 0.3}
    for task in ts:
        # fresh engines for both runs: their simulated prefix caches then see the same calls (same cached counts)
        (record,) = label_rollouts(
            [task], engines(ts, tokenizer, **noise), memory, seed=5, rollout_id="lab", keep_prompt_ids=True
        )
        snaps, finished = snapshots(task, engines(ts, tokenizer, **noise), memory, 5, "lab")
        assert record.outcome == finished.outcome and len(record.steps) == len(snaps)
        for step in record.steps:
            restored, original = restore(record, step.phase2_index), snaps[step.step]
            assert restored.pending().request.messages == original.pending().request.messages
            assert restored.pending().request.sampling == original.pending().request.sampling
            assert restored.env.snapshot() == original.env.snapshot()
            assert restored.memory.bank == original.memory.bank and restored.memory.turns == original.memory.turns
            assert restored.trace().model_dump() == original.trace().model_dump()  # calls with ids, events, usage
            assert state_digest(restored) == state_digest(original)
        # a record survives JSONL
        assert LabelledRollout.model_validate_json(record.model_dump_json()) == record


def test_restored_environment_continues_identically() -> None:
    ts = tasks(1, start=8)
    eng = engines(ts, miss_rate=0.4)
    (record,) = label_rollouts(ts, eng, ProactiveConfig(), seed=2)
    step = record.steps[len(record.steps) // 2]
    # the same actions (the rest of the record, replayed) give the same observations, state and outcome
    replayed = restore(record, step.phase2_index)
    rest = ReplayEngine(record.calls[step.phase2_index :])  # one rollout: one call per wavefront, in recorded order
    run_rollouts([replayed], EngineSet(reasoner=rest, memory=rest))
    assert not rest.queue
    _, original = snapshots(ts[0], engines(ts, miss_rate=0.4), ProactiveConfig(), 2, "label")
    assert [e.model_dump() for e in replayed.events] == [e.model_dump() for e in original.events]
    assert replayed.env.snapshot() == original.env.snapshot() and replayed.outcome == original.outcome
    # a live continuation draws the recorded seeds, so it continues exactly as the labelled run did
    live = restore(record, step.phase2_index)
    run_rollouts([live], engines(ts, miss_rate=0.4))
    assert [e.observation for e in live.events] == [e.observation for e in original.events]
    assert live.memory_calls[-1].text == original.memory_calls[-1].text and live.outcome == record.outcome


def test_replay_refuses_a_diverging_record() -> None:
    ts = tasks(1)
    (record,) = label_rollouts(ts, engines(ts), ProactiveConfig())
    broken = record.model_copy(deep=True)
    broken.calls[1].role = "bank_edit"  # the rollout asks for Phase 2 here
    with pytest.raises(ReplayMismatchError, match=r"diverged at call 1 .*asks for 'intervene'"):
        restore(broken, record.steps[1].phase2_index)
    with pytest.raises(IndexError):
        restore(record, len(record.calls))


def test_distraction_draws_are_shared_by_counterfactual_branches() -> None:
    agent = ActionAgent(distraction=0.3, seed=1)
    rng = random.Random(0)
    draws = [agent.distracted(rng, {"task_id": "t", "step": s}) for s in range(400)]
    assert draws == [agent.distracted(random.Random(9), {"task_id": "t", "step": s}) for s in range(400)]
    assert 0.2 < sum(draws) / 400 < 0.4
    assert not ActionAgent(distraction=0.0).distracted(rng, {}) and ActionAgent(distraction=1.0).distracted(rng, {})
    with pytest.raises(ValueError):
        ActionAgent(distraction=1.5)


# ---------------------------------------------------------------------------------------------------- pre-filters
def test_prefilters_fire_on_state_changes_errors_and_repeats() -> None:
    from memrl.rollout.pivots.labels import _filters

    memory = ProactiveMemory(ProactiveConfig(window=4))
    memory.reset("task: t", {})
    script = [
        ("", "task: t"),
        ("ls", "a b"),
        ("pip install numpy", "error: externally-managed-environment"),
        ("pip install numpy", "error: externally-managed-environment"),
        ("cat README.md", "# readme"),
        ("python3.10 run.py", "wrote build/result.txt"),
    ]
    for step, (action, observation) in enumerate(script):
        memory.on_turn(Turn(step=step, action_text=action, observation=observation))
    cfg = PrefilterConfig()
    assert _filters(memory, 0, cfg) == []  # before `ls`
    assert _filters(memory, 1, cfg) == ["state_change"]  # before the first install
    assert _filters(memory, 2, cfg) == ["state_change", "tool_error", "repeat"]  # the install is repeated
    assert _filters(memory, 3, cfg) == ["tool_error"]  # after the second failure, before `cat`
    assert _filters(memory, 4, cfg) == ["state_change"]  # before running the pipeline
    assert _filters(memory, 4, PrefilterConfig(state_change=False, every_step=True)) == ["every_step"]
    with pytest.raises(ValueError):
        PrefilterConfig(error_pattern="(unclosed")


# ---------------------------------------------------------------------------------------------------- detection
def test_detector_finds_planted_pivots_with_few_false_positives(tmp_path: Path) -> None:
    ts = tasks(6, start=20)
    eng = engines(ts)
    records = label_rollouts(ts, eng, ProactiveConfig(), seed=1)
    pivots, stats = detect_pivots(records, eng, DetectConfig())
    assert stats["candidates"] < sum(len(r.steps) for r in records)  # the pre-filters pruned
    required = detection_scores(records, pivots, lambda p: p["requirement"])
    assert required["planted"] >= 12 and required["recall"] == 1.0
    overall = detection_scores(records, pivots)
    assert overall["precision"] >= 0.9
    for p in pivots:
        if p.is_pivot and p.planted is not None:
            silent = next(a for a in p.alternatives if a.reminder is None)
            assert silent.outcome == 0.0 and p.best_reminder == p.planted["reminder"]
    write_jsonl(tmp_path / "pivots.jsonl", pivots)
    write_jsonl(tmp_path / "rollouts.jsonl", records)
    assert read_jsonl(tmp_path / "pivots.jsonl", PivotRecord) == pivots
    assert read_jsonl(tmp_path / "rollouts.jsonl", LabelledRollout) == records


def test_every_turn_is_a_group_site_without_detection() -> None:
    ts = tasks(2, start=40)
    eng = engines(ts)
    records = label_rollouts(
        ts,
        eng,
        ProactiveConfig(),
        seed=1,
        prefilter=PrefilterConfig(every_step=False, state_change=False, tool_error=False, repeat=False),
    )
    sites = every_turn(records)
    assert [(s.record_id, s.step) for s in sites] == [(r.record_id, st.step) for r in records for st in r.steps]
    assert all(not s.is_pivot and not s.alternatives for s in sites)  # unlabelled, whatever the pre-filters say
    assert sum(s.planted is not None for s in sites) == sum(st.planted is not None for r in records for st in r.steps)
    (group,) = sample_pivot_groups(sites[3:4], {r.record_id: r for r in records}, eng, PivotGroupConfig(group_size=2))
    assert group.pivot_id == sites[3].pivot_id and group.metadata["step"] == sites[3].step
    with pytest.raises(ValueError):
        PivotGroupConfig(at="pivot")


@pytest.mark.parametrize("cite", [False, True])
def test_detection_compares_distinct_decisions_only(cite: bool) -> None:
    ts = tasks(2, start=30)
    eng = engines(ts, cite_ids=cite)
    records = label_rollouts(ts, eng, ProactiveConfig(cite_entries=cite), seed=0)
    pivots, _ = detect_pivots(records, eng, DetectConfig(alternatives=3, policy_samples=3))
    for p in pivots:
        reminders = [a.reminder for a in p.alternatives]
        assert len(reminders) == len(set(reminders)) <= 3 and p.alternatives[0].source == "recorded"
        assert p.spread == max(a.outcome for a in p.alternatives) - min(a.outcome for a in p.alternatives)
    # a citation (`k1: ...`) and the bank entry it restates are one decision: compared by what the agent receives
    cited = [p for p in pivots if p.planted is not None and p.alternatives[0].text.startswith("<context_for_action>k")]
    assert bool(cited) == cite
    for p in cited:
        assert p.alternatives[0].reminder == p.planted["reminder"]


# ---------------------------------------------------------------------------------------------------- groups
class Coin:
    """A Phase 2 policy that reminds of the needed fact or stays silent by a coin flip (the oracle's Phase 1)."""

    name = "coin"

    def __init__(self, truths: dict[str, Any]) -> None:
        self.oracle = ProactiveOracle(truths=truths)
        self.noisy = ProactiveOracle({"miss_rate": 0.5}, truths=truths)

    def respond(self, messages: list[Message], rng: random.Random, metadata: dict[str, Any]) -> str:
        if metadata["role"] == "bank_edit":
            return self.oracle.respond(messages, rng, metadata)
        return self.noisy.respond(messages, rng, metadata)


def test_groups_at_a_pivot_share_the_restored_state(tokenizer: Any) -> None:
    ts = tasks(3, start=40, facts=list(REQUIRED))
    truths = {t.task_id: t.truth() for t in ts}
    eng = EngineSet(
        reasoner=ScriptedEngine(ActionAgent(), tokenizer=tokenizer),
        memory=ScriptedEngine(Coin(truths), tokenizer=tokenizer),
    )
    oracle = engines(ts, tokenizer)
    # one task per labelling run (fresh engines), as in the snapshots below: equal simulated prefix-cache counts
    records = [label_rollouts([t], engines(ts, tokenizer), ProactiveConfig(), seed=4)[0] for t in ts]
    pivots, _ = detect_pivots(records, oracle, DetectConfig())
    # the last pivot of each episode: no later fatal step, so the outcome hangs on this decision alone
    found = [
        max((p for p in pivots if p.is_pivot and p.record_id == r.record_id), key=lambda p: p.step) for r in records
    ]
    by_id = {r.record_id: r for r in records}
    groups = sample_pivot_groups(found, by_id, eng, PivotGroupConfig(group_size=6))
    assert len(groups) == len(found)
    for pivot, group in zip(found, groups, strict=True):
        record = by_id[pivot.record_id]
        snaps, _ = snapshots(
            next(t for t in ts if t.task_id == pivot.task_id), engines(ts, tokenizer), ProactiveConfig(), 4, "label"
        )
        original = snaps[pivot.step]
        assert group.state == state_digest(original)  # the restored state is the labelled run's state
        assert {s.fingerprint for s in group.samples} == {group.state}  # every sample starts from it
        assert group.prompt_ids == record.calls[pivot.phase2_index].prompt_ids
        assert group.messages == original.pending().request.messages
        assert all(s.call.prompt_ids == group.prompt_ids for s in group.samples)
        for s in group.samples:  # a reminder of the needed requirement saves the episode; silence loses it
            assert s.outcome == float(s.reminder == pivot.planted["reminder"])
    assert {s.reminder is None for g in groups for s in g.samples} == {True, False}  # the coin gave both


def test_phase1_and_2_groups_sample_phase1_and_follow_with_phase2() -> None:
    ts = tasks(2, start=50, facts=list(REQUIRED))
    truths = {t.task_id: t.truth() for t in ts}
    oracle = engines(ts)
    records = label_rollouts(ts, oracle, ProactiveConfig(), seed=0)
    pivots, _ = detect_pivots(records, oracle, DetectConfig())
    found = [p for p in pivots if p.is_pivot][:2]
    noisy = EngineSet(
        reasoner=ScriptedEngine(ActionAgent()),
        memory=ScriptedEngine(ProactiveOracle({"miss_rate": 0.5, "drop_rate": 0.5}, truths=truths)),
    )
    groups = sample_pivot_groups(
        found, {r.record_id: r for r in records}, noisy, PivotGroupConfig(group_size=4, phases="phase1+2")
    )
    for group in groups:
        assert group.role == "bank_edit" and len(group.samples) == 4
        for s in group.samples:
            assert s.call.role == "bank_edit" and s.followup is not None and s.followup.role == "intervene"
            assert s.followup.step == s.call.step
            assert s.reminder == s.followup.metadata["reminder"]


# ---------------------------------------------------------------------------------------------------- compact Phase 2
def test_cited_entries_are_restated_and_the_oracle_notes_the_risk() -> None:
    from memrl.data.formats import parse_phase_prompt, render_tool_call
    from memrl.data.schemas import MemoryCall

    def save(kind: str, content: str) -> str:
        return render_tool_call(f"memory_save_{kind}", {"content": content})

    def run_memory(memory: ProactiveMemory, request: Any, text: str) -> MemoryCall:
        call = MemoryCall(call_id="c", role=request.role, text=text)
        memory.on_memory_result(request, call)
        return call

    memory = ProactiveMemory(ProactiveConfig(cite_entries=True))
    memory.reset("task: t", {"task_id": "x"})
    memory.on_turn(Turn(step=0, action_text="", observation="task: t\nnext: ls (subtask 1 of 3)", role="user"))
    run_memory(
        memory,
        memory.next_memory_request(),
        save("knowledge", "requirement: use python3.10, not python")
        + save("procedural", "pip install fails without --user: use pip install --user PKG"),
    )
    call = run_memory(memory, memory.next_memory_request(), "<context_for_action>k1, p2</context_for_action>")
    assert call.metadata["cited"] == ["k1", "p2"] and call.error is None
    assert memory.reasoner_messages("s")[-1].content.endswith(
        "requirement: use python3.10, not python; pip install fails without --user: use pip install --user PKG"
    )
    memory.after_reasoner_call()
    assert [e.used for e in memory.bank.entries] == [1, 1]
    memory.on_turn(Turn(step=1, action_text="", observation="x\nnext: ls (subtask 2 of 3)"))
    run_memory(memory, memory.next_memory_request(), "")
    call = run_memory(memory, memory.next_memory_request(), "<context_for_action>k7: a copy</context_for_action>")
    assert call.metadata["reminder"] is None and "unknown entry id" in call.error  # silence, recorded
    # a citation with a garbled copy of the entry still delivers the bank's exact text; free text stays free text
    for step, text, expected in (
        (2, "k1: use python3.99", "requirement: use python3.10, not python"),
        (3, "keep k1 in mind", "keep k1 in mind"),
    ):
        memory.after_reasoner_call()
        memory.on_turn(Turn(step=step, action_text="", observation=f"y\nnext: ls (subtask {step} of 3)"))
        run_memory(memory, memory.next_memory_request(), "")
        call = run_memory(memory, memory.next_memory_request(), f"<context_for_action>{text}</context_for_action>")
        assert call.metadata["reminder"] == expected

    # the oracle: the status names the entry the next subtask needs; Phase 2 cites it
    task = ProactiveTask({"n_subtasks": 12, "facts": list(REQUIRED)}, seed=60)
    pivot = next(p for p in task.pivots if p["fact"] == "interpreter")
    rollout = build_proactive_rollout(task, ProactiveConfig(window=1, cite_entries=True))
    oracle = ScriptedEngine(ProactiveOracle({"note_risk": True, "cite_ids": True}, truths={task.task_id: task.truth()}))
    eng = EngineSet(reasoner=ScriptedEngine(ActionAgent()), memory=oracle)
    while not (rollout.pending().role == "intervene" and rollout.step == pivot["step"]):
        rollout.advance(eng.for_call(rollout.pending()).generate([rollout.pending().request])[0])
    status = parse_phase_prompt(rollout.pending().request.messages)[3].status
    entry = next(e for e in rollout.memory.bank.entries if "python3" in e.content)
    assert status.endswith(f"; risk: {entry.entry_id}: {entry.content}")
    reply = oracle.generate([rollout.pending().request])[0].completions[0].text
    assert reply == f"<context_for_action>{entry.entry_id}: {entry.content}</context_for_action>"
    rollout.advance(oracle.generate([rollout.pending().request])[0])
    assert rollout.memory.reasoner_messages("s")[-1].content.endswith(pivot["reminder"])


# ---------------------------------------------------------------------------------------------------- one fatal pivot
def test_a_missed_single_fatal_pivot_is_detected_and_its_group_has_advantages() -> None:
    """A task with one fatal pivot, a student that misses it: detection (every bank entry tried) finds the turn, and
    the group sampled there carries non-zero advantages; a budget too small for the bank misses it and says so."""
    from memrl.data.tasks.proactive import BankWriter
    from memrl.rewards.groups import pivot_groups

    ts = tasks(4, start=60, facts=["interpreter", "output", "protected", "install_flag"], fatal_pivots=1)
    truths = {t.task_id: t.truth() for t in ts}
    assert all(sum(p["requirement"] for p in t.pivots) == 1 for t in ts)
    student = EngineSet(
        reasoner=ScriptedEngine(ActionAgent()),
        memory=ScriptedEngine(ProactiveOracle({"miss_rate": 1.0}, truths=truths)),
        by_role={"bank_edit": ScriptedEngine(BankWriter())},
    )
    records = label_rollouts(ts, student, ProactiveConfig(), seed=3)
    assert all(r.outcome == 0.0 for r in records)  # the student misses the one fatal pivot: every episode fails
    fatal = {(r.record_id, s.step) for r in records for s in r.steps if s.planted and s.planted["requirement"]}
    assert len(fatal) == len(ts)

    pivots, stats = detect_pivots(records, student, DetectConfig(policy_samples=0))
    found = {(p.record_id, p.step) for p in pivots if p.is_pivot}
    assert fatal <= found
    assert stats["bank_tried"] == stats["bank_entries"] > 2 * stats["candidates"] and stats["bank_over_budget"] == 0
    at_fatal = [p for p in pivots if (p.record_id, p.step) in fatal]
    assert all(p.best_reminder == p.planted["reminder"] for p in at_fatal if p.planted is not None)

    # a budget of 2: the recorded silence and the first bank entry only (silence repeats the recorded decision)
    _, cut = detect_pivots(records, student, DetectConfig(policy_samples=0, alternatives=2))
    assert cut["bank_tried"] == cut["candidates"] and cut["bank_over_budget"] > 0 and cut["budget"] == 2.0

    coin = EngineSet(
        reasoner=ScriptedEngine(ActionAgent()),
        memory=ScriptedEngine(Coin(truths)),
        by_role={"bank_edit": ScriptedEngine(BankWriter())},
    )
    results = sample_pivot_groups(at_fatal, {r.record_id: r for r in records}, coin, PivotGroupConfig(group_size=8))
    groups = pivot_groups(results)
    assert len(groups) == len(at_fatal)
    for group, result in zip(groups, results, strict=True):
        assert {s.outcome for s in result.samples} == {0.0, 1.0}  # the coin both caught and missed it
        assert not group.zero_variance and all(s.advantage != 0.0 for s in group.samples)
        for s in group.samples:  # caught (the reminder restates the needed requirement) -> positive advantage
            assert (s.advantage > 0) == (s.metadata["outcome"] == 1.0)


def test_fatal_misses_count_the_fatal_pivots_a_policy_missed() -> None:
    ts = tasks(3, start=70, facts=["interpreter", "output", "protected", "install_flag"], fatal_pivots=2)
    truths = {t.task_id: t.truth() for t in ts}
    for miss_rate, expected in ((0.0, False), (1.0, True)):
        eng = engines(ts, miss_rate=miss_rate)
        rollouts = [build_proactive_rollout(copy.deepcopy(t), ProactiveConfig(), seed=2) for t in ts]
        run_rollouts(rollouts, eng)
        assert [r.outcome for r in rollouts] == [float(not expected)] * len(ts)
        for rollout in rollouts:
            assert rollout.env.task_id in truths and fatal_misses(rollout) == [expected, expected]
            # the benchmark's start rule: a perfect student flips every episode (missing one pivot fails it), one
            # that misses both pivots flips none
            assert flippable(rollout.outcome, fatal_misses(rollout)) is not expected
    assert flippable(0.0, [False, True, False]) and not flippable(0.0, [True, True, False])
    assert not flippable(0.0, [False, False])  # failed with every pivot caught: no pivot decision flips it


def test_fatal_pivots_is_a_checked_setting_of_the_task_family() -> None:
    from memrl.data.tasks.proactive import ProactiveParams

    for f in (1, 2, 3):
        task = ProactiveTask({"n_subtasks": 12, "fatal_pivots": f}, seed=5)
        assert sum(p["requirement"] for p in task.pivots) == f and task.reference.outcome == 1.0
        assert ProactiveTask.from_spec(task.spec, task.task_id).plan == task.plan  # the spec rebuilds the same task
    assert (
        ProactiveTask({"n_subtasks": 12}, seed=5).plan
        == ProactiveTask({"n_subtasks": 12, "fatal_pivots": 3}, seed=5).plan
    )  # 3 of 3: the default task
    for bad in ({"fatal_pivots": 4}, {"fatal_pivots": 0}, {"facts": ["interpreter"], "fatal_pivots": 2}):
        with pytest.raises(ValueError, match="fatal_pivots"):
            ProactiveParams.model_validate(bad)
