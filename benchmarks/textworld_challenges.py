"""TextWorld beyond the three preset challenges: games of ``tw-make tw-simple --rewards dense --goal detailed`` (an
errand told step by step) and ``tw-make tw-cooking --recipe 5 --take 5 --go 9`` (five ingredients to find in nine
rooms), played by the ``ms_textworld`` family's reasoner with its full context (``long_context``: every turn stays in
the context) and distilled with its expert inside SAM (``memrl data distill``: the expert writes the cues and recalls,
rejection sampling keeps the episodes the reasoner won). Both read only what TextWorld gives every game: the
reasoner the objective text, the admissible commands and the observations; the expert the walkthrough
(``extra.walkthrough``) besides.

Per setting: games won with full context (of ``--games``, the test split's seeds), and the distilled episodes kept
with the rows of each SAM role. Prints one JSON line (``--out`` writes it too).

    .venv/bin/python -m benchmarks.textworld_challenges [--games 10] [--settings simple,cooking]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from memrl.data.tasks import TaskSetConfig, load_tasks
from memrl.data.tasks.ms_textworld import MS_TEXTWORLD_SPLITS, TwReasoner
from memrl.rollout.agents import task_rollout
from memrl.rollout.engines.scripted import ScriptedEngine
from memrl.rollout.loop import EngineSet, run_rollouts

SETTINGS: dict[str, dict[str, Any]] = {
    "simple": {"challenge": "simple", "rewards": "dense", "goal": "detailed"},
    "cooking": {"challenge": "cooking", "recipe": 5, "take": 5, "go": 9},
}


def full_context_wins(params: dict[str, Any], games: int, seed: int) -> dict[str, Any]:
    """Games won by the family's reasoner with every turn in its context (no memory model is called)."""
    tasks = load_tasks(TaskSetConfig(family="ms_textworld", params=params, count=games, seed=seed), "tw")
    engines = EngineSet(reasoner=ScriptedEngine(TwReasoner(), name="reasoner"), memory=ScriptedEngine(TwReasoner()))
    memory = {"name": "long_context", "window_tokens": 1_000_000}
    traces = run_rollouts([task_rollout(t, memory, rollout_id="full") for t in tasks], engines)
    return {
        "won": sum(bool(t.stats.get("env_won")) for t in traces),
        "games": games,
        "steps": [t.reasoner_usage.calls for t in traces],
    }


def distilled(params: dict[str, Any], games: int, seed: int, work: Path) -> dict[str, Any]:
    """``memrl data distill`` of the family's expert inside SAM: episodes kept and rows per role."""
    config = work / "distill.yaml"
    config.write_text(
        json.dumps(
            {
                "command": "data distill",
                "run": {"output_dir": str(work), "name": "distill", "seed": 0},
                "tasks": {"family": "ms_textworld", "params": params, "count": games, "seed": seed},
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "memrl.launch.cli", "data", "distill", "--config", str(config)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    if done.returncode != 0:
        raise SystemExit(f"distill failed:\n{done.stderr[-3000:]}")
    stats = json.loads((work / "distill" / "sft" / "stats.json").read_text())
    return {"stats": stats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", type=int, default=10)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--cache-dir", default=".cache/textworld", help="generated games are kept (and reused) here")
    parser.add_argument("--work", default=None, help="distillation folder (default: a temporary one)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    seed = MS_TEXTWORLD_SPLITS["test"]
    out: dict[str, Any] = {"games": args.games, "seed": seed, "settings": {}}
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.settings.split(","):
            params = {**SETTINGS[name], "cache_dir": str(Path(args.cache_dir).absolute())}
            t0 = time.perf_counter()
            result = {"params": SETTINGS[name], "full_context": full_context_wins(params, args.games, seed)}
            work = Path(args.work or scratch) / name
            work.mkdir(parents=True, exist_ok=True)
            result["distill"] = distilled(params, args.games, seed, work)
            result["wall_s"] = round(time.perf_counter() - t0, 1)
            out["settings"][name] = result
    line = json.dumps(out)
    if args.out:
        Path(args.out).write_text(line + "\n")
    print(line, flush=True)


if __name__ == "__main__":
    main()
