"""Proactive task family: terminal state, scripted action agent, pivots, oracle Phase 1 / Phase 2, formats."""

from __future__ import annotations

import copy
import random

from memrl.data.experts import ProactiveOracle
from memrl.data.formats import (
    parse_bank,
    parse_intervention,
    parse_phase_prompt,
    parse_tool_calls,
    parse_window,
    render_bank,
    render_phase1_prompt,
    render_phase2_prompt,
    render_window,
)
from memrl.data.tasks import ActionAgent, ProactiveTask, make_task, simulate_proactive
from memrl.data.tasks.proactive import FACTS, BankWriter, window_messages

RNG = random.Random(0)


def test_reference_run_succeeds_and_pivots_are_recorded() -> None:
    task = ProactiveTask({"n_subtasks": 16}, seed=1)
    assert task.reference.outcome == 1.0
    assert task.pivots
    ep = task.episode()
    assert ep.metadata["pivots"] == task.pivots
    for pivot in task.pivots:
        assert pivot["fact"] in task.params.facts
        assert task.values[pivot["fact"]] in pivot["reminder"]
    assert make_task(task.spec).plan == task.plan


def test_oracle_in_the_loop_succeeds_and_no_memory_fails() -> None:
    with_memory, without = 0.0, 0.0
    for seed in range(12):
        task = ProactiveTask({"n_subtasks": 24}, seed=seed)
        with_memory += simulate_proactive(task, ActionAgent(), ProactiveOracle()).outcome
        without += simulate_proactive(task, ActionAgent(), None).outcome
    assert with_memory == 12
    assert without == 0


def test_needless_reminders_cost_steps_and_missed_pivots_hurt() -> None:
    task = ProactiveTask({"n_subtasks": 24}, seed=3)
    noisy = simulate_proactive(task, ActionAgent(), ProactiveOracle({"false_alarm_rate": 1.0}))
    assert noisy.wasted > task.params.slack and noisy.outcome == 0.0
    missed = simulate_proactive(task, ActionAgent(), ProactiveOracle({"miss_rate": 1.0}))
    assert missed.outcome == 0.0


def test_agent_uses_a_reminder_only_when_it_names_the_next_fact() -> None:
    task = ProactiveTask({"n_subtasks": 16}, seed=2)
    pivot = task.pivots[0]
    turns = [("", task.reset())]
    for t in task.reference.turns[1 : pivot["step"] + 1]:
        turns.append((t.action, t.observation))
    agent = ActionAgent(distraction=1.0)  # an irrelevant reminder always distracts it
    default = parse_tool_calls(agent.respond(window_messages(turns, 4, None), RNG, {})).calls[0]
    reminded = parse_tool_calls(agent.respond(window_messages(turns, 4, pivot["reminder"]), RNG, {})).calls[0]
    assert default.arguments["action"] != reminded.arguments["action"]
    # the reminded command uses the fact (for "never touch X" it leaves X out of the cleanup)
    assert (task.values[pivot["fact"]] in reminded.arguments["action"]) == (pivot["fact"] != "protected")
    wasted = parse_tool_calls(agent.respond(window_messages(turns, 4, "requirement: be nice"), RNG, {})).calls[0]
    assert wasted.arguments["action"] == "pwd"


def test_restore_continues_identically_and_violations_fail_the_verifier() -> None:
    task = ProactiveTask({"n_subtasks": 16}, seed=4)
    task.reset()
    actions = [t.action for t in task.reference.turns[1:]]
    for a in actions[:5]:
        task.step(a)
    snap = task.snapshot()
    rest = [task.step(a) for a in actions[5:]]
    assert task.finish(None) == 1.0
    task.restore(snap)
    task.step("rm -rf build/tmp data/*/tmp")  # diverge, then restore again: the same observations, the same outcome
    task.restore(snap)
    assert [task.step(a) for a in actions[5:]] == rest and task.finish(None) == 1.0
    task.restore(snap)
    twin = copy.deepcopy(task)
    twin.step(f"rm -rf {task.values['protected']}")
    assert twin.s.violations and task.s.violations == []


def test_phase1_writes_the_bank_and_phase2_reminds_before_a_pivot() -> None:
    task = ProactiveTask({"n_subtasks": 16}, seed=5)
    oracle = ProactiveOracle()
    window = render_window([(0, "", task.reset())])
    reply = oracle.respond(
        render_phase1_prompt(task.task, window, render_bank("", [], [])), RNG, {"truth": task.truth()}
    )
    names = [c.name for c in parse_tool_calls(reply).calls]
    assert names[0] == "memory_update_status" and names.count("memory_save_knowledge") == 3
    pivot = task.pivots[0]
    turns = task.reference.turns
    steps = [(t.turn_idx, t.action, t.observation) for t in turns[max(0, pivot["step"] - 3) : pivot["step"] + 1]]
    bank = render_bank("s", [("k1", pivot["reminder"])], [])
    reminder, error = parse_intervention(
        oracle.respond(render_phase2_prompt(task.task, render_window(steps), bank), RNG, {"truth": task.truth()})
    )
    assert error is None and reminder == pivot["reminder"]
    quiet = [(t.turn_idx, t.action, t.observation) for t in turns[1:3]]
    silent = oracle.respond(render_phase2_prompt(task.task, render_window(quiet), bank), RNG, {"truth": task.truth()})
    assert parse_intervention(silent) == (None, None)


