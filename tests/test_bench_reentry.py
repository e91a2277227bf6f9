"""benchmarks/reentry.py at its smallest setting: one JSON line; replay re-runs exactly the horizon's steps per
branch, snapshot/restore none, and every branch continued as the original did (the benchmark checks it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_reentry_benchmark_quick() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "reentry.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = [x for x in done.stdout.splitlines() if x.strip()]
    out = json.loads(line)
    assert out["benchmark"] == "reentry" and out["horizons"] == [4, 16]
    assert out["replay"]["env_steps_per_branch"] == [4.0, 16.0]
    assert out["snapshot"]["env_steps_per_branch"] == [0.0, 0.0]
    assert all(s > 0 for mode in ("replay", "snapshot") for s in out[mode]["seconds_per_branch"])
