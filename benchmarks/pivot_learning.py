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
   ``--samples`` rollouts each (the seed's sampling seeds). Per F and variant the mean pass rate, and the paired
   differences (pivot - no_rl, all_turns - no_rl, pivot - all_turns) on the same task under the same seed, with
   two-level 95% intervals over seeds and test tasks (the wider of a bootstrap resampling both and the seed-level t;
   :func:`~memrl.rollout.evaluation.stats.two_level_interval`); the per-task, per-seed pass rates are kept in the
   JSON (``records``) so anyone can recompute them. One JSON line last.

**Settings chosen on dev** (``--select``): the ``pivot`` variant under every entry of :data:`SELECT_GRID` (learning
rate, reminder cost, advantage) from the chosen start, at every F, scored on dev tasks; the highest mean dev pass rate
wins (ties: the entry listed first, the recipe's own). The choice goes to ``<work>/<start>/selected_on_dev.json``,
which a later run applies to both RL variants before the command line's overrides (a file chosen from other start
weights is refused); without it the JSON says the settings were NOT chosen on dev.

``--quick`` is sized to finish within 15 minutes on the 2 shared cores (one start, fewer seeds, tasks and
iterations); the default (full) setting runs 5 seeds.

    .venv/bin/python -m benchmarks.pivot_learning [--quick] [--work DIR] [--seeds 0 1 2 3 4] [--fatal 1 2 3]
                                                  [--select] [--jobs 2] [dotted GRPO overrides]

With ``--reuse`` an interrupted run is completed: SFT models, dev measurements and finished (F, seed, variant) runs
are read back from ``--work``, and a GRPO run that was interrupted continues from its last iteration (every iteration
is checkpointed). The runs live under a folder keyed by their settings, so a rerun under other settings never reads
them back. ``--jobs N`` (with ``--work``; implies ``--reuse``) runs N processes that share the runs through claim
files. Everything is computed under one CPU profile (``benchmarks.harness.CPU_PROFILE``: one torch thread, AVX2
kernels; ``--native-cpu`` opts out), so figures move neither with ``--jobs`` nor with the machine's core count or
instruction set; the starts' digests are recorded, and a rebuilt start whose digest differs from the committed
figures' is named in one line. The last line also gives the wall time,
the CPU time (user + sys, every core) and the load average, and the wall seconds per stage.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    Claims,
    bench_parser,
    cpu_profile,
    cpu_seconds,
    die_with_parent,
    emit,
    mean_ci,
    pin_cpu_numerics,
    pin_threads,
    seed_task_interval,
    start_workers,
    stop_workers,
    wait_for,
    weights_digest,
)
from memrl.data.config import load_config
from memrl.data.distill import RejectionConfig, distill_traces
from memrl.data.experts import ProactiveOracle
from memrl.data.tasks import ProactiveTask
from memrl.data.tasks.proactive import BankWriter
from memrl.rollout.agents import build_proactive_rollout
from memrl.rollout.engines.base import set_torch_threads, torch_threads
from memrl.rollout.engines.factory import build_engine
from memrl.rollout.engines.scripted import ScriptedEngine
from memrl.rollout.loop import EngineSet, run_rollouts
from memrl.rollout.models import TinyModelSpec, ensure_tiny_model, load_tokenizer
from memrl.rollout.pivots import fatal_misses

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("pivot", "all_turns")
PAIRS = (("pivot", "no_rl"), ("all_turns", "no_rl"), ("pivot", "all_turns"))  # the paired differences a - b
# torch threads: the starts' builds (whatever the machine has: the same weights on any machine), then every run
START_THREADS, RUN_THREADS = 1, 1
COMMITTED = ROOT / "docs" / "figures" / "pivot_learning_full.json"  # the committed figures (their start digests)
SELECT_DEV_OFFSET = 10_000  # --select scores on dev tasks from DEV_START + this (the curves use DEV_START ...)
# --select's grid, declared before it ran (issue 39 item 7): dotted GRPO overrides, every advantage preset of
# memrl.rewards.advantage (memrl's default first, then the paper's group-std formula) x the reminder cost (the
# recipe's 0.1, or none) x the learning rate (the recipe's 3e-4, or a third of it); the recipe's settings as they were
# before the selection first, so a tie keeps them (the recipe now carries the choice: dr_grpo, lr 1e-4)
SELECT_ADVANTAGES = ("informative_only", "grpo_std", "dr_grpo", "dr_grpo_gated", "std_floor", "batch_outcome_std")
SELECT_GRID: tuple[dict[str, Any], ...] = tuple(
    {"reward.advantage": advantage, "reward.reminder_cost": cost, "trainer.lr": lr}
    for advantage in SELECT_ADVANTAGES
    for cost in (0.1, 0.0)
    for lr in (3e-4, 1e-4)
)
DEV_START, TEST_START = 50_000, 100_000
STARTS: dict[str, dict[str, Any]] = {  # candidate starting students (teacher noise, teacher task F mix, SFT size)
    "issue": {"miss": 0.4, "false_alarm": 0.1, "fatal_mix": [3], "train_tasks": 48, "sft_steps": 60},  # m ~ 0.8-1
    "clean_curriculum": {"miss": 0.0, "false_alarm": 0.1, "fatal_mix": [1, 2, 3], "train_tasks": 48, "sft_steps": 60},
    "clean_long": {"miss": 0.0, "false_alarm": 0.1, "fatal_mix": [1, 2, 3], "train_tasks": 96, "sft_steps": 240},
}
SETTINGS: dict[str, dict[str, Any]] = {  # sized for the wall time on 2 shared cores before any run; not tuned
    "full": {
        "starts": list(STARTS),
        "seeds": [0, 1, 2, 3, 4],
        "dev_tasks": 12,
        "test_tasks": 24,
        "samples": 2,
        "iterations": 3,
        "label_tasks": 6,
        "pivots_per_iteration": 6,
        "non_pivots_per_iteration": 2,
        "group_size": 8,
    },
    "quick": {
        "starts": ["clean_long"],
        "seeds": [0, 1],
        "dev_tasks": 6,
        "test_tasks": 12,
        "samples": 2,
        "iterations": 2,
        "label_tasks": 3,
        "pivots_per_iteration": 4,
        "non_pivots_per_iteration": 1,
        "group_size": 4,
    },
}
GRPO_KEYS = {
    "iterations": "loop.iterations",
    "dev_tasks": "eval_tasks.count",
    "label_tasks": "pivots.tasks",
    "pivots_per_iteration": "groups.pivots_per_iteration",
    "non_pivots_per_iteration": "groups.non_pivots_per_iteration",
    "group_size": "groups.group_size",
}


