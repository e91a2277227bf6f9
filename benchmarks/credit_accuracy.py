"""How well does each credit method's advantage agree with a recall action's true value? A direct, low-variance test
of tree credit ("SAM: State-Adaptive Memory for Long-Horizon Reasoning Agent", arXiv 2605.24468, section 2.3)
without a learning run.

On the ``multihop`` SAM setting, the shared SFT checkpoint of benchmarks.ablations (built there when missing) plays
the SFT policy's own episodes on dev tasks; every recall it makes is a *state* (the rollout is forked just before the
recall call: the environment and memory snapshot make the continuation exact). At each state the policy samples 8
recall actions (temperature 1, as trained), and the SAM oracle expert answers the same request. An *action* is the
recall's first page read; later page reads are sampled in each continuation.

Ground truth (replay): Q(s, a) = mean outcome of ``--replays`` independent continuations of the state after action a
(the policy making every later memory call); the expert's recall is replayed the same way. The true advantage of
sibling k in a group of K is Q(s, a_k) - mean_j Q(s, a_j). Identical actions (equal token ids) share one Q.

Each method's advantage for the same K siblings, from its own independent samples (never the replays):

- ``tree`` (lambda 0): V(n) = mean outcome over the leaves below the sibling in a tree of at most 8 leaves, split
  evenly (K = 2: 4 leaves each; 4: 2; 8: 1), then GRPO's (r - mean) / std over the siblings;
- ``oat`` (lambda 0.5): r = V(n) + 0.5 (c(n) - c_bar), c from the committee (the oracle expert with the offline judge,
  the embedded default), then the same normalisation;
- ``flat``: flat GRPO's copied trajectory advantage: the outcome of one trajectory through the sibling, normalised by
  the mean and std of K trajectories of the same task from its start (the baseline flat GRPO uses);
- ``committee``: c(n) - c_bar alone (checks the committee against outcomes before it is mixed into the reward);
- ``oat_recoverability`` and ``committee_recoverability``: the same with the committee's recoverability judge
  (``committee.criterion: recoverability``, rewards/committee.py) instead of the lexical rubric.

**Tied groups.** Where a method's own leaves tie (the tree's V(n) equal across the K siblings), OAT's advantage is the
committee's alone: under the paper's GRPO formula it is about +-1 whatever the committee gap (issue 39). Scoring only
actions with a non-zero true advantage over all groups hides whether those committee-only advantages are right, so
every method is also scored on the tied groups alone (``tied_groups``): a sign agreement above 1/2 there means the
committee's preference between outcome-tied siblings points the way replay does; 1/2 is what a method that gives them
no advantage scores (the tree, or OAT with ``advantage: informative_only``).

Reasoner tokens per group: the tree's 8 continuations from the state (16 are run: the most any K needs), flat's K
trajectories from the task's start (the shared prefix up to the state is not counted for the tree).

Reported per method and K: sign agreement with the true advantage over actions whose true advantage is not 0 (a
method's 0 counts one half), and the Spearman rank correlation of the two over all the K-groups' actions, each with a
95% interval from a bootstrap over states (the actions of one state are not independent), over all groups and over
the tied groups alone; the reasoner tokens each method spends per group; each committee's rank correlation with Q, and
the expert's value gap.

    python -m benchmarks.credit_accuracy --quick      # under 15 min on 2 CPU cores
    python -m benchmarks.credit_accuracy              # >= 500 recall actions

One JSON line last.
"""

from __future__ import annotations

import copy
import json
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import bench_parser, emit, pin_threads

KS = (2, 4, 8)
NOISY_ORACLE = {"error_rate": 0.3, "verbatim": 1.0, "omission": 0.5}  # --policy noisy-oracle (as tree_vs_flat's)
MAX_LEAVES = 8  # the tree's leaf budget, split evenly among the K siblings
METHODS = ("tree", "oat", "flat", "committee", "oat_recoverability", "committee_recoverability")
CRITERIA = {"": "rubric", "_recoverability": "recoverability"}  # method suffix -> committee criterion


def ranks(values: Sequence[float]) -> list[float]:
    """Average ranks (ties share the mean of their positions)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2.0
        i = j + 1
    return out


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (None when either side is constant or there are fewer than two pairs)."""
    if len(x) < 2:
        return None
    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx = sum((a - mx) ** 2 for a in rx) ** 0.5
    sy = sum((b - my) ** 2 for b in ry) ** 0.5
    return None if sx == 0 or sy == 0 else sxy / (sx * sy)


