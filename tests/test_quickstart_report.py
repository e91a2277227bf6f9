"""The quickstart's report.md is computed from the run's own config and results (issue 41 item 6): no sentence
written for the default reads wrong elsewhere, and each stage's figures are written as soon as the stage has them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memrl.launch.quickstart import QuickstartConfig, _Stages
from memrl.launch.report import export_sentence, write_report


def fake_summary(eval_samples: int, export: dict[str, Any] | None) -> dict[str, Any]:
    figures = {
        "success": 0.5 if eval_samples else None,
        "success_greedy": 0.6,
        "success/12 steps": 0.5,
        "success_greedy/12 steps": 0.6,
        "reasoner_tokens_per_task": 900.0,
        "memory_tokens_per_task": 300.0,
    }
    return {
        "success_sft": figures["success"],
        "success_rl": figures["success"],
        "success_sft_greedy": 0.6,
        "success_rl_greedy": 0.6,
        "baselines": {"oracle expert (upper bound)": {"success": 1.0, "success_greedy": 1.0}},
        "eval_before": figures,
        "eval_after": figures,
        "distill": {"traces": {"kept": 20, "total": 24}, "rows": {"kept": 80}},
        "rl_iterations": 2,
        "rl_updates": 2,
        "reasoner_tokens_rl": 5000,
        "export": export,
        "paired": None,
        "stage_s": {"sft": 1.0},
        "wall_s": 10.0,
        "peak_rss_gib": 1.0,
        "base_model_dir": "/m/base",
        "sft_model_dir": "/r/sft/final",
    }


def test_report_sentences_follow_the_config_and_the_checks(tmp_path: Path) -> None:
    """The sentences the issue found wrong outside the default: 'mean of 0 runs per task', 'leaves the fact out
    (0% of the time)', and 'weights differ from the untrained base' where the check compared with the SFT model."""
    cfg = QuickstartConfig.model_validate(
        {
            "eval_samples": 0,
            "expert": {"defer_to_later": 0.0},
            "tree": {"branch_roles": ["consolidate", "recall"]},
            "credit": {"terms": []},
        }
    )
    export = {
        "path": "/r/export/model",
        "ok": True,
        "failures": [],
        "differs_from_base": {
            "base": "/r/sft/final",
            "differs": True,
            "tensors_changed": 3,
            "tensors_compared": 24,
            "max_abs_diff": 0.1,
        },
    }
    report = write_report(tmp_path, cfg, fake_summary(0, export), [{"iteration": 0, "reward_mean": 0.5}]).read_text()
    assert "runs per task" not in report and "*Sampled*: not run (`eval_samples: 0`)" in report
    assert "leaves the fact out" not in report and "writes every fact into its cues" in report
    assert "an oracle expert" in report and "privileged" not in report
    assert "siblings per cue and recall" in report and "reward r = V(n) (committee off)" in report
    assert "weights differ from the SFT model RL started from (3/24 tensors changed)" in report
    assert "untrained base" not in report

    default = QuickstartConfig()
    report = write_report(tmp_path, default, fake_summary(2, None), [{"iteration": 0}]).read_text()
    assert (
        "*Sampled*: the memory model as it is trained (cues greedy, recall sampled at temperature 1; the mean of "
        "2 runs per task)."
    ) in report
    assert "leaves the fact out (90% of the time, `expert.defer_to_later`)" in report
    assert "r = V(n) + 0.5 (c(n) - c_bar)" in report and "Export:" not in report

    textworld = QuickstartConfig.model_validate({"task_family": "ms_textworld", "task_params": {"max_steps": 40}})
    report = write_report(tmp_path, textworld, fake_summary(0, None), [{"iteration": 0}]).read_text()
    assert "leaves the fact out" not in report and "writes every fact" not in report
    assert "the ms_textworld family's own oracle, which sees the true state" in report
    assert "from a privileged oracle expert" in report

    against_base = dict(
        export,
        differs_from_base=dict(export["differs_from_base"], base="/m/base", differs=False),
        ok=False,
        failures=["differs_from_base"],
    )
    assert export_sentence(against_base, "/m/base", "/r/sft/final") == (
        "- Export: `/r/export/model` (FAILED: differs_from_base in transformers and vLLM; weights do NOT differ from "
        "the untrained base (3/24 tensors changed))."
    )


def test_stage_figures_are_written_as_each_stage_ends(tmp_path: Path) -> None:
    stages = _Stages(tmp_path)
    stages.figures("eval-oracle", {"success": 1.0, "success_greedy": 1.0}, "held-out success 100% sampled")
    assert json.loads((tmp_path / "stage_figures.json").read_text()) == {
        "eval-oracle": {"success": 1.0, "success_greedy": 1.0}
    }
    stages.figures("eval-untrained", {"success_greedy": 0.0}, "held-out success 0% greedy")
    assert list(json.loads((tmp_path / "stage_figures.json").read_text())) == ["eval-oracle", "eval-untrained"]
