"""The statistics of benchmarks/ablations.py: paired differences by task, and the training diagnostics it reports."""

from __future__ import annotations

import pytest

from benchmarks.ablations import diagnostics, paired_difference


def test_paired_difference_is_per_task_and_matches_seeds() -> None:
    a = [
        {"seed": 0, "per_task": {"t1": 1.0, "t2": 0.5, "t3": 1.0}},
        {"seed": 1, "per_task": {"t1": 1.0, "t2": 1.0, "t3": 0.0}},
    ]
    b = [
        {"seed": 0, "per_task": {"t1": 0.0, "t2": 0.5, "t3": 1.0}},
        {"seed": 2, "per_task": {"t1": 0.0, "t2": 0.0, "t3": 0.0}},
    ]
    out = paired_difference(a, b)
    assert out["seeds"] == [0] and out["tasks"] == 3
    assert out["difference"] == pytest.approx(100 / 3)
    assert out["ci95"][0] < out["difference"] < out["ci95"][1]
    assert paired_difference(a, [{"seed": 5, "per_task": {}}]) == {}


def test_paired_difference_over_several_seeds_has_a_two_level_interval() -> None:
    """Three seeds, two tasks, differences (points) per seed [20, 0], [20, 20], [40, 20]: seed means 10, 20, 30 (the
    seed-level t: 20 +- t(0.975, 2) 10 / sqrt(3)); task means over seeds 26.7 and 13.3 (the task-level interval the
    benchmark reported before: 20 +- 1.96 x 9.43 / sqrt(2)). Treating the six (seed, task) differences as
    independent samples would give 20 +- 2.57 x 12.6 / sqrt(6) = +- 13.3, narrower than the seed-level t."""
    import math

    a = [{"seed": s, "per_task": {"t1": x, "t2": y}} for s, (x, y) in enumerate([(0.2, 0.0), (0.5, 0.4), (0.4, 0.2)])]
    b = [{"seed": s, "per_task": {"t1": x, "t2": y}} for s, (x, y) in enumerate([(0.0, 0.0), (0.3, 0.2), (0.0, 0.0)])]
    out = paired_difference(a, b)
    assert out["seeds"] == [0, 1, 2] and out["tasks"] == 2
    assert out["difference"] == pytest.approx(20.0)
    assert out["per_seed"] == pytest.approx([10.0, 20.0, 30.0])
    half_t = 4.302652729749464 * 10 / math.sqrt(3)
    assert out["ci95_seed_t"] == pytest.approx([20 - half_t, 20 + half_t])
    half_task = 1.959963984540054 * math.sqrt(2 * (20 / 3) ** 2) / math.sqrt(2)
    assert out["ci95_tasks_only"] == pytest.approx([20 - half_task, 20 + half_task])
    low, high = out["ci95"]  # the wider of the bootstrap and the seed-level t
    assert low <= min(out["ci95_seed_t"][0], out["ci95_two_level_bootstrap"][0]) + 1e-9
    assert high >= max(out["ci95_seed_t"][1], out["ci95_two_level_bootstrap"][1]) - 1e-9
    assert out["half_width"] >= half_t - 1e-9 and half_t > half_task


def test_records_keep_every_seed_and_task_and_recompute_the_paired_table() -> None:
    from benchmarks.ablations import paired_from_records, task_records

    def run(seed: int, sampled: dict, greedy: dict) -> dict:
        return {"seed": seed, "success": 0.0, "per_task": sampled, "per_task_greedy": greedy}

    runs = {
        "sft": [run(0, {"a": 0.5, "b": 0.0}, {"a": 1.0, "b": 0.0}), run(1, {"a": 0.0, "b": 0.5}, {"a": 0.0, "b": 1.0})],
        "oat": [run(0, {"a": 1.0, "b": 0.5}, {"a": 1.0, "b": 1.0}), run(1, {"a": 1.0}, {"a": 1.0})],
    }
    records = task_records(runs)
    assert records["tasks"] == ["a", "b"]
    assert records["sampled"]["oat"] == {"0": [1.0, 0.5], "1": [1.0, None]}  # a task not scored stays None
    assert records["greedy"]["sft"]["1"] == [0.0, 1.0]
    paired = paired_from_records(records)
    assert set(paired) == {"oat - sft"}
    direct = paired_difference(runs["oat"], runs["sft"])
    assert paired["oat - sft"]["sampled"] == direct  # only task "a" is scored under every seed of both
    assert direct["tasks"] == 1 and direct["difference"] == pytest.approx(75.0)
    assert paired["oat - sft"]["greedy"]["difference"] == pytest.approx(50.0)


