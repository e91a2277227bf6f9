"""Task families: AMA-style QA episodes, SAM scattered-evidence tasks (and their real-text form, ``dialogue``: the
same episodes told as English conversations), proactive behavioural-state-decay tasks, and the adapters of a user's
own environment or agent (a Gym-style class, an ``async def`` episode function, an agent over HTTP).

Families are registered components (:data:`~memrl.data.registry.TASK_FAMILIES`, ``@register_task``): a task set
names one by ``family`` (a registered name) or by ``entry`` (an import path ``package.module:Name`` of a user's
Gym-style class, episode function or registered task class), so nothing in memrl is edited to add one.

SAM and proactive tasks implement the agent loop's task interface (``task_id``, ``task``, ``max_steps``,
``reset() -> str``, ``step(action) -> (observation, done)``, ``finish(answer) -> outcome``) plus ``snapshot()`` /
``restore()``; :func:`make_task` rebuilds one from its :class:`~memrl.data.schemas.EnvSpec`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from memrl.data.config import ConfigError, ConfigModel
from memrl.data.envs.gym import GymFactory, GymTask, ReentryMode
from memrl.data.io import read_jsonl
from memrl.data.registry import TASK_FAMILIES, ComponentError, Registration, task_kind
from memrl.data.schemas import EnvSpec, Episode
from memrl.data.tasks.ama import make_ama_episode
from memrl.data.tasks.check import check_episode_qa
from memrl.data.tasks.dialogue import DialogueParams, DialogueTask
from memrl.data.tasks.external import ExternalTask, HttpAgentParams, HttpAgentTask, TaskInfo
from memrl.data.tasks.ms_textworld import MsTextWorldTask  # registers ms_textworld (Microsoft TextWorld)
from memrl.data.tasks.proactive import ActionAgent, ProactiveParams, ProactiveTask, simulate_proactive
from memrl.data.tasks.sam import SamReasoner, SamTask, SamTaskParams
from memrl.data.tasks.sam_reference import simulate_sam
from memrl.data.tracking import progress_bar
from memrl.data.user_code import check_params

__all__ = [
    "TASK_FAMILIES",
    "ActionAgent",
    "DialogueParams",
    "DialogueTask",
    "ExternalTask",
    "HttpAgentParams",
    "HttpAgentTask",
    "MsTextWorldTask",
    "ProactiveParams",
    "ProactiveTask",
    "SamReasoner",
    "SamTask",
    "SamTaskParams",
    "TaskInfo",
    "TaskSetConfig",
    "check_episode_qa",
    "family_of",
    "load_tasks",
    "make_ama_episode",
    "make_task",
    "simulate_proactive",
    "simulate_sam",
    "task_from_episode",
]


def make_task(spec: EnvSpec, task_id: str = "") -> Any:
    """Rebuild the interactive task a spec names (a registered family of memrl's task interface: ``sam``,
    ``dialogue``, ``proactive``, ...)."""
    if spec.name not in TASK_FAMILIES or TASK_FAMILIES.get(spec.name).extra.get("kind") != "env":
        known = [r.name for r in TASK_FAMILIES.items() if r.extra.get("kind") == "env"]
        raise KeyError(f"unknown task family {spec.name!r}; registered: {sorted(known)}")
    return TASK_FAMILIES.get(spec.name).obj.from_spec(spec, task_id)


def task_from_episode(episode: Episode) -> Any:
    """The interactive task behind a SAM or proactive :class:`Episode` (its ``env`` spec, its id)."""
    if episode.env is None:
        raise ValueError(f"episode {episode.episode_id!r} has no env spec")
    return make_task(episode.env, episode.episode_id)


class TaskSetConfig(ConfigModel):
    """A set of interactive tasks: the episodes of a JSONL file (``memrl data synth`` output), or ``count`` tasks
    generated from the family's parameters with seeds ``seed, seed + 1, ...``. The family is a registered name
    (``family``) or a user's component named by import path (``entry``: a Gym-style environment class, an ``async
    def run(task, memory, reasoner)`` episode function, or a class registered with ``@register_task``)."""

    family: str = "sam"  # a registered task family: sam, dialogue, proactive, http_agent, or one a user registered
    entry: str | None = None  # "package.module:Name" of a user's Gym env class / episode function / task (sets family)
    params: dict[str, Any] = {}  # a family's parameters (no section of its own): a Gym class's constructor kwargs
    max_steps: int | None = Field(None, ge=1, le=10**6)  # reasoner steps per episode of a Gym/episode family
    reentry: ReentryMode = "auto"  # Gym env: re-enter a state by snapshot/restore when it has them (auto), or replay
    episode_timeout_s: float = Field(300.0, gt=0, le=86_400)  # an episode (a Gym env: its calls in all) longer fails
    partial_credit: bool = False  # Gym env: an episode cut by max_steps scores its rewards so far (clipped), not 0
    episodes: str | None = None  # JSONL of episodes to load; None: generate count tasks
    count: int = Field(64, ge=0, le=10**6)  # tasks to generate, or at most this many from episodes (there 0: all)
    seed: int = Field(0, ge=0, lt=2**32)  # seed of the first generated task (then seed + 1, ...)
    sam: SamTaskParams = SamTaskParams()
    dialogue: DialogueParams = DialogueParams()
    proactive: ProactiveParams = ProactiveParams()

    @model_validator(mode="after")
    def _known_family(self) -> TaskSetConfig:
        reg = family_of(self)
        if self.entry is not None and reg.name and self.family != reg.name:
            self.family = reg.name  # a registered class named by path: its registered name (config.yaml shows it)
        elif self.entry is not None and not reg.name and self.family not in ("gym", "episode"):
            self.family = task_kind(reg.obj)  # an unregistered Gym class / episode function
        if reg.config is not None and reg.extra.get("section", "params") == "params":
            try:
                reg.config.model_validate(self.params)
            except Exception as exc:
                raise ValueError(f"params: not valid for task family {self.family!r}: {exc}") from None
        if reg.extra.get("kind") == "gym":  # its constructor's keyword arguments: checked now, not at every reset
            check_params(reg.obj, _family_params(self, reg, as_kwargs=True), "the Gym-style environment", "params")
        return self


def family_of(cfg: TaskSetConfig) -> Registration[Any]:
    """The registration of a task set's family (an ``entry`` is imported; an unregistered Gym class or episode
    function gets an unnamed registration of its kind). A :class:`ComponentError` names an unknown family or a
    component missing part of its protocol."""
    if cfg.entry is not None:
        reg = TASK_FAMILIES.get(cfg.entry)
        if not reg.name:
            kind = task_kind(reg.obj)
            if kind == "env":
                raise ComponentError(
                    f"task entry {cfg.entry!r} is a task class of memrl's own interface: register it "
                    f"with @register_task(name, params=...) so its parameters can be validated"
                )
            reg = Registration(name="", obj=reg.obj, entry=cfg.entry, extra={"kind": kind})
        return reg
    if cfg.family in ("gym", "episode"):
        raise ComponentError(
            f"task family {cfg.family!r} needs entry: 'package.module:Name' naming the "
            f"{'Gym-style environment class' if cfg.family == 'gym' else 'async episode function'}"
        )
    return TASK_FAMILIES.get(cfg.family)


def _family_params(cfg: TaskSetConfig, reg: Registration[Any], as_kwargs: bool = False) -> Any:
    section = reg.extra.get("section", "params")
    if section != "params":
        return getattr(cfg, section)
    params = reg.config.model_validate(cfg.params) if reg.config is not None else dict(cfg.params)
    if as_kwargs and isinstance(params, ConfigModel):
        return params.model_dump(mode="json")
    return params


def load_tasks(cfg: TaskSetConfig, prefix: str = "task") -> list[Any]:
    """The tasks of ``cfg`` (deterministic); ids are ``<prefix>-<seed>`` for generated tasks."""
    reg = family_of(cfg)
    kind = reg.extra.get("kind", "env")
    if cfg.episodes:
        if kind != "env":
            raise ConfigError(
                f"episodes: {cfg.episodes} holds episodes of memrl's own task families; a "
                f"{kind} family ({cfg.family}) generates its tasks from count and seed"
            )
        tasks = [task_from_episode(e) for e in read_jsonl(cfg.episodes, Episode) if e.env is not None]
        tasks = [t for t in tasks if t.family == cfg.family]
        if not tasks:
            raise ConfigError(f"{cfg.episodes}: no {cfg.family} episodes in the file")
        return tasks[: cfg.count] if cfg.count else tasks
    params = _family_params(cfg, reg)
    max_steps = cfg.max_steps or reg.extra.get("max_steps")

    def make(seed: int) -> Any:
        task_id = f"{prefix}-{seed}"
        if kind == "env":
            return reg.obj(params, seed=seed, task_id=task_id)
        kwargs = params.model_dump(mode="json") if isinstance(params, ConfigModel) else dict(params)
        if kind == "gym":
            return GymTask(
                GymFactory(reg.obj, kwargs),
                seed=seed,
                task_id=task_id,
                family=cfg.family,
                max_steps=max_steps,
                reentry=cfg.reentry,
                timeout_s=cfg.episode_timeout_s,
                partial_credit=cfg.partial_credit,
            )
        if kind == "episode":
            return ExternalTask(
                kind="episode",
                family=cfg.family,
                params=kwargs,
                seed=seed,
                task_id=task_id,
                max_steps=max_steps or 64,
                entry=reg.entry,
                timeout_s=cfg.episode_timeout_s,
            )
        return reg.obj(params, seed=seed, task_id=task_id)  # an HTTP-agent family

    # generating a task runs its reference agent (milliseconds each): a large count gets a bar and a time estimate
    seeds = progress_bar(
        range(cfg.seed, cfg.seed + cfg.count),
        desc=f"{prefix} tasks",
        leave=False,
        work=f"{cfg.count:,} {cfg.family} tasks to generate",
    )
    return [make(seed) for seed in seeds]
