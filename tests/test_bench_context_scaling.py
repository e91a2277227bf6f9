"""benchmarks/context_scaling.py at its smallest setting (``--quick``: 2K, 4K, 8K with 2 tasks)."""

from __future__ import annotations

from tests.bench_run import run_benchmark


def test_context_scaling_quick() -> None:
    record = run_benchmark("context_scaling", ["--quick"])
    assert record["benchmark"] == "context_scaling" and sorted(map(int, record["horizons"])) == [2048, 4096, 8192]
    for horizon in record["horizons"].values():
        sam, long_context = horizon["sam"], horizon["long_context"]
        assert sam["peak_context_tokens"] > 0 and 0.0 <= sam["success"] <= 1.0 and sam["memory_calls"] > 0
        assert long_context["memory_calls"] == 0 and long_context["peak_context_tokens"] <= record["window_tokens"]
    # SAM's active context stays flat as the horizon grows; the long-context window's does not
    assert record["sam_context_growth"] < record["long_context_context_growth"]