def split(cfg: Any, start: int, count: int, fatal: list[int]) -> list[ProactiveTask]:
    """``count`` tasks of the config's family from seed ``start``, F cycling through ``fatal``."""
    return [
        ProactiveTask({**cfg.train_tasks.params, "fatal_pivots": fatal[i % len(fatal)]}, seed=start + i)
        for i in range(count)
    ]


def engines_for(cfg: Any, policy: Any) -> EngineSet:
    """The frozen action agent and bank writer around a Phase 2 ``policy`` engine."""
    return EngineSet(
        reasoner=build_engine(cfg.reasoner), memory=policy, by_role={"bank_edit": ScriptedEngine(BankWriter())}
    )


def hf_policy(cfg: Any, model: Path | str) -> Any:
    return build_engine(cfg.engine.model_copy(update={"model": str(model)}))


def measure(cfg: Any, engines: EngineSet, tasks: list[ProactiveTask], seed: int, samples: int) -> dict[str, Any]:
    """Pass rate, miss rate m and flippable fraction of ``engines``' policy on ``tasks`` (``samples`` each), by F."""
    rollouts = [
        build_proactive_rollout(
            copy.deepcopy(t), cfg.memory, seed=seed + r, rollout_id=f"m{r}", reasoner_sampling=cfg.reasoner_sampling
        )
        for r in range(samples)
        for t in tasks
    ]
    run_rollouts(rollouts, engines)
    out: dict[str, Any] = {}
    for f in sorted({t.params.fatal_pivots for t in tasks}):
        mine = [r for r in rollouts if r.env.params.fatal_pivots == f]
        misses = [fatal_misses(r) for r in mine]
        flat = [m for ms in misses for m in ms]
        out[str(f)] = {
            "pass_rate": round(sum(r.outcome or 0.0 for r in mine) / len(mine), 4),
            "m": round(sum(flat) / len(flat), 4) if flat else None,
            "fatal_pivots_reached": len(flat),
            "flippable": round(
                sum(flippable(r.outcome, ms) for r, ms in zip(mine, misses, strict=True)) / len(mine), 4
            ),
            "exactly_one_miss": round(sum(sum(ms) == 1 for ms in misses) / len(mine), 4),
            "reminders_per_episode": round(
                sum(r.memory.stats.get("reminders_injected", 0) for r in mine) / len(mine), 3
            ),
            "episodes": len(mine),
            "per_task": per_task_pass(mine),
        }
    return out


def per_task_pass(rollouts: list[Any]) -> dict[str, float]:
    """Each task's pass rate over its sampled rollouts: the unit the two-level intervals resample with the seeds."""
    by_task: dict[str, list[float]] = {}
    for r in rollouts:
        by_task.setdefault(r.env.task_id, []).append(float(r.outcome or 0.0))
    return {task: statistics.fmean(values) for task, values in sorted(by_task.items())}


