"""SIGKILL a one-step-off OAT-GRPO run during its last checkpoint write and at a random moment; each ``--resume`` ends
with the uninterrupted run's weights and a metrics.jsonl holding every step once (benchmarks/resume_faults.py runs
the same check over 20 kills; its smoke test, tests/test_bench_resume_faults.py, kills in the first checkpoint
write)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from benchmarks import resume_faults as bench


# protects: one-step-off OAT-GRPO killed in its last checkpoint write and at a random moment resumes to the
# uninterrupted run's weights (a kill in the first write: test_bench_resume_faults.py)
@pytest.mark.slow
def test_sigkill_then_resume_equals_the_uninterrupted_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    """One-step-off rollouts (``loop.max_staleness=1``, in the driver): a kill in the last checkpoint write (the
    one-step-off collection of the newest complete checkpoint needs a policy version the iteration after it no longer
    uses) and one at a random moment."""
    stale = "loop.max_staleness=1"
    started, wall = bench.run(bench.command(tiny_model_dir, tmp_path, "reference", stale), tmp_path / "reference")
    reference = bench.weights(tmp_path / "reference")
    expected = bench.steps(tmp_path / "reference")
    assert expected == [-1, 0, 1, 2, 3]
    kills = [(None, bench.ITERATIONS - 1), (random.Random(1).uniform(started, wall), 0)]
    for trial, (moment, in_write_of) in enumerate(kills):
        name = f"killed-{trial}"
        hit = bench.kill_at(
            bench.command(tiny_model_dir, tmp_path, name, stale), tmp_path / name, moment, in_write_of=in_write_of
        )
        if hit["finished"]:
            continue  # the run beat the kill on a slow machine: nothing to resume
        bench.run(bench.command(tiny_model_dir, tmp_path, name, stale, "--resume"))
        assert bench.steps(tmp_path / name) == expected, hit
        assert bench.same_weights(bench.weights(tmp_path / name), reference), hit
        assert not list((tmp_path / name / "checkpoints").glob(".tmp-ckpt-*"))
