"""``memrl train oat-grpo``: OAT-GRPO for the SAM memory model (seed 001 section 2.3).

Each iteration builds memory-call trees with the current policy in the rollout engine (the frozen reasoner continues
every sibling), scores sibling groups with the committee (shared per parent context, cached), assigns OAT credit
r(n) = V(n) + lambda (c(n) - c_bar) and sibling-group advantages, updates the policy with the group trainer, and syncs
the new weights into the engine (train/online.py). Held-out success is measured with the same rollout code.

The embedded default (tiny model, scripted reasoner, the oracle expert as committee, offline judge) needs no network;
the paper's setup swaps in endpoints for the reasoner, the committee and the judge, listed under ``placement``
(configs/oat_grpo_sam_qwen3.5-9b.yaml; the Slurm script fills them with the servers it starts). A served model in
``placement`` replaces the recipe's engine for that role and borrows its client settings when that is an ``openai``
engine. Outputs: config.yaml, metrics.jsonl (with each iteration's task ids), checkpoints/, policy/vNNNNN,
trees_last.jsonl, committee_cache/, summary.json.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Literal

from pydantic import model_validator

from data.config import ConfigError, ConfigModel, PlacementConfig, RunConfig, ServedModel, config_hash
from data.io import atomic_write_text, write_jsonl
from data.tasks import TaskSetConfig, load_tasks
from data.tasks.sam import SamTask
from data.tracking import MetricsLogger
from rewards.committee import Committee, CommitteeConfig
from rewards.credit import CreditConfig, assign_batch_credit
from rollout.agents import sam_rollout
from rollout.engines.base import Engine
from rollout.engines.config import EndpointConfig, EngineConfig, build_engine, place_policy_engine
from rollout.harness import evaluate_sam_memory
from rollout.loop import EngineSet
from rollout.memory.base import RoleSampling
from rollout.memory.sam import SamConfig
from rollout.tree import TreeConfig, build_trees, check_trained_sampling, trees_to_groups
from train.group_trainer import GroupTrainer, GroupTrainerConfig, make_accelerator
from train.online import LoopConfig, run_online_loop, shared_run_dir
from train.policy import PolicySpec

__all__ = ["OATGRPOConfig", "load_sam_tasks", "run_oat_grpo", "summarize_eval", "train_oat_grpo"]


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
    reasoner: EngineConfig | None = None  # the frozen reasoner; default: the scripted SAM reasoner
    committee: CommitteeSetup = CommitteeSetup()
    memory: SamConfig = SamConfig()
    train_tasks: TaskSetConfig = TaskSetConfig()
    eval_tasks: TaskSetConfig = TaskSetConfig(seed=10_000)
    tasks_per_iteration: int = 16  # training tasks rolled out (as trees) per iteration
    tree: TreeConfig = TreeConfig()
    credit: CreditConfig = CreditConfig()
    trainer: GroupTrainerConfig = GroupTrainerConfig()
    loop: LoopConfig = LoopConfig()
    eval_samples: int = 1  # sampled runs per held-out task (the memory config's own temperatures); plus one greedy
    reasoner_token_budget: int | None = None  # stop rolling out once training spent this many reasoner tokens

    @model_validator(mode="after")
    def _trained_roles_sampled_as_scored(self) -> OATGRPOConfig:
        for role in self.tree.branch_roles:
            sampling = self.memory.sampling.get(role, RoleSampling())
            check_trained_sampling(role, sampling.temperature, sampling.top_p)
        return self


# ----------------------------------------------------------------------------------------------------------------
# tasks and engines


def load_sam_tasks(cfg: TaskSetConfig, prefix: str) -> list[SamTask]:
    """The SAM tasks of a task set (see :func:`data.tasks.load_tasks`)."""
    if cfg.family != "sam":
        raise ConfigError(f"OAT-GRPO trains the SAM memory model: task family must be 'sam', got {cfg.family!r}")
    return [t for t in load_tasks(cfg, prefix) if isinstance(t, SamTask)]


def default_reasoner(tokenizer: str, seed: int) -> EngineConfig:
    """The scripted SAM reasoner with the policy's tokenizer for exact token accounting."""
    return EngineConfig(
        backend="scripted", name="reasoner", scripted_policy="data.tasks.sam:SamReasoner",
        scripted_kwargs={"max_pages": 2, "recall_budget": 2}, tokenizer=tokenizer, seed=seed,
    )


def default_oracle(tokenizer: str, seed: int) -> EngineConfig:
    """The SAM oracle expert without noise: the offline committee's reference."""
    return EngineConfig(backend="scripted", name="sam-oracle", scripted_policy="data.experts.sam:SamOracle",
                        tokenizer=tokenizer, seed=seed)