def two_level(by_seed: dict[int, dict[str, float]]) -> dict[str, Any]:
    """Mean and 95% two-level interval over seeds and test tasks (:func:`benchmarks.harness.seed_task_interval`) of
    per-(seed, task) values, rounded, with the seed-level t and the task-level interval beside it."""
    iv = seed_task_interval(by_seed)

    def rounded(x: list[float] | None) -> list[float] | None:
        return x and [round(v, 4) for v in x]

    return {
        "mean": round(iv["mean"], 4),
        "ci95": rounded(iv["ci95"]),
        "ci95_seed_t": rounded(iv["ci95_seed_t"]),
        "ci95_two_level_bootstrap": rounded(iv["ci95_two_level_bootstrap"]),
        "ci95_tasks_only": rounded(iv["ci95_tasks_only"]),
        "n": len(iv["seeds"]),
        "tasks": iv["tasks"],
    }


def paired_deltas(rows: dict[tuple[int, str], dict[str, Any]], seeds: list[int]) -> dict[str, Any]:
    """Per pair of :data:`PAIRS`: the pass-rate difference a - b on the same test task under the same seed, with
    its two-level interval."""
    out = {}
    for a, b in PAIRS:
        diffs = {
            s: {
                t: rows[(s, a)]["per_task"][t] - p
                for t, p in rows[(s, b)]["per_task"].items()
                if t in rows[(s, a)]["per_task"]
            }
            for s in seeds
        }
        out[f"{a}-{b}"] = two_level(diffs)
    return out


def pass_records(rows: dict[tuple[int, str], dict[str, Any]], seeds: list[int]) -> dict[str, Any]:
    """Every variant's pass rate per seed and test task (``tasks``: one order for every list; None where a task was
    not scored), kept in the JSON so the intervals can be recomputed from it alone."""
    tasks = sorted({t for row in rows.values() for t in row["per_task"]})
    return {
        "tasks": tasks,
        "pass_rate": {
            v: {str(s): [rows[(s, v)]["per_task"].get(t) for t in tasks] for s in seeds} for v in ("no_rl", *VARIANTS)
        },
    }


def flippable(outcome: float | None, misses: list[bool]) -> bool:
    """Whether one changed decision at a fatal pivot flips this episode: a pass with every fatal pivot caught (missing
    one fails it) or a failure with exactly one missed (catching it can pass it). A student that misses every pivot
    flips nothing at F >= 2, one that catches every pivot flips every episode: both directions give detection a pivot
    and a pivot group non-zero advantages."""
    passed = bool(outcome)
    return (passed and not any(misses)) or (not passed and sum(misses) == 1)


def train_start(name: str, cfg: Any, args: argparse.Namespace, model_dir: Path, work: Path) -> dict[str, Any]:
    """Teacher traces of start ``name`` -> SFT rows -> the SFT model at ``work/starts/NAME/sft/final``, built with
    :data:`START_THREADS` torch threads whatever the machine has (other thread counts round float sums differently
    and give other weights); the digest of its weights is recorded."""
    from memrl.train.sft import SFTRunConfig, run_sft

    folder = work / "starts" / name
    start = {**STARTS[name], **{k: getattr(args, k) for k in ("train_tasks", "sft_steps") if getattr(args, k)}}
    t0 = time.perf_counter()
    tasks = split(cfg, 0, start["train_tasks"], start["fatal_mix"])
    truths = {t.task_id: t.truth() for t in tasks}
    teacher = ProactiveOracle(
        {"miss_rate": start["miss"], "false_alarm_rate": start["false_alarm"], "cite_ids": True}, truths=truths
    )
    engines = engines_for(cfg, ScriptedEngine(teacher, tokenizer=load_tokenizer(model_dir)))
    sft = SFTRunConfig.model_validate(
        {
            "run": {"output_dir": str(folder), "name": "sft", "seed": 0},
            "model": {"base": str(model_dir)},
            "lora": {"enabled": False},
            "data": {"dir": str(folder / "distill"), "roles": ["intervene"]},
            "train": {
                "max_steps": start["sft_steps"],
                "batch_size": args.sft_batch,
                "lr": args.sft_lr,
                "warmup": 0.05,
                "bf16": True,
                "save_steps": 0,
                "logging_steps": 20,
                "max_length": 384,
                "progress": False,
            },
        }
    )
    with torch_threads(START_THREADS):
        traces = run_rollouts([build_proactive_rollout(t, cfg.memory, seed=0) for t in tasks], engines)
        distilled = distill_traces(
            traces, folder / "distill", RejectionConfig(min_outcome=0.0, roles=["intervene"]), progress=False
        )
        run_sft(sft)
    return {
        "start": name,
        **start,
        "teacher_pass_rate": round(sum(t.outcome or 0.0 for t in traces) / len(traces), 4),
        "intervene_rows": distilled["roles"]["intervene"]["kept"],
        "start_threads": START_THREADS,
        "weights": weights_digest(folder / "sft" / "final")[:16],
        "seconds": round(time.perf_counter() - t0, 1),
    }


