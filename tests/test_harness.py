"""The evaluation harness: Rollout.add_turn, the programmatic reader, ingest-once QA, tasks, and ``memrl eval`` with
resume after an interruption."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

import memrl.launch.evaluation.run as evaluate_module
from memrl.data.config import load_config
from memrl.data.formats import parse_tool_calls, render_tool_call
from memrl.data.schemas import Message
from memrl.data.tasks import SamTask, make_ama_episode
from memrl.launch.evaluation.config import EvalConfig
from memrl.launch.evaluation.run import evaluate, load_results
from memrl.rollout.engines.scripted import ScriptedEngine
from memrl.rollout.evaluation.extractive import ExtractiveMemoryModel
from memrl.rollout.evaluation.qa import ReplayEnv, run_qa
from memrl.rollout.evaluation.reader import NOT_IN_CONTEXT, Evidence, EvidenceReader, ReaderQuestion, question_evidence
from memrl.rollout.evaluation.tasks import evaluate_sam_memory
from memrl.rollout.loop import EngineSet, Rollout, run_rollouts
from memrl.rollout.memory.base import Turn
from memrl.rollout.models import load_tokenizer
from tests.fakes import CountEnv, FakeEngine, TwoCallMemory

ROOT = Path(__file__).resolve().parents[1]
PAGED = {"page_turns": 1, "live_capacity_turns": 4, "keep_recent_turns": 3}
ALL_SYSTEMS = [
    {"memory": {"name": "sam", **PAGED}},
    {"memory": {"name": "long_context"}},
    {"memory": {"name": "bm25", **PAGED}},
    {"memory": {"name": "embedding", "embedder": "hashing", **PAGED}},
    {"memory": {"name": "mage"}},
    {"memory": {"name": "memma", "embedder": "hashing"}},
    {"memory": {"name": "ama_agent", "embedder": "hashing"}},
    {"memory": {"name": "proactive", "action_window": 4}},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return load_tokenizer(tiny_model_dir)


def tiny_config(
    tmp_path: Path, tiny_model_dir: Path, systems: list[dict[str, Any]] | None = None, **extra: Any
) -> EvalConfig:
    data = {
        "run": {"output_dir": str(tmp_path), "name": "ev"},
        "datasets": [
            {
                "name": "ama",
                "kind": "ama_synthetic",
                "envs": ["textworld"],
                "target_tokens": [400, 700],
                "episodes_per_setting": 1,
                "per_type": 1,
            }
        ],
        "systems": systems or ALL_SYSTEMS,
        "tokenizer": str(tiny_model_dir),
        "episodes_per_batch": 1,
        **extra,
    }
    return EvalConfig.model_validate(data)


# ----------------------------------------------------------------------------------------------------------------
# Rollout.add_turn


def test_add_turn_drops_a_cached_reasoner_call_and_refuses_during_memory_work() -> None:
    rollout = Rollout(CountEnv("t"), TwoCallMemory(), reasoner_system="sys")
    before = rollout.pending()
    assert before is not None and before.kind == "reasoner" and "start" in before.request.messages[-1].content
    rollout.add_turn(Turn(step=5, action_text="", observation="question: how many?", role="user"))
    after = rollout.pending()
    assert after is not before and after.request.messages[-1].content.endswith("question: how many?")
    assert rollout.step == 5 and rollout.pending() is after  # cached again until advanced
    rollout.memory.on_tool_call(parse_tool_calls(render_tool_call("memory", {"intent": "x"})).calls[0], 5)
    rollout._pending = None
    assert rollout.pending().kind == "memory"
    with pytest.raises(RuntimeError, match="memory call is pending"):
        rollout.add_turn(Turn(step=6, action_text="", observation="late", role="user"))


def test_add_turn_then_run_to_the_end() -> None:
    rollout = Rollout(CountEnv("t"), TwoCallMemory(), reasoner_system="sys")
    rollout.add_turn(Turn(step=0, action_text="", observation="ticks=3", role="tool"))
    (trace,) = run_rollouts([rollout], EngineSet(reasoner=FakeEngine("reasoner"), memory=FakeEngine("memory")))
    assert trace.events[0].kind == "memory_tool"  # the added turn is what the reasoner saw first


# ----------------------------------------------------------------------------------------------------------------
# the reader


def _ask(reader: EvidenceReader, system: str, context: str, step: int = 10) -> str:
    messages = [Message(role="system", content=system), Message(role="user", content=context)]
    return reader.respond(messages, random.Random(0), {"task_id": "e", "rollout_id": "r", "step": step})


def test_reader_answers_only_from_evidence_in_its_context() -> None:
    reader = EvidenceReader()
    reader.register("e", "r", ReaderQuestion("where is the red key?", "drawer 5", Evidence(all_of=["drawer 5"]), 10))
    retrieval = "Tools: act(action) ...; memory(intent) retrieves ...; answer(answer) ends the task."
    found = parse_tool_calls(_ask(reader, retrieval, "the red key is in drawer 5\nwhere is the red key?")).calls[0]
    assert found.name == "answer" and found.arguments["answer"] == "drawer 5"
    call = parse_tool_calls(_ask(reader, retrieval, "where is the red key?")).calls[0]
    assert call.name == "memory" and call.arguments == {"intent": "where is the red key?"}
    spent = parse_tool_calls(_ask(reader, retrieval, "where is the red key?", step=12)).calls[0]  # budget 2 used
    assert spent.name == "answer" and spent.arguments["answer"] == NOT_IN_CONTEXT
    # the question text itself is not evidence
    reader.register("e", "r", ReaderQuestion("is it drawer 5?", "yes", Evidence(all_of=["drawer 5"]), 10))
    assert "yes" not in _ask(reader, "no tools", "is it drawer 5?")


def test_reader_picks_sam_pages_by_cue_overlap() -> None:
    reader = EvidenceReader()
    reader.register("e", "r", ReaderQuestion("where is the red key?", "drawer 5", Evidence(all_of=["drawer 5"]), 10))
    sam = "Tools: act(action) acts; memory(intent, page_ids) recalls earlier pages; answer(answer) ends the task."
    block = "task: t\nmemory cues:\np0: kitchen, blue cup\np1: red key, small drawer\np2: hall, red lamp"
    call = parse_tool_calls(_ask(reader, sam, block)).calls[0]
    assert call.arguments["page_ids"] == [1, 2]


def test_question_evidence_sources() -> None:
    episode = make_ama_episode("textworld", {}, 1, 500, per_type=1)
    qa = episode.qa_pairs[0]
    assert question_evidence(episode, qa).all_of == [s for v in qa.metadata["evidence"].values() for s in v]
    bare = qa.model_copy(update={"metadata": {}})
    assert question_evidence(episode, bare).all_of == [episode.trajectory[n].observation for n in qa.needle_turns]
    none = bare.model_copy(update={"needle_turns": [], "metadata": {"alternatives": ["x", "y"]}})
    assert question_evidence(episode, none).any_of == [qa.answer, "x", "y"]


# ----------------------------------------------------------------------------------------------------------------
# QA mode


def test_ingestion_runs_once_per_episode_and_questions_fork(tokenizer: Any) -> None:
    episode = make_ama_episode("textworld", {}, 3, 700, per_type=2)
    reader = EvidenceReader()
    memory = ScriptedEngine(ExtractiveMemoryModel(), tokenizer=tokenizer)
    engines = EngineSet(reasoner=ScriptedEngine(reader, tokenizer=tokenizer), memory=memory)
    records = list(
        run_qa([episode], {"name": "sam", **PAGED}, engines, dataset="d", system="sam", model="m", reader=reader)
    )
    assert len(records) == len(episode.qa_pairs) == 8
    ingested = {r["memory_tokens_ingest"]["calls"] for r in records}
    assert len(ingested) == 1 and min(ingested) > 3  # one cue per page of the trajectory, made once for all
    # a fork only adds the cues of pages cut while answering (the question and recalled content grow the context)
    assert all(r["stats"]["sam_consolidate_calls"] - min(ingested) <= r["memory_calls_answer"] for r in records)
    assert all(
        r["memory_tokens_ingest_share"]["prompt"] * 8 == pytest.approx(r["memory_tokens_ingest"]["prompt"])
        for r in records
    )
    assert all(r["reasoner_tokens"]["spent"] > 0 for r in records)
    assert any(r["stats"].get("sam_recalls", 0) for r in records)  # the reader used SAM's memory tool
    # skipping finished items answers only the rest, from a fresh ingestion
    again = list(
        run_qa(
            [episode],
            {"name": "sam", **PAGED},
            engines,
            dataset="d",
            system="sam",
            model="m",
            reader=reader,
            skip={r["key"] for r in records[:5]},
        )
    )
    assert [r["key"] for r in again] == [r["key"] for r in records[5:]]
    assert [r["answer"] for r in again] == [r["answer"] for r in records[5:]]


def test_replay_env_refuses_actions() -> None:
    env = ReplayEnv(make_ama_episode("gridworld", {}, 0, 300, per_type=1))
    observation, over = env.step("go north")
    assert "recorded trajectory" in observation and not over and env.finish("x") == 0.0


def test_eval_runs_every_system_side_by_side_with_tokens(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = tiny_config(tmp_path, tiny_model_dir)
    summary = evaluate(cfg, tmp_path / "ev")
    rows = {r["system"]: r for r in summary["datasets"]["ama"]["overall"]}
    assert set(rows) == {"sam", "long_context", "bm25", "embedding", "mage", "memma", "ama_agent", "proactive"}
    assert all(r["n"] == 8 and r["reasoner_tokens"] > 0 for r in rows.values())
    assert rows["long_context"]["judge_acc"] == 1.0  # everything fits the window: the reader finds all evidence
    assert all(rows[s]["memory_tokens"] > 0 for s in ("sam", "mage", "memma", "ama_agent", "proactive"))
    assert rows["bm25"]["memory_tokens"] == 0  # no memory model
    report = (tmp_path / "ev" / "report.md").read_text()
    assert "programmatic reader" in report and "reasoner tok/q" in report and "memory tok/q" in report
    for system in rows:
        assert f"| {system} | scripted |" in report
    assert "Official metric: AMA-Bench judge accuracy by QA type" in report and "| all | A | B | C | D |" in report
    assert "400 tok" in report and "700 tok" in report  # the horizon breakdown
    assert "?" not in report.split("by horizon")[1]
    # every score is a mean with its 95% bootstrap interval
    lc = rows["long_context"]
    assert lc["judge_acc_ci"] == [1.0, 1.0] and "1.000 [1.00, 1.00]" in report
    sam = rows["sam"]
    assert sam["judge_acc_ci"][0] <= sam["judge_acc"] <= sam["judge_acc_ci"][1]
    per_question = (tmp_path / "ev" / "per_question.tsv").read_text().splitlines()
    assert per_question[0].split("\t")[:7] == ["dataset", "episode", "item", "system", "model", "type", "official"]
    assert len(per_question) == 1 + 8 * len(rows) and per_question[1:] == sorted(per_question[1:])


def test_eval_resumes_after_an_interruption_without_duplicates(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    systems = [{"memory": {"name": "sam", **PAGED}}, {"memory": {"name": "long_context"}}]
    reference = evaluate(tiny_config(tmp_path / "a", tiny_model_dir, systems), tmp_path / "a")
    expected = {r["key"]: r["answer"] for r in load_results(tmp_path / "a" / "results.jsonl")}
    assert len(expected) == reference["items"] == 16

    real_append = evaluate_module.append_jsonl
    calls = {"n": 0}

    def interrupted(path: Any, record: Any) -> None:
        calls["n"] += 1
        if calls["n"] > 5:
            raise KeyboardInterrupt
        real_append(path, record)

    monkeypatch.setattr(evaluate_module, "append_jsonl", interrupted)
    run = tmp_path / "b" / "ev"
    with pytest.raises(KeyboardInterrupt):
        evaluate(tiny_config(tmp_path / "b", tiny_model_dir, systems), run)
    monkeypatch.setattr(evaluate_module, "append_jsonl", real_append)
    with open(run / "results.jsonl", "ab") as fh:  # a writer killed mid-line
        fh.write(b'{"key": "ama|torn')
    first = (run / "results.jsonl").read_bytes().split(b"\n")[:5]
    summary = evaluate(tiny_config(tmp_path / "b", tiny_model_dir, systems), run)
    lines = (run / "results.jsonl").read_bytes().split(b"\n")
    assert lines[:5] == first and lines[-1] == b""  # finished rows kept as they were, the torn tail cut
    keys = [json.loads(line)["key"] for line in lines if line]
    assert len(keys) == len(set(keys)) == 16
    assert summary["resumed_items"] == 5 and summary["written_this_run"] == 11
    assert {r["key"]: r["answer"] for r in load_results(run / "results.jsonl")} == expected
    again = evaluate(tiny_config(tmp_path / "b", tiny_model_dir, systems), run)
    assert again["written_this_run"] == 0 and len((run / "results.jsonl").read_bytes().split(b"\n")) == 17


def test_checked_in_config_loads() -> None:
    cfg = load_config(EvalConfig, ROOT / "configs" / "eval_ama_synthetic.yaml")
    assert [s.name for s in cfg.systems] == [
        "sam",
        "long_context",
        "bm25",
        "embedding",
        "mage",
        "memma",
        "ama_agent",
        "proactive",
    ]


# ----------------------------------------------------------------------------------------------------------------
# tasks


def test_sam_tasks_entry_point_returns_success_and_tokens(tokenizer: Any) -> None:
    tasks = [SamTask({"horizon_steps": 8}, seed=s, task_id=f"t{s}") for s in range(3)]
    result = evaluate_sam_memory(tasks, None, {"name": "sam", **PAGED}, samples=1, tokenizer=tokenizer)
    assert result["success_greedy"] == 1.0 and result["success_sampled"] is not None
    assert result["reasoner_tokens_per_task"] > 0 and result["memory_tokens_per_task"] > 0
    assert list(result["by_horizon"]) == ["8 steps"] and len(result["records"]) == 6


def test_eval_on_task_families_and_loaded_formats(tmp_path: Path, tiny_model_dir: Path) -> None:
    fixtures = ROOT / "tests" / "fixtures"
    cfg = EvalConfig.model_validate(
        {
            "run": {"output_dir": str(tmp_path), "name": "ev"},
            "datasets": [
                {"name": "sam", "kind": "sam", "tasks": {"family": "sam", "count": 2, "sam": {"horizon_steps": 6}}},
                {
                    "name": "pro",
                    "kind": "proactive",
                    "tasks": {"family": "proactive", "count": 1, "proactive": {"n_subtasks": 6}},
                },
                {"name": "locomo", "kind": "locomo", "path": str(fixtures / "locomo_small.json")},
                {"name": "arena", "kind": "memoryarena", "path": str(fixtures / "memoryarena_small.jsonl")},
                {"name": "amab", "kind": "amabench", "path": str(fixtures / "amabench_small.jsonl")},
            ],
            "systems": [{"memory": {"name": "long_context"}}, {"memory": {"name": "proactive"}}],
            "tokenizer": str(tiny_model_dir),
        }
    )
    summary = evaluate(cfg, tmp_path / "ev")
    data = summary["datasets"]
    assert [r["system"] for r in data["sam"]["greedy"]] == ["long_context"]
    assert [r["system"] for r in data["pro"]["greedy"]] == ["proactive"]
    assert data["pro"]["greedy"][0]["success"] == 1.0  # the oracle expert reminds the scripted agent in time
    assert "by_category" in data["locomo"] and data["locomo"]["overall"][0].get("locomo_judge") is not None
    assert {r["system"] for r in data["arena"]["overall"]} == {"long_context", "proactive"}
    assert any("sam x proactive" in s for s in summary["skipped"])
    report = (tmp_path / "ev" / "report.md").read_text()
    assert "Official metric: LoCoMo F1 by category" in report and "success (greedy)" in report
    assert "Official metric: MemoryArena task success rate" in report
    assert {r["system"] for r in data["arena"]["tasks"]} == {"long_context", "proactive"}
    assert all(r["n"] == 2 and 0 <= r["success"] <= r["progress"] <= 1 for r in data["arena"]["tasks"])


def test_engines_from_config_replace_the_reader_and_the_judge(tmp_path: Path, tiny_model_dir: Path) -> None:
    scripted = {"backend": "scripted", "tokenizer": str(tiny_model_dir)}
    cfg = tiny_config(
        tmp_path,
        tiny_model_dir,
        [{"memory": {"name": "long_context"}}],
        reasoner={
            **scripted,
            "name": "model-reasoner",
            "scripted_policy": "memrl.rollout.evaluation.reader:EvidenceReader",
        },
        judge={**scripted, "name": "judge", "scripted_policy": "memrl.rewards.scorers:LexicalJudge"},
        models=[
            {
                "name": "extractive",
                "engine": {**scripted, "scripted_policy": "memrl.rollout.evaluation.extractive:ExtractiveMemoryModel"},
            }
        ],
    )
    summary = evaluate(cfg, tmp_path / "ev")
    (row,) = summary["datasets"]["ama"]["overall"]
    # a reader nobody registered questions with knows no gold answers: every answer is "not mentioned"
    assert row["model"] == "extractive" and row["judge_acc"] == 0.0 and row["reasoner_tokens"] > 0
    assert summary["reader"] == "model-reasoner" and summary["judge"] == "judge"
    assert "programmatic reader" not in (tmp_path / "ev" / "report.md").read_text()