def served_engine(served: ServedModel, client: EngineConfig | None, name: str) -> EngineConfig:
    """An ``openai`` engine on the endpoints of a placement entry; ``client``, when it is an ``openai`` engine config,
    lends its client settings (api, timeouts, retries, per-endpoint concurrency, chat template kwargs)."""
    if not served.endpoints:
        raise ConfigError(f"placement: {name} ({served.model}) lists no endpoints")
    client = client if client is not None and client.backend == "openai" else None
    template = client.endpoints[0] if client is not None else EndpointConfig(url=served.endpoints[0])
    endpoints = [template.model_copy(update={"url": url, "model": served.model, "api_key_env": served.api_key_env})
                 for url in served.endpoints]
    if client is not None:
        return client.model_copy(update={"name": name, "model": served.model, "endpoints": endpoints})
    return EngineConfig(backend="openai", name=name, model=served.model, endpoints=endpoints)


def resolve_engines(cfg: OATGRPOConfig) -> tuple[EngineConfig, list[EngineConfig], EngineConfig | None]:
    """(reasoner, committee references, judge): ``placement``'s served models where set (the Slurm script fills them
    with the endpoints it starts), else the recipe's own engines; no references means the SAM oracle expert."""
    place = cfg.placement
    reasoner = cfg.reasoner or default_reasoner(cfg.policy.base, cfg.run.seed)
    if place.reasoner is not None:
        reasoner = served_engine(place.reasoner, cfg.reasoner, "reasoner")
    own = cfg.committee.references
    references = [served_engine(s, own[min(i, len(own) - 1)] if own else None, f"committee:{s.model}")
                  for i, s in enumerate(place.committee)] or list(own)
    if not references:
        references = [default_oracle(cfg.policy.base, cfg.run.seed)]
    judge = cfg.committee.judge
    if place.judge is not None:
        judge = served_engine(place.judge, cfg.committee.judge, "judge")
    return reasoner, references, judge


def policy_engine_config(cfg: OATGRPOConfig) -> EngineConfig:
    """The rollout engine of the policy (vLLM on the base; LoRA hot-swap when the trainer trains an adapter), placed
    as ``placement.policy`` says."""
    lora = cfg.trainer.lora
    adapter = cfg.policy.adapter is not None or lora.enabled
    base = cfg.engine or EngineConfig(backend="vllm", name="policy", model=cfg.policy.base, dtype="float32")
    updates: dict[str, Any] = {"model": base.model or cfg.policy.base}
    if adapter:
        updates.update(enable_lora=True, max_lora_rank=max(base.max_lora_rank, lora.r))
    return place_policy_engine(base.model_copy(update=updates), cfg.placement.policy)


def summarize_eval(result: dict[str, Any]) -> dict[str, Any]:
    """Flat metrics of :func:`rollout.harness.evaluate_sam_memory`: success sampled (the policy as trained) and greedy,
    overall and per horizon, and tokens per task."""
    out: dict[str, Any] = {
        "success": result["success_sampled"],
        "success_greedy": result["success_greedy"],
        "reasoner_tokens_per_task": result["reasoner_tokens_per_task"],
        "memory_tokens_per_task": result["memory_tokens_per_task"],
    }
    for horizon, values in result["by_horizon"].items():
        out[f"success/{horizon}"] = values["success_sampled"]
        out[f"success_greedy/{horizon}"] = values["success_greedy"]
    return out


