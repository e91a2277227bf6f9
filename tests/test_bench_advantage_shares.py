"""benchmarks/advantage_shares.py at its smallest setting (the noisy scripted expert as the policy): every advantage
option on the same trees, with the trainer's diagnostics."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.bench_run import model_cache, run_benchmark


# protects: benchmarks/advantage_shares.py's JSON at its smallest setting: every advantage option on the same SAM trees,
# with the trainer's diagnostics
@pytest.mark.slow
def test_advantage_shares_compares_every_option_on_one_batch(tmp_path: Path) -> None:
    from memrl.rewards.advantage import ADVANTAGE_PRESETS

    args = [*shlex.split("--policy noisy-oracle --tasks 4"), "--work", str(tmp_path), "--model-cache", model_cache()]
    record = run_benchmark("advantage_shares", args, timeout=900)
    options = record["options"]
    assert set(options) == {f"{p}/{s}" for p in ADVANTAGE_PRESETS for s in ("separate", "branch")}
    for layout in ("separate", "branch"):
        paper, only = options[f"grpo_std/{layout}"], options[f"informative_only/{layout}"]
        assert only.get("outcome_tied_row_fraction", 0.0) == 0.0 and only["rows"] <= paper["rows"]
        if paper["abs_advantage_tied_mean"] is not None:  # the paper's formula: unit-size committee-only advantages
            assert paper["abs_advantage_tied_mean"] == pytest.approx(1.0, abs=0.05)
            assert options[f"dr_grpo/{layout}"]["abs_advantage_tied_mean"] < 0.5
    # branching at the first differing call never leaves more identical rows to cancel than the separate layout
    assert (
        options["grpo_std/branch"].get("identical_row_cancelled_advantage_fraction", 0.0)
        <= options["grpo_std/separate"].get("identical_row_cancelled_advantage_fraction", 0.0) + 1e-9
    )


# protects: benchmarks/advantage_shares.py on proactive pivot groups: the paper's advantage pushes outcome-tied groups
# toward silence, informative_only trains none of them
@pytest.mark.slow
def test_advantage_shares_of_pivot_groups_show_the_cost_only_push_toward_silence() -> None:
    args = [*shlex.split("--family proactive --tasks 2"), "--model-cache", model_cache()]
    options = run_benchmark("advantage_shares", args, timeout=900)["options"]
    paper, only = options["all_turns/grpo_std"], options["all_turns/informative_only"]
    assert paper["outcome_tied_groups"] > 0 and paper["tied_mixed_groups_advantage_remind"] < -0.5
    assert paper["tied_mixed_groups_advantage_silent"] > 0 and paper["outcome_tied_advantage_fraction"] > 0.3
    assert only["tied_mixed_groups_advantage_remind"] == 0.0 and only.get("outcome_tied_advantage_fraction", 0) == 0
    assert only["rows"] < paper["rows"]
