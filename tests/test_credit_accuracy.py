"""The statistics of benchmarks/credit_accuracy.py: ranks, Spearman, sign agreement, the state bootstrap, and each
credit method's advantages for one sibling group."""

from __future__ import annotations

import pytest

from benchmarks.credit_accuracy import (
    bootstrap,
    group_advantages_by_method,
    ranks,
    sign_agreement,
    spearman,
)


def test_ranks_average_ties_and_spearman_reads_monotone_relations() -> None:
    assert ranks([3.0, 1.0, 3.0, 2.0]) == [2.5, 0.0, 2.5, 1.0]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 1000]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1], [1, 2, 3]) is None


def test_sign_agreement_counts_a_zero_advantage_as_half_and_skips_zero_truth() -> None:
    pairs = [(1.0, 0.5), (-1.0, 0.5), (0.0, -0.2), (2.0, 0.0)]
    assert sign_agreement(pairs) == pytest.approx((1 + 0 + 0.5) / 3)
    assert sign_agreement([(1.0, 0.0)]) is None


def test_bootstrap_interval_brackets_the_point_and_resamples_states() -> None:
    states = [[(1.0, 1.0), (-1.0, -1.0)]] * 5 + [[(1.0, -1.0), (-1.0, 1.0)]] * 5
    out = bootstrap(states, sign_agreement, draws=400)
    assert out["value"] == pytest.approx(0.5) and out["actions"] == 20
    low, high = out["ci95"]
    assert low < 0.5 < high and high - low > 0.1


def test_methods_disagree_where_they_should() -> None:
    """Tree credit compares siblings; flat GRPO compares a trajectory with the task's start, so when every root
    trajectory tied it has no signal; the committee alone follows c."""
    advs = group_advantages_by_method([1.0, 0.0], [0.2, 0.9], [1.0, 0.0], [1.0, 1.0])
    assert advs["tree"][0] > 0 > advs["tree"][1]
    assert advs["flat"] == [0.0, 0.0]
    assert advs["committee"] == pytest.approx([-0.35, 0.35])
    assert advs["oat"][0] > 0 > advs["oat"][1]  # the outcome gap (1) outweighs 0.5 x the committee gap (0.7)
    assert "oat" not in group_advantages_by_method([1.0, 0.0], [0.2, None], [1.0, 0.0], [0.0, 1.0])


def test_recoverability_methods_and_committee_only_advantages_in_tied_groups() -> None:
    """Where the tree's own leaves tie, OAT's advantage is the committee's alone and unit-sized (the paper's formula);
    the recoverability committee gets methods of its own."""
    advs = group_advantages_by_method([1.0, 1.0], [0.61, 0.60], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0])
    assert advs["tree"] == [0.0, 0.0]
    assert advs["oat"] == pytest.approx([1.0, -1.0], abs=1e-3)  # a 0.01 committee gap becomes +-1
    assert advs["committee_recoverability"] == pytest.approx([-0.5, 0.5])
    assert advs["oat_recoverability"][1] > 0 > advs["oat_recoverability"][0]
    assert "oat_recoverability" not in group_advantages_by_method([1.0, 0.0], [0.2, 0.9], [1.0, 0.0], [0.0, 1.0])
