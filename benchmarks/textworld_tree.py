"""Where the seconds of one OAT-GRPO rollout batch go on Microsoft TextWorld: the memory-call trees of one
iteration (``--trees`` games, one :func:`memrl.rollout.tree.build_trees` call, as the recipe builds them) on one cell,
timed by component: the memory model's generation, the frozen reasoner, TextWorld's own steps, the replay that
re-enters a state for a fork, and the rest (SAM's bookkeeping, the scheduler).

Each tree is built twice, with and without ``tree.share_greedy_calls`` (equal greedy calls computed once per build;
``--sharing on`` or ``off`` builds once), and the two builds' trees are compared: the JSON says whether they are
identical (a near-tie decided differently in another batch parts them), their digests, and the seconds per tree of
each. Only engines whose greedy answer is a function of the request share (transformers; on vLLM both builds are the
same). The transformers engine decodes by
continuous batching unless ``--no-continuous-batching`` (batched ``generate`` calls, its fallback).

    python -m benchmarks.textworld_tree --cell treasure_hunter/large --trees 6            # the tiny model
    python -m benchmarks.textworld_tree --cell treasure_hunter/large --trees 2 --model smollm2 --engine vllm

The components are wall-clock seconds inside each call, summed over calls (the memory model's: its decode steps and
joins under continuous batching, else its ``generate`` calls); the memory model runs in a thread of its own, so the
components overlap and their sum may exceed the build's wall time. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, bench_parser, emit, pin_threads


@contextmanager
def timed(targets: list[tuple[Any, str, str]]) -> Iterator[tuple[dict[str, float], Counter[str]]]:
    """Wrap each ``(class, method, component)`` to add its wall seconds and calls to the component's totals."""
    seconds: dict[str, float] = defaultdict(float)
    calls: Counter[str] = Counter()
    originals = [(cls, name, cls.__dict__[name]) for cls, name, _ in targets]

    def wrap(fn: Any, component: str) -> Any:
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[component] += time.perf_counter() - t0
                calls[component] += 1

        return timed_call

    for (cls, name, component), (_, _, fn) in zip(targets, originals, strict=True):
        setattr(cls, name, wrap(fn, component))
    try:
        yield seconds, calls
    finally:
        for cls, name, fn in originals:
            setattr(cls, name, fn)


def memory_engine(
    model: str,
    engine: str,
    model_cache: str,
    continuous_batching: bool = True,
    kv_cache_gib: float = 2.0,
    served: str = "weights",
) -> Any:
    """The memory model's engine: the tiny model, SmolLM2, or a checkpoint folder, float32 (on vLLM with a KV cache
    of ``kv_cache_gib``, as the TextWorld benchmark's RL engine). ``served="adapter"`` serves it through a fresh LoRA
    adapter, as an RL run that hot-loads its adapter does (``loop.lora_sync: adapter``): the adapter's update is zero,
    so the outputs are the model's, and the engine's LoRA ops are what is added."""
    from benchmarks.textworld import memory_engine_config
    from memrl.rollout.engines.factory import build_engine
    from memrl.rollout.models import TinyModelSpec, ensure_smollm2, ensure_tiny_model
    from memrl.train.policy import LoraSettings, PolicySpec, load_policy, save_policy

    if model == "tiny":
        path = ensure_tiny_model(model_cache, TinyModelSpec())
    elif model == "smollm2":
        path = ensure_smollm2(model_cache)
    else:
        path = Path(model)
    cfg = memory_engine_config(engine, "policy", path, kv_cache_gib, continuous_batching)
    if served == "weights":
        return build_engine(cfg)
    lora = LoraSettings()
    adapter = (
        Path(model_cache) / f"fresh-lora-r{lora.r}-{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]}"
    )
    if not (adapter / "adapter_config.json").exists():
        save_policy(load_policy(PolicySpec(base=str(path)), lora, init_seed=0)[0], adapter)
    built = build_engine(cfg.model_copy(update={"enable_lora": True, "max_lora_rank": lora.r}))
    built.load_adapter(str(adapter), 0)
    return built


