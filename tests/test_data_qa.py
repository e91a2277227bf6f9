"""Rule-based QA: every answer replays correctly against the environment state; needles hold the evidence."""

from __future__ import annotations

import pytest

from memrl.data.config import load_config
from memrl.data.io import read_jsonl
from memrl.data.qa import TEMPLATES, check_qa, replay_views
from memrl.data.schemas import Episode
from memrl.data.synth import SynthConfig, run_synth
from memrl.data.tasks import check_episode_qa, make_ama_episode


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


def test_chained_goal_answers_replay_correctly() -> None:
    checked: set[str] = set()
    for env in ("textworld", "gridworld"):
        for seed in range(3):
            ep = make_ama_episode(env, {"chain_length": 3, "verbosity": seed}, seed, 3000, noise=0.25, per_type=4)
            assert ep.env is not None and ep.env.params["chain_length"] == 3
            views = replay_views(ep.env, ep.trajectory)
            for qa in ep.qa_pairs:
                assert check_qa(qa, ep.trajectory, views) == []
                checked.add(qa.metadata["template"])
    assert {"goal_action", "goals_count"} <= checked  # the goal templates saw chained goals


# ---------------------------------------------------------------------------------------------------- all families
@pytest.fixture(scope="module")
def synth_episodes(tmp_path_factory: pytest.TempPathFactory) -> list[Episode]:
    """Episodes of every family as `memrl data synth` writes them (read back from its JSONL files)."""
    out = tmp_path_factory.mktemp("synth")
    sources = (
        "sources=[{family: ama, env: gridworld, count: 2, target_tokens: [1500], params: {chain_length: 3}},"
        " {family: ama, env: textworld, count: 2, target_tokens: [1500], params: {chain_length: 3}},"
        " {family: sam, count: 6, params: {horizon_steps: 12}},"
        " {family: sam, count: 6, params: {horizon_steps: 16, n_evidence: 2, repeat_evidence_frac: 0.5}},"
        " {family: proactive, count: 4, params: {n_subtasks: 10}}]"
    )
    cfg = load_config(SynthConfig, None, [sources, f"run.output_dir={out}", "run.name=s", "arrow=false"])
    assert run_synth(cfg) == 0
    return [*read_jsonl(out / "s" / "train.jsonl", Episode), *read_jsonl(out / "s" / "eval.jsonl", Episode)]


def test_every_family_written_by_synth_replays_against_the_true_state(synth_episodes: list[Episode]) -> None:
    checked: dict[str, int] = {}
    for ep in synth_episodes:
        assert check_episode_qa(ep) == []
        family = ep.metadata["family"]
        checked[family] = checked.get(family, 0) + len(ep.qa_pairs)
    assert checked["sam"] == 12 and checked["proactive"] == 20 and checked["ama"] > 40
    sam = [ep for ep in synth_episodes if ep.metadata["family"] == "sam"]
    assert any("key that opens" in ep.qa_pairs[0].question for ep in sam)  # two-hop questions were checked
    assert any(ep.metadata["repeated_evidence"] for ep in sam)


@pytest.mark.parametrize("family", ["sam", "proactive", "ama"])
def test_family_checks_catch_a_wrong_answer_a_wrong_needle_and_a_tampered_turn(
    synth_episodes: list[Episode], family: str
) -> None:
    ep = next(e for e in synth_episodes if e.metadata["family"] == family)
    qa = ep.qa_pairs[0]
    wrong = ep.model_copy(update={"qa_pairs": [qa.model_copy(update={"answer": "cupboard 99"})]})
    assert any("replayed state says" in p or "task's state says" in p for p in check_episode_qa(wrong))
    # a needle on the last turn (the question, or the final command) holds none of the evidence
    if family != "ama":
        moved = ep.model_copy(update={"qa_pairs": [qa.model_copy(update={"needle_turns": [len(ep.trajectory) - 1]})]})
        assert check_episode_qa(moved) != []
    turns = list(ep.trajectory)
    turns[2] = turns[2].model_copy(update={"observation": "something else"})
    assert any("turn 2" in p for p in check_episode_qa(ep.model_copy(update={"trajectory": turns})))
