"""``memrl train oat-grpo``: OAT-GRPO for a memory model ("SAM: State-Adaptive Memory for Long-Horizon Reasoning
Agent", arXiv 2605.24468, section 2.3), over any registered (task family, memory system, reasoner, reward terms):
SAM on the SAM tasks by default, a user's Gym environment, episode function or HTTP agent named by import path
(``train_tasks: {entry: "mypkg.env:MyTextGame"}``, docs/own_agent.md).

Each iteration builds memory-call trees with the current policy in the rollout engines (the frozen reasoner continues
every sibling), scores sibling groups with the committee (shared per parent context, cached), assigns OAT credit
r(n) = V(n) + lambda (c(n) - c_bar) and sibling-group advantages, updates the policy with the group trainer, and syncs
the new weights into the engines (train/online.py). Trees, committee scoring and credit run inside the rollout
workers (rollout/worker.py): one in this process, or with ``fleet.workers`` a Ray fleet on every node
(rollout/fleet.py). Held-out success is measured with the same rollout code.

The task family supplies the defaults: its memory system (``memory`` unset), its registered scripted reasoner
(``reasoner`` unset) and its oracle expert as the committee's reference (``committee.references`` empty); a family
without one of them needs it configured (checked before the run folder exists). ``eval_tasks`` takes the training
family when it names none.

The embedded default (tiny model, scripted reasoner, the oracle expert as committee, offline judge) needs no network;
the paper's setup swaps in endpoints for the reasoner, the committee and the judge, listed under ``placement``
(configs/oat_grpo_sam_qwen3.5-9b.yaml; the Slurm script fills them with the servers it starts). A served model in
``placement`` replaces the recipe's engine for that role and borrows its client settings when that is an ``openai``
engine. Outputs: config.yaml, metrics.jsonl (with each iteration's task ids), checkpoints/, policy/vNNNNN,
trees_last.jsonl, committee_cache/, summary.json.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict

import torch
from pydantic import Field, model_validator
from typing_extensions import Unpack

from memrl.data.config import (
    ConfigError,
    ConfigModel,
    FieldError,
    PlacementConfig,
    RunConfig,
    config_hash,
)
from memrl.data.errors import UserCodeError
from memrl.data.io import atomic_write_text, write_jsonl
from memrl.data.registry import ComponentError
from memrl.data.run_dir import shared_run_dir
from memrl.data.schemas import MemoryCallTree, episode_won
from memrl.data.tasks import TaskSetConfig, family_of, load_tasks
from memrl.data.tracking import MetricsLogger
from memrl.data.user_code import check_params
from memrl.rewards.committee import Committee, CommitteeConfig
from memrl.rewards.credit import CreditConfig, informative_groups
from memrl.rewards.groups import credit_and_groups
from memrl.rollout.agents import task_rollout
from memrl.rollout.engines.config import EngineConfig, place_policy_engine, scripted_policy_class, served_engine
from memrl.rollout.engines.factory import build_sticky_engine
from memrl.rollout.episodes import close_drivers
from memrl.rollout.evaluation.tasks import FAILURE_STATS, evaluate_memory
from memrl.rollout.fleet import FleetConfig, FleetResult, build_fleet
from memrl.rollout.loop import EngineSet, Rollout
from memrl.rollout.memory.base import RoleSampling
from memrl.rollout.memory.registry import MemoryConfig, family_memory, parse_memory_config
from memrl.rollout.tree import TreeConfig, check_trained_sampling
from memrl.rollout.worker import Scorer, WorkerSpec
from memrl.train.group_trainer import GroupTrainer, GroupTrainerConfig, make_accelerator
from memrl.train.online import LoopConfig, OnlineLoop, check_staleness_placement, stale_sampling_tis
from memrl.train.policy import PolicySpec
from memrl.train.weight_sync import InMemoryWeightSync

__all__ = [
    "OATGRPOConfig",
    "RunOptions",
    "check_inputs",
    "load_sam_tasks",
    "run_oat_grpo",
    "summarize_eval",
    "train_oat_grpo",
]

NO_REASONER = "memrl.rollout.episodes:NoReasoner"  # an episode/HTTP family's reasoner when none is configured

log = logging.getLogger(__name__)


class CommitteeSetup(ConfigModel):
    """Reference engines (empty: the synthetic task's oracle expert) and the judge (None: the offline judge)."""

    references: list[EngineConfig] = []
    judge: EngineConfig | None = None
    settings: CommitteeConfig = CommitteeConfig()


class OATGRPOConfig(ConfigModel):
    """Everything ``memrl train oat-grpo`` needs."""

    command: Literal["train oat-grpo"] = "train oat-grpo"  # the command this config is for
    run: RunConfig = RunConfig()
    placement: PlacementConfig = PlacementConfig()
    policy: PolicySpec
    engine: EngineConfig | None = None  # the policy's rollout engine; default: vLLM on policy.base
    reasoner: EngineConfig | None = None  # the frozen reasoner; default: the task family's registered scripted one
    committee: CommitteeSetup = CommitteeSetup()
    memory: MemoryConfig | None = None  # any registered memory system; None: the task family's (sam: SAM)
    train_tasks: TaskSetConfig = TaskSetConfig()
    eval_tasks: TaskSetConfig = TaskSetConfig(seed=10_000)
    tasks_per_iteration: int = Field(16, ge=1, le=10**5)  # training tasks rolled out (as trees) per iteration
    tree: TreeConfig = TreeConfig()
    credit: CreditConfig = CreditConfig()
    trainer: GroupTrainerConfig = GroupTrainerConfig()
    loop: LoopConfig = LoopConfig()
    fleet: FleetConfig = FleetConfig()  # rollout workers (Ray actors) on every node; 0 workers: this process's engine
    eval_samples: int = Field(1, ge=0)  # sampled runs per held-out task (the memory config's temperatures) + 1 greedy
    reasoner_token_budget: int | None = Field(None, ge=1)  # stop rolling out once training spent this many
    #   reasoner tokens (with max_staleness k the check sees the last k iterations' spending late)

    @model_validator(mode="before")
    @classmethod
    def _memory_of_the_family(cls, data: Any) -> Any:
        """``memory`` without ``name``/``entry`` configures the task family's default system (SAM's for SAM)."""
        if (
            isinstance(data, dict)
            and isinstance(memory := data.get("memory"), dict)
            and "name" not in memory
            and "entry" not in memory
        ):
            tasks = data.get("train_tasks", {})
            tasks = tasks if isinstance(tasks, TaskSetConfig) else TaskSetConfig.model_validate(tasks or {})
            try:
                data = {**data, "memory": {"name": default_memory(tasks), **memory}}
            except ComponentError as exc:
                raise FieldError("memory", memory, str(exc)) from None
        return data

    @model_validator(mode="after")
    def _family_defaults(self) -> OATGRPOConfig:
        if not {"family", "entry"} & self.eval_tasks.model_fields_set and (
            self.eval_tasks.family,
            self.eval_tasks.entry,
        ) != (self.train_tasks.family, self.train_tasks.entry):
            keys = ("family", "entry", "params", "max_steps", "reentry", "episode_timeout_s", "partial_credit")
            self.eval_tasks = self.eval_tasks.model_copy(update={k: getattr(self.train_tasks, k) for k in keys})
        if self.memory is None:
            try:
                self.memory = parse_memory_config({"name": default_memory(self.train_tasks)})
            except ComponentError as exc:
                raise FieldError("memory", None, str(exc)) from None
        return self

    @model_validator(mode="after")
    def _trained_roles_sampled_as_scored(self) -> OATGRPOConfig:
        for role in self.tree.branch_roles:
            sampling = getattr(self.memory, "sampling", {}).get(role, RoleSampling())
            check_trained_sampling(role, sampling.temperature, sampling.top_p)
        if (trainer := stale_sampling_tis(self.trainer, self.loop)) is not self.trainer:
            self.trainer = trainer  # k >= 1: truncated IS on, and config.yaml shows it
        return self


# ----------------------------------------------------------------------------------------------------------------
# tasks and engines


def default_memory(tasks: TaskSetConfig) -> str:
    """The memory system a task family runs by default (an episode function or an HTTP agent owns its memory:
    ``external`` only carries the sampling of its roles)."""
    return family_memory(family_of(tasks))


def load_sam_tasks(cfg: TaskSetConfig, prefix: str) -> list[Any]:
    """The tasks of a task set (kept under its old name: any registered family, see
    :func:`memrl.data.tasks.load_tasks`)."""
    return load_tasks(cfg, prefix)


def check_inputs(cfg: OATGRPOConfig) -> None:
    """Checks only this command knows (the generic ones are in launch/preflight.py), before any run folder exists:
    both task sets resolve to a family, the family has a reasoner (or one is configured), and the committee term has
    references (the family's oracle, or ``committee.references``)."""
    for key, tasks in (("train_tasks", cfg.train_tasks), ("eval_tasks", cfg.eval_tasks)):
        try:
            family_of(tasks)
        except ComponentError as exc:
            raise ConfigError(f"{key}: {exc}") from None
    reg = family_of(cfg.train_tasks)
    kind = reg.extra.get("kind", "env")
    if (
        kind in ("env", "gym")
        and cfg.reasoner is None
        and cfg.placement.reasoner is None
        and not reg.extra.get("reasoner")
    ):
        raise ConfigError(
            f"train_tasks: family {cfg.train_tasks.family!r} has no registered reasoner: set reasoner "
            f"(an engine; a scripted one names its policy by registered name or import path)"
        )
    if kind in ("env", "gym") and getattr(cfg.memory, "name", "") == "external":
        raise ConfigError(
            "memory: external is the memory of an episode function or an HTTP agent; a "
            f"{kind} family runs a memory system (e.g. memory: {{name: sam}} or your own by entry)"
        )
    engines = [
        ("reasoner", cfg.reasoner),
        ("engine", cfg.engine),
        ("committee.judge", cfg.committee.judge),
        *((f"committee.references.{i}", r) for i, r in enumerate(cfg.committee.references)),
    ]
    for key, engine in engines:
        if engine is not None and engine.backend == "scripted" and engine.scripted_policy:
            try:
                policy = scripted_policy_class(engine.scripted_policy)
            except ConfigError as exc:
                raise ConfigError(f"{key}: {exc}") from None
            check_params(policy, engine.scripted_kwargs, "the scripted policy", f"{key}.scripted_kwargs")
    committee_used = bool(cfg.credit.weight_of("committee"))
    unused = [
        k
        for k, v in (("committee.judge", cfg.committee.judge), ("committee.references", cfg.committee.references))
        if v
    ]
    if unused and not committee_used:
        raise ConfigError(
            f"{' and '.join(unused)} {'is' if len(unused) == 1 else 'are'} set but no reward term weights the "
            f"committee (credit.terms: {', '.join(t.label for t in cfg.credit.terms) or 'none'}), so "
            f"{'it' if len(unused) == 1 else 'they'} would never be called: add {{name: committee, weight: 0.5}} to "
            f"credit.terms, or remove {' and '.join(unused)}"
        )
    if committee_used and not cfg.committee.references and not cfg.placement.committee and not reg.extra.get("oracle"):
        raise ConfigError(
            f"credit: the committee term needs reference engines, and task family "
            f"{cfg.train_tasks.family!r} has no oracle: set committee.references, or drop the committee "
            f"term (its weight 0)"
        )


def default_reasoner(tokenizer: str, seed: int) -> EngineConfig:
    """The scripted SAM reasoner with the policy's tokenizer for exact token accounting."""
    return EngineConfig(
        backend="scripted",
        name="reasoner",
        scripted_policy="memrl.data.tasks.sam:SamReasoner",
        scripted_kwargs={"max_pages": 2, "recall_budget": 2},
        tokenizer=tokenizer,
        seed=seed,
    )


def family_reasoner(tasks: TaskSetConfig, tokenizer: str, seed: int) -> EngineConfig:
    """The task family's registered scripted reasoner (SAM's: :func:`default_reasoner`) with the policy's tokenizer;
    an episode/HTTP family without one gets a reasoner that refuses calls (its agent brings its own)."""
    name = family_of(tasks).extra.get("reasoner")
    if name == "sam":
        return default_reasoner(tokenizer, seed)
    return EngineConfig(
        backend="scripted", name="reasoner", scripted_policy=name or NO_REASONER, tokenizer=tokenizer, seed=seed
    )


def default_oracle(tokenizer: str, seed: int, oracle: str = "memrl.data.experts.sam:SamOracle") -> EngineConfig:
    """The task family's oracle expert without noise (SAM's by default): the offline committee's reference."""
    name = "sam-oracle" if oracle.endswith(":SamOracle") else "oracle"
    return EngineConfig(backend="scripted", name=name, scripted_policy=oracle, tokenizer=tokenizer, seed=seed)


def resolve_engines(cfg: OATGRPOConfig) -> tuple[EngineConfig, list[EngineConfig], EngineConfig | None]:
    """(reasoner, committee references, judge): ``placement``'s served models where set (the Slurm script fills them
    with the endpoints it starts), else the recipe's own engines; no references means the SAM oracle expert."""
    place = cfg.placement
    reasoner = cfg.reasoner or family_reasoner(cfg.train_tasks, cfg.policy.base, cfg.run.seed)
    if place.reasoner is not None:
        reasoner = served_engine(place.reasoner, cfg.reasoner, "reasoner")
    own = cfg.committee.references
    references = [
        served_engine(s, own[min(i, len(own) - 1)] if own else None, f"committee:{s.model}")
        for i, s in enumerate(place.committee)
    ] or list(own)
    oracle = family_of(cfg.train_tasks).extra.get("oracle")
    if not references and oracle:
        references = [default_oracle(cfg.policy.base, cfg.run.seed, oracle)]
    judge = cfg.committee.judge
    if place.judge is not None:
        judge = served_engine(place.judge, cfg.committee.judge, "judge")
    return reasoner, references, judge


def policy_engine_config(cfg: OATGRPOConfig) -> EngineConfig:
    """The rollout engine of the policy (vLLM on the base; LoRA hot-swap when the trainer trains an adapter, unless
    ``loop.lora_sync`` sends it merged), placed as ``placement.policy`` says."""
    lora = cfg.trainer.lora
    adapter = cfg.policy.adapter is not None or lora.enabled
    base = cfg.engine or EngineConfig.vllm("policy", cfg.policy.base)
    updates: dict[str, Any] = {"model": base.model or cfg.policy.base}
    if adapter and cfg.loop.lora_sync == "adapter":  # 'merged' reloads full weights: no LoRA ops in the engine
        updates.update(enable_lora=True, max_lora_rank=max(base.max_lora_rank, lora.r))
    return place_policy_engine(base.model_copy(update=updates), cfg.placement.policy)


def summarize_eval(result: dict[str, Any]) -> dict[str, Any]:
    """Flat metrics of :func:`memrl.rollout.evaluation.tasks.evaluate_memory`: success sampled (the policy as
    trained) and greedy, overall and per horizon, tokens per task, and failed episodes when any failed."""
    out: dict[str, Any] = {
        "success": result["success_sampled"],
        "success_greedy": result["success_greedy"],
        "mean_outcome": result["mean_outcome_sampled"],
        "mean_outcome_greedy": result["mean_outcome_greedy"],
        "reasoner_tokens_per_task": result["reasoner_tokens_per_task"],
        "memory_tokens_per_task": result["memory_tokens_per_task"],
    }
    if result.get("failed_episodes"):
        out["failed_episodes"] = result["failed_episodes"]
    for horizon, values in result["by_horizon"].items():
        out[f"success/{horizon}"] = values["success_sampled"]
        out[f"success_greedy/{horizon}"] = values["success_greedy"]
    return out


def iteration_batch(tasks: list[Any], size: int, seed: int, iteration: int) -> list[Any]:
    """The tasks of an iteration: a pure function of (seed, iteration), reshuffled every pass over the set."""
    per_epoch = max(len(tasks) // size, 1)
    epoch, index = divmod(iteration, per_epoch)
    order = list(range(len(tasks)))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return [tasks[i] for i in order[index * size : (index + 1) * size]]


@dataclass
class TreeScorer:
    """Committee (+ judge) scoring of a worker's trees; called once inside each rollout worker, where it builds the
    committee's clients (sticky per tree) and returns the scorer. ``enabled`` False (lambda 0) scores nothing."""

    references: list[EngineConfig]
    judge: EngineConfig | None
    settings: CommitteeConfig
    enabled: bool = True

    def __call__(self) -> Scorer:
        if not self.enabled:
            return lambda trees: {}
        committee = Committee(
            self.settings,
            [build_sticky_engine(c) for c in self.references],
            build_sticky_engine(self.judge) if self.judge is not None else None,
        )

        def score(trees: list[MemoryCallTree]) -> dict[str, Any]:
            cstats = committee.score(trees)
            # counts add up over workers; the mean score is rebuilt from its sum and count by the driver
            return {
                **cstats.metrics(),
                "committee_score_sum": sum(cstats.scores),
                "committee_scores": len(cstats.scores),
            }

        return score


@dataclass
class TaskTreeRollout:
    """Starts a worker's rollouts: ``(task, rollout id, seed) -> rollout`` of any task family under the recipe's
    memory config (:func:`memrl.rollout.agents.task_rollout`)."""

    memory: Any

    def __call__(self, task: Any, rollout_id: str, seed: int) -> Rollout:
        return task_rollout(task, self.memory, seed=seed, rollout_id=rollout_id)


def collection_metrics(batch: list[Any], results: list[FleetResult]) -> dict[str, Any]:
    """An iteration's metrics from the trees the fleet built (summed over workers and dynamic-sampling rounds)."""
    trees = [t for r in results for t in r.trees]
    leaves = [n for t in trees for n in t.nodes if n.kind == "leaf"]
    metrics: dict[str, Any] = {
        "tasks": [t.task_id for t in batch],  # the data order, checked against an uninterrupted run on resume
        **leaf_outcome_metrics(leaves),
        "leaves": len(leaves),
        "reasoner_tokens": sum(t.reasoner_usage.spent for t in trees),
        "rerun_tasks": sum(r.reruns for r in results),
    }
    for tree in trees:  # states re-entered at the branch points: reentry_snapshot, reentry_replay, replayed_steps, ...
        for key, value in tree.metadata.get("reentry", {}).items():
            name = f"reentry_{key}" if key in ("snapshot", "replay") else key
            metrics[name] = metrics.get(name, 0) + value
    for key in FAILURE_STATS:  # failed episodes by kind (each a failed leaf): always there, 0 when none failed
        metrics[key] = sum(int(n.metadata.get("stats", {}).get(key, 0)) for n in leaves)
    if count := sum(int(n.metadata.get("stats", {}).get("agent_rejected_requests", 0)) for n in leaves):
        metrics["agent_rejected_requests"] = count
    for r in results:
        for key, value in r.metrics.items():
            metrics[key] = metrics.get(key, 0) + value if isinstance(value, (int, float)) else value
    if "committee_scores" in metrics:
        total, count = metrics.pop("committee_score_sum"), metrics.pop("committee_scores")
        if count:  # a mean over nothing is absent, not 0
            metrics["committee_score_mean"] = total / count
    return metrics


def check_collection(trees: list[MemoryCallTree], iteration: int) -> None:
    """Stop a run whose every episode of an iteration failed (an environment or agent that fails every episode the
    same way: nothing would be trained, and "done" would be a lie), naming the kinds of failure (the caller logs the
    iteration's metrics first, so ``metrics.jsonl`` counts them too)."""
    leaves = [n for t in trees for n in t.nodes if n.kind == "leaf"]
    kinds: dict[str, int] = {}
    for n in leaves:
        stats = n.metadata.get("stats", {})
        for key in FAILURE_STATS:
            if stats.get(key):
                kinds[key] = kinds.get(key, 0) + 1
    failed = sum(1 for n in leaves if any(n.metadata.get("stats", {}).get(k) for k in FAILURE_STATS))
    if leaves and failed == len(leaves):
        counts = ", ".join(f"{k} {v}" for k, v in kinds.items())
        raise UserCodeError(
            f"every episode of iteration {iteration} failed ({len(leaves)} of {len(leaves)}: {counts}), so there is "
            f"nothing to train on; the warnings above name each episode's failure and the run's log has their "
            f"tracebacks"
        )


def untrained_cause(trees: list[MemoryCallTree], tree: TreeConfig, memory: Any) -> str:
    """Why an iteration trained no memory call (one line for the warning)."""
    actions = sum(1 for t in trees for n in t.nodes if n.kind == "memory")
    if not trees:
        return "no tree was built (no tasks ran)"
    if actions:
        return f"its {actions} memory actions got no advantage (credit.advantage and the sibling groups' rewards)"
    name = getattr(memory, "name", None) or getattr(memory, "entry", None) or "the memory system"
    return (
        f"no memory call was made under a trained role (tree.branch_roles: {', '.join(tree.branch_roles)}): "
        f"{name} either never calls the memory model or calls it under other roles (memory.sampling names "
        f"{', '.join(sorted(getattr(memory, 'sampling', {}) or {})) or 'none'})"
    )


def leaf_outcome_metrics(leaves: list[Any]) -> dict[str, float | int]:
    """``success``: the share of leaves (episodes) won (:func:`~memrl.data.schemas.episode_won`: the environment's
    word, else an outcome of 1); ``mean_outcome``: their mean outcome in [0, 1] (partial credit included where the
    family gives it); ``episodes_truncated``: episodes cut before the environment ended them (when any)."""
    n = max(len(leaves), 1)
    outcomes = [leaf.metadata.get("true_outcome", leaf.outcome) or 0.0 for leaf in leaves]
    stats = [leaf.metadata.get("stats", {}) for leaf in leaves]
    out: dict[str, float | int] = {
        "success": sum(episode_won(o, s) for o, s in zip(outcomes, stats, strict=True)) / n,
        "mean_outcome": sum(outcomes) / n,
    }
    if truncated := sum(int(s.get("env_truncated", 0)) for s in stats):
        out["episodes_truncated"] = truncated
    return out


def extra_tasks(tasks: list[Any], taken: set[str], size: int, seed: int, iteration: int, round_: int) -> list[Any]:
    """Dynamic sampling's next tasks: ``size`` training tasks not yet in the iteration, a pure function of (seed,
    iteration, round) so a resumed run draws the same."""
    free = [t for t in tasks if t.task_id not in taken]
    random.Random((seed * 1_000_003 + iteration) * 101 + round_).shuffle(free)
    return free[:size]


@dataclass
class _Collected:
    """An iteration's trees in flight; :meth:`result` waits for them and, with dynamic sampling on
    (``tree.informative_groups``), builds more trees until the batch holds that many outcome-informative sibling
    groups or ``tree.max_extra_trees`` extra trees were built (what it stopped at is logged)."""

    pending: Any
    batch: list[Any]
    more: Callable[[int, list[Any]], Any]  # (round, tasks) -> trees in flight
    pool: list[Any]
    tree: TreeConfig
    seed: int
    iteration: int

    def result(self) -> tuple[list[MemoryCallTree], dict[str, Any]]:
        results: list[FleetResult] = [self.pending.result()]
        trees = list(results[0].trees)
        taken = {t.task_id for t in self.batch}
        informative, extra, rounds = informative_groups(trees), 0, 0
        while informative < self.tree.informative_groups and extra < self.tree.max_extra_trees:
            rounds += 1
            size = min(len(self.batch), self.tree.max_extra_trees - extra)
            tasks = extra_tasks(self.pool, taken, size, self.seed, self.iteration, rounds)
            if not tasks:
                break
            results.append(self.more(rounds, tasks).result())
            taken.update(t.task_id for t in tasks)
            trees += results[-1].trees
            extra += len(tasks)
            informative = informative_groups(trees)
        metrics = collection_metrics(self.batch, results)
        if self.tree.informative_groups:
            metrics.update(
                extra_trees=extra,
                dynamic_sampling_rounds=rounds,
                informative_groups_short=max(self.tree.informative_groups - informative, 0),
            )
        return trees, metrics


def use_in_memory_sync(cfg: OATGRPOConfig, gpu: bool) -> bool:
    """Whether full weights go to the fleet by NCCL broadcast (GPUs, a Ray fleet, full-weight training) or by disk."""
    possible = gpu and cfg.fleet.workers != 0 and cfg.policy.adapter is None and not cfg.trainer.lora.enabled
    if cfg.loop.weight_sync == "nccl" and not possible:
        raise ConfigError(
            "loop.weight_sync: nccl needs GPUs, a Ray fleet (fleet.workers != 0) and full-weight "
            "training (LoRA adapters are synced by directory)"
        )
    return possible and cfg.loop.weight_sync in ("nccl", "auto")


# ----------------------------------------------------------------------------------------------------------------


def run_oat_grpo(cfg: OATGRPOConfig) -> int:
    """Run the loop; writes metrics.jsonl, checkpoints, policy versions, trees of the last iteration, summary.json."""
    accelerator = make_accelerator(cfg.trainer)
    run_dir = shared_run_dir(cfg, cfg.run, "train-oat-grpo", accelerator)
    result = train_oat_grpo(cfg, run_dir, accelerator=accelerator)
    if accelerator.is_main_process and not result["stopped"]:  # a sitting's end writes no summary
        evals = result["evals"]
        summary = {
            **{k: result[k] for k in ("iterations_run", "updates", "policy_version", "policy_dir", "lora")},
            "iterations": cfg.loop.iterations,
            "world_size": accelerator.num_processes,
            "before": evals[0] if evals and evals[0]["iteration"] == -1 else None,
            "after": evals[-1] if evals else None,
            "training_reasoner_tokens": sum(h.get("reasoner_tokens", 0) for h in result["history"]),
            "history": result["history"],
        }
        atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=1) + "\n")
        log.info(f"[oat-grpo] done: {result['iterations_run']} iterations, policy {result['policy_dir']}")
    return 0


