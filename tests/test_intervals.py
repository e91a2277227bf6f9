"""Intervals of benchmark comparisons (rollout/evaluation/stats.py): Student-t over seeds, the task-level interval
the benchmarks reported before, and the two-level interval over training seeds and test tasks, against values
computed by hand."""

from __future__ import annotations

import math
import random

import pytest

from memrl.rollout.evaluation.stats import (
    seed_level_t,
    t_interval,
    task_level_interval,
    two_level_bootstrap,
    two_level_interval,
)

T975_DF1, T975_DF2, T975_DF4 = 12.706204736174698, 4.302652729749464, 2.7764451051977987  # Student-t 0.975 quantiles


def test_t_interval_matches_the_hand_computed_student_t() -> None:
    # mean 2, sd 1, n 3: 2 +- t(0.975, 2) / sqrt(3)
    low, high = t_interval([1.0, 2.0, 3.0])
    assert low == pytest.approx(2 - T975_DF2 / math.sqrt(3)) and high == pytest.approx(2 + T975_DF2 / math.sqrt(3))
    # five values: mean 0.3, sd 0.1581..., 4 degrees of freedom
    values = [0.1, 0.2, 0.3, 0.4, 0.5]
    half = T975_DF4 * math.sqrt(0.025) / math.sqrt(5)
    assert t_interval(values) == pytest.approx([0.3 - half, 0.3 + half])
    assert t_interval([0.7]) is None  # one seed has no interval
    # a 90% interval is narrower
    assert t_interval(values, level=0.9)[1] - t_interval(values, level=0.9)[0] < 2 * half


def test_seed_level_t_takes_each_seed_s_mean_as_one_sample() -> None:
    rows = [[0.0, 2.0], [1.0, 3.0], [2.0, 4.0]]  # seed means 1, 2, 3: mean 2, sd 1, 2 degrees of freedom
    expected = [2 - T975_DF2 / math.sqrt(3), 2 + T975_DF2 / math.sqrt(3)]
    assert seed_level_t(rows) == pytest.approx(expected)
    # treating the 6 (seed, task) values as independent samples would give mean 2, sd sqrt(2), n 6, 5 df:
    # +- 1.48 instead of +- 2.48
    assert seed_level_t(rows)[1] - 2 == pytest.approx(2.4841377, abs=1e-6)
    assert seed_level_t([[0.5, 1.0]]) is None
    with pytest.raises(ValueError, match="row lengths"):
        seed_level_t([[0.0, 1.0], [1.0]])


def test_task_level_interval_averages_seeds_first() -> None:
    rows = [[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]]  # per-task means 0.5, 1, 0.5: mean 2/3, sd 0.2887
    half = 1.959963984540054 * math.sqrt(1 / 12) / math.sqrt(3)
    assert task_level_interval(rows) == pytest.approx([2 / 3 - half, 2 / 3 + half])


def test_two_level_bootstrap_resamples_seeds_and_tasks_as_units() -> None:
    # two seeds, constant within each: a resample's mean is 0, 0.5 or 1 with chances 1/4, 1/2, 1/4, so the 95%
    # percentile interval is [0, 1] whatever the tasks. Resampling the 20 (seed, task) cells independently would
    # give about [0.28, 0.72]; resampling tasks only, [0.5, 0.5].
    rows = [[0.0] * 10, [1.0] * 10]
    assert two_level_bootstrap(rows) == [0.0, 1.0]
    # seeds that agree and tasks that differ: the tasks' spread is the interval
    assert two_level_bootstrap([[0.0, 1.0], [0.0, 1.0]]) == [0.0, 1.0]
    # every value equal: no spread at all
    assert two_level_bootstrap([[0.25] * 4] * 3) == pytest.approx([0.25, 0.25])
    assert two_level_bootstrap(rows, seed=1) == two_level_bootstrap(rows, seed=1)  # reproducible


def test_two_level_interval_is_the_wider_of_the_bootstrap_and_the_seed_t() -> None:
    rows = [[0.0] * 10, [1.0] * 10]
    out = two_level_interval(rows)
    half = T975_DF1 * math.sqrt(0.5) / math.sqrt(2)  # seed means 0 and 1: sd 0.7071, 1 degree of freedom
    assert out["seed_level_t"] == pytest.approx([0.5 - half, 0.5 + half])
    assert out["two_level_bootstrap"] == [0.0, 1.0]
    assert out["interval"] == pytest.approx([0.5 - half, 0.5 + half])  # the t-interval is the wider here
    assert out["task_level"] == pytest.approx([0.5, 0.5])  # every task's seed mean is 0.5: the seeds cancel out
    assert out["per_seed_mean"] == [0.0, 1.0] and out["seeds"] == 2 and out["tasks"] == 10
    assert out["half_width"] == pytest.approx(half)
    # one seed: the bootstrap over tasks alone, no t-interval
    single = two_level_interval([[0.0, 1.0, 1.0, 0.0]])
    assert single["seed_level_t"] is None and single["interval"] == single["two_level_bootstrap"]


def test_two_level_interval_is_wider_than_the_task_level_one_when_seeds_spread() -> None:
    """Five training runs that land in different places (a per-seed offset) scored on 200 tasks: the task-level
    interval sees only the tasks' spread; the two-level interval sees the runs' too."""
    rng = random.Random(0)
    offsets = [-0.08, -0.04, 0.0, 0.04, 0.08]
    rows = [[off + rng.gauss(0.02, 0.3) for _ in range(200)] for off in offsets]
    out = two_level_interval(rows)
    task_width = out["task_level"][1] - out["task_level"][0]
    for key in ("interval", "two_level_bootstrap", "seed_level_t"):
        low, high = out[key]
        assert high - low > 1.5 * task_width, key
        assert low < out["mean"] < high
    # without the seeds' spread the two-level and task-level widths are alike
    same = [[rng.gauss(0.02, 0.3) for _ in range(200)]] * 5
    calm = two_level_interval(same)
    calm_task = calm["task_level"][1] - calm["task_level"][0]
    assert calm["two_level_bootstrap"][1] - calm["two_level_bootstrap"][0] == pytest.approx(calm_task, rel=0.25)
