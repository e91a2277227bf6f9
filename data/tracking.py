"""Run metrics and memrl's log handlers.

Metrics: one line per step on the console, one JSON object per step in ``metrics.jsonl``, wandb when enabled. wandb
runs in the mode the config names (``offline`` needs no network); its API key, if any, comes from the environment
(``WANDB_API_KEY``) and is never written anywhere by memrl.

Logging: every memrl module logs through ``logging.getLogger(__name__)``. The CLI (launch/console.py) installs the two
handlers defined here: a :class:`ConsoleHandler` on the ``memrl`` logger (the console shows memrl's banners, results
and progress bars, see :func:`progress_bar`) and a :class:`RunLog` on the root logger, the run's ``run.log``, which
gets every record, third-party included, and (without ``--verbose``) everything written to file descriptors 1 and 2:
third-party prints and progress bars, engine start-up output of C++ code and child processes. The run log is a
temporary file until the run directory exists; :func:`bind_run_log` moves it into place.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

from memrl.data.config import WandbConfig
from memrl.data.io import append_jsonl, atomic_write_text

__all__ = ["ConsoleHandler", "MetricsLogger", "RunLog", "bind_run_log", "format_metrics", "progress_bar",
           "run_log_path"]

log = logging.getLogger(__name__)

_CONSOLE_KEYS = ("reward_mean", "success", "loss", "clip_fraction", "approx_kl", "entropy", "grad_norm",
                 "eval/success", "eval/success_greedy")


def format_metrics(step: int, metrics: dict[str, Any], keys: tuple[str, ...] = _CONSOLE_KEYS) -> str:
    """A compact console line with the most telling metrics first."""
    shown = [f"{k}={metrics[k]:.4g}" for k in keys if isinstance(metrics.get(k), (int, float))]
    return f"[step {step}] " + " ".join(shown)


class MetricsLogger:
    """Writes metrics to ``<run_dir>/metrics.jsonl`` (append, durable), the console, and wandb."""

    def __init__(
        self, run_dir: str | Path, wandb_cfg: WandbConfig | None = None, config: dict[str, Any] | None = None,
        *, name: str | None = None, console: bool = True, resume_from_step: int | None = None,
    ) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.console = console
        self._start = time.time()
        self._wandb = None
        if resume_from_step is not None and self.path.exists():
            self.truncate_after(resume_from_step)
        if wandb_cfg is not None and wandb_cfg.enabled and wandb_cfg.mode != "disabled":
            import wandb

            self._wandb = wandb.init(
                project=wandb_cfg.project, entity=wandb_cfg.entity, mode=wandb_cfg.mode, tags=list(wandb_cfg.tags),
                dir=str(Path(run_dir)), name=name, config=config or {}, reinit="finish_previous",
            )

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after ``step`` (work redone after a resume is logged again, not twice)."""
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line from a kill
            if record.get("step", -1) <= step:
                kept.append(line)
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Record one step's metrics."""
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        record = {"step": step, "time_s": round(time.time() - self._start, 3), **clean}
        append_jsonl(self.path, record)
        line = format_metrics(step, metrics)
        if self.console and line.rstrip() != f"[step {step}]":  # nothing worth a console line
            log.info(line)
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in clean.items() if isinstance(v, (int, float))}, step=step)

    def close(self) -> None:
        """Finish the wandb run."""
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


# ----------------------------------------------------------------------------------------------------------------
# log handlers


