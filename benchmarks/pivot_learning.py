"""Pivot-turn GRPO on the tiny CPU intervention agent, from a start where one decision can change an outcome: pivot
groups vs all-turn groups vs no RL, per number of fatal pivots per task, over seeds, paired on the same test tasks.

The pipeline runs on CPU with the tiny random-initialised Qwen3 model (2 x 128) and ``configs/pivot_grpo_tiny.yaml``
("Remember When It Matters: Proactive Memory Agent for Long-Horizon Agents", sections 3 and 4.5). Three disjoint task
splits: training (seeds 0 ...), dev (50,000 ...), test (100,000 ...); a task plants F fatal requirement pivots
(``fatal_pivots``, F in ``--fatal``), each of which a pass needs caught.

1. **Starting students, chosen on dev.** For each start in :data:`STARTS` (teacher noise, the F mix of its training
   tasks, the number of teacher tasks and SFT steps), teacher traces (Phase 1: the scripted
   :class:`~memrl.data.tasks.proactive.BankWriter`, which never reads the plan; Phase 2: the prompted expert
   :class:`~memrl.data.experts.ProactiveOracle` citing bank entries by id) become SFT rows of the ``intervene`` role and
   one SFT model. Each is run on the dev tasks (every F, sampled at T = 1) and measured: the miss rate m (fraction of
   fatal pivots whose decision did not deliver the needed fact) and the flippable fraction (episodes with exactly one
   missed fatal pivot: one changed decision flips them). The start with the highest flippable fraction on dev starts RL
   (ties: the lower dev m, then the first listed; the rule is fixed before any run; the test split is not read).
2. **GRPO from it**, per F, seed and variant, the same number of groups and samples per iteration: ``pivot``: groups at
   pivots found by counterfactual replay over every bank entry (plus a few labelled non-pivots, where the reminder
   cost teaches silence); ``all_turns``: groups at any memory step of the labelled rollouts, no detection. Pivots
   detected per iteration and the detection budget are logged; the run evaluates on the dev split after every
   iteration (the learning curves).
3. **Test.** The final policy of every (F, seed, variant), and ``no_rl`` (the chosen SFT model), on the same test tasks,
   ``--samples`` rollouts each (the seed's sampling seeds). Per F and variant the mean pass rate over seeds with a 95%
   t-interval, and paired differences (pivot - no_rl, all_turns - no_rl, pivot - all_turns) per seed with t-intervals.
   One JSON line last.

``--quick`` is sized to finish within 15 minutes on the 2 shared cores (one start, fewer seeds, tasks and
iterations); the default (full) setting runs 5 seeds. Settings are fixed in advance, not tuned until a variant wins.

    .venv/bin/python benchmarks/pivot_learning.py [--quick] [--work DIR] [--seeds 0 1 2 3 4] [--fatal 1 2 3]
                                                  [dotted GRPO overrides]

With ``--reuse`` an interrupted run is completed: SFT models, dev measurements and finished (F, seed, variant) runs
are read back from ``--work``, and a GRPO run that was interrupted continues from its last iteration (every iteration
is checkpointed). The last line also gives the wall time, the CPU time (user + sys, every core) and the load average,
and the wall seconds per stage.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from memrl.data.config import load_config
from memrl.data.distill import RejectionConfig, distill_traces
from memrl.data.experts import ProactiveOracle
from memrl.data.tasks import ProactiveTask
from memrl.data.tasks.proactive import BankWriter
from memrl.rollout.agents import build_proactive_rollout
from memrl.rollout.engines.factory import build_engine
from memrl.rollout.engines.scripted import ScriptedEngine
from memrl.rollout.evaluation.stats import t_interval
from memrl.rollout.loop import EngineSet, run_rollouts
from memrl.rollout.models import TinyModelSpec, ensure_tiny_model, load_tokenizer
from memrl.rollout.pivots import fatal_misses

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("pivot", "all_turns")
DEV_START, TEST_START = 50_000, 100_000
STARTS: dict[str, dict[str, Any]] = {  # candidate starting students (teacher noise, teacher task F mix, SFT size)
    "issue": {"miss": 0.4, "false_alarm": 0.1, "fatal_mix": [3], "train_tasks": 48, "sft_steps": 60},  # m ~ 0.8-1
    "clean_curriculum": {"miss": 0.0, "false_alarm": 0.1, "fatal_mix": [1, 2, 3], "train_tasks": 48, "sft_steps": 60},
    "clean_long": {"miss": 0.0, "false_alarm": 0.1, "fatal_mix": [1, 2, 3], "train_tasks": 96, "sft_steps": 240},
}
SETTINGS: dict[str, dict[str, Any]] = {  # sized for the wall time on 2 shared cores before any run; not tuned
    "full": {"starts": list(STARTS), "seeds": [0, 1, 2, 3, 4], "dev_tasks": 12,
             "test_tasks": 24, "samples": 2, "iterations": 3, "label_tasks": 6, "pivots_per_iteration": 6,
             "non_pivots_per_iteration": 2, "group_size": 8},
    "quick": {"starts": ["clean_long"], "seeds": [0, 1], "dev_tasks": 6,
              "test_tasks": 12, "samples": 2, "iterations": 2, "label_tasks": 3, "pivots_per_iteration": 4,
              "non_pivots_per_iteration": 1, "group_size": 4},
}
GRPO_KEYS = {"iterations": "loop.iterations", "dev_tasks": "eval_tasks.count", "label_tasks": "pivots.tasks",
             "pivots_per_iteration": "groups.pivots_per_iteration",
             "non_pivots_per_iteration": "groups.non_pivots_per_iteration", "group_size": "groups.group_size"}


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children (every core counted)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def mean_ci(values: list[float]) -> dict[str, Any]:
    """Mean and 95% t-interval over ``values`` (one per seed); a single value has no interval."""
    interval = t_interval(values)
    return {"mean": round(statistics.fmean(values), 4), "ci95": interval and [round(x, 4) for x in interval],
            "n": len(values)}


def split(cfg: Any, start: int, count: int, fatal: list[int]) -> list[ProactiveTask]:
    """``count`` tasks of the config's family from seed ``start``, F cycling through ``fatal``."""
    return [ProactiveTask({**cfg.train_tasks.params, "fatal_pivots": fatal[i % len(fatal)]}, seed=start + i)
            for i in range(count)]