@dataclass
class OATRun:
    """What an OAT-GRPO run holds across iterations (torchtune's recipe state), built by :func:`setup_oat_grpo`:
    the trainer, the rollout fleet (main process only), the task sets, the logger and the loop's bookkeeping."""

    cfg: OATGRPOConfig
    run_dir: Path
    trainer: GroupTrainer
    fleet: Any
    loop: OnlineLoop
    train_tasks: list[Any]
    eval_tasks: list[Any]
    logger: MetricsLogger
    own_logger: bool
    last_eval: dict[str, Any]

    def launch(self, iteration: int) -> _Collected | tuple[list, dict[str, Any]]:
        """Start building iteration ``iteration``'s trees on the fleet (nothing once the reasoner budget is spent)."""
        cfg = self.cfg
        if cfg.reasoner_token_budget is not None and self.spent_before(iteration) >= cfg.reasoner_token_budget:
            return [], {"budget_exhausted": 1}  # no rollouts, no update: the equal-budget comparisons stop here
        batch = iteration_batch(self.train_tasks, cfg.tasks_per_iteration, cfg.run.seed, iteration)
        rollout, seed = TaskTreeRollout(cfg.memory), job_seed(cfg, iteration)

        def more(round_: int, tasks: list[Any]) -> Any:
            return self.fleet.submit(iteration, tasks, seed + 104_729 * round_, rollout)

        return _Collected(
            self.fleet.submit(iteration, batch, seed, rollout),
            batch,
            more,
            self.train_tasks,
            cfg.tree,
            cfg.run.seed,
            iteration,
        )

    def spent_before(self, iteration: int) -> int:
        """Reasoner tokens spent on training rollouts before ``iteration`` (from metrics.jsonl: survives a resume,
        which truncates the log to the checkpoint first)."""
        path = self.run_dir / "metrics.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        return sum(int(r.get("reasoner_tokens", 0)) for r in rows if 0 <= r.get("step", -1) < iteration)

    def evaluate(self, iteration: int) -> dict[str, Any]:
        """Held-out success of the current policy (reused when no update ran since the last evaluation)."""
        if self.last_eval.get("version") == self.trainer.version:  # no update since (budget spent): the same policy
            return dict(self.last_eval["result"])
        cfg, tasks = self.cfg, self.eval_tasks
        result = self.fleet.call_one(
            lambda engine, reasoner: summarize_eval(
                evaluate_memory(
                    tasks,
                    EngineSet(reasoner=reasoner, memory=engine),
                    cfg.memory,
                    samples=cfg.eval_samples,
                    seed=cfg.run.seed,
                )
            )
        )
        self.last_eval.update(version=self.trainer.version, result=result)
        return result

    def close(self) -> None:
        """Finish the logger this run opened and stop the fleet."""
        if self.own_logger:
            self.logger.close()
        if self.fleet is not None:
            self.fleet.close()
        close_drivers()  # HTTP agents this process started, and its model endpoint


