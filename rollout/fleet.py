"""The rollout fleet: rank 0 drives one Ray actor per policy engine on every node (the rollout plane).

Placement (:func:`plan_fleet`): ``placement.policy.mode: separate`` puts an engine on every ``tensor_parallel_size``
kept GPUs of every node (training uses the others); ``colocate`` puts them on the training GPUs of every training
node, where they sleep during updates. The workers are reserved with one placement group (a bundle per engine,
spread over the nodes Ray sees; the Slurm script advertises to Ray only the GPUs the fleet may use).

Sharding: a job's tasks are split into whole trees per worker, load-aware (:func:`shard_tasks`: each task onto the
worker that would finish it soonest by its measured trees/s; every task counts as one, the fleet has no per-task
cost estimate), so a tree never leaves its worker. The trees come back in task order whatever the split, so with
the same seeds 1 or N workers give the same trees (and the driver the same groups).

Faults: a worker that dies mid-job (SIGKILL, OOM, a lost node) has its tasks re-run on the live workers; a task's
trees are taken from exactly one answer, so nothing is double-counted. Ray restarts the actor (``max_restarts``); the
fleet replays the last weight sync into it before it works again; a worker that does not come back within
``restart_timeout_s`` leaves the fleet with a warning.

Weight sync is fanned out to every worker: :meth:`RolloutFleet.load_adapter` / :meth:`RolloutFleet.update_weights`
(directories: LoRA adapters, and full weights on CPU or as the fallback) and
:meth:`RolloutFleet.weight_sync_client`, vLLM's weight-sync client protocol over the fleet for the in-memory NCCL
broadcast on GPUs (train/weight_sync.py drives it). After a sync, :meth:`RolloutFleet.probe_logprobs` asks every
worker for its log-probs on a fixed probe, which the trainer checks against its own (train/weight_sync.py). Actor
calls run one at a time per worker, so a sync queued behind a job lands after that job's trees.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from memrl.data.config import ConfigError, ConfigModel, PolicyPlacement
from memrl.data.schemas import MemoryCallTree
from memrl.rollout.engines.base import EngineProbe
from memrl.rollout.loop import Rollout
from memrl.rollout.reaper import start_reaper
from memrl.rollout.worker import RolloutWorker, TreeBatch, TreeJob, WorkerSpec

__all__ = [
    "EngineSlot",
    "FleetCollection",
    "FleetConfig",
    "FleetResult",
    "LocalFleet",
    "RolloutFleet",
    "build_fleet",
    "plan_fleet",
    "shard_tasks",
]


class FleetConfig(ConfigModel):
    """The rollout workers (Ray actors, one policy engine each) that build the trees; see docs/cluster.md."""

    workers: int | None = Field(0, ge=0)  # 0: the main process's own engine, no Ray; None: one per engine slot
    address: str | None = None  # Ray cluster to join; None: RAY_ADDRESS (the Slurm script sets it) or a local Ray
    cpus_per_worker: float = Field(1.0, gt=0)  # Ray CPUs reserved per worker (its engine runs one torch thread)
    max_restarts: int = Field(1, ge=0)  # Ray restarts of a dead worker before it leaves the fleet
    restart_timeout_s: float = Field(600.0, gt=0)  # how long a restarting worker may take (engine start-up)


# ----------------------------------------------------------------------------------------------------------------
# placement


@dataclass(frozen=True)
class EngineSlot:
    """Where one rollout engine runs: a node index and its GPUs there; ``sleeps`` when it shares them with training."""

    node: int
    gpus: tuple[int, ...]
    sleeps: bool


def plan_fleet(placement: PolicyPlacement, nodes: int, gpus_per_node: int) -> list[EngineSlot]:
    """The engine slots of every node: ``separate``: the last ``placement.gpus_per_node`` GPUs of each node, TP per
    engine; ``colocate``: every GPU of each training node, TP per engine, sleeping during updates."""
    tp = placement.tensor_parallel_size
    if placement.mode == "separate":
        first, count = gpus_per_node - placement.gpus_per_node, placement.gpus_per_node
        if first < 1:
            raise ConfigError(
                f"placement.policy.gpus_per_node={count} leaves no training GPU on a {gpus_per_node}-GPU node"
            )
    else:
        first, count = 0, gpus_per_node
    if count % tp:
        raise ConfigError(f"{count} GPUs per node for the fleet is not a multiple of tensor_parallel_size {tp}")
    return [
        EngineSlot(node, tuple(range(first + e * tp, first + (e + 1) * tp)), placement.mode == "colocate")
        for node in range(nodes)
        for e in range(count // tp)
    ]


def shard_tasks(costs: Sequence[float], speeds: Sequence[float]) -> list[list[int]]:
    """Split tasks (by expected cost) over workers (by trees per second): longest task first, each onto the worker
    that would finish it soonest. Returns the task indices of every worker, each in task order."""
    if not speeds:
        raise ValueError("no live rollout worker")
    finish = [0.0] * len(speeds)
    shards: list[list[int]] = [[] for _ in speeds]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        w = min(range(len(speeds)), key=lambda w: ((finish[w] + costs[i]) / speeds[w], w))
        finish[w] += costs[i]
        shards[w].append(i)
    return [sorted(s) for s in shards]


# ----------------------------------------------------------------------------------------------------------------
# results


@dataclass
class FleetResult:
    """One job's trees in task order, merged metrics, and where each tree was built."""

    trees: list[MemoryCallTree]
    metrics: dict[str, Any]
    worker_of: dict[str, int]  # task id -> worker whose answer was taken
    memory_calls: dict[str, dict[int, int]]  # task id -> {worker: memory requests served}
    reruns: int  # tasks re-run after a worker died


