"""The statistics of benchmarks/ablations.py: paired differences by task, and the training diagnostics it reports."""

from __future__ import annotations

import pytest

from benchmarks.ablations import diagnostics, paired_difference


def test_paired_difference_is_per_task_and_matches_seeds() -> None:
    a = [{"seed": 0, "per_task": {"t1": 1.0, "t2": 0.5, "t3": 1.0}}, {"seed": 1, "per_task": {"t1": 1.0, "t2": 1.0,
                                                                                                  "t3": 0.0}}]
    b = [{"seed": 0, "per_task": {"t1": 0.0, "t2": 0.5, "t3": 1.0}}, {"seed": 2, "per_task": {"t1": 0.0, "t2": 0.0,
                                                                                                  "t3": 0.0}}]
    out = paired_difference(a, b)
    assert out["seeds"] == [0] and out["tasks"] == 3
    assert out["difference"] == pytest.approx(100 / 3)
    assert out["ci95"][0] < out["difference"] < out["ci95"][1]
    assert paired_difference(a, [{"seed": 5, "per_task": {}}]) == {}


def test_diagnostics_average_iterations_and_keep_the_last_probe_kl() -> None:
    history = [{"rows": 4, "kl_initial_probe": 0.01, "approx_kl": 0.0}, {"rows": 8, "kl_initial_probe": 0.03}]
    out = diagnostics(history)
    assert out["rows"] == 6 and out["kl_initial_probe"] == 0.03 and out["approx_kl"] == 0.0
    assert "clip_fraction" not in out