def reused_json(path: Path) -> dict[str, Any]:
    """A record an earlier run left in --work, read back for --reuse: a damaged one (cut short, not a JSON object)
    stops the benchmark naming the file, never read as if it were whole."""
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        value = exc
    if not isinstance(value, dict):
        what = f"{type(value).__name__}: {value}" if isinstance(value, Exception) else "not a JSON object"
        raise SystemExit(
            f"[pivot_learning] --reuse: {path} is damaged ({what}); delete it to have it computed again, or run "
            f"without --reuse"
        )
    return value


def reused_start(path: Path, model: Path) -> dict[str, Any]:
    """A start's record read back for --reuse, checked against the SFT model it describes: the weights in ``model``
    must be the ones it recorded (a model folder replaced or cut short since is refused, naming both)."""
    record = reused_json(path)
    try:
        found = weights_digest(model)[:16] if any(model.glob("*.safetensors")) else "no weights"
    except Exception as exc:  # a damaged safetensors file
        found = f"unreadable weights ({type(exc).__name__})"
    if found != record.get("weights"):
        raise SystemExit(
            f"[pivot_learning] --reuse: {path} records SFT weights {record.get('weights')!r} but {model} holds "
            f"{found!r}; delete {path.parent} to train the start again, or run without --reuse"
        )
    return record


def choose_start(
    cfg: Any, args: argparse.Namespace, model_dir: Path, work: Path, dev: list[ProactiveTask]
) -> tuple[str, dict[str, Any]]:
    """Train and measure every candidate start on dev; the one with the most flippable dev episodes (ties: the lower
    dev m, then the first listed)."""
    report: dict[str, Any] = {}
    for name in args.starts:
        path, trained_path = work / "starts" / name / "dev.json", work / "starts" / name / "start.json"
        if args.reuse and path.is_file():
            report[name] = reused_start(path, work / "starts" / name / "sft" / "final")
        else:
            if args.reuse and trained_path.is_file():  # the SFT model is there; its dev measurement is not
                trained = reused_start(trained_path, work / "starts" / name / "sft" / "final")
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


def run_variant(
    args: argparse.Namespace, final: Path, run_root: Path, fatal: int, seed: int, variant: str, overrides: list[str]
) -> dict[str, Any]:
    """Pivot-turn GRPO from the SFT model ``final`` on F = ``fatal`` tasks under the dotted ``overrides`` (the
    settings chosen on dev, then the command line's), evaluated on dev after every iteration and checkpointed after
    every iteration, so ``--reuse`` continues an interrupted run from its last iteration."""
    from memrl.train.pivot_grpo import PivotGRPOConfig, run_pivot_grpo

    done = run_root / variant / "summary.json"
    resume = args.reuse and (run_root / variant / "config.yaml").is_file() and not done.is_file()
    cfg = load_config(
        PivotGRPOConfig,
        args.config,
        [
            f"run.output_dir={run_root}",
            f"run.name={variant}",
            f"run.seed={seed}",
            f"policy.base={final}",
            f"engine.model={final}",
            f"reasoner.tokenizer={final}",
            f"phase1.tokenizer={final}",
            *[f"{key}={getattr(args, name)}" for name, key in GRPO_KEYS.items()],
            f"train_tasks.params.fatal_pivots={fatal}",
            f"eval_tasks.params.fatal_pivots={fatal}",
            f"eval_tasks.seed_start={DEV_START}",
            "loop.eval_every=1",
            "loop.checkpoint_every=1",
            f"run.resume={resume}",
            "eval.greedy=false",
            "eval.no_memory_baseline=false",
            f"groups.at={'pivots' if variant == 'pivot' else 'all_turns'}",
            *overrides,
        ],
    )
    if not (args.reuse and done.is_file()):
        if resume:
            emit({"stage": "resume", "run": str(run_root / variant)})
        run_pivot_grpo(cfg)
    summary = reused_json(done)
    history = summary["history"]
    return {
        "policy_dir": summary["policy_dir"],
        "pivots_detected": [h.get("refresh_pivots") for h in history],  # per iteration (None: no refresh there)
        "pivot_pool": [h.get("pivot_pool") for h in history],
        "detect_budget": next((h["refresh_budget"] for h in history if "refresh_budget" in h), None),
        "bank_entries_tried": sum(h.get("refresh_bank_tried", 0.0) for h in history),
        "bank_entries_over_budget": sum(h.get("refresh_bank_over_budget", 0.0) for h in history),
        "zero_variance_groups": [h.get("zero_variance_group_fraction") for h in history],
        # per iteration: the share of the update's |A| from outcome-tied groups (cost-only signal; issue 39)
        "outcome_tied_advantage_fraction": [h.get("outcome_tied_advantage_fraction") for h in history],
        "dev_curve": [round(e["pass_rate"], 4) for e in summary_evals(summary)],
        "action_tokens_training": summary["training_action_tokens"],
        "seconds": float(json.loads((run_root / variant / "metrics.jsonl").read_text().splitlines()[-1])["time_s"]),
    }