def _merge_metrics(batches: Sequence[TreeBatch]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for batch in batches:
        for key, value in batch.metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[key] = out.get(key, 0) + value
    return out


def _dead(exc: BaseException) -> bool:
    import ray.exceptions

    return isinstance(
        exc, (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.ObjectLostError)
    )


class FleetCollection:
    """A job in flight (:meth:`RolloutFleet.submit`); :meth:`result` waits for it, re-running a dead worker's tasks."""

    def __init__(self, fleet: RolloutFleet, job: TreeJob) -> None:
        self.fleet, self.job = fleet, job
        self.pending: dict[Any, tuple[int, list[int]]] = {}
        self.reruns = 0
        self._dispatch(list(range(len(job.tasks))))

    def _dispatch(self, indices: list[int]) -> None:
        live = self.fleet.live()
        shards = shard_tasks([1.0] * len(indices), [self.fleet.speed[w] for w in live])
        for w, shard in zip(live, shards, strict=True):
            if shard:
                part = [indices[i] for i in shard]
                job = TreeJob(
                    self.job.iteration, [self.job.tasks[i] for i in part], self.job.seed, self.job.make_rollout
                )
                self.pending[self.fleet.handles[w].build.remote(job)] = (w, part)

    def result(self) -> FleetResult:
        """Every task's tree exactly once, in task order (blocks until the job is done)."""
        import ray

        answers: dict[int, tuple[int, TreeBatch, int]] = {}  # task index -> (worker, its batch, position there)
        batches: list[TreeBatch] = []
        memory_calls: dict[str, dict[int, int]] = {}
        while self.pending:
            (ref,), _ = ray.wait(list(self.pending), num_returns=1)
            w, part = self.pending.pop(ref)
            try:
                batch: TreeBatch = ray.get(ref)
            except Exception as exc:
                if not _dead(exc):
                    raise
                self.fleet.mark_down(w, exc)
                self.reruns += len(part)
                self._dispatch(part)  # the same tasks, seeds and policy version on the live workers
                continue
            batches.append(batch)
            self.fleet.speed[w] = max(len(part) / max(batch.seconds, 1e-6), 1e-6)
            for pos, i in enumerate(part):
                assert i not in answers, f"task {i} answered twice"
                answers[i] = (w, batch, pos)
            for task_id, calls in batch.memory_calls.items():
                memory_calls.setdefault(task_id, {})[w] = calls
        self.fleet.recover()
        order = range(len(self.job.tasks))
        trees = [answers[i][1].trees[answers[i][2]] for i in order]
        return FleetResult(
            trees=trees,
            metrics=_merge_metrics(batches),
            worker_of={t.task_id: answers[i][0] for i, t in zip(order, trees, strict=True)},
            memory_calls=memory_calls,
            reruns=self.reruns,
        )


# ----------------------------------------------------------------------------------------------------------------
# the fleet


class RolloutFleet:
    """Ray actors running :class:`~memrl.rollout.worker.RolloutWorker`, one per engine slot (see the module docstring).

    Implements the engine's sync interface (``load_adapter``, ``update_weights``, ``sleep``, ``policy_version``) by
    fanning out to every live worker, so the online loop syncs a fleet as it syncs one engine.
    """

    name = "fleet"

    def __init__(self, spec: WorkerSpec, cfg: FleetConfig, placement: PolicyPlacement | None = None) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        placement = placement or PolicyPlacement()
        self.reaper: subprocess.Popen[bytes] | None = None
        if not ray.is_initialized():
            address = cfg.address or os.environ.get("RAY_ADDRESS")
            # ray.init replaces the SIGTERM handler with its own (sys.exit mid-step, which can abort the process):
            # memrl's shutdown path stays in charge (launch/shutdown.py), and it stops Ray too
            sigterm = signal.getsignal(signal.SIGTERM)
            if address:
                ray.init(address=address, include_dashboard=False)
            else:
                # the local cluster and its workers end with this process, also when it is killed (kill -9), even
                # during ray.init (the reaper records Ray's processes as they start); on a cluster we joined, Ray
                # ends the actors this driver owns when it goes
                self.reaper = start_reaper()
                ray.init(num_cpus=max(int((cfg.workers or 1) * cfg.cpus_per_worker) + 1, 2), include_dashboard=False)
            if threading.current_thread() is threading.main_thread() and sigterm is not None:
                signal.signal(signal.SIGTERM, sigterm)
        gpus = int(ray.cluster_resources().get("GPU", 0))
        tp = placement.tensor_parallel_size if spec.policy.backend == "vllm" else 1
        workers = cfg.workers if cfg.workers is not None else gpus // tp if gpus else 0
        if workers < 1:
            raise ConfigError(
                "fleet.workers: null sizes the fleet by the GPUs Ray advertises, and Ray sees none: "
                "set fleet.workers to a number"
            )
        gpu_each = tp if gpus and spec.policy.backend == "vllm" else 0
        bundle: dict[str, float] = {"CPU": cfg.cpus_per_worker, **({"GPU": gpu_each} if gpu_each else {})}
        self.group = placement_group([dict(bundle) for _ in range(workers)], strategy="SPREAD")
        ray.get(self.group.ready())
        actor = ray.remote(RolloutWorker)
        self.spec, self.cfg, self.tp = spec, cfg, tp
        self.handles = [
            actor.options(
                num_cpus=cfg.cpus_per_worker,
                num_gpus=gpu_each,
                max_restarts=cfg.max_restarts,
                max_task_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=w),
            ).remote(w, spec)
            for w in range(workers)
        ]
        self.speed = [1.0] * workers
        self.down: set[int] = set()
        self.gone: set[int] = set()
        self.policy_version = 0
        self.restarts = 0  # workers brought back by recover(): an in-memory sync group must be reopened after one
        self._last_sync: tuple[Literal["adapter", "weights"], str, int] | None = None
        ray.get([h.version.remote() for h in self.handles])  # every engine is up

    # ------------------------------------------------------------------------------------------------------------
    def live(self) -> list[int]:
        """Indices of the workers that take work."""
        live = [w for w in range(len(self.handles)) if w not in self.down and w not in self.gone]
        if not live:
            self.recover()
            live = [w for w in range(len(self.handles)) if w not in self.gone]
        if not live:
            raise RuntimeError("every rollout worker is gone: the fleet cannot continue")
        return live

    def mark_down(self, w: int, exc: BaseException) -> None:
        """Stop giving work to worker ``w`` until :meth:`recover` sees it back."""
        if w not in self.down:
            warnings.warn(
                f"rollout worker {w} died ({type(exc).__name__}); its trees run on the other workers", stacklevel=2
            )
        self.down.add(w)

    def recover(self) -> None:
        """Bring restarted workers back (replaying the last weight sync); drop the ones that do not come back."""
        import ray

        for w in sorted(self.down):
            handle = self.handles[w]
            deadline = time.monotonic() + self.cfg.restart_timeout_s
            while True:
                try:
                    ray.get(handle.version.remote(), timeout=max(deadline - time.monotonic(), 0.1))
                    if self._last_sync is not None:
                        ray.get(handle.sync.remote(*self._last_sync), timeout=self.cfg.restart_timeout_s)
                    # a restarted worker's speed is unknown again: assume the fleet's mean so it gets its share
                    others = [self.speed[v] for v in range(len(self.handles)) if v != w and v not in self.gone]
                    self.speed[w] = sum(others) / len(others) if others else 1.0
                    self.restarts += 1
                    break
                except ray.exceptions.ActorUnavailableError:  # restarting: its engine is still starting
                    if time.monotonic() < deadline:
                        time.sleep(1.0)
                        continue
                    exc: BaseException = TimeoutError(f"not back after {self.cfg.restart_timeout_s:.0f}s")
                except Exception as error:  # restarts exhausted, node lost, or start-up failed
                    exc = error
                self.gone.add(w)
                warnings.warn(
                    f"rollout worker {w} did not restart ({type(exc).__name__}): the fleet shrinks to "
                    f"{len(self.handles) - len(self.gone)} workers",
                    stacklevel=2,
                )
                break
            self.down.discard(w)

    @property
    def size(self) -> int:
        """Workers currently in the fleet."""
        return len(self.handles) - len(self.gone)

    # ------------------------------------------------------------------------------------------------------------
    def submit(
        self, iteration: int, tasks: Sequence[Any], seed: int, make_rollout: Callable[[Any, str, int], Rollout]
    ) -> FleetCollection:
        """Start building the trees of ``tasks`` on the fleet under the workers' current policy version."""
        return FleetCollection(self, TreeJob(iteration, list(tasks), seed, make_rollout))

    def _fan_out(self, method: str, *args: Any) -> list[Any]:
        import ray

        refs = {w: getattr(self.handles[w], method).remote(*args) for w in self.live()}
        out = []
        for w, ref in refs.items():
            try:
                out.append(ray.get(ref))
            except Exception as exc:
                if not _dead(exc):
                    raise
                self.mark_down(w, exc)
        return out

    def load_adapter(self, path: str, version: int) -> None:
        """Every worker serves the LoRA adapter in ``path`` as ``version``."""
        self._sync("adapter", path, version)

    def update_weights(self, path: str, version: int) -> None:
        """Every worker reloads the full weights in directory ``path`` (the disk path), serving them as ``version``."""
        self._sync("weights", path, version)

    def _sync(self, kind: Literal["adapter", "weights"], path: str, version: int) -> None:
        self._last_sync = (kind, str(path), version)
        self._fan_out("sync", *self._last_sync)
        self.policy_version = version

    def set_version(self, version: int, path: str | None = None) -> None:
        """After an in-memory sync: every worker serves the received weights as ``version``; ``path`` (if the
        version was also saved) is what a restarted worker reloads."""
        self._fan_out("update_weight_version", str(version))
        if path is not None:
            self._last_sync = ("weights", str(path), version)
        self.policy_version = version

    def sleep(self) -> None:
        """Every worker's engine sleeps (colocated on GPUs; nothing on CPU)."""
        self._fan_out("sleep")

    def call_one(self, fn: Callable[[Any, Any], Any]) -> Any:
        """Run ``fn(policy engine, reasoner)`` on one live worker (held-out evaluation)."""
        import ray

        return ray.get(self.handles[self.live()[0]].call.remote(fn))

    def versions(self) -> list[int]:
        """The policy version every live worker serves."""
        return self._fan_out("version")

    def probe(self, prompt_ids: Sequence[int], max_tokens: int = 8) -> list[list[int]]:
        """Greedy tokens of every live worker for one prompt."""
        return self._fan_out("probe", list(prompt_ids), max_tokens)

    def probe_logprobs(self, prompts: list[list[int]], max_tokens: int) -> list[EngineProbe]:
        """Every live worker's greedy tokens and log-probs on the weight-sync probe (memrl.train.weight_sync)."""
        return self._fan_out("probe_logprobs", [list(p) for p in prompts], max_tokens)

    def weight_sync_client(self) -> Any:
        """vLLM's ``RayVLLMWeightSyncClient`` over the live workers (the in-memory NCCL path), except that every
        worker joins the trainer's NCCL group at its own ranks: the trainer is rank 0 and worker ``j``'s TP ranks
        start at ``1 + j * TP`` (vLLM's client gives every engine the same ranks, which only works for one engine or
        vLLM's data-parallel engines). vLLM is imported here, on the GPU path only."""
        import ray
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest
        from vllm.distributed.weight_transfer.clients import RayVLLMWeightSyncClient

        tp = self.tp

        class FleetWeightSyncClient(RayVLLMWeightSyncClient):
            def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
                ray.get(
                    [
                        h.init_weight_transfer_engine.remote(
                            WeightTransferInitRequest(init_info={**init_info, "rank_offset": 1 + j * tp})
                        )
                        for j, h in enumerate(self.handles)
                    ]
                )

        return FleetWeightSyncClient([self.handles[w] for w in self.live()])

    def close(self) -> None:
        """Stop the workers and remove their placement group."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for handle in self.handles:
            ray.kill(handle)
        remove_placement_group(self.group)


class LocalFleet:
    """One :class:`~memrl.rollout.worker.RolloutWorker` in this process, no Ray (``fleet.workers: 0``): the same
    interface as :class:`RolloutFleet`, a job built when it is submitted."""

    name = "local"
    size = 1

    def __init__(self, spec: WorkerSpec) -> None:
        self.worker = RolloutWorker(0, spec)
        self.spec = spec

    @property
    def policy_version(self) -> int:
        """The version the engine serves."""
        return self.worker.version()

    def submit(
        self, iteration: int, tasks: Sequence[Any], seed: int, make_rollout: Callable[[Any, str, int], Rollout]
    ) -> _Done:
        """Build the trees now (under the current policy version); the result is ready at once."""
        batch = self.worker.build(TreeJob(iteration, list(tasks), seed, make_rollout))
        return _Done(
            FleetResult(
                trees=batch.trees,
                metrics=_merge_metrics([batch]),
                worker_of={t.task_id: 0 for t in batch.trees},
                memory_calls={task_id: {0: calls} for task_id, calls in batch.memory_calls.items()},
                reruns=0,
            )
        )

    def load_adapter(self, path: str, version: int) -> None:
        """Serve the LoRA adapter in ``path`` as ``version``."""
        self.worker.sync("adapter", str(path), version)

    def update_weights(self, path: str, version: int) -> None:
        """Reload the full weights in ``path`` as ``version``."""
        self.worker.sync("weights", str(path), version)

    def sleep(self) -> None:
        """The engine sleeps (colocated on GPUs; nothing on CPU)."""
        self.worker.sleep()

    def probe_logprobs(self, prompts: list[list[int]], max_tokens: int) -> list[EngineProbe]:
        """The engine's greedy tokens and log-probs on the weight-sync probe (memrl.train.weight_sync)."""
        return [self.worker.probe_logprobs(prompts, max_tokens)]

    def call_one(self, fn: Callable[[Any, Any], Any]) -> Any:
        """Run ``fn(policy engine, reasoner)`` here."""
        return self.worker.call(fn)

    def close(self) -> None:
        """Close the engines."""
        self.worker.close()


@dataclass
class _Done:
    value: FleetResult

    def result(self) -> FleetResult:
        return self.value


def build_fleet(
    spec: WorkerSpec,
    cfg: FleetConfig,
    placement: PolicyPlacement | None = None,
) -> RolloutFleet | LocalFleet:
    """The rollout workers ``cfg`` asks for: Ray actors, or with ``workers: 0`` one worker in this process."""
    return LocalFleet(spec) if cfg.workers == 0 else RolloutFleet(spec, cfg, placement)
