"""Run metrics and memrl's log handlers.

Metrics: one line per step on the console, one JSON object per step in ``metrics.jsonl`` (always), and every backend
``run.logging.backends`` lists (verl's, NeMo-RL's and SkyRL's list of loggers): ``wandb`` (also when
``run.wandb.enabled``), ``tensorboard`` (torch's ``SummaryWriter``: event files under ``<run dir>/tensorboard``) and
``mlflow`` (an ``MlflowClient`` run, by default in a local file store ``<run dir>/mlruns``, which MLflow 3 keeps in
maintenance mode and opens with ``MLFLOW_ALLOW_FILE_STORE=true``, set here; ``mlflow ui --backend-store-uri
<run dir>/mlruns`` shows it; ``run.logging.mlflow_tracking_uri`` names a server or a database instead). The numbers
of each step go to every backend; a resumed run continues the same wandb/MLflow run, and TensorBoard drops the
events after the resumed step. wandb runs in the mode the config names (``offline`` needs no network); its API key,
if any, comes from the environment (``WANDB_API_KEY``) and is never written anywhere by memrl.

Logging: every memrl module logs through ``logging.getLogger(__name__)``. The CLI (launch/console.py) installs the two
handlers defined here: a :class:`ConsoleHandler` on the ``memrl`` logger (the console shows memrl's banners, results
and progress bars, see :func:`progress_bar`) and a :class:`RunLog` on the root logger, the run's ``run.log``, which
gets every record, third-party included, and (without ``--verbose``) everything written to file descriptors 1 and 2:
third-party prints and progress bars, engine start-up output of C++ code and child processes. The run log is a
temporary file until the run directory exists; :func:`bind_run_log` moves it into place.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TextIO

from memrl.data.config import ConfigError, LoggingConfig, WandbConfig
from memrl.data.io import append_jsonl, atomic_write_text

__all__ = [
    "BACKENDS",
    "ConsoleHandler",
    "MetricsBackend",
    "MetricsLogger",
    "RunLog",
    "bind_run_log",
    "format_metrics",
    "progress_bar",
    "run_log_path",
]

log = logging.getLogger(__name__)

_CONSOLE_KEYS = (
    "reward_mean",
    "success",
    "mean_outcome",
    "reentry_snapshot",
    "reentry_replay",
    "replayed_steps",
    "replay_verified",
    "loss",
    "clip_fraction",
    "approx_kl",
    "entropy",
    "grad_norm",
    "eval/success",
    "eval/success_greedy",
)


def format_metrics(step: int, metrics: dict[str, Any], keys: tuple[str, ...] = _CONSOLE_KEYS) -> str:
    """A compact console line with the most telling metrics first."""
    shown = [f"{k}={metrics[k]:.4g}" for k in keys if isinstance(metrics.get(k), (int, float))]
    return f"[step {step}] " + " ".join(shown)


class MetricsBackend(Protocol):
    """Where a step's numbers go besides ``metrics.jsonl`` (one of :data:`BACKENDS`)."""

    def log(self, step: int, numbers: dict[str, float]) -> None:
        """Record one step's numeric metrics."""

    def close(self) -> None:
        """Finish the run (flush and close files)."""


class _Wandb:
    def __init__(self, cfg: WandbConfig, run_dir: Path, name: str | None, config: dict[str, Any]) -> None:
        import wandb

        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            mode=cfg.mode,
            tags=list(cfg.tags),
            dir=str(run_dir),
            name=name,
            config=config,
            reinit="finish_previous",
        )

    def log(self, step: int, numbers: dict[str, float]) -> None:
        self.run.log(numbers, step=step)

    def close(self) -> None:
        self.run.finish()


class _TensorBoard:
    """torch's ``SummaryWriter``; after a resume the events past the resumed step are purged."""

    def __init__(self, directory: Path, purge_after: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(directory), purge_step=None if purge_after is None else purge_after + 1)

    def log(self, step: int, numbers: dict[str, float]) -> None:
        for key, value in numbers.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()  # readable while the run goes on, and after a kill

    def close(self) -> None:
        self.writer.close()


_MLFLOW_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")  # the characters MLflow allows in a metric name


