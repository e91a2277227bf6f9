"""Task evaluation (any registered task family: SAM, proactive, a user's Gym environment, episode function or HTTP
agent): the agent loop runs each task with a frozen reasoner (the family's scripted one, or any engine); the item's
outcome is the task's verifier (success / pass). With ``samples`` > 0 each task also runs that many times with the
memory model sampled (temperature from its config, or ``temperature``), beside one greedy run.
:func:`evaluate_memory` is the in-process entry point the trainers use (:func:`evaluate_sam_memory` the same with
SAM's scripted reasoner and oracle; the quickstart's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypedDict

from typing_extensions import Unpack

from memrl.data.schemas import EpisodeTrace, episode_won
from memrl.data.tasks.proactive import ProactiveTask
from memrl.data.tasks.sam import SamTask
from memrl.rollout.agents import task_rollout
from memrl.rollout.engines.base import Engine
from memrl.rollout.evaluation.records import Scorer, chunks, item_key, scored, usage_dict
from memrl.rollout.evaluation.stats import mean_or_none
from memrl.rollout.loop import EngineSet, run_rollouts
from memrl.rollout.memory.embedders import Embedder
from memrl.rollout.memory.proactive import ProactiveConfig
from memrl.rollout.memory.registry import MemoryConfig
from memrl.rollout.memory.sam import TokenCounter

__all__ = ["FAILURE_STATS", "EvalOptions", "episode_fields", "evaluate_memory", "evaluate_sam_memory", "run_tasks"]

FAILURE_STATS = ("env_errors", "env_timeouts", "episode_errors", "episode_timeouts", "episode_bad_outcomes")
"""Run statistics that mark an episode as failed, by kind: its environment raised or outlived ``episode_timeout_s``,
its episode function or agent raised or outlived it, or ended with a score outside [0, 1]."""


def _with_temperature(memory: MemoryConfig, temperature: float | None) -> MemoryConfig:
    sampling = getattr(memory, "sampling", None)
    if temperature is None or not isinstance(sampling, dict):
        return memory
    roles = {k: v.model_copy(update={"temperature": temperature}) for k, v in sampling.items()}
    return memory.model_copy(update={"sampling": roles})


def _task_horizon(task: Any) -> str:
    """A task's horizon label for per-horizon breakdowns (its ``horizon_label``, else its family)."""
    label = getattr(task, "horizon_label", None)
    return str(label) if label else str(getattr(task, "family", "task"))


