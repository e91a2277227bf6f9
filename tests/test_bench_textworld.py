"""benchmarks/textworld.py at its smallest setting: one treasure_hunter game, the scripted variants (no memory, long
context, BM25, SAM with the expert) and the replay check, into a temporary work folder and game cache."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_a_work_folder_refuses_another_scale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A work folder caches its SFT checkpoint, RL runs and evaluations: another training scale in it exits 2 naming
    the fields, while more test games, dev games or seeds reuse it."""
    from dataclasses import replace

    from benchmarks.textworld import QUICK, check_scale

    check_scale(tmp_path, QUICK)
    check_scale(tmp_path, replace(QUICK, test_games=225, dev_games=12, seeds=3))
    with pytest.raises(SystemExit) as exit_info:
        check_scale(tmp_path, replace(QUICK, sft_steps=1500, iterations=8))
    assert exit_info.value.code == 2
    assert "iterations 2 -> 8, sft_steps 30 -> 1500" in capsys.readouterr().err
    older = tmp_path / "older"  # stages cached before the folder recorded its scale
    (older / "rl").mkdir(parents=True)
    with pytest.raises(SystemExit):
        check_scale(older, QUICK)
    assert "cached stages of an unrecorded scale" in capsys.readouterr().err


# protects: benchmarks/textworld.py's JSON at its smallest setting on a generated Microsoft TextWorld game
@pytest.mark.slow
def test_textworld_benchmark_smallest_setting(tmp_path: Path) -> None:
    pytest.importorskip("textworld", reason="the textworld extra is not installed")
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "textworld.py"),
        "--quick",
        "--model",
        "none",
        "--cells",
        "treasure_hunter/small",
        "--test-games",
        "2",
        "--seeds",
        "2",
        "--work",
        str(tmp_path / "work"),
        "--game-cache",
        str(tmp_path / "games"),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["benchmark"] == "textworld" and result["records"]["games"] == ["test-400000", "test-400001"]
    table = result["table"]
    assert set(table) == {"no_memory", "long_context", "bm25", "sam_expert"}
    assert table["sam_expert"]["all"]["success"] == 1.0 and table["sam_expert"]["all"]["steps_to_win"] > 0
    assert set(result["paired"]) == {"bm25-no_memory", "long_context-no_memory"}
    assert result["paired"]["bm25-no_memory"]["all"]["seeds"] == 2
    assert (
        result["replay"]
        == {"games": 2, "exact": 2, "commands_replayed": result["replay"]["commands_replayed"], "mismatched": []}
        and result["replay"]["commands_replayed"] >= 2
    )
    assert "replay re-entry exact on 2 of 2 test games" in out.stderr
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)  # everything cached
    assert rerun.returncode == 0 and json.loads(rerun.stdout.strip().splitlines()[-1])["table"] == table
    assert "games ready in 0 s" in rerun.stderr


