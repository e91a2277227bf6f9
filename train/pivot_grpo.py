"""``memrl train pivot-grpo``: pivot-turn GRPO for the proactive intervention agent (seed 003 section 4.5).

The policy is the memory agent (typically the SFT model); the action agent stays frozen (scripted on CPU, or
``placement.reasoner``'s OpenAI-compatible endpoints: the paper's Qwen3.5-122B-A10B). The shared online loop
(:func:`memrl.train.online.run_online_loop`) runs the iterations; this module supplies its ``collect`` and ``evaluate``:

- **Pivot refresh** every ``pivots.every`` iterations: offline labelled rollouts of ``pivots.tasks`` training tasks
  with the current policy, pre-filtered candidate steps, counterfactual resampling (:mod:`memrl.rollout.pivots`). The
  labelled rollouts and every candidate's label and outcome spread are written under
  ``<run_dir>/pivots/r<NNNN>/`` (``rollouts.jsonl``, ``pivots.jsonl``, then a ``COMPLETE`` marker), so a resumed run
  reloads the pool it was training on instead of relabelling it with another policy.
- **Groups** each iteration: ``groups.pivots_per_iteration`` pivots of the pool (a pure function of the seed and
  the iteration; with ``groups.at: all_turns``, the ablation, no detection runs and the groups go to that many plus
  ``non_pivots_per_iteration`` memory steps of the labelled rollouts, pivots or not), G samples each from the
  restored state, every one continued to the end and scored by
  :mod:`memrl.rewards.pivot` (verifier outcome minus the optional per-reminder cost and the format penalty).
- **Update and sync**: the group trainer updates the policy; the loop saves it and loads it into the rollout engine
  (LoRA hot-swap or in-place full weights).
- **Evaluation**: held-out pass rate at the rollout temperature (and greedy), reminders per episode and the action
  agent's tokens, beside the no-memory baseline and the SFT agent (the policy before the first update); written to
  ``baselines.json`` once, so a resumed run compares against the same numbers (a run started in a directory that
  already holds one, e.g. a second variant from the same SFT model, reuses its evaluation of the starting policy).

Phase 1 (``bank_edit``) is served by the policy too unless ``phase1`` names another engine (e.g. the scripted oracle,
when only Phase 2 is trained). ``summary.json`` holds the evaluations, the baselines and the action agent's tokens.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from memrl.data.config import ConfigError, ConfigModel, PlacementConfig, RunConfig
from memrl.data.io import atomic_write_text, read_jsonl, write_jsonl
from memrl.data.schemas import Episode, TokenUsage
from memrl.data.tasks import ProactiveTask, task_from_episode
from memrl.data.tracking import MetricsLogger
from memrl.rewards.groups import pivot_groups
from memrl.rewards.pivot import PivotRewardConfig
from memrl.rollout.agents import build_proactive_rollout
from memrl.rollout.engines.base import Engine
from memrl.rollout.engines.config import EndpointConfig, EngineConfig, place_policy_engine
from memrl.rollout.engines.factory import build_engine
from memrl.rollout.loop import EngineSet, run_rollouts
from memrl.rollout.memory.base import RoleSampling
from memrl.rollout.memory.proactive import ProactiveConfig
from memrl.rollout.memory.workflow import action_of
from memrl.rollout.pivots import (
    DetectConfig,
    LabelledRollout,
    PivotGroupConfig,
    PivotRecord,
    detect_pivots,
    detection_scores,
    every_turn,
    label_rollouts,
    sample_pivot_groups,
)
from memrl.train.checkpoint import CheckpointManager
from memrl.train.group_trainer import GroupTrainer, GroupTrainerConfig, make_accelerator
from memrl.train.online import LoopConfig, run_online_loop, shared_run_dir, stale_sampling_tis
from memrl.train.policy import PolicySpec

__all__ = [
    "PivotEvalConfig",
    "PivotGRPOConfig",
    "PivotRefreshConfig",
    "ProactiveTaskSetConfig",
    "evaluate_memory",
    "run_pivot_grpo",
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
    reasoner: EngineConfig = EngineConfig(backend="scripted", name="action-agent",
                                          scripted_policy="memrl.data.tasks.proactive:ActionAgent")
    reasoner_sampling: RoleSampling = RoleSampling(temperature=0.0, max_tokens=256)
    phase1: EngineConfig | None = Field(None, description="engine for Phase 1 (None: the policy serves it)")
    memory: ProactiveConfig = ProactiveConfig()
    train_tasks: ProactiveTaskSetConfig = ProactiveTaskSetConfig()
    eval_tasks: ProactiveTaskSetConfig = ProactiveTaskSetConfig(seed_start=100_000)
    pivots: PivotRefreshConfig = PivotRefreshConfig()
    groups: PivotGroupConfig = PivotGroupConfig()
    reward: PivotRewardConfig = PivotRewardConfig()
    trainer: GroupTrainerConfig = GroupTrainerConfig()
    loop: LoopConfig = LoopConfig()
    eval: PivotEvalConfig = PivotEvalConfig()

    @model_validator(mode="after")
    def _consistent(self) -> PivotGRPOConfig:
        if self.engine.backend not in ("vllm", "hf"):
            raise ValueError("engine: the policy's rollout engine must be 'vllm' or 'hf' (it loads the synced weights)")
        if self.groups.phases == "phase1+2" and self.phase1 is not None:
            raise ValueError("groups.phases 'phase1+2' trains Phase 1: it must be served by the policy (phase1: null)")
        if self.memory.variant != "full":
            raise ValueError("pivot-turn GRPO trains the full two-phase agent: memory.variant must be 'full'")
        if (trainer := stale_sampling_tis(self.trainer, self.loop)) is not self.trainer:
            self.trainer = trainer  # k >= 1: truncated IS on, and config.yaml shows it
        return self


# ----------------------------------------------------------------------------------------------------------------
# Engines


def _reasoner_config(cfg: PivotGRPOConfig) -> EngineConfig:
    """The frozen action agent: ``placement.reasoner``'s endpoints when set (with ``cfg.reasoner``'s client settings
    when it is an ``openai`` engine), else ``cfg.reasoner``."""
    served = cfg.placement.reasoner
    if served is None:
        return cfg.reasoner
    if not served.endpoints:
        raise ConfigError("placement.reasoner lists no endpoints")
    client = cfg.reasoner if cfg.reasoner.backend == "openai" else None
    template = client.endpoints[0] if client is not None else EndpointConfig(url=served.endpoints[0])
    endpoints = [template.model_copy(update={"url": url, "model": served.model, "api_key_env": served.api_key_env})
                 for url in served.endpoints]
    if client is not None:
        return client.model_copy(update={"model": served.model, "endpoints": endpoints})
    return EngineConfig(backend="openai", name=cfg.reasoner.name or "action-agent", model=served.model,
                        endpoints=endpoints)


def _with_truths(engine: Engine, tasks: list[ProactiveTask]) -> Engine:
    """Give a scripted oracle the ground truth of the run's tasks (it looks it up by task id)."""
    truths = getattr(getattr(engine, "policy", None), "truths", None)
    if isinstance(truths, dict):
        truths.update({t.task_id: t.truth() for t in tasks})
    return engine