def run_tasks(
    tasks: Sequence[Any],
    memory: MemoryConfig,
    engines: EngineSet,
    *,
    dataset: str,
    system: str,
    model: str,
    samples: int = 0,
    temperature: float | None = None,
    greedy: bool = True,
    skip: Iterable[str] = (),
    scorer: Scorer | None = None,
    count_tokens: TokenCounter | None = None,
    embedder: Embedder | None = None,
    seed: int = 0,
    tasks_per_batch: int = 16,
    on_progress: Callable[[int], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Run each task once greedily (memory roles at temperature 0; ``greedy=False`` skips it) and ``samples`` times
    sampled (at ``temperature``, default the config's) with the family's scripted agent; yield one record per run
    not in ``skip``. The outcome is the task's verifier (:func:`memrl.rollout.agents.task_rollout` builds every run).
    An episode that failed (its environment or agent raised or timed out) is an outcome of 0 with its counts in
    ``stats``."""
    runs = (["greedy"] if greedy else []) + [f"sample{k}" for k in range(samples)]
    configs = {"greedy": _with_temperature(memory, 0.0)}
    configs.update({r: _with_temperature(memory, temperature) for r in runs if r != "greedy"})
    done = set(skip)
    jobs = [
        (task, run) for task in tasks for run in runs if item_key(dataset, task.task_id, run, system, model) not in done
    ]
    for chunk in chunks(jobs, tasks_per_batch):
        rollouts = [_task_rollout(task, configs[run], run, seed, count_tokens, embedder) for task, run in chunk]
        traces = run_rollouts(rollouts, engines)
        records = []
        for (task, run), trace in zip(chunk, traces, strict=True):
            records.append(
                {
                    "key": item_key(dataset, task.task_id, run, system, model),
                    "dataset": dataset,
                    "mode": task.family,
                    "episode_id": task.task_id,
                    "item_id": run,
                    "system": system,
                    "model": model,
                    "sampled": run != "greedy",
                    "answer": trace.answer,
                    "outcome": trace.outcome,
                    **episode_fields(trace),
                    "horizon": _task_horizon(task),
                    "reasoner_tokens": usage_dict(trace.reasoner_usage),
                    "memory_tokens_answer": usage_dict(trace.memory_usage),
                    "memory_calls_answer": len(trace.memory_calls),
                    "reasoner_calls": trace.reasoner_usage.calls,
                    "peak_context_tokens": trace.peak_context_tokens,
                    "stats": dict(trace.stats),
                }
            )
        yield from scored(records, scorer, on_progress)


def episode_fields(trace: EpisodeTrace) -> dict[str, Any]:
    """What a task record says about its episode beside the outcome: ``won`` (the environment's word, else an
    outcome of 1), ``truncated`` (cut before the environment ended it: the step limit), ``partial_outcome`` (the
    outcome with partial credit: a Gym environment's rewards so far, clipped; else the outcome) and ``steps`` (the
    reasoner's calls)."""
    truncated = bool(trace.stats.get("env_truncated")) or any(e.kind == "limit" for e in trace.events)
    return {
        "won": episode_won(trace.outcome, trace.stats),
        "truncated": truncated,
        "partial_outcome": trace.metadata.get("partial_outcome", trace.outcome),
        "steps": trace.reasoner_usage.calls,
    }


def _task_rollout(
    task: Any, memory: MemoryConfig, run: str, seed: int, count_tokens: TokenCounter | None, embedder: Embedder | None
) -> Any:
    if isinstance(task, ProactiveTask) and not isinstance(memory, ProactiveConfig):
        raise ValueError(f"proactive tasks run the proactive agent, not {memory.name!r}")
    return task_rollout(task, memory, seed=seed, rollout_id=run, count_tokens=count_tokens, embedder=embedder)


def evaluate_memory(
    tasks: Sequence[Any],
    engines: EngineSet,
    memory: MemoryConfig | dict[str, Any],
    *,
    samples: int = 1,
    temperature: float | None = None,
    seed: int = 0,
    count_tokens: TokenCounter | None = None,
    tasks_per_batch: int = 256,
    progress: str | None = "eval",
    dataset: str = "tasks",
) -> dict[str, Any]:
    """Evaluate a memory model (``engines.memory``) inside the memory system ``memory`` on tasks of any family, in
    process: one greedy run and ``samples`` sampled runs per task, ``tasks_per_batch`` runs in flight at once (one
    batched engine call per wavefront). Returns ``success_greedy``, ``success_sampled`` (None without samples),
    reasoner and memory tokens per task (``spent`` and prompt + completion), per-horizon success, the failed
    episodes (``failed_episodes``) and the records."""
    from memrl.data.tracking import progress_bar
    from memrl.rollout.memory.registry import parse_memory_config

    cfg = parse_memory_config(memory)
    with progress_bar(total=len(tasks) * (1 + samples), desc=progress, disable=progress is None, leave=False) as bar:
        records = list(
            run_tasks(
                tasks,
                cfg,
                engines,
                dataset=dataset,
                system=cfg.name,
                model="model",
                samples=samples,
                temperature=temperature,
                seed=seed,
                count_tokens=count_tokens,
                tasks_per_batch=tasks_per_batch,
                on_progress=bar.update,
            )
        )
    greedy = [r for r in records if not r["sampled"]]
    sampled = [r for r in records if r["sampled"]]

    def success(rows: list[dict[str, Any]]) -> float | None:
        return mean_or_none([float(r["won"]) for r in rows])

    def mean_outcome(rows: list[dict[str, Any]]) -> float | None:
        return mean_or_none([float(r["outcome"] or 0.0) for r in rows])

    horizons = sorted({r["horizon"] for r in records})
    failed = sum(1 for r in records if any(r["stats"].get(k) for k in FAILURE_STATS))
    return {
        "success_greedy": success(greedy),
        "success_sampled": success(sampled),
        "mean_outcome_greedy": mean_outcome(greedy),
        "mean_outcome_sampled": mean_outcome(sampled),
        "reasoner_tokens_per_task": mean_or_none([r["reasoner_tokens"]["spent"] for r in greedy]),
        "memory_tokens_per_task": mean_or_none(
            [r["memory_tokens_answer"]["prompt"] + r["memory_tokens_answer"]["completion"] for r in greedy]
        ),
        "by_horizon": {
            h: {
                "success_greedy": success([r for r in greedy if r["horizon"] == h]),
                "success_sampled": success([r for r in sampled if r["horizon"] == h]),
            }
            for h in horizons
        },
        "failed_episodes": failed,
        "records": records,
    }


class EvalOptions(TypedDict, total=False):
    """How :func:`evaluate_memory` runs (its keywords, which :func:`evaluate_sam_memory` passes through)."""

    samples: int  # sampled runs per task beside the greedy one (default 1)
    temperature: float | None  # of the sampled runs (default: the memory system's own)
    seed: int  # of the runs and the engines (default 0)
    count_tokens: TokenCounter | None  # the memory systems' token counter (default: the approximate one)
    tasks_per_batch: int  # runs in flight at once (default 256)
    progress: str | None  # the progress bar's label (default "eval"; None: no bar)


def evaluate_sam_memory(
    tasks: Sequence[SamTask],
    memory_engine: Engine | None,
    memory: MemoryConfig | dict[str, Any] | None = None,
    *,
    tokenizer: Any = None,
    reasoner: Engine | None = None,
    **options: Unpack[EvalOptions],
) -> dict[str, Any]:
    """Evaluate a memory model inside SAM on SAM tasks, in process: one greedy run and ``samples`` sampled runs per
    task, ``tasks_per_batch`` runs in flight at once (one batched engine call per wavefront). ``memory_engine`` None
    uses the SAM oracle expert. Returns ``success_greedy``, ``success_sampled`` (None without samples), reasoner and
    memory tokens per task (``spent`` and prompt + completion), per-horizon success and the records."""
    from memrl.rollout.agents import sam_engines

    engines = sam_engines(memory_engine, tokenizer=tokenizer, seed=options.get("seed", 0))
    if reasoner is not None:
        engines = EngineSet(reasoner=reasoner, memory=engines.memory)
    result = evaluate_memory(tasks, engines, memory or {"name": "sam"}, dataset="sam", **options)
    result.pop("failed_episodes")
    return result
