"""SAM task family: the tour, the scripted reasoner, the oracle expert and the reference loop."""

from __future__ import annotations

import copy
import random

import pytest

from memrl.data.experts import SamOracle
from memrl.data.formats import (
    NOTHING_RELEVANT,
    SAM_REASONER_SYSTEM,
    parse_tool_calls,
    render_sam_consolidate_prompt,
    render_sam_memory_block,
    render_sam_recall_prompt,
    render_sam_recalled,
    render_tool_call,
)
from memrl.data.schemas import Episode, Message
from memrl.data.tasks import SamReasoner, SamTask, make_task, simulate_sam, task_from_episode
from memrl.data.tasks.sam import parse_facts

RNG = random.Random(0)


def _call(reply: str) -> tuple[str, dict]:
    calls = parse_tool_calls(reply).calls
    assert len(calls) == 1
    return calls[0].name, calls[0].arguments


def test_episode_shape_question_and_evidence() -> None:
    task = SamTask({"horizon_steps": 30, "n_evidence": 1}, seed=4)
    ep = task.episode()
    assert len(ep.trajectory) == 31
    assert all("\nnext: " in t.observation for t in ep.trajectory[:-1])
    assert ep.trajectory[-1].observation.endswith(f"question: {task.question}")
    qa = ep.qa_pairs[0]
    item = task.gold_entities[0]
    assert max(qa.needle_turns) <= 9  # the first 30% of the tour
    assert f"the {item} is in {qa.answer}" in ep.trajectory[qa.needle_turns[0]].observation
    assert Episode.model_validate_json(ep.model_dump_json()) == ep


def test_two_hop_evidence_sits_in_two_turns() -> None:
    task = SamTask({"horizon_steps": 40, "n_evidence": 2}, seed=1)
    key, container = task.gold_entities
    ep = task.episode()
    a, b = ep.qa_pairs[0].needle_turns
    texts = ep.trajectory[a].observation + ep.trajectory[b].observation
    assert f"the {key} opens {container}" in texts and f"the {key} is in {task.answer}" in texts


def test_step_follows_the_tour_and_restore_continues_identically() -> None:
    task = SamTask({"horizon_steps": 20}, seed=2)
    assert task.reset().endswith(f"next: {task.tour[0]}")
    for action in task.tour[:5]:
        _, done = task.step(action)
        assert not done
    snap = task.snapshot()
    rest = [task.step(a)[0] for a in task.tour[5:]]
    task.restore(snap)
    assert [task.step(a)[0] for a in task.tour[5:]] == rest
    assert rest[-1].endswith(f"question: {task.question}")
    twin = copy.deepcopy(task)
    assert twin.step("look") == task.step("look")
    assert make_task(task.spec).question == task.question


def test_reasoner_follows_next_and_answers_from_a_paraphrase() -> None:
    reasoner = SamReasoner()
    base = [
        Message(role="system", content=SAM_REASONER_SYSTEM),
        Message(role="user", content=render_sam_memory_block("t", [(0, "red key, blue cup")])),
    ]
    name, args = _call(reasoner.respond([*base, Message(role="tool", content="x\nnext: open drawer 5")], RNG, {}))
    assert (name, args) == ("act", {"action": "open drawer 5"})
    asked = [*base, Message(role="tool", content="question: where is the red key?")]
    name, args = _call(reasoner.respond(asked, RNG, {}))
    assert name == "memory" and args["page_ids"] == [0] and "red key" in args["intent"]
    recalled = [
        *asked,
        Message(role="assistant", content=render_tool_call("memory", args)),
        Message(role="user", content=render_sam_recalled(args["intent"], [0], "drawer 5 holds the red key")),
    ]
    assert _call(reasoner.respond(recalled, RNG, {})) == ("answer", {"answer": "drawer 5"})
    empty = [
        *asked,
        Message(role="assistant", content=render_tool_call("memory", args)),
        Message(role="user", content=render_sam_recalled(args["intent"], [0], NOTHING_RELEVANT)),
    ]
    assert _call(reasoner.respond(empty, RNG, {})) == ("answer", {"answer": "unknown"})


def test_oracle_cue_and_recall_follow_the_page() -> None:
    page = (
        "> open drawer 5\nyou open drawer 5.\nthe red key is in drawer 5\nthe old lamp is in drawer 5\n"
        "> open chest 7\nthe brass key opens chest 7"
    )
    oracle = SamOracle()
    cue = oracle.respond(render_sam_consolidate_prompt(3, page), RNG, {})
    assert cue == "red key, old lamp, brass key, chest 7"
    got = oracle.respond(render_sam_recall_prompt("where is the red key", 3, page, ""), RNG, {})
    assert got == "the red key is in drawer 5"
    got = oracle.respond(render_sam_recall_prompt("which key opens chest 7", 3, page, "x is y"), RNG, {})
    assert got == "x is y\nthe brass key opens chest 7"
    assert oracle.respond(render_sam_recall_prompt("where is the blue cup", 3, page, ""), RNG, {}) == NOTHING_RELEVANT
    paraphrase = SamOracle({"verbatim": 0, "paraphrase": 1})
    assert paraphrase.recall("where is the red key", page, "", RNG) == "drawer 5 holds the red key"
    assert parse_facts("drawer 5 holds the red key").location == {"red key": "drawer 5"}
    omit = SamOracle({"verbatim": 0, "omission": 1})
    assert omit.recall("where is the red key", page, "", RNG) == NOTHING_RELEVANT
    wrong = SamOracle({"error_rate": 1.0})
    assert "red key" not in wrong.cue(page, RNG, ["red key"])
    assert wrong.recall("where is the red key", page, "", RNG) != "the red key is in drawer 5"


@pytest.mark.parametrize("hops", [1, 2])
def test_oracle_in_the_loop_succeeds_and_no_memory_fails(hops: int) -> None:
    with_memory, without = 0.0, 0.0
    for seed in range(12):
        task = SamTask({"horizon_steps": 48, "n_evidence": hops}, seed=seed)
        with_memory += simulate_sam(task, SamReasoner(), SamOracle()).outcome
        without += simulate_sam(task, SamReasoner(), None).outcome
    assert with_memory == 12
    assert without == 0


def test_a_noisy_expert_fails_some_tasks() -> None:
    outcomes = [
        simulate_sam(
            SamTask({"horizon_steps": 40}, seed=s), SamReasoner(), SamOracle({"error_rate": 0.5}), seed=s
        ).outcome
        for s in range(12)
    ]
    assert 0 < sum(outcomes) < 12


def test_finish_normalises_and_task_rebuilds_from_the_episode() -> None:
    task = SamTask({"horizon_steps": 12}, seed=8)
    assert task.finish(f"The {task.answer.upper()}.") == 1.0
    assert task.finish("unknown") == 0.0
    rebuilt = task_from_episode(task.episode())
    assert rebuilt.answer == task.answer and rebuilt.tour == task.tour


def test_target_tokens_horizon() -> None:
    task = SamTask({"horizon_steps": None, "target_tokens": 4096}, seed=3)
    tokens = task.episode().horizon_tokens
    assert abs(tokens - 4096) / 4096 < 0.10
    with pytest.raises(ValueError, match="exactly one"):
        SamTask({"horizon_steps": 10, "target_tokens": 4096})
