"""The run folder: ``run.output_dir/run.name``, created when a run starts, holding its resolved ``config.yaml`` and
``run.log`` beside everything the run writes.

A run folder is owned by one process: :func:`prepare_run_dir` takes an exclusive ``fcntl`` lock on its ``.lock`` file
before it writes anything, and holds it until the process exits (or :func:`unlock_run_dirs`). A second start into a
locked folder is a :class:`~memrl.data.config.ConfigError` that has touched nothing of the first run. The lock is
re-entrant within one process (a test or the quickstart may prepare the same folder twice).

``--resume`` compares the resolved config with the one the run saved: a difference in a key that changes the run's
meaning is an error listing the keys, unless ``run.allow_config_change`` names them (or a section holding them).
"""

from __future__ import annotations

import datetime
import fcntl
import fnmatch
import logging
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from memrl.data.config import ConfigError, RunConfig, write_resolved_config
from memrl.data.io import read_mapping
from memrl.data.tracking import bind_run_log

__all__ = [
    "IGNORED_ON_RESUME",
    "check_no_run_in",
    "check_resume_config",
    "check_run_dir",
    "config_changes",
    "created_run_dirs",
    "prepare_run_dir",
    "run_dir_of",
    "shared_run_dir",
    "unlock_run_dirs",
]

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"
# Keys that say where or how a run is observed or executed, not what it computes: a resume may change them freely.
IGNORED_ON_RESUME = (
    "run.resume",
    "run.allow_config_change",
    "run.output_dir",
    "run.wandb.*",
    "train.stop_at_step",
    "loop.stop_after_iterations",
    "fleet.*",
    "placement.*.endpoints",
    "placement.*.*.endpoints",
    "placement.*.api_key_env",
    "placement.*.*.api_key_env",
)

# run folder -> (its open lock file, whether this process created the folder)
_held: dict[Path, tuple[Any, bool]] = {}


def run_dir_of(run: RunConfig, command: str) -> Path:
    """The run folder ``run`` names (``run.output_dir/run.name``; without a name ``<command>-<UTC timestamp>``)."""
    name = run.name or f"{command.replace(' ', '-')}-{datetime.datetime.now(datetime.timezone.utc):%Y%m%d-%H%M%S}"
    return Path(run.output_dir) / name


def check_no_run_in(run_dir: Path) -> None:
    """Refuse to start a new run where one already is (its ``config.yaml``) unless the user asks to resume it."""
    if (run_dir / "config.yaml").exists():
        raise ConfigError(
            f"run directory {run_dir} already holds a run: pass --resume (run.resume=true) to continue "
            "it, or choose another run.name"
        )


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out or {prefix: {}}
    return {prefix: node}


def _matches(key: str, patterns: list[str] | tuple[str, ...]) -> bool:
    """``key`` equals a pattern, lies under it (``trainer`` covers ``trainer.lr``) or matches it as a glob."""
    return any(key == p or key.startswith(p + ".") or fnmatch.fnmatchcase(key, p) for p in patterns)


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The dotted keys whose values differ between a run's saved config and the current one (added and removed keys
    included), except those in :data:`IGNORED_ON_RESUME`."""
    before, after = _flatten(saved), _flatten(current)
    return sorted(
        k
        for k in before.keys() | after.keys()
        if before.get(k, "<absent>") != after.get(k, "<absent>") and not _matches(k, IGNORED_ON_RESUME)
    )


def check_resume_config(cfg: BaseModel, run: RunConfig, run_dir: Path) -> list[str]:
    """The config changes a resume makes (all named by ``run.allow_config_change``), or a ConfigError listing the
    ones that are not."""
    path = run_dir / "config.yaml"
    try:
        saved = read_mapping(path)
    except ValueError as exc:
        raise ConfigError(f"--resume: {path} {exc}; the run's saved config is needed to resume it") from None
    changes = config_changes(saved, cfg.model_dump(mode="json"))
    refused = [k for k in changes if not _matches(k, run.allow_config_change)]
    if refused:
        shown = ", ".join(
            f"{k} ({_flatten(saved).get(k, '<absent>')!r} -> "
            f"{_flatten(cfg.model_dump(mode='json')).get(k, '<absent>')!r})"
            for k in refused[:12]
        )
        more = f" and {len(refused) - 12} more" if len(refused) > 12 else ""
        raise ConfigError(
            f"--resume: the config differs from the one run {run_dir} was started with in {shown}{more}; "
            "resume with the same config, or name the keys you mean to change with "
            f"--allow-config-change {' '.join(refused[:12])}"
        )
    return changes


def _lock(run_dir: Path) -> Any:
    """Take the run folder's exclusive lock (the folder exists); a ConfigError naming the holder when it is taken."""
    handle = open(run_dir / LOCK_FILE, "a+", encoding="utf-8")  # noqa: SIM115 - held until release or exit
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise ConfigError(
            f"run directory {run_dir} is in use by a running memrl process ({holder}); wait for it to "
            "end, or choose another run.name"
        ) from None
    except OSError as exc:  # a filesystem without locks (Lustre mounted without -o flock): run unlocked, say so
        logger.warning("cannot lock %s (%s): a second start into this run folder will not be refused", run_dir, exc)
    return handle