def job_seed(cfg: OATGRPOConfig, iteration: int) -> int:
    """The seed of an iteration's rollouts and of its credit's controls."""
    return cfg.run.seed * 7919 + iteration


class RunOptions(TypedDict, total=False):
    """What a caller of :func:`train_oat_grpo` may pass beside the config and the run folder."""

    logger: MetricsLogger  # the caller's metrics logger (default: one of the run's own, closed at the end)
    eval_tasks: list[Any]  # the held-out tasks (default: the config's eval_tasks)
    accelerator: Any  # an Accelerator already made (default: the trainer makes one)
    initial_eval: dict[str, Any]  # the starting policy's held-out figures, when the caller already has them


def setup_oat_grpo(cfg: OATGRPOConfig, run_dir: Path, **options: Unpack[RunOptions]) -> OATRun:
    """The trainer, the engines (a fleet of rollout workers, each building trees and scoring them with the
    committee), the task sets and the loop of an OAT-GRPO run."""
    trainer = GroupTrainer(cfg.policy, cfg.trainer, accelerator=options.get("accelerator"))
    main = trainer.accelerator.is_main_process
    gpu = torch.cuda.is_available()
    check_staleness_placement(cfg.loop, cfg.placement.policy, gpu)
    in_memory = use_in_memory_sync(cfg, gpu)
    reasoner_cfg, reference_cfgs, judge_cfg = resolve_engines(cfg)
    settings = cfg.committee.settings
    if settings.cache_dir is None:
        settings = settings.model_copy(update={"cache_dir": str(run_dir / "committee_cache")})
    spec = WorkerSpec(
        policy=policy_engine_config(cfg),
        reasoner=reasoner_cfg,
        tree=cfg.tree,
        config_hash=config_hash(cfg),
        make_scorer=TreeScorer(reference_cfgs, judge_cfg, settings, enabled=bool(cfg.credit.weight_of("committee"))),
        weight_transfer="nccl" if in_memory else None,
    )
    fleet = build_fleet(spec, cfg.fleet, cfg.placement.policy) if main else None
    logger = options.get("logger")
    own_logger = logger is None
    logger = logger or MetricsLogger(
        run_dir,
        cfg.run.wandb if main else None,
        cfg.model_dump(mode="json"),
        name=run_dir.name,
        console=main,
        logging=cfg.run.logging if main else None,
    )
    loop = OnlineLoop.for_recipe(
        cfg,
        trainer,
        fleet,
        run_dir,
        logger,
        desc="oat-grpo",
        attach={"reward_cache": Path(str(settings.cache_dir))},
        in_memory=InMemoryWeightSync(trainer, fleet) if in_memory else None,
    )
    initial_eval, eval_tasks = options.get("initial_eval"), options.get("eval_tasks")
    last_eval = {} if initial_eval is None else {"version": trainer.version, "result": initial_eval}
    return OATRun(
        cfg,
        run_dir,
        trainer,
        fleet,
        loop,
        load_sam_tasks(cfg.train_tasks, "train"),
        eval_tasks if eval_tasks is not None else load_sam_tasks(cfg.eval_tasks, "eval"),
        logger,
        own_logger,
        last_eval,
    )


