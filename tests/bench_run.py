"""Run a script of benchmarks/ the way a user does (its own process, the command line its docstring shows) and hand
back its last line, which every benchmark prints as one JSON object: the smoke tests (tests/test_bench_*.py) that keep
a benchmark from rotting unseen (issue 41, acceptance 5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(name: str, args: list[str], *, timeout: float = 1800.0, cwd: Path | None = None) -> dict[str, Any]:
    """``python benchmarks/<name>.py args...``: exit 0 and no traceback, or an assertion with the output's tail;
    returns its last line parsed as a JSON object."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), *args],
        cwd=cwd or ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    tail = proc.stdout[-3000:] + "\n--- stderr ---\n" + proc.stderr[-5000:]
    assert proc.returncode == 0, f"benchmarks/{name}.py {' '.join(args)} exited {proc.returncode}:\n{tail}"
    assert "Traceback" not in proc.stderr, tail
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines, f"benchmarks/{name}.py printed nothing:\n{tail}"
    try:
        record = json.loads(lines[-1])
    except json.JSONDecodeError:
        raise AssertionError(f"benchmarks/{name}.py's last line is not JSON: {lines[-1][:300]}") from None
    assert isinstance(record, dict), lines[-1][:300]
    return record