def check_run_dir(cfg: BaseModel, run: RunConfig, run_dir: Path) -> list[str]:
    """Read-only checks of a start into ``run_dir``: a new run needs a folder without a run; a resume needs the run's
    config unchanged but for the keys ``run.allow_config_change`` names (returns the changed keys)."""
    if not run.resume:
        check_no_run_in(run_dir)
        return []
    return check_resume_config(cfg, run, run_dir) if (run_dir / "config.yaml").exists() else []


def prepare_run_dir(cfg: BaseModel, run: RunConfig, command: str) -> Path:
    """Create (or, with ``run.resume``, reuse) the run directory, lock it, and write the resolved config into it.

    The directory is ``run.output_dir/run.name``; without a name it is ``<command>-<UTC timestamp>``. Nothing is
    written into a folder that holds a run (or is locked by another process) unless this start may continue it.
    """
    run_dir = run_dir_of(run, command)
    key = run_dir.absolute()
    if key not in _held:
        check_run_dir(cfg, run, run_dir)  # before the lock file is created in someone else's run folder
        created = not run_dir.exists()
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            handle = _lock(run_dir)
        except ConfigError:
            if created:  # an empty folder this process made a moment ago, while the other run took the lock
                _remove_if_empty(run_dir)
            raise
        _held[key] = (handle, created)
    try:
        changes = check_run_dir(cfg, run, run_dir)  # again under the lock: another start may have won the race
    except ConfigError:
        unlock_run_dirs(key)
        raise
    handle = _held[key][0]
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    if changes and (run_dir / "config.yaml").exists():
        # the run's history keeps the config it ran with until now beside the new one
        (run_dir / "config.yaml").replace(run_dir / f"config.before-resume-{_stamp()}.yaml")
        logger.warning("resuming %s with changed config keys: %s", run_dir, ", ".join(changes))
    write_resolved_config(cfg, run_dir)
    bind_run_log(run_dir)  # captured third-party output (``memrl ... `` without --verbose) goes to run.log
    return run_dir


def _stamp() -> str:
    return f"{datetime.datetime.now(datetime.timezone.utc):%Y%m%d-%H%M%S}"


def _remove_if_empty(folder: Path) -> None:
    try:
        for leftover in folder.iterdir():
            if leftover.name != LOCK_FILE:
                return
        (folder / LOCK_FILE).unlink(missing_ok=True)
        folder.rmdir()
    except OSError:
        pass


def created_run_dirs() -> list[Path]:
    """The run folders this process created and still holds (what a failed start may remove)."""
    return [path for path, (_, created) in _held.items() if created]


def unlock_run_dirs(*only: Path) -> None:
    """Unlock the run folders this process holds (all, or those of ``only``)."""
    for path in list(_held) if not only else [p.absolute() for p in only]:
        entry = _held.pop(path, None)
        if entry is not None:
            entry[0].close()


def shared_run_dir(cfg: BaseModel, run: RunConfig, command: str, state: Any) -> Path:
    """The run directory, prepared (and its resolved config written) by the main process only and agreed on by every
    process of a distributed run: otherwise the other ranks would find the main rank's fresh config and refuse to
    start ("already holds a run"). ``state`` is an accelerate ``Accelerator`` or ``PartialState``."""
    payload: list[str | None] = [None, None]  # [run directory, config error]
    if state.is_main_process:
        try:
            payload[0] = str(prepare_run_dir(cfg, run, command))
        except ConfigError as exc:
            payload[1] = str(exc)
    if state.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(payload, from_process=0)
    if payload[1] is not None:
        raise ConfigError(payload[1])
    return Path(str(payload[0]))
