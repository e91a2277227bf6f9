"""Run metrics: one line on the console, one JSON object per step in ``metrics.jsonl``, and wandb when enabled.

wandb runs in the mode the config names (``offline`` needs no network); its API key, if any, comes from the
environment (``WANDB_API_KEY``) and is never written anywhere by memrl.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from data.config import WandbConfig
from data.io import append_jsonl, atomic_write_text

__all__ = ["MetricsLogger", "format_metrics"]

_CONSOLE_KEYS = ("reward_mean", "success", "loss", "clip_fraction", "approx_kl", "entropy", "grad_norm")


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
        if self.console:
            print(format_metrics(step, metrics), flush=True)
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in clean.items() if isinstance(v, (int, float))}, step=step)

    def close(self) -> None:
        """Finish the wandb run."""
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