class ConsoleHandler(logging.Handler):
    """memrl's records on the console: information on ``out`` as written, warnings and errors on ``err`` after their
    level; ``err`` is also where memrl's progress bars draw (:func:`progress_bar`)."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        super().__init__(logging.INFO)
        self.out, self.err = out, err

    def emit(self, record: logging.LogRecord) -> None:
        """Write one record to the console."""
        try:
            text = self.format(record)
            if record.levelno >= logging.WARNING:
                text, stream = f"{record.levelname.lower()}: {text}", self.err
            else:
                stream = self.out
            stream.write(text + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


def _console_handler() -> ConsoleHandler | None:
    return next((h for h in logging.getLogger("memrl").handlers if isinstance(h, ConsoleHandler)), None)


ESTIMATE_AFTER_S = 2.0
"""How long a bar with ``work`` measures its rate before it logs how long the whole job would take."""
LONG_JOB_S = 600.0
"""A job projected to take longer than this has its estimate on the console; a shorter one only in the debug log
(so the quickstart's console stays as it was)."""


def progress_bar(iterable: Any = None, *, work: str | None = None, **kwargs: Any) -> Any:
    """A tqdm bar drawn on memrl's console (where the CLI's :class:`ConsoleHandler` shows memrl's records; stderr when
    memrl runs as a library). With ``work`` (what the whole job is, e.g. ``"1,000,000 episodes"``), one log line says,
    once the first items have run for :data:`ESTIMATE_AFTER_S` seconds, how long the rest would take at the rate
    measured over them, on the console when it is longer than :data:`LONG_JOB_S`: an absurd size shows as an absurd
    time while it can still be interrupted."""
    from tqdm.auto import tqdm

    handler = _console_handler()
    file = handler.err if handler is not None else sys.stderr
    if work is None:
        return tqdm(iterable, file=file, **kwargs)

    class EstimatingBar(tqdm):
        def update(self, n: float | None = 1) -> bool | None:
            shown = super().update(n)
            if not getattr(self, "_estimated", False) and not self.disable:
                self._estimate()
            return shown

        def _estimate(self) -> None:
            elapsed, done = self._time() - self.start_t, self.n - self.initial
            if elapsed < ESTIMATE_AFTER_S or done <= 0 or not self.total:
                return
            self._estimated = True
            rate = done / elapsed
            remaining = (self.total - self.n) / rate
            with tqdm.external_write_mode(file=self.fp):
                log.log(logging.INFO if remaining >= LONG_JOB_S else logging.DEBUG,
                        f"{self.desc or 'progress'}: {work}; {done:,} done in {elapsed:.1f} s ({rate:.3g}/s): about "
                        f"{_duration(remaining)} to go")

    return EstimatingBar(iterable, file=file, **kwargs)


def _duration(seconds: float) -> str:
    """``seconds`` in the unit a person reads it in (``40 s``, ``12 min``, ``3.5 h``, ``2.1 days``, ``31 years``)."""
    for unit, size in (("years", 365 * 86400), ("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.0f} s"


class RunLog(logging.StreamHandler):
    """The run's ``run.log``: every log record, and with ``capture_fds`` everything written to file descriptors 1
    and 2 (third-party prints, C++ and child-process output). A temporary file until :meth:`bind` moves it into the
    run directory; :meth:`finish` restores file descriptors 1 and 2 and deletes a log that was never bound (the run
    never started)."""

    def __init__(self, capture_fds: bool) -> None:
        fd, tmp = tempfile.mkstemp(prefix="memrl-run-", suffix=".log")
        super().__init__(os.fdopen(fd, "a", buffering=1, encoding="utf-8", errors="replace"))
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.path, self.bound = Path(tmp), False
        self._saved_fds: list[int] = []
        if capture_fds:
            _flush_std_streams()  # what was written before belongs on the console
            self._saved_fds = [os.dup(1), os.dup(2)]
            self._point_fds_at(self.stream)

    def _point_fds_at(self, stream: TextIO) -> None:
        if self._saved_fds:
            os.dup2(stream.fileno(), 1)
            os.dup2(stream.fileno(), 2)

    def bind(self, run_dir: str | Path) -> Path:
        """Move the log into ``<run_dir>/run.log`` (appending to one already there, as on a resume) and write there
        from now on."""
        if self.bound:
            return self.path
        _flush_std_streams()
        self.flush()
        target = Path(run_dir) / "run.log"
        new = open(target, "a", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115 - the handler's
        new.write(self.path.read_text(encoding="utf-8", errors="replace"))
        new.flush()
        self._point_fds_at(new)
        self.setStream(new).close()
        os.unlink(self.path)
        self.path, self.bound = target, True
        return target

    def close(self) -> None:
        """Flush only: ``logging.shutdown`` and ``logging.config`` close every handler they know (vLLM configures its
        loggers when imported, mid-run), and the run log must go on capturing until :meth:`finish`."""
        self.flush()
        super().close()

    def finish(self) -> None:
        """Restore file descriptors 1 and 2, close the log, and delete it if it was never bound (the end of the
        command; the handler must be off every logger by then)."""
        self.acquire()
        try:
            _flush_std_streams()
            for fd, saved in enumerate(self._saved_fds, start=1):
                os.dup2(saved, fd)
                os.close(saved)
            self._saved_fds = []
            if self.stream is not None:
                self.stream.close()
                self.stream = None  # logging.shutdown flushes every handler it has seen: nothing is left to flush
            if not self.bound:
                self.path.unlink(missing_ok=True)
        finally:
            self.release()
        super().close()


def _flush_std_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        # a replaced or closed stream holds nothing of ours
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()


def _run_log() -> RunLog | None:
    return next((h for h in logging.getLogger().handlers if isinstance(h, RunLog)), None)


def run_log_path() -> Path | None:
    """Where the run log is being written (None when the CLI has not set one up)."""
    handler = _run_log()
    return handler.path if handler is not None else None


def bind_run_log(run_dir: str | Path) -> Path | None:
    """Move the run log into ``<run_dir>/run.log`` (first call only; None when there is no run log)."""
    handler = _run_log()
    if handler is None or handler.bound:
        return None
    return handler.bind(run_dir)
