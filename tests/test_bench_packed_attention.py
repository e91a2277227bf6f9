"""benchmarks/packed_attention.py: its workload, its three paths computing one loss, and the summary's ratios; the
script itself at its smallest setting (slow tier)."""

from __future__ import annotations

import argparse

import pytest
import torch

from benchmarks.packed_attention import PATHS, build_model, growth, mixed_rows, run_case, summarize, token_ids
from tests.bench_run import run_benchmark


@pytest.mark.parametrize("budget", [512, 8192, 32768])
def test_rows_fill_the_budget_exactly_with_mixed_lengths(budget: int) -> None:
    rows = mixed_rows(budget, seed=0)
    assert sum(p + r for p, r in rows) == budget
    assert all(p >= 1 and r >= 1 for p, r in rows)
    assert all(64 <= p <= 4096 and 10 <= r <= 400 for p, r in rows[:-1])  # the last row is cut to fit
    if budget >= 8192:
        assert len(rows) >= 3 and len({p + r for p, r in rows}) >= 3
    assert mixed_rows(budget, seed=0) == rows


def test_the_three_paths_compute_the_same_loss_gradient() -> None:
    """The figures compare like with like: packed, dense-mask and padded passes give one gradient."""
    from benchmarks.packed_attention import training_pass

    torch.manual_seed(0)
    model = build_model(64, 1, 2048, 500)
    pairs = token_ids(mixed_rows(600, seed=2), 500, 0)
    grads = {}
    for path in PATHS:
        model.zero_grad(set_to_none=True)
        training_pass(path, model, pairs)
        grads[path] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    assert grads["packed"].abs().sum() > 0
    for path in ("dense_mask", "padded"):
        assert torch.allclose(grads[path], grads["packed"], atol=1e-6, rtol=1e-4), path


@pytest.mark.parametrize("path", PATHS)
def test_a_case_reports_times_and_peaks(path: str) -> None:
    args = argparse.Namespace(path=path, budget=700, hidden=64, layers=1, vocab=500, steps=1, threads=1, seed=0)
    record = run_case(args)
    assert record["path"] == path and record["budget"] == 700
    assert record["seconds_per_step"] > 0 and record["attention_seconds"] > 0
    assert record["cpu_seconds_per_step"] > 0 and record["attention_cpu_seconds"] > 0
    assert record["step_peak_gib"] >= 0 and record["attention_peak_gib"] >= 0


def test_summary_reads_growth_against_rows_and_budget_squared() -> None:
    def case(budget: int, sum_sq: int, packed: float, dense: float) -> dict:
        return {
            "budget": budget,
            "sum_sq_rows": sum_sq,
            "packed": {"cpu_seconds_per_step": packed, "attention_cpu_seconds": packed, "step_peak_gib": 1.0},
            "dense_mask": {"cpu_seconds_per_step": dense, "attention_cpu_seconds": dense, "step_peak_gib": 5.0},
            "padded": {"failed": "exit -9"},
        }

    # budget x4, sum of squared rows x4: the packed time x4 follows the rows, the dense x16 the square
    cases = [case(8, 25, 2.0, 1.0), case(32, 100, 8.0, 16.0)]
    g = growth(cases, "packed", "cpu_seconds_per_step")
    assert g["growth"] == {"8": 1.0, "32": 4.0}
    assert g["over_sum_sq"]["32"] == pytest.approx(1.0) and g["over_budget_sq"]["32"] == pytest.approx(0.25)
    dense = growth(cases, "dense_mask", "attention_cpu_seconds")
    assert dense["over_budget_sq"]["32"] == pytest.approx(1.0) and dense["over_sum_sq"]["32"] == pytest.approx(4.0)
    s = summarize(cases)
    assert s["largest_budget"] == 32 and s["packed_step_peak_over_dense"] == pytest.approx(0.2)
    assert s["dense_step_time_over_packed"] == pytest.approx(2.0) and s["padded_step_time_over_packed"] is None
    assert s["failed"] == 2 and s["padded"]["step_time"]["growth"] == {}  # padded failed at both budgets


# protects: benchmarks/packed_attention.py end to end (its three paths' subprocesses and JSON last line)
@pytest.mark.slow
def test_packed_attention_benchmark_smallest_setting() -> None:
    record = run_benchmark(
        "packed_attention",
        ["--budgets", "512", "--paths", "packed", "--hidden", "64", "--layers", "1", "--vocab", "1000"],
    )
    (case,) = record["cases"]
    assert record["summary"]["failed"] == 0 and case["dense_mask"] == {"skipped": "not run"}
    assert case["packed"]["cpu_seconds_per_step"] > 0 and case["sum_sq_rows"] > 0
