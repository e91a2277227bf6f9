"""Running a command from a test: to the end, its text output captured, the test failing with its stderr's tail."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.served import free_port

ROOT = Path(__file__).resolve().parents[1]


def run_ok(
    cmd: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` in ``cwd``; fail the test, naming the command and the last 3,000 characters of its stderr,
    unless it exits 0."""
    done = subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{shlex.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done


def cpu_torchrun(nproc: int) -> list[str]:
    """``launch/torchrun.sh`` with ``nproc`` CPU processes on a free rendezvous port, up to the ``--`` that the memrl
    command follows."""
    launcher = str(ROOT / "launch" / "torchrun.sh")
    return [
        "bash",
        launcher,
        "--device",
        "cpu",
        "--nproc-per-node",
        str(nproc),
        "--master-port",
        str(free_port()),
        "--",
    ]
