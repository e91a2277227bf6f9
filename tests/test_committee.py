"""Committee and judge: once per parent context, cached, tolerant of failures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakes import CountEnv, FakeEngine, RecallAwareMemory, RecordingEngine

from memrl.data.schemas import MemoryCallTree
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
    Committee(CommitteeConfig(fallback="skip"), [RecordingEngine("x", "ref")], RecordingEngine("?", "j")).score(skip)
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


# ------------------------------------------------------------------------------------------- recoverability judge
def recall_group(intent: str, candidates: list[str], page: str = "the brass key opens chest 7") -> MemoryCallTree:
    """root -> one sibling group of SAM recalls under ``intent`` whose final extractions are ``candidates``."""
    from memrl.data.formats import render_sam_recall_prompt
    from memrl.data.schemas import MemoryCall, Message, TreeNode

    messages = [Message(**m) for m in render_sam_recall_prompt(intent, 3, page, "")]
    nodes = [TreeNode(node_id="root", kind="root", children=[f"a{k}" for k in range(len(candidates))])]
    nodes += [
        TreeNode(
            node_id=f"a{k}",
            parent_id="root",
            depth=1,
            kind="memory",
            group_id="g",
            call=MemoryCall(call_id=f"a{k}", role="recall", messages=messages, text=text),
        )
        for k, text in enumerate(candidates)
    ]
    return MemoryCallTree(tree_id="t", task_id="t", root_id="root", nodes=nodes)


def test_recoverability_reads_what_the_reasoner_needs_where_lexical_overlap_prefers_a_wrong_answer() -> None:
    from memrl.rewards.committee import offline_recoverability

    refs = ["the brass key opens chest 7"]
    right = "chest 7 opens with the brass key\nthe red key is in drawer 5"  # paraphrased, with a distractor
    wrong = "the iron key opens chest 7"  # the reference's wording, the wrong key
    assert offline_judge(wrong, refs) > offline_judge(right, refs)  # the lexical rubric is fooled
    assert offline_recoverability(right, refs, "which key opens chest 7") == 1.0
    assert offline_recoverability(wrong, refs, "which key opens chest 7") == 0.0
    assert offline_recoverability("nothing relevant", refs, "which key opens chest 7") == 0.0
    # the references hold no answer: a candidate claiming none is right, one claiming an answer is not
    assert offline_recoverability("nothing relevant", refs, "where is the red key") == 1.0
    assert offline_recoverability(right, refs, "where is the red key") == 0.0
    # the majority of the references sets the target; an intent no reader knows has no recoverability score
    assert offline_recoverability(wrong, [wrong, wrong, refs[0]], "which key opens chest 7") == 1.0
    assert offline_recoverability(right, refs, "summarise the page") is None


def test_committee_scores_recoverability_offline_and_falls_back_to_the_rubric_for_unknown_requests() -> None:
    tree = recall_group("which key opens chest 7", ["chest 7 opens with the brass key", "the iron key opens chest 7"])
    stats = Committee(
        CommitteeConfig(criterion="recoverability"), [RecordingEngine("the brass key opens chest 7")], None
    ).score([tree])
    assert [n.committee_score for n in tree.nodes if n.kind == "memory"] == [1.0, 0.0]
    assert stats.recoverability_fallbacks == 0
    unknown = recall_group("summarise the page", ["a", "the brass key opens chest 7"])
    stats = Committee(
        CommitteeConfig(criterion="recoverability"), [RecordingEngine("the brass key opens chest 7")], None
    ).score([unknown])
    scores = [n.committee_score for n in unknown.nodes if n.kind == "memory"]
    assert stats.recoverability_fallbacks == 1 and scores[1] == pytest.approx(1.0) and scores[0] < 0.5


def test_an_endpoint_judge_is_asked_the_recoverability_question(tmp_path: Path) -> None:
    tree = recall_group("which key opens chest 7", ["x", "y"])
    judge = RecordingEngine('[{"candidate": 1, "recoverable": 8}, {"candidate": 2, "recoverable": 0}]', "judge")
    cfg = CommitteeConfig(criterion="recoverability", cache_dir=str(tmp_path / "cache"))
    Committee(cfg, [RecordingEngine("the brass key opens chest 7")], judge).score([tree])
    assert [n.committee_score for n in tree.nodes if n.kind == "memory"] == [pytest.approx(0.8), 0.0]
    (request,) = judge.requests
    assert "recoverability" in request.messages[0].content
    assert "request:\nintent: which key opens chest 7" in request.messages[-1].content
    assert parse_judge_scores('[{"recoverable": 12}]', 1, "recoverability") == [1.0]
    assert parse_judge_scores('[{"relevance": 10, "coverage": 0, "consistency": 10}]', 1, "recoverability") is None