def test_proactive_formats_round_trip() -> None:
    bank_text = render_bank("at subtask 3", [("k1", "requirement: x"), ("k4", "y")], [("p2", "pip needs --user")])
    bank = parse_bank(bank_text)
    assert bank.status == "at subtask 3" and bank.knowledge == {"k1": "requirement: x", "k4": "y"}
    assert bank.procedural == {"p2": "pip needs --user"}
    steps = [(0, "", "task: t\nnext: a (subtask 1 of 2)"), (1, "ls", "a b\nnext: b (subtask 2 of 2)")]
    assert parse_window(render_window(steps)) == steps
    for phase, render in ((1, render_phase1_prompt), (2, render_phase2_prompt)):
        parsed = parse_phase_prompt(render("task: t", render_window(steps), bank_text))
        assert parsed is not None
        assert parsed[0] == phase and parsed[1] == "task: t" and parse_window(parsed[2]) == steps
        assert parsed[3] == bank


def _writer_in_the_loop(oracle: ProactiveOracle) -> object:
    """Phase 1 by the bank writer, Phase 2 by ``oracle`` (one scripted memory policy for simulate_proactive)."""

    class Both:
        def respond(self, messages: list, rng: random.Random, metadata: dict) -> str:
            if metadata["role"] == "bank_edit":
                return BankWriter().respond(messages, rng, {})  # no truth reaches Phase 1
            return oracle.respond(messages, rng, metadata)

    return Both()


def test_bank_writer_records_what_was_seen_and_never_the_plan() -> None:
    task = ProactiveTask({"n_subtasks": 12}, seed=7)
    first = render_phase1_prompt(task.task, render_window([(0, "", task.reset())]), render_bank("", [], []))
    writer = BankWriter()
    reply = writer.respond(first, RNG, {})
    # the reply depends on the prompt alone: the task's truth (plan, values, pivots) changes nothing
    assert writer.respond(first, RNG, {"truth": task.truth(), "task_id": task.task_id}) == reply
    saved = [c.arguments["content"] for c in parse_tool_calls(reply).calls if c.name == "memory_save_knowledge"]
    assert sorted(saved) == sorted(FACTS[k].sentence(task.values[k]) for k in ("interpreter", "output", "protected"))
    status = next(c.arguments["content"] for c in parse_tool_calls(reply).calls if c.name == "memory_update_status")
    assert "risk" not in status and status.startswith("at subtask 1 of")
    # a failed command and the diagnosis its output states are recorded; the next step repeats nothing
    failed = [
        (
            3,
            "pip install numpy",
            "error: externally-managed-environment\nhint: pip install --user numpy\n"
            "next: install numpy (subtask 2 of 12)",
        )
    ]
    bank = render_bank("at subtask 2 of 12: install numpy", [("k1", saved[0])], [])
    calls = parse_tool_calls(
        writer.respond(render_phase1_prompt(task.task, render_window(failed), bank), RNG, {})
    ).calls
    procedural = [c.arguments["content"] for c in calls if c.name == "memory_save_procedural"]
    assert procedural == [
        "failed: pip install numpy -> error: externally-managed-environment",
        FACTS["install_flag"].sentence("--user"),
    ]
    assert not any(c.name == "memory_delete" for c in calls)
    full = render_bank(
        "at subtask 2 of 12: install numpy",
        [(f"k{i}", s) for i, s in enumerate(saved, 1)],
        [("p4", procedural[0]), ("p5", procedural[1])],
    )
    assert writer.respond(render_phase1_prompt(task.task, render_window(failed), full), RNG, {}) == ""


def test_prompted_phase2_over_the_written_bank_beats_no_memory() -> None:
    passed = without = 0.0
    for seed in range(8):
        task = ProactiveTask({"n_subtasks": 16}, seed=seed)
        oracle = ProactiveOracle({"cite_ids": True})
        run = simulate_proactive(task, ActionAgent(), _writer_in_the_loop(oracle), k=2)
        passed += run.outcome
        without += simulate_proactive(task, ActionAgent(), None, k=2).outcome
    assert passed == 8 and without == 0
