"""The run folder: ``run.output_dir/run.name``, created when a run starts, holding its resolved ``config.yaml`` and
``run.log`` beside everything the run writes."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from memrl.data.config import ConfigError, RunConfig, write_resolved_config
from memrl.data.tracking import bind_run_log

__all__ = ["check_no_run_in", "prepare_run_dir"]


def check_no_run_in(run_dir: Path) -> None:
    """Refuse to start a new run where one already is (its ``config.yaml``) unless the user asks to resume it."""
    if (run_dir / "config.yaml").exists():
        raise ConfigError(f"run directory {run_dir} already holds a run: pass --resume (run.resume=true) to continue "
                          "it, or choose another run.name")


def prepare_run_dir(cfg: BaseModel, run: RunConfig, command: str) -> Path:
    """Create (or, with ``run.resume``, reuse) the run directory and write the resolved config into it.

    The directory is ``run.output_dir/run.name``; without a name it is ``<command>-<UTC timestamp>``.
    """
    import datetime

    name = run.name or f"{command.replace(' ', '-')}-{datetime.datetime.now(datetime.timezone.utc):%Y%m%d-%H%M%S}"
    run_dir = Path(run.output_dir) / name
    if not run.resume:
        check_no_run_in(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_resolved_config(cfg, run_dir)
    bind_run_log(run_dir)  # captured third-party output (``memrl ... `` without --verbose) goes to run.log
    return run_dir