def seconds_by_stage(starts: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, float]:
    """Wall seconds per stage (rows read back with ``--reuse`` count with the time they took when they ran)."""
    return {
        "starts_teacher_and_sft": round(sum(s["seconds"] for s in starts.values()), 1),
        "starts_dev": round(sum(s.get("dev_seconds", 0.0) for s in starts.values()), 1),
        "grpo_runs_with_dev_curves": round(sum(r.get("seconds", 0.0) for r in rows), 1),
        "test": round(sum(r.get("test_seconds", 0.0) for r in rows), 1),
    }


def summary_evals(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The dev evaluations in order: before the first update, then after every iteration."""
    rows = [summary["before"]] if summary["before"] else []
    return rows + [
        h_eval
        for h_eval in (
            {k[len("eval/") :]: v for k, v in h.items() if k.startswith("eval/")} for h in summary["history"]
        )
        if h_eval
    ]


def grpo_overrides(args: argparse.Namespace, work: Path, chosen: str) -> tuple[list[str], dict[str, Any]]:
    """The GRPO runs' dotted overrides: the settings ``--select`` chose on dev for this start (when its file exists
    and was chosen from the same start weights), then the command line's, which win; and what to report about them."""
    path = selection_file(work, chosen)
    if not path.is_file():
        return list(args.overrides), {
            "chosen_on_dev": None,
            "note": f"NOT chosen on dev: no {path} (run --select "
            f"first); the runs use {args.config} with the command line's overrides",
        }
    selection = json.loads(path.read_text())
    weights = json.loads((work / "starts" / chosen / "start.json").read_text()).get("weights")
    if selection.get("start_weights") != weights:
        raise SystemExit(
            f"[pivot_learning] {path} was chosen from the start weights {selection.get('start_weights')}, "
            f"but {work / 'starts' / chosen} holds {weights}: run --select again"
        )
    chosen_overrides = [f"{k}={v}" for k, v in selection["chosen"]["overrides"].items()]
    mine = {o.split("=", 1)[0] for o in args.overrides}
    overruled = [o for o in chosen_overrides if o.split("=", 1)[0] in mine]
    return [*chosen_overrides, *args.overrides], {
        "chosen_on_dev": selection["chosen"]["overrides"],
        "file": str(path),
        "rule": selection["rule"],
        "candidates": [
            {"overrides": c["overrides"], "dev_pass_rate": c["dev_pass_rate"]} for c in selection["candidates"]
        ],
        "overruled_by_the_command_line": overruled,
    }


def selection_file(work: Path, start: str) -> Path:
    """Where ``--select`` writes the GRPO settings it chose for ``start`` and the test run reads them."""
    return work / start / "selected_on_dev.json"


def runs_folder(work: Path, chosen: str, overrides: list[str], args: argparse.Namespace) -> Path:
    """The folder of the (F, seed, variant) runs: keyed by everything they depend on (the settings, the sizes), so
    ``--reuse`` never reads back a run made under other settings."""
    inputs = {
        "overrides": overrides,
        "config": Path(args.config).name,
        "cpu": cpu_profile(),
        **{k: getattr(args, k) for k in SETTINGS["full"] if k not in ("starts", "seeds")},
    }
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:10]
    return work / chosen / f"runs-{key}"


def run_items(items: list[tuple[str, int, Path, Any]], claims: Claims, poll_s: float = 5.0) -> None:
    """Compute every (name, seed, done file, compute) whose done file is missing, sharing the work with the other
    ``--jobs`` processes through ``claims``: one claimed by a live process is waited for, not repeated. Returns when
    every done file exists. ``compute`` writes its done file last (whole, by a rename)."""
    pending = list(items)
    while pending:
        waiting = []
        for name, seed, done, compute in pending:
            if done.is_file():
                continue
            if not claims.take(f"{name}-s{seed}"):
                waiting.append((name, seed, done, compute))
                continue
            try:
                if not done.is_file():
                    compute()
            finally:
                claims.release(f"{name}-s{seed}")
        if waiting and len(waiting) == len(pending):
            time.sleep(poll_s)
        pending = waiting