def engines_for(cfg: Any, policy: Any) -> EngineSet:
    """The frozen action agent and bank writer around a Phase 2 ``policy`` engine."""
    return EngineSet(reasoner=build_engine(cfg.reasoner), memory=policy,
                     by_role={"bank_edit": ScriptedEngine(BankWriter())})


def hf_policy(cfg: Any, model: Path | str) -> Any:
    return build_engine(cfg.engine.model_copy(update={"model": str(model)}))


def measure(cfg: Any, engines: EngineSet, tasks: list[ProactiveTask], seed: int, samples: int) -> dict[str, Any]:
    """Pass rate, miss rate m and flippable fraction of ``engines``' policy on ``tasks`` (``samples`` each), by F."""
    rollouts = [build_proactive_rollout(copy.deepcopy(t), cfg.memory, seed=seed + r, rollout_id=f"m{r}",
                                        reasoner_sampling=cfg.reasoner_sampling) for r in range(samples) for t in tasks]
    run_rollouts(rollouts, engines)
    out: dict[str, Any] = {}
    for f in sorted({t.params.fatal_pivots for t in tasks}):
        mine = [r for r in rollouts if r.env.params.fatal_pivots == f]
        misses = [fatal_misses(r) for r in mine]
        flat = [m for ms in misses for m in ms]
        out[str(f)] = {"pass_rate": round(sum(r.outcome or 0.0 for r in mine) / len(mine), 4),
                       "m": round(sum(flat) / len(flat), 4) if flat else None, "fatal_pivots_reached": len(flat),
                       "flippable": round(sum(flippable(r.outcome, ms) for r, ms in zip(mine, misses, strict=True))
                                          / len(mine), 4),
                       "exactly_one_miss": round(sum(sum(ms) == 1 for ms in misses) / len(mine), 4),
                       "reminders_per_episode": round(sum(r.memory.stats.get("reminders_injected", 0) for r in mine)
                                                      / len(mine), 3), "episodes": len(mine)}
    return out


def flippable(outcome: float | None, misses: list[bool]) -> bool:
    """Whether one changed decision at a fatal pivot flips this episode: a pass with every fatal pivot caught (missing
    one fails it) or a failure with exactly one missed (catching it can pass it). A student that misses every pivot
    flips nothing at F >= 2, one that catches every pivot flips every episode: both directions give detection a pivot
    and a pivot group non-zero advantages."""
    passed = bool(outcome)
    return (passed and not any(misses)) or (not passed and sum(misses) == 1)


