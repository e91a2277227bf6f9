"""Soak: memory and open files over many short OAT-GRPO iterations on the rollout fleet (issue 41 item 5).

The real loop (:func:`memrl.train.oat_grpo.train_oat_grpo`) runs the tiny recipe (configs/oat_grpo_tiny.yaml) on the
random-init tiny model, shrunk to about a second per iteration: 2 SAM tasks per iteration as trees on ``--workers``
Ray rollout workers (transformers engines), a full-weight update, the disk weight sync into every worker and its
sync check, a checkpoint every ``--checkpoint-every`` iterations; no held-out evaluation. After every iteration
(the logger's call) it records the resident set size (RSS) of the driver and of each rollout worker (the Ray actor
processes ``ray::RolloutWorker``), their peak since the previous iteration (sampled every 0.2 s) and their open
file descriptors. Per-iteration rows go to ``<work>/soak.jsonl`` as they come.

Prints one JSON object last: for the driver and each worker the RSS at the first measured iteration and at the end,
the peak, and the growth per 100 iterations (least-squares slope of the end-of-iteration RSS over the iterations
after ``--warmup``; the first iterations fill allocator pools, caches and the tokenizer's memo), the open files
likewise, and ``bounded``: every slope at most ``--bound-mb`` per 100 iterations and no open-file growth.

    .venv/bin/python -m benchmarks.soak [--iterations 300 --workers 2 --work /tmp/soak]
    .venv/bin/python -m benchmarks.soak --iterations 4 --warmup 1 --workers 1     # the test's smallest setting
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import bench_parser, emit, pin_threads, tiny_oat_overrides

ROOT = Path(__file__).resolve().parents[1]


def overrides(model: Path, out: Path, iterations: int, workers: int, checkpoint_every: int) -> list[str]:
    """The tiny OAT-GRPO recipe at about a second per iteration on a fleet of ``workers`` Ray workers."""
    return [
        *tiny_oat_overrides(model, out, "soak", train_tasks=64),
        f"loop.iterations={iterations}",
        f"loop.eval_every={iterations * 10}",  # no held-out evaluation
        f"loop.checkpoint_every={checkpoint_every}",
        "loop.keep_checkpoints=2",
        "trainer.lr=1e-4",
        f"fleet.workers={workers}",
        "fleet.cpus_per_worker=0.5",
    ]


def worker_processes(root: Any) -> list[Any]:
    """The rollout workers among ``root``'s descendants (Ray names the actor processes ``ray::RolloutWorker``)."""
    import psutil

    found = []
    for proc in root.children(recursive=True):
        try:
            if "RolloutWorker" in " ".join(proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return sorted(found, key=lambda p: p.pid)


class Sampler:
    """Peak RSS of the driver and the workers between two iteration ends, sampled every ``period_s``."""

    def __init__(self, period_s: float = 0.2) -> None:
        import psutil

        self.me = psutil.Process()
        self.workers: list[Any] = []
        self.peaks: dict[int, int] = {}
        self.period_s = period_s
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(self.period_s):
            with self.lock:
                for proc in [self.me, *self.workers]:
                    try:
                        rss = proc.memory_info().rss
                    except Exception:  # a worker that just died
                        continue
                    self.peaks[proc.pid] = max(self.peaks.get(proc.pid, 0), rss)

    def take(self) -> dict[str, Any]:
        """This iteration's end figures and peaks (then the peaks start again)."""
        with self.lock:
            if not self.workers:
                self.workers = worker_processes(self.me)
            row: dict[str, Any] = {}
            for name, proc in [("driver", self.me), *((f"worker{i}", w) for i, w in enumerate(self.workers))]:
                try:
                    rss, files = proc.memory_info().rss, proc.num_fds()
                except Exception:
                    continue
                row[name] = {
                    "rss_mb": rss / 2**20,
                    "peak_mb": max(self.peaks.get(proc.pid, 0), rss) / 2**20,
                    "open_files": files,
                    "pid": proc.pid,
                }
            self.peaks = {}
            return row

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def slope_per_100(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ``ys`` over ``xs``, times 100 (0 with fewer than two points)."""
    if len(xs) < 2:
        return 0.0
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return 100.0 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def summarize(rows: list[dict[str, Any]], warmup: int, bound_mb: float) -> dict[str, Any]:
    """Per process: RSS first / final / peak, growth per 100 iterations after ``warmup``, open files likewise."""
    measured = [r for r in rows if r["iteration"] >= warmup] or rows
    names = sorted({k for r in rows for k in r["processes"]}, key=lambda n: (n != "driver", n))
    out: dict[str, Any] = {}
    for name in names:
        seen = [(r["iteration"], r["processes"][name]) for r in measured if name in r["processes"]]
        if not seen:
            continue
        its = [float(i) for i, _ in seen]
        out[name] = {
            "rss_first_mb": round(seen[0][1]["rss_mb"], 1),
            "rss_final_mb": round(seen[-1][1]["rss_mb"], 1),
            "rss_peak_mb": round(max(p["peak_mb"] for r in rows for k, p in r["processes"].items() if k == name), 1),
            "rss_growth_mb_per_100": round(slope_per_100(its, [p["rss_mb"] for _, p in seen]), 2),
            "open_files_first": seen[0][1]["open_files"],
            "open_files_final": seen[-1][1]["open_files"],
            "open_files_growth_per_100": round(slope_per_100(its, [float(p["open_files"]) for _, p in seen]), 2),
        }
    bounded = all(
        v["rss_growth_mb_per_100"] <= bound_mb and v["open_files_final"] <= v["open_files_first"] for v in out.values()
    )
    return {"processes": out, "bounded": bounded}


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, seed=False)
    parser.add_argument("--iterations", type=int, default=300, help="OAT-GRPO iterations")
    parser.add_argument("--workers", type=int, default=2, help="Ray rollout workers")
    parser.add_argument("--warmup", type=int, default=20, help="iterations left out of the growth slopes")
    parser.add_argument("--checkpoint-every", type=int, default=25, help="checkpoint interval (iterations)")
    parser.add_argument(
        "--bound-mb", type=float, default=20.0, help="largest RSS growth per 100 iterations that counts as bounded"
    )
    parser.add_argument("--work", type=Path, default=None, help="work folder (default: a temporary one)")
    parser.add_argument("--model", type=Path, default=None, help="tiny model folder (default: built and cached)")
    args = parser.parse_args(argv)
    pin_threads(args.threads)
    if args.iterations < 1 or args.workers < 1 or args.warmup < 0:
        parser.error("--iterations and --workers must be >= 1, --warmup >= 0")
    if args.work is not None and args.work.exists() and not args.work.is_dir():
        parser.error(f"--work {args.work} is a file, not a folder")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from memrl.data.config import load_config
    from memrl.data.tracking import MetricsLogger
    from memrl.rollout.models import TinyModelSpec, ensure_tiny_model
    from memrl.train.oat_grpo import OATGRPOConfig, train_oat_grpo

    torch.set_num_threads(1)
    work = args.work or Path(tempfile.mkdtemp(prefix="memrl-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    model = args.model or ensure_tiny_model(ROOT / ".cache" / "models", TinyModelSpec())
    out = work / "runs"
    cfg = load_config(
        OATGRPOConfig,
        ROOT / "configs" / "oat_grpo_tiny.yaml",
        overrides(model, out, args.iterations, args.workers, args.checkpoint_every),
    )
    run_dir = out / "soak"
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    progress = work / "soak.jsonl"
    progress.write_text("")
    rows: list[dict[str, Any]] = []
    sampler = Sampler()
    started = time.perf_counter()

    class SoakLogger(MetricsLogger):
        """The run's metrics logger, which also measures the processes at the end of every iteration."""

        def log(self, step: int, metrics: dict[str, Any]) -> None:
            super().log(step, metrics)
            if step < 0:
                return
            row = {
                "iteration": step,
                "wall_s": round(time.perf_counter() - started, 2),
                "processes": sampler.take(),
                "sync_s": metrics.get("sync_s"),
                "sync_check_s": metrics.get("sync_check_s"),
                "iteration_s": metrics.get("iteration_s"),
            }
            rows.append(row)
            with open(progress, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")
            if step % 25 == 0 or step == args.iterations - 1:
                driver = row["processes"].get("driver", {})
                print(
                    f"[soak] iteration {step}: driver {driver.get('rss_mb', 0):.0f} MB, "
                    f"{len(row['processes']) - 1} workers, {row['wall_s']:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )

    logger = SoakLogger(run_dir, None, {}, name="soak", console=False)
    try:
        train_oat_grpo(cfg, run_dir, logger=logger)
    finally:
        sampler.close()
        logger.close()
    summary = {
        "benchmark": "soak",
        "iterations": len(rows),
        "workers": args.workers,
        "warmup": args.warmup,
        "wall_s": round(time.perf_counter() - started, 1),
        "iteration_s_mean": round(sum(r["iteration_s"] or 0 for r in rows) / max(len(rows), 1), 3),
        "sync_s_mean": round(sum(r["sync_s"] or 0 for r in rows) / max(len(rows), 1), 4),
        "sync_check_s_mean": round(sum(r["sync_check_s"] or 0 for r in rows) / max(len(rows), 1), 4),
        "bound_mb_per_100": args.bound_mb,
        **summarize(rows, args.warmup, args.bound_mb),
        "progress": str(progress),
    }
    emit(summary, args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
