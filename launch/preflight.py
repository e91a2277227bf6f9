"""Checks every command runs on its validated config before it creates anything.

Pydantic has already checked types and ranges (every numeric field declares its own bounds; the base class refuses
non-finite numbers and booleans as numbers). This walks the config and checks what lies outside it: the files and
folders named in it (model checkpoints, tokenizers and LoRA adapters with their weights, episode files with each
record against its schema, the run's output folder), API keys in the environment, and ``--resume`` targets (the
run's saved config, a finished run, checkpoints that are gone).
A command adds its own checks (``Job.checks``) for what only it knows. Everything raises
:class:`~memrl.data.errors.UserError`, which the CLI turns into one message and exit code 2.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from memrl.data.checks import (
    check_adapter_dir,
    check_existing_file,
    check_model_ref,
    check_output_dir,
    check_resume_target,
)
from memrl.data.config import RunConfig
from memrl.data.errors import UserError
from memrl.data.run_dir import check_no_run_in, check_resume_config
from memrl.train.checkpoint import check_checkpoints_remain

__all__ = ["OUTPUT_KEYS", "check_config"]

logger = logging.getLogger(__name__)

# Folders a command writes into besides its run directory (checked writable without being created).
OUTPUT_KEYS = frozenset({"out", "output", "model_cache", "cache_dir"})


def check_config(cfg: BaseModel) -> None:
    """Run the generic checks on a command's whole config (see the module docstring)."""
    run = getattr(cfg, "run", None)
    if isinstance(run, RunConfig):
        _check_run(cfg, run)
    _walk(cfg, "")


def _check_run(cfg: BaseModel, run: RunConfig) -> None:
    check_output_dir(run.output_dir, "run.output_dir")
    if run.resume:
        check_resume_target(run.output_dir, run.name)
        assert run.name is not None
        _check_resumable(cfg, run, Path(run.output_dir) / run.name)
    elif run.name is not None:
        check_output_dir(str(Path(run.output_dir) / run.name), "run.name")
        check_no_run_in(Path(run.output_dir) / run.name)


def _check_resumable(cfg: BaseModel, run: RunConfig, run_dir: Path) -> None:
    """``--resume`` does not guess: the config is the run's own (or the changes are named), a finished run is not
    run again, and a run that saved checkpoints still has one."""
    changes = check_resume_config(cfg, run, run_dir)
    if (run_dir / "summary.json").is_file() and not changes:
        raise UserError(
            f"--resume: run {run_dir} is finished (it wrote summary.json): nothing to resume. To train it "
            "further, resume with a longer schedule and --allow-config-change naming it (e.g. "
            "loop.iterations or train.max_steps), or start a new run from its final weights"
        )
    check_checkpoints_remain(run_dir / "checkpoints")


def _walk(node: Any, prefix: str) -> None:
    if isinstance(node, BaseModel):
        _check_section(node, prefix)
        for name in type(node).model_fields:
            _walk(getattr(node, name), f"{prefix}.{name}" if prefix else name)
    elif isinstance(node, (list, tuple)):
        for i, item in enumerate(node):
            _walk(item, f"{prefix}.{i}")
    elif isinstance(node, dict):
        for key, item in node.items():
            if isinstance(item, BaseModel):
                _walk(item, f"{prefix}.{key}")


MAX_WORKERS_PER_CORE = 16  # a local fleet of more rollout workers than this per core is refused


