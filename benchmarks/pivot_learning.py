"""Pivot-turn GRPO on the tiny CPU intervention agent: held-out pass rate before and after.

The pipeline runs on CPU with the tiny random-initialised Qwen3 model (2 x 128) and ``configs/pivot_grpo_tiny.yaml``:

1. **Teacher traces.** The proactive memory agent runs on training tasks with an imperfect prompted expert. Phase 1 is
   the noise-free oracle; it also notes the open risk in the bank's private status (``; risk: k1: SENTENCE``: the
   entry the next subtask needs while the window does not show it, as the bank shows it). Phase 2 is the oracle with
   error knobs (``--miss``: stays silent at a pivot; ``--false-alarm``: cites a needless entry) and cites the entry
   with a copy of its line (``<context_for_action>k1: SENTENCE</context_for_action>``; the memory system restates
   the cited entry's exact text, so a garbled copy does no harm). Its Phase 2 calls become SFT rows
   (``data/distill.py``, every trace kept: the student inherits the teacher's calibration).
2. **SFT** of the ``intervene`` role (``train/sft.py``: TRL SFTTrainer, full fine-tuning, bf16 autocast).
3. **Pivot-turn GRPO** (``train/pivot_grpo.py``, the ``memrl train pivot-grpo`` runner) from the SFT model for
   ``--iterations`` iterations: pivots relabelled with the current policy every ``pivots.every`` iterations, G
   samples per pivot, verifier outcome minus a small per-reminder cost.
4. One JSON line last: held-out pass rate before and after at the rollout temperature (1.0) and greedy, reminders per
   episode before and after, the action agent's tokens spent in training, the no-memory baseline, wall times.

Why this shape: a tiny model learns first-token choices and fixed-structure copies in minutes, not content lookup in
long prompts. So bank management stays with the oracle, the risk it notes sits in one place, and the trained output
is a first-token choice (silence or a reminder) plus a copy of the noted line: exactly the when-to-intervene
calibration pivot-turn GRPO is for.

    .venv/bin/python benchmarks/pivot_learning.py [--work runs/pivot-learning] [--iterations 8] [--sft-steps 160]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from data.config import load_config
from data.distill import RejectionConfig, distill_traces
from data.experts import ProactiveOracle
from rollout.engines.config import build_engine
from rollout.engines.scripted import ScriptedEngine
from rollout.loop import EngineSet, run_rollouts
from rollout.memory.proactive import build_proactive_rollout
from rollout.models import TinyModelSpec, ensure_tiny_model, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=str(ROOT / "configs" / "pivot_grpo_tiny.yaml"))
    parser.add_argument("--work", default=None, help="output directory (default: a temporary one)")
    parser.add_argument("--train-tasks", type=int, default=96, help="tasks the teacher runs on for SFT rows")
    parser.add_argument("--miss", type=float, default=0.4, help="teacher: silence at a pivot")
    parser.add_argument("--false-alarm", type=float, default=0.1, help="teacher: needless citation elsewhere")
    parser.add_argument("--sft-steps", type=int, default=160)
    parser.add_argument("--sft-batch", type=int, default=32)
    parser.add_argument("--sft-lr", type=float, default=3e-3)
    parser.add_argument("--iterations", type=int, default=8, help="pivot-turn GRPO iterations")
    parser.add_argument("--reuse-sft", action="store_true", help="keep an existing <work>/sft/final")
    parser.add_argument("overrides", nargs="*", help="dotted overrides of the GRPO config")
    args = parser.parse_args()

    from train.pivot_grpo import PivotGRPOConfig, run_pivot_grpo
    from train.sft import SFTRunConfig, run_sft

    work = Path(args.work or tempfile.mkdtemp(prefix="memrl-pivot-learning-"))
    start = time.perf_counter()
    model_dir = ensure_tiny_model(ROOT / ".cache" / "models", TinyModelSpec())
    final = work / "sft" / "final"
    cfg = load_config(PivotGRPOConfig, args.config, [
        f"run.output_dir={work}", "run.name=pivot-grpo", f"policy.base={final}", f"engine.model={final}",
        f"reasoner.tokenizer={final}", f"phase1.tokenizer={final}", f"loop.iterations={args.iterations}",
        *args.overrides,
    ])

    # 1. teacher traces -> SFT rows of the intervene role
    t0 = time.perf_counter()
    tokenizer = load_tokenizer(model_dir)
    tasks = cfg.train_tasks.load()[: args.train_tasks]
    truths = {t.task_id: t.truth() for t in tasks}
    teacher = ProactiveOracle({"miss_rate": args.miss, "false_alarm_rate": args.false_alarm, "note_risk": True,
                               "cite_ids": True}, truths=truths)
    phase1 = ProactiveOracle({"note_risk": True, "cite_ids": True}, truths=truths)
    engines = EngineSet(
        reasoner=build_engine(cfg.reasoner.model_copy(update={"tokenizer": str(model_dir)})),
        memory=ScriptedEngine(teacher, tokenizer=tokenizer), by_role={"bank_edit": ScriptedEngine(phase1)},
    )
    traces = run_rollouts([build_proactive_rollout(t, cfg.memory, seed=cfg.run.seed) for t in tasks], engines)
    stats = distill_traces(traces, work / "distill", RejectionConfig(min_outcome=0.0, roles=["intervene"]),
                           progress=False)
    teacher_pass = sum(t.outcome or 0.0 for t in traces) / len(traces)
    emit({"stage": "teacher", "tasks": len(tasks), "teacher_pass_rate": round(teacher_pass, 4),
          "intervene_rows": stats["roles"]["intervene"]["kept"], "seconds": round(time.perf_counter() - t0, 1)})

    # 2. SFT of the intervention agent
    t0 = time.perf_counter()
    if not (args.reuse_sft and final.is_dir()):
        sft = SFTRunConfig.model_validate({
            "run": {"output_dir": str(work), "name": "sft", "seed": cfg.run.seed},
            "model": {"base": str(model_dir)},
            "lora": {"enabled": False},
            "data": {"dir": str(work / "distill"), "roles": ["intervene"]},
            "train": {"max_steps": args.sft_steps, "batch_size": args.sft_batch, "lr": args.sft_lr, "warmup": 0.05,
                      "bf16": True, "save_steps": 0, "logging_steps": 20, "max_length": 384, "progress": False},
        })
        run_sft(sft)
    sft_seconds = time.perf_counter() - t0
    emit({"stage": "sft", "steps": args.sft_steps, "batch": args.sft_batch, "seconds": round(sft_seconds, 1)})

    # 3. pivot-turn GRPO (its evaluation before the first update is the SFT agent's)
    t0 = time.perf_counter()
    run_pivot_grpo(cfg)
    grpo_seconds = time.perf_counter() - t0
    summary = json.loads((work / "pivot-grpo" / "summary.json").read_text())
    before, after = summary["before"], summary["after"]
    for row in summary["history"]:
        emit({"stage": "grpo", **{k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()
                                 if k in ("iteration", "reward_mean", "pivot_pool", "pivot_success",
                                          "pivot_reminder_rate", "non_pivot_reminder_rate",
                                          "zero_variance_group_fraction", "rows", "refresh_recall",
                                          "refresh_precision", "action_tokens")}})
    emit({
        "benchmark": "pivot_learning",
        "model": "tiny 2x128",
        "held_out_tasks": cfg.eval_tasks.count,
        "iterations": summary["iterations_run"],
        "pass_rate_before": before["pass_rate"],
        "pass_rate_after": after["pass_rate"],
        "greedy_pass_rate_before": before.get("greedy_pass_rate"),
        "greedy_pass_rate_after": after.get("greedy_pass_rate"),
        "reminders_per_episode_before": before["reminders_per_episode"],
        "reminders_per_episode_after": after["reminders_per_episode"],
        "double_checks_per_episode_before": before["double_checks_per_episode"],
        "double_checks_per_episode_after": after["double_checks_per_episode"],
        "no_memory_pass_rate": before.get("no_memory_pass_rate"),
        "teacher_pass_rate": teacher_pass,
        "action_agent_tokens_training": summary["training_action_tokens"],
        "action_agent_tokens_eval_per_run": after["action_tokens"],
        "pass_rate_rose": after["pass_rate"] > before["pass_rate"],
        "sft_seconds": round(sft_seconds, 1),
        "grpo_seconds": round(grpo_seconds, 1),
        "total_seconds": round(time.perf_counter() - start, 1),
        "work": str(work),
    })


if __name__ == "__main__":
    main()
