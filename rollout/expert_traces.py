"""``memrl data distill``: run an expert memory model inside a memory system over a task set and distil its traces.

The expert is the task family's programmatic oracle (with noise knobs, so rejection sampling has something to reject)
or any engine, e.g. a frontier model behind an OpenAI-compatible endpoint. It runs inside SAM or the proactive agent
with the family's frozen scripted reasoner / action agent; every trace goes through
:class:`memrl.data.distill.DistillWriter`
(rejection sampling, one chat-format dataset per memory role, resumable: finished traces are skipped on a rerun).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from memrl.data.config import ConfigModel, RunConfig
from memrl.data.distill import DistillWriter, RejectionConfig
from memrl.data.experts.proactive import ProactiveOracle, ProactiveOracleConfig
from memrl.data.experts.sam import SamOracle, SamOracleConfig
from memrl.data.run_dir import prepare_run_dir
from memrl.data.tasks import SAM_FAMILIES, TaskSetConfig, load_tasks
from memrl.data.tasks.proactive import ActionAgent, ProactiveTask
from memrl.data.tasks.sam import SamReasoner, SamTask
from memrl.data.tracking import progress_bar
from memrl.rollout.agents import build_proactive_rollout, sam_rollout
from memrl.rollout.engines.config import EngineConfig
from memrl.rollout.engines.factory import build_engine
from memrl.rollout.engines.scripted import ScriptedEngine
from memrl.rollout.loop import EngineSet, Rollout, run_rollouts
from memrl.rollout.memory.proactive import ProactiveConfig
from memrl.rollout.memory.sam import SamConfig
from memrl.rollout.models import load_tokenizer

__all__ = ["DistillRunConfig", "distill", "run_distill"]

log = logging.getLogger(__name__)


class DistillRunConfig(ConfigModel):
    """What ``memrl data distill`` runs."""

    command: Literal["data distill"] = "data distill"  # the command this config is for
    run: RunConfig = RunConfig()
    tasks: TaskSetConfig = TaskSetConfig()
    expert: EngineConfig | None = None  # None: the family's oracle with the noise knobs below
    sam_oracle: SamOracleConfig = SamOracleConfig()
    proactive_oracle: ProactiveOracleConfig = ProactiveOracleConfig()
    sam_memory: SamConfig = SamConfig()
    proactive_memory: ProactiveConfig = ProactiveConfig()
    reasoner_max_pages: int = 1  # page ids the scripted SAM reasoner asks for per recall
    reasoner_recall_budget: int = Field(2, ge=0, le=1000)  # recall calls per intent of the scripted SAM reasoner
    tokenizer: str | None = None  # token accounting of the scripted agents (a model dir or hub id)
    rejection: RejectionConfig = RejectionConfig()
    batch_size: int = Field(32, ge=1, le=2**16)  # tasks rolled out together per batch
    out: str | None = None  # default: <run dir>/sft


def _engines(cfg: DistillRunConfig, tasks: list[Any]) -> EngineSet:
    tokenizer = load_tokenizer(cfg.tokenizer) if cfg.tokenizer else None
    if cfg.tasks.family in SAM_FAMILIES:
        reasoner = ScriptedEngine(
            SamReasoner(max_pages=cfg.reasoner_max_pages, recall_budget=cfg.reasoner_recall_budget),
            tokenizer=tokenizer,
            seed=cfg.run.seed,
            name="reasoner",
        )
        expert = (
            build_engine(cfg.expert)
            if cfg.expert
            else ScriptedEngine(SamOracle(cfg.sam_oracle), tokenizer=tokenizer, seed=cfg.run.seed, name="sam-oracle")
        )
    else:
        reasoner = ScriptedEngine(ActionAgent(), tokenizer=tokenizer, seed=cfg.run.seed, name="action-agent")
        truths = {t.task_id: t.truth() for t in tasks}
        expert = (
            build_engine(cfg.expert)
            if cfg.expert
            else ScriptedEngine(
                ProactiveOracle(cfg.proactive_oracle, truths=truths),
                tokenizer=tokenizer,
                seed=cfg.run.seed,
                name="proactive-oracle",
            )
        )
    return EngineSet(reasoner=reasoner, memory=expert)


def _rollout(cfg: DistillRunConfig, task: SamTask | ProactiveTask, seed: int) -> Rollout:
    if isinstance(task, SamTask):
        return sam_rollout(task, cfg.sam_memory, seed=seed, rollout_id="expert")
    return build_proactive_rollout(task, cfg.proactive_memory, seed=seed, rollout_id="expert")


def distill(cfg: DistillRunConfig, out_dir: str | Path) -> dict[str, Any]:
    """Run the expert over the task set in batches and write the per-role datasets; returns the stats."""
    tasks = load_tasks(cfg.tasks, "distill")
    writer = DistillWriter(out_dir, cfg.rejection)
    if writer.resumed:
        log.info(f"[distill] resuming: {writer.resumed} traces already written")
    engines = _engines(cfg, tasks)
    todo = [t for t in tasks if not writer.is_done(f"{t.task_id}/expert")]
    bar = progress_bar(total=len(tasks), initial=len(tasks) - len(todo), desc="distill",
                       work=f"{len(todo):,} expert rollouts")
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