def _check_fleet_size(fleet: Any, prefix: str) -> None:
    """A local Ray fleet (no ``fleet.address``, no ``RAY_ADDRESS``) asking for more CPUs than the machine has gets a
    warning with the numbers (its workers would share cores and start one after another), and one of more than
    :data:`MAX_WORKERS_PER_CORE` workers per core is refused: minutes of silence otherwise."""
    workers = fleet.workers
    if not workers or fleet.address or os.environ.get("RAY_ADDRESS"):
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    key = _key(prefix, "workers")
    if workers > MAX_WORKERS_PER_CORE * cores:
        raise UserError(
            f"{key}={workers}: a local fleet of {workers} rollout workers on {cores} cores (at most "
            f"{MAX_WORKERS_PER_CORE} per core); choose fewer, or join a cluster with fleet.address"
        )
    wanted = workers * fleet.cpus_per_worker
    if wanted > cores:
        logger.warning(
            f"{key}={workers} x {_key(prefix, 'cpus_per_worker')}={fleet.cpus_per_worker:g} asks for "
            f"{wanted:g} CPUs on a machine with {cores} cores: the workers will share cores (slower than "
            f"{max(1, int(cores // fleet.cpus_per_worker))} workers would be)"
        )


def _key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _check_section(section: BaseModel, prefix: str) -> None:
    fields = type(section).model_fields
    for name in fields:
        value = getattr(section, name)
        if isinstance(value, str) and name in OUTPUT_KEYS:
            check_output_dir(value, _key(prefix, name))
    key_env = getattr(section, "api_key_env", None)
    if isinstance(key_env, str) and not os.environ.get(key_env):
        raise UserError(
            f"{_key(prefix, 'api_key_env')}: environment variable {key_env} is not set (it should hold "
            "the endpoint's API key); export it, or set api_key_env to null for servers without a key"
        )
    kind = type(section).__name__
    if kind == "FleetConfig":
        _check_fleet_size(section, prefix)
    if kind == "EngineConfig":
        _check_engine(section, prefix)
    elif kind == "PolicySpec":
        check_model_ref(section.base, _key(prefix, "base"), tokenizer=True)
        if section.adapter:
            check_adapter_dir(section.adapter, _key(prefix, "adapter"), base=section.base)
    elif "episodes" in fields and "count" in fields:
        _check_task_set(section, prefix)
    elif "adapter" in fields and isinstance(section.adapter, str):
        check_adapter_dir(section.adapter, _key(prefix, "adapter"))
    if "tokenizer" in fields and kind != "EngineConfig":
        tok = section.tokenizer
        if isinstance(tok, str) and tok != "tiny":
            check_model_ref(tok, _key(prefix, "tokenizer"), needs="tokenizer_config.json")


def _check_engine(engine: Any, prefix: str) -> None:
    if engine.backend in ("vllm", "hf") and engine.model:
        check_model_ref(
            engine.model, _key(prefix, "model"), tokenizer=not engine.tokenizer or engine.tokenizer == engine.model
        )
    if engine.tokenizer and engine.tokenizer != engine.model:
        check_model_ref(engine.tokenizer, _key(prefix, "tokenizer"), needs="tokenizer_config.json")


def _check_task_set(tasks: Any, prefix: str) -> None:
    """Episode files are read now (each record against its schema: file:line:field); a generated set must not be
    empty."""
    if tasks.episodes:
        check_existing_file(tasks.episodes, _key(prefix, "episodes"), what="episodes file")
        if hasattr(tasks, "load"):
            loaded = tasks.load()
        else:
            from memrl.data.tasks import load_tasks

            loaded = load_tasks(tasks, "check")
        if not loaded:
            raise UserError(f"{_key(prefix, 'episodes')}: {tasks.episodes} holds no usable episodes")
        if Path(tasks.episodes).suffix == ".jsonl":
            _check_nonempty_episodes(Path(tasks.episodes))
    elif tasks.count < 1:
        raise UserError(f"{_key(prefix, 'count')}={tasks.count}: a generated task set needs count >= 1")


def _check_nonempty_episodes(path: Path) -> None:
    """An episode without turns or without questions gives nothing to roll out or score: ``file:line: field``."""
    import json

    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            record = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            continue  # the loader has already reported what it could not read
        if not isinstance(record, dict):
            continue
        for field in ("trajectory", "qa_pairs"):
            if field in record and not record[field]:
                raise UserError(
                    f"{path}:{lineno}: field '{field}': empty (an episode needs turns and questions to "
                    "roll out and score); remove the record or complete it"
                )
