"""benchmarks/pivot_learning.py at its smallest setting (one start of 4 teacher tasks and 2 SFT steps, F = 1, one
GRPO iteration, 2 test tasks): ``--select`` chooses the GRPO settings on dev, the test run applies them (keyed into
its runs folder) with two-level intervals and per-task records, two processes (``--jobs 2``) share the runs, and a
rerun reads every finished run back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
TINY = ["--quick", "--fatal", "1", "--starts", "clean_long", "--train-tasks", "4", "--sft-steps", "2", "--dev-tasks",
        "1", "--test-tasks", "2", "--samples", "1", "--iterations", "1", "--label-tasks", "1",
        "--pivots-per-iteration", "1", "--non-pivots-per-iteration", "1", "--group-size", "2"]


def _run(*args: str) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "pivot_learning.py"), *TINY, *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_select_then_test_with_two_jobs_then_resume(tmp_path: Path, tiny_model_dir: Path) -> None:
    work = str(tmp_path / "w")
    selection = _run("--work", work, "--select", "--jobs", "2")[-1]
    assert selection["benchmark"] == "pivot_learning-select" and selection["split"] == "dev"
    from benchmarks.pivot_learning import SELECT_GRID

    assert [c["overrides"] for c in selection["candidates"]] == list(SELECT_GRID)
    best = max(c["dev_pass_rate"] for c in selection["candidates"])
    first_best = next(c for c in selection["candidates"] if c["dev_pass_rate"] == best)
    assert selection["chosen"] == first_best  # ties go to the entry listed first
    assert selection["start_weights"] and (tmp_path / "w" / "clean_long" / "selected_on_dev.json").is_file()

    lines = _run("--work", work, "--seeds", "0", "1", "--jobs", "2")
    record = lines[-1]
    assert record["benchmark"] == "pivot_learning"
    assert record["grpo_settings"]["chosen_on_dev"] == selection["chosen"]["overrides"]
    assert record["grpo_overrides"] == [f"{k}={v}" for k, v in selection["chosen"]["overrides"].items()]
    assert record["start_weights"]["clean_long"] == selection["start_weights"]
    f1 = record["by_fatal_pivots"]["1"]
    assert set(f1["paired_deltas_pass_rate"]) == {"pivot-no_rl", "all_turns-no_rl", "pivot-all_turns"}
    for delta in f1["paired_deltas_pass_rate"].values():
        assert delta["n"] == 2 and delta["tasks"] == 2
        assert delta["ci95"][0] <= delta["mean"] <= delta["ci95"][1]
    assert len(f1["records"]["tasks"]) == 2
    assert all(set(by_seed) == {"0", "1"} for by_seed in f1["records"]["pass_rate"].values())
    assert len([line for line in lines if line.get("stage") == "result"]) == 6  # 2 seeds x (no_rl, pivot, all_turns)

    again = _run("--work", work, "--seeds", "0", "1", "--reuse")[-1]
    assert again["by_fatal_pivots"] == record["by_fatal_pivots"] and again["runs"] == record["runs"]
    assert again["total_seconds"] < record["total_seconds"]
