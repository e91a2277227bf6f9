"""benchmarks/soak.py at its smallest setting (SEAMS seam 4): a few OAT-GRPO iterations on a 1-worker Ray fleet print
the one JSON line with the driver's and the worker's RSS and open files per iteration and the growth figures."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests.bench_run import run_benchmark


# protects: benchmarks/soak.py's JSON: the driver's and a Ray worker's memory and open files per iteration
@pytest.mark.slow
def test_soak_prints_memory_and_open_files_of_driver_and_workers(tiny_model_dir: Path, tmp_path: Path) -> None:
    args = [*shlex.split("--iterations 3 --warmup 1 --workers 1"), "--work", str(tmp_path / "soak")]
    args += ["--model", str(tiny_model_dir)]
    summary = run_benchmark("soak", args, timeout=900)
    assert summary["benchmark"] == "soak" and summary["iterations"] == 3 and summary["workers"] == 1
    processes = summary["processes"]
    assert set(processes) == {"driver", "worker0"}  # the Ray actor process was found and measured
    for figures in processes.values():
        assert 100 < figures["rss_first_mb"] <= figures["rss_peak_mb"] and figures["open_files_final"] > 0
        assert isinstance(figures["rss_growth_mb_per_100"], float)
    assert summary["sync_check_s_mean"] > 0 and summary["sync_s_mean"] > 0  # the sync check ran every iteration
    rows = [json.loads(line) for line in (tmp_path / "soak" / "soak.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert all(r["processes"]["worker0"]["pid"] != r["processes"]["driver"]["pid"] for r in rows)


def test_growth_slope_and_bound() -> None:
    """The growth figure is the least-squares slope per 100 iterations after the warm-up; bounded needs every slope
    within the bound and no open-file growth."""
    from benchmarks.soak import slope_per_100, summarize

    assert slope_per_100([0, 1, 2, 3], [10, 10.5, 11, 11.5]) == pytest.approx(50.0)

    def row(i: int, rss: float, files: int) -> dict:
        return {"iteration": i, "processes": {"driver": {"rss_mb": rss, "peak_mb": rss + 1, "open_files": files}}}

    flat = summarize([row(i, 800 + (50 if i == 0 else 0), 30) for i in range(10)], warmup=1, bound_mb=5)
    assert flat["bounded"] and flat["processes"]["driver"]["rss_growth_mb_per_100"] == 0.0
    assert flat["processes"]["driver"]["rss_peak_mb"] == 851.0
    leaking = summarize([row(i, 800 + i, 30 + i) for i in range(10)], warmup=1, bound_mb=5)
    assert not leaking["bounded"] and leaking["processes"]["driver"]["rss_growth_mb_per_100"] == 100.0