def iteration_batch(tasks: list[SamTask], size: int, seed: int, iteration: int) -> list[SamTask]:
    """The tasks of an iteration: a pure function of (seed, iteration), reshuffled every pass over the set."""
    per_epoch = max(len(tasks) // size, 1)
    epoch, index = divmod(iteration, per_epoch)
    order = list(range(len(tasks)))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return [tasks[i] for i in order[index * size : (index + 1) * size]]


# ----------------------------------------------------------------------------------------------------------------


def run_oat_grpo(cfg: OATGRPOConfig) -> int:
    """Run the loop; writes metrics.jsonl, checkpoints, policy versions, trees of the last iteration, summary.json."""
    accelerator = make_accelerator(cfg.trainer)
    run_dir = shared_run_dir(cfg, cfg.run, "train-oat-grpo", accelerator)
    result = train_oat_grpo(cfg, run_dir, accelerator=accelerator)
    if accelerator.is_main_process:
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
        print(f"[oat-grpo] done: {result['iterations_run']} iterations, policy {result['policy_dir']}", flush=True)
    return 0


def train_oat_grpo(
    cfg: OATGRPOConfig, run_dir: Path, *, logger: MetricsLogger | None = None, eval_tasks: list[SamTask] | None = None,
    accelerator: Any = None, initial_eval: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The loop behind ``memrl train oat-grpo`` (also called by the quickstart, which passes its own logger and a
    held-out set spanning several horizons); returns a summary dict. ``initial_eval``: the starting policy's held-out
    figures when the caller already has them (a benchmark starting many runs from one checkpoint), used instead of
    evaluating it again."""
    trainer = GroupTrainer(cfg.policy, cfg.trainer, accelerator=accelerator)
    main = trainer.accelerator.is_main_process
    engine: Engine | None = build_engine(policy_engine_config(cfg)) if main else None
    reasoner_cfg, reference_cfgs, judge_cfg = resolve_engines(cfg)
    reasoner = build_engine(reasoner_cfg) if main else None
    references = [build_engine(c) for c in reference_cfgs] if main else []
    judge = build_engine(judge_cfg) if main and judge_cfg is not None else None
    settings = cfg.committee.settings
    if settings.cache_dir is None:
        settings = settings.model_copy(update={"cache_dir": str(run_dir / "committee_cache")})
    committee = Committee(settings, references, judge) if main else None
    train_tasks = load_sam_tasks(cfg.train_tasks, "train")
    eval_tasks = eval_tasks if eval_tasks is not None else load_sam_tasks(cfg.eval_tasks, "eval")
    engines = EngineSet(reasoner=reasoner, memory=engine) if main else None  # type: ignore[arg-type]
    chash = config_hash(cfg)
    own_logger = logger is None
    logger = logger or MetricsLogger(run_dir, cfg.run.wandb if main else None, cfg.model_dump(mode="json"),
                                     name=run_dir.name, console=main)

    def spent_before(iteration: int) -> int:
        """Reasoner tokens the run spent on training rollouts before ``iteration`` (from metrics.jsonl: survives a
        resume, which truncates the log to the checkpoint first)."""
        path = run_dir / "metrics.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        return sum(int(r.get("reasoner_tokens", 0)) for r in rows if 0 <= r.get("step", -1) < iteration)

    def collect(iteration: int) -> tuple[list, dict[str, Any]]:
        if cfg.reasoner_token_budget is not None and spent_before(iteration) >= cfg.reasoner_token_budget:
            return [], {"budget_exhausted": 1}  # no rollouts, no update: the equal-budget comparisons stop here
        batch = iteration_batch(train_tasks, cfg.tasks_per_iteration, cfg.run.seed, iteration)
        seed = cfg.run.seed * 7919 + iteration

        def make(task: SamTask, rid: str) -> Any:
            return sam_rollout(task, cfg.memory, seed=seed, rollout_id=rid)

        trees, stats = build_trees(batch, make, engines, cfg.tree, config_hash=chash)
        cstats = committee.score(trees) if cfg.credit.committee_weight else None
        credit = assign_batch_credit(trees, cfg.credit, mode=cfg.tree.mode, seed=seed)
        groups = trees_to_groups(trees, source="oat" if cfg.tree.mode == "tree" else "flat")
        write_jsonl(run_dir / "trees_last.jsonl", trees)
        leaves = [n for t in trees for n in t.nodes if n.kind == "leaf"]
        metrics: dict[str, Any] = {
            "tasks": [t.task_id for t in batch],  # the data order, checked against an uninterrupted run on resume
            "success": sum(n.metadata.get("true_outcome", n.outcome) or 0.0 for n in leaves) / max(len(leaves), 1),
            "leaves": len(leaves),
            "reasoner_tokens": sum(t.reasoner_usage.spent for t in trees),
            "memory_calls_trained": sum(len(g.samples) for g in groups),
            "credit_groups": sum(c.groups for c in credit),
            "credit_zero_variance_groups": sum(c.zero_variance_groups for c in credit),
            "engine_calls": sum(stats.engine_calls.values()),
            "wavefronts": stats.wavefronts,
        }
        if cstats is not None:
            metrics.update(committee_requests=cstats.committee_requests, judge_requests=cstats.judge_requests,
                           committee_cache_hits=cstats.cache_hits, committee_failures=cstats.failures,
                           committee_score_mean=sum(cstats.scores) / max(len(cstats.scores), 1))
        return groups, metrics

    last_eval: dict[str, Any] = {} if initial_eval is None else {"version": trainer.version, "result": initial_eval}

    def evaluate(iteration: int) -> dict[str, Any]:
        if last_eval.get("version") == trainer.version:  # no update since (budget spent): the same policy
            return dict(last_eval["result"])
        result = summarize_eval(evaluate_sam_memory(eval_tasks, engine, cfg.memory, samples=cfg.eval_samples,
                                                    reasoner=reasoner, seed=cfg.run.seed))
        last_eval.update(version=trainer.version, result=result)
        return result

    result = run_online_loop(trainer=trainer, engine=engine, cfg=cfg.loop, run_dir=run_dir, resume=cfg.run.resume,
                             collect=collect, evaluate=evaluate, logger=logger, desc="oat-grpo",
                             attach={"reward_cache": Path(str(settings.cache_dir))})
    if own_logger:
        logger.close()
    if engine is not None:
        engine.close()
    return {"iterations_run": result.iterations_run, "updates": result.updates, "policy_dir": result.policy_dir,
            "policy_version": result.policy_version, "history": result.history, "evals": result.evals,
            "lora": trainer.is_peft}

