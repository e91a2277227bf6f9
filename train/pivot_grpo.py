"""``memrl train pivot-grpo``: pivot-turn GRPO for the proactive intervention agent ("Remember When It Matters:
Proactive Memory Agent for Long-Horizon Agents", section 4.5).

The policy is the memory agent (typically the SFT model); the action agent stays frozen (scripted on CPU, or
``placement.reasoner``'s OpenAI-compatible endpoints: the paper's Qwen3.5-122B-A10B). The tasks are the proactive
family by default, or any task family or a user's Gym-style environment named as OAT-GRPO names it
(``train_tasks: {entry: "pkg.mod:MyEnv", params: {...}, max_steps: N}``; ``eval_tasks`` naming no family takes
train_tasks' on seeds from 100000); pivot states are re-entered by checked replay, or by the environment's own
snapshot/restore when a branch is forked (:mod:`memrl.rollout.pivots`). Set ``reasoner`` to the environment's action
agent and ``pivots.detect.prefilter`` to filters that fire on it (``every_step: true`` for a small game).

:func:`run_pivot_grpo` is the whole recipe, written over the online loop OAT-GRPO runs on
(:class:`~memrl.train.online.OnlineLoop`: resume, checkpoints, bounded staleness, the one weight-sync path): setup,
then per iteration, top to bottom,

1. **collect**: every ``pivots.every`` iterations the pivot pool is refreshed (:func:`refresh_pool`): offline
   labelled rollouts of ``pivots.tasks`` training tasks with the current policy, pre-filtered candidate steps,
   counterfactual resampling over every bank entry within a logged budget (:mod:`memrl.rollout.pivots`), written under
   ``<run_dir>/pivots/r<NNNN>/`` (``rollouts.jsonl``, ``pivots.jsonl``, then ``COMPLETE``) so a resumed run reloads
   the pool it was training on. Then :func:`draw_sites` picks ``groups.pivots_per_iteration`` pivots (plus
   ``non_pivots_per_iteration`` labelled non-pivots; with ``groups.at: all_turns``, the ablation, no detection runs
   and the sites are that many memory steps of the labelled rollouts, pivots or not), and G samples are drawn at each
   from the restored state, every one continued to the end;
2. **credit and groups**: :func:`memrl.rewards.groups.pivot_groups` scores each sample (:mod:`memrl.rewards.pivot`:
   verifier outcome minus the optional per-reminder cost and the format penalty) and builds the trainer groups with
   group-relative advantages;
3. **update** (:class:`~memrl.train.group_trainer.GroupTrainer`), 4. **sync** (the new version into the rollout
   engine: LoRA hot-swap or in-place full weights), 5. **log** (and evaluate when due), 6. **checkpoint**.

``--resume`` continues from the newest complete checkpoint as OAT-GRPO does; the pivot pool needs nothing in the
checkpoint: a refresh is a pure function of (seed, refresh, the policy that labels it), and a completed one is
reloaded from its folder. With ``loop.max_staleness: k`` the collection of iteration ``i + k`` (its refresh included)
runs under the policy of iteration ``i``, before that iteration's update, and the trainer weights it by truncated
importance sampling; the collection runs in this process, so k buys no overlap here, only the same semantics as an
OAT-GRPO run.

**Evaluation** (:func:`evaluate_policy`): held-out pass rate at the rollout temperature (and greedy), reminders per
episode and the action agent's tokens, beside the no-memory baseline and the SFT agent (the policy before the first
update); written to ``baselines.json`` once, so a resumed run compares against the same numbers (a run started in a
directory that already holds one, e.g. a second variant from the same SFT model, reuses its evaluation of the
starting policy).

Phase 1 (``bank_edit``) is served by the policy too unless ``phase1`` names another engine (e.g. the scripted bank
writer, when only Phase 2 is trained). ``summary.json`` holds the evaluations, the baselines and the action agent's
tokens.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
from pydantic import BeforeValidator, Field, model_validator

from memrl.data.config import ConfigError, ConfigModel, PlacementConfig, RunConfig
from memrl.data.io import atomic_write_text, read_jsonl, write_jsonl
from memrl.data.run_dir import shared_run_dir
from memrl.data.schemas import Episode, TokenUsage
from memrl.data.tasks import ProactiveTask, TaskSetConfig, family_of, load_tasks, task_from_episode
from memrl.data.tracking import MetricsLogger
from memrl.rewards.groups import pivot_groups
from memrl.rewards.pivot import PivotRewardConfig
from memrl.rollout.agents import task_rollout
from memrl.rollout.engines.base import Engine
from memrl.rollout.engines.config import EngineConfig, place_policy_engine, served_engine
from memrl.rollout.engines.factory import build_engine
from memrl.rollout.loop import EngineSet, run_rollouts
from memrl.rollout.memory.base import RoleSampling
from memrl.rollout.memory.proactive import ProactiveConfig
from memrl.rollout.memory.workflow import action_of
from memrl.rollout.pivots import (
    DetectConfig,
    LabelledRollout,
    PivotGroupConfig,
    PivotGroupResult,
    PivotRecord,
    detect_pivots,
    detection_scores,
    every_turn,
    label_rollouts,
    sample_pivot_groups,
)
from memrl.train.group_trainer import GroupTrainer, GroupTrainerConfig, make_accelerator
from memrl.train.online import LoopConfig, OnlineLoop, check_staleness_placement, stale_sampling_tis
from memrl.train.policy import PolicySpec

log = logging.getLogger(__name__)

__all__ = [
    "PivotEvalConfig",
    "PivotGRPOConfig",
    "PivotPool",
    "PivotRefreshConfig",
    "PivotRun",
    "PivotTaskSet",
    "ProactiveTaskSetConfig",
    "draw_sites",
    "evaluate_policy",
    "evaluate_proactive",
    "group_metrics",
    "load_task_set",
    "refresh_pool",
    "run_pivot_grpo",
    "setup_pivot_grpo",
]


class ProactiveTaskSetConfig(ConfigModel):
    """Proactive tasks: ``count`` generated ones (``params``, seeds ``seed_start`` ...), or the proactive episodes of
    a JSONL file (``episodes``: e.g. ``memrl data synth`` output; ``count`` caps them)."""

    params: dict[str, Any] = {}  # ProactiveParams of generated tasks
    seed_start: int = 0  # seed of the first generated task (then +1, ...)
    count: int = Field(32, ge=1, le=10**6)  # tasks to generate, or at most this many from episodes
    episodes: str | None = None  # JSONL whose proactive episodes are the tasks; None: generate

    def load(self) -> list[ProactiveTask]:
        """The tasks, built from their specs."""
        if self.episodes is None:
            return [ProactiveTask(self.params, seed=self.seed_start + i) for i in range(self.count)]
        path = Path(self.episodes)
        if not path.is_file():
            raise ConfigError(f"episodes file not found: {path}")
        tasks = []
        for episode in read_jsonl(path, Episode):
            if episode.env is not None and episode.env.name == "proactive":
                task = task_from_episode(episode)
                assert isinstance(task, ProactiveTask)
                tasks.append(task)
        if not tasks:
            raise ConfigError(f"{path} holds no proactive episode")
        return tasks[: self.count]


def _task_set_form(value: Any) -> str:
    """Which form a task set is written in: a registered family or a user's component (``family`` / ``entry``: a
    :class:`~memrl.data.tasks.TaskSetConfig`), or the proactive task set (:class:`ProactiveTaskSetConfig`)."""
    if isinstance(value, TaskSetConfig) or (isinstance(value, dict) and {"family", "entry"} & value.keys()):
        return "family"
    return "proactive"


def _task_set(value: Any) -> Any:
    """A task set validated as the form it is written in (:func:`_task_set_form`; errors name the set's own keys)."""
    if isinstance(value, (ProactiveTaskSetConfig, TaskSetConfig)):
        return value
    return (TaskSetConfig if _task_set_form(value) == "family" else ProactiveTaskSetConfig).model_validate(value)


PivotTaskSet = Annotated[ProactiveTaskSetConfig | TaskSetConfig, BeforeValidator(_task_set)]
"""A pivot run's task set: the proactive tasks (the default form), or any family of memrl's task interface or a
user's Gym-style environment named as in ``memrl train oat-grpo`` (``{entry: "pkg.mod:MyEnv", params: ...}``)."""


def load_task_set(cfg: ProactiveTaskSetConfig | TaskSetConfig, prefix: str) -> list[Any]:
    """The tasks of a pivot run's task set (ids ``<prefix>-<seed>`` for a family's generated tasks)."""
    return cfg.load() if isinstance(cfg, ProactiveTaskSetConfig) else load_tasks(cfg, prefix)


class PivotRefreshConfig(ConfigModel):
    """How the pivot pool is (re)built with the current policy."""

    every: int = Field(5, ge=1, description="iterations between pivot refreshes")
    tasks: int = Field(16, ge=1, description="training tasks labelled per refresh")
    detect: DetectConfig = DetectConfig()


class PivotEvalConfig(ConfigModel):
    """Held-out evaluation of the memory agent."""

    temperature: float | None = Field(None, ge=0, description="None: the memory roles' rollout temperature")
    greedy: bool = True  # also evaluate greedy decoding
    repeats: int = Field(1, ge=1, description="rollouts per task (different seeds)")
    no_memory_baseline: bool = True  # also evaluate the no_memory variant once, as a baseline


class PivotGRPOConfig(ConfigModel):
    """Config of ``memrl train pivot-grpo``."""

    command: Literal["train pivot-grpo"] = "train pivot-grpo"  # the command this config is for
    run: RunConfig = RunConfig()
    placement: PlacementConfig = PlacementConfig()
    policy: PolicySpec
    engine: EngineConfig = Field(description="the policy's rollout engine (vllm or hf on the policy's base)")
    reasoner: EngineConfig = EngineConfig(
        backend="scripted", name="action-agent", scripted_policy="memrl.data.tasks.proactive:ActionAgent"
    )
    reasoner_sampling: RoleSampling = RoleSampling(temperature=0.0, max_tokens=256)
    phase1: EngineConfig | None = Field(None, description="engine for Phase 1 (None: the policy serves it)")
    memory: ProactiveConfig = ProactiveConfig()
    train_tasks: PivotTaskSet = ProactiveTaskSetConfig()
    eval_tasks: PivotTaskSet = ProactiveTaskSetConfig(seed_start=100_000)  # a family's: train_tasks' on other seeds
    pivots: PivotRefreshConfig = PivotRefreshConfig()
    groups: PivotGroupConfig = PivotGroupConfig()
    reward: PivotRewardConfig = PivotRewardConfig()
    trainer: GroupTrainerConfig = GroupTrainerConfig()
    loop: LoopConfig = LoopConfig()
    eval: PivotEvalConfig = PivotEvalConfig()

    @model_validator(mode="before")
    @classmethod
    def _eval_tasks_of_the_training_family(cls, data: Any) -> Any:
        """With a family's train_tasks (``family`` / ``entry``), eval_tasks naming none takes train_tasks' family on
        its own seeds (default 100000), as ``memrl train oat-grpo`` does."""
        if not isinstance(data, dict) or _task_set_form(data.get("train_tasks")) != "family":
            return data
        evals = data.get("eval_tasks", {})
        if _task_set_form(evals) == "family" or not isinstance(evals, dict):
            return data
        train = data["train_tasks"]
        train = train.model_dump(exclude_unset=True) if isinstance(train, TaskSetConfig) else dict(train)
        inherited = {k: train[k] for k in ("family", "entry", "params", "max_steps", "reentry") if k in train}
        return {**data, "eval_tasks": {"seed": 100_000, **inherited, **evals}}

    @model_validator(mode="after")
    def _consistent(self) -> PivotGRPOConfig:
        if self.engine.backend not in ("vllm", "hf"):
            raise ValueError("engine: the policy's rollout engine must be 'vllm' or 'hf' (it loads the synced weights)")
        if self.groups.phases == "phase1+2" and self.phase1 is not None:
            raise ValueError("groups.phases 'phase1+2' trains Phase 1: it must be served by the policy (phase1: null)")
        if self.memory.variant != "full":
            raise ValueError("pivot-turn GRPO trains the full two-phase agent: memory.variant must be 'full'")
        for key in ("train_tasks", "eval_tasks"):
            tasks = getattr(self, key)
            if isinstance(tasks, TaskSetConfig) and tasks.count == 0 and tasks.episodes is None:
                raise ValueError(f"{key}.count: generated tasks need a count of at least 1 (got 0)")
            if isinstance(tasks, TaskSetConfig) and (kind := family_of(tasks).extra.get("kind")) in ("episode", "http"):
                raise ValueError(
                    f"{key}: pivot-turn GRPO runs the proactive memory agent in memrl's agent loop, so "
                    f"its tasks are a family of memrl's task interface or a Gym-style environment; "
                    f"{tasks.entry or tasks.family!r} is an {kind} family (its agent loop is its own)"
                )
        if (trainer := stale_sampling_tis(self.trainer, self.loop)) is not self.trainer:
            self.trainer = trainer  # k >= 1: truncated IS on, and config.yaml shows it
        return self


# ----------------------------------------------------------------------------------------------------------------
# Engines


def _reasoner_config(cfg: PivotGRPOConfig) -> EngineConfig:
    """The frozen action agent: ``placement.reasoner``'s endpoints when set (with ``cfg.reasoner``'s client settings
    when it is an ``openai`` engine), else ``cfg.reasoner``."""
    served = cfg.placement.reasoner
    return cfg.reasoner if served is None else served_engine(served, cfg.reasoner, cfg.reasoner.name or "action-agent")


def _with_truths(engine: Engine, tasks: list[Any]) -> Engine:
    """Give a scripted oracle the ground truth of the run's tasks that know it (it looks it up by task id)."""
    truths = getattr(getattr(engine, "policy", None), "truths", None)
    if isinstance(truths, dict):
        truths.update({t.task_id: t.truth() for t in tasks if callable(getattr(t, "truth", None))})
    return engine


def build_engines(cfg: PivotGRPOConfig, tasks: list[Any]) -> tuple[EngineSet, Engine]:
    """(the run's engines, the policy's rollout engine)."""
    policy = build_engine(place_policy_engine(cfg.engine, cfg.placement.policy))
    reasoner = _with_truths(build_engine(_reasoner_config(cfg)), tasks)
    by_role = {"bank_edit": _with_truths(build_engine(cfg.phase1), tasks)} if cfg.phase1 is not None else {}
    return EngineSet(reasoner=reasoner, memory=policy, by_role=by_role), policy


# ----------------------------------------------------------------------------------------------------------------
# Evaluation


def _at_temperature(memory: ProactiveConfig, temperature: float | None) -> ProactiveConfig:
    if temperature is None:
        return memory
    sampling = {role: s.model_copy(update={"temperature": temperature}) for role, s in memory.sampling.items()}
    return memory.model_copy(update={"sampling": sampling})


def evaluate_proactive(
    tasks: list[Any],
    engines: EngineSet,
    memory: ProactiveConfig,
    *,
    seed: int = 0,
    repeats: int = 1,
    reasoner_sampling: RoleSampling | None = None,
) -> dict[str, float]:
    """Pass rate, reminders per episode, double-checks per episode and the action agent's tokens of ``memory`` on
    ``tasks`` (``repeats`` rollouts each, seeds ``seed`` ...)."""
    rollouts = [
        task_rollout(task, memory, seed=seed + r, rollout_id=f"eval{r}", reasoner_sampling=reasoner_sampling)
        for r in range(repeats)
        for task in tasks
    ]
    traces = run_rollouts(rollouts, engines)
    n = len(traces)
    usage = sum((t.reasoner_usage for t in traces), TokenUsage())
    return {
        "pass_rate": sum(t.outcome or 0.0 for t in traces) / n,
        "reminders_per_episode": sum(t.stats.get("reminders_injected", 0) for t in traces) / n,
        "double_checks_per_episode": sum(
            sum(e.kind == "act" and action_of(e.reply) == "pwd" for e in t.events) for t in traces
        )
        / n,
        "action_tokens": float(usage.spent),
    }


# ----------------------------------------------------------------------------------------------------------------
# The steps of an iteration (each called once, in order, from run_pivot_grpo)


@dataclass
class PivotPool:
    """One refresh's labelled rollouts and the group sites drawn from: detected pivots and labelled non-pivots (with
    ``groups.at: all_turns`` every memory step, unlabelled, sits in ``negatives``)."""

    refresh: int
    records: dict[str, LabelledRollout]
    pivots: list[PivotRecord]
    negatives: list[PivotRecord]
    stats: dict[str, float] = field(default_factory=dict)  # the refresh's metrics (stats.json when reloaded)


def refresh_pool(cfg: PivotGRPOConfig, run_dir: Path, engines: EngineSet, tasks: list[Any], r: int) -> PivotPool:
    """The pool of refresh ``r``: reloaded (with its metrics) when a previous process completed it, else labelled and
    detected now with the current policy and written under ``<run_dir>/pivots/r<NNNN>/`` (``COMPLETE`` last)."""
    folder = run_dir / "pivots" / f"r{r:04d}"
    if (folder / "COMPLETE").exists():
        records, labels = (
            read_jsonl(folder / "rollouts.jsonl", LabelledRollout),
            read_jsonl(folder / "pivots.jsonl", PivotRecord),
        )
        return PivotPool(
            r,
            {x.record_id: x for x in records},
            [p for p in labels if p.is_pivot],
            [p for p in labels if not p.is_pivot],
            json.loads((folder / "stats.json").read_text()),
        )
    rng = random.Random(f"{cfg.run.seed}/refresh/{r}")
    order = rng.sample(range(len(tasks)), len(tasks))
    chosen = [tasks[order[i % len(order)]] for i in range(cfg.pivots.tasks)]
    records = label_rollouts(
        chosen,
        engines,
        cfg.memory,
        prefilter=cfg.pivots.detect.prefilter,
        rollout_id=f"r{r}",
        seed=cfg.run.seed * 100_003 + r,
        reasoner_sampling=cfg.reasoner_sampling,
    )
    labelling = sum((rec.reasoner_usage for rec in records), TokenUsage()).spent
    stats = {"refresh_label_pass_rate": sum(rec.outcome for rec in records) / len(records)}
    if cfg.groups.at == "all_turns":  # no detection: every memory step is a group site
        labels = every_turn(records)
        stats.update({"refresh_turns": float(len(labels)), "refresh_action_tokens": float(labelling)})
    else:
        labels, cost = detect_pivots(
            records, engines, cfg.pivots.detect, salt=r + 1, tasks={t.task_id: t for t in tasks}
        )
        required = detection_scores(records, labels, lambda p: bool(p.get("requirement")))
        stats.update({f"refresh_{k}": v for k, v in cost.items() if k != "action_tokens"})
        stats.update(
            {
                "refresh_recall": detection_scores(records, labels)["recall"],
                "refresh_precision": detection_scores(records, labels)["precision"],
                "refresh_requirement_recall": required["recall"],
                "refresh_action_tokens": cost["action_tokens"] + labelling,
            }
        )  # labelling + counterfactuals
    write_jsonl(folder / "rollouts.jsonl", records)
    write_jsonl(folder / "pivots.jsonl", labels)
    atomic_write_text(folder / "stats.json", json.dumps(stats, indent=1) + "\n")
    atomic_write_text(folder / "COMPLETE", "ok\n")
    return PivotPool(
        r,
        {x.record_id: x for x in records},
        [p for p in labels if p.is_pivot],
        [p for p in labels if not p.is_pivot],
        stats,
    )


def draw_sites(pool: PivotPool, cfg: PivotGroupConfig, seed: int, iteration: int) -> list[PivotRecord]:
    """This iteration's group sites, a pure function of the seed and the iteration: ``pivots_per_iteration`` pivots
    and ``non_pivots_per_iteration`` labelled non-pivots (``at: all_turns``: that many memory steps, any)."""
    rng = random.Random(f"{seed}/groups/{iteration}")
    if cfg.at == "all_turns":
        sites = cfg.pivots_per_iteration + cfg.non_pivots_per_iteration
        return rng.sample(pool.negatives, min(sites, len(pool.negatives)))
    chosen = rng.sample(pool.pivots, min(cfg.pivots_per_iteration, len(pool.pivots)))
    return chosen + rng.sample(pool.negatives, min(cfg.non_pivots_per_iteration, len(pool.negatives)))


def group_metrics(pool: PivotPool, results: list[PivotGroupResult], *, refresh: bool = True) -> dict[str, float]:
    """What the sampled groups did: pool size, success and reminder rates at pivots and elsewhere, the action agent's
    tokens spent (``action_tokens`` adds the pool's labelling and detection with ``refresh``: in the refresh's first
    iteration only, so a sum over iterations counts them once)."""
    at_pivots = [s for g in results if g.metadata["is_pivot"] for s in g.samples]
    others = [s for g in results if not g.metadata["is_pivot"] for s in g.samples]
    spent = float(sum((s.usage for g in results for s in g.samples), TokenUsage()).spent)
    return {
        "pivot_pool": float(len(pool.pivots)),
        "pivot_groups": float(len(results)),
        "planted_group_fraction": sum(g.metadata["planted"] for g in results) / len(results) if results else 0.0,
        "non_pivot_reminder_rate": sum(s.reminder is not None for s in others) / len(others) if others else 0.0,
        "pivot_success": sum(s.outcome for s in at_pivots) / len(at_pivots) if at_pivots else 0.0,
        "pivot_reminder_rate": sum(s.reminder is not None for s in at_pivots) / len(at_pivots) if at_pivots else 0.0,
        "group_action_tokens": spent,
        "action_tokens": spent + (pool.stats.get("refresh_action_tokens", 0.0) if refresh else 0.0),
    }


def evaluate_policy(
    cfg: PivotGRPOConfig, engines: EngineSet, tasks: list[Any], run_dir: Path, iteration: int
) -> dict[str, Any]:
    """The policy on the held-out tasks (sampled, and greedy with ``eval.greedy``) beside the no-memory and SFT
    baselines of ``baselines.json``; before the first update (``iteration`` -1) it writes them, or reuses the
    start's evaluation a run from the same SFT model left there."""
    path = run_dir / "baselines.json"
    baselines: dict[str, float] = json.loads(path.read_text()) if path.exists() else {}

    def run(memory: ProactiveConfig) -> dict[str, float]:
        return evaluate_proactive(
            tasks, engines, memory, seed=cfg.run.seed, repeats=cfg.eval.repeats, reasoner_sampling=cfg.reasoner_sampling
        )

    start = {k[len("sft_") :]: v for k, v in baselines.items() if k.startswith("sft_")}
    if iteration < 0 and "pass_rate" in start and ("greedy_pass_rate" in start or not cfg.eval.greedy):
        out: dict[str, Any] = start
    else:
        out = dict(run(_at_temperature(cfg.memory, cfg.eval.temperature)))
        if cfg.eval.greedy:
            out.update({f"greedy_{k}": v for k, v in run(_at_temperature(cfg.memory, 0.0)).items()})
    if iteration < 0:
        if "no_memory_pass_rate" not in baselines and cfg.eval.no_memory_baseline:
            baselines["no_memory_pass_rate"] = run(cfg.memory.model_copy(update={"variant": "no_memory"}))["pass_rate"]
        baselines.update({f"sft_{k}": v for k, v in out.items() if f"sft_{k}" not in baselines})
        atomic_write_text(path, json.dumps(baselines, indent=1, sort_keys=True) + "\n")
    for name in ("no_memory", "sft"):
        if f"{name}_pass_rate" in baselines:
            out[f"{name}_pass_rate"] = baselines[f"{name}_pass_rate"]
            out[f"gain_over_{name}"] = out["pass_rate"] - baselines[f"{name}_pass_rate"]
    return out


# ----------------------------------------------------------------------------------------------------------------
# The recipe


@dataclass
class PivotRun:
    """What a pivot-turn GRPO run holds across iterations, built by :func:`setup_pivot_grpo`: the trainer, the engines
    (main process only), the task sets, the logger, the loop's bookkeeping and the current pivot pool."""

    cfg: PivotGRPOConfig
    run_dir: Path
    trainer: GroupTrainer
    engines: EngineSet | None
    loop: OnlineLoop
    train_tasks: list[Any]
    eval_tasks: list[Any]
    logger: MetricsLogger | None
    pool: PivotPool | None = None

    def launch(self, iteration: int) -> tuple[list[PivotGroupResult], dict[str, Any]]:
        """Collect iteration ``iteration`` with the policy the engine holds now: the pool of its refresh (built, or
        reloaded from disk), then G samples at each of its sites, every one continued to the end. The refresh's
        metrics (and its action-agent tokens) go with the refresh's first iteration only, so a run resumed anywhere
        logs them once, as an uninterrupted run does."""
        cfg, engines = self.cfg, self.engines
        assert engines is not None, "launch runs on the main process"
        refresh = iteration // cfg.pivots.every
        if self.pool is None or self.pool.refresh != refresh:
            self.pool = refresh_pool(cfg, self.run_dir, engines, self.train_tasks, refresh)
        first = iteration == refresh * cfg.pivots.every
        sites = draw_sites(self.pool, cfg.groups, cfg.run.seed, iteration)
        results = sample_pivot_groups(
            sites,
            self.pool.records,
            engines,
            cfg.groups,
            salt=iteration,
            tasks={t.task_id: t for t in self.train_tasks},
        )
        return results, {**(self.pool.stats if first else {}), **group_metrics(self.pool, results, refresh=first)}

    def evaluate(self, iteration: int) -> dict[str, Any]:
        """The policy on the held-out tasks beside the baselines (:func:`evaluate_policy`)."""
        assert self.engines is not None, "evaluation runs on the main process"
        return evaluate_policy(self.cfg, self.engines, self.eval_tasks, self.run_dir, iteration)

    def close(self) -> None:
        """Finish the logger and close every engine once."""
        if self.logger is not None:
            self.logger.close()
        if self.engines is not None:
            engines = self.engines
            for engine in {id(e): e for e in (engines.reasoner, engines.memory, *engines.by_role.values())}.values():
                engine.close()


def setup_pivot_grpo(cfg: PivotGRPOConfig, run_dir: Path, accelerator: Any = None) -> PivotRun:
    """The trainer, the engines (the policy's rollout engine, the frozen action agent, Phase 1's engine), the task
    sets and the loop of a pivot-turn GRPO run."""
    trainer = GroupTrainer(cfg.policy, cfg.trainer, accelerator=accelerator)
    main = trainer.accelerator.is_main_process
    check_staleness_placement(cfg.loop, cfg.placement.policy, torch.cuda.is_available())
    train_tasks, eval_tasks = load_task_set(cfg.train_tasks, "train"), load_task_set(cfg.eval_tasks, "eval")
    engines, policy_engine = build_engines(cfg, train_tasks + eval_tasks) if main else (None, None)
    logger = (
        MetricsLogger(run_dir, cfg.run.wandb, cfg.model_dump(mode="json"), name=run_dir.name, logging=cfg.run.logging)
        if main
        else None
    )
    loop = OnlineLoop.for_recipe(cfg, trainer, policy_engine, run_dir, logger, desc="pivot-grpo")
    return PivotRun(cfg, run_dir, trainer, engines, loop, train_tasks, eval_tasks, logger)


def run_pivot_grpo(cfg: PivotGRPOConfig) -> int:
    """Run pivot-turn GRPO (see the module docstring) on the shared online loop; writes ``summary.json`` into the run
    directory. One iteration: collect (refresh the pivot pool when due, G samples at this iteration's sites, every one
    continued to the end) -> credit and groups (pivot rewards, group advantages) -> update -> sync -> log ->
    checkpoint."""
    accelerator = make_accelerator(cfg.trainer)
    run_dir = shared_run_dir(cfg, cfg.run, cfg.command, accelerator)
    run = setup_pivot_grpo(cfg, run_dir, accelerator)
    loop, main = run.loop, accelerator.is_main_process
    try:
        for iteration in loop.start(run.launch, run.evaluate):
            # collect: the pool of this refresh, then G samples at each of this iteration's sites (k ahead with
            # max_staleness)
            results, metrics = loop.collected(iteration, run.launch)
            # credit and groups: r = outcome - reminder cost - format penalty, group-relative advantages
            groups = pivot_groups(results, cfg.reward) if main else None
            update = loop.update(groups)  # every process: pi_old / pi_ref scoring, optimizer steps
            sync = loop.sync(iteration)  # the new policy version into the rollout engine
            loop.log(iteration, {**metrics, **update, **sync}, run.evaluate)  # held-out evaluation when due
            loop.checkpoint(iteration)
    finally:
        run.close()
    result = loop.result()
    if main and not result.stopped:  # a sitting's end writes no summary
        evals, history = result.evals, result.history
        atomic_write_text(
            run_dir / "summary.json",
            json.dumps(
                {
                    "iterations_run": result.iterations_run,
                    "updates": result.updates,
                    "policy_version": result.policy_version,
                    "policy_dir": result.policy_dir,
                    "before": evals[0] if evals and evals[0]["iteration"] == -1 else None,
                    "after": evals[-1] if evals else None,
                    "training_action_tokens": sum(h.get("action_tokens", 0.0) for h in history),
                    "history": history,
                },
                indent=1,
            )
            + "\n",
        )
    return 0
