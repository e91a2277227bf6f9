"""Re-entry cost: what it takes a memory-call tree to put one sibling at a state of a Gym-style environment, by
replaying the logged actions from reset (checked by observation digests) or by snapshot/restore, as the horizon (the
steps already taken) grows. The environment is the built-in text world (data/envs/textworld.py) behind the Gym-style
protocol (reset(seed) / step(action) -> observation, reward, done, info / snapshot / restore), driven by its optimal
policy; a branch is one ``copy.deepcopy`` of the :class:`~memrl.data.envs.gym.GymTask` (what ``Rollout.fork`` does).

Per horizon and mode: seconds per branch (median over ``--repeats`` runs of ``--branches`` branches) and environment
steps per branch (the steps the re-entry itself ran). Every branch is checked: the next action gives the same
observation in the branch as in the original. Prints one JSON line.

    .venv/bin/python -m benchmarks.reentry [--quick] [--horizons 8,32,128,512,2048] [--branches 8] [--repeats 5]
"""

from __future__ import annotations

import copy
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import bench_parser, emit, pin_threads
from memrl.data.envs.gym import GymFactory, GymTask
from memrl.data.envs.textworld import TextWorldEnv, TextWorldParams

HORIZONS = [8, 32, 128, 512, 2048]
PARAMS = {"n_rooms": 8, "containers_per_room": 2, "items_per_container": 2, "chain_length": 2}


class BuiltinTextWorld:
    """The built-in text world behind the Gym-style protocol (its optimal policy gives the actions to take)."""

    def __init__(self, **params: Any) -> None:
        self.params = TextWorldParams.model_validate(params)
        self.world: TextWorldEnv | None = None

    def reset(self, seed: int) -> str:
        self.world = TextWorldEnv(self.params, seed)
        return self.world.reset()

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        assert self.world is not None
        done_before = self.world.s.goals_done
        observation = self.world.step(action)
        return observation, float(self.world.s.goals_done > done_before), False, {}

    def snapshot(self) -> Any:
        assert self.world is not None
        return self.world.snapshot()

    def restore(self, state: Any) -> None:
        assert self.world is not None
        self.world.restore(state)


def walk(mode: str, horizon: int, seed: int) -> GymTask:
    """A task of the built-in text world after ``horizon`` optimal steps, re-entering by ``mode``."""
    task = GymTask(GymFactory(BuiltinTextWorld, PARAMS), seed=seed, task_id=f"tw-{seed}", reentry=mode)  # type: ignore[arg-type]
    task.reset()
    for _ in range(horizon):
        task.step(task.env.world.optimal_action())
    return task


def measure(mode: str, horizon: int, branches: int, repeats: int) -> dict[str, float]:
    """Seconds and environment steps per branch at one horizon."""
    seconds, steps = [], []
    for repeat in range(repeats):
        task = walk(mode, horizon, seed=repeat)
        action = task.env.world.optimal_action()
        start = time.perf_counter()
        twins = [copy.deepcopy(task) for _ in range(branches)]
        seconds.append((time.perf_counter() - start) / branches)
        steps.append(sum(t.env_steps - task.env_steps for t in twins) / branches)
        expected = copy.deepcopy(task).step(action)
        for twin in twins:
            if twin.step(action) != expected:
                raise RuntimeError(f"{mode} re-entry at horizon {horizon} diverged from the original")
    return {"seconds_per_branch": statistics.median(seconds), "env_steps_per_branch": statistics.mean(steps)}


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).parent,
            text=True,
            capture_output=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = bench_parser(__doc__, seed=False)
    parser.add_argument("--quick", action="store_true", help="the smallest setting: horizons 4 and 16, 2 branches")
    parser.add_argument("--horizons", default=",".join(map(str, HORIZONS)))
    parser.add_argument("--branches", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    pin_threads(args.threads)
    horizons = [4, 16] if args.quick else [int(h) for h in args.horizons.split(",")]
    branches, repeats = (2, 1) if args.quick else (args.branches, args.repeats)
    out: dict[str, Any] = {
        "benchmark": "reentry",
        "env": "data/envs/textworld.py (built-in text world)",
        "params": PARAMS,
        "horizons": horizons,
        "branches": branches,
        "repeats": repeats,
    }
    for mode in ("replay", "snapshot"):
        rows = [measure(mode, h, branches, repeats) for h in horizons]
        out[mode] = {k: [round(r[k], 6) for r in rows] for k in ("seconds_per_branch", "env_steps_per_branch")}
    out["replay_over_snapshot_seconds"] = [
        round(r / max(s, 1e-9), 2)
        for r, s in zip(out["replay"]["seconds_per_branch"], out["snapshot"]["seconds_per_branch"], strict=True)
    ]
    out.update(
        commit=commit(),
        machine=f"{platform.machine()} {platform.processor() or ''}".strip(),
        python=platform.python_version(),
        when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    emit(out, args.json_out)


if __name__ == "__main__":
    main()