def build_engines(cfg: PivotGRPOConfig, tasks: list[ProactiveTask]) -> tuple[EngineSet, Engine]:
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


def evaluate_memory(
    tasks: list[ProactiveTask],
    engines: EngineSet,
    memory: ProactiveConfig,
    *,
    seed: int = 0,
    repeats: int = 1,
    reasoner_sampling: RoleSampling | None = None,
) -> dict[str, float]:
    """Pass rate, reminders per episode, double-checks per episode and the action agent's tokens of ``memory`` on
    ``tasks`` (``repeats`` rollouts each, seeds ``seed`` ...)."""
    rollouts = [build_proactive_rollout(task, memory, seed=seed + r, rollout_id=f"eval{r}",
                                        reasoner_sampling=reasoner_sampling)
                for r in range(repeats) for task in tasks]
    traces = run_rollouts(rollouts, engines)
    n = len(traces)
    usage = sum((t.reasoner_usage for t in traces), TokenUsage())
    return {
        "pass_rate": sum(t.outcome or 0.0 for t in traces) / n,
        "reminders_per_episode": sum(t.stats.get("reminders_injected", 0) for t in traces) / n,
        "double_checks_per_episode": sum(
            sum(e.kind == "act" and action_of(e.reply) == "pwd" for e in t.events) for t in traces) / n,
        "action_tokens": float(usage.spent),
    }


# ----------------------------------------------------------------------------------------------------------------
# The run


