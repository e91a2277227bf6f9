"""Task families: AMA-style QA episodes, SAM scattered-evidence tasks (and their real-text form, ``dialogue``: the
same episodes told as English conversations), proactive behavioural-state-decay tasks.

SAM and proactive tasks implement the agent loop's task interface (``task_id``, ``task``, ``max_steps``,
``reset() -> str``, ``step(action) -> (observation, done)``, ``finish(answer) -> outcome``) plus ``snapshot()`` /
``restore()``; :func:`make_task` rebuilds one from its :class:`~memrl.data.schemas.EnvSpec`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from memrl.data.config import ConfigError, ConfigModel
from memrl.data.io import read_jsonl
from memrl.data.schemas import EnvSpec, Episode
from memrl.data.tasks.ama import make_ama_episode
from memrl.data.tasks.check import check_episode_qa
from memrl.data.tasks.dialogue import DialogueParams, DialogueTask
from memrl.data.tasks.proactive import ActionAgent, ProactiveParams, ProactiveTask, simulate_proactive
from memrl.data.tasks.sam import SamReasoner, SamTask, SamTaskParams
from memrl.data.tasks.sam_reference import simulate_sam
from memrl.data.tracking import progress_bar

__all__ = [
    "SAM_FAMILIES",
    "TASKS",
    "ActionAgent",
    "DialogueParams",
    "DialogueTask",
    "ProactiveParams",
    "ProactiveTask",
    "SamReasoner",
    "SamTask",
    "SamTaskParams",
    "TaskSetConfig",
    "check_episode_qa",
    "load_tasks",
    "make_ama_episode",
    "make_task",
    "simulate_proactive",
    "simulate_sam",
    "task_from_episode",
]

TASKS: dict[str, type[SamTask] | type[ProactiveTask]] = {
    "sam": SamTask, "dialogue": DialogueTask, "proactive": ProactiveTask,
}
SAM_FAMILIES = ("sam", "dialogue")
"""Families whose tasks are :class:`SamTask` s (SAM's memory system, reasoner and oracle run them)."""


def make_task(spec: EnvSpec, task_id: str = "") -> SamTask | ProactiveTask:
    """Rebuild the interactive task a spec names (``sam``, ``dialogue`` or ``proactive``)."""
    if spec.name not in TASKS:
        raise KeyError(f"unknown task family {spec.name!r}; registered: {sorted(TASKS)}")
    return TASKS[spec.name].from_spec(spec, task_id)


def task_from_episode(episode: Episode) -> SamTask | ProactiveTask:
    """The interactive task behind a SAM or proactive :class:`Episode` (its ``env`` spec, its id)."""
    if episode.env is None:
        raise ValueError(f"episode {episode.episode_id!r} has no env spec")
    return make_task(episode.env, episode.episode_id)


class TaskSetConfig(ConfigModel):
    """A set of interactive tasks: the episodes of a JSONL file (``memrl data synth`` output), or ``count`` tasks
    generated from the family's parameters with seeds ``seed, seed + 1, ...``."""

    family: Literal["sam", "dialogue", "proactive"] = "sam"  # task family
    episodes: str | None = None  # JSONL of episodes to load; None: generate count tasks
    count: int = Field(64, ge=0, le=10**6)  # tasks to generate, or at most this many from episodes (there 0: all)
    seed: int = Field(0, ge=0, lt=2**32)  # seed of the first generated task (then seed + 1, ...)
    sam: SamTaskParams = SamTaskParams()
    dialogue: DialogueParams = DialogueParams()
    proactive: ProactiveParams = ProactiveParams()


def load_tasks(cfg: TaskSetConfig, prefix: str = "task") -> list[SamTask | ProactiveTask]:
    """The tasks of ``cfg`` (deterministic); ids are ``<prefix>-<seed>`` for generated tasks."""
    if cfg.episodes:
        tasks = [task_from_episode(e) for e in read_jsonl(cfg.episodes, Episode) if e.env is not None]
        tasks = [t for t in tasks if t.family == cfg.family]
        if not tasks:
            raise ConfigError(f"{cfg.episodes}: no {cfg.family} episodes in the file")
        return tasks[: cfg.count] if cfg.count else tasks
    make, params = {"sam": (SamTask, cfg.sam), "dialogue": (DialogueTask, cfg.dialogue),
                    "proactive": (ProactiveTask, cfg.proactive)}[cfg.family]
    # generating a task runs its reference agent (milliseconds each): a large count gets a bar and a time estimate
    seeds = progress_bar(range(cfg.seed, cfg.seed + cfg.count), desc=f"{prefix} tasks", leave=False,
                         work=f"{cfg.count:,} {cfg.family} tasks to generate")
    return [make(params, seed=seed, task_id=f"{prefix}-{seed}") for seed in seeds]
