"""benchmarks/ablations.py at its smallest setting (``--smoke``: a tiny SFT start of its own, 3 test tasks, 2 seeds):
every stage runs, the JSON keeps each variant's success per seed and task, ``--recompute`` gives the same paired
table from those records alone, and rerunning the command reuses every finished run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ablations.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1800)


def test_smoke_run_keeps_the_records_recomputes_and_resumes(tmp_path: Path, tiny_model_dir: Path) -> None:
    common = ["--smoke", "--variants", "oat,sft_more", "--work", str(tmp_path / "w"),
              "--model-cache", str(tiny_model_dir.parent)]
    first = _run(*common)
    assert first.returncode == 0, first.stderr[-3000:]
    record = json.loads(first.stdout.strip().splitlines()[-1])
    assert record["scale"] == "smoke" and record["seeds"] == 2 and record["setting"] == "multihop"
    assert (tmp_path / "w" / "multihop" / "start-smoke" / "sft" / "final" / "config.json").is_file()
    records = record["records"]
    assert len(records["tasks"]) == 3
    for mode in ("sampled", "greedy"):
        assert set(records[mode]) == {"sft", "oat", "sft_more"}
        assert all(set(by_seed) == {"0", "1"} and all(len(v) == 3 for v in by_seed.values())
                   for by_seed in records[mode].values())
    paired = record["paired"]["oat - sft"]["sampled"]
    assert paired["seeds"] == [0, 1] and paired["tasks"] == 3 and len(paired["per_seed"]) == 2
    for key in ("ci95", "ci95_seed_t", "ci95_two_level_bootstrap", "ci95_tasks_only"):
        assert paired[key][0] <= paired["difference"] <= paired[key][1], key

    saved = tmp_path / "ablations.json"
    saved.write_text(json.dumps(record))
    again = _run("--recompute", str(saved))
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout) == record["paired"]

    resumed = _run(*common)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    second = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert sorted(second["reused_runs"]) == sorted(f"{v}-s{s}" for v in ("sft", "oat", "sft_more") for s in (0, 1))
    assert second["records"] == records and second["sft_weights"] == record["sft_weights"]