def test_a_rebuilt_start_with_other_weights_is_named_in_one_line(tmp_path) -> None:
    import json

    from benchmarks.sam_start import committed_starts, start_mismatch

    (tmp_path / "ablations_full.json").write_text(json.dumps({"setting": "multihop", "sft_weights": "41336ca2"}))
    (tmp_path / "other.json").write_text(json.dumps({"setting": "deferring_expert", "sft_weights": "aaaa"}))
    (tmp_path / "old.json").write_text(json.dumps({"setting": "multihop"}))  # no digest recorded: not compared
    (tmp_path / "broken.json").write_text("{")
    assert committed_starts("multihop", tmp_path) == {"ablations_full.json": "41336ca2"}
    assert start_mismatch("multihop", "41336ca2", tmp_path) is None
    line = start_mismatch("multihop", "8647402f", tmp_path)
    assert line is not None and "\n" not in line
    assert "8647402f" in line and "ablations_full.json (41336ca2)" in line
    assert start_mismatch("textworld", "8647402f", tmp_path) is None  # no committed figures for it


def test_diagnostics_average_iterations_and_keep_the_last_probe_kl() -> None:
    history = [{"rows": 4, "kl_initial_probe": 0.01, "approx_kl": 0.0}, {"rows": 8, "kl_initial_probe": 0.03}]
    out = diagnostics(history)
    assert out["rows"] == 6 and out["kl_initial_probe"] == 0.03 and out["approx_kl"] == 0.0
    assert "clip_fraction" not in out


def test_select_picks_the_best_dev_success_and_breaks_ties_towards_the_defaults() -> None:
    from benchmarks.ablations import SELECT_ADVANTAGES, SELECT_GRID, pick_setting
    from memrl.rewards.advantage import ADVANTAGE_PRESETS

    assert pick_setting([0.40, 0.45, 0.42]) == 1
    assert pick_setting([0.45, 0.40, 0.45]) == 0  # a tie: the entry listed first
    from memrl.rewards.advantage import AdvantageConfig

    first = SELECT_GRID[0]
    assert first.advantage == AdvantageConfig().preset and first.lr == min(s.lr for s in SELECT_GRID)  # defaults
    assert SELECT_ADVANTAGES[1] == "grpo_std"  # then the paper's formula
    assert set(SELECT_ADVANTAGES) == set(ADVANTAGE_PRESETS)  # every preset is compared on dev
    assert {s.advantage for s in SELECT_GRID} == set(SELECT_ADVANTAGES)
    assert [(s.update_epochs, s.steps_per_epoch) for s in SELECT_GRID].count((1, 1)) == 1  # the old default, once


def test_settings_chosen_on_dev_list_what_the_grid_varied_and_what_it_held_fixed() -> None:
    from benchmarks.ablations import settings_chosen_on_dev

    def candidate(lr: float, kl: float, epochs: int, dev: float, **more: object) -> dict:
        return {"lr": lr, "kl_coef": kl, "update_epochs": epochs, "dev_success": dev, **more}

    # a record from before issue 39 (no advantage or steps per epoch): lr and kl varied
    grid = [candidate(1e-4, 0.0, 2, 0.50), candidate(2e-4, 0.05, 2, 0.53)]
    selection = {"chosen": grid[1], "candidates": grid, "rule": "the highest", "sft_dev_success": 0.47}
    rl, listed = settings_chosen_on_dev(selection, "selected_on_dev.json")
    assert (rl.lr, rl.kl_coef, rl.update_epochs, rl.advantage, rl.steps_per_epoch) == (2e-4, 0.05, 2, "grpo_std", 2)
    assert "chosen on dev" in listed["trainer.lr=0.0002, trainer.kl_coef=0.05"]
    assert "53.0%" in listed["trainer.lr=0.0002, trainer.kl_coef=0.05"]
    assert "held fixed" in listed["trainer.update_epochs=2"]
    assert "held fixed" in listed["credit.advantage=grpo_std"]
    assert not any(k.startswith("trainer.lr=1e-4") or k.startswith("trainer.kl_coef=0.05") for k in listed)

    # issue 39's grid: the advantage and the learning rate varied, and one entry of one optimizer step per batch
    varied = [
        candidate(1e-4, 0.05, 2, 0.50, advantage="grpo_std", steps_per_epoch=2),
        candidate(1e-4, 0.05, 2, 0.56, advantage="dr_grpo_gated", steps_per_epoch=2),
        candidate(2e-4, 0.05, 1, 0.40, advantage="grpo_std", steps_per_epoch=1),
    ]
    rl, listed = settings_chosen_on_dev({**selection, "chosen": varied[1], "candidates": varied}, "s.json")
    assert (rl.advantage, rl.lr, rl.steps_per_epoch) == ("dr_grpo_gated", 1e-4, 2)
    # the scale and dev tasks the choice was made on are named (a full run may apply the quick selection)
    rl, listed = settings_chosen_on_dev(
        {**selection, "chosen": varied[1], "candidates": varied, "scale": "quick", "dev_tasks": 48},
        "quick/selected_on_dev.json",
    )
    assert "quick/selected_on_dev.json: quick scale, 48 dev tasks" in " ".join(listed.values())
    key = (
        "trainer.lr=0.0001, trainer.update_epochs=2, credit.advantage=dr_grpo_gated, "
        "trainer.optimizer_steps_per_epoch=2"
    )
    assert "chosen on dev" in listed[key] and "0.0001/2/dr_grpo_gated/2: 56.0%" in listed[key]
    assert "held fixed" in listed["trainer.kl_coef=0.05"]


