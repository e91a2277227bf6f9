"""benchmarks/proactive_ablations.py at its smallest setting (2 tasks, no slack sweep)."""

from __future__ import annotations

from tests.bench_run import run_benchmark


def test_proactive_ablations_two_tasks() -> None:
    record = run_benchmark("proactive_ablations", ["--tasks", "2", "--sweep", ""])
    assert record["benchmark"] == "proactive_ablations" and record["tasks"] == 2
    variants = record["variants"]
    assert set(variants) == {"no_memory", "full", "full_bank", "always_inject", "injection_only"}
    for figures in variants.values():
        assert 0.0 <= figures["pass_rate"] <= 1.0 and 0.0 <= figures["subtask_completion"] <= 1.0
    assert variants["no_memory"]["memory_calls"] == 0 and variants["full"]["memory_calls"] > 0