def test_an_unchanged_policy_reuses_its_weights_evaluation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An RL run that made no update has the SFT weights: its greedy evaluation on the same games is the same
    computation, so the cached one is reused (and named); other weights are evaluated."""
    from types import SimpleNamespace

    from benchmarks.textworld import QUICK, Bench, digest

    model = tmp_path / "policy"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    weights = digest(model)
    (tmp_path / "evals").mkdir()
    sft = {"success": 0.5, "games": {"test-400000": {"won": 1.0}}, "seconds": 9.0}
    (tmp_path / "evals" / f"test-sam_sft-{weights}-2-test-400000.json").write_text(json.dumps(sft))
    bench = Bench(SimpleNamespace(engine="hf"), QUICK, tmp_path)
    games = [SimpleNamespace(task_id="test-400000"), SimpleNamespace(task_id="test-400001")]
    reused = bench.evaluate("sam_oat", model, games, "test-s1")
    assert reused["success"] == 0.5 and reused["same_weights_as"] == f"test-sam_sft-{weights}-2-test-400000"
    assert (tmp_path / "evals" / f"test-s1-sam_oat-{weights}-2-test-400000.json").exists()
    (model / "model.safetensors").write_bytes(b"other weights")

    class EvaluationStarted(Exception):
        pass

    def build_engine(*_args: object, **_kwargs: object) -> None:
        raise EvaluationStarted

    monkeypatch.setattr("memrl.rollout.engines.factory.build_engine", build_engine)
    with pytest.raises(EvaluationStarted):  # other weights: a real evaluation starts
        bench.evaluate("sam_oat", model, games, "test-s2")


def test_skip_names_only_trained_variants_and_smollm2_takes_the_recipes_sft() -> None:
    """``--skip`` accepts the skippable trained variants and rejects anything else (a usage error); SmolLM2's SFT
    settings are the recipe's, not the tiny model's learning rate."""
    import argparse

    import yaml

    from benchmarks.textworld import QUICK, skipped_variants, smollm2_sft

    assert skipped_variants("sam_untrained,sam_flat") == ("sam_untrained", "sam_flat")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown variant 'sam_oat'"):
        skipped_variants("sam_flat,sam_oat")
    recipe = yaml.safe_load((ROOT / "configs" / "textworld_smollm2.yaml").read_text())
    sft = smollm2_sft()
    assert {"lr_sft": recipe["sft"]["lr"], "max_length": recipe["sft"]["max_length"]} == sft
    assert QUICK.lr_sft != sft["lr_sft"]


def test_an_unknown_skipped_variant_exits_2_naming_the_flag() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "textworld.py"), "--skip", "sam_sft"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 2 and "--skip: unknown variant 'sam_sft'" in out.stderr


def test_an_evaluation_resumes_at_its_next_chunk_and_more_games_add_only_new_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Evaluations are cached per chunk of games: a run stopped mid-evaluation redoes only the unfinished chunks, a
    longer game list (more test games) only the chunks that changed, and the result is the same as in one go."""
    from types import SimpleNamespace

    import benchmarks.textworld as tw

    monkeypatch.setattr(tw, "EVAL_CHUNK", 2)
    played: list[list[str]] = []

    class Stopped(Exception):
        pass

    def evaluate_chunk(variant: str, memory: object, tasks: list[object], desc: str) -> dict[str, object]:
        names = [t.task_id for t in tasks]
        if "test-4" in names and not played.count(["stop"]):
            played.append(["stop"])
            raise Stopped
        played.append(names)
        games = {n: {"won": float(int(n.split("-")[1]) % 3 == 0), "cell": "c", "steps": 1} for n in names}
        return {"success": sum(g["won"] for g in games.values()) / len(games), "games": games, "seconds": 1.0}

    bench = tw.Bench(SimpleNamespace(engine="hf"), tw.QUICK, tmp_path)
    monkeypatch.setattr(bench, "evaluate_chunk", evaluate_chunk)
    games = [SimpleNamespace(task_id=f"test-{i}") for i in range(5)]
    with pytest.raises(Stopped):  # stopped in the third chunk
        bench.evaluate("bm25", None, games, "test")
    assert played == [["test-0", "test-1"], ["test-2", "test-3"], ["stop"]]
    result = bench.evaluate("bm25", None, games, "test")
    assert played[3:] == [["test-4"]]  # resumed at the unfinished chunk
    assert result["success"] == pytest.approx(2 / 5) and list(result["games"]) == [f"test-{i}" for i in range(5)]
    assert bench.evaluate("bm25", None, games, "test") == result and len(played) == 4  # cached whole
    more = [*games, SimpleNamespace(task_id="test-5"), SimpleNamespace(task_id="test-6")]
    grown = bench.evaluate("bm25", None, more, "test")
    assert played[4:] == [["test-4", "test-5"], ["test-6"]]  # only the chunks that changed
    assert grown["success"] == pytest.approx(3 / 7) and grown["seconds"] == 4.0  # its four chunks' compute
