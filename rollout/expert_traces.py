"""``memrl data distill``: run an expert memory model inside a memory system over a task set and distil its traces.

The expert is the task family's programmatic oracle (with noise knobs, so rejection sampling has something to reject)
or any engine, e.g. a frontier model behind an OpenAI-compatible endpoint. It runs inside a memory system (the
family's default: SAM or the proactive agent; ``memory`` names any registered one, a user's by import path) with a
frozen reasoner (the family's registered scripted reasoner, or ``reasoner``: any engine); every trace goes through
:class:`memrl.data.distill.DistillWriter` (rejection sampling, one chat-format dataset per memory role, resumable:
finished traces are skipped on a rerun). An episode-function or HTTP-agent family runs its own loop: the expert
answers its memory calls.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from memrl.data.config import ConfigError, ConfigModel, RunConfig
from memrl.data.distill import DistillWriter, RejectionConfig
from memrl.data.experts.proactive import ProactiveOracle, ProactiveOracleConfig
from memrl.data.experts.sam import SamOracleConfig
from memrl.data.registry import Registration, import_entry
from memrl.data.run_dir import prepare_run_dir
from memrl.data.tasks import TaskSetConfig, family_of, load_tasks
from memrl.data.tasks.proactive import ProactiveTask
from memrl.data.tracking import progress_bar
from memrl.rollout.agents import build_proactive_rollout, task_rollout
from memrl.rollout.engines.config import EngineConfig, load_scripted_policy, scripted_policy_class
from memrl.rollout.engines.factory import build_engine
from memrl.rollout.engines.scripted import ScriptedEngine
from memrl.rollout.loop import EngineSet, run_rollouts
from memrl.rollout.memory.proactive import ProactiveConfig
from memrl.rollout.memory.registry import MemoryConfig, family_memory
from memrl.rollout.memory.sam import SamConfig
from memrl.rollout.models import load_tokenizer

__all__ = ["DistillRunConfig", "check_inputs", "distill", "run_distill"]

log = logging.getLogger(__name__)


class DistillRunConfig(ConfigModel):
    """What ``memrl data distill`` runs."""

    command: Literal["data distill"] = "data distill"  # the command this config is for
    run: RunConfig = RunConfig()
    tasks: TaskSetConfig = TaskSetConfig()
    expert: EngineConfig | None = None  # None: the family's oracle with the noise knobs below
    reasoner: EngineConfig | None = None  # the frozen reasoner; None: the family's registered scripted reasoner
    memory: MemoryConfig | None = None  # any registered memory system; None: the family's (sam_memory / ...)
    sam_oracle: SamOracleConfig = SamOracleConfig()
    proactive_oracle: ProactiveOracleConfig = ProactiveOracleConfig()
    sam_memory: SamConfig = SamConfig()  # the SAM families' default memory system
    proactive_memory: ProactiveConfig = ProactiveConfig()  # the proactive family's default memory system
    reasoner_max_pages: int = 1  # page ids the scripted SAM reasoner asks for per recall
    reasoner_recall_budget: int = Field(2, ge=0, le=1000)  # recall calls per intent of the scripted SAM reasoner
    tokenizer: str | None = None  # token accounting of the scripted agents (a model dir or hub id)
    rejection: RejectionConfig = RejectionConfig()
    batch_size: int = Field(32, ge=1, le=2**16)  # tasks rolled out together per batch
    out: str | None = None  # default: <run dir>/sft

    @model_validator(mode="after")
    def _one_memory(self) -> DistillRunConfig:
        if self.memory is not None and {"sam_memory", "proactive_memory"} & self.model_fields_set:
            raise ValueError(
                "set either memory (any memory system) or sam_memory / proactive_memory (the built-in "
                "families' defaults), not both"
            )
        return self


def check_inputs(cfg: DistillRunConfig) -> None:
    """Before any run folder exists: the family, the memory system and the reasoner resolve, and an expert exists
    for a family without an oracle."""
    reg = family_of(cfg.tasks)
    for key, engine in (("reasoner", cfg.reasoner), ("expert", cfg.expert)):
        if engine is not None and engine.backend == "scripted" and engine.scripted_policy:
            try:
                scripted_policy_class(engine.scripted_policy)
            except ConfigError as exc:
                raise ConfigError(f"{key}: {exc}") from None
    if cfg.expert is None and not reg.extra.get("oracle"):
        raise ConfigError(
            f"tasks: family {cfg.tasks.family!r} has no oracle expert: set expert (an engine, e.g. a "
            f"frontier model behind an OpenAI-compatible endpoint)"
        )
    if cfg.memory is None:
        try:
            family_memory(reg)  # a family without a default memory system: the config must name one
        except ConfigError as exc:
            raise ConfigError(f"memory: {exc}") from None
    if reg.extra.get("kind", "env") in ("env", "gym") and cfg.reasoner is None and not reg.extra.get("reasoner"):
        raise ConfigError(
            f"tasks: family {cfg.tasks.family!r} has no registered reasoner: set reasoner (an engine; "
            f"a scripted one names its policy by import path)"
        )


def _family_memory(cfg: DistillRunConfig, reg: Registration[Any]) -> Any:
    if cfg.memory is not None:
        return cfg.memory
    default = reg.extra.get("memory")
    if default == "sam":
        return cfg.sam_memory
    if default == "proactive":
        return cfg.proactive_memory
    return {"name": default} if default else None


def _engines(cfg: DistillRunConfig, tasks: list[Any]) -> EngineSet:
    tokenizer = load_tokenizer(cfg.tokenizer) if cfg.tokenizer else None
    reg = family_of(cfg.tasks)
    if cfg.reasoner is not None:
        reasoner = build_engine(cfg.reasoner)
    else:
        name = reg.extra.get("reasoner") or "sam"
        kwargs = (
            {"max_pages": cfg.reasoner_max_pages, "recall_budget": cfg.reasoner_recall_budget} if name == "sam" else {}
        )
        reasoner = ScriptedEngine(
            load_scripted_policy(name, kwargs),
            tokenizer=tokenizer,
            seed=cfg.run.seed,
            name="reasoner" if name == "sam" else name.replace("_", "-"),
        )
    if cfg.expert is not None:
        return EngineSet(reasoner=reasoner, memory=build_engine(cfg.expert))
    oracle = import_entry(str(reg.extra.get("oracle")), "oracle expert")
    if oracle is ProactiveOracle:
        truths = {t.task_id: t.truth() for t in tasks}
        expert = ScriptedEngine(
            ProactiveOracle(cfg.proactive_oracle, truths=truths),
            tokenizer=tokenizer,
            seed=cfg.run.seed,
            name="proactive-oracle",
        )
    else:
        expert = ScriptedEngine(oracle(cfg.sam_oracle), tokenizer=tokenizer, seed=cfg.run.seed, name="sam-oracle")
    return EngineSet(reasoner=reasoner, memory=expert)


def _rollout(cfg: DistillRunConfig, task: Any, seed: int) -> Any:
    if isinstance(task, ProactiveTask) and cfg.memory is None:
        return build_proactive_rollout(task, cfg.proactive_memory, seed=seed, rollout_id="expert")
    return task_rollout(task, _family_memory(cfg, family_of(cfg.tasks)), seed=seed, rollout_id="expert")


def distill(cfg: DistillRunConfig, out_dir: str | Path) -> dict[str, Any]:
    """Run the expert over the task set in batches and write the per-role datasets; returns the stats."""
    tasks = load_tasks(cfg.tasks, "distill")
    writer = DistillWriter(out_dir, cfg.rejection)
    if writer.resumed:
        log.info(f"[distill] resuming: {writer.resumed} traces already written")
    engines = _engines(cfg, tasks)
    todo = [t for t in tasks if not writer.is_done(f"{t.task_id}/expert")]
    bar = progress_bar(
        total=len(tasks), initial=len(tasks) - len(todo), desc="distill", work=f"{len(todo):,} expert rollouts"
    )
    for start in range(0, len(todo), cfg.batch_size):
        batch = todo[start : start + cfg.batch_size]
        traces = run_rollouts([_rollout(cfg, t, cfg.run.seed) for t in batch], engines)
        for trace in traces:
            writer.add(trace)
        bar.update(len(batch))
    bar.close()
    return writer.finish()


def run_distill(cfg: DistillRunConfig) -> int:
    """Entry point of ``memrl data distill``."""
    run_dir = prepare_run_dir(cfg, cfg.run, "data-distill")
    out = Path(cfg.out) if cfg.out else run_dir / "sft"
    distill(cfg, out)
    log.info(f"[distill] datasets in {out}")
    return 0
