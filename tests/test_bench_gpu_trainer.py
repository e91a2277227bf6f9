"""The GPU check (``bash tests/gpu/run.sh check``) dry-run on the CPU in its quick form: the suite collected, then
benchmarks/gpu_trainer.py ``--quick`` (the tiny shape: LoRA on the length mix and a 256-token context, then full weights
at 512 tokens as the 9B run's stand-in), each case beside the padded reference; and the benchmark's child
environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# protects: benchmarks/gpu_trainer.py --quick on the CPU: memrl's and the reference step run and its JSON last line
@pytest.mark.slow
def test_gpu_check_dry_run_on_cpu(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "OUT": str(tmp_path),
        "PYTHON": sys.executable,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "MEMRL_GPU_SITE": str(tmp_path / "site"),
        # the check's wall-clock budgets (fitted to a GPU machine's 9-minute call) would skip the benchmark's
        # workloads on a loaded CI machine: here they are wide, so the dry run is the same whatever the load
        "MEMRL_GPU_CHECK_S": "3600",
        "MEMRL_GPU_SUITE_S": "900",
    }
    proc = subprocess.run(
        ["bash", "tests/gpu/run.sh", "check", "--device", "cpu", "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    tail = proc.stdout[-4000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, tail
    assert "no carried wheels: this environment has what the check needs" in proc.stdout
    benchmark = "benchmarks/gpu_trainer.py"
    assert f"[gpu] check: python {benchmark}" in proc.stdout  # the check ran the benchmark after the suite
    assert "tests collected" in (tmp_path / "gpu-suite.log").read_text()
    for name, modes, workloads in [("4b", {"lora"}, {"mix", "ctx256"}), ("9b", {"full"}, {"ctx512"})]:
        summary = json.loads((tmp_path / f"gpu-check-{name}-summary.json").read_text())
        assert summary["summary"]["failed_processes"] == 0, summary
        cases = summary["cases"]
        assert {c["mode"] for c in cases} == modes and {c["workload"] for c in cases} == workloads
        for case in cases:
            assert case["shape"] == "tiny" and "plan_error" in case
            for impl in ("memrl", "reference"):
                assert not case[impl]["oom"] and case[impl]["tokens_per_s"] > 0, case
            assert case["memrl"]["gradient_checkpointing"] is False  # the plan says the tiny run fits
            assert case["memrl"]["attention"].startswith("memrl_packed_sdpa (per_row_sdpa")


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
