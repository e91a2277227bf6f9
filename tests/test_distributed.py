"""Real multi-process runs on CPU: torchrun with 2 processes (plain DDP, and the OAT-GRPO recipe under DeepSpeed
ZeRO-2) equals 1 process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from served import free_port
from test_oat_grpo import tiny_overrides

from tests.commands import cpu_torchrun

ROOT = Path(__file__).resolve().parents[1]


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


# protects: plain DDP with token-budget micro-batches and a warmup schedule across 2 real processes (each rank scores
# its half; the update and the learning rate equal 1 process's); no fast test starts a process group
@pytest.mark.slow
@pytest.mark.distributed
def test_ddp_two_processes_score_their_shard_and_step_the_schedule_once(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Plain DDP, token-budget micro-batches, 2 optimizer steps under warmup: each rank scores half of the rows, the
    update and the learning rate equal the 1-process ones."""
    script = ROOT / "tests" / "scripts" / "group_step.py"
    options = ("warmup_steps=10", "optimizer_steps_per_epoch=2", "max_tokens_per_micro_batch=40", "kl_coef=0.1")
    one = torchrun(1, script, str(tiny_model_dir), "none", str(tmp_path / "p1"), *options)
    two = torchrun(2, script, str(tiny_model_dir), "none", str(tmp_path / "p2"), *options)
    assert one["scored_rows"] == [6] and two["scored_rows"] == [3, 3]
    assert one["lr"] == two["lr"] == pytest.approx(1e-3 * 3 / 10)  # two optimizer steps into a 10-step warmup
    assert two["loss"] == pytest.approx(one["loss"], abs=1e-6)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    assert max_weight_diff(tmp_path / "p1", tmp_path / "p2") < 1e-4


def oat_grpo_run(nproc: int, model: Path, out: Path, name: str) -> Path:
    """One OAT-GRPO iteration of the tiny recipe through launch/torchrun.sh on CPU under DeepSpeed ZeRO-2."""
    # MEMRL_PYTHON: the launcher runs this interpreter, not whatever .venv or python3 it would find.
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
        "MEMRL_PYTHON": sys.executable,
    }
    cmd = [
        *cpu_torchrun(nproc),
        "train",
        "oat-grpo",
        "--config",
        str(ROOT / "configs" / "oat_grpo_tiny.yaml"),
        *tiny_overrides(model, out, name),
        "loop.iterations=1",
        "eval_tasks.count=1",
        "trainer.deepspeed=zero2_cpu",
        "trainer.micro_batches=2",
        "trainer.update_epochs=2",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return out / name


# protects: launch/torchrun.sh with 2 processes under DeepSpeed ZeRO-2 (micro-batches, 2 update epochs) makes the
# same OAT-GRPO update, checkpoint and synced policy as 1 process
@pytest.mark.slow
@pytest.mark.distributed
def test_oat_grpo_iteration_two_processes_zero2_matches_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    one = oat_grpo_run(1, tiny_model_dir, tmp_path, "one")
    two = oat_grpo_run(2, tiny_model_dir, tmp_path, "two")
    summaries = [json.loads((d / "summary.json").read_text()) for d in (one, two)]
    assert [s["world_size"] for s in summaries] == [1, 2]
    assert summaries[0]["updates"] == summaries[1]["updates"] >= 1
    (m1,), (m2,) = (
        [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if json.loads(x)["step"] == 0]
        for d in (one, two)
    )
    # The main process rolls out the same groups in both runs; the 2 ranks split their rows.
    assert m2["tasks"] == m1["tasks"] and m2["rows"] == m1["rows"] > 0
    assert m2["reward_mean"] == pytest.approx(m1["reward_mean"], abs=1e-9)
    assert m2["loss"] == pytest.approx(m1["loss"], rel=1e-5, abs=1e-7)
    assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-4)
    # The checkpoint and the synced policy after the update equal the 1-process ones.
    assert max_weight_diff(one / "policy" / "v00001", two / "policy" / "v00001") < 1e-4
    assert all((d / "checkpoints" / "ckpt-000000" / "COMPLETE").exists() for d in (one, two))
