"""benchmarks/tree_vs_flat.py at its smallest setting: the token ratios and, from replays, the reasoner tokens per
correctly-signed credited action of both modes."""

from __future__ import annotations

import pytest

from tests.bench_run import run_benchmark


# protects: benchmarks/tree_vs_flat.py's JSON: token ratios and reasoner tokens per correctly-signed action from replays
@pytest.mark.slow
def test_tree_vs_flat_reports_tokens_per_correctly_signed_action() -> None:
    summary = run_benchmark("tree_vs_flat", ["--tasks", "2", "--ks", "2", "--replays", "2"], timeout=600)
    assert summary["benchmark"] == "tree_vs_flat" and summary["replays_per_action"] == 2
    row = summary["per_k"]["2"]
    for mode in ("tree", "flat"):
        r = row[mode]
        assert (
            0
            <= r["correctly_signed_actions"]
            <= r["actions_with_nonzero_true_advantage"]
            <= r["credited_actions_scored"]
        )
        assert r["reasoner_tokens_per_correctly_signed_action"] == r["reasoner_tokens"] / max(
            r["correctly_signed_actions"], 1
        )
    # every action of a flat trajectory is credit-bearing and scored; a tree scores its sibling-level units
    assert row["flat"]["credited_actions_scored"] == row["flat"]["credit_bearing_actions"]
    assert row["tree"]["credited_actions_scored"] <= row["tree"]["credit_bearing_actions"]
    assert row["flat_over_tree_correctly_signed"] > 0 and "flat_over_tree" in row
