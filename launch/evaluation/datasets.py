"""The datasets of an evaluation: their files, the episodes or tasks they hold, and the check that they are there
before anything is created."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memrl.data.config import ConfigError
from memrl.data.errors import UserError
from memrl.data.tasks import TaskSetConfig, load_tasks, make_ama_episode
from memrl.launch.evaluation.config import DatasetSpec, EvalConfig

__all__ = ["check_inputs", "dataset_path", "items_of", "load_dataset"]


def check_inputs(cfg: EvalConfig) -> None:
    """Before anything is created: every dataset file exists and holds at least one episode."""
    from memrl.data.checks import check_existing_file

    for key in ("datasets", "systems", "models"):
        if not getattr(cfg, key):
            raise ConfigError(f"{key}: the list is empty, so there is nothing to evaluate; name at least one")
    for i, spec in enumerate(cfg.datasets):
        key = f"datasets.{i}.path"
        if spec.kind in ("ama_synthetic", "sam", "proactive", "tasks"):
            continue  # generated (counts are bounded) or a task set the generic checks read
        path = dataset_path(spec, cfg.data_dir)
        if path is None:
            raise ConfigError(f"{key}: dataset {spec.name!r} of kind {spec.kind} needs a file")
        check_existing_file(str(path), key, what=f"{spec.kind} dataset file")
        try:
            episodes = load_dataset(spec, cfg.data_dir)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, UserError):
                raise
            raise UserError(
                f"{key}: {path} is not a readable {spec.kind} dataset ({type(exc).__name__}: {exc})"
            ) from None
        if not episodes:
            raise UserError(f"{key}: {path} holds no episodes, so there is nothing to evaluate")


def dataset_path(spec: DatasetSpec, data_dir: str | None = None) -> Path | None:
    """The file of a dataset: its ``path``, under ``data_dir`` when relative (``~`` expanded)."""
    if spec.path is None:
        return None
    path = Path(spec.path).expanduser()
    return path if path.is_absolute() or data_dir is None else Path(data_dir).expanduser() / path


def load_dataset(spec: DatasetSpec, data_dir: str | None = None) -> list[Any]:
    """The episodes (QA kinds) or tasks (``sam`` / ``proactive``) of a dataset."""
    if spec.kind in ("sam", "proactive", "tasks"):
        tasks_cfg = spec.tasks or TaskSetConfig(family=spec.kind, count=8, seed=spec.seed)
        tasks = load_tasks(tasks_cfg, prefix=spec.name)
        return tasks[: spec.max_episodes] if spec.max_episodes else tasks
    if spec.kind == "ama_synthetic":
        episodes = [
            make_ama_episode(
                env, dict(spec.env_params), spec.seed + i, target, noise=spec.noise, per_type=spec.per_type
            )
            for env in spec.envs
            for target in spec.target_tokens
            for i in range(spec.episodes_per_setting)
        ]
    else:
        from memrl.data.loaders import LOADERS

        path = dataset_path(spec, data_dir)
        assert path is not None
        if not path.is_file():
            raise ConfigError(f"dataset {spec.name!r}: file not found: {path} (set its path, or data_dir=DIR)")
        episodes = LOADERS[spec.kind](path)
    return episodes[: spec.max_episodes] if spec.max_episodes else episodes


def items_of(spec: DatasetSpec, data: list[Any]) -> int:
    """How many records a dataset yields per system and model (questions, or task runs): a progress bar's total."""
    if spec.kind in ("sam", "proactive", "tasks"):
        return len(data) * (1 + spec.samples)
    per = spec.max_questions
    return sum(min(len(e.qa_pairs), per) if per else len(e.qa_pairs) for e in data)
