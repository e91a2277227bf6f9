"""SIGKILL at random moments of a 4-iteration (``--iterations``) OAT-GRPO run, each followed by ``--resume``: does
every trial end with the uninterrupted run's weights and a ``metrics.jsonl`` holding each step once, and does the kill
leave no process of the run behind?

The run is the tiny CPU recipe (configs/oat_grpo_tiny.yaml shrunk by :func:`overrides`, which the OAT-GRPO tests
run too; a checkpoint after every iteration), by default on a Ray fleet of 2 rollout workers with one-step-off
rollouts (``--fleet-workers 2 --max-staleness 1``; ``--fleet-workers 0`` runs the rollouts in the driver). One
uninterrupted run gives the reference weights and its timing. Trial 0 kills during the first checkpoint write (the
moment its temporary folder appears); the others at a moment drawn uniformly from the reference run's active span
(from its run directory appearing, after imports and checks, to its end), or, for the share ``--in-write`` of them,
0-50 ms after the temporary folder of a random iteration's checkpoint appears (a kill counts as in a write only if a
temporary folder was there when it was sent). Only the driver is killed (kill -9); the
processes of its tree at that moment (Ray head, agents, rollout workers) must all be gone 10 s later. Each killed
run is resumed to completion (a kill that lands after the run finished, or after it wrote its summary, is re-drawn).
Prints one line per trial, then ``resumes_equal: N/M``, the same count for the kills that landed in a checkpoint
write, and one JSON line with what the kills hit.

    .venv/bin/python -m benchmarks.resume_faults --trials 20 --work /tmp/resume-faults
    .venv/bin/python -m benchmarks.resume_faults --trials 20 --in-write 0.5   # half the kills aimed at writes
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import bench_parser, emit, pin_threads

ROOT = Path(__file__).resolve().parents[1]
ITERATIONS = 4  # of every run (main() sets --iterations here)


FLEET: list[str] = []  # the fleet overrides of this invocation (main() sets them; the tests run without a fleet)


def overrides(model: Path, out: Path, name: str, *, iterations: int | None = None, eval_every: int = 2) -> list[str]:
    """The tiny recipe at seconds per iteration (the random-init tiny model; its cues are noise, so the scripted
    reasoner finds no page worth recalling: the trees also branch at cue writing, sampled). The OAT-GRPO tests run
    the same recipe."""
    return [
        f"policy.base={model}",
        f"engine.model={model}",
        f"run.output_dir={out}",
        f"run.name={name}",
        "train_tasks.count=16",
        "train_tasks.sam.horizon_steps=6",
        "eval_tasks.count=2",
        "eval_tasks.sam.horizon_steps=6",
        "tasks_per_iteration=4",
        "tree.branch_factor=2",
        "tree.max_leaves=4",
        "tree.branch_roles=[consolidate, recall]",
        "memory.sampling.consolidate.temperature=1.0",
        "memory.sampling.consolidate.max_tokens=16",
        "memory.sampling.recall.max_tokens=24",
        f"loop.iterations={iterations or ITERATIONS}",
        f"loop.eval_every={eval_every}",
        "loop.checkpoint_every=1",
        "loop.keep_checkpoints=2",
        *FLEET,
    ]


def command(model: Path, out: Path, name: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "memrl.launch.cli",
        "train",
        "oat-grpo",
        "--config",
        str(ROOT / "configs" / "oat_grpo_tiny.yaml"),
        *overrides(model, out, name),
        *extra,
    ]


def env() -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def run(cmd: list[str], run_dir: Path | None = None) -> tuple[float, float]:
    """Run to completion; returns (seconds until ``run_dir/config.yaml`` appeared, i.e. the run started after
    imports and checks, or 0; total seconds)."""
    start = time.perf_counter()
    started = 0.0
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while run_dir is not None and proc.poll() is None and not started:
        if (run_dir / "config.yaml").exists():
            started = time.perf_counter() - start
        time.sleep(0.01)
    out, err = proc.communicate(timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"run failed ({proc.returncode}):\n{out[-2000:]}\n{err[-3000:]}")
    return started, time.perf_counter() - start


def weights(run_dir: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    final = sorted((run_dir / "policy").glob("v*"))[-1]
    out: dict[str, object] = {}
    for file in sorted(final.glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


def same_weights(a: dict[str, object], b: dict[str, object]) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # type: ignore[arg-type]


def steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _alive(procs: list[Any]) -> list[Any]:
    import psutil

    out = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            continue
    return out


def kill_at(
    cmd: list[str], run_dir: Path, moment: float | None, *, in_write_of: int = 0, write_delay: float = 0.0
) -> dict[str, object]:
    """Start the run and SIGKILL its driver ``moment`` s after start (None: ``write_delay`` s after the temporary
    folder of checkpoint ``in_write_of`` appears); returns what the kill hit and how many processes of its tree
    outlived it by 10 s, or {"finished": True} when the run ended (or wrote its summary) first."""
    import psutil

    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    start = time.perf_counter()
    tmp = run_dir / "checkpoints" / f".tmp-ckpt-{in_write_of:06d}"
    write_seen: float | None = None
    tree: list[Any] = []
    try:
        while proc.poll() is None:
            elapsed = time.perf_counter() - start
            if moment is None and write_seen is None and tmp.exists():
                write_seen = elapsed
            if (write_seen is not None and elapsed >= write_seen + write_delay) or (
                moment is not None and elapsed >= moment
            ):
                with contextlib.suppress(psutil.Error):
                    tree = psutil.Process(proc.pid).children(recursive=True)
                writing = (
                    sorted(p.name for p in (run_dir / "checkpoints").glob(".tmp-ckpt-*"))
                    if (run_dir / "checkpoints").is_dir()
                    else []
                )
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=60)
                if (run_dir / "summary.json").exists():
                    break  # killed after the run finished its work: nothing to resume
                complete = (
                    sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt-*") if (p / "COMPLETE").exists())
                    if (run_dir / "checkpoints").is_dir()
                    else []
                )
                deadline = time.monotonic() + 10
                while _alive(tree) and time.monotonic() < deadline:
                    time.sleep(0.2)
                return {
                    "killed_at_s": round(elapsed, 2),
                    "checkpoint_being_written": writing,
                    "complete_checkpoints": complete,
                    "orphans_after_10s": len(_alive(tree)),
                    "finished": False,
                }
            time.sleep(0.002)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for leftover in _alive(tree):  # counted above; never left running
            with contextlib.suppress(psutil.Error):
                leftover.kill()
    return {"finished": True}


def main() -> None:
    global ITERATIONS
    parser = bench_parser(__doc__)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--work", default="/tmp/memrl-resume-faults")
    parser.add_argument("--fleet-workers", type=int, default=2, help="Ray rollout workers (0: rollouts in the driver)")
    parser.add_argument("--max-staleness", type=int, default=1, help="loop.max_staleness (one-step-off: 1)")
    parser.add_argument(
        "--in-write",
        type=float,
        default=0.0,
        help="share of the trials after the first aimed at a checkpoint write (of a random "
        "iteration, a random 0-50 ms after its temporary folder appears) instead of a uniform "
        "moment; whether a kill did land in a write is recorded, not assumed",
    )
    parser.add_argument("--iterations", type=int, default=ITERATIONS, help="OAT-GRPO iterations of every run")
    args = parser.parse_args()
    pin_threads(args.threads)
    if args.iterations < 1:
        parser.error(f"--iterations must be at least 1, got {args.iterations}")
    ITERATIONS = args.iterations
    FLEET[:] = [f"fleet.workers={args.fleet_workers}", f"loop.max_staleness={args.max_staleness}"]
    if args.fleet_workers:
        # engine.batch_size=1: the hf engine samples each row alone. In shared batches the left padding changes the
        # logits in the last bits, and the load-aware split over the workers (by measured speed) changes who shares a
        # batch, so the rollout log-probs (the truncated importance weights of max_staleness >= 1) would differ
        # between an uninterrupted run and a resumed one for reasons that have nothing to do with the resume.
        FLEET.extend(["fleet.cpus_per_worker=0.5", "engine.batch_size=1"])

    from memrl.rollout.models import TinyModelSpec, ensure_tiny_model

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    model = ensure_tiny_model(os.environ.get("MEMRL_MODEL_CACHE", ROOT / ".cache" / "models"), TinyModelSpec())
    started, wall = run(command(model, work, "reference"), work / "reference")
    reference = weights(work / "reference")
    expected_steps = steps(work / "reference")
    rng = random.Random(args.seed)
    trials, equal = [], 0
    for trial in range(args.trials):
        name = f"trial-{trial:02d}"
        run_dir = work / name
        aimed = trial == 0 or rng.random() < args.in_write  # drawn once: a redraw below keeps the kind of kill
        while True:
            moment = None if aimed else rng.uniform(started, wall)
            hit = kill_at(
                command(model, work, name),
                run_dir,
                moment,
                in_write_of=rng.randrange(ITERATIONS) if trial else 0,
                write_delay=rng.uniform(0.0, 0.05) if trial else 0.0,
            )
            if not hit["finished"]:
                break
            shutil.rmtree(run_dir, ignore_errors=True)  # the run beat the kill: another moment, same kind
        run(command(model, work, name, "--resume"))
        got = steps(run_dir)
        ok = same_weights(weights(run_dir), reference) and got == expected_steps
        equal += ok
        trials.append({"trial": trial, "aimed_at_a_write": aimed, **hit, "steps": got, "equal": ok})
        emit(trials[-1])
        shutil.rmtree(run_dir, ignore_errors=True)
    in_write = [t for t in trials if t["checkpoint_being_written"]]
    print(f"resumes_equal: {equal}/{args.trials}", flush=True)
    print(
        f"resumes_equal_after_kills_in_checkpoint_writes: {sum(t['equal'] for t in in_write)}/{len(in_write)}",
        flush=True,
    )
    emit(
        {
            "benchmark": "resume_faults",
            "iterations": ITERATIONS,
            "fleet_workers": args.fleet_workers,
            "max_staleness": args.max_staleness,
            "in_write": args.in_write,
            "uninterrupted_wall_s": round(wall, 1),
            "kills_aimed_at_a_write": sum(t["aimed_at_a_write"] for t in trials),
            "run_started_at_s": round(started, 1),
            "expected_steps": expected_steps,
            "resumes_equal": f"{equal}/{args.trials}",
            "kills_during_checkpoint_write": len(in_write),
            "resumes_equal_after_checkpoint_write_kills": f"{sum(t['equal'] for t in in_write)}/{len(in_write)}",
            "kills_before_first_checkpoint": sum(not t["complete_checkpoints"] for t in trials),
            "trials_with_orphans_after_10s": sum(bool(t["orphans_after_10s"]) for t in trials),
        },
        args.json_out,
    )


if __name__ == "__main__":
    main()
