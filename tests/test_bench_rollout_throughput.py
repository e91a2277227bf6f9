"""benchmarks/rollout_throughput.py at its smallest setting (2 prompts x 1 sample x 4 tokens; vLLM's CPU wheel)."""

from __future__ import annotations

import pytest

from tests.bench_run import run_benchmark


# protects: benchmarks/rollout_throughput.py's JSON: vLLM's and transformers' tokens per second
@pytest.mark.slow
@pytest.mark.vllm
def test_rollout_throughput_smallest() -> None:
    pytest.importorskip("vllm")
    record = run_benchmark("rollout_throughput", ["--prompts", "2", "--samples", "1", "--max-tokens", "4"])
    assert record["vllm_tokens_per_s"] > 0 and record["hf_tokens_per_s"] > 0 and record["ratio"] > 0
