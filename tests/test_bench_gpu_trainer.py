"""benchmarks/gpu_trainer.py at its smallest setting: ``--quick`` (the tiny shape, a 256-token context) on the CPU,
LoRA only, without the length mix (tests/gpu runs it on a GPU)."""

from __future__ import annotations

import pytest

from tests.bench_run import run_benchmark


@pytest.mark.slow
def test_gpu_trainer_quick_on_cpu() -> None:
    record = run_benchmark(
        "gpu_trainer", ["--quick", "--device", "cpu", "--modes", "lora", "--no-mix", "--warmup", "0"]
    )
    assert record["cases"], record
    for case in record["cases"]:
        assert case["shape"] == "tiny" and case["mode"] == "lora"
        for impl in ("memrl", "reference"):
            assert not case[impl]["oom"] and case[impl]["seconds_per_step"] > 0 and case[impl]["tokens"] > 0
