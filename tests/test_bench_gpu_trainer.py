"""benchmarks/gpu_trainer.py at its smallest setting: ``--quick`` (the tiny shape, a 256-token context) on the CPU,
LoRA only, without the length mix (tests/gpu runs it on a GPU)."""

from __future__ import annotations

import pytest

from tests.bench_run import run_benchmark


# protects: benchmarks/gpu_trainer.py --quick on the CPU: memrl's and the reference step run and its JSON last line
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


def test_children_keep_the_callers_python_path() -> None:
    """The measuring children import the carried wheels tests/gpu/run.sh puts on PYTHONPATH (the first H200 run's
    children replaced it with the checkout alone and failed on ``import pydantic``)."""
    import os

    from benchmarks.gpu_trainer import ROOT, child_env

    env = child_env("cuda", {"PYTHONPATH": "/tmp/memrl-gpu-site", "HOME": "/root"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/tmp/memrl-gpu-site"]
    assert env["HOME"] == "/root" and "CUDA_VISIBLE_DEVICES" not in env
    assert child_env("cpu", {})["PYTHONPATH"] == str(ROOT)
    assert child_env("cpu", {})["CUDA_VISIBLE_DEVICES"] == ""
