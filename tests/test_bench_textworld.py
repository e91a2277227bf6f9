"""benchmarks/textworld.py at its smallest setting: one treasure_hunter game, the scripted variants (no memory, long
context, BM25, SAM with the expert) and the replay check, into a temporary work folder and game cache."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("textworld", reason="the textworld extra is not installed")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_textworld_benchmark_smallest_setting(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "textworld.py"),
        "--quick",
        "--model",
        "none",
        "--cells",
        "treasure_hunter/small",
        "--test-games",
        "2",
        "--seeds",
        "2",
        "--work",
        str(tmp_path / "work"),
        "--game-cache",
        str(tmp_path / "games"),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["benchmark"] == "textworld" and result["records"]["games"] == ["test-400000", "test-400001"]
    table = result["table"]
    assert set(table) == {"no_memory", "long_context", "bm25", "sam_expert"}
    assert table["sam_expert"]["all"]["success"] == 1.0 and table["sam_expert"]["all"]["steps_to_win"] > 0
    assert set(result["paired"]) == {"bm25-no_memory", "long_context-no_memory"}
    assert result["paired"]["bm25-no_memory"]["all"]["seeds"] == 2
    assert (
        result["replay"]
        == {"games": 2, "exact": 2, "commands_replayed": result["replay"]["commands_replayed"], "mismatched": []}
        and result["replay"]["commands_replayed"] >= 2
    )
    assert "replay re-entry exact on 2 of 2 test games" in out.stderr
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)  # everything cached
    assert rerun.returncode == 0 and json.loads(rerun.stdout.strip().splitlines()[-1])["table"] == table
    assert "games ready in 0 s" in rerun.stderr