def profile(args: argparse.Namespace) -> dict[str, Any]:
    """Build the trees with and without greedy sharing; the seconds per tree and component, and whether equal."""
    from memrl.data.envs.gym import GymTask
    from memrl.data.envs.ms_textworld import MsTextWorldEnv
    from memrl.data.tasks import TaskSetConfig, load_tasks
    from memrl.data.tasks.ms_textworld import MS_TEXTWORLD_SPLITS, TwReasoner
    from memrl.rollout.agents import task_rollout
    from memrl.rollout.engines.continuous_batching import RunningBatch
    from memrl.rollout.engines.scripted import ScriptedEngine
    from memrl.rollout.loop import EngineSet, Rollout
    from memrl.rollout.tree import TreeConfig, build_trees

    params = {"mix": [args.cell], "max_steps": args.max_steps, "cache_dir": args.game_cache}
    tasks = load_tasks(
        TaskSetConfig(family="ms_textworld", params=params, count=args.trees, seed=MS_TEXTWORLD_SPLITS["train"]),
        "train",
    )
    for task in tasks:
        task.record()  # generated before the clock starts
    memory_cfg = {
        "name": "sam",
        "page_turns": 1,
        "live_capacity_turns": 4,
        "keep_recent_turns": 3,
        "max_cue_tokens": 192,
        "sampling": {
            "consolidate": {"temperature": 0.0, "max_tokens": 192},
            "recall": {"temperature": 1.0, "max_tokens": 256},
        },
    }
    memory = memory_engine(
        args.model, args.engine, args.model_cache, not args.no_continuous_batching, args.kv_cache_gib, args.served
    )
    # the memory model's busy seconds: its decode steps and joins under continuous batching, else its generate calls
    decoding = (
        [(RunningBatch, "join", "memory_generation"), (RunningBatch, "step", "memory_generation")]
        if getattr(memory, "decoder", None) is not None
        else [(type(memory), "generate", "memory_generation")]
    )
    targets = [
        *decoding,
        (TwReasoner, "respond", "reasoner"),
        (MsTextWorldEnv, "step", "textworld_steps"),
        (MsTextWorldEnv, "reset", "textworld_resets"),
        (GymTask, "_replay", "replay"),
        (Rollout, "advance", "rollout_advance"),
        (Rollout, "pending", "rollout_pending"),
    ]
    builds: dict[str, Any] = {}
    dumps: dict[str, Any] = {}
    try:
        for share in {"both": (False, True), "off": (False,), "on": (True,)}[args.sharing]:
            label = "with_sharing" if share else "without_sharing"
            cfg = TreeConfig(
                mode="tree",
                branch_roles=["recall"],
                branch_factor=args.branch_factor,
                max_leaves=args.max_leaves,
                share_greedy_calls=share,
            )
            engines = EngineSet(reasoner=ScriptedEngine(TwReasoner(), name="reasoner"), memory=memory)
            with timed(targets) as (seconds, calls):
                t0 = time.perf_counter()
                trees, stats = build_trees(
                    tasks,
                    lambda task, rid: task_rollout(task, memory_cfg, seed=args.seed, rollout_id=rid),
                    engines,
                    cfg,
                    progress=f"trees ({label.replace('_', ' ')})",
                )
                wall = time.perf_counter() - t0
            leaves = [n for t in trees for n in t.nodes if n.kind == "leaf"]
            builds[label] = {
                "wall_s": round(wall, 2),
                "seconds_per_tree": round(wall / len(trees), 2),
                "components_s": {k: round(v, 2) for k, v in sorted(seconds.items())},
                "calls": dict(sorted(calls.items())),
                "engine_calls": stats.engine_calls,
                "shared_greedy_calls": stats.shared_greedy_calls,
                "memory_requests": sum(len(n.follow_up_calls) + 1 for t in trees for n in t.nodes if n.call),
                "nodes": sum(len(t.nodes) for t in trees),
                "leaves": len(leaves),
                "leaves_won": sum(float(n.outcome or 0) for n in leaves),
                "env_steps": sum(n.metadata["stats"].get("env_steps", 0) for n in leaves),
            }
            dumps[label] = [dumped(t) for t in trees]
            builds[label]["trees_digest"] = digest(dumps[label])
    finally:
        memory.close()
    both = len(builds) == 2
    return {
        "benchmark": "textworld_tree",
        "cell": args.cell,
        "model": args.model,
        "engine": args.engine,
        "kv_cache_gib": args.kv_cache_gib if args.engine == "vllm" else None,
        "served": args.served,
        "continuous_batching": getattr(memory, "decoder", None) is not None,
        "trees": args.trees,
        "settings": {
            "branch_factor": args.branch_factor,
            "max_leaves": args.max_leaves,
            "max_steps": args.max_steps,
            "seed": args.seed,
            "memory": memory_cfg,
        },
        "builds": builds,
        "trees_identical": dumps["without_sharing"] == dumps["with_sharing"] if both else None,
        "speedup": round(builds["without_sharing"]["wall_s"] / builds["with_sharing"]["wall_s"], 2) if both else None,
        "torch_threads": args.threads,
        "load_average": [round(x, 1) for x in os.getloadavg()],
    }


def dumped(tree: Any) -> dict[str, Any]:
    """A tree as data, without prefix-cache hits (they follow the batch compositions)."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "cached_prompt_tokens"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(tree.model_dump(mode="json"))


def digest(trees: list[dict[str, Any]]) -> str:
    """A short digest of the trees as data: equal across code versions when the trees are."""
    return hashlib.sha256(json.dumps(trees, sort_keys=True).encode()).hexdigest()[:16]


def main() -> None:
    parser = bench_parser(__doc__)
    parser.set_defaults(threads=2)
    parser.add_argument("--cell", default="treasure_hunter/large", help="challenge/size")
    parser.add_argument("--trees", type=int, default=6, help="games, one tree each, built together")
    parser.add_argument("--model", default="tiny", help="tiny, smollm2 or a checkpoint folder (the memory model)")
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument(
        "--no-continuous-batching", action="store_true", help="hf: batched generate() calls (the engine's fallback)"
    )
    parser.add_argument(
        "--sharing", choices=("both", "on", "off"), default="both", help="build with and/or without greedy sharing"
    )
    parser.add_argument("--kv-cache-gib", type=float, default=2.0, help="vllm: the KV cache in GiB")
    parser.add_argument(
        "--served",
        choices=("weights", "adapter"),
        default="weights",
        help="the model as weights (an RL run's lora_sync: merged) or through a fresh LoRA adapter (lora_sync: "
        "adapter)",
    )
    parser.add_argument("--branch-factor", type=int, default=4)
    parser.add_argument("--max-leaves", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=100, help="game commands per episode")
    parser.add_argument("--game-cache", default=str(ROOT / ".cache" / "textworld"))
    parser.add_argument("--model-cache", default=str(ROOT / ".cache" / "models"))
    args = parser.parse_args()
    pin_threads(args.threads)
    out = profile(args)
    out["command"] = "python -m benchmarks.textworld_tree " + " ".join(sys.argv[1:])
    emit(out, args.json_out)


if __name__ == "__main__":
    main()
