"""benchmarks/reentry.py at its smallest setting: one JSON line; replay re-runs exactly the horizon's steps per
branch, snapshot/restore none, and every branch continued as the original did (the benchmark checks it)."""

from __future__ import annotations

from tests.bench_run import bench_process, json_lines


def test_reentry_benchmark_quick() -> None:
    done = bench_process("reentry", ["--quick"], timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (out,) = json_lines(done)  # one line: the JSON record
    assert out["benchmark"] == "reentry" and out["horizons"] == [4, 16]
    assert out["replay"]["env_steps_per_branch"] == [4.0, 16.0]
    assert out["snapshot"]["env_steps_per_branch"] == [0.0, 0.0]
    assert all(s > 0 for mode in ("replay", "snapshot") for s in out[mode]["seconds_per_branch"])