def write_json(path: Path, record: dict[str, Any]) -> None:
    """``record`` to ``path`` whole or not at all (another process may be waiting for it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(record, indent=1) + "\n")
    partial.replace(path)


def score_item(
    args: argparse.Namespace,
    base: Any,
    final: Path,
    root: Path,
    fatal: int,
    seed: int,
    variant: str,
    overrides: list[str],
    tasks: list[ProactiveTask],
    sample_seed: int,
    path: Path,
) -> None:
    """Train ``variant`` (``no_rl``: nothing) and score its final policy on ``tasks``; the row goes to ``path``."""
    trained = run_variant(args, final, root, fatal, seed, variant, overrides) if variant != "no_rl" else {}
    t0 = time.perf_counter()
    policy = hf_policy(base, trained.get("policy_dir", final))
    try:
        score = measure(base, engines_for(base, policy), tasks, sample_seed, args.samples)
    finally:
        policy.close()
    write_json(
        path,
        {
            "fatal": fatal,
            "seed": seed,
            "variant": variant,
            **score[str(fatal)],
            **trained,
            "test_seconds": round(time.perf_counter() - t0, 1),
        },
    )


def select(
    args: argparse.Namespace, base: Any, final: Path, work: Path, chosen: str, claims: Claims
) -> dict[str, Any] | None:
    """``--select``: the ``pivot`` variant under every entry of :data:`SELECT_GRID` (then the command line's
    overrides) at every F and ``--select-seeds`` seed, each final policy scored on dev tasks beside the start's
    (``no_rl``) on the same tasks; the entry with the highest mean dev pass rate over F and seeds (ties: the entry
    listed first). The test split is not read. A ``--worker`` computes its share and returns None."""
    folder = work / chosen / "select"
    dev = {f: split(base, DEV_START + SELECT_DEV_OFFSET, args.test_tasks, [f]) for f in args.fatal}
    items = []
    for f in args.fatal:
        for seed in args.select_seeds:
            path = folder / "no_rl" / f"F{f}-seed{seed}.dev.json"
            items.append(
                (
                    f"select-no_rl-F{f}",
                    seed,
                    path,
                    lambda f=f, seed=seed, path=path: score_item(
                        args, base, final, folder / "no_rl", f, seed, "no_rl", [], dev[f], DEV_START + 1000 * seed, path
                    ),
                )
            )
            for i, entry in grid(args):
                root = folder / f"c{i}" / f"F{f}" / f"seed{seed}"
                overrides = [*(f"{k}={v}" for k, v in entry.items()), *args.overrides]
                items.append(
                    (
                        f"select-c{i}-F{f}",
                        seed,
                        root / "pivot.dev.json",
                        lambda f=f, seed=seed, root=root, overrides=overrides: score_item(
                            args,
                            base,
                            final,
                            root,
                            f,
                            seed,
                            "pivot",
                            overrides,
                            dev[f],
                            DEV_START + 1000 * seed,
                            root / "pivot.dev.json",
                        ),
                    )
                )
    run_items(items, claims)
    if args.worker:
        return None

    def dev_rate(path: Path) -> float:
        return float(json.loads(path.read_text())["pass_rate"])

    start = statistics.fmean(
        dev_rate(folder / "no_rl" / f"F{f}-seed{s}.dev.json") for f in args.fatal for s in args.select_seeds
    )
    candidates = []
    for i, entry in grid(args):
        by_f = {
            str(f): statistics.fmean(
                dev_rate(folder / f"c{i}" / f"F{f}" / f"seed{s}" / "pivot.dev.json") for s in args.select_seeds
            )
            for f in args.fatal
        }
        candidates.append(
            {
                "entry": i,
                "overrides": entry,
                "dev_pass_rate": round(statistics.fmean(by_f.values()), 4),
                "dev_pass_rate_by_fatal": by_f,
            }
        )
        emit({"stage": "select", **candidates[-1], "no_rl_dev_pass_rate": round(start, 4)})
    best = max(range(len(candidates)), key=lambda i: (candidates[i]["dev_pass_rate"], -i))
    return {
        "rule": "the highest mean dev pass rate of the pivot variant over F and the selection seeds; ties to the "
        "entry listed first (the recipe's settings before the selection)",
        "split": "dev",
        "dev_tasks_per_fatal": args.test_tasks,
        "samples": args.samples,
        "fatal": args.fatal,
        "seeds": args.select_seeds,
        "start": chosen,
        "grid_entries": "all" if args.select_entries is None else [i for i, _ in grid(args)],
        "start_weights": json.loads((work / "starts" / chosen / "start.json").read_text()).get("weights"),
        "command_line_overrides": args.overrides,
        "no_rl_dev_pass_rate": round(start, 4),
        "candidates": candidates,
        "chosen": candidates[best],
    }


def grid(args: argparse.Namespace) -> list[tuple[int, dict[str, Any]]]:
    """The entries of :data:`SELECT_GRID` that ``--select`` runs, with their indices (``--select-entries``)."""
    chosen = range(len(SELECT_GRID)) if args.select_entries is None else args.select_entries
    bad = [i for i in chosen if not 0 <= i < len(SELECT_GRID)]
    if bad:
        raise SystemExit(f"[pivot_learning] --select-entries {bad}: SELECT_GRID has entries 0-{len(SELECT_GRID) - 1}")
    return [(i, SELECT_GRID[i]) for i in chosen]


def start_mismatch(chosen: str, weights: str | None, committed: Path = COMMITTED) -> str | None:
    """One line when the chosen start's weights differ from the ones the committed figures (``committed``) report."""
    if not committed.is_file() or weights is None:
        return None
    reported = (json.loads(committed.read_text()).get("start_weights") or {}).get(chosen)
    if reported is None or reported == weights:
        return None
    return (
        f"WARNING: the start {chosen} has weights {weights}, not {reported} as in {committed}: figures from it "
        f"will not match the committed ones"
    )


