"""Run metrics and the console: one line per step on the console, one JSON object per step in ``metrics.jsonl``,
wandb when enabled; and :func:`quiet_console`, which keeps the console for memrl's own output.

wandb runs in the mode the config names (``offline`` needs no network); its API key, if any, comes from the
environment (``WANDB_API_KEY``) and is never written anywhere by memrl.

The console: memrl's banners, results and progress bars go to the terminal; everything else (third-party warnings,
library progress bars, logging records, engine start-up output written by C++ or by child processes straight to file
descriptors 1 and 2) goes to the run's ``run.log``. Until the run directory exists it is buffered in a temporary file,
which :func:`bind_run_log` moves into place (and which is deleted when the run never starts). A write is memrl's when
the first frame that is not ``print``/tqdm/io machinery belongs to a memrl package; anything written through
``logging`` or ``warnings`` is a log record.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from memrl.data.config import WandbConfig
from memrl.data.io import append_jsonl, atomic_write_text

__all__ = ["MetricsLogger", "bind_run_log", "format_metrics", "quiet_console", "run_log_path"]

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
            print(line, flush=True)
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in clean.items() if isinstance(v, (int, float))}, step=step)

    def close(self) -> None:
        """Finish the wandb run."""
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


# ----------------------------------------------------------------------------------------------------------------
# console routing

_MEMRL_PACKAGES = frozenset({"memrl", "benchmarks", "__main__"})
# Stream plumbing between a writer and the console (wandb wraps sys.stdout.write while a run is live; once Ray has
# started in the process, its tqdm_ray replaces the builtin print with a wrapper).
_MACHINERY = ("tqdm", "io", "_io", "codecs", "contextlib", "memrl.data.tracking", "threading",
              "wandb.sdk.lib.console_capture", "ray.experimental.tqdm_ray")
_LOG_MACHINERY = ("logging", "warnings", "py.warnings")
# Third-party writers whose output is the progress of a memrl stage: the SFT trainer's progress bar and loss lines.
_SHOWN = ("transformers.trainer_callback",)


def _from_memrl() -> bool:
    """Whether the current write comes from memrl code (see the module docstring)."""
    frame = sys._getframe(2)
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module.startswith(_LOG_MACHINERY):
            return False
        if not module.startswith(_MACHINERY):
            return module.split(".", 1)[0] in _MEMRL_PACKAGES or module.startswith(_SHOWN)
        frame = frame.f_back
    return False


class _Router(io.TextIOBase):
    """A text stream that sends memrl's writes to the console and every other write to the log."""

    def __init__(self, console: TextIO, log: TextIO) -> None:
        self.console, self.log = console, log

    def write(self, text: str) -> int:
        (self.console if _from_memrl() else self.log).write(text)
        return len(text)

    def flush(self) -> None:
        self.console.flush()
        self.log.flush()

    def isatty(self) -> bool:
        return self.console.isatty()

    def fileno(self) -> int:  # raw fd writers are libraries: their bytes belong in the log
        return self.log.fileno()

    @property
    def buffer(self) -> Any:  # byte writers likewise
        return self.log.buffer

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.console, "encoding", None) or "utf-8"


class _Capture:
    def __init__(self, log_path: Path, log: TextIO, routers: list[_Router]) -> None:
        self.log_path, self.log, self.routers, self.bound = log_path, log, routers, False


_active: _Capture | None = None


def run_log_path() -> Path | None:
    """Where third-party output is being written (None when the console is not captured)."""
    return _active.log_path if _active is not None else None


def _console_stream(stream: TextIO) -> TextIO:
    """A stream on what ``stream`` shows now, unaffected by later redirection of fds 1 and 2."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return stream
    return os.fdopen(os.dup(fd), "w", buffering=1, encoding=getattr(stream, "encoding", None) or "utf-8",
                     errors="replace")


@contextlib.contextmanager
def quiet_console(enabled: bool = True) -> Iterator[None]:
    """Route third-party output to ``run.log`` for the duration (see the module docstring); ``enabled=False``
    (``--verbose``) leaves the console alone."""
    global _active
    if not enabled or _active is not None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    old_out, old_err = sys.stdout, sys.stderr
    console_out, console_err = _console_stream(old_out), _console_stream(old_err)
    fd, tmp = tempfile.mkstemp(prefix="memrl-run-", suffix=".log")
    log = os.fdopen(fd, "a", buffering=1, encoding="utf-8", errors="replace")
    saved = [os.dup(1), os.dup(2)]
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    routers = [_Router(console_out, log), _Router(console_err, log)]
    sys.stdout, sys.stderr = routers
    _active = _Capture(Path(tmp), log, routers)
    try:
        yield
    finally:
        capture, _active = _active, None
        for stream in (*routers, console_out, console_err):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr = old_out, old_err
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd_saved in saved:
            os.close(fd_saved)
        capture.log.close()
        if not capture.bound:  # the run never started: leave nothing behind
            with contextlib.suppress(FileNotFoundError):
                os.unlink(capture.log_path)
        for stream in (console_out, console_err):
            if stream is not old_out and stream is not old_err:
                stream.close()


def bind_run_log(run_dir: str | Path) -> Path | None:
    """Move the captured output into ``<run_dir>/run.log`` and write there from now on (first call only)."""
    capture = _active
    if capture is None or capture.bound:
        return None
    target = Path(run_dir) / "run.log"
    capture.log.flush()
    new = open(target, "a", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115 - lives with the capture
    new.write(capture.log_path.read_text(encoding="utf-8", errors="replace"))
    new.flush()
    os.dup2(new.fileno(), 1)
    os.dup2(new.fileno(), 2)
    for router in capture.routers:
        router.log = new
    capture.log.close()
    os.unlink(capture.log_path)
    capture.log, capture.log_path, capture.bound = new, target, True
    return target
