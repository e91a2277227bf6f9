"""The shared fixtures of the benchmark smoke tests (tests/test_bench_*.py): run a benchmark the way a user does (its
own process, ``python -m benchmarks.<name> args...`` from the repository root, offline, one thread) and hand back its
JSON lines, the last of which every benchmark prints as one JSON object; the model cache the benchmarks share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH_ENV = {
    "OMP_NUM_THREADS": "1",
    "WANDB_MODE": "offline",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONPATH": str(ROOT),
}


def model_cache() -> str:
    """The folder the benchmarks build their tiny models into (``MEMRL_MODEL_CACHE``, else ``.cache/models``)."""
    return os.environ.get("MEMRL_MODEL_CACHE", str(ROOT / ".cache" / "models"))


def bench_process(
    name: str, args: list[str], *, timeout: float = 1800.0, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -m benchmarks.<name> args...`` in its own process (``env`` added to :data:`BENCH_ENV`); the finished
    process, whatever its exit code."""
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args],
        cwd=cwd or ROOT,
        env={**os.environ, **BENCH_ENV, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def json_lines(proc: subprocess.CompletedProcess) -> list[dict[str, Any]]:
    """Every stdout line of a benchmark that is a JSON object, in order."""
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def run_benchmark(
    name: str,
    args: list[str],
    *,
    timeout: float = 1800.0,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """:func:`bench_process`, then: exit 0 and no traceback, or an assertion with the output's tail; returns its last
    line parsed as a JSON object."""
    proc = bench_process(name, args, timeout=timeout, cwd=cwd, env=env)
    command = f"python -m benchmarks.{name} {' '.join(args)}"
    tail = proc.stdout[-3000:] + "\n--- stderr ---\n" + proc.stderr[-5000:]
    assert proc.returncode == 0, f"{command} exited {proc.returncode}:\n{tail}"
    assert "Traceback" not in proc.stderr, tail
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines, f"{command} printed nothing:\n{tail}"
    try:
        record = json.loads(lines[-1])
    except json.JSONDecodeError:
        raise AssertionError(f"{command}: the last line is not JSON: {lines[-1][:300]}") from None
    assert isinstance(record, dict), lines[-1][:300]
    return record