def sign_agreement(pairs: Sequence[tuple[float, float]], tol: float = 1e-9) -> float | None:
    """Mean over (method, truth) pairs with a non-zero truth of: 1 same sign, 1/2 method 0, 0 opposite."""
    scored = [1.0 if m * t > 0 else 0.5 if abs(m) <= tol else 0.0 for m, t in pairs if abs(t) > tol]
    return statistics.fmean(scored) if scored else None


def bootstrap(states: list[list[tuple[float, float]]], stat: Any, draws: int = 1000, seed: int = 0) -> dict[str, Any]:
    """``stat`` over all pairs with a 95% percentile interval from resampling states with replacement."""
    flat = [p for s in states for p in s]
    point = stat(flat)
    rng = random.Random(seed)
    values = []
    for _ in range(draws):
        sample = [p for _ in states for p in states[rng.randrange(len(states))]]
        v = stat(sample)
        if v is not None:
            values.append(v)
    values.sort()
    ci = [values[int(0.025 * len(values))], values[int(0.975 * len(values)) - 1]] if values else None
    return {"value": point, "ci95": ci, "actions": len(flat), "nonzero_truth": sum(abs(t) > 1e-9 for _, t in flat)}


def centred(values: Sequence[float]) -> list[float]:
    mean = statistics.fmean(values)
    return [v - mean for v in values]


# ----------------------------------------------------------------------------------------------------------------
class Replayer:
    """Engines and the continuation machinery on one SFT checkpoint."""

    def __init__(self, bench: Any, seed: int) -> None:
        from memrl.rollout.engines.config import EngineConfig
        from memrl.rollout.engines.factory import build_engine
        from memrl.rollout.loop import EngineSet
        from memrl.train.oat_grpo import default_oracle

        self.bench = bench
        if bench.sft_dir is None:  # --policy noisy-oracle: the scripted expert with recall noise, no checkpoint
            self.policy = build_engine(
                EngineConfig(
                    backend="scripted",
                    name="policy",
                    scripted_policy="memrl.data.experts.sam:SamOracle",
                    scripted_kwargs={"config": NOISY_ORACLE},
                    tokenizer=str(bench.base),
                    seed=seed,
                )
            )
        else:
            self.policy = build_engine(
                EngineConfig(backend="hf", name="policy", model=str(bench.sft_dir), dtype="float32", batch_size=64)
            )
        self.engines = EngineSet(reasoner=build_engine(bench.reasoner_config(seed)), memory=self.policy)
        self.expert = build_engine(default_oracle(str(bench.base), seed))
        self.reasoner_tokens = 0

    def run(self, rollouts: list[Any]) -> list[float]:
        """Play ``rollouts`` to the end; their outcomes (reasoner tokens spent are added up)."""
        from memrl.rollout.loop import run_rollouts

        before = [r.reasoner_usage.spent for r in rollouts]
        run_rollouts(rollouts, self.engines)
        self.reasoner_tokens += sum(r.reasoner_usage.spent - b for r, b in zip(rollouts, before, strict=True))
        return [float(r.outcome or 0.0) for r in rollouts]

    def continue_after(self, state: Any, result: Any, sample: int, prefix: str, n: int) -> list[Any]:
        """``n`` forks of ``state`` that took sample ``sample`` of ``result`` as the recall (not yet played)."""
        forks = []
        for j in range(n):
            fork = state.fork(f"{state.rollout_id}.{prefix}{j}")
            fork.advance(result, sample=sample)
            forks.append(fork)
        return forks

    def close(self) -> None:
        self.policy.close()


