"""benchmarks/sft_tiny.py at its smallest setting (2 steps of full fine-tuning on 40 rows)."""

from __future__ import annotations

from tests.bench_run import run_benchmark


def test_sft_tiny_two_steps() -> None:
    record = run_benchmark("sft_tiny", ["--steps", "2", "--rows", "20", "--batch", "4", "--variants", "full-fp32"])
    (result,) = record["results"]
    assert result["variant"] == "full-fp32" and result["steps"] == 2 and result["steps_per_s"] > 0
    assert result["eval_loss_after"] < result["eval_loss_before"]