def main() -> None:
    parser = bench_parser(__doc__, seed=False)
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
    parser.add_argument(
        "--select",
        action="store_true",
        help="choose the GRPO settings (SELECT_GRID: learning rate, reminder cost, advantage) on dev "
        "for the chosen start and write <work>/<start>/selected_on_dev.json, which later runs "
        "read",
    )
    parser.add_argument("--select-seeds", type=int, nargs="+", default=[0], help="GRPO seeds of every --select entry")
    parser.add_argument(
        "--select-entries",
        type=int,
        nargs="+",
        default=None,
        help="run only these entries of SELECT_GRID (indices; default: all); the record names them",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="processes sharing the (F, seed, variant) runs (needs --work; implies --reuse); every "
        "run computes with one torch thread, so its figures do not depend on --jobs",
    )
    parser.add_argument(
        "--native-cpu",
        action="store_true",
        help="compute with this machine's own kernels and thread count instead of the pinned profile "
        "(benchmarks.harness.CPU_PROFILE: one thread, AVX2 kernels); the figures then depend on "
        "the machine",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    for name, value in SETTINGS["full"].items():
        if isinstance(value, int):
            parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help="override the setting's")
    parser.add_argument("overrides", nargs="*", help="dotted overrides of the GRPO config")
    args = parser.parse_args()
    pin_threads(args.threads)
    setting = "quick" if args.quick else "full"
    for name, value in SETTINGS[setting].items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.jobs > 1 and not args.work:
        parser.error("--jobs needs --work: the processes share its files")
    if args.jobs > 1 or args.worker:
        args.reuse = True  # the processes read back each other's finished runs
    pin_cpu_numerics(args.native_cpu)  # re-executes this process under CPU_PROFILE (before torch loads)
    if args.worker:
        die_with_parent()

    from memrl.train.pivot_grpo import PivotGRPOConfig

    work = Path(args.work or tempfile.mkdtemp(prefix="memrl-pivot-learning-"))
    work.mkdir(parents=True, exist_ok=True)
    clock, cpu_clock, load_before = time.perf_counter(), cpu_seconds(), os.getloadavg()
    model_dir = ensure_tiny_model(ROOT / ".cache" / "models", TinyModelSpec())
    if not args.worker:
        emit(
            {
                "stage": "setting",
                "setting": setting,
                **{k: getattr(args, k) for k in SETTINGS[setting]},
                "fatal": args.fatal,
                "overrides": args.overrides,
                "select": args.select,
                "jobs": args.jobs,
            }
        )
    base = load_config(
        PivotGRPOConfig,
        args.config,
        [
            f"run.output_dir={work}",
            f"policy.base={model_dir}",
            f"engine.model={model_dir}",
            f"reasoner.tokenizer={model_dir}",
            f"phase1.tokenizer={model_dir}",
            *args.overrides,
        ],
    )
    dev = split(base, DEV_START, args.dev_tasks * len(args.fatal), args.fatal)
    chosen, starts = choose_start(base, args, model_dir, work, dev)  # before any worker starts: they reuse it
    final = work / "starts" / chosen / "sft" / "final"
    if not args.worker:
        emit(
            {
                "stage": "chosen",
                "start": chosen,
                "dev_m": starts[chosen]["dev_m"],
                "dev_flippable": starts[chosen]["dev_flippable"],
                "weights": starts[chosen].get("weights"),
            }
        )
        mismatch = start_mismatch(chosen, starts[chosen].get("weights"))
        if mismatch:
            print(f"[pivot_learning] {mismatch}", flush=True)
    set_torch_threads(RUN_THREADS)  # every run on one thread, whatever --jobs and the machine say
    workers = start_workers(args.jobs) if args.jobs > 1 and not args.worker else []
    claims = Claims(work / chosen / "claims")
    try:
        if args.select:
            selection = select(args, base, final, work, chosen, claims)
            if selection is not None:
                wait_for(workers, "pivot_learning")
                write_json(
                    selection_file(work, chosen),
                    {
                        **selection,
                        "wall_seconds": round(time.perf_counter() - clock, 1),
                        "cpu_seconds": round(cpu_seconds() - cpu_clock, 1),
                    },
                )
                emit(
                    {
                        "benchmark": "pivot_learning-select",
                        "setting": setting,
                        **selection,
                        "file": str(selection_file(work, chosen)),
                        "total_seconds": round(time.perf_counter() - clock, 1),
                        "cpu_seconds": round(cpu_seconds() - cpu_clock, 1),
                    }
                )
            return
        overrides, settings_report = grpo_overrides(args, work, chosen)
        folder = runs_folder(work, chosen, overrides, args)
        tests = {f: split(base, TEST_START, args.test_tasks, [f]) for f in args.fatal}
        items = []
        for fatal in args.fatal:
            for seed in args.seeds:
                root = folder / f"F{fatal}" / f"seed{seed}"
                for variant in ("no_rl", *VARIANTS):
                    path = root / f"{variant}.test.json"
                    if not args.reuse:
                        path.unlink(missing_ok=True)
                    items.append(
                        (
                            f"F{fatal}-{variant}",
                            seed,
                            path,
                            lambda fatal=fatal, seed=seed, root=root, variant=variant, path=path: score_item(
                                args,
                                base,
                                final,
                                root,
                                fatal,
                                seed,
                                variant,
                                overrides,
                                tests[fatal],
                                TEST_START + 1000 * seed,
                                path,
                            ),
                        )
                    )
        run_items(items, claims)
        if args.worker:
            return
        wait_for(workers, "pivot_learning")
        report(args, setting, work, folder, chosen, starts, overrides, settings_report, clock, cpu_clock, load_before)
    finally:
        stop_workers(workers)