def collect_states(
    rep: Replayer, tasks: list[Any], per_task: int, memory: Any, seed: int, roots: int
) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
    """The SFT policy's episodes: every first page read of a recall in trajectory 0 of each task is a state (at most
    ``per_task``); ``roots`` trajectories per task from its start give flat GRPO's baseline."""
    from memrl.rollout.agents import sam_rollout
    from memrl.rollout.loop import run_rollouts

    states: list[dict[str, Any]] = []

    def on_result(rollout: Any, call: Any, result: Any) -> None:
        first_read = (
            call.kind == "memory" and call.role == "recall" and not call.request.metadata.get("continues_action")
        )
        if first_read and rollout.rollout_id == "root0":
            mine = [s for s in states if s["task_id"] == rollout.env.task_id]
            if len(mine) < per_task:
                states.append(
                    {"task_id": rollout.env.task_id, "state": rollout.fork(f"s{len(states)}"), "request": call.request}
                )

    rollouts = [sam_rollout(t, memory, seed=seed, rollout_id=f"root{g}") for t in tasks for g in range(roots)]
    run_rollouts(rollouts, rep.engines, on_result=on_result, progress="episodes")
    rep.reasoner_tokens += sum(r.reasoner_usage.spent for r in rollouts)
    outcomes: dict[str, list[float]] = {}
    for r in rollouts:
        outcomes.setdefault(r.env.task_id, []).append(float(r.outcome or 0.0))
    return states, outcomes


def committee_scores(
    requests: list[Any], results: list[Any], seed: int, tokenizer: str, criterion: str = "rubric"
) -> list[list[float | None]]:
    """c(n) of every sampled action at every state (the oracle committee with the offline judge, asking the
    ``criterion``'s question)."""
    from memrl.data.schemas import MemoryCallTree, TreeNode
    from memrl.rewards.committee import Committee, CommitteeConfig
    from memrl.rollout.engines.base import to_memory_call
    from memrl.rollout.engines.factory import build_engine
    from memrl.train.oat_grpo import default_oracle

    trees = []
    for i, (request, result) in enumerate(zip(requests, results, strict=True)):
        nodes = [TreeNode(node_id="root", kind="root", children=[f"a{k}" for k in range(len(result.completions))])]
        for k in range(len(result.completions)):
            call = to_memory_call(f"s{i}/a{k}", "recall", request, result, k, metadata=dict(request.metadata))
            nodes.append(TreeNode(node_id=f"a{k}", parent_id="root", depth=1, kind="memory", call=call, group_id="g"))
        task_id = str(request.metadata.get("task_id", i))
        trees.append(MemoryCallTree(tree_id=f"s{i}", task_id=task_id, root_id="root", nodes=nodes))
    committee = Committee(CommitteeConfig(criterion=criterion), [build_engine(default_oracle(tokenizer, seed))], None)
    committee.score(trees)
    return [[n.committee_score for n in t.nodes if n.kind == "memory"] for t in trees]


