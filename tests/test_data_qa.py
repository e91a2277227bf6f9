"""Rule-based QA: every answer replays correctly against the environment state; needles hold the evidence."""

from __future__ import annotations

import pytest

from data.qa import TEMPLATES, check_qa, replay_views
from data.tasks import make_ama_episode


@pytest.fixture(scope="module")
def episodes() -> list:
    out = []
    for env in ("textworld", "gridworld"):
        for verbosity in (0, 1, 2):
            for seed in range(2):
                out.append(make_ama_episode(env, {"verbosity": verbosity}, seed, 3000, noise=0.25, per_type=4))
    return out


def test_every_answer_replays_correctly_and_needles_hold_evidence(episodes: list) -> None:
    checked = 0
    for ep in episodes:
        views = replay_views(ep.env, ep.trajectory)
        for qa in ep.qa_pairs:
            assert check_qa(qa, ep.trajectory, views) == []
            assert all(0 <= t < len(ep.trajectory) for t in qa.needle_turns)
            checked += 1
    assert checked > 150


def test_all_types_and_templates_are_generated(episodes: list) -> None:
    types = {qa.type for ep in episodes for qa in ep.qa_pairs}
    templates = {qa.metadata["template"] for ep in episodes for qa in ep.qa_pairs}
    assert types == {"A", "B", "C", "D"}
    assert templates == set(TEMPLATES)


def test_a_wrong_answer_or_needle_is_caught(episodes: list) -> None:
    ep = episodes[0]
    views = replay_views(ep.env, ep.trajectory)
    qa = ep.qa_pairs[0].model_copy(update={"answer": "somewhere else"})
    assert any("replayed state says" in p for p in check_qa(qa, ep.trajectory, views))
    qa = next(q for q in ep.qa_pairs if q.metadata["template"] != "action_at")
    bad_turn = (qa.needle_turns[0] + len(ep.trajectory) // 2) % len(ep.trajectory)
    moved = qa.model_copy(
        update={"needle_turns": [bad_turn], "metadata": {**qa.metadata, "evidence": {str(bad_turn): ["no such text"]}}}
    )
    assert any("does not contain" in p for p in check_qa(moved, ep.trajectory, views))


def test_replay_detects_a_tampered_trajectory(episodes: list) -> None:
    ep = episodes[1]
    turns = list(ep.trajectory)
    turns[3] = turns[3].model_copy(update={"observation": "something else"})
    with pytest.raises(ValueError, match="turn 3"):
        replay_views(ep.env, turns)


def test_episode_is_in_amabench_shape(episodes: list) -> None:
    dumped = episodes[0].model_dump()
    for key in ("episode_id", "task", "task_type", "domain", "trajectory", "qa_pairs"):
        assert key in dumped
    assert set(dumped["trajectory"][0]) == {"turn_idx", "action", "observation"}
    assert {"question", "answer", "type", "needle_turns"} <= set(dumped["qa_pairs"][0])
