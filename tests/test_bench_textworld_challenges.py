"""benchmarks/textworld_challenges.py at its smallest setting: one tw-simple game (dense rewards, a detailed goal),
won by the family's reasoner with its full context and distilled by its expert inside SAM, one JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import textworld"], capture_output=True).returncode != 0,
    reason="the textworld extra is not installed",
)


# protects: the challenge benchmark's two stages (a full-context rollout, `memrl data distill` in a subprocess) and
# its JSON line, on a game tw-make generates at test time
@pytest.mark.slow
def test_textworld_challenges_benchmark_smallest(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.textworld_challenges",
            "--games",
            "1",
            "--settings",
            "simple",
            "--cache-dir",
            str(tmp_path / "games"),
            "--work",
            str(tmp_path / "work"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    simple = out["settings"]["simple"]
    assert out["games"] == 1 and simple["params"]["challenge"] == "simple"
    assert simple["full_context"]["won"] == 1, simple
    roles = simple["distill"]["stats"]["roles"]
    assert roles["consolidate"]["traces_kept"] == 1 and roles["recall"]["traces_kept"] == 1, roles
    assert roles["consolidate"]["kept"] > 0 and roles["recall"]["kept"] > 0, roles
