"""The ready-made recipes for evaluating served models on LoCoMo, AMA-Bench and MemoryArena: they load, show, dry-run
(printing the files and endpoints they need), and the LoCoMo recipe runs end to end against a real vLLM
OpenAI-compatible server; the scripted defaults on a LoCoMo-format conversation give SAM a nonzero score, or say
plainly that it needs a real memory model."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmark_files import write_amabench, write_locomo, write_memoryarena

from memrl.data.config import load_config
from memrl.launch.cli import main
from memrl.launch.evaluation.config import EvalConfig
from memrl.launch.evaluation.run import evaluate
from memrl.rollout.evaluation.extractive import ExtractiveMemoryModel

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {name: ROOT / "configs" / f"eval_{name}.yaml" for name in ("locomo", "amabench", "memoryarena")}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_shows_and_dry_runs(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["config", "show", "--config", str(RECIPES[name])]) == 0
    shown = capsys.readouterr().out
    assert "command: eval" in shown and "backend: openai" in shown
    write_locomo(tmp_path / "locomo10.json")
    write_amabench(tmp_path / "open_end_qa_set.jsonl")
    write_memoryarena(tmp_path / "group_travel_planner.jsonl")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert (
        main(
            [
                "eval",
                "--config",
                str(RECIPES[name]),
                "--dry-run",
                f"data_dir={tmp_path}",
                f"run.output_dir={tmp_path / 'runs'}",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "http://127.0.0.1:8001/v1 model 'memory'" in out and "reasoner: OpenAI-compatible endpoint" in out
    assert "judge: OpenAI-compatible endpoint" in out and "tokenizer runs/export/model" in out
    files = {
        "locomo": ["locomo10.json (found)"],
        "amabench": ["open_end_qa_set.jsonl (found)"],
        "memoryarena": ["group_travel_planner.jsonl (found)", "formal_reasoning_math.jsonl (NOT FOUND)"],
    }[name]
    for line in files:
        assert f"{tmp_path}/{line}" in out
    if name == "locomo":
        assert "key from $OPENAI_API_KEY (NOT SET)" in out
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing


def _locomo_eval(tmp_path: Path, tiny_model_dir: Path) -> EvalConfig:
    path = write_locomo(tmp_path / "locomo10.json", turns_per_session=80)
    return EvalConfig.model_validate(
        {
            "run": {"output_dir": str(tmp_path), "name": "ev"},
            "datasets": [{"name": "locomo", "kind": "locomo", "path": str(path)}],
            "systems": [{"memory": {"name": "sam"}}, {"memory": {"name": "bm25"}}],
            "tokenizer": str(tiny_model_dir),
        }
    )


def test_scripted_sam_on_a_real_locomo_conversation_scores(tmp_path: Path, tiny_model_dir: Path) -> None:
    summary = evaluate(_locomo_eval(tmp_path, tiny_model_dir), tmp_path / "ev")
    rows = {r["system"]: r for r in summary["datasets"]["locomo"]["overall"]}
    sam = rows["sam"]
    # the conversation (320 turns) is paged; the scripted cues and recalls surface lexically findable evidence
    assert sam["memory_tokens"] > 0 and sam["evidence_in_context"] > 0 and sam["locomo"] > 0
    assert summary["datasets"]["locomo"]["needs_model"] == []
    report = (tmp_path / "ev" / "report.md").read_text()
    assert "needs a real memory model" not in report
    assert "LoCoMo F1 by horizon" in report and "<=" in report.split("LoCoMo F1 by horizon")[1]


def test_a_system_that_surfaces_nothing_is_reported_as_needing_a_real_model(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ExtractiveMemoryModel, "_recall", lambda self, messages, user: "nothing relevant")
    monkeypatch.setattr(ExtractiveMemoryModel, "_consolidate", lambda self, messages, user: "small talk")
    summary = evaluate(_locomo_eval(tmp_path, tiny_model_dir), tmp_path / "ev")
    assert summary["datasets"]["locomo"]["needs_model"] == [["sam", "scripted"]]
    report = (tmp_path / "ev" / "report.md").read_text()
    assert "**sam x scripted:** the scripted memory model surfaced none of the questions' evidence" in report


# ----------------------------------------------------------------------------------------------------------------
# The LoCoMo recipe against a real vLLM OpenAI-compatible server on the tiny model (one server for the three roles)


# protects: the LoCoMo eval recipe end to end with reasoner, memory model and judge behind one real vLLM server (16K
# context)
@pytest.mark.slow
@pytest.mark.vllm
def test_locomo_recipe_end_to_end_against_a_vllm_server(tmp_path: Path, vllm_server_16k: tuple[str, Path]) -> None:
    # the session's server (tests/conftest.py): the tiny model with 16K positions, as the untrained reasoner's
    # replies pile up in its context
    url, tiny_model_dir = vllm_server_16k
    endpoint = f"[{{url: '{url}', model: tiny, max_concurrency: 8}}]"
    # 96 turns (about 2900 of the tiny model's tokens): over SAM's live capacity (2048 tokens); two of its questions
    # take every role through the server for each system
    write_locomo(tmp_path / "locomo10.json", turns_per_session=24)
    cfg = load_config(
        EvalConfig,
        RECIPES["locomo"],
        [
            f"data_dir={tmp_path}",
            "datasets=[{name: locomo, kind: locomo, path: locomo10.json, max_questions: 2}]",
            f"run.output_dir={tmp_path / 'runs'}",
            f"models=[{{name: trained, engine: {{backend: openai, name: memory, tokenizer: '{tiny_model_dir}', "
            f"endpoints: {endpoint}}}}}]",
            f"reasoner.endpoints={endpoint}",
            f"judge.endpoints={endpoint}",
            "judge_max_tokens=16",
            f"tokenizer={tiny_model_dir}",
        ],
    )
    summary = evaluate(cfg, tmp_path / "runs" / "eval-locomo")
    entry = summary["datasets"]["locomo"]
    rows = {r["system"]: r for r in entry["overall"]}
    assert set(rows) == {"sam", "long_context", "bm25"} and all(r["n"] == 2 for r in rows.values())
    # every role went through the server: the reasoner for every system, the memory model for SAM's cues
    assert all(r["reasoner_tokens"] > 0 for r in rows.values()) and rows["sam"]["memory_tokens"] > 0
    assert all(0 <= r["locomo"] <= 1 and len(r["locomo_ci"]) == 2 for r in rows.values())
    assert summary["judge"] == "judge" and summary["reader"] == "reasoner"
    run = tmp_path / "runs" / "eval-locomo"
    report = (run / "report.md").read_text()
    assert "Official metric: LoCoMo F1 by category" in report and "by horizon" in report
    assert len((run / "per_question.tsv").read_text().splitlines()) == 1 + 3 * 2