def train_start(name: str, cfg: Any, args: argparse.Namespace, model_dir: Path, work: Path) -> dict[str, Any]:
    """Teacher traces of start ``name`` -> SFT rows -> the SFT model at ``work/starts/NAME/sft/final``."""
    from memrl.train.sft import SFTRunConfig, run_sft

    folder = work / "starts" / name
    start = {**STARTS[name], **{k: getattr(args, k) for k in ("train_tasks", "sft_steps") if getattr(args, k)}}
    t0 = time.perf_counter()
    tasks = split(cfg, 0, start["train_tasks"], start["fatal_mix"])
    truths = {t.task_id: t.truth() for t in tasks}
    teacher = ProactiveOracle({"miss_rate": start["miss"], "false_alarm_rate": start["false_alarm"],
                               "cite_ids": True}, truths=truths)
    engines = engines_for(cfg, ScriptedEngine(teacher, tokenizer=load_tokenizer(model_dir)))
    traces = run_rollouts([build_proactive_rollout(t, cfg.memory, seed=0) for t in tasks], engines)
    distilled = distill_traces(traces, folder / "distill", RejectionConfig(min_outcome=0.0, roles=["intervene"]),
                               progress=False)
    sft = SFTRunConfig.model_validate({
        "run": {"output_dir": str(folder), "name": "sft", "seed": 0},
        "model": {"base": str(model_dir)},
        "lora": {"enabled": False},
        "data": {"dir": str(folder / "distill"), "roles": ["intervene"]},
        "train": {"max_steps": start["sft_steps"], "batch_size": args.sft_batch, "lr": args.sft_lr, "warmup": 0.05,
                  "bf16": True, "save_steps": 0, "logging_steps": 20, "max_length": 384, "progress": False},
    })
    run_sft(sft)
    return {"start": name, **start, "teacher_pass_rate": round(sum(t.outcome or 0.0 for t in traces) / len(traces), 4),
            "intervene_rows": distilled["roles"]["intervene"]["kept"], "seconds": round(time.perf_counter() - t0, 1)}


def choose_start(cfg: Any, args: argparse.Namespace, model_dir: Path, work: Path, dev: list[ProactiveTask]
                 ) -> tuple[str, dict[str, Any]]:
    """Train and measure every candidate start on dev; the one with the most flippable dev episodes (ties: the lower
    dev m, then the first listed)."""
    report: dict[str, Any] = {}
    for name in args.starts:
        path, trained_path = work / "starts" / name / "dev.json", work / "starts" / name / "start.json"
        if args.reuse and path.is_file():
            report[name] = json.loads(path.read_text())
        else:
            if args.reuse and trained_path.is_file():  # the SFT model is there; its dev measurement is not
                trained = json.loads(trained_path.read_text())
            else:
                trained = train_start(name, cfg, args, model_dir, work)
                trained_path.write_text(json.dumps(trained, indent=1) + "\n")
            t0 = time.perf_counter()
            policy = hf_policy(cfg, work / "starts" / name / "sft" / "final")
            report[name] = {**trained, "dev": measure(cfg, engines_for(cfg, policy), dev, DEV_START, 1)}
            policy.close()
            report[name]["dev_seconds"] = round(time.perf_counter() - t0, 1)
            path.write_text(json.dumps(report[name], indent=1) + "\n")
        dev_rows = report[name]["dev"].values()
        report[name]["dev_flippable"] = round(statistics.fmean(r["flippable"] for r in dev_rows), 4)
        report[name]["dev_pass_rate"] = round(statistics.fmean(r["pass_rate"] for r in dev_rows), 4)
        report[name]["dev_m"] = round(statistics.fmean(r["m"] for r in dev_rows if r["m"] is not None), 4)
        emit({"stage": "start", **report[name]})
    chosen = max(args.starts, key=lambda n: (report[n]["dev_flippable"], -report[n]["dev_m"]))
    return chosen, report


