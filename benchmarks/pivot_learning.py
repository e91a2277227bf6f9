"""Pivot-turn GRPO on the tiny CPU intervention agent: pivot groups vs all-turn groups vs no RL, over seeds.

The pipeline runs on CPU with the tiny random-initialised Qwen3 model (2 x 128) and ``configs/pivot_grpo_tiny.yaml``:

1. **Teacher traces.** The proactive memory agent runs on training tasks. Phase 1 (bank writing) is the scripted
   :class:`~memrl.data.tasks.proactive.BankWriter`: it records what the agent has seen (the statement's requirements,
   facts the window states, failed commands) and never reads the task's plan, so the bank does not say which entry the
   next
   subtask needs. Phase 2 is an imperfect prompted expert (:class:`~memrl.data.experts.ProactiveOracle`; ``--miss``:
   stays silent at a pivot; ``--false-alarm``: cites a needless entry) that cites the entry by its id (``k1: ...``; the
   memory system restates the cited entry's exact text). Its Phase 2 calls become SFT rows (every trace kept: the
   student inherits the teacher's calibration).
2. **SFT** of the ``intervene`` role (TRL SFTTrainer, full fine-tuning, bf16 autocast), once: this one checkpoint
   is where every seed and variant starts. ``no_rl`` is this model, evaluated with each seed's sampling seed.
3. **GRPO from the SFT model**, per seed, one run per variant, the same number of groups and samples per iteration:
   ``pivot``: groups at pivots found by counterfactual replay (plus a few labelled non-pivots, where the reminder cost
   teaches silence); ``all_turns``: groups at memory steps drawn from every trigger turn of the labelled rollouts, no
   detection (``groups.at=all_turns``). Phase 1 stays with the bank writer in every variant; only Phase 2 is trained.
4. Held-out pass rate at the rollout temperature (1.0) and greedy, reminders per episode, the action agent's tokens
   spent in training (labelling, detection and group continuations) and wall times per seed and variant (``no_rl``'s
   is the shared teacher + SFT time); per variant the mean over seeds with a 95% t-interval (seeds as the units), per
   seed a 95% Wilson interval over its held-out episodes, and the paired differences (pivot - no_rl, all_turns -
   no_rl, pivot - all_turns) with t-intervals. One JSON line last. Greedy decoding of ``no_rl`` is the same on every
   seed, so its interval is a point.

``--quick`` fits about 15 minutes on 2 CPU cores (fewer teacher tasks, SFT steps, iterations and held-out tasks); the
default (full) setting about 45 minutes. Settings are fixed in advance, not tuned until a variant wins.

    .venv/bin/python benchmarks/pivot_learning.py [--quick] [--work DIR] [--seeds 0 1 2] [dotted GRPO overrides]

With ``--reuse-sft --reuse-runs`` an interrupted or split run (e.g. seeds run as separate processes on one ``--work``)
is completed: the SFT model and finished (seed, variant) runs are read back, the rest is run, and the summary is
printed over all of them.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from memrl.data.config import load_config
from memrl.data.distill import RejectionConfig, distill_traces
from memrl.data.experts import ProactiveOracle
from memrl.data.tasks.proactive import BankWriter
from memrl.rollout.agents import build_proactive_rollout
from memrl.rollout.engines.factory import build_engine
from memrl.rollout.engines.scripted import ScriptedEngine
from memrl.rollout.evaluation.stats import t_interval
from memrl.rollout.loop import EngineSet, run_rollouts
from memrl.rollout.models import TinyModelSpec, ensure_tiny_model, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("pivot", "all_turns")
SETTINGS: dict[str, dict[str, int]] = {  # sized for the wall time on 2 shared cores before any run; not tuned
    "full": {"train_tasks": 96, "sft_steps": 120, "iterations": 3, "eval_tasks": 40, "label_tasks": 8,
             "pivots_per_iteration": 6, "non_pivots_per_iteration": 3, "group_size": 8},
    "quick": {"train_tasks": 48, "sft_steps": 60, "iterations": 2, "eval_tasks": 24, "label_tasks": 4,
              "pivots_per_iteration": 4, "non_pivots_per_iteration": 2, "group_size": 4},
}
GRPO_KEYS = {"iterations": "loop.iterations", "eval_tasks": "eval_tasks.count", "label_tasks": "pivots.tasks",
             "pivots_per_iteration": "groups.pivots_per_iteration",
             "non_pivots_per_iteration": "groups.non_pivots_per_iteration", "group_size": "groups.group_size"}


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def wilson(successes: float, n: int, z: float = 1.959964) -> list[float]:
    """95% Wilson score interval of a binomial proportion."""
    if n == 0:
        return [0.0, 1.0]
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def mean_ci(values: list[float]) -> dict[str, Any]:
    """Mean and 95% t-interval over ``values`` (one per seed); a single value has no interval."""
    interval = t_interval(values)
    return {"mean": round(statistics.fmean(values), 4), "ci95": interval and [round(x, 4) for x in interval],
            "n": len(values)}


def teacher_and_sft(cfg: Any, args: argparse.Namespace, model_dir: Path, work: Path, seed: int) -> dict[str, Any]:
    """Teacher traces -> SFT rows -> the SFT model at ``work/sft/final`` (shared by every seed and variant)."""
    from memrl.train.sft import SFTRunConfig, run_sft

    t0 = time.perf_counter()
    tokenizer = load_tokenizer(model_dir)
    tasks = cfg.train_tasks.load()[: args.train_tasks]
    truths = {t.task_id: t.truth() for t in tasks}
    teacher = ProactiveOracle({"miss_rate": args.miss, "false_alarm_rate": args.false_alarm, "cite_ids": True},
                              truths=truths)
    engines = EngineSet(
        reasoner=build_engine(cfg.reasoner.model_copy(update={"tokenizer": str(model_dir)})),
        memory=ScriptedEngine(teacher, tokenizer=tokenizer), by_role={"bank_edit": ScriptedEngine(BankWriter())},
    )
    traces = run_rollouts([build_proactive_rollout(t, cfg.memory, seed=seed) for t in tasks], engines)
    distilled = distill_traces(traces, work / "distill", RejectionConfig(min_outcome=0.0, roles=["intervene"]),
                               progress=False)
    teacher_pass = sum(t.outcome or 0.0 for t in traces) / len(traces)
    sft = SFTRunConfig.model_validate({
        "run": {"output_dir": str(work), "name": "sft", "seed": seed},
        "model": {"base": str(model_dir)},
        "lora": {"enabled": False},
        "data": {"dir": str(work / "distill"), "roles": ["intervene"]},
        "train": {"max_steps": args.sft_steps, "batch_size": args.sft_batch, "lr": args.sft_lr, "warmup": 0.05,
                  "bf16": True, "save_steps": 0, "logging_steps": 20, "max_length": 384, "progress": False},
    })
    run_sft(sft)
    return {"teacher_pass_rate": round(teacher_pass, 4), "intervene_rows": distilled["roles"]["intervene"]["kept"],
            "seconds": round(time.perf_counter() - t0, 1)}


def run_variant(args: argparse.Namespace, final: Path, seed_dir: Path, seed: int, variant: str,
                settings: dict[str, int]) -> dict[str, Any]:
    """Pivot-turn GRPO from the SFT model ``final`` with groups at ``variant``; the summary and the wall time."""
    from memrl.train.pivot_grpo import PivotGRPOConfig, run_pivot_grpo

    sized = [f"{key}={settings[name]}" for name, key in GRPO_KEYS.items()]
    cfg = load_config(PivotGRPOConfig, args.config, [
        f"run.output_dir={seed_dir}", f"run.name={variant}", f"run.seed={seed}", f"policy.base={final}",
        f"engine.model={final}", f"reasoner.tokenizer={final}", f"phase1.tokenizer={final}", *sized,
        f"groups.at={'pivots' if variant == 'pivot' else 'all_turns'}", *args.overrides,
    ])
    run_dir = seed_dir / variant
    earlier = [seed_dir / v / "baselines.json" for v in VARIANTS if v != variant]
    if not run_dir.exists() and (found := next((p for p in earlier if p.is_file()), None)) is not None:
        run_dir.mkdir(parents=True)  # the same SFT model, seed and held-out tasks: reuse its no-RL evaluation
        shutil.copy(found, run_dir / "baselines.json")
    done = run_dir / "summary.json"
    if not (args.reuse_runs and done.is_file()):
        run_pivot_grpo(cfg)
    summary = json.loads(done.read_text())
    # the run's own clock: seconds from its logger's start to its last record (the final evaluation)
    last = (run_dir / "metrics.jsonl").read_text().splitlines()[-1]
    seconds = float(json.loads(last)["time_s"])
    for row in summary["history"]:
        emit({"stage": "grpo", "seed": seed, "variant": variant,
              **{k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()
                 if k in ("iteration", "reward_mean", "pivot_pool", "pivot_groups", "planted_group_fraction",
                          "pivot_success", "pivot_reminder_rate", "non_pivot_reminder_rate",
                          "zero_variance_group_fraction", "rows", "refresh_recall", "refresh_precision",
                          "action_tokens")}})
    return {"summary": summary, "seconds": seconds, "eval_tasks": cfg.eval_tasks.count}


def result_row(seed: int, variant: str, evaluation: dict[str, Any], n: int, tokens: float, seconds: float
               ) -> dict[str, Any]:
    """One (seed, variant) result with Wilson intervals over its ``n`` held-out episodes."""
    sampled, greedy = evaluation["pass_rate"], evaluation.get("greedy_pass_rate")
    return {
        "stage": "result", "seed": seed, "variant": variant, "held_out_tasks": n,
        "pass_rate": round(sampled, 4), "pass_rate_ci95": wilson(sampled * n, n),
        "greedy_pass_rate": None if greedy is None else round(greedy, 4),
        "greedy_pass_rate_ci95": None if greedy is None else wilson(greedy * n, n),
        "reminders_per_episode": round(evaluation["reminders_per_episode"], 3),
        "greedy_reminders_per_episode": (round(evaluation["greedy_reminders_per_episode"], 3)
                                         if "greedy_reminders_per_episode" in evaluation else None),
        "double_checks_per_episode": round(evaluation["double_checks_per_episode"], 3),
        "action_tokens_training": tokens, "action_tokens_eval_per_run": evaluation["action_tokens"],
        "seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "pivot_grpo_tiny.yaml"))
    parser.add_argument("--work", default=None, help="output directory (default: a temporary one)")
    parser.add_argument("--quick", action="store_true", help="the ~15-minute setting (see SETTINGS)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="GRPO and evaluation seeds")
    parser.add_argument("--miss", type=float, default=0.4, help="teacher: silence at a pivot")
    parser.add_argument("--false-alarm", type=float, default=0.1, help="teacher: needless citation elsewhere")
    parser.add_argument("--sft-batch", type=int, default=32)
    parser.add_argument("--sft-lr", type=float, default=3e-3)
    parser.add_argument("--reuse-sft", action="store_true", help="keep an existing <work>/sft/final")
    parser.add_argument("--reuse-runs", action="store_true",
                        help="read back (seed, variant) runs that finished in <work> instead of redoing them")
    for name in SETTINGS["full"]:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help="override the setting's")
    parser.add_argument("overrides", nargs="*", help="dotted overrides of the GRPO config")
    args = parser.parse_args()
    setting = "quick" if args.quick else "full"
    settings = {k: v if getattr(args, k) is None else getattr(args, k) for k, v in SETTINGS[setting].items()}
    args.train_tasks, args.sft_steps = settings["train_tasks"], settings["sft_steps"]

    from memrl.train.pivot_grpo import PivotGRPOConfig

    work = Path(args.work or tempfile.mkdtemp(prefix="memrl-pivot-learning-"))
    start = time.perf_counter()
    model_dir = ensure_tiny_model(ROOT / ".cache" / "models", TinyModelSpec())
    emit({"stage": "setting", "setting": setting, **settings, "seeds": args.seeds, "overrides": args.overrides})

    # one SFT model (the first seed's teacher traces and SFT run) is the start of every seed and variant
    final = work / "sft" / "final"
    base = load_config(PivotGRPOConfig, args.config, [
        f"run.output_dir={work}", f"run.seed={args.seeds[0]}", f"policy.base={model_dir}",
        f"engine.model={model_dir}", *args.overrides,
    ])
    if args.reuse_sft and final.is_dir():
        done = work / "sft" / "summary.json"  # the SFT run's own record: its wall time, when it wrote one
        wall = json.loads(done.read_text())["wall_s"] if done.is_file() else 0.0
        teacher: dict[str, Any] = {"reused": str(final), "seconds": round(wall, 1)}
    else:
        teacher = teacher_and_sft(base, args, model_dir, work, args.seeds[0])
    emit({"stage": "sft", **teacher})
    rows: list[dict[str, Any]] = []
    for seed in args.seeds:
        seed_dir = work / f"seed{seed}"
        for variant in VARIANTS:
            out = run_variant(args, final, seed_dir, seed, variant, settings)
            summary, n = out["summary"], out["eval_tasks"]
            if variant == VARIANTS[0]:
                row = result_row(seed, "no_rl", summary["before"], n, 0.0, teacher["seconds"])
                row["no_memory_pass_rate"] = summary["before"].get("no_memory_pass_rate")
                rows.append(row)
                emit(row)
            row = result_row(seed, variant, summary["after"], n, summary["training_action_tokens"], out["seconds"])
            rows.append(row)
            emit(row)

    greedy = all(r["greedy_pass_rate"] is not None for r in rows)  # off when the config evaluates sampled only
    variants: dict[str, dict[str, Any]] = {}
    for name in ("no_rl", *VARIANTS):
        mine = [r for r in rows if r["variant"] == name]
        variants[name] = {
            "pass_rate": mean_ci([r["pass_rate"] for r in mine]),
            "greedy_pass_rate": mean_ci([r["greedy_pass_rate"] for r in mine]) if greedy else None,
            "reminders_per_episode": mean_ci([r["reminders_per_episode"] for r in mine]),
            "action_tokens_training": mean_ci([r["action_tokens_training"] for r in mine]),
            "seconds": mean_ci([r["seconds"] for r in mine]),
        }
    by = {(r["seed"], r["variant"]): r for r in rows}
    deltas = {}
    for a, b in (("pivot", "no_rl"), ("all_turns", "no_rl"), ("pivot", "all_turns")):
        deltas[f"{a}-{b}"] = {
            metric: mean_ci([by[(s, a)][metric] - by[(s, b)][metric] for s in args.seeds])
            for metric in ("pass_rate", "greedy_pass_rate") if greedy or metric == "pass_rate"
        }
    emit({
        "benchmark": "pivot_learning",
        "setting": setting,
        **settings,
        "model": "tiny 2x128",
        "phase1": "bank-writer (observed facts and failures; no plan, no risk note)",
        "sft": teacher,
        "seeds": args.seeds,
        "variants": variants,
        "deltas": deltas,
        "no_memory_pass_rate": mean_ci([r["no_memory_pass_rate"] for r in rows if r["variant"] == "no_rl"]),
        "pivot_beats_all_turns": deltas["pivot-all_turns"]["pass_rate"]["mean"] > 0,
        "pivot_beats_no_rl": deltas["pivot-no_rl"]["pass_rate"]["mean"] > 0,
        "total_seconds": round(time.perf_counter() - start, 1),
        "work": str(work),
    })


if __name__ == "__main__":
    main()
