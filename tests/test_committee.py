"""Committee and judge: once per parent context, cached, tolerant of failures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakes import CountEnv, FakeEngine, RecallAwareMemory, RecordingEngine

from memrl.rewards.committee import Committee, CommitteeConfig, offline_judge, parse_judge_scores
from memrl.rollout.engines.base import Engine
from memrl.rollout.loop import EngineSet, Rollout
from memrl.rollout.tree import TreeConfig, build_trees


def trees(n_tasks: int = 2):
    def make(task: str, rid: str) -> Rollout:
        return Rollout(CountEnv(task), RecallAwareMemory(), reasoner_system="s", rollout_id=rid)

    eng = EngineSet(reasoner=FakeEngine("reasoner", good_marker="part b#1"), memory=FakeEngine("memory"))
    out, _ = build_trees(
        [f"t{i}" for i in range(n_tasks)], make, eng, TreeConfig(branch_factor=2, max_branch_depth=2, max_leaves=8)
    )
    return out


def judge_reply(last: str, metadata: dict[str, Any]) -> str:
    n = last.split("candidates:\n")[1].count("\n") + 1
    return json.dumps(
        [{"candidate": i + 1, "relevance": 10, "coverage": 10 * (i % 2), "consistency": 10} for i in range(n)]
    )


def test_one_committee_and_judge_call_per_parent_context_and_warm_cache(tmp_path: Path) -> None:
    ts = trees(2)  # 3 sibling groups per tree
    refs = [RecordingEngine("part b#1", "ref-a"), RecordingEngine("part b", "ref-b")]
    judge = RecordingEngine(judge_reply, "judge")
    cfg = CommitteeConfig(cache_dir=str(tmp_path / "cache"))
    stats = Committee(cfg, refs, judge).score(ts)
    assert stats.groups == 6
    assert [len(r.requests) for r in refs] == [6, 6] and [r.calls for r in refs] == [1, 1]  # batched, not per sibling
    assert len(judge.requests) == 6 and judge.calls == 1
    scored = [n for t in ts for n in t.nodes if n.kind == "memory"]
    assert all(n.committee_score is not None for n in scored)
    assert sorted({round(n.committee_score, 6) for n in scored}) == [pytest.approx(2 / 3), 1.0]
    # the judge saw the union of both references
    assert "[1] part b#1\n[2] part b" in judge.requests[0].messages[-1].content
    # a rerun on the same inputs with a warm cache makes no committee or judge call
    refs2 = [RecordingEngine("x", "ref-a"), RecordingEngine("y", "ref-b")]
    judge2 = RecordingEngine(judge_reply, "judge")
    fresh = trees(2)
    stats2 = Committee(cfg, refs2, judge2).score(fresh)
    assert [r.calls for r in refs2] == [0, 0] and judge2.calls == 0 and stats2.cache_hits == 12 + 6
    assert [n.committee_score for t in fresh for n in t.nodes] == [n.committee_score for t in ts for n in t.nodes]


def test_unreadable_judge_falls_back_and_is_counted() -> None:
    ts = trees(1)
    committee = Committee(
        CommitteeConfig(fallback="offline"),
        [RecordingEngine("part a#1", "ref")],
        RecordingEngine("I think they are fine", "judge"),
    )
    stats = committee.score(ts)
    assert stats.failures == 3 and stats.fallbacks == 3
    scores = {n.call.text: n.committee_score for n in ts[0].nodes if n.kind == "memory"}
    assert scores["part a#1"] == pytest.approx(1.0) and scores["part a#0"] < 1.0
    skip = trees(1)
    Committee(CommitteeConfig(fallback="skip"), [RecordingEngine("x", "ref")], RecordingEngine("?", "j")).score(
        skip
    )
    assert all(n.committee_score is None for n in skip[0].nodes)


def test_dead_reference_engine_is_not_fatal() -> None:
    class Dead(Engine):
        name = "dead"

        def generate(self, requests):
            raise ConnectionError("endpoint down")

    ts = trees(1)
    stats = Committee(CommitteeConfig(), [Dead()], None).score(ts)
    assert stats.failures == 3 and all(n.committee_score is None for n in ts[0].nodes)


def test_empty_answers_are_counted_not_cached_and_token_limits_key_the_cache(tmp_path: Path) -> None:
    cfg = CommitteeConfig(cache_dir=str(tmp_path / "cache"))
    silent = RecordingEngine("  ", "ref")
    stats = Committee(cfg, [silent], None).score(trees(1))
    assert stats.failures == 3 and stats.fallbacks == 3 and not list((tmp_path / "cache").rglob("*.json"))
    answering = RecordingEngine("part b#1", "ref")
    assert Committee(cfg, [answering], None).score(trees(1)).cache_hits == 0 and answering.calls == 1
    again = RecordingEngine("part b#1", "ref")
    assert Committee(cfg, [again], None).score(trees(1)).cache_hits == 3 and again.calls == 0
    longer = RecordingEngine("part b#1", "ref")  # a different token limit is a different question
    Committee(cfg.model_copy(update={"reference_max_tokens": 64}), [longer], None).score(trees(1))
    assert longer.calls == 1


def test_committee_members_answer_concurrently() -> None:
    import threading

    meeting = threading.Barrier(2, timeout=10)

    class Waiting(RecordingEngine):
        def generate(self, requests):
            meeting.wait()  # each member waits for the other: only concurrent calls get past
            return super().generate(requests)

    refs = [Waiting("part b#1", "ref-a"), Waiting("part b", "ref-b")]
    stats = Committee(CommitteeConfig(), refs, None).score(trees(1))
    assert stats.failures == 0 and [r.calls for r in refs] == [1, 1]


def test_offline_judge_and_parser() -> None:
    ref = ["the red key is in drawer 5"]
    assert offline_judge("the red key is in drawer 5", ref) == pytest.approx(1.0)
    assert offline_judge("nothing relevant", ref) == pytest.approx(1 / 3)  # no numbers: consistent, but no content
    assert offline_judge("the red key is in drawer 7", ref) < offline_judge("the red key is in drawer", ref)
    assert offline_judge("", ref) == 0.0
    assert parse_judge_scores('ok: [{"relevance": 10, "coverage": 0, "consistency": 10}]', 1) == [pytest.approx(2 / 3)]
    assert parse_judge_scores('[{"relevance": 10}]', 1) is None
    assert parse_judge_scores("[1, 2]", 3) is None