def run_variant(args: argparse.Namespace, final: Path, run_root: Path, fatal: int, seed: int, variant: str
                ) -> dict[str, Any]:
    """Pivot-turn GRPO from the SFT model ``final`` on F = ``fatal`` tasks, evaluated on dev after every iteration and
    checkpointed after every iteration, so ``--reuse`` continues an interrupted run from its last iteration."""
    from memrl.train.pivot_grpo import PivotGRPOConfig, run_pivot_grpo

    done = run_root / variant / "summary.json"
    resume = args.reuse and (run_root / variant / "config.yaml").is_file() and not done.is_file()
    cfg = load_config(PivotGRPOConfig, args.config, [
        f"run.output_dir={run_root}", f"run.name={variant}", f"run.seed={seed}", f"policy.base={final}",
        f"engine.model={final}", f"reasoner.tokenizer={final}", f"phase1.tokenizer={final}",
        *[f"{key}={getattr(args, name)}" for name, key in GRPO_KEYS.items()],
        f"train_tasks.params.fatal_pivots={fatal}", f"eval_tasks.params.fatal_pivots={fatal}",
        f"eval_tasks.seed_start={DEV_START}", "loop.eval_every=1", "loop.checkpoint_every=1", f"run.resume={resume}",
        "eval.greedy=false", "eval.no_memory_baseline=false",
        f"groups.at={'pivots' if variant == 'pivot' else 'all_turns'}", *args.overrides,
    ])
    if not (args.reuse and done.is_file()):
        if resume:
            emit({"stage": "resume", "run": str(run_root / variant)})
        run_pivot_grpo(cfg)
    summary = json.loads(done.read_text())
    history = summary["history"]
    return {
        "policy_dir": summary["policy_dir"],
        "pivots_detected": [h.get("refresh_pivots") for h in history],  # per iteration (None: no refresh there)
        "pivot_pool": [h.get("pivot_pool") for h in history],
        "detect_budget": next((h["refresh_budget"] for h in history if "refresh_budget" in h), None),
        "bank_entries_tried": sum(h.get("refresh_bank_tried", 0.0) for h in history),
        "bank_entries_over_budget": sum(h.get("refresh_bank_over_budget", 0.0) for h in history),
        "zero_variance_groups": [h.get("zero_variance_group_fraction") for h in history],
        "dev_curve": [round(e["pass_rate"], 4) for e in summary_evals(summary)],
        "action_tokens_training": summary["training_action_tokens"],
        "seconds": float(json.loads((run_root / variant / "metrics.jsonl").read_text().splitlines()[-1])["time_s"]),
    }


def seconds_by_stage(starts: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, float]:
    """Wall seconds per stage (rows read back with ``--reuse`` count with the time they took when they ran)."""
    return {"starts_teacher_and_sft": round(sum(s["seconds"] for s in starts.values()), 1),
            "starts_dev": round(sum(s.get("dev_seconds", 0.0) for s in starts.values()), 1),
            "grpo_runs_with_dev_curves": round(sum(r.get("seconds", 0.0) for r in rows), 1),
            "test": round(sum(r.get("test_seconds", 0.0) for r in rows), 1)}


