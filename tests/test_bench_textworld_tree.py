"""benchmarks/textworld_tree.py at its smallest setting: one memory-call tree on a generated treasure_hunter game
(the tiny model, 5 commands, 2 leaves, continuous batching), built with and without greedy sharing; fewer memory
engine calls with sharing, the seconds split by component, one JSON line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench_run import model_cache, run_benchmark

pytest.importorskip("textworld", reason="the textworld extra is not installed")


def test_textworld_tree_profile_smallest(tmp_path: Path) -> None:
    args = ["--cell", "treasure_hunter/medium", "--trees", "1", "--max-steps", "5", "--branch-factor", "2"]
    args += ["--max-leaves", "2", "--threads", "1", "--game-cache", str(tmp_path / "games")]
    record = run_benchmark("textworld_tree", [*args, "--model-cache", model_cache()], timeout=600)
    assert record["benchmark"] == "textworld_tree" and record["trees"] == 1 and record["settings"]["max_steps"] == 5
    before, after = record["builds"]["without_sharing"], record["builds"]["with_sharing"]
    assert record["continuous_batching"] is True
    assert record["trees_identical"] == (before["trees_digest"] == after["trees_digest"])
    assert before["shared_greedy_calls"] == 0 and after["shared_greedy_calls"] > 0
    assert after["engine_calls"]["policy"] < before["engine_calls"]["policy"]  # the shared calls were not computed
    assert before["memory_requests"] == after["memory_requests"] > 0 and before["leaves"] == 2
    for build in (before, after):
        assert {"memory_generation", "reasoner", "textworld_steps", "replay"} <= set(build["components_s"])
        assert build["seconds_per_tree"] > 0 and build["env_steps"] > 0
    assert record["command"].startswith("python -m benchmarks.textworld_tree ")
