"""benchmarks/pivot_learning.py at its smallest setting (one start of 4 teacher tasks and 2 SFT steps, F = 1, one
GRPO iteration, 2 test tasks): ``--select`` chooses the GRPO settings on dev with two processes; a test run with two
processes (``--jobs 2``) reports two-level intervals and per-task records, and a rerun reads every finished run back;
the settings chosen on dev are applied to the runs (and keyed into their folder), a file chosen from other start
weights is refused."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import pytest

from tests.bench_run import bench_process, json_lines

TINY = shlex.split(
    "--quick --fatal 1 --starts clean_long --train-tasks 4 --sft-steps 2 --dev-tasks 1 --test-tasks 2 --samples 1 "
    "--iterations 1 --label-tasks 1 --pivots-per-iteration 1 --non-pivots-per-iteration 1 --group-size 2"
)


def _run(*args: str) -> list[dict]:
    done = bench_process("pivot_learning", [*TINY, *args], timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json_lines(done)


def test_the_select_grid_crosses_every_advantage_preset_with_the_costs_and_learning_rates() -> None:
    from benchmarks.pivot_learning import SELECT_GRID
    from memrl.rewards.advantage import ADVANTAGE_PRESETS, AdvantageConfig
    from memrl.rewards.pivot import PivotRewardConfig

    # the recipe's settings before the selection first (memrl's default advantage, lr 3e-4)
    assert SELECT_GRID[0] == {
        "reward.advantage": AdvantageConfig().preset,
        "reward.reminder_cost": 0.1,
        "trainer.lr": 3e-4,
    }
    assert len(SELECT_GRID) == len({json.dumps(e, sort_keys=True) for e in SELECT_GRID}) == len(ADVANTAGE_PRESETS) * 4
    assert {e["reward.advantage"] for e in SELECT_GRID} == set(ADVANTAGE_PRESETS)
    for entry in SELECT_GRID:  # every entry is a valid reward config
        PivotRewardConfig(advantage=entry["reward.advantage"], reminder_cost=entry["reward.reminder_cost"])


# protects: the benchmark's own processes end to end (the start built once and shared, --jobs 2, --reuse, --select on
# dev) and its JSON last line at its smallest setting; the fast tests check the selection grid and overrides only
@pytest.mark.slow
def test_two_jobs_share_the_runs_a_rerun_reads_them_back_and_select_chooses_on_dev(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """One work folder, so the start (teacher tasks and SFT) is built once: a test run with two processes and two seeds,
    its rerun read back, then ``--select`` on dev with two processes."""
    from benchmarks.pivot_learning import SELECT_GRID

    work = str(tmp_path / "w")
    lines = _run("--work", work, "--seeds", "0", "1", "--jobs", "2")
    record = lines[-1]
    assert record["benchmark"] == "pivot_learning"
    assert record["grpo_settings"]["chosen_on_dev"] is None and "NOT chosen on dev" in record["grpo_settings"]["note"]
    assert record["start_weights"]["clean_long"] and record["start_threads"] == record["run_threads"] == 1  # pinned
    f1 = record["by_fatal_pivots"]["1"]
    assert set(f1["paired_deltas_pass_rate"]) == {"pivot-no_rl", "all_turns-no_rl", "pivot-all_turns"}
    for delta in [*f1["paired_deltas_pass_rate"].values(), *(v["pass_rate"] for v in f1["variants"].values())]:
        assert delta["n"] == 2 and delta["tasks"] == 2
        assert delta["ci95"][0] <= delta["mean"] <= delta["ci95"][1]
    assert len(f1["records"]["tasks"]) == 2
    assert all(set(by_seed) == {"0", "1"} for by_seed in f1["records"]["pass_rate"].values())
    assert len([line for line in lines if line.get("stage") == "result"]) == 6  # 2 seeds x (no_rl, pivot, all_turns)

    again = _run("--work", work, "--seeds", "0", "1", "--reuse")[-1]
    assert again["by_fatal_pivots"] == record["by_fatal_pivots"] and again["runs"] == record["runs"]

    # settings chosen on dev (the runs above were not: no selection file existed then), from the same start (--reuse)
    selection = _run("--work", work, "--reuse", "--select", "--select-entries", "0", "3", "--jobs", "2")[-1]
    assert selection["benchmark"] == "pivot_learning-select" and selection["split"] == "dev"
    assert [c["overrides"] for c in selection["candidates"]] == [SELECT_GRID[0], SELECT_GRID[3]]
    assert selection["grid_entries"] == [0, 3]
    best = max(c["dev_pass_rate"] for c in selection["candidates"])
    assert selection["chosen"] == next(c for c in selection["candidates"] if c["dev_pass_rate"] == best)  # ties: first
    saved = json.loads((tmp_path / "w" / "clean_long" / "selected_on_dev.json").read_text())
    assert saved["chosen"] == selection["chosen"] and saved["start_weights"] == selection["start_weights"]
    assert sorted(
        p.parts[-4] for p in (tmp_path / "w" / "clean_long" / "select").glob("c*/F1/seed0/pivot.dev.json")
    ) == ["c0", "c3"]


def test_settings_chosen_on_dev_are_applied_before_the_command_line_and_key_the_runs(tmp_path: Path) -> None:
    from benchmarks.pivot_learning import SETTINGS, grpo_overrides, runs_folder, selection_file

    start = tmp_path / "starts" / "clean_long"
    start.mkdir(parents=True)
    (start / "start.json").write_text(json.dumps({"weights": "abc"}))
    overrides = ["trainer.lr=5e-5", "loop.iterations=3"]
    args = argparse.Namespace(overrides=overrides, config="configs/pivot_grpo_tiny.yaml", **SETTINGS["quick"])
    plain, report = grpo_overrides(args, tmp_path, "clean_long")
    assert plain == args.overrides and report["chosen_on_dev"] is None
    chosen = {"trainer.lr": 1e-4, "reward.reminder_cost": 0.0}
    selection_file(tmp_path, "clean_long").parent.mkdir(parents=True)
    selection_file(tmp_path, "clean_long").write_text(
        json.dumps(
            {
                "start_weights": "abc",
                "rule": "r",
                "chosen": {"overrides": chosen},
                "candidates": [{"overrides": chosen, "dev_pass_rate": 0.5}],
            }
        )
    )
    overrides, report = grpo_overrides(args, tmp_path, "clean_long")
    assert overrides == ["trainer.lr=0.0001", "reward.reminder_cost=0.0", "trainer.lr=5e-5", "loop.iterations=3"]
    assert report["chosen_on_dev"] == chosen and report["overruled_by_the_command_line"] == ["trainer.lr=0.0001"]
    assert runs_folder(tmp_path, "clean_long", overrides, args) != runs_folder(tmp_path, "clean_long", plain, args)
    assert runs_folder(tmp_path, "clean_long", plain, args) == runs_folder(tmp_path, "clean_long", list(plain), args)
    (start / "start.json").write_text(json.dumps({"weights": "other"}))
    with pytest.raises(SystemExit, match="run --select again"):
        grpo_overrides(args, tmp_path, "clean_long")


def test_a_rebuilt_start_with_other_weights_is_named_in_one_line(tmp_path: Path) -> None:
    from benchmarks.pivot_learning import start_mismatch

    committed = tmp_path / "pivot_learning_full.json"
    assert start_mismatch("clean_long", "abc", committed) is None  # no committed figures
    committed.write_text(json.dumps({"start_weights": {"clean_long": "abc"}}))
    assert start_mismatch("clean_long", "abc", committed) is None
    line = start_mismatch("clean_long", "def", committed)
    assert line is not None and "\n" not in line and "def" in line and "abc" in line
    assert start_mismatch("issue", "def", committed) is None  # the committed figures do not report this start
