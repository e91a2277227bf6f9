"""Where an OAT-GRPO update's advantage comes from, under each advantage option, on the same trees (issue 39 items 1-3).

One batch of memory-call trees as the ``oat`` variant of ``benchmarks.ablations`` builds them (the ``multihop``
setting's training tasks, K = 4 siblings per recall, at most 16 leaves, the oracle committee with the offline judge,
lambda 0.5) from one policy: the shared SFT checkpoint of ``benchmarks.ablations`` (built there when missing), a
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

**Pivot-turn groups** (``--family proactive``; "Remember When It Matters", section 4.5). The same question for the
reminder cost: proactive tasks with ``--fatal`` fatal pivots each, a scripted student (the proactive oracle expert
missing a fatal pivot with probability 0.4 and reminding needlessly with probability 0.1) labels its own rollouts,
counterfactual replay finds the pivots, and G = 8 samples of the same student are continued to the end at every
detected pivot (``pivot``) and at every memory step (``all_turns``); r = outcome - 0.1 x reminder - 0.5 x malformed.
Per option the same diagnostics, and in the outcome-tied groups that mixed decisions (all continuations pass or all
fail, some remind) the mean advantage of reminding and of staying silent: the push toward silence that the cost alone
sets (the audit: A(remind) = -1.73, A(silent) = +0.58 under ``grpo_std``, such groups carrying 81% of the all-turn
runs' advantage mass).

    python -m benchmarks.advantage_shares [--tasks 32] [--policy DIR | noisy-oracle] [--criterion recoverability]
    python -m benchmarks.advantage_shares --family proactive [--tasks 12 --fatal 3]

A table, then one JSON line last.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import bench_parser, emit, pin_threads

NOISY_ORACLE = {"error_rate": 0.3, "verbatim": 1.0, "omission": 0.5}


def number(record: dict[str, Any], key: str, spec: str) -> str:
    """``record[key]`` in the format ``spec``; ``-`` where it is missing or None."""
    return "-" if record.get(key) is None else format(record[key], spec)


def print_row(cells: list[Any], widths: list[int]) -> None:
    """One row of the console table: the first cell left-aligned, the others right-aligned, to ``widths``."""
    label, *rest = cells
    print(
        f"{label:<{widths[0]}} " + " ".join(f"{cell:>{width}}" for cell, width in zip(rest, widths[1:], strict=True)),
        flush=True,
    )


def option_shares(
    trees: list[Any], preset: str, shared_prefix: str, committee_weight: float, seed: int
) -> dict[str, Any]:
    """The rows one update would train on copies of ``trees`` under one option, and where their advantage comes
    from."""
    from memrl.rewards.credit import CreditConfig
    from memrl.rewards.groups import credit_and_groups
    from memrl.train.rows import advantage_shares, rows_from_groups

    terms = [{"name": "committee", "weight": committee_weight}] if committee_weight else []
    cfg = CreditConfig(terms=terms, advantage=preset, shared_prefix=shared_prefix)
    groups, credit = credit_and_groups(copy.deepcopy(trees), cfg, "tree", seed)
    rows = rows_from_groups(groups)
    tied = [abs(r.advantage) for r in rows if r.outcome_tied]
    informative = [abs(r.advantage) for r in rows if not r.outcome_tied]
    return {
        "rows": len(rows),
        "trained_tokens": sum(len(r.response_ids) for r in rows),
        "updates": bool(rows),
        "informative_groups": credit["informative_groups"],
        "outcome_tie_fraction": credit.get("outcome_tie_fraction"),
        "prefix_shared_sibling_fraction": credit.get("prefix_shared_sibling_fraction"),
        "abs_advantage_tied_mean": statistics.fmean(tied) if tied else None,
        "abs_advantage_informative_mean": statistics.fmean(informative) if informative else None,
        **advantage_shares(rows),
    }


def build_batch(args: argparse.Namespace) -> tuple[list[Any], dict[str, Any]]:
    """The trees of one batch (module docstring) and what they were built from."""
    from benchmarks.harness import weights_digest
    from benchmarks.sam_start import SamStart
    from memrl.data.tasks import TaskSetConfig, load_tasks
    from memrl.rewards.committee import Committee, CommitteeConfig
    from memrl.rollout.agents import sam_rollout
    from memrl.rollout.engines.config import EngineConfig
    from memrl.rollout.engines.factory import build_engine
    from memrl.rollout.loop import EngineSet
    from memrl.rollout.models import TinyModelSpec, ensure_tiny_model
    from memrl.rollout.tree import TreeConfig, build_trees
    from memrl.train.oat_grpo import default_oracle

    bench = SamStart(args.setting, Path(args.work), args.model_cache)
    if args.policy is None:
        bench.prepare()
        policy_cfg = EngineConfig(backend="hf", name="policy", model=str(bench.sft_dir), dtype="float32", batch_size=64)
        start = dict(bench.start)
    else:
        bench.base = ensure_tiny_model(args.model_cache, TinyModelSpec())
        if args.policy == "noisy-oracle":
            policy_cfg = EngineConfig(
                backend="scripted",
                name="policy",
                scripted_policy="memrl.data.experts.sam:SamOracle",
                scripted_kwargs={"config": NOISY_ORACLE},
                tokenizer=str(bench.base),
                seed=args.seed,
            )
            start = {"base_weights": weights_digest(bench.base)[:16], "policy": f"noisy-oracle {NOISY_ORACLE}"}
        else:
            policy_cfg = EngineConfig(backend="hf", name="policy", model=args.policy, dtype="float32", batch_size=64)
            start = {
                "base_weights": weights_digest(bench.base)[:16],
                "policy_weights": weights_digest(Path(args.policy))[:16],
            }
    tasks = load_tasks(
        TaskSetConfig(count=args.tasks, seed=bench.setting.train_seed + args.seed, sam=bench.setting.train), "train"
    )
    policy = build_engine(policy_cfg)
    engines = EngineSet(reasoner=build_engine(bench.reasoner_config(args.seed)), memory=policy)
    tree = TreeConfig(branch_roles=["recall"], branch_factor=args.k, max_leaves=args.max_leaves)
    try:
        trees, _ = build_trees(
            tasks,
            lambda task, rid: sam_rollout(task, bench.memory, seed=args.seed, rollout_id=rid),
            engines,
            tree,
            progress="trees",
        )
    finally:
        policy.close()
    committee = Committee(
        CommitteeConfig(criterion=args.criterion), [build_engine(default_oracle(str(bench.base), args.seed))], None
    )
    committee.score(trees)
    return trees, start


STUDENT = {"miss_rate": 0.4, "false_alarm_rate": 0.1}  # --family proactive: the scripted student's noise


def pivot_option_shares(results: list[Any], preset: str, reminder_cost: float) -> dict[str, Any]:
    """The rows one pivot-GRPO update would train from ``results`` under one option, where their advantage comes
    from, and the mean advantage of reminding and of silence in outcome-tied groups that mixed decisions."""
    from memrl.rewards.advantage import is_zero_variance
    from memrl.rewards.groups import pivot_groups
    from memrl.rewards.pivot import PivotRewardConfig
    from memrl.train.rows import advantage_shares, rows_from_groups

    groups = pivot_groups(results, PivotRewardConfig(reminder_cost=reminder_cost, advantage=preset))
    rows = rows_from_groups(groups)
    remind, silent = [], []
    for g in groups:
        outcomes = [s.metadata["outcome"] for s in g.samples]
        decisions = {s.metadata["reminder"] for s in g.samples}
        if len(g.samples) > 1 and is_zero_variance(outcomes) and decisions == {True, False}:
            remind += [s.advantage for s in g.samples if s.metadata["reminder"]]
            silent += [s.advantage for s in g.samples if not s.metadata["reminder"]]
    sibling = [g for g in groups if len(g.samples) > 1]
    return {
        "groups": len(sibling),
        "outcome_tied_groups": sum(bool(g.metadata.get("outcome_tied")) for g in sibling),
        "rows": len(rows),
        "updates": bool(rows),
        "tied_mixed_groups_advantage_remind": statistics.fmean(remind) if remind else None,
        "tied_mixed_groups_advantage_silent": statistics.fmean(silent) if silent else None,
        **advantage_shares(rows),
    }


def build_pivot_batch(args: argparse.Namespace) -> dict[str, list[Any]]:
    """The pivot-turn group results of the scripted student at detected pivots and at every memory step."""
    from memrl.data.experts import ProactiveOracle
    from memrl.data.tasks import ActionAgent, ProactiveTask
    from memrl.data.tasks.proactive import BankWriter
    from memrl.rollout.engines.scripted import ScriptedEngine
    from memrl.rollout.loop import EngineSet
    from memrl.rollout.memory.proactive import ProactiveConfig
    from memrl.rollout.models import TinyModelSpec, ensure_tiny_model, load_tokenizer
    from memrl.rollout.pivots import (
        DetectConfig,
        PivotGroupConfig,
        detect_pivots,
        every_turn,
        label_rollouts,
        sample_pivot_groups,
    )

    tokenizer = load_tokenizer(ensure_tiny_model(args.model_cache, TinyModelSpec()))  # token ids: trainer rows
    tasks = [
        ProactiveTask({"n_subtasks": 12, "fatal_pivots": args.fatal}, seed=args.seed * 1000 + s)
        for s in range(args.tasks)
    ]
    truths = {t.task_id: t.truth() for t in tasks}
    student = EngineSet(
        reasoner=ScriptedEngine(ActionAgent(), tokenizer=tokenizer),
        memory=ScriptedEngine(ProactiveOracle(STUDENT, truths=truths), tokenizer=tokenizer),
        by_role={"bank_edit": ScriptedEngine(BankWriter(), tokenizer=tokenizer)},
    )
    records = label_rollouts(tasks, student, ProactiveConfig(), seed=args.seed, progress="labelled rollouts")
    by_id = {r.record_id: r for r in records}
    pivots, _ = detect_pivots(records, student, DetectConfig(policy_samples=0))
    group = PivotGroupConfig(group_size=8)
    return {
        "pivot": sample_pivot_groups([p for p in pivots if p.is_pivot], by_id, student, group, progress="pivot groups"),
        "all_turns": sample_pivot_groups(every_turn(records), by_id, student, group, progress="all-turn groups"),
    }


def pivot_main(args: argparse.Namespace) -> None:
    """``--family proactive`` (module docstring)."""
    from memrl.rewards.advantage import ADVANTAGE_PRESETS

    t0 = time.perf_counter()
    batches = build_pivot_batch(args)
    built_s = time.perf_counter() - t0
    out: dict[str, Any] = {}
    widths = [30, 6, 5, 5, 8, 9, 9]
    keys = [
        "outcome_tied_advantage_fraction",
        "tied_mixed_groups_advantage_remind",
        "tied_mixed_groups_advantage_silent",
    ]
    print_row(["sites/option", "groups", "tied", "rows", "tied |A|", "A(remind)", "A(silent)"], widths)
    for sites, results in batches.items():
        for preset in ADVANTAGE_PRESETS:
            o = pivot_option_shares(results, preset, args.reminder_cost)
            out[f"{sites}/{preset}"] = o
            counts = [o["groups"], o["outcome_tied_groups"], o["rows"]]
            print_row([f"{sites}/{preset}", *counts, *(number(o, key, "+.2f") for key in keys)], widths)
    print(
        json.dumps(
            {
                "benchmark": "advantage_shares",
                "family": "proactive",
                "tasks": args.tasks,
                "fatal_pivots": args.fatal,
                "student": STUDENT,
                "reminder_cost": args.reminder_cost,
                "seed": args.seed,
                "build_seconds": round(built_s, 1),
                "options": out,
            }
        ),
        flush=True,
    )


def main() -> None:
    from memrl.rewards.advantage import ADVANTAGE_PRESETS

    parser = bench_parser(__doc__)
    parser.add_argument(
        "--tasks",
        type=int,
        default=None,
        help="training tasks whose trees (or rollouts) make the batch (default 32; proactive: 12)",
    )
    parser.add_argument("--k", type=int, default=4, help="siblings per recall")
    parser.add_argument("--max-leaves", type=int, default=16)
    parser.add_argument("--committee-weight", type=float, default=0.5, help="lambda")
    parser.add_argument(
        "--criterion",
        choices=["rubric", "recoverability"],
        default="rubric",
        help="the committee's question (rewards/committee.py)",
    )
    parser.add_argument("--setting", default="multihop")
    parser.add_argument(
        "--policy",
        default=None,
        help="a model directory, or 'noisy-oracle'; default: benchmarks.ablations's SFT start",
    )
    parser.add_argument("--work", default="runs/ablations", help="where the shared SFT checkpoint lives")
    parser.add_argument("--model-cache", default=".cache/models")
    parser.add_argument(
        "--family",
        choices=["sam", "proactive"],
        default="sam",
        help="OAT-GRPO trees (sam) or pivot-turn groups (proactive)",
    )
    parser.add_argument("--fatal", type=int, default=3, help="--family proactive: fatal pivots per task")
    parser.add_argument("--reminder-cost", type=float, default=0.1, help="--family proactive: reward.reminder_cost")
    args = parser.parse_args()
    pin_threads(args.threads)
    if args.family == "proactive":
        args.tasks = args.tasks or 12
        pivot_main(args)
        return
    args.tasks = args.tasks or 32

    t0 = time.perf_counter()
    trees, start = build_batch(args)
    built_s = time.perf_counter() - t0
    options: dict[str, Any] = {}
    widths = [34, 5, 9, 8, 8, 8, 8]
    print_row(["option", "rows", "tied rows", "tied |A|", "cancels", "|A| tied", "|A| inf"], widths)
    keys = [
        "outcome_tied_row_fraction",
        "outcome_tied_advantage_fraction",
        "identical_row_cancelled_advantage_fraction",
        "abs_advantage_tied_mean",
        "abs_advantage_informative_mean",
    ]
    for shared_prefix in ("separate", "branch"):
        for preset in ADVANTAGE_PRESETS:
            out = option_shares(trees, preset, shared_prefix, args.committee_weight, args.seed)
            name = f"{preset}/{shared_prefix}"
            options[name] = out
            print_row([name, out["rows"], *(number(out, key, ".3f") for key in keys)], widths)
    record = {
        "benchmark": "advantage_shares",
        "setting": args.setting,
        "tasks": args.tasks,
        "k": args.k,
        "max_leaves": args.max_leaves,
        "committee_weight": args.committee_weight,
        "criterion": args.criterion,
        "seed": args.seed,
        **start,
        "trees": len(trees),
        "leaves": sum(n.kind == "leaf" for t in trees for n in t.nodes),
        "success": statistics.fmean(n.outcome or 0.0 for t in trees for n in t.nodes if n.kind == "leaf"),
        "build_seconds": round(built_s, 1),
        "options": options,
    }
    emit(record, args.json_out)


if __name__ == "__main__":
    main()
