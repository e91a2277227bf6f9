"""Reasoner tokens per credit-bearing memory action: memory-call trees (OAT-GRPO) vs flat trajectories (vanilla GRPO).

Both modes run the same SAM tasks with the same rollout seeds through :func:`memrl.rollout.tree.build_trees`:
- tree: the recall is sampled K times from one parent context and each sibling is continued by its own copy of the
  reasoner (``branch_factor`` K, depth 2, up to K^2 leaves);
- flat: K independent trajectories per task (``flat_group_size`` K).
A *credit-bearing* memory action is one that a group compares with alternatives: a tree node with at least one
sibling, or any recall of a flat trajectory (its group holds the task's K trajectories). Reasoner tokens are what the
frozen reasoner computes: prefill not served from the prefix cache plus generated tokens
(:attr:`memrl.data.schemas.TokenUsage.spent`). The reasoner is the scripted SAM reasoner with the tiny model's
tokenizer, so its engine simulates vLLM's prefix cache (blocks of 16 tokens, reusable after the batch that computed
them): flat
trajectories of one task share their identical prefixes through that cache, so the figure is what a real engine
would spend, not a naive count.

The memory model is the SAM oracle expert: a noise-free one writes the cues (deterministic, as a greedy memory model
would, so the flat trajectories of a task agree until their first recall) and a noisy one recalls (errors and
omissions, so sibling recalls differ and outcomes vary). Committee rewards are off: they cost no reasoner tokens.

    .venv/bin/python -m benchmarks.tree_vs_flat [--tasks 16 --horizon 12 --ks 2 4 8 --replays 8]

Prints a table, then one JSON object last: for every K, tokens per credit-bearing action in each mode and their
ratio ``flat_over_tree`` (> 1: trees spend fewer reasoner tokens per trained action); beside it the same ratio per
action whose advantage came out nonzero (``flat_over_tree_informative``: sibling recalls that lead to the same outcome
carry no signal in a tree) and without prefix caching (``flat_over_tree_uncached``: prompt + generated tokens).

**Per correctly-signed credited action** (``flat_over_tree_correctly_signed``). Every action of a flat trajectory is
"credit-bearing", although all of a trajectory's actions share one outcome, so the ratio above flatters flat GRPO.
Replay gives each credited action a ground truth, as ``benchmarks/credit_accuracy.py`` does: the rollout is forked at
the action's state (the environment and memory copy make the continuation exact) and ``--replays`` continuations are
played from there (the memory model making every later call). A tree sibling's true advantage is Q(s, a) - the mean
of Q(s, a_k) over the K sampled siblings, Q the mean outcome of the continuations after its first page read; a flat
action's is Q(s, a) - V(s), V(s) the mean outcome of ``--replays`` continuations that sample the action afresh. An
action is correctly signed when its advantage and its true advantage have the same non-zero sign; the tree's
sibling-level units are scored (a unit sharing its first read with others: their pooled truth), the groups nested
inside a shared read are counted apart (``credited_actions_unscored``). The replays are a measurement, not spent by
either method: the ratio divides each mode's own reasoner tokens by its correctly-signed actions.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import bench_parser, emit, pin_threads

ROOT = Path(__file__).resolve().parents[1]


def run_mode(tasks: list[Any], mode: str, k: int, tokenizer: str, args: argparse.Namespace) -> dict[str, Any]:
    """Build trees (or flat groups) for ``tasks`` with fresh engines (an empty prefix cache) and count tokens."""
    from memrl.launch.quickstart import QuickstartConfig
    from memrl.rewards.credit import CreditConfig, assign_credit, assign_flat_credit
    from memrl.rollout.agents import sam_rollout
    from memrl.rollout.engines.config import EngineConfig
    from memrl.rollout.engines.factory import build_engine
    from memrl.rollout.loop import EngineSet
    from memrl.rollout.tree import TreeConfig, build_trees

    def scripted(name: str, policy: str, kwargs: dict[str, Any]) -> Any:
        return build_engine(
            EngineConfig(
                backend="scripted",
                name=name,
                scripted_policy=policy,
                scripted_kwargs=kwargs,
                tokenizer=tokenizer,
                seed=args.seed,
            )
        )

    reasoner = scripted("reasoner", "memrl.data.tasks.sam:SamReasoner", {"max_pages": 2, "recall_budget": 2})
    noisy = {"config": {"error_rate": args.error_rate, "verbatim": 1.0, "omission": args.omission}}
    engines = EngineSet(
        reasoner=reasoner,
        memory=scripted("recall", "memrl.data.experts.sam:SamOracle", noisy),
        by_role={"consolidate": scripted("consolidate", "memrl.data.experts.sam:SamOracle", {})},
    )
    memory = QuickstartConfig().memory  # SAM as the quickstart trains inside it
    cfg = TreeConfig(
        mode=mode, branch_roles=["recall"], branch_factor=k, max_branch_depth=2, max_leaves=k * k, flat_group_size=k
    )

    def make(task: Any, rollout_id: str) -> Any:
        return sam_rollout(task, memory, seed=args.seed, rollout_id=rollout_id)

    states: list[dict[str, Any]] = []

    def on_action(state: Any, call: Any, result: Any, ids: list[str]) -> None:
        if args.replays and (mode == "flat" or len(ids) > 1):
            states.append(
                {
                    "state": state.fork(f"{state.rollout_id}~s"),
                    "call": call,
                    "result": result,
                    "ids": ids,
                    "group": f"g:{state.rollout_id}:{ids[0].rsplit(':', 1)[1]}",
                    "task_id": state.env.task_id,
                }
            )

    start = time.perf_counter()
    trees, stats = build_trees(tasks, make, engines, cfg, on_action=on_action)
    seconds = time.perf_counter() - start
    credit = CreditConfig(terms=[])
    for tree in trees:
        (assign_credit if mode == "tree" else assign_flat_credit)(tree, credit)
    signed = correctly_signed(trees, states, engines, mode, args) if args.replays else {}
    actions = informative = 0
    for tree in trees:
        siblings: dict[str, int] = {}
        memory_nodes = [n for n in tree.nodes if n.kind == "memory"]
        for node in memory_nodes:
            siblings[node.group_id or node.node_id] = siblings.get(node.group_id or node.node_id, 0) + 1
        for node in memory_nodes:
            if mode == "flat" or siblings[node.group_id or node.node_id] > 1:
                actions += 1
                informative += bool(node.advantage)
    spent = sum(t.reasoner_usage.spent for t in trees)
    prompt = sum(t.reasoner_usage.prompt_tokens for t in trees)
    cached = sum(t.reasoner_usage.cached_prompt_tokens for t in trees)
    generated = sum(t.reasoner_usage.completion_tokens for t in trees)
    leaves = [n for t in trees for n in t.nodes if n.kind == "leaf"]
    return {
        "reasoner_tokens": spent,
        "reasoner_prompt_tokens": prompt,
        "reasoner_cached_prompt_tokens": cached,
        "reasoner_generated_tokens": generated,
        "reasoner_calls": sum(t.reasoner_usage.calls for t in trees),
        "credit_bearing_actions": actions,
        "actions_with_nonzero_advantage": informative,
        "reasoner_tokens_per_action": spent / max(actions, 1),
        "reasoner_tokens_per_informative_action": spent / max(informative, 1),
        "reasoner_tokens_uncached_per_action": (prompt + generated) / max(actions, 1),
        "leaves": len(leaves),
        "success": sum(leaf.outcome or 0.0 for leaf in leaves) / max(len(leaves), 1),
        "engine_calls": sum(stats.engine_calls.values()),
        "seconds": round(seconds, 2),
        **signed,
        **(
            {"reasoner_tokens_per_correctly_signed_action": spent / max(signed["correctly_signed_actions"], 1)}
            if signed
            else {}
        ),
    }


def _outcomes(forks: list[Any], engines: Any) -> list[float]:
    from memrl.rollout.loop import run_rollouts

    run_rollouts(forks, engines)
    return [float(f.outcome or 0.0) for f in forks]


def _covered(node: Any, nodes: dict[str, Any]) -> list[str]:
    """The sampled sibling nodes a credited unit stands for: itself, the identical copies merged into it, and, for a
    node of shared first calls, the siblings that share them (and their copies)."""
    members = node.metadata.get("shared_by") or [node.node_id]
    out = []
    for m in members:
        out += [m, *(nodes[m].metadata.get("merged", []) if m in nodes else [])]
    return out


def correctly_signed(
    trees: list[Any], states: list[dict[str, Any]], engines: Any, mode: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Replay every credited action's state (module docstring): how many credited actions carry an advantage whose
    sign is that of their true advantage."""
    import copy
    import statistics

    t0 = time.perf_counter()
    r = args.replays
    per_tree = {t.task_id: {n.node_id: n for n in t.nodes} for t in trees}
    scored = correct = nonzero_truth = 0
    forks: list[Any] = []
    plans = []  # per state: what its forks estimate
    for i, st in enumerate(states):
        result, state = st["result"], st["state"]
        if mode == "tree":
            keys = [tuple(c.response_ids) or c.text for c in result.completions]
            first = {key: keys.index(key) for key in keys}
            q_forks = {}
            for key, k in first.items():
                q_forks[key] = [state.fork(f"{state.rollout_id}~{i}q{k}.{j}") for j in range(r)]
                for f in q_forks[key]:
                    f.advance(result, sample=k)
                forks += q_forks[key]
            plans.append((st, keys, q_forks, None))
        else:
            q = [state.fork(f"{state.rollout_id}~{i}q.{j}") for j in range(r)]
            for f in q:
                f.advance(result, sample=0)
            request = copy.deepcopy(st["call"].request)
            request.sampling.n = r
            request.sampling.seed = (request.sampling.seed or 0) + 7_919
            fresh = engines.for_call(st["call"]).generate([request])[0]
            v = [state.fork(f"{state.rollout_id}~{i}v.{j}") for j in range(r)]
            for j, f in enumerate(v):
                f.advance(fresh, sample=j)
            forks += q + v
            plans.append((st, None, {"q": q}, v))
    _outcomes(forks, engines)

    def mean(fs: list[Any]) -> float:
        return statistics.fmean(float(f.outcome or 0.0) for f in fs)

    unscored = 0
    for st, keys, q_forks, v in plans:
        nodes = per_tree[st["task_id"]]
        if mode == "tree":
            q = {key: mean(fs) for key, fs in q_forks.items()}
            baseline = statistics.fmean(q[key] for key in keys)
            sample_key = dict(zip(st["ids"], keys, strict=True))
            units = [n for n in nodes.values() if n.group_id == st["group"] and n.kind == "memory"]
            if len(units) < 2:  # every sibling the same action: nothing credited here
                continue
            nested = [n for n in nodes.values() if (n.group_id or "").startswith(st["group"] + ">")]
            unscored += len(nested)
            pairs = []
            for unit in units:
                covered = [sample_key[c] for c in _covered(unit, nodes) if c in sample_key]
                if covered:
                    pairs.append((unit.advantage or 0.0, q[covered[0]] - baseline))
        else:
            node = nodes.get(st["ids"][0])
            pairs = [] if node is None else [(node.advantage or 0.0, mean(q_forks["q"]) - mean(v))]
        for advantage, truth in pairs:
            scored += 1
            nonzero_truth += abs(truth) > 1e-9
            correct += abs(truth) > 1e-9 and advantage * truth > 0
    return {
        "credited_actions_scored": scored,
        "credited_actions_unscored": unscored,
        "actions_with_nonzero_true_advantage": nonzero_truth,
        "correctly_signed_actions": correct,
        "replays_per_action": r,
        "replay_seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--horizon", type=int, default=12, help="tour steps of every SAM task")
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--error-rate", type=float, default=0.3, help="recall noise of the memory model")
    parser.add_argument("--omission", type=float, default=0.5, help="weight of omissions among recall errors")
    parser.add_argument(
        "--replays",
        type=int,
        default=8,
        help="continuations per credited action for the replay ground truth (0: skip it)",
    )
    args = parser.parse_args()
    pin_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from memrl.data.tasks import TaskSetConfig, load_tasks
    from memrl.data.tasks.sam import SamTaskParams
    from memrl.rollout.models import TinyModelSpec, ensure_tiny_model

    tokenizer = str(
        ensure_tiny_model(Path(os.environ.get("MEMRL_MODEL_CACHE", ROOT / ".cache" / "models")), TinyModelSpec())
    )
    params = SamTaskParams(horizon_steps=args.horizon, facts_per_obs=1, containers_per_room=2)
    tasks = load_tasks(TaskSetConfig(count=args.tasks, seed=args.seed, sam=params), "bench")

    results: dict[str, Any] = {}
    print(f"{'K':>3} {'mode':>5} {'actions':>8} {'tokens':>9} {'cached':>9} {'per action':>11} {'success':>8}")
    for k in args.ks:
        row: dict[str, Any] = {}
        for mode in ("tree", "flat"):
            r = run_mode(tasks, mode, k, tokenizer, args)
            row[mode] = r
            print(
                f"{k:>3} {mode:>5} {r['credit_bearing_actions']:>8} {r['reasoner_tokens']:>9} "
                f"{r['reasoner_cached_prompt_tokens']:>9} {r['reasoner_tokens_per_action']:>11.1f} "
                f"{r['success']:>8.3f}",
                flush=True,
            )
        row["flat_over_tree"] = row["flat"]["reasoner_tokens_per_action"] / max(
            row["tree"]["reasoner_tokens_per_action"], 1e-9
        )
        suffixes = [("informative", "per_informative_action"), ("uncached", "uncached_per_action")]
        if args.replays:
            suffixes.append(("correctly_signed", "per_correctly_signed_action"))
        for suffix, key in suffixes:
            row[f"flat_over_tree_{suffix}"] = row["flat"][f"reasoner_tokens_{key}"] / max(
                row["tree"][f"reasoner_tokens_{key}"], 1e-9
            )
        results[str(k)] = row
    summary = {
        "benchmark": "tree_vs_flat",
        "tasks": args.tasks,
        "horizon": args.horizon,
        "recall_error_rate": args.error_rate,
        "replays_per_action": args.replays,
        "flat_over_tree": {k: round(v["flat_over_tree"], 3) for k, v in results.items()},
        "per_k": {
            k: {
                "tree_reasoner_tokens_per_action": round(v["tree"]["reasoner_tokens_per_action"], 1),
                "flat_reasoner_tokens_per_action": round(v["flat"]["reasoner_tokens_per_action"], 1),
                "flat_over_tree": round(v["flat_over_tree"], 3),
                "flat_over_tree_informative": round(v["flat_over_tree_informative"], 3),
                "flat_over_tree_uncached": round(v["flat_over_tree_uncached"], 3),
                **(
                    {
                        "flat_over_tree_correctly_signed": round(v["flat_over_tree_correctly_signed"], 3),
                        "tree_reasoner_tokens_per_correctly_signed_action": round(
                            v["tree"]["reasoner_tokens_per_correctly_signed_action"], 1
                        ),
                        "flat_reasoner_tokens_per_correctly_signed_action": round(
                            v["flat"]["reasoner_tokens_per_correctly_signed_action"], 1
                        ),
                    }
                    if args.replays
                    else {}
                ),
                "tree": v["tree"],
                "flat": v["flat"],
            }
            for k, v in results.items()
        },
    }
    emit(summary, args.json_out)


if __name__ == "__main__":
    main()
