"""``memrl quickstart``: the held-out results it hands the export reach the model card; :func:`check_quickstart_run`
is what a finished run on a shrunken config holds (the tutorial test runs it end to end)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml


def test_heldout_results_reach_the_model_card(tmp_path: Path) -> None:
    from memrl.launch.quickstart import QuickstartConfig, heldout_results
    from memrl.train.export import ExportConfig, render_model_card
    from memrl.train.policy import PolicySpec

    cfg = QuickstartConfig(eval_horizons=[12, 24], eval_tasks_per_horizon=60, eval_samples=2)
    before = {
        "success": 0.654,
        "success_greedy": 0.742,
        "success/12 steps": 0.7,
        "success/24 steps": 0.6,
        "success_greedy/12 steps": 0.8,
        "success_greedy/24 steps": 0.684,
        "reasoner_tokens_per_task": 900.0,
    }
    after = {
        "success": 0.733,
        "success_greedy": 0.892,
        "success/12 steps": 0.75,
        "success/24 steps": 0.716,
        "success_greedy/12 steps": 0.9,
        "success_greedy/24 steps": 0.884,
        "reasoner_tokens_per_task": 880.0,
    }
    baselines = {
        "oracle expert (upper bound)": {"success": 1.0, "success_greedy": 1.0},
        "untrained tiny model": {"success": None, "success_greedy": 0.0},
    }
    results = heldout_results(cfg, before, after, baselines)
    assert results["per_horizon"] == {
        "12 steps": {"sft": 0.7, "rl": 0.75, "sft_greedy": 0.8, "rl_greedy": 0.9},
        "24 steps": {"sft": 0.6, "rl": 0.716, "sft_greedy": 0.684, "rl_greedy": 0.884},
    }
    path = tmp_path / "heldout_results.json"
    path.write_text(json.dumps(results))
    card = render_model_card(ExportConfig(policy=PolicySpec(base="base"), results=str(path)), False, {}, "m")
    for line in (
        "| success_sft | 0.654 |",
        "| success_rl | 0.733 |",
        "| success_rl_greedy | 0.892 |",
        "| per_horizon.24 steps.rl | 0.716 |",
        "| per_horizon.12 steps.sft_greedy | 0.8 |",
        "| baselines.oracle expert (upper bound).success_greedy | 1 |",
        "| baselines.untrained tiny model.success_greedy | 0 |",
    ):
        assert line in card, line
    assert "reasoner_tokens_per_task" not in card and "baselines.untrained tiny model.success |" not in card


def check_quickstart_run(run_dir: Path) -> None:
    """What a finished ``memrl quickstart`` run at the tutorial's tiny scale (distill_tasks=24, sft.max_steps=6,
    eval_horizons=[12], eval_tasks_per_horizon=4, eval_samples=1, loop.iterations=2) leaves behind: every stage ran
    and the run directory is complete. tests/test_tutorials.py runs that command from docs/tutorials/quickstart.md
    and checks its run with this, so the pipeline runs once in the suite."""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary["stage_s"]) == {"model", "distill", "sft", "eval-oracle", "eval-untrained", "rl", "export"}
    # Six SFT steps leave the model near random, so groups may all fail alike and be skipped (no update).
    assert summary["rl_iterations"] == 2 and 0 <= summary["rl_updates"] <= 2
    assert summary["baselines"]["oracle expert (upper bound)"]["success_greedy"] == 1.0
    # every stage's figures were written as the stage ended; the report's sentences follow this config
    figures = json.loads((run_dir / "stage_figures.json").read_text())
    assert set(figures) == {"distill", "sft", "eval-oracle", "eval-untrained", "rl", "export"}
    assert figures["eval-oracle"]["success_greedy"] == 1.0 and figures["sft"]["global_step"] == 6
    assert "one run per task" in (run_dir / "report.md").read_text()
    for key in ("success_sft", "success_rl", "success_sft_greedy", "success_rl_greedy"):
        assert 0.0 <= summary[key] <= 1.0
    assert summary["export"] is not None and summary["reasoner_tokens_rl"] > 0
    assert figures["export"]["ok"] and figures["export"]["differs_from_base"]["differs"]  # verified in vLLM too
    # The resolved config holds the overrides; the report and every plot exist; metrics.jsonl has one parseable JSON
    # object per line; the export is a loadable checkpoint.
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["loop"]["iterations"] == 2 and resolved["sft"]["max_steps"] == 6
    report = (run_dir / "report.md").read_text()
    assert "SFT + OAT-GRPO" in report
    for plot in ("reward_success.png", "success_per_horizon.png", "tokens.png"):
        assert (run_dir / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", plot
        assert f"![{plot}]({plot})" in report
    assert sorted(p.name for p in run_dir.glob("*.png")) == [
        "reward_success.png",
        "success_per_horizon.png",
        "tokens.png",
    ]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics and all(isinstance(m, dict) and isinstance(m["step"], int) for m in metrics)
    # summary.json: the figures acceptance asks for are numbers (not bools, not None).
    for key in ("success_sft", "success_rl", "wall_s", "peak_rss_gib"):
        assert type(summary[key]) in (int, float), key
    assert summary["wall_s"] > 0 and 0 < summary["peak_rss_gib"] < 64
    model = run_dir / "export" / "model"
    assert (model / "model.safetensors").exists() and (model / "config.json").exists()
    # the path as the run names it: relative to the folder it ran in when run.output_dir is (the tutorial's "runs")
    assert (
        summary["export"]["ok"] is True
        and (run_dir.parents[1] / summary["export"]["path"]).resolve() == model.resolve()
    )

    # The model card records the held-out results: SFT vs SFT + OAT-GRPO, per horizon, and the baselines.
    card = (model / "README.md").read_text()
    assert "No evaluation results were given" not in card and "From `heldout_results.json`:" in card

    def row(key: str, value: float) -> str:
        return f"| {key} | {value:.4g} |" if isinstance(value, float) else f"| {key} | {value} |"

    results = json.loads((run_dir / "heldout_results.json").read_text())
    for key in ("success_sft", "success_rl", "success_sft_greedy", "success_rl_greedy"):
        assert results[key] == summary[key] and row(key, results[key]) in card
    assert list(results["per_horizon"]) == ["12 steps"]  # eval_horizons=[12]
    for horizon, values in results["per_horizon"].items():
        assert values["rl_greedy"] == summary["eval_after"][f"success_greedy/{horizon}"]
        assert row(f"per_horizon.{horizon}.sft_greedy", values["sft_greedy"]) in card
        assert row(f"per_horizon.{horizon}.rl_greedy", values["rl_greedy"]) in card
    assert row("baselines.oracle expert (upper bound).success_greedy", 1.0) in card
    assert "baselines.untrained tiny model.success_greedy" in card
