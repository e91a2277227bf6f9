"""benchmarks/learning.py at its smallest setting (--smoke: the quickstart's pipeline on a few tasks, one iteration)."""

from __future__ import annotations

import pytest

from tests.bench_run import run_benchmark


# protects: benchmarks/learning.py's JSON at --smoke (the quickstart pipeline run as a benchmark)
@pytest.mark.slow
def test_learning_smoke(tmp_path) -> None:
    record = run_benchmark("learning", ["--smoke", "--iterations", "1", "--eval-samples", "1", "--work", str(tmp_path)])
    assert record["benchmark"] == "oat_grpo_learning" and record["iterations"] == 1
    assert record["held_out_tasks"] == 4 and 0.0 <= record["success_before"] <= 1.0
