"""Proactive memory agent ablations ("Remember When It Matters: Proactive Memory Agent for Long-Horizon Agents", Table
2) on the scripted proactive tasks.

The scripted action agent (``ActionAgent``, greedy) acts through the proactive memory agent whose memory model is the
oracle expert (``ProactiveOracle``); every variant runs on the same tasks. Per variant: pass rate, injected reminders
(Phase 2 or forced), full-bank exposures, the fraction of subtasks finished, the rate of requirement violations and the
agent's double-checks (``pwd``: the cost of a memory context that does not bear on the next subtask, paid with
probability ``--distraction``). The step budget of a task is its perfect-memory run plus ``slack`` steps; a sweep over
the slack shows how each variant's pass rate depends on how many wasted steps the budget forgives. Prints one line per
run and one JSON object last.

    .venv/bin/python -m benchmarks.proactive_ablations [--tasks 32] [--slack 2] [--distraction 0.3] [--sweep 1,2,4,8]
"""

from __future__ import annotations

import time

from benchmarks.harness import bench_parser, emit, pin_threads
from memrl.data.experts import ProactiveOracle
from memrl.data.tasks import ActionAgent, ProactiveParams, ProactiveTask
from memrl.rollout.agents import build_proactive_rollout
from memrl.rollout.engines.scripted import ScriptedEngine
from memrl.rollout.loop import EngineSet, run_rollouts
from memrl.rollout.memory.proactive import ProactiveConfig
from memrl.rollout.memory.workflow import action_of

VARIANTS = ("no_memory", "full", "full_bank", "always_inject", "injection_only")


def run_variant(tasks: list[ProactiveTask], variant: str, distraction: float) -> dict[str, float]:
    truths = {t.task_id: t.truth() for t in tasks}
    engines = EngineSet(
        reasoner=ScriptedEngine(ActionAgent(distraction)), memory=ScriptedEngine(ProactiveOracle(truths=truths))
    )
    rollouts = [build_proactive_rollout(t, ProactiveConfig(variant=variant), rollout_id=variant) for t in tasks]
    start = time.perf_counter()
    traces = run_rollouts(rollouts, engines)
    seconds = time.perf_counter() - start
    n = len(traces)

    def total(key: str) -> int:
        return sum(tr.stats.get(key, 0) for tr in traces)

    envs = [r.env for r in rollouts]
    return {
        "pass_rate": round(sum(tr.outcome or 0.0 for tr in traces) / n, 4),
        "reminders": total("reminders_injected"),
        "reminders_per_episode": round(total("reminders_injected") / n, 2),
        "forced_reminders": total("forced_injections"),
        "exposures": total("bank_exposures"),
        "memory_calls": sum(len(tr.memory_calls) for tr in traces),
        "subtask_completion": round(sum(e.s.done / len(e.plan) for e in envs) / n, 4),
        "violation_rate": round(sum(bool(e.s.violations) for e in envs) / n, 4),
        "double_checks_per_episode": round(
            sum(sum(ev.kind == "act" and action_of(ev.reply) == "pwd" for ev in tr.events) for tr in traces) / n, 2
        ),
        "seconds": round(seconds, 2),
    }


def make_tasks(count: int, n_subtasks: int, slack: int, seed: int) -> list[ProactiveTask]:
    return [ProactiveTask({"n_subtasks": n_subtasks, "slack": slack}, seed=seed + i) for i in range(count)]


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--n-subtasks", type=int, default=16)
    parser.add_argument(
        "--slack",
        type=int,
        default=ProactiveParams().slack,
        help="the headline budget slack (default: the task family's)",
    )
    parser.add_argument(
        "--distraction",
        type=float,
        default=0.3,
        help="probability that an irrelevant reminder costs the action agent a step",
    )
    parser.add_argument("--sweep", default="0,1,2,3,4,8", help="slack values for the sweep ('' to skip)")
    args = parser.parse_args()
    pin_threads(args.threads)

    tasks = make_tasks(args.tasks, args.n_subtasks, args.slack, args.seed)
    variants = {}
    for variant in VARIANTS:
        variants[variant] = run_variant(tasks, variant, args.distraction)
        emit({"slack": args.slack, "variant": variant, **variants[variant]})
    lo, hi = variants["no_memory"]["pass_rate"], variants["full"]["pass_rate"]
    between = {v: lo < variants[v]["pass_rate"] < hi for v in VARIANTS[2:]}

    sweep: dict[str, dict[str, float]] = {}
    for slack in [int(s) for s in args.sweep.split(",") if s.strip()]:
        swept = tasks if slack == args.slack else make_tasks(args.tasks, args.n_subtasks, slack, args.seed)
        sweep[str(slack)] = {}
        for variant in VARIANTS:
            figures = variants[variant] if slack == args.slack else run_variant(swept, variant, args.distraction)
            sweep[str(slack)][variant] = figures["pass_rate"]
        emit({"sweep_slack": slack, **sweep[str(slack)]})

    emit(
        {
            "benchmark": "proactive_ablations",
            "tasks": args.tasks,
            "n_subtasks": args.n_subtasks,
            "slack": args.slack,
            "distraction": args.distraction,
            "pivots": sum(len(t.pivots) for t in tasks),
            "variants": variants,
            "strictly_between": between,
            "pass_rate_by_slack": sweep,
        },
        args.json_out,
    )


if __name__ == "__main__":
    main()
