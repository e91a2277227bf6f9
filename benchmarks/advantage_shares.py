"""Where an OAT-GRPO update's advantage comes from, under each advantage option, on the same trees (issue 39 items 1-3).

One batch of memory-call trees as the ``oat`` variant of ``benchmarks/ablations.py`` builds them (the ``multihop``
setting's training tasks, K = 4 siblings per recall, at most 16 leaves, the oracle committee with the offline judge,
lambda 0.5) from one policy: the shared SFT checkpoint of ``benchmarks/ablations.py`` (built there when missing), a
model directory, or ``noisy-oracle`` (the scripted SAM expert with recall noise: a smoke run without a checkpoint).
Then, without training, every option's credit on copies of those trees (:func:`memrl.rewards.groups.credit_and_groups`
and the trainer's rows, :func:`memrl.train.rows.rows_from_groups`):

- the advantage presets of :mod:`memrl.rewards.advantage` (``grpo_std`` is the paper's formula), each with the tree
  branching at the siblings' first differing call (``credit.shared_prefix: branch``) and without (``separate``);
- per option: the rows an update would train and their response tokens, whether it updates at all, and the
  diagnostics the trainer logs (:func:`memrl.train.rows.advantage_shares`): the share of rows and of the total |A|
  from outcome-tied groups, identical rows and the share of |A| that cancels on them; the mean |A| of rows from tied
  and from outcome-informative groups.

The audit behind issue 39 read these off training logs: committee-only tied groups carried 46% of the advantage mass
with mean |A| 0.97 under ``grpo_std``, and 65% of the |A| of duplicated sibling rows cancelled. Here they are computed
for every option on one batch, so options are compared on the same trees.

    python benchmarks/advantage_shares.py [--tasks 32] [--policy DIR | noisy-oracle] [--criterion recoverability]

A table, then one JSON line last.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.ablations when run as a script

NOISY_ORACLE = {"error_rate": 0.3, "verbatim": 1.0, "omission": 0.5}


def option_shares(trees: list[Any], preset: str, shared_prefix: str, committee_weight: float,
                  seed: int) -> dict[str, Any]:
    """The rows one update would train on copies of ``trees`` under one option, and where their advantage comes
    from."""
    from memrl.rewards.credit import CreditConfig
    from memrl.rewards.groups import credit_and_groups
    from memrl.train.rows import advantage_shares, rows_from_groups

    cfg = CreditConfig(committee_weight=committee_weight, advantage=preset, shared_prefix=shared_prefix)
    groups, credit = credit_and_groups(copy.deepcopy(trees), cfg, "tree", seed)
    rows = rows_from_groups(groups)
    tied = [abs(r.advantage) for r in rows if r.outcome_tied]
    informative = [abs(r.advantage) for r in rows if not r.outcome_tied]
    return {
        "rows": len(rows), "trained_tokens": sum(len(r.response_ids) for r in rows), "updates": bool(rows),
        "informative_groups": credit["informative_groups"], "outcome_tie_fraction": credit.get("outcome_tie_fraction"),
        "prefix_shared_sibling_fraction": credit.get("prefix_shared_sibling_fraction"),
        "abs_advantage_tied_mean": statistics.fmean(tied) if tied else None,
        "abs_advantage_informative_mean": statistics.fmean(informative) if informative else None,
        **advantage_shares(rows),
    }


def build_batch(args: argparse.Namespace) -> tuple[list[Any], dict[str, Any]]:
    """The trees of one batch (module docstring) and what they were built from."""
    from benchmarks.ablations import Bench, weights_digest
    from memrl.data.tasks import TaskSetConfig, load_tasks
    from memrl.rewards.committee import Committee, CommitteeConfig
    from memrl.rollout.agents import sam_rollout
    from memrl.rollout.engines.config import EngineConfig
    from memrl.rollout.engines.factory import build_engine
    from memrl.rollout.loop import EngineSet
    from memrl.rollout.models import TinyModelSpec, ensure_tiny_model
    from memrl.rollout.tree import TreeConfig, build_trees
    from memrl.train.oat_grpo import default_oracle

    bench = Bench(argparse.Namespace(quick=True, setting=args.setting, work=args.work, split="dev",
                                     model_cache=args.model_cache))
    if args.policy is None:
        bench.prepare()
        policy_cfg = EngineConfig(backend="hf", name="policy", model=str(bench.sft_dir), dtype="float32",
                                  batch_size=64)
        start = dict(bench.start)
    else:
        bench.base = ensure_tiny_model(args.model_cache, TinyModelSpec())
        if args.policy == "noisy-oracle":
            policy_cfg = EngineConfig(backend="scripted", name="policy",
                                      scripted_policy="memrl.data.experts.sam:SamOracle",
                                      scripted_kwargs={"config": NOISY_ORACLE}, tokenizer=str(bench.base),
                                      seed=args.seed)
            start = {"base_weights": weights_digest(bench.base)[:16], "policy": f"noisy-oracle {NOISY_ORACLE}"}
        else:
            policy_cfg = EngineConfig(backend="hf", name="policy", model=args.policy, dtype="float32", batch_size=64)
            start = {"base_weights": weights_digest(bench.base)[:16],
                     "policy_weights": weights_digest(Path(args.policy))[:16]}
    tasks = load_tasks(TaskSetConfig(count=args.tasks, seed=bench.setting.train_seed + args.seed,
                                     sam=bench.setting.train), "train")
    policy = build_engine(policy_cfg)
    engines = EngineSet(reasoner=build_engine(bench.reasoner_config(args.seed)), memory=policy)
    tree = TreeConfig(branch_roles=["recall"], branch_factor=args.k, max_leaves=args.max_leaves)
    try:
        trees, _ = build_trees(tasks, lambda task, rid: sam_rollout(task, bench.memory, seed=args.seed,
                                                                    rollout_id=rid),
                               engines, tree, progress="trees")
    finally:
        policy.close()
    committee = Committee(CommitteeConfig(criterion=args.criterion),
                          [build_engine(default_oracle(str(bench.base), args.seed))], None)
    committee.score(trees)
    return trees, start


def main() -> None:
    from memrl.rewards.advantage import ADVANTAGE_PRESETS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=32, help="training tasks whose trees make the batch")
    parser.add_argument("--k", type=int, default=4, help="siblings per recall")
    parser.add_argument("--max-leaves", type=int, default=16)
    parser.add_argument("--committee-weight", type=float, default=0.5, help="lambda")
    parser.add_argument("--criterion", choices=["rubric", "recoverability"], default="rubric",
                        help="the committee's question (rewards/committee.py)")
    parser.add_argument("--setting", default="multihop")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", default=None,
                        help="a model directory, or 'noisy-oracle'; default: benchmarks/ablations.py's SFT start")
    parser.add_argument("--work", default="runs/ablations", help="where the shared SFT checkpoint lives")
    parser.add_argument("--model-cache", default=".cache/models")
    args = parser.parse_args()

    t0 = time.perf_counter()
    trees, start = build_batch(args)
    built_s = time.perf_counter() - t0
    options: dict[str, Any] = {}
    print(f"{'option':<34} {'rows':>5} {'tied rows':>9} {'tied |A|':>8} {'cancels':>8} {'|A| tied':>8} "
          f"{'|A| inf':>8}")
    for shared_prefix in ("separate", "branch"):
        for preset in ADVANTAGE_PRESETS:
            out = option_shares(trees, preset, shared_prefix, args.committee_weight, args.seed)
            name = f"{preset}/{shared_prefix}"
            options[name] = out

            def fmt(key: str, o: dict[str, Any] = out) -> str:
                return "-" if o.get(key) is None else f"{o[key]:.3f}"

            print(f"{name:<34} {out['rows']:>5} {fmt('outcome_tied_row_fraction'):>9} "
                  f"{fmt('outcome_tied_advantage_fraction'):>8} {fmt('identical_row_cancelled_advantage_fraction'):>8} "
                  f"{fmt('abs_advantage_tied_mean'):>8} {fmt('abs_advantage_informative_mean'):>8}", flush=True)
    record = {
        "benchmark": "advantage_shares", "setting": args.setting, "tasks": args.tasks, "k": args.k,
        "max_leaves": args.max_leaves, "committee_weight": args.committee_weight, "criterion": args.criterion,
        "seed": args.seed, **start, "trees": len(trees),
        "leaves": sum(n.kind == "leaf" for t in trees for n in t.nodes),
        "success": statistics.fmean(n.outcome or 0.0 for t in trees for n in t.nodes if n.kind == "leaf"),
        "build_seconds": round(built_s, 1), "options": options,
    }
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