def summary_evals(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The dev evaluations in order: before the first update, then after every iteration."""
    rows = [summary["before"]] if summary["before"] else []
    return rows + [h_eval for h_eval in (
        {k[len("eval/"):]: v for k, v in h.items() if k.startswith("eval/")} for h in summary["history"]) if h_eval]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "pivot_grpo_tiny.yaml"))
    parser.add_argument("--work", default=None, help="output directory (default: a temporary one)")
    parser.add_argument("--quick", action="store_true", help="the setting sized for 15 minutes (see SETTINGS)")
    parser.add_argument("--fatal", type=int, nargs="+", default=[1, 2, 3], help="fatal pivots per task, reported by")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="GRPO and test sampling seeds")
    parser.add_argument("--starts", nargs="+", default=None, choices=list(STARTS), help="candidate starts")
    parser.add_argument("--train-tasks", type=int, default=None, help="teacher tasks of every start (default: its own)")
    parser.add_argument("--sft-steps", type=int, default=None, help="SFT steps of every start (default: its own)")
    parser.add_argument("--sft-batch", type=int, default=32)
    parser.add_argument("--sft-lr", type=float, default=3e-3)
    parser.add_argument("--reuse", action="store_true", help="read back what an earlier run left in --work")
    for name, value in SETTINGS["full"].items():
        if isinstance(value, int):
            parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help="override the setting's")
    parser.add_argument("overrides", nargs="*", help="dotted overrides of the GRPO config")
    args = parser.parse_args()
    setting = "quick" if args.quick else "full"
    for name, value in SETTINGS[setting].items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)

    from memrl.train.pivot_grpo import PivotGRPOConfig

    work = Path(args.work or tempfile.mkdtemp(prefix="memrl-pivot-learning-"))
    work.mkdir(parents=True, exist_ok=True)
    clock, cpu_clock, load_before = time.perf_counter(), cpu_seconds(), os.getloadavg()
    model_dir = ensure_tiny_model(ROOT / ".cache" / "models", TinyModelSpec())
    emit({"stage": "setting", "setting": setting, **{k: getattr(args, k) for k in SETTINGS[setting]},
          "fatal": args.fatal, "overrides": args.overrides})
    base = load_config(PivotGRPOConfig, args.config, [
        f"run.output_dir={work}", f"policy.base={model_dir}", f"engine.model={model_dir}",
        f"reasoner.tokenizer={model_dir}", f"phase1.tokenizer={model_dir}", *args.overrides])
    dev = split(base, DEV_START, args.dev_tasks * len(args.fatal), args.fatal)
    chosen, starts = choose_start(base, args, model_dir, work, dev)
    final = work / "starts" / chosen / "sft" / "final"
    emit({"stage": "chosen", "start": chosen, "dev_m": starts[chosen]["dev_m"],
          "dev_flippable": starts[chosen]["dev_flippable"]})

    results: dict[str, Any] = {}
    all_rows: list[dict[str, Any]] = []
    for fatal in args.fatal:
        test = split(base, TEST_START, args.test_tasks, [fatal])
        rows: dict[tuple[int, str], dict[str, Any]] = {}
        for seed in args.seeds:
            root = work / chosen / f"F{fatal}" / f"seed{seed}"  # under the start: --reuse never mixes starts
            for variant in ("no_rl", *VARIANTS):
                path = root / f"{variant}.test.json"
                if args.reuse and path.is_file():
                    row = json.loads(path.read_text())
                else:
                    trained = run_variant(args, final, root, fatal, seed, variant) if variant != "no_rl" else {}
                    t0 = time.perf_counter()
                    policy = hf_policy(base, trained.get("policy_dir", final))
                    score = measure(base, engines_for(base, policy), test, TEST_START + 1000 * seed, args.samples)
                    policy.close()
                    row = {"fatal": fatal, "seed": seed, "variant": variant, **score[str(fatal)], **trained,
                           "test_seconds": round(time.perf_counter() - t0, 1)}
                    root.mkdir(parents=True, exist_ok=True)
                    path.write_text(json.dumps(row, indent=1) + "\n")
                rows[(seed, variant)] = row
                all_rows.append(row)
                emit({"stage": "result", **{k: v for k, v in row.items() if k != "policy_dir"}})
        per = {v: {"pass_rate": mean_ci([rows[(s, v)]["pass_rate"] for s in args.seeds]),
                   "m": mean_ci([rows[(s, v)]["m"] for s in args.seeds if rows[(s, v)]["m"] is not None]),
                   "reminders_per_episode": mean_ci([rows[(s, v)]["reminders_per_episode"] for s in args.seeds])}
               for v in ("no_rl", *VARIANTS)}
        for v in VARIANTS:
            per[v]["pivots_detected_per_iteration"] = [rows[(s, v)]["pivots_detected"] for s in args.seeds]
            per[v]["dev_curve_mean"] = [round(statistics.fmean(c), 4) for c in
                                        zip(*(rows[(s, v)]["dev_curve"] for s in args.seeds), strict=True)]
        deltas = {f"{a}-{b}": mean_ci([rows[(s, a)]["pass_rate"] - rows[(s, b)]["pass_rate"] for s in args.seeds])
                  for a, b in (("pivot", "no_rl"), ("all_turns", "no_rl"), ("pivot", "all_turns"))}
        results[str(fatal)] = {"test_tasks": args.test_tasks, "samples": args.samples, "variants": per,
                               "paired_deltas_pass_rate": deltas}
    emit({
        "benchmark": "pivot_learning",
        "setting": setting,
        "model": "tiny 2x128",
        "phase1": "bank-writer (observed facts and failures; no plan, no risk note)",
        "seeds": args.seeds,
        "start_chosen_on_dev": chosen,
        "starting_miss_rate_m_dev": {f: starts[chosen]["dev"][str(f)]["m"] for f in args.fatal},
        "starting_flippable_dev": {f: starts[chosen]["dev"][str(f)]["flippable"] for f in args.fatal},
        "starts": {n: {k: starts[n][k] for k in ("dev_m", "dev_flippable", "teacher_pass_rate", "miss", "fatal_mix",
                                                 "train_tasks", "sft_steps", "dev_pass_rate")}
                   for n in starts},
        "by_fatal_pivots": results,
        "total_seconds": round(time.perf_counter() - clock, 1),
        "cpu_seconds": round(cpu_seconds() - cpu_clock, 1),  # user + sys over every core; beside the wall time
        "load_average_1_5_15": {"start": [round(x, 2) for x in load_before],
                                "end": [round(x, 2) for x in os.getloadavg()]},
        "seconds_by_stage": seconds_by_stage(starts, all_rows),
        "work": str(work),
    })


if __name__ == "__main__":
    main()
