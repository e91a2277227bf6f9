"""How a rollout is built, in one place: the harness, the tree builder, distillation and the trainers call
:func:`task_rollout` (any task of a registered family + a memory config + seeds -> a rollout: memrl's
:class:`~memrl.rollout.loop.Rollout` for a task of memrl's interface or a Gym-style environment, an
:class:`~memrl.rollout.episodes.EpisodeRollout` for an episode function or an HTTP agent), with the family-shaped
wrappers :func:`sam_rollout` and :func:`build_proactive_rollout`, and, for SAM's scripted reasoner and oracle expert,
:func:`sam_engines`.

A task shapes its rollout through optional hooks: ``memory_defaults(config) -> dict`` (settings the memory config
takes from the task unless it sets them), ``reasoner_system`` (the frozen agent's system prompt; default the memory
system's own) and ``rollout_metadata(system, config) -> dict`` (the episode metadata: ground truth for oracles,
never shown to a model).

Example (the oracle as memory model; any engine can replace it, e.g. the vLLM engine of the trained model)::

    engines = sam_engines(tokenizer=tok)
    traces = run_rollouts([sam_rollout(task, {"name": "sam"}, seed=s) for s, task in enumerate(tasks)], engines)

For :func:`memrl.rollout.tree.build_trees`: ``make_rollout=lambda task, rid: sam_rollout(task, cfg, rollout_id=rid)``.
"""

from __future__ import annotations

import copy
from typing import Any

from memrl.data.experts.sam import SamOracle, SamOracleConfig
from memrl.data.schemas import Episode
from memrl.data.tasks import TASK_FAMILIES, ProactiveTask, task_from_episode
from memrl.data.tasks.sam import SamReasoner, SamTask
from memrl.rollout.engines.base import Engine
from memrl.rollout.engines.scripted import ScriptedEngine
from memrl.rollout.loop import EngineSet, Rollout
from memrl.rollout.memory.base import MemorySystem, RoleSampling
from memrl.rollout.memory.embedders import Embedder
from memrl.rollout.memory.proactive import ProactiveConfig
from memrl.rollout.memory.registry import MemoryConfig, build_memory, family_memory, parse_memory_config
from memrl.rollout.memory.sam import TokenCounter

__all__ = ["build_proactive_rollout", "sam_engines", "sam_rollout", "task_rollout"]


def task_rollout(
    task: Any,
    memory: MemoryConfig | dict[str, Any] | MemorySystem | None = None,
    *,
    seed: int = 0,
    rollout_id: str = "r",
    count_tokens: TokenCounter | None = None,
    embedder: Embedder | None = None,
    reasoner_sampling: RoleSampling | None = None,
    metadata: dict[str, Any] | None = None,
    copy_task: bool = True,
) -> Any:
    """A rollout of the frozen reasoner on ``task`` (a task or its :class:`Episode`) through the memory system
    ``memory`` (a config, a mapping with ``name`` / ``entry``, or a built system; None: the family's default).

    The task is copied (rollouts of one task never share state; ``copy_task=False`` runs the object given).
    ``seed`` seeds every model call of the rollout (with ``rollout_id``, so forks of one rollout draw
    independently). An episode-function or HTTP-agent task returns an
    :class:`~memrl.rollout.episodes.EpisodeRollout` (its memory system is the user's own code; ``memory`` gives the
    sampling of its roles)."""
    if isinstance(task, Episode):
        task = task_from_episode(task)
    if getattr(task, "kind", "env") in ("episode", "http"):
        from memrl.rollout.episodes import external_rollout

        return external_rollout(task, memory, seed=seed, rollout_id=rollout_id, metadata=metadata)
    if memory is None:
        memory = {"name": family_memory(TASK_FAMILIES.get(task.family))}
    if isinstance(memory, MemorySystem):
        system, config = memory, None
    else:
        config = parse_memory_config(memory)
        defaults = getattr(task, "memory_defaults", None)
        if callable(defaults):
            update = {
                k: v
                for k, v in defaults(config).items()
                if k in type(config).model_fields and k not in config.model_fields_set
            }
            config = config.model_copy(update=update)
        system = build_memory(config, count_tokens=count_tokens, embedder=embedder)
    env = copy.deepcopy(task) if copy_task else task
    hook = getattr(env, "rollout_metadata", None)
    meta = hook(system, config) if callable(hook) else {"family": env.family, "memory": system.name}
    return Rollout(
        env,
        system,
        reasoner_system=getattr(env, "reasoner_system", None) or getattr(system, "reasoner_system", ""),
        reasoner_sampling=reasoner_sampling,
        seed=seed,
        rollout_id=rollout_id,
        metadata={**meta, **(metadata or {})},
    )