def group_advantages_by_method(
    q_tree: list[float],
    committee: list[float | None],
    flat_outcomes: list[float],
    root_outcomes: list[float],
    recoverability: list[float | None] | None = None,
) -> dict[str, list[float]]:
    """The K siblings' advantages under each method (module docstring): OAT's are the paper's formula
    (:data:`memrl.rewards.advantage.ADVANTAGE_PRESETS` ``grpo_std``) over V(n) and lambda (c - c_bar)."""
    from memrl.rewards.advantage import ADVANTAGE_PRESETS, group_advantages, shaped_group_advantages

    out = {"tree": group_advantages(q_tree, "std")}
    for suffix, scores in (("", committee), ("_recoverability", recoverability)):
        if scores is not None and all(c is not None for c in scores):
            c = [float(x) for x in scores]  # type: ignore[arg-type]
            out[f"oat{suffix}"] = shaped_group_advantages(
                q_tree, [0.5 * d for d in centred(c)], ADVANTAGE_PRESETS["grpo_std"]
            )
            out[f"committee{suffix}"] = centred(c)
    mean = statistics.fmean(root_outcomes)
    std = statistics.pstdev(root_outcomes)
    out["flat"] = [0.0 if std <= 1e-9 else (o - mean) / (std + 1e-6) for o in flat_outcomes]
    return out


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer states and replays (under 15 min on 2 cores)")
    parser.add_argument("--tasks", type=int, default=None, help="dev tasks whose episodes give the states")
    parser.add_argument("--states-per-task", type=int, default=3)
    parser.add_argument("--replays", type=int, default=None, help="continuations per action for the ground truth")
    parser.add_argument("--setting", default="multihop")
    parser.add_argument("--work", default="runs/ablations", help="where the shared SFT checkpoint lives")
    parser.add_argument("--model-cache", default=".cache/models")
    parser.add_argument(
        "--policy",
        default=None,
        help="a model directory to use instead of the shared SFT checkpoint, "
        "or 'noisy-oracle': the scripted SAM expert with recall noise (no checkpoint: a smoke run)",
    )
    args = parser.parse_args()
    pin_threads(args.threads)
    n_tasks = args.tasks or (8 if args.quick else 24)
    replays = args.replays or (8 if args.quick else 16)

    from benchmarks.harness import weights_digest
    from benchmarks.sam_start import SamStart
    from memrl.data.tasks import TaskSetConfig, load_tasks

    t_start = time.perf_counter()
    bench = SamStart(args.setting, Path(args.work), args.model_cache)
    if args.policy is None:
        bench.prepare()
    elif args.policy == "noisy-oracle":
        from memrl.rollout.models import TinyModelSpec, ensure_tiny_model

        bench.base, bench.sft_dir = ensure_tiny_model(args.model_cache, TinyModelSpec()), None
        bench.start = {"base_weights": weights_digest(bench.base)[:16], "policy": f"noisy-oracle {NOISY_ORACLE}"}
    else:
        from memrl.rollout.models import TinyModelSpec, ensure_tiny_model

        bench.base, bench.sft_dir = ensure_tiny_model(args.model_cache, TinyModelSpec()), Path(args.policy)
        bench.start = {
            "base_weights": weights_digest(bench.base)[:16],
            "policy_weights": weights_digest(bench.sft_dir)[:16],
        }
    tasks = load_tasks(TaskSetConfig(count=n_tasks, seed=bench.setting.dev_seed + 7, sam=bench.setting.test), "dev")
    rep = Replayer(bench, args.seed)
    max_k = max(KS)
    try:
        states, root_outcomes = collect_states(rep, tasks, args.states_per_task, bench.memory, args.seed, max_k)
        print(
            f"[credit_accuracy] {len(states)} recall states from {n_tasks} tasks "
            f"({time.perf_counter() - t_start:.0f} s)",
            flush=True,
        )
        if not states:
            raise SystemExit(
                f"credit_accuracy: the policy made no recall in the episodes of {n_tasks} dev tasks: "
                "there is no state to score (more --tasks, or a policy that recalls)"
            )
        root_tokens = rep.reasoner_tokens
        # the K = 8 samples of each state (K = 2, 4 use the first ones) and the expert's recall
        requests = []
        for s in states:
            request = copy.deepcopy(s["request"])
            request.sampling.n = max_k
            requests.append(request)
        samples = rep.policy.generate(requests)
        expert = rep.expert.generate([s["request"] for s in states])
        scores = committee_scores([s["request"] for s in states], samples, args.seed, str(bench.base))
        recoverable = committee_scores(
            [s["request"] for s in states], samples, args.seed, str(bench.base), "recoverability"
        )
        # ground truth: replays of every distinct action and of the expert's; the tree's own leaves: independent
        gt_forks, tree_forks, expert_forks = [], [], []
        for s, result, exp in zip(states, samples, expert, strict=True):
            keys = [tuple(c.response_ids) for c in result.completions]
            s["keys"] = keys
            first = {key: keys.index(key) for key in keys}
            s["gt"] = {key: rep.continue_after(s["state"], result, k, "gt", replays) for key, k in first.items()}
            gt_forks += [f for fs in s["gt"].values() for f in fs]
            leaves = [MAX_LEAVES // 2] * 2 + [MAX_LEAVES // 4] * 2 + [MAX_LEAVES // 8] * 4  # most any K needs
            s["tree"] = [rep.continue_after(s["state"], result, k, "tree", n) for k, n in enumerate(leaves)]
            tree_forks += [f for fs in s["tree"] for f in fs]
            s["expert"] = rep.continue_after(s["state"], exp, 0, "expert", replays)
            expert_forks += s["expert"]
        t0 = time.perf_counter()
        rep.reasoner_tokens = 0
        rep.run(tree_forks)
        tree_tokens = rep.reasoner_tokens
        rep.run(gt_forks + expert_forks)
        print(
            f"[credit_accuracy] {len(gt_forks) + len(expert_forks) + len(tree_forks)} continuations "
            f"({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    finally:
        rep.close()

    def mean_outcome(forks: list[Any]) -> float:
        return statistics.fmean(float(f.outcome or 0.0) for f in forks)

    results: dict[str, Any] = {}
    per_state: dict[tuple[str, int], list[list[tuple[float, float]]]] = {(m, k): [] for m in METHODS for k in KS}
    tied: dict[tuple[str, int], list[list[tuple[float, float]]]] = {(m, k): [] for m in METHODS for k in KS}
    committee_vs_q: dict[str, list[tuple[float, float]]] = {suffix: [] for suffix in CRITERIA}
    expert_gap = []
    true_ties = {k: 0 for k in KS}
    for s, c_scores, r_scores in zip(states, scores, recoverable, strict=True):
        q = [mean_outcome(s["gt"][key]) for key in s["keys"]]
        expert_gap.append(mean_outcome(s["expert"]) - statistics.fmean(q))
        for suffix, cs in (("", c_scores), ("_recoverability", r_scores)):
            committee_vs_q[suffix] += [(float(c), v) for c, v in zip(cs, q, strict=True) if c is not None]
        for k in KS:
            truth = centred(q[:k])
            true_ties[k] += max(q[:k]) - min(q[:k]) <= 1e-9
            per_leaf = MAX_LEAVES // k
            pooled: dict[tuple[int, ...], list[Any]] = {}  # identical siblings are one node: their leaves pool
            for i in range(k):
                pooled.setdefault(s["keys"][i], []).extend(s["tree"][i][:per_leaf])
            v_tree = [mean_outcome(pooled[s["keys"][i]]) for i in range(k)]
            flat = [float(s["tree"][i][0].outcome or 0.0) for i in range(k)]
            advs = group_advantages_by_method(v_tree, c_scores[:k], flat, root_outcomes[s["task_id"]][:k], r_scores[:k])
            outcome_tied = max(v_tree) - min(v_tree) <= 1e-9
            for method, adv in advs.items():
                per_state[(method, k)].append(list(zip(adv, truth, strict=True)))
                if outcome_tied:
                    tied[(method, k)].append(list(zip(adv, truth, strict=True)))

    def scored(groups: list[list[tuple[float, float]]]) -> dict[str, Any]:
        return {
            "sign_agreement": bootstrap(groups, sign_agreement),
            "rank_correlation": bootstrap(
                groups, lambda p: spearman([a for a, _ in p], [t for _, t in p]) if len(p) > 2 else None
            ),
        }

    for k in KS:
        results[f"K={k}"] = {
            "groups": len(states),
            "actions": len(states) * k,
            "true_value_tie_groups": true_ties[k],
            **{method: scored(per_state[(method, k)]) for method in METHODS if per_state[(method, k)]},
            # the groups whose own leaves tied: OAT's advantage there is the committee's alone
            "tied_groups": {
                "groups": len(tied[("tree", k)]),
                **{method: scored(tied[(method, k)]) for method in METHODS if tied[(method, k)]},
            },
            # continuations from the state (tree: its 8 leaves) or trajectories from the task's start (flat: K)
            "reasoner_tokens_per_group": {
                "tree": round(tree_tokens / max(len(states), 1) * MAX_LEAVES / 16),
                "flat": round(root_tokens / max(len(tasks), 1) * k / max_k),
            },
        }
    record = {
        "benchmark": "credit_accuracy",
        "setting": args.setting,
        "quick": args.quick,
        **bench.start,  # the weights the states and replays come from
        "tasks": n_tasks,
        "states": len(states),
        "replays_per_action": replays,
        "recall_actions": sum(len(states) * k for k in KS),
        **{
            f"committee{suffix}_vs_true_value": {
                "rank_correlation": spearman([c for c, _ in pairs], [v for _, v in pairs]),
                "pairs": len(pairs),
            }
            for suffix, pairs in committee_vs_q.items()
        },
        "expert_value_gap_mean": statistics.fmean(expert_gap) if expert_gap else None,
        "wall_seconds": round(time.perf_counter() - t_start, 1),
        "by_k": results,
    }
    out = Path(args.work) / ("credit_accuracy_quick.json" if args.quick else "credit_accuracy.json")
    out.write_text(json.dumps(record, indent=1) + "\n")
    emit(record, args.json_out)


if __name__ == "__main__":
    main()
