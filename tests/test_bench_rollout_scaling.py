"""benchmarks/rollout_scaling.py at its smallest setting (2 trees, 2 loop iterations, no vLLM). It crashed after its
first figure once (its stand-in trainer lacked a method the loop had gained) and nothing noticed: issue 41."""

from __future__ import annotations

import pytest

from tests.bench_run import run_benchmark


# protects: benchmarks/rollout_scaling.py's JSON at its smallest setting (fleet, one-step-off and async figures)
@pytest.mark.slow
def test_rollout_scaling_smallest() -> None:
    record = run_benchmark("rollout_scaling", ["--tasks", "2", "--iterations", "2", "--latency-ms", "5", "--skip-vllm"])
    assert record["tasks"] == 2 and record["trees_per_s_1"] > 0 and record["trees_per_s_2"] > 0
    for figure in ("fleet_speedup", "offpolicy_iteration_ratio", "async_speedup", "async_speedup_endpoints"):
        assert record[figure] > 0, figure
    assert isinstance(record["passed"], bool)