class _MLflow:
    """One MLflow run per memrl run (its id kept in ``<run dir>/mlflow_run_id``, so a resume continues it)."""

    def __init__(self, cfg: LoggingConfig, run_dir: Path, name: str | None, config: dict[str, Any]) -> None:
        from mlflow import MlflowClient

        uri = cfg.mlflow_tracking_uri or (run_dir / "mlruns").absolute().as_uri()
        if uri.startswith("file:"):  # MLflow 3 keeps its file store in maintenance mode, behind this switch
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        id_file = run_dir / "mlflow_run_id"
        if id_file.exists():
            self.run_id = id_file.read_text().strip()
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            experiment = self.client.get_experiment_by_name(cfg.mlflow_experiment)
            experiment_id = (
                experiment.experiment_id
                if experiment is not None
                else self.client.create_experiment(cfg.mlflow_experiment)
            )
            self.run_id = self.client.create_run(experiment_id, run_name=name or run_dir.name).info.run_id
            atomic_write_text(id_file, self.run_id + "\n")
            if config:
                self.client.log_dict(self.run_id, config, "config.json")

    def log(self, step: int, numbers: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_MLFLOW_KEY.sub("_", k), v, now, step) for k, v in numbers.items()]
        for start in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics per batch
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


BACKENDS: dict[str, str | None] = {"jsonl": None, "wandb": "wandb", "tensorboard": "tensorboard", "mlflow": "mlflow"}
"""Every ``run.logging.backends`` name and the package it needs (jsonl: none, it is always on)."""


class MetricsLogger:
    """Writes metrics to ``<run_dir>/metrics.jsonl`` (append, durable), the console, and the configured backends
    (wandb when ``wandb_cfg`` enables it; ``logging``: ``run.logging``, whose list adds wandb, tensorboard, mlflow).
    """

    def __init__(
        self,
        run_dir: str | Path,
        wandb_cfg: WandbConfig | None = None,
        config: dict[str, Any] | None = None,
        *,
        name: str | None = None,
        console: bool = True,
        resume_from_step: int | None = None,
        logging: LoggingConfig | None = None,
    ) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.console = console
        self._start = time.time()
        self._purge_after: int | None = None  # TensorBoard drops its events after this step (a resume)
        if resume_from_step is not None and self.path.exists():
            self.truncate_after(resume_from_step)
        run_dir = Path(run_dir)
        listed = set(logging.backends) if logging is not None else set()
        wandb_cfg = wandb_cfg or WandbConfig()
        if wandb_cfg.enabled:
            listed.add("wandb")
        if wandb_cfg.mode == "disabled":
            listed.discard("wandb")
        wanted = [b for b in ("wandb", "tensorboard", "mlflow") if b in listed]
        for backend in wanted:
            package = BACKENDS[backend]
            if package is not None and importlib.util.find_spec(package) is None:
                raise ConfigError(
                    f"run.logging.backends lists {backend}, but the {package} package is not "
                    f"installed: pip install 'memrl[tracking]' (or remove {backend} from the list)"
                )
        cfg = logging or LoggingConfig()
        openers: dict[str, Callable[[], MetricsBackend]] = {
            "wandb": lambda: _Wandb(wandb_cfg, run_dir, name, config or {}),
            "tensorboard": lambda: _TensorBoard(
                Path(cfg.tensorboard_dir or run_dir / "tensorboard"), self._purge_after
            ),
            "mlflow": lambda: _MLflow(cfg, run_dir, name, config or {}),
        }
        self._openers = {b: openers[b] for b in wanted}
        self._backends: dict[str, MetricsBackend] = {}
        if "wandb" in self._openers:  # wandb starts at once, as before (its run shows up before the first step)
            self._backends["wandb"] = self._openers.pop("wandb")()

    @property
    def backends(self) -> list[str]:
        """The backends this logger writes to besides ``metrics.jsonl``."""
        return [*self._backends, *self._openers]

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after ``step`` (work redone after a resume is logged again, not twice)."""
        self._purge_after = step if step >= 0 else None
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
        for backend in list(self._openers):  # opened at the first step: a resume has truncated by then
            self._backends[backend] = self._openers.pop(backend)()
        if self._backends:
            numbers = {
                k: float(v)
                for k, v in clean.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None
            }
            for backend in self._backends.values():
                backend.log(step, numbers)

    def close(self) -> None:
        """Finish every backend's run."""
        backends, self._backends, self._openers = self._backends, {}, {}
        for backend in backends.values():
            backend.close()


# ----------------------------------------------------------------------------------------------------------------
# log handlers


class ConsoleHandler(logging.Handler):
    """memrl's records on the console: information on ``out`` as written, warnings and errors on ``err`` after their
    level; ``err`` is also where memrl's progress bars draw (:func:`progress_bar`)."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        super().__init__(logging.INFO)
        self.out, self.err = out, err

    def emit(self, record: logging.LogRecord) -> None:
        """Write one record to the console (not one marked for the run's log only: a user's traceback)."""
        if getattr(record, "run_log_only", False):
            return
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
                log.log(
                    logging.INFO if remaining >= LONG_JOB_S else logging.DEBUG,
                    f"{self.desc or 'progress'}: {work}; {done:,} done in {elapsed:.1f} s ({rate:.3g}/s): about "
                    f"{_duration(remaining)} to go",
                )

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
