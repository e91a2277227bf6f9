"""The statistics of benchmarks/ablations.py: paired differences by task, and the training diagnostics it reports."""

from __future__ import annotations

import pytest

from benchmarks.ablations import diagnostics, paired_difference


def test_paired_difference_is_per_task_and_matches_seeds() -> None:
    a = [{"seed": 0, "per_task": {"t1": 1.0, "t2": 0.5, "t3": 1.0}}, {"seed": 1, "per_task": {"t1": 1.0, "t2": 1.0,
                                                                                                  "t3": 0.0}}]
    b = [{"seed": 0, "per_task": {"t1": 0.0, "t2": 0.5, "t3": 1.0}}, {"seed": 2, "per_task": {"t1": 0.0, "t2": 0.0,
                                                                                                  "t3": 0.0}}]
    out = paired_difference(a, b)
    assert out["seeds"] == [0] and out["tasks"] == 3
    assert out["difference"] == pytest.approx(100 / 3)
    assert out["ci95"][0] < out["difference"] < out["ci95"][1]
    assert paired_difference(a, [{"seed": 5, "per_task": {}}]) == {}


def test_diagnostics_average_iterations_and_keep_the_last_probe_kl() -> None:
    history = [{"rows": 4, "kl_initial_probe": 0.01, "approx_kl": 0.0}, {"rows": 8, "kl_initial_probe": 0.03}]
    out = diagnostics(history)
    assert out["rows"] == 6 and out["kl_initial_probe"] == 0.03 and out["approx_kl"] == 0.0
    assert "clip_fraction" not in out


def test_select_picks_the_best_dev_success_and_breaks_ties_towards_the_defaults() -> None:
    from benchmarks.ablations import SELECT_GRID, pick_setting

    assert pick_setting([0.40, 0.45, 0.42]) == 1
    assert pick_setting([0.45, 0.40, 0.45]) == 0  # a tie: the entry listed first
    first = SELECT_GRID[0]
    assert first.kl_coef == 0.0 and first.lr == min(s.lr for s in SELECT_GRID)  # closest to memrl's defaults


def test_progress_reuses_finished_runs_only_under_the_same_key(tmp_path) -> None:
    from benchmarks.ablations import Progress

    path = tmp_path / "progress.jsonl"
    Progress(path, "k1").add("oat", 0, {"success": 0.5})
    Progress(path, "k2").add("oat", 1, {"success": 0.25})
    again = Progress(path, "k1")
    assert again.get("oat", 0) == {"seed": 0, "success": 0.5}
    assert again.get("oat", 1) is None  # finished under other settings: run again
    assert Progress(path, "k3").done == {}


def test_run_key_changes_with_the_rl_settings() -> None:
    import argparse

    from benchmarks.ablations import ANALYSIS_SETTINGS, QUICK, SELECT_GRID, run_key

    args = argparse.Namespace(setting="multihop", split="test")
    assert run_key(args, QUICK, ANALYSIS_SETTINGS) == run_key(args, QUICK, ANALYSIS_SETTINGS)
    assert run_key(args, QUICK, ANALYSIS_SETTINGS) != run_key(args, QUICK, SELECT_GRID[0])


def test_full_estimate_scales_this_run_s_rates() -> None:
    from benchmarks.ablations import FULL, QUICK, full_estimate

    runs = {"oat": [{"train_s": 80.0, "trees": 8, "iterations_trained": 2}],
            "sft_more": [{"train_s": 999.0, "trees": 0}]}
    phases = {"test_eval": {"wall_s": QUICK.test_tasks * (QUICK.eval_samples + 1) * 0.5, "count": 1}}
    out = full_estimate(runs, phases, QUICK)
    assert out["seconds_per_tree"] == 10.0 and out["seconds_per_eval_episode"] == 0.5
    # 8 trees over 2 iterations of 4 tasks: no extra trees
    episodes = FULL.test_tasks * (FULL.eval_samples + 1) + FULL.dev_curve_tasks * 2 * (FULL.iterations // 5 + 1)
    assert out["seconds_per_rl_variant_seed"] == round(FULL.iterations * FULL.tasks_per_iteration * 10 + episodes * 0.5)
    assert full_estimate({}, phases, QUICK) == {}