def report(
    args: argparse.Namespace,
    setting: str,
    work: Path,
    folder: Path,
    chosen: str,
    starts: dict[str, Any],
    overrides: list[str],
    settings_report: dict[str, Any],
    clock: float,
    cpu_clock: float,
    load_before: tuple[float, float, float],
) -> None:
    """Per F: every (seed, variant) row, the pass rates and paired differences with two-level intervals, the
    per-task records; one JSON line last."""
    results: dict[str, Any] = {}
    all_rows: list[dict[str, Any]] = []
    for fatal in args.fatal:
        rows: dict[tuple[int, str], dict[str, Any]] = {}
        for seed in args.seeds:
            for variant in ("no_rl", *VARIANTS):
                row = json.loads((folder / f"F{fatal}" / f"seed{seed}" / f"{variant}.test.json").read_text())
                rows[(seed, variant)] = row
                all_rows.append(row)
                emit({"stage": "result", **{k: v for k, v in row.items() if k not in ("policy_dir", "per_task")}})
        per = {
            v: {
                "pass_rate": two_level({s: rows[(s, v)]["per_task"] for s in args.seeds}),
                "m": mean_ci([rows[(s, v)]["m"] for s in args.seeds if rows[(s, v)]["m"] is not None]),
                "reminders_per_episode": mean_ci([rows[(s, v)]["reminders_per_episode"] for s in args.seeds]),
            }
            for v in ("no_rl", *VARIANTS)
        }
        for v in VARIANTS:
            per[v]["pivots_detected_per_iteration"] = [rows[(s, v)]["pivots_detected"] for s in args.seeds]
            per[v]["dev_curve_mean"] = [
                round(statistics.fmean(c), 4)
                for c in zip(*(rows[(s, v)]["dev_curve"] for s in args.seeds), strict=True)
            ]
        results[str(fatal)] = {
            "test_tasks": args.test_tasks,
            "samples": args.samples,
            "variants": per,
            "paired_deltas_pass_rate": paired_deltas(rows, args.seeds),
            "records": pass_records(rows, args.seeds),
        }
    emit(
        {
            "benchmark": "pivot_learning",
            "setting": setting,
            "model": "tiny 2x128",
            "phase1": "bank-writer (observed facts and failures; no plan, no risk note)",
            "seeds": args.seeds,
            "start_chosen_on_dev": chosen,
            "start_weights": {n: starts[n].get("weights") for n in starts},  # digests: a rebuilt start is compared
            "start_threads": START_THREADS,
            "run_threads": RUN_THREADS,
            "cpu": cpu_profile(),
            "grpo_overrides": overrides,
            "grpo_settings": settings_report,
            "starting_miss_rate_m_dev": {f: starts[chosen]["dev"][str(f)]["m"] for f in args.fatal},
            "starting_flippable_dev": {f: starts[chosen]["dev"][str(f)]["flippable"] for f in args.fatal},
            "starts": {
                n: {
                    k: starts[n][k]
                    for k in (
                        "dev_m",
                        "dev_flippable",
                        "teacher_pass_rate",
                        "miss",
                        "fatal_mix",
                        "train_tasks",
                        "sft_steps",
                        "dev_pass_rate",
                    )
                }
                for n in starts
            },
            "by_fatal_pivots": results,
            "jobs": args.jobs,
            "total_seconds": round(time.perf_counter() - clock, 1),  # this invocation's (a --reuse run: the rest)
            "cpu_seconds": round(cpu_seconds() - cpu_clock, 1),  # user + sys over every core; beside the wall time
            "load_average_1_5_15": {
                "start": [round(x, 2) for x in load_before],
                "end": [round(x, 2) for x in os.getloadavg()],
            },
            "seconds_by_stage": seconds_by_stage(starts, all_rows),
            "work": str(work),
            "runs": str(folder),
        },
        args.json_out,
    )


if __name__ == "__main__":
    main()