class _PivotCollector:
    """The loop's ``collect``: the pivot pool (refreshed every ``pivots.every`` iterations) and its groups."""

    def __init__(self, cfg: PivotGRPOConfig, run_dir: Path, engines: EngineSet, tasks: list[ProactiveTask]) -> None:
        self.cfg, self.dir, self.engines, self.tasks = cfg, run_dir / "pivots", engines, tasks
        self.refresh = -1
        self.records: dict[str, LabelledRollout] = {}
        self.pool: list[PivotRecord] = []
        self.negatives: list[PivotRecord] = []

    def _labelled(self, r: int) -> tuple[list[LabelledRollout], list[PivotRecord], dict[str, float]]:
        """The pool of refresh ``r``: reloaded when a previous process completed it (no metrics: they were logged
        with the iteration that built it), else labelled and detected now with the current policy."""
        folder = self.dir / f"r{r:04d}"
        if (folder / "COMPLETE").exists():
            return read_jsonl(folder / "rollouts.jsonl", LabelledRollout), read_jsonl(folder / "pivots.jsonl",
                                                                                      PivotRecord), {}
        cfg = self.cfg
        rng = random.Random(f"{cfg.run.seed}/refresh/{r}")
        order = list(range(len(self.tasks)))
        rng.shuffle(order)
        chosen = [self.tasks[order[i % len(order)]] for i in range(cfg.pivots.tasks)]
        records = label_rollouts(chosen, self.engines, cfg.memory, prefilter=cfg.pivots.detect.prefilter,
                                 seed=cfg.run.seed * 100_003 + r, rollout_id=f"r{r}",
                                 reasoner_sampling=cfg.reasoner_sampling)
        labelling = sum((rec.reasoner_usage for rec in records), TokenUsage())
        stats = {"refresh_label_pass_rate": sum(rec.outcome for rec in records) / len(records)}
        if cfg.groups.at == "all_turns":  # no detection: every memory step is a group site
            pivots = every_turn(records)
            stats.update({"refresh_turns": float(len(pivots)), "refresh_action_tokens": float(labelling.spent)})
        else:
            pivots, cost = detect_pivots(records, self.engines, cfg.pivots.detect, salt=r + 1)
            scores = detection_scores(records, pivots)
            required = detection_scores(records, pivots, lambda p: bool(p.get("requirement")))
            stats.update({
                "refresh_candidates": cost["candidates"],
                "refresh_continuations": cost["continuations"],
                "refresh_pivots": cost["pivots"],
                "refresh_recall": scores["recall"],
                "refresh_precision": scores["precision"],
                "refresh_requirement_recall": required["recall"],
                "refresh_action_tokens": cost["action_tokens"] + labelling.spent,  # labelling + counterfactuals
            })
        write_jsonl(folder / "rollouts.jsonl", records)
        write_jsonl(folder / "pivots.jsonl", pivots)
        atomic_write_text(folder / "stats.json", json.dumps(stats, indent=1) + "\n")
        atomic_write_text(folder / "COMPLETE", "ok\n")
        return records, pivots, stats

    def __call__(self, iteration: int) -> tuple[list[Any], dict[str, Any]]:
        cfg = self.cfg
        metrics: dict[str, Any] = {}
        r = iteration // cfg.pivots.every
        if r != self.refresh:
            records, pivots, stats = self._labelled(r)
            self.refresh, self.records = r, {rec.record_id: rec for rec in records}
            self.pool = [p for p in pivots if p.is_pivot]
            self.negatives = [p for p in pivots if not p.is_pivot]
            metrics.update(stats)
        rng = random.Random(f"{cfg.run.seed}/groups/{iteration}")
        if cfg.groups.at == "all_turns":
            sites = cfg.groups.pivots_per_iteration + cfg.groups.non_pivots_per_iteration
            # every_turn records are unlabelled (is_pivot false): the whole refresh sits in self.negatives
            chosen = rng.sample(self.negatives, min(sites, len(self.negatives)))
        else:
            chosen = rng.sample(self.pool, min(cfg.groups.pivots_per_iteration, len(self.pool)))
            chosen += rng.sample(self.negatives, min(cfg.groups.non_pivots_per_iteration, len(self.negatives)))
        results = sample_pivot_groups(chosen, self.records, self.engines, cfg.groups, salt=iteration)
        groups = pivot_groups(results, cfg.reward)
        samples = [s for g in results if g.metadata["is_pivot"] for s in g.samples]
        others = [s for g in results if not g.metadata["is_pivot"] for s in g.samples]
        spent = sum((s.usage for g in results for s in g.samples), TokenUsage()).spent
        metrics.update({
            "pivot_pool": float(len(self.pool)),
            "pivot_groups": float(len(results)),
            "planted_group_fraction": sum(g.metadata["planted"] for g in results) / len(results) if results else 0.0,
            "non_pivot_reminder_rate": sum(s.reminder is not None for s in others) / len(others) if others else 0.0,
            "pivot_success": sum(s.outcome for s in samples) / len(samples) if samples else 0.0,
            "pivot_reminder_rate": sum(s.reminder is not None for s in samples) / len(samples) if samples else 0.0,
            "group_action_tokens": float(spent),
            "action_tokens": float(spent) + metrics.get("refresh_action_tokens", 0.0),
        })
        return groups, metrics


