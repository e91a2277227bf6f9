"""Real multi-process runs on CPU: torchrun with 2 processes under DeepSpeed ZeRO-2 equals 1 process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, script: Path, *args: str) -> dict:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--master_port",
        str(free_port()),
        str(script),
        *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("METRICS ")]
    assert proc.returncode == 0 and len(lines) == 1, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[0][len("METRICS ") :])


def max_weight_diff(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    return max(float((wa[k] - wb[k]).abs().max()) for k in wa)


@pytest.mark.slow
@pytest.mark.distributed
def test_group_trainer_two_processes_zero2_matches_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    script = ROOT / "tests" / "scripts" / "group_step.py"
    one = torchrun(1, script, str(tiny_model_dir), "zero2_cpu", str(tmp_path / "p1"))
    two = torchrun(2, script, str(tiny_model_dir), "zero2_cpu", str(tmp_path / "p2"))
    assert (one["world"], two["world"]) == (1, 2)
    assert two["loss"] == pytest.approx(one["loss"], abs=1e-6)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    assert max_weight_diff(tmp_path / "p1", tmp_path / "p2") < 1e-4