def test_progress_reuses_finished_runs_only_under_the_same_key(tmp_path) -> None:
    from benchmarks.harness import Progress

    path = tmp_path / "progress.jsonl"
    Progress(path, "k1").add("oat", 0, {"success": 0.5})
    Progress(path, "k2").add("oat", 1, {"success": 0.25})
    again = Progress(path, "k1")
    assert again.get("oat", 0) == {"seed": 0, "success": 0.5}
    assert again.get("oat", 1) is None  # finished under other settings: run again
    assert Progress(path, "k3").done == {}


def test_run_key_changes_with_the_rl_settings_and_the_start() -> None:
    import argparse

    from benchmarks.ablations import ANALYSIS_SETTINGS, QUICK, SELECT_GRID, run_key

    args = argparse.Namespace(setting="multihop", split="test")
    start = {"base_weights": "b", "sft_weights": "s"}
    assert run_key(args, QUICK, ANALYSIS_SETTINGS, start) == run_key(args, QUICK, ANALYSIS_SETTINGS, dict(start))
    assert run_key(args, QUICK, ANALYSIS_SETTINGS, start) != run_key(args, QUICK, SELECT_GRID[1], start)
    assert run_key(args, QUICK, SELECT_GRID[0], start) != run_key(args, QUICK, SELECT_GRID[2], start)  # advantage
    # a rebuilt SFT checkpoint with other weights: the finished runs started elsewhere and are not reused
    assert run_key(args, QUICK, ANALYSIS_SETTINGS, start) != run_key(
        args, QUICK, ANALYSIS_SETTINGS, {**start, "sft_weights": "t"}
    )


def test_full_estimate_scales_this_run_s_rates() -> None:
    from benchmarks.ablations import FULL, QUICK, full_estimate

    runs = {
        "oat": [{"train_s": 80.0, "trees": 8, "iterations_trained": 2}],
        "sft_more": [{"train_s": 999.0, "trees": 0}],
    }
    phases = {"test_eval": {"wall_s": QUICK.test_tasks * (QUICK.eval_samples + 1) * 0.5, "count": 1}}
    out = full_estimate(runs, phases, QUICK)
    assert out["seconds_per_tree"] == 10.0 and out["seconds_per_eval_episode"] == 0.5
    # 8 trees over 2 iterations of 4 tasks: no extra trees
    episodes = FULL.test_tasks * (FULL.eval_samples + 1) + FULL.dev_curve_tasks * 2 * (FULL.iterations // 5 + 1)
    assert out["seconds_per_rl_variant_seed"] == round(FULL.iterations * FULL.tasks_per_iteration * 10 + episodes * 0.5)
    assert full_estimate({}, phases, QUICK) == {}


def test_claims_are_exclusive_and_a_dead_holder_s_claim_is_taken_over(tmp_path) -> None:
    import subprocess
    import sys

    from benchmarks.harness import Claims

    claims = Claims(tmp_path / "claims")
    assert claims.take("oat-s0") and claims.take("oat-s0")  # taken, and still ours
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "claims" / "flat-s1.pid").write_text(str(live.pid))
        assert not claims.take("flat-s1")  # a live process computes it
    finally:
        live.kill()
        live.wait()
    assert claims.take("flat-s1")  # its holder died: taken over
    claims.release("oat-s0")
    assert not (tmp_path / "claims" / "oat-s0.pid").exists()


def test_two_processes_share_the_runs_and_compute_each_once(tmp_path) -> None:
    """run_all in two processes at once over one progress file: every run is computed by exactly one of them, and
    each process returns only when all are finished."""
    import json
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    script = textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from benchmarks.ablations import run_all
        from benchmarks.harness import Claims, Progress
        work = Path({str(tmp_path)!r})
        progress = Progress(work / "progress.jsonl", "k")
        def compute(v, s):
            def run():
                time.sleep(0.3)
                return {{"by": os.getpid()}}
            return run
        run_all([(v, s, compute(v, s)) for v in ("a", "b", "c") for s in range(2)], progress,
                Claims(work / "claims"), work, poll_s=0.1)
        print(sorted(progress.done))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    rows = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert sorted((r["variant"], r["seed"]) for r in rows) == [(v, s) for v in "abc" for s in range(2)]  # once each
    assert len({r["by"] for r in rows}) == 2  # both processes did some of the work
    assert outs[0] == outs[1] != ""  # each saw every run finished before it returned
    assert list((tmp_path / "claims").iterdir()) == []
