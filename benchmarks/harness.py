"""What every benchmark shares: the command line's common flags, pinned CPU numerics, timing and peak memory, the JSON
last line, two-level statistics over training seeds and test tasks, and the stage cache (weights digests, resumable
progress files and the claim files several worker processes share work through).

A benchmark is a module of this package, run from the repository root as ``python -m benchmarks.<name> [flags]``;
its last line on stdout is one JSON object (:func:`emit`), which the smoke tests (``tests/test_bench_*.py``) read at
the benchmark's smallest setting.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "CPU_PROFILE",
    "FIGURES",
    "ROOT",
    "Claims",
    "PhaseClock",
    "Progress",
    "bench_parser",
    "check_bench_inputs",
    "cpu_profile",
    "cpu_seconds",
    "die_with_parent",
    "emit",
    "mean_ci",
    "own_command",
    "peak_rss_mb",
    "pin_cpu_numerics",
    "pin_threads",
    "seed_task_interval",
    "start_workers",
    "stop_workers",
    "tiny_oat_overrides",
    "wait_for",
    "weights_digest",
]

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures"  # the committed figures

# ------------------------------------------------------------------------------------------------------------------
# The command line and the tiny recipe


def bench_parser(doc: str | None, *, seed: bool = True) -> argparse.ArgumentParser:
    """An argument parser whose description is the benchmark's docstring, with the flags every benchmark takes:
    ``--threads`` (torch CPU threads while it computes; see :func:`pin_threads`), ``--json-out`` (also write the last
    line's record to a file) and, unless ``seed`` is False, ``--seed``."""
    parser = argparse.ArgumentParser(
        description=(doc or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads while the benchmark computes (default: the benchmark's own choice)",
    )
    parser.add_argument("--json-out", default=None, help="also write the JSON record of the last line to this file")
    if seed:
        parser.add_argument("--seed", type=int, default=0, help="the seed of the benchmark's tasks and runs")
    return parser


def tiny_oat_overrides(
    model: Path, out: Path, name: str, *, train_tasks: int = 8, config_sampling: bool = False
) -> list[str]:
    """Overrides of ``configs/oat_grpo_tiny.yaml`` for about a second per iteration: ``model`` as the policy and
    its engine, the run ``out/name``, short SAM tasks, two an iteration, trees of 4 leaves branching at cue writing
    (sampled) and recall, 12-token memory answers (``config_sampling``: the config's own branch roles and sampling)."""
    overrides = [
        f"policy.base={model}",
        f"engine.model={model}",
        f"run.output_dir={out}",
        f"run.name={name}",
        f"train_tasks.count={train_tasks}",
        "train_tasks.sam.horizon_steps=6",
        "eval_tasks.count=2",
        "eval_tasks.sam.horizon_steps=6",
        "tasks_per_iteration=2",
        "tree.branch_factor=2",
        "tree.max_leaves=4",
    ]
    if config_sampling:
        return overrides
    return [
        *overrides,
        "tree.branch_roles=[consolidate, recall]",
        "memory.sampling.consolidate.temperature=1.0",
        "memory.sampling.consolidate.max_tokens=12",
        "memory.sampling.recall.max_tokens=12",
    ]


def emit(record: dict[str, Any], json_out: str | os.PathLike[str] | None = None) -> None:
    """Print ``record`` as one JSON line (the benchmark's last line), and write it to ``json_out`` when given."""
    line = json.dumps(record)
    print(line, flush=True)
    if json_out:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(line + "\n", encoding="utf-8")


def check_bench_inputs(work: Path, progress_files: list[Path]) -> None:
    """Before anything is built: ``--work`` must be a folder that can be written, and the progress files it holds
    must be JSONL objects; otherwise one line naming the path and exit 2 (not a traceback after the SFT start)."""
    from memrl.data.checks import check_output_dir
    from memrl.data.errors import UserError
    from memrl.data.io import check_jsonl_file

    try:
        check_output_dir(str(work), "--work")
        for path in progress_files:
            check_jsonl_file(path, "--work")
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


# ------------------------------------------------------------------------------------------------------------------
# Pinned numerics

# Measured on this project's machines (docs/results): a model's weights after training do not depend on the thread
# count but do depend on the host CPU's instruction set (the same start built with AVX-512 kernels and with AVX2
# kernels: two digests), and the machines differ. So the benchmarks that report learned figures compute under one
# profile: one thread, and AVX2 kernels in ATen, MKL (with its conditional numerical reproducibility) and oneDNN,
# which every x86-64 machine of the last decade runs. The variables act only when the libraries load, so the process
# re-executes itself under them (pin_cpu_numerics).
CPU_PROFILE = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "MKL_CBWR": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}


def own_command() -> list[str]:
    """The command line that started this process: ``python -m package.module args...`` for a module run with
    ``-m``, else ``python script args...``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    head = ["-m", spec.name] if spec is not None and spec.name != "__main__" else [sys.argv[0]]
    return [sys.executable, *head, *sys.argv[1:]]


def pin_cpu_numerics(native: bool = False) -> str:
    """Make this process compute under :data:`CPU_PROFILE`: replace it (``execve``, same command line) by one started
    with those variables unless they are set already, or, with ``native``, leave the machine's own kernels and thread
    count (faster on a large machine; figures then depend on the machine). Returns the profile's name."""
    if native:
        return "native"
    if any(os.environ.get(k) != v for k, v in CPU_PROFILE.items()):
        sys.stdout.flush()
        sys.stderr.flush()
        command = own_command()
        os.execve(command[0], command, {**os.environ, **CPU_PROFILE})
    return "avx2-1thread"


def cpu_profile() -> str:
    """The CPU profile this process computes under: ``avx2-1thread`` (:data:`CPU_PROFILE`) or ``native``."""
    return "avx2-1thread" if all(os.environ.get(k) == v for k, v in CPU_PROFILE.items()) else "native"


def pin_threads(threads: int | None) -> None:
    """Set torch's CPU threads for the whole process (None: leave them): what a benchmark times or trains then does
    not depend on the machine's core count."""
    if threads is not None:
        from memrl.rollout.engines.base import set_torch_threads

        set_torch_threads(threads)


# ------------------------------------------------------------------------------------------------------------------
# Timing and peak memory


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children (every core counted)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, MiB (Linux reports ``ru_maxrss`` in KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


class PhaseClock:
    """Wall and CPU seconds (this process's threads plus waited-for children) and the 1-minute load average per
    benchmark phase: where a run's time goes, and how busy the machine was meanwhile."""

    def __init__(self) -> None:
        self.phases: dict[str, dict[str, Any]] = {}

    @staticmethod
    def _cpu() -> float:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + children.ru_utime + children.ru_stime

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        wall, cpu, load = time.perf_counter(), self._cpu(), os.getloadavg()[0]
        try:
            yield
        finally:
            p = self.phases.setdefault(phase, {"wall_s": 0.0, "cpu_s": 0.0, "count": 0, "load": []})
            p["wall_s"] += time.perf_counter() - wall
            p["cpu_s"] += self._cpu() - cpu
            p["count"] += 1
            p["load"] += [load, os.getloadavg()[0]]

    def summary(self) -> dict[str, dict[str, float]]:
        """Per phase: wall and CPU seconds, how many times it ran, the mean load average sampled at its edges."""
        return {
            name: {
                "wall_s": round(p["wall_s"], 1),
                "cpu_s": round(p["cpu_s"], 1),
                "count": p["count"],
                "load_avg": round(statistics.fmean(p["load"]), 2),
            }
            for name, p in self.phases.items()
        }


# ------------------------------------------------------------------------------------------------------------------
# Statistics (the intervals themselves live in memrl.rollout.evaluation.stats)


def mean_ci(values: list[float]) -> dict[str, Any]:
    """Mean and 95% t-interval over ``values`` (one per seed); a single value has no interval."""
    from memrl.rollout.evaluation.stats import t_interval

    interval = t_interval(values)
    return {
        "mean": round(statistics.fmean(values), 4),
        "ci95": interval and [round(x, 4) for x in interval],
        "n": len(values),
    }


def seed_task_interval(by_seed: dict[int, dict[str, float]]) -> dict[str, Any]:
    """The mean of per-(seed, task) values on the tasks every seed has, with its 95% two-level interval over training
    seeds and test tasks (:func:`~memrl.rollout.evaluation.stats.two_level_interval`: the wider of the bootstrap
    resampling both and the seed-level t): ``mean``, ``ci95``, ``half_width``, ``ci95_two_level_bootstrap``,
    ``ci95_seed_t``, ``ci95_tasks_only`` (seeds averaged first, tasks as the only unit), ``per_seed``, ``seeds``,
    ``tasks`` (how many) and ``interval`` (which rule gave ``ci95``). Empty without seeds."""
    from memrl.rollout.evaluation.stats import two_level_interval

    seeds = sorted(by_seed)
    if not seeds:
        return {}
    tasks = sorted(set.intersection(*(set(by_seed[s]) for s in seeds)))
    iv = two_level_interval([[by_seed[s][t] for t in tasks] for s in seeds])
    return {
        "mean": iv["mean"],
        "ci95": iv["interval"],
        "half_width": iv["half_width"],
        "ci95_two_level_bootstrap": iv["two_level_bootstrap"],
        "ci95_seed_t": iv["seed_level_t"],
        "ci95_tasks_only": iv["task_level"],
        "per_seed": iv["per_seed_mean"],
        "seeds": seeds,
        "tasks": len(tasks),
        "interval": iv["rule"],
    }


# ------------------------------------------------------------------------------------------------------------------
# The stage cache and work shared between processes


def weights_digest(model_dir: Path) -> str:
    """SHA-256 over a saved model's tensors (names and bytes, whatever file metadata says): equal for equal
    weights, so an evaluation of the same weights under the same seed is computed once."""
    import torch
    from safetensors import safe_open

    digest = hashlib.sha256()
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for name in sorted(f.keys()):
                digest.update(name.encode())
                digest.update(f.get_tensor(name).contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class Progress:
    """progress.jsonl: one line per finished (variant, seed) with its run key; a rerun of the same command skips
    the finished ones (an unfinished one's folder is removed and it runs again from its start). Several processes
    may share one file (``--jobs``): each line is one ``write`` to a file opened for appending, and :meth:`get`
    reads lines the others have added since."""

    def __init__(self, path: Path, key: str) -> None:
        self.path, self.key = path, key
        self.done: dict[tuple[str, int], dict[str, Any]] = {}
        self._read = 0  # bytes of the file already parsed
        self.refresh()

    def refresh(self) -> None:
        """Parse the lines appended since the last read (complete lines only)."""
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self._read)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._read += len(complete)
        for line in complete.decode().splitlines():
            row = json.loads(line) if line.strip() else {}
            if row.get("key") == self.key:
                self.done[(row["variant"], row["seed"])] = {k: v for k, v in row.items() if k not in ("key", "variant")}

    def get(self, variant: str, seed: int) -> dict[str, Any] | None:
        """The finished row of (variant, seed) under this key, or None."""
        self.refresh()
        return self.done.get((variant, seed))

    def add(self, variant: str, seed: int, row: dict[str, Any]) -> None:
        """Record (variant, seed) as finished with ``row``."""
        line = json.dumps({"key": self.key, "variant": variant, "seed": seed, **row}) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one append: other processes' lines never interleave with it
        finally:
            os.close(fd)
        self.refresh()


class Claims:
    """Which process is computing what: a file per claim under ``folder`` (``<name>.pid``; a name may hold ``/``),
    created exclusively, holding the claimant's PID. A claim whose process has died is taken over, so a killed
    worker's work is computed again."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def _file(self, name: str) -> Path:
        return self.folder / f"{name}.pid"

    def holder(self, name: str) -> int | None:
        """The PID written in the claim of ``name``; None when nobody holds it."""
        try:
            return int(self._file(name).read_text())
        except FileNotFoundError:
            return None

    def take(self, name: str) -> bool:
        """True when this process now holds the claim (newly, or it already did); False when a live process does."""
        path, me = self._file(name), os.getpid()
        path.parent.mkdir(parents=True, exist_ok=True)
        mine = path.with_name(f"{path.name}.{me}.tmp")
        mine.write_text(str(me))
        try:
            while True:
                try:
                    os.link(mine, path)  # created whole, PID inside, or not at all
                    return True
                except FileExistsError:
                    holder = self.holder(name)
                    if holder == me:
                        return True
                    if holder is not None and _alive(holder):
                        return False
                    if holder is not None:  # None: released since our link; claim it again
                        self._drop_stale(path, holder)
        finally:
            mine.unlink(missing_ok=True)

    @staticmethod
    def _drop_stale(path: Path, holder: int) -> None:
        """Remove a dead holder's claim, unless another process has replaced it meanwhile."""
        aside = path.with_name(f"{path.name}.{os.getpid()}.stale")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return
        if int(aside.read_text()) != holder:  # a live process's fresh claim: put it back
            with contextlib.suppress(FileExistsError):
                os.link(aside, path)
        aside.unlink()

    def release(self, name: str) -> None:
        """Give up the claim of ``name`` if this process holds it."""
        if self.holder(name) == os.getpid():
            self._file(name).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_workers(jobs: int, extra: Sequence[str] = ()) -> list[subprocess.Popen]:
    """``jobs - 1`` copies of this command (and ``extra`` arguments) as ``--worker`` processes on the same work
    folder; each dies with its parent (:func:`die_with_parent`), so killing the benchmark leaves no worker behind."""
    command, argv, skip = own_command(), [], False
    head = command[: len(command) - len(sys.argv) + 1]
    for a in sys.argv[1:]:
        if skip:
            skip = False
        elif a == "--jobs":
            skip = True
        elif not a.startswith("--jobs="):
            argv.append(a)
    return [subprocess.Popen([*head, *argv, *extra, "--worker", f"--worker-index={i}"]) for i in range(1, jobs)]


def die_with_parent() -> None:
    """Ask Linux to send this process SIGTERM when its parent exits (prctl PR_SET_PDEATHSIG)."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent was already gone
        sys.exit(1)


def stop_workers(workers: list[Any]) -> None:
    """Terminate the workers still running (the benchmark failed or was interrupted) and reap every one."""
    for w in workers:
        if w.poll() is None:
            w.terminate()
        w.wait()


def wait_for(workers: list[Any], name: str) -> None:
    """Every run is finished when this is called: let the workers exit, and fail loudly if one crashed."""
    for w in workers:
        if w.wait() != 0:
            raise SystemExit(
                f"[{name}] worker {w.pid} exited with {w.returncode}; its runs were finished by another process, but "
                "check its output above"
            )