class _Evaluator:
    """The loop's ``evaluate``: the policy on the held-out tasks, beside the no-memory and SFT baselines."""

    def __init__(self, cfg: PivotGRPOConfig, run_dir: Path, engines: EngineSet, tasks: list[ProactiveTask]) -> None:
        self.cfg, self.path, self.engines, self.tasks = cfg, run_dir / "baselines.json", engines, tasks
        self.baselines: dict[str, float] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def _run(self, memory: ProactiveConfig) -> dict[str, float]:
        e = self.cfg.eval
        return evaluate_memory(self.tasks, self.engines, memory, seed=self.cfg.run.seed, repeats=e.repeats,
                               reasoner_sampling=self.cfg.reasoner_sampling)

    def __call__(self, iteration: int) -> dict[str, Any]:
        cfg = self.cfg
        start = {k[len("sft_"):]: v for k, v in self.baselines.items() if k.startswith("sft_")}
        if iteration < 0 and "pass_rate" in start and ("greedy_pass_rate" in start or not cfg.eval.greedy):
            # the starting policy was evaluated already (a baselines.json placed in the run directory): reuse it
            out: dict[str, Any] = start
        else:
            out = dict(self._run(_at_temperature(cfg.memory, cfg.eval.temperature)))
            if cfg.eval.greedy:
                out.update({f"greedy_{k}": v for k, v in self._run(_at_temperature(cfg.memory, 0.0)).items()})
        if "no_memory_pass_rate" not in self.baselines and cfg.eval.no_memory_baseline:
            none = self._run(cfg.memory.model_copy(update={"variant": "no_memory"}))
            self.baselines["no_memory_pass_rate"] = none["pass_rate"]
        if "sft_pass_rate" not in self.baselines and iteration < 0:
            self.baselines.update({f"sft_{k}": v for k, v in out.items()})
        if iteration < 0:
            atomic_write_text(self.path, json.dumps(self.baselines, indent=1, sort_keys=True) + "\n")
        for name in ("no_memory", "sft"):
            if f"{name}_pass_rate" in self.baselines:
                out[f"{name}_pass_rate"] = self.baselines[f"{name}_pass_rate"]
                out[f"gain_over_{name}"] = out["pass_rate"] - self.baselines[f"{name}_pass_rate"]
        return out


def run_pivot_grpo(cfg: PivotGRPOConfig) -> int:
    """Run pivot-turn GRPO (see the module docstring); writes ``summary.json`` into the run directory."""
    accelerator = make_accelerator(cfg.trainer)
    run_dir = shared_run_dir(cfg, cfg.run, cfg.command, accelerator)
    main = accelerator.is_main_process
    trainer = GroupTrainer(cfg.policy, cfg.trainer, accelerator=accelerator)
    train_tasks, eval_tasks = cfg.train_tasks.load(), cfg.eval_tasks.load()
    engines, policy_engine = build_engines(cfg, train_tasks + eval_tasks) if main else (None, None)
    latest = CheckpointManager(run_dir / "checkpoints").latest() if cfg.run.resume else None
    resume_step = int(latest.name.split("-")[1]) if latest is not None else None
    logger = MetricsLogger(run_dir, cfg.run.wandb if main else None, cfg.model_dump(mode="json"), name=run_dir.name,
                           console=main, resume_from_step=resume_step if main else None)
    collect = _PivotCollector(cfg, run_dir, engines, train_tasks) if main else None
    evaluate = _Evaluator(cfg, run_dir, engines, eval_tasks) if main else None
    try:
        result = run_online_loop(
            trainer=trainer, engine=policy_engine, cfg=cfg.loop, run_dir=run_dir, resume=cfg.run.resume,
            collect=collect if collect is not None else (lambda i: ([], {})), evaluate=evaluate, logger=logger,
            desc="pivot-grpo",
        )
    finally:
        logger.close()
        if engines is not None:
            for engine in {id(e): e for e in (engines.reasoner, engines.memory, *engines.by_role.values())}.values():
                engine.close()
    if main:
        evals = result.evals
        summary = {
            "iterations_run": result.iterations_run,
            "updates": result.updates,
            "policy_version": result.policy_version,
            "policy_dir": result.policy_dir,
            "before": evals[0] if evals and evals[0]["iteration"] == -1 else None,
            "after": evals[-1] if evals else None,
            "training_action_tokens": sum(h.get("action_tokens", 0.0) for h in result.history),
            "history": result.history,
        }
        atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=1) + "\n")
    return 0
