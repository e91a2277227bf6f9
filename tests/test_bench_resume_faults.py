"""benchmarks/resume_faults.py at its smallest setting (one kill, in the first checkpoint write, rollouts in the
driver)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench_run import run_benchmark


# protects: benchmarks/resume_faults.py (2 iterations): a SIGKILL in the first checkpoint write (staleness 0) resumes
# to the uninterrupted run's weights, no orphan process; its JSON
@pytest.mark.slow
def test_resume_faults_one_trial(tmp_path: Path) -> None:
    record = run_benchmark(
        "resume_faults",
        ["--trials", "1", "--iterations", "2", "--fleet-workers", "0", "--max-staleness", "0", "--work", str(tmp_path)],
    )
    assert record["benchmark"] == "resume_faults" and record["resumes_equal"] == "1/1"
    assert record["iterations"] == 2 and record["expected_steps"] == [-1, 0, 1]
    assert record["kills_during_checkpoint_write"] == 1 and record["trials_with_orphans_after_10s"] == 0