def train_oat_grpo(cfg: OATGRPOConfig, run_dir: Path, **options: Unpack[RunOptions]) -> dict[str, Any]:
    """The loop behind ``memrl train oat-grpo`` (also called by the quickstart, which passes its own logger and a
    held-out set spanning several horizons; ``options``: :class:`RunOptions`); returns a summary dict. ``initial_eval``
    (a benchmark starting many runs from one checkpoint) is used instead of evaluating the start again. One iteration:
    collect -> credit -> groups -> update -> sync -> log -> checkpoint."""
    run = setup_oat_grpo(cfg, run_dir, **options)
    loop, main = run.loop, run.trainer.accelerator.is_main_process
    warned = False
    try:
        for iteration in loop.start(run.launch, run.evaluate):
            # collect: trees under the current policy (k ahead with max_staleness), dynamic sampling included
            trees, metrics = loop.collected(iteration, run.launch)
            groups, credit = None, {}
            if main:
                try:
                    check_collection(trees, iteration)
                except UserCodeError:
                    run.logger.log(iteration, metrics)  # the failures by kind, in metrics.jsonl as well
                    raise
                # credit: V(n), c(n), r(n) and sibling advantages over the whole batch; groups: the trainer's rows
                groups, credit = credit_and_groups(trees, cfg.credit, cfg.tree.mode, job_seed(cfg, iteration))
                if trees and not credit["memory_calls_trained"] and not warned:
                    warned = True  # once per run: the same cause holds for the iterations after
                    log.warning(
                        f"[oat-grpo] iteration {iteration} trained no memory call (memory_calls_trained 0): "
                        f"{untrained_cause(trees, cfg.tree, cfg.memory)}"
                    )
                if trees:
                    write_jsonl(run_dir / "trees_last.jsonl", trees)
            update = loop.update(groups)  # every process: pi_old / pi_ref scoring, optimizer steps
            sync = loop.sync(iteration)  # the new policy into the engines
            loop.log(iteration, {**metrics, **credit, **update, **sync}, run.evaluate)  # held-out eval when due
            loop.checkpoint(iteration)
    finally:
        run.close()
    result = loop.result()
    return {
        "iterations_run": result.iterations_run,
        "updates": result.updates,
        "policy_dir": result.policy_dir,
        "policy_version": result.policy_version,
        "history": result.history,
        "evals": result.evals,
        "lora": run.trainer.is_peft,
        "stopped": result.stopped,
    }
