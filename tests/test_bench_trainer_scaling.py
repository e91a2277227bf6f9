"""benchmarks/trainer_scaling.py at its smallest setting (one 256-token context, one repeat, one step)."""

from __future__ import annotations

import pytest

from tests.bench_run import run_benchmark


# protects: benchmarks/trainer_scaling.py's JSON: memrl's step against the reference at the real vocabulary, log-probs
# within 1e-3
@pytest.mark.slow
def test_trainer_scaling_one_context() -> None:
    record = run_benchmark(
        "trainer_scaling", ["--contexts", "256", "--response", "32", "--repeats", "1", "--steps", "1"]
    )
    assert record["ooms"] == 0 and record["vocab"] == 151936
    (case,) = record["cases"]
    assert case["context"] == 256 and case["memrl_step_peak_gib"] > 0 and case["reference_step_peak_gib"] > 0
    assert record["logprob_max_abs_diff"] is not None and record["logprob_max_abs_diff"] < 1e-3