def sam_rollout(
    task: SamTask | Episode, memory: MemoryConfig | dict[str, Any] | MemorySystem, **options: Any
) -> Rollout:
    """A rollout of the frozen reasoner on a SAM task through the memory system ``memory`` (:func:`task_rollout`,
    with its keyword ``options``, for a task of the SAM families: the reasoner's system prompt is the memory system's
    own (SAM's ``memory(intent, page_ids)``, intent-only retrieval, or no memory tool); the episode metadata carries
    ``gold_entities`` (the oracle expert's view of the true state; other engines ignore it))."""
    env = task_from_episode(task) if isinstance(task, Episode) else task
    if not isinstance(env, SamTask):
        raise TypeError(f"sam_rollout needs a SAM task, got {type(env).__name__}")
    return task_rollout(env, memory, **options)


def sam_engines(
    memory: Engine | None = None,
    *,
    tokenizer: Any = None,
    oracle: SamOracleConfig | dict[str, Any] | None = None,
    max_pages: int = 2,
    recall_budget: int = 2,
    seed: int = 0,
) -> EngineSet:
    """The scripted frozen reasoner (:class:`~memrl.data.tasks.sam.SamReasoner`) and a memory engine: ``memory`` when
    given (e.g. the vLLM engine of the memory model), else the oracle expert (:class:`~memrl.data.experts.sam.SamOracle`
    with the ``oracle`` noise knobs). With ``tokenizer`` the scripted engines report token ids and usage like a model
    engine (the reasoner's prompt tokens are the tokenizer's count of the rendered chat)."""
    reasoner = ScriptedEngine(
        SamReasoner(max_pages=max_pages, recall_budget=recall_budget), tokenizer=tokenizer, seed=seed, name="reasoner"
    )
    if memory is None:
        memory = ScriptedEngine(SamOracle(oracle), tokenizer=tokenizer, seed=seed, name="sam-oracle")
    return EngineSet(reasoner=reasoner, memory=memory)


def build_proactive_rollout(
    source: Episode | ProactiveTask,
    config: ProactiveConfig | None = None,
    *,
    seed: int = 0,
    rollout_id: str = "r",
    reasoner_sampling: RoleSampling | None = None,
) -> Rollout:
    """The agent-loop rollout of one proactive task with the proactive memory agent: how the harness, distillation
    and pivot-turn GRPO build these rollouts alike.

    ``source`` is a :class:`ProactiveTask` or its :class:`Episode` (rebuilt from ``episode.env``). The memory window
    ``window`` and the action agent's ``action_window`` default to the task's agent window (``params.window``) unless
    ``config`` sets them. The rollout's metadata carries the task's pivots and step budget (ground truth for pivot
    analysis; never shown to a model).

    Engines it expects (:class:`~memrl.rollout.loop.EngineSet`): the reasoner answers
    :data:`~memrl.data.formats.ACTION_AGENT_SYSTEM` chats with one ``act(action)`` tool call (the scripted agent:
    ``ScriptedEngine(ActionAgent())``, greedy); the memory engine answers roles ``bank_edit`` and ``intervene``
    (``EngineSet.by_role`` may split them). An oracle memory engine finds the ground truth by the request's
    ``task_id``: ``ScriptedEngine(ProactiveOracle(truths={task.task_id: task.truth()}))``.
    """
    task = source if isinstance(source, ProactiveTask) else task_from_episode(source)
    if not isinstance(task, ProactiveTask):
        raise ValueError(f"episode {task.task_id!r} is not a proactive task")
    return task_rollout(
        task,
        config or ProactiveConfig(),
        seed=seed,
        rollout_id=rollout_id,
        reasoner_sampling=reasoner_sampling,
        copy_task=False,
    )
