"""Does RL make the memory model better than SFT alone, and what do OAT-GRPO's tree credit and committee reward add?
A powered, paired ablation on a task setting where credit assignment matters ("SAM: State-Adaptive Memory for
Long-Horizon Reasoning Agent", arXiv 2605.24468, section 2.3; issues 18 and 26).

One shared SFT checkpoint (the tiny Qwen3 memory model distilled from a limited, noisy SAM expert on the setting's
SFT tasks), then, per seed and at equal reasoner-token budgets (training rollouts only; evaluation is not counted):

- ``oat``: OAT-GRPO, memory-call trees branching at every recall, r = V(n) + lambda (c(n) - c_bar), lambda 0.5;
- ``tree_lambda0``: the same trees without the committee term (lambda 0);
- ``flat``: memrl's flat GRPO (G independent trajectories per task; each trajectory counts once);
- ``sft_more``: no RL; SFT continues from the shared checkpoint on fresh expert trajectories for the same number of
  optimizer steps as ``oat`` seed 0 made, with as many rows per step as it trained on;
- ``no_signal``: OAT-GRPO with the leaf outcomes and the committee scores permuted across the batch (a control: the
  advantages carry nothing about the task);
- ``lr0``: OAT-GRPO at learning rate 0 (a control: everything runs, nothing moves);
- ``trl_grpo`` (not run unless named): TRL ``GRPOTrainer`` as the external peer, in its own loop.

Two named settings (``--setting``, :data:`memrl.data.tasks.sam.SAM_SETTINGS`), each with its own SFT start and runs
under ``<work>/<setting>``: ``multihop`` (the student's own noisy-imitation gap, which more expert data also closes)
and ``deferring_expert`` (the expert's systematic bias, which more expert data cannot remove: the setting where RL
must win).

Every run's final policy is scored on the same ``test_tasks`` test tasks, ``eval_samples`` sampled runs each (recall
at temperature 1, as trained) plus one greedy run, so differences are *paired* by task and seed. Per pair of
variants (RL vs SFT, RL vs ``sft_more``, oat vs flat, oat vs lambda 0, each vs ``no_signal``) the benchmark reports
the mean difference of per-task success with a two-level 95% interval over training seeds and test tasks (the wider
of a bootstrap resampling both and the seed-level t; :func:`paired_difference`), beside the task-level interval
reported before. The JSON keeps every variant's success per seed and task (``records``), so
``--recompute FILE`` recomputes the table from a committed file alone. Learning curves: success on
``dev_curve_tasks`` dev tasks every ``eval_every`` iterations against training reasoner tokens (mean over seeds), as
a PNG. ``--split dev`` scores the final policies on dev tasks instead (for choosing settings; report test).

Settings of the RL variants that differ from memrl's defaults are listed in the JSON (``non_default_settings``) with
the reason for each. ``--select`` chooses the learning rate and KL weight on the dev split only: ``oat``
under each entry of the pre-declared :data:`SELECT_GRID`, scored on dev tasks paired with the SFT start, picked by
:func:`pick_setting`; the choice goes to ``<work>/<setting>/<quick|full>/selected_on_dev.json``, which a later
test-split run reads and lists with its dev figures. ``--selection-scale quick`` lets a full run apply the quick
selection's choice (the full selection costs about as much as the full run); the JSON names the file, its scale and
its dev tasks.

Unattended and resumable: every finished (variant, seed) is a line of ``progress.jsonl`` with the key of the settings
it ran under; rerunning the same command skips those and restarts only the unfinished one. ``--jobs N`` runs N
processes that share the (variant, seed) runs through claim files. Everything is computed under one CPU profile
(:data:`CPU_PROFILE`: one torch thread, AVX2 kernels; the process re-executes itself under it, ``--native-cpu``
opts out), so a run's figures depend neither on ``--jobs``, nor on which process computed it, nor on the machine's
core count or instruction set; a rebuilt start whose digest differs from the one the committed figures
(``docs/figures``) report is named in one line. Evaluations are cached by
(weights, seed, tasks); the SFT start's dev-curve figures are computed once per seed. The JSON reports each phase's
wall and CPU seconds with the load average (``phases``) and, for ``--quick``, the full setting's time extrapolated
from the measured rates (``full_estimate``).

    python -m benchmarks.ablations --quick --select   # choose the RL settings on dev (13 settings, seed 0)
    python -m benchmarks.ablations --quick            # 48 test tasks x 2 samples, 2 seeds
    python -m benchmarks.ablations --select --jobs 2  # the same choice at the full scale (300 dev tasks)
    python -m benchmarks.ablations --jobs 2           # 300 test tasks x 4 samples, 5 seeds, >= 100 optimizer steps
    python -m benchmarks.ablations --jobs 2 --selection-scale quick   # the full run under the quick dev choice
    python -m benchmarks.ablations --setting deferring_expert --select --jobs 2   # the other setting, the same way
    python -m benchmarks.ablations --recompute docs/figures/ablations_full.json  # the intervals from the records

One JSON line last, with ``variants`` (per variant and seed) and ``paired`` (the differences).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    Claims,
    PhaseClock,
    Progress,
    bench_parser,
    check_bench_inputs,
    cpu_profile,
    die_with_parent,
    emit,
    pin_cpu_numerics,
    pin_threads,
    seed_task_interval,
    start_workers,
    stop_workers,
    wait_for,
    weights_digest,
)
from benchmarks.sam_start import SFT_STEPS, SamStart, run_sft_stage

VARIANTS = ("oat", "tree_lambda0", "flat", "sft_more", "no_signal", "lr0", "trl_grpo")
DEFAULT_VARIANTS = VARIANTS[:-1]
# (a, b): the paired differences a - b the benchmark reports
PAIRS = (
    ("oat", "sft"),
    ("tree_lambda0", "sft"),
    ("flat", "sft"),
    ("oat", "sft_more"),
    ("oat", "flat"),
    ("oat", "tree_lambda0"),
    ("oat", "no_signal"),
    ("tree_lambda0", "no_signal"),
    ("flat", "no_signal"),
    ("sft_more", "no_signal"),
    ("oat", "lr0"),
    ("no_signal", "sft"),
    ("lr0", "sft"),
)
# The RL variants' settings that differ from memrl's defaults, with the reason for each (issue 26's analysis of the
# starved RL phase). The learning rate, KL weight and update epochs among them are replaced by the choice of
# ``--select`` on the dev split when its file exists (see RLSettings).
NON_DEFAULT_SETTINGS = {
    "tree.branch_factor=4": "K=2 left ~55% of groups as two copies of one text; 4-8 is practical (issue 26)",
    "tree.max_leaves=16": "4 leaves per sibling at K=4, so V(n) averages more than one outcome",
    "tree.informative_groups=tasks_per_iteration, tree.max_extra_trees=tasks_per_iteration": "dynamic sampling: ~74% "
    "of groups tied on outcome, leaving 2-4 informative comparisons per iteration",
    "trainer.update_epochs=2, trainer.optimizer_steps_per_epoch=2": "4 optimizer steps per batch so the clipped ratio "
    "does its work (one step per iteration never clips)",
    "trainer.kl_coef=0.05 (kl_reference: initial)": "holds the policy near the SFT start: Adam at a fixed lr "
    "otherwise random-walks every weight",
    "trainer.lr=1e-4, lr_schedule=cosine to 0.1 over the run": "half the previous 2e-4 (which drifted 1-3% of "
    "the weights in 5 steps), decayed so late steps refine",
    "loop.eval_every": "a dev learning curve for every run",
}


# torch threads of every run after the shared SFT start, whatever the machine has: no figure depends on the machine's
# core count or on --jobs (one thread is also the fastest on a shared 2-core machine)
RUN_THREADS = 1


@dataclass(frozen=True)
class AblationScale:
    """Sizes of one benchmark setting."""

    test_tasks: int
    train_tasks: int
    tasks_per_iteration: int
    iterations: int  # OAT iterations that define the budget (seed 0)
    max_iterations: int  # cap for the other runs (they stop at the budget)
    eval_every: int
    branch_factor: int
    max_leaves: int
    flat_group_size: int
    trl_prompts_per_step: int
    eval_samples: int  # sampled test runs per task (plus one greedy)
    dev_curve_tasks: int  # dev tasks of the learning curve
    seeds: int
    name: str = "full"  # the folder of its runs
    sft_steps: int = SFT_STEPS  # of the shared SFT start
    distill_tasks: int | None = None  # expert tasks of the SFT data (None: the setting's)

    @property
    def shares_start(self) -> bool:
        """Whether the scale uses the setting's shared SFT start (quick and full do; smoke builds its own)."""
        return self.sft_steps == SFT_STEPS and self.distill_tasks is None


QUICK = AblationScale(
    name="quick",
    test_tasks=48,
    train_tasks=128,
    tasks_per_iteration=4,
    iterations=4,
    max_iterations=6,
    eval_every=2,
    branch_factor=4,
    max_leaves=16,
    flat_group_size=4,
    trl_prompts_per_step=4,
    eval_samples=2,
    dev_curve_tasks=16,
    seeds=2,
)
FULL = AblationScale(
    test_tasks=300,
    train_tasks=1024,
    tasks_per_iteration=8,
    iterations=25,
    max_iterations=32,
    eval_every=5,
    branch_factor=4,
    max_leaves=16,
    flat_group_size=4,
    trl_prompts_per_step=8,
    eval_samples=4,
    dev_curve_tasks=48,
    seeds=5,
)
# the smallest setting (its own tiny SFT start): runs every stage to check the machinery, measures nothing
SMOKE = AblationScale(
    name="smoke",
    test_tasks=3,
    train_tasks=8,
    tasks_per_iteration=2,
    iterations=1,
    max_iterations=2,
    eval_every=1,
    branch_factor=2,
    max_leaves=4,
    flat_group_size=2,
    trl_prompts_per_step=2,
    eval_samples=1,
    dev_curve_tasks=2,
    seeds=2,
    sft_steps=2,
    distill_tasks=6,
)
STEPS_PER_EPOCH = 2  # optimizer steps per pass over a collected batch


@dataclass(frozen=True)
class RLSettings:
    """The RL variants' optimisation settings that ``--select`` chooses on the dev split."""

    lr: float
    kl_coef: float  # the k3 KL to the initial (SFT) policy
    update_epochs: int  # passes over each collected batch, steps_per_epoch optimizer steps each
    advantage: str = "grpo_std"  # credit.advantage: a preset of memrl.rewards.advantage.ADVANTAGE_PRESETS
    steps_per_epoch: int = STEPS_PER_EPOCH  # optimizer steps per pass

    @property
    def name(self) -> str:
        return f"lr{self.lr:g}-kl{self.kl_coef:g}-ep{self.update_epochs}x{self.steps_per_epoch}-{self.advantage}"


# The fields of RLSettings as the config keys they set (the JSON lists the settings by these keys).
RL_KEYS = {
    "lr": "trainer.lr",
    "kl_coef": "trainer.kl_coef",
    "update_epochs": "trainer.update_epochs",
    "advantage": "credit.advantage",
    "steps_per_epoch": "trainer.optimizer_steps_per_epoch",
}
# from issue 26's analysis, used when no --select choice exists: 4 optimizer steps per batch, so FULL's 25
# iterations make 100 optimizer steps
ANALYSIS_SETTINGS = RLSettings(lr=1e-4, kl_coef=0.05, update_epochs=2)
# the advantage presets --select compares (every one of memrl.rewards.advantage.ADVANTAGE_PRESETS): memrl's default
# first, then the paper's formula, so a tie keeps the default
SELECT_ADVANTAGES = ("informative_only", "grpo_std", "dr_grpo", "dr_grpo_gated", "std_floor", "batch_outcome_std")
# --select's grid, declared before it ran (issue 39): every advantage preset at the two learning rates the previous
# --select found best (docs/figures/ablations_select_full.json: 1e-4 and 2e-4, both with kl_coef 0.05, which beat 0
# at each), 2 epochs x 2 optimizer steps per batch; then one entry at the old trainer default of one optimizer step
# per batch. The rule: the highest mean dev success (sampled runs, paired with the SFT start on the same dev tasks);
# a tie goes to the earlier entry (memrl's default advantage, the smaller learning rate).
SELECT_GRID = (
    *(RLSettings(lr, 0.05, 2, advantage) for advantage in SELECT_ADVANTAGES for lr in (1e-4, 2e-4)),
    RLSettings(2e-4, 0.05, 1, SELECT_ADVANTAGES[0], steps_per_epoch=1),
)


def pick_setting(scores: list[float]) -> int:
    """The index of the grid entry ``--select`` chooses: the highest dev success, ties to the earliest entry."""
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


# ----------------------------------------------------------------------------------------------------------------
class AblationBench(SamStart):
    """Shared state of one ablation run: the setting's SFT start (:class:`~benchmarks.sam_start.SamStart`), the
    scale, the scored tasks, the training tasks and the evaluation cache."""

    def __init__(self, args: argparse.Namespace) -> None:
        from memrl.data.tasks import TaskSetConfig, load_tasks

        scale = SMOKE if getattr(args, "smoke", False) else QUICK if args.quick else FULL
        work = Path(args.work) / args.setting
        super().__init__(
            args.setting,
            Path(args.work),
            args.model_cache,
            start_dir=None if scale.shares_start else work / f"start-{scale.name}",
            steps=scale.sft_steps,
            distill_tasks=scale.distill_tasks,
            shared=scale.shares_start,
        )
        self.args, self.scale = args, scale
        self.runs = self.work / scale.name / args.split  # the runs under quick/, full/ or smoke/
        check_bench_inputs(Path(args.work), [self.runs / "progress.jsonl", self.runs / "select_progress.jsonl"])
        self.runs.mkdir(parents=True, exist_ok=True)
        seed = self.setting.test_seed if args.split == "test" else self.setting.dev_seed
        self.test_tasks = load_tasks(
            TaskSetConfig(count=scale.test_tasks, seed=seed, sam=self.setting.test), args.split
        )
        self.train_set = TaskSetConfig(count=scale.train_tasks, seed=self.setting.train_seed, sam=self.setting.train)
        # the learning curve's dev tasks (disjoint from the test tasks by seed, and from the final dev scoring)
        self.curve_tasks = load_tasks(
            TaskSetConfig(count=scale.dev_curve_tasks, seed=self.setting.dev_seed + 1, sam=self.setting.test), "curve"
        )
        self.sft_evals: dict[int, dict[str, Any]] = {}
        self.rl = ANALYSIS_SETTINGS  # replaced by --select's choice in main()
        # the SFT start's dev-curve figures per seed: every RL run of a seed starts from them (computed by the first)
        self.initial_curve: dict[int, dict[str, Any]] = {}
        self.eval_cache = self.runs / "eval_cache"  # evaluations keyed by weights, seed and tasks (deterministic)

    def evaluate(self, model_dir: Path, seed: int) -> dict[str, Any]:
        """Held-out success of a saved memory model on the scored tasks: ``eval_samples`` sampled runs per task (as
        trained) plus greedy, overall and per task (``per_task``: sampled, ``per_task_greedy``)."""
        from memrl.rollout.engines.config import EngineConfig
        from memrl.rollout.engines.factory import build_engine
        from memrl.rollout.evaluation.tasks import evaluate_sam_memory
        from memrl.train.oat_grpo import summarize_eval

        scored = f"{self.args.split}{self.scale.test_tasks}x{self.scale.eval_samples}"
        key = f"{weights_digest(model_dir)[:24]}-s{seed}-{scored}-{cpu_profile()}"
        cached = self.eval_cache / f"{key}.json"
        if cached.exists():  # the same weights, seed and tasks: the evaluation is deterministic
            return json.loads(cached.read_text())
        with self.clock("test_eval"):  # only evaluations that ran: the rate per episode is measured on them
            engine = build_engine(
                EngineConfig(backend="hf", name="memory", model=str(model_dir), dtype="float32", batch_size=64)
            )
            try:
                result = evaluate_sam_memory(
                    self.test_tasks,
                    engine,
                    self.memory,
                    samples=self.scale.eval_samples,
                    reasoner=build_engine(self.reasoner_config(seed)),
                    seed=seed,
                    progress=None,
                )
            finally:
                engine.close()
        per_task: dict[str, list[float]] = {}
        greedy: dict[str, float] = {}
        for r in result["records"]:
            if r["sampled"]:
                per_task.setdefault(r["episode_id"], []).append(float(r["outcome"] or 0.0))
            else:
                greedy[r["episode_id"]] = float(r["outcome"] or 0.0)
        out = {
            **summarize_eval(result),
            "per_task": {k: statistics.fmean(v) for k, v in per_task.items()},
            "per_task_greedy": greedy,
        }
        self.eval_cache.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(f".{os.getpid()}.tmp")  # another --jobs process may read it meanwhile
        partial.write_text(json.dumps(out))
        partial.replace(cached)
        return out

    def sft_eval(self, seed: int) -> dict[str, Any]:
        """The shared SFT checkpoint's held-out figures under ``seed`` (every run of that seed starts from them)."""
        if seed not in self.sft_evals:
            self.sft_evals[seed] = self.evaluate(self.sft_dir, seed)  # type: ignore[arg-type]
        return self.sft_evals[seed]

    # ------------------------------------------------------------------------------------------------ memrl RL
    def oat_family(
        self, variant: str, seed: int, budget: int | None, name: str | None = None, curve: bool = True
    ) -> dict[str, Any]:
        """``oat``, ``tree_lambda0``, ``flat``, ``no_signal`` and ``lr0`` through ``memrl train oat-grpo`` under
        ``self.rl``: a dev learning curve during training (``curve`` False: only its ends), then the final policy
        scored on the scored tasks."""
        from memrl.data.config import RunConfig
        from memrl.data.run_dir import prepare_run_dir
        from memrl.data.tracking import MetricsLogger
        from memrl.rewards.credit import CreditConfig
        from memrl.rollout.engines.config import EngineConfig
        from memrl.rollout.tree import TreeConfig
        from memrl.train.group_trainer import GroupTrainerConfig
        from memrl.train.oat_grpo import OATGRPOConfig, train_oat_grpo
        from memrl.train.online import LoopConfig
        from memrl.train.policy import LoraSettings, PolicySpec

        s = self.scale
        tree = TreeConfig(
            mode="flat" if variant == "flat" else "tree",
            branch_roles=["recall"],
            branch_factor=s.branch_factor,
            max_leaves=s.max_leaves,
            flat_group_size=s.flat_group_size,
            informative_groups=0 if variant == "flat" else s.tasks_per_iteration,
            max_extra_trees=0 if variant == "flat" else s.tasks_per_iteration,
        )
        rl = self.rl
        committee = 0.0 if variant in ("tree_lambda0", "flat") else 0.5
        credit = CreditConfig(
            terms=[{"name": "committee", "weight": committee}] if committee else [],
            shuffle_outcomes=variant == "no_signal",
            advantage=rl.advantage,
        )
        iterations = s.iterations if budget is None else s.max_iterations
        trainer = GroupTrainerConfig(
            lr=0.0 if variant == "lr0" else rl.lr,
            lora=LoraSettings(enabled=False),
            update_epochs=rl.update_epochs,
            optimizer_steps_per_epoch=rl.steps_per_epoch,
            kl_coef=rl.kl_coef,
            kl_reference="initial",
            lr_schedule="cosine",
            min_lr_ratio=0.1,
            lr_decay_steps=iterations * rl.update_epochs * rl.steps_per_epoch,
        )
        cfg = OATGRPOConfig(
            run=RunConfig(output_dir=str(self.runs), name=name or f"{variant}-s{seed}", seed=seed),
            policy=PolicySpec(base=str(self.sft_dir)),
            engine=EngineConfig(backend="hf", name="policy", model=str(self.sft_dir), dtype="float32", batch_size=64),
            reasoner=self.reasoner_config(seed),
            memory=self.memory,
            train_tasks=self.train_set,
            tasks_per_iteration=s.tasks_per_iteration,
            tree=tree,
            credit=credit,
            trainer=trainer,
            loop=LoopConfig(
                iterations=iterations,
                eval_every=s.eval_every if curve else 0,
                checkpoint_every=iterations,
                keep_checkpoints=1,
            ),
            eval_samples=1,
            reasoner_token_budget=budget,
        )
        run_dir = prepare_run_dir(cfg, cfg.run, "train-oat-grpo")
        logger = MetricsLogger(run_dir, None, cfg.model_dump(mode="json"), name=run_dir.name, console=False)
        t0 = time.perf_counter()
        with self.clock("rl_train_and_dev_curve"):
            result = train_oat_grpo(
                cfg, run_dir, logger=logger, eval_tasks=self.curve_tasks, initial_eval=self.initial_curve.get(seed)
            )
        logger.close()
        if result["evals"] and result["evals"][0]["iteration"] == -1:  # the SFT start's figures, for the seed's others
            self.initial_curve.setdefault(seed, {k: v for k, v in result["evals"][0].items() if k != "iteration"})
        trained = [h for h in result["history"] if not h.get("budget_exhausted")]
        trees = sum(s.tasks_per_iteration + int(h.get("extra_trees", 0)) for h in trained)
        spent, by_iteration = 0, {}
        for h in result["history"]:
            spent += int(h.get("reasoner_tokens", 0))
            by_iteration[h["iteration"]] = spent
        curve = [
            (0.0 if e["iteration"] < 0 else float(by_iteration[e["iteration"]]), e["success"], e["success_greedy"])
            for e in result["evals"]
        ]
        rows = [h.get("rows", 0.0) for h in result["history"] if not h.get("skipped")]
        train_s = sum(float(h.get("iteration_s", 0.0)) for h in result["history"])
        final = self.evaluate(Path(result["policy_dir"]), seed)
        return {
            **final,
            "reasoner_tokens": spent,
            "updates": result["updates"],
            "rows_per_update": statistics.fmean(rows) if rows else 0.0,
            "wall_s": round(time.perf_counter() - t0, 1),
            "train_s": round(train_s, 1),
            "trees": trees,
            "iterations_trained": len(trained),
            "curve": curve,
            "diagnostics": diagnostics(result["history"]),
        }

    # ------------------------------------------------------------------------------------------------ SFT only
    def sft_more(self, seed: int, budget: int, steps: int, rows_per_step: int) -> dict[str, Any]:
        """Spend the budget on more expert trajectories and continue SFT on them from the shared checkpoint for
        ``steps`` optimizer steps of ``rows_per_step`` rows (what the RL run it is compared with made)."""
        from memrl.data.config import RunConfig
        from memrl.data.experts.sam import SamOracleConfig
        from memrl.data.tasks import TaskSetConfig, load_tasks
        from memrl.rollout.engines.factory import build_engine
        from memrl.rollout.evaluation.tasks import evaluate_sam_memory
        from memrl.rollout.expert_traces import DistillRunConfig, distill
        from memrl.rollout.models import load_tokenizer

        t0 = time.perf_counter()
        probe = load_tasks(TaskSetConfig(count=16, seed=self.setting.train_seed, sam=self.setting.sft), "probe")
        expert = evaluate_sam_memory(
            probe,
            None,
            self.memory,
            samples=0,
            tokenizer=load_tokenizer(str(self.base)),
            reasoner=build_engine(self.reasoner_config(seed)),
            seed=seed,
            progress=None,
        )
        per_task = max(float(expert["reasoner_tokens_per_task"]), 1.0)
        extra = max(1, math.ceil(budget / per_task))
        out = self.runs / f"sft_more-s{seed}"
        tasks = TaskSetConfig(count=extra, seed=500_000 + 10_000 * seed, sam=self.setting.sft)
        with self.clock("sft_more_data_and_train"):
            distill(
                DistillRunConfig(
                    run=RunConfig(output_dir=str(out), name="distill", seed=seed),
                    tasks=tasks,
                    sam_oracle=SamOracleConfig(**self.setting.expert),
                    sam_memory=self.memory,
                    reasoner_max_pages=2,
                    tokenizer=str(self.base),
                ),
                out / "distill",
            )
            # continued at the RL variants' learning rate: a fresh 2e-3 warm restart undoes the shared checkpoint
            model = run_sft_stage(
                out / "distill",
                self.sft_dir,
                out,
                "sft",
                steps,
                seed=seed,  # type: ignore[arg-type]
                lr=self.rl.lr,
                batch_size=rows_per_step,
            )
        result = self.evaluate(model, seed)
        return {
            **result,
            "reasoner_tokens": round(extra * per_task),
            "extra_expert_tasks": extra,
            "sft_steps": steps,
            "sft_rows_per_step": rows_per_step,
            "wall_s": round(time.perf_counter() - t0, 1),
        }

    # ------------------------------------------------------------------------------------------------ TRL peer
    def trl_grpo(self, seed: int, budget: int) -> dict[str, Any]:
        """TRL ``GRPOTrainer`` on the recall contexts of the SFT model's own trajectories, trajectory-level reward."""
        import torch
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer

        from memrl.data.tasks import load_tasks
        from memrl.rollout.agents import sam_rollout
        from memrl.rollout.engines.base import Completion, GenerationResult, Usage
        from memrl.rollout.engines.config import EngineConfig
        from memrl.rollout.engines.factory import build_engine
        from memrl.rollout.loop import EngineSet, run_rollouts
        from memrl.rollout.models import load_tokenizer

        t0 = time.perf_counter()
        tokenizer = load_tokenizer(str(self.sft_dir))
        memory_engine = build_engine(
            EngineConfig(backend="hf", name="continuation", model=str(self.sft_dir), dtype="float32", batch_size=64)
        )
        engines = EngineSet(reasoner=build_engine(self.reasoner_config(seed)), memory=memory_engine)
        spent = [0]

        # 1. the SFT model's own trajectories; a snapshot at the start of every recall is a prompt
        tasks = load_tasks(self.train_set, "train")
        random.Random(seed).shuffle(tasks)
        states: list[Any] = []
        rows: list[dict[str, Any]] = []

        def on_result(rollout: Any, call: Any, result: Any) -> None:
            if call.kind == "memory" and call.role == "recall" and not call.request.metadata.get("continues_action"):
                snapshot = rollout.fork(f"{rollout.rollout_id}.p{len(states)}")  # still waiting for this call
                rows.append(
                    {
                        "prompt": [{"role": m.role, "content": m.content} for m in call.request.messages],
                        "state": len(states),
                    }
                )
                states.append(snapshot)

        collect = [
            sam_rollout(t, self.memory, seed=seed, rollout_id="c") for t in tasks[: 2 * self.scale.tasks_per_iteration]
        ]
        run_rollouts(collect, engines, on_result=on_result)
        spent[0] += sum(r.reasoner_usage.spent for r in collect)
        if not rows:
            raise RuntimeError("trl_grpo: the SFT model's trajectories made no recall: no prompt to train on")

        # 2. reward: continue the episode from the snapshot with the completion as that recall's page read
        def reward(
            prompts: list[Any], completions: list[Any], state: list[int], completion_ids: list[list[int]], **_: Any
        ) -> list[float]:
            forks = []
            for i, (completion, ids, key) in enumerate(zip(completions, completion_ids, state, strict=True)):
                text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
                rollout = states[key].fork(f"g{i}")
                rollout.advance(
                    GenerationResult(
                        prompt_ids=[],
                        completions=[Completion(ids, [0.0] * len(ids), text, "stop")],
                        usage=Usage(completion_tokens=len(ids)),
                        engine="trl",
                    )
                )
                forks.append(rollout)
            before = [r.reasoner_usage.spent for r in forks]
            run_rollouts(forks, engines)
            spent[0] += sum(r.reasoner_usage.spent - b for r, b in zip(forks, before, strict=True))
            return [float(r.outcome or 0.0) for r in forks]

        model = AutoModelForCausalLM.from_pretrained(str(self.sft_dir), dtype=torch.float32)

        class SyncAndBudget(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
                memory_engine.update_weights(model.state_dict(), state.global_step)
                if spent[0] >= budget:
                    control.should_training_stop = True
                return control

        k = self.scale.branch_factor * 2
        args = GRPOConfig(
            output_dir=str(self.runs / f"trl_grpo-s{seed}"),
            seed=seed,
            learning_rate=2e-4,
            num_generations=k,
            per_device_train_batch_size=k * self.scale.trl_prompts_per_step,
            max_completion_length=64,
            temperature=1.0,
            top_p=1.0,
            beta=0.0,
            max_steps=10_000,
            logging_steps=5,
            save_strategy="no",
            report_to=[],
            use_cpu=not torch.cuda.is_available(),
            bf16=False,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            callbacks=[SyncAndBudget()],
        )
        trainer.train()
        out = self.runs / f"trl_grpo-s{seed}" / "final"
        trainer.save_model(str(out))
        tokenizer.save_pretrained(str(out))
        memory_engine.close()
        result = self.evaluate(out, seed)
        return {
            **result,
            "reasoner_tokens": spent[0],
            "updates": trainer.state.global_step,
            "prompts": len(rows),
            "wall_s": round(time.perf_counter() - t0, 1),
        }


# ----------------------------------------------------------------------------------------------------------------
DIAGNOSTIC_KEYS = (
    "rows",
    "trained_tokens",
    "informative_groups",
    "outcome_tie_fraction",
    "identical_sibling_fraction",
    "advantage_mean",
    "approx_kl",
    "approx_kl_max",
    "clip_fraction",
    "ratio_min",
    "ratio_max",
    "kl_initial_probe",
    "extra_trees",
    "informative_groups_short",
    "optimizer_step_count",
    # issue 39: how much of an update the outcome-tied groups and identical rows make up
    "outcome_tied_row_fraction",
    "outcome_tied_advantage_fraction",
    "identical_row_fraction",
    "identical_row_cancelled_advantage_fraction",
    "prefix_shared_sibling_fraction",
    "kl_probe_s",
)


def diagnostics(history: list[dict[str, Any]]) -> dict[str, float]:
    """A run's training diagnostics: the mean over its iterations of each of :data:`DIAGNOSTIC_KEYS` (the last for
    the KL to the initial policy, which accumulates)."""
    out: dict[str, float] = {}
    for key in DIAGNOSTIC_KEYS:
        values = [float(h[key]) for h in history if isinstance(h.get(key), (int, float))]
        if values:
            out[key] = values[-1] if key == "kl_initial_probe" else statistics.fmean(values)
    return out


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per variant: mean over seeds of test success (sampled, greedy), tokens, wall time, and each seed's row."""
    out: dict[str, Any] = {}
    for variant, rows in runs.items():
        if not rows:
            continue
        out[variant] = {
            "mean": {
                "success": statistics.fmean(r["success"] for r in rows),
                "success_greedy": statistics.fmean(r["success_greedy"] for r in rows),
                "reasoner_tokens": statistics.fmean(r["reasoner_tokens"] for r in rows),
                "wall_s": statistics.fmean(r["wall_s"] for r in rows),
            },
            "seeds": [
                {
                    k: v
                    for k, v in r.items()
                    if k not in ("curve", "per_task", "per_task_greedy", "by_horizon")
                    and not k.startswith("success/")
                    and not k.startswith("success_greedy/")
                }
                for r in rows
            ],
        }
    return out


def paired_difference(a: list[dict[str, Any]], b: list[dict[str, Any]], key: str = "per_task") -> dict[str, Any]:
    """Mean over seeds and tasks of (a's success - b's success) on the same task under the same seed, in points,
    with a two-level 95% interval over training seeds and test tasks
    (:func:`~memrl.rollout.evaluation.stats.two_level_interval`: the wider of the two-level bootstrap and the
    seed-level t); the task-level interval reported before (seeds averaged first, tasks as the only unit) is kept
    beside it as ``ci95_tasks_only``. Seeds are matched where both sides have them, tasks where every matched seed
    of both sides has them."""
    seeds = sorted({r["seed"] for r in a} & {r["seed"] for r in b})
    if not seeds:
        return {}
    a_by, b_by = {r["seed"]: r[key] for r in a}, {r["seed"]: r[key] for r in b}
    iv = seed_task_interval(
        {s: {t: 100 * (a_by[s][t] - b_by[s][t]) for t in set(a_by[s]) & set(b_by[s])} for s in seeds}
    )
    return {
        "difference": iv["mean"],
        "ci95": iv["ci95"],
        "half_width": iv["half_width"],
        "ci95_two_level_bootstrap": iv["ci95_two_level_bootstrap"],
        "ci95_seed_t": iv["ci95_seed_t"],
        "ci95_tasks_only": iv["ci95_tasks_only"],
        "per_seed": iv["per_seed"],
        "tasks": iv["tasks"],
        "seeds": seeds,
        "interval": iv["interval"],
    }


RECORD_KEYS = {"sampled": "per_task", "greedy": "per_task_greedy"}


def task_records(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Every variant's success per seed and test task, the unit the intervals resample, for the committed JSON:
    ``tasks`` (one order for every list), then per mode (``sampled``: the mean over the task's sampled runs;
    ``greedy``: its greedy run) ``{variant: {seed: [success per task, None where not scored]}}``."""
    tasks = sorted({t for rows in runs.values() for r in rows for t in r.get("per_task", {})})
    out: dict[str, Any] = {"tasks": tasks}
    for mode, key in RECORD_KEYS.items():
        out[mode] = {
            v: {str(r["seed"]): [r.get(key, {}).get(t) for t in tasks] for r in rows}
            for v, rows in runs.items()
            if rows
        }
    return out


def paired_from_records(records: dict[str, Any], pairs: tuple[tuple[str, str], ...] = PAIRS) -> dict[str, Any]:
    """The ``paired`` table recomputed from :func:`task_records`' output alone (what ``--recompute FILE`` prints)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for mode, key in RECORD_KEYS.items():
        for variant, by_seed in records[mode].items():
            rows = runs.setdefault(variant, [])
            for seed, values in by_seed.items():
                row = next((r for r in rows if r["seed"] == int(seed)), None)
                if row is None:
                    row = {"seed": int(seed)}
                    rows.append(row)
                row[key] = {t: v for t, v in zip(records["tasks"], values, strict=True) if v is not None}
    return {
        f"{a} - {b}": {
            "sampled": paired_difference(runs[a], runs[b]),
            "greedy": paired_difference(runs[a], runs[b], "per_task_greedy"),
        }
        for a, b in pairs
        if runs.get(a) and runs.get(b)
    }


def settings_chosen_on_dev(selection: dict[str, Any], file_name: str) -> tuple[RLSettings, dict[str, str]]:
    """The RL settings a ``--select`` record chose, and the non-default settings with their reasons: what the grid
    varied is listed as chosen on dev with every candidate's dev figure; what it held fixed is listed as such."""

    def settings(row: dict[str, Any]) -> dict[str, Any]:  # records before issue 39 lack advantage, steps_per_epoch
        return {k: row.get(k, getattr(ANALYSIS_SETTINGS, k)) for k in RL_KEYS}

    candidates = [settings(r) for r in selection["candidates"]]
    rl = RLSettings(**settings(selection["chosen"]))
    varied = [k for k in RL_KEYS if len({c[k] for c in candidates}) > 1]
    non_default = {
        k: v
        for k, v in NON_DEFAULT_SETTINGS.items()
        if not k.startswith(("trainer.kl_coef", "trainer.lr", "trainer.update"))
    }

    def value(v: Any) -> str:
        return f"{v:g}" if isinstance(v, float) else str(v)

    figures = ", ".join(
        "/".join(value(c[k]) for k in varied) + f": {100 * r['dev_success']:.1f}%"
        for c, r in zip(candidates, selection["candidates"], strict=True)
    )
    chosen = ", ".join(f"{RL_KEYS[k]}={value(getattr(rl, k))}" for k in varied)
    for k in RL_KEYS:
        if k not in varied:
            non_default[f"{RL_KEYS[k]}={value(getattr(rl, k))}"] = "held fixed on the --select grid (not chosen on dev)"
    if varied:
        non_default[chosen] = (
            f"chosen on dev ({file_name}: {selection.get('scale', '?')} scale, {selection.get('dev_tasks', '?')} "
            f"dev tasks; {selection['rule']}): dev success by "
            f"{'/'.join(RL_KEYS[k] for k in varied)}: {figures}; SFT "
            f"{100 * selection['sft_dev_success']:.1f}%"
        )
    non_default["trainer.lr_schedule=cosine to 0.1 over the run"] = (
        "from issue 26's analysis, not chosen on dev: late steps refine"
    )
    return rl, non_default


def plot_curves(runs: dict[str, list[dict[str, Any]]], sft: float, path: Path, setting: str = "multihop") -> None:
    """Dev success (sampled) against training reasoner tokens, mean over seeds, one line per variant. A variant
    without a dev curve (``sft_more``) is not drawn on the dev axis: a note under the plot gives its test success
    against the SFT start's (``sft``, test), so the two splits never share an axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.8))
    notes = []
    for variant, rows in runs.items():
        if not rows:
            continue
        if rows[0].get("curve"):
            n = min(len(r["curve"]) for r in rows)
            xs = [statistics.fmean(r["curve"][i][0] for r in rows) for i in range(n)]
            ys = [statistics.fmean(r["curve"][i][1] for r in rows) for i in range(n)]
            ax.plot(xs, ys, marker="o", label=variant)
        else:
            test = 100 * statistics.fmean(r["success"] for r in rows)
            tokens = statistics.fmean(r["reasoner_tokens"] for r in rows)
            notes.append(
                f"{variant} has no dev curve: test success {test:.1f}% after {tokens:,.0f} reasoner tokens "
                f"(SFT start on test: {100 * sft:.1f}%)"
            )
    ax.set_xlabel("training reasoner tokens")
    ax.set_ylabel("held-out dev success (sampled)")
    ax.set_title(f"SAM {setting}: learning curves on dev (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if notes:
        fig.text(0.01, 0.01, "\n".join(notes), fontsize=7)
    fig.tight_layout(rect=(0, 0.04 * len(notes), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_key(args: argparse.Namespace, scale: AblationScale, rl: RLSettings, start: dict[str, str]) -> str:
    """What a finished (variant, seed) row of progress.jsonl was computed under: a row is reused on a rerun only
    when every one of these is unchanged, the weights it started from (``start``: AblationBench.start's digests)
    included."""
    inputs = {
        "scale": asdict(scale),
        "rl": asdict(rl),
        "setting": args.setting,
        "split": args.split,
        "sft_steps": SFT_STEPS,
        "non_default": sorted(NON_DEFAULT_SETTINGS),
        "start": start,
        "cpu": cpu_profile(),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def run_all(
    items: list[tuple[str, int, Any]],
    progress: Progress,
    claims: Claims,
    runs: Path,
    on_finished: Any = None,
    poll_s: float = 5.0,
) -> None:
    """Compute every (variant, seed, compute) not yet in ``progress``, sharing the work with any other process on
    the same files: a run another live process has claimed is waited for, not repeated. Returns when every item is
    finished, by whichever process. A run's folder (``runs/<variant>-s<seed>``) left by an interrupted try is
    removed before it runs again. ``on_finished(variant, seed, row, seconds)`` reports the ones computed here."""
    import shutil

    pending = list(items)
    while pending:
        waiting = []
        for variant, seed, compute in pending:
            if progress.get(variant, seed) is not None:
                continue
            if not claims.take(f"{variant}-s{seed}"):
                waiting.append((variant, seed, compute))
                continue
            try:
                if progress.get(variant, seed) is None:  # finished between the check and the claim
                    shutil.rmtree(runs / f"{variant}-s{seed}", ignore_errors=True)  # an interrupted try
                    t0 = time.perf_counter()
                    row = compute()
                    progress.add(variant, seed, row)
                    if on_finished is not None:
                        on_finished(variant, seed, row, time.perf_counter() - t0)
            finally:
                claims.release(f"{variant}-s{seed}")
        if waiting and len(waiting) == len(pending):
            time.sleep(poll_s)  # every remaining run is another process's: wait for it
        pending = waiting


def selection_file(work: Path, scale: str) -> Path:
    """Where ``--select`` writes its choice and the test-split run reads it."""
    return work / scale / "selected_on_dev.json"


def select(bench: AblationBench, progress: Progress, claims: Claims, seed: int = 0) -> dict[str, Any] | None:
    """``--select``: ``oat`` under each of :data:`SELECT_GRID` on the dev split only (one seed, the SFT start's
    figures on the same dev tasks as the pair), the choice by :func:`pick_setting`. A ``--worker`` computes its
    share of the runs and returns None."""

    def candidate_run(candidate: RLSettings) -> dict[str, Any]:
        bench.rl = candidate
        return bench.oat_family("oat", seed, None, name=f"select-{candidate.name}-s{seed}", curve=False)

    items = [("sft", seed, lambda: bench.sft_eval(seed))]
    items += [(f"select-{c.name}", seed, lambda c=c: candidate_run(c)) for c in SELECT_GRID]
    run_all(items, progress, claims, bench.runs)
    if bench.args.worker:
        return None
    sft = progress.get("sft", seed)
    assert sft is not None
    rows = []
    for candidate in SELECT_GRID:
        row = progress.get(f"select-{candidate.name}", seed)
        assert row is not None
        diff = paired_difference([row], [sft])
        rows.append(
            {
                **asdict(candidate),
                "dev_success": row["success"],
                "dev_success_greedy": row["success_greedy"],
                "oat_minus_sft": diff,
                "updates": row["updates"],
                "wall_s": row["wall_s"],
            }
        )
        say(
            f"select {candidate.name}: dev sampled {row['success']:.3f} greedy {row['success_greedy']:.3f} "
            f"(SFT {sft['success']:.3f}); oat - SFT {diff['difference']:+.1f} "
            f"[{diff['ci95'][0]:+.1f}, {diff['ci95'][1]:+.1f}]"
        )
    chosen = pick_setting([r["dev_success"] for r in rows])
    return {
        "rule": "the highest mean dev success (sampled), ties to the setting listed first (closest to memrl's "
        "defaults: kl_coef 0 first, then the smaller lr)",
        "split": "dev",
        "seed": seed,
        "dev_tasks": bench.scale.test_tasks,
        "eval_samples_per_task": bench.scale.eval_samples,
        "sft_dev_success": sft["success"],
        "candidates": rows,
        "chosen": rows[chosen],
    }


def full_estimate(
    runs: dict[str, list[dict[str, Any]]], phases: dict[str, dict[str, float]], scale: AblationScale
) -> dict[str, Any]:
    """The full setting's time on this machine, extrapolated from this run's measured rates: seconds per tree (or
    flat group) built and trained, and per evaluation episode (a task's sampled or greedy run)."""
    rl = [
        r for variant, rows in runs.items() if variant not in ("sft_more", "trl_grpo") for r in rows if r.get("trees")
    ]
    evals = phases.get("test_eval", {})
    episodes = evals.get("count", 0) * scale.test_tasks * (scale.eval_samples + 1)
    if not rl or not episodes:
        return {}
    per_tree = sum(r["train_s"] for r in rl) / sum(r["trees"] for r in rl)
    per_episode = evals["wall_s"] / episodes
    # dynamic sampling's extra trees, as a ratio to the iterations' own tasks
    extra_ratio = sum(r["trees"] for r in rl) / sum(r["iterations_trained"] * scale.tasks_per_iteration for r in rl)
    curve = FULL.dev_curve_tasks * 2 * (FULL.iterations // FULL.eval_every + 1)  # 1 sampled + greedy per eval
    per_rl_run = (
        FULL.iterations * FULL.tasks_per_iteration * extra_ratio * per_tree
        + (FULL.test_tasks * (FULL.eval_samples + 1) + curve) * per_episode
    )
    runs_full = FULL.seeds * (len(DEFAULT_VARIANTS) - 1)  # RL runs; sft_more and the SFT evals are cheaper
    total = runs_full * per_rl_run + FULL.seeds * 2 * FULL.test_tasks * (FULL.eval_samples + 1) * per_episode
    return {
        "seconds_per_tree": round(per_tree, 2),
        "seconds_per_eval_episode": round(per_episode, 3),
        "seconds_per_rl_variant_seed": round(per_rl_run),
        "hours_total": round(total / 3600, 1),
        "how": "this run's rates x the full setting's trees (25 iterations x 8 tasks, scaled by this run's "
        "extra-tree ratio) and evaluation episodes (300 x 5 test + 48 x 2 dev-curve x 6)",
    }


def say(message: str) -> None:
    """One progress line on stdout, marked with the worker when several processes share the run."""
    print(f"[ablations{WORKER_TAG}] {message}", flush=True)


WORKER_TAG = ""


def main() -> None:
    global WORKER_TAG

    parser = bench_parser(__doc__, seed=False)
    parser.add_argument("--quick", action="store_true", help="the small setting")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the smallest setting, with its own tiny SFT start: every stage runs, nothing is measured "
        "(the test suite's)",
    )
    parser.add_argument("--seeds", type=int, default=None, help="default: 2 (--quick) or 5")
    parser.add_argument(
        "--variants", default=",".join(DEFAULT_VARIANTS), help=f"comma-separated subset of {', '.join(VARIANTS)}"
    )
    parser.add_argument("--setting", default="multihop", help="a name of memrl.data.tasks.sam.SAM_SETTINGS")
    parser.add_argument("--split", choices=["dev", "test"], default="test")
    parser.add_argument(
        "--select",
        action="store_true",
        help="choose lr / kl_coef for 'oat' on the dev split (SELECT_GRID) and write "
        "<work>/<setting>/<quick|full>/selected_on_dev.json, which later test-split runs read",
    )
    parser.add_argument("--work", default="runs/ablations", help="output directory (the SFT checkpoint is reused)")
    parser.add_argument("--model-cache", default=".cache/models")
    parser.add_argument("--prepare-only", action="store_true", help="build the shared SFT checkpoint and stop")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="processes sharing the (variant, seed) runs (2 on this 2-core machine); every run "
        "computes with one torch thread, so its figures do not depend on --jobs or on which "
        "process computed it",
    )
    parser.add_argument(
        "--recompute",
        metavar="JSON",
        default=None,
        help="print the paired table recomputed from a committed ablations JSON's per-task, per-seed "
        "records (nothing is run)",
    )
    parser.add_argument(
        "--native-cpu",
        action="store_true",
        help="compute with this machine's own kernels and thread count instead of the pinned profile "
        "(one thread, AVX2 kernels: CPU_PROFILE); faster on a large machine, but the figures then "
        "depend on the machine",
    )
    parser.add_argument(
        "--selection-scale",
        choices=["quick", "full"],
        default=None,
        help="apply the dev choice that --select made at this scale (default: the run's own); the JSON names it",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    pin_threads(args.threads)
    if args.recompute:
        record = json.loads(Path(args.recompute).read_text())
        if "records" not in record:
            raise SystemExit(
                f"[ablations] {args.recompute} has no per-task records (written by versions before "
                "two-level intervals): nothing to recompute from"
            )
        print(json.dumps(paired_from_records(record["records"]), indent=1), flush=True)
        return
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    pin_cpu_numerics(args.native_cpu)  # re-executes this process under CPU_PROFILE (before torch loads)
    if args.worker:
        WORKER_TAG = f" w{args.worker_index}"
        die_with_parent()
    if args.select:
        args.split = "dev"  # settings are chosen on dev tasks only, never on the test split
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    if "oat" not in variants:
        parser.error("the budget is what 'oat' seed 0 spends: keep 'oat' in --variants")
    if args.select and args.selection_scale:
        parser.error("--selection-scale applies an earlier dev choice to a test run; --select makes its own")

    t_start = time.perf_counter()
    bench = AblationBench(args)
    prep = bench.prepare()  # before any worker starts: they reuse the checkpoint
    say(f"shared SFT checkpoint {bench.sft_dir} ({prep})")
    if args.prepare_only:
        return
    from memrl.rollout.engines.base import set_torch_threads

    # one thread per process whatever --jobs says, so a run's figures are the same with --jobs 1 and 2 (and on any
    # machine); OpenMP threads spinning on a shared core also cost 4-12x
    set_torch_threads(RUN_THREADS)
    workers = start_workers(args.jobs) if args.jobs > 1 and not args.worker else []
    try:
        run_benchmark(args, bench, t_start, workers)
    finally:
        stop_workers(workers)


def run_benchmark(
    args: argparse.Namespace, bench: AblationBench, t_start: float, workers: list[subprocess.Popen]
) -> None:
    """The selection or the ablation proper, on the prepared checkpoint (a ``--worker`` only computes runs)."""
    variants = [v for v in args.variants.split(",") if v]
    seeds = args.seeds or bench.scale.seeds
    chosen_file = selection_file(bench.work, args.selection_scale or bench.scale.name)
    non_default = dict(NON_DEFAULT_SETTINGS)
    claims = Claims(bench.runs / "claims")
    if args.select:
        progress = Progress(
            bench.runs / "select_progress.jsonl", run_key(args, bench.scale, ANALYSIS_SETTINGS, bench.start)
        )
        selection = select(bench, progress, claims)
        if selection is None:  # a worker
            return
        wait_for(workers, "ablations")
        record = {
            "benchmark": "ablations-select",
            "setting": args.setting,
            "quick": args.quick,
            "scale": bench.scale.name,
            "jobs": args.jobs,
            **bench.start,
            "cpu": cpu_profile(),
            **selection,
            "phases": bench.clock.summary(),
            "wall_seconds": round(time.perf_counter() - t_start, 1),
            "cpu_seconds": round(PhaseClock._cpu(), 1),
        }
        chosen_file.write_text(json.dumps(record, indent=1) + "\n")
        emit(record, args.json_out)
        return
    if chosen_file.exists() and args.split == "test":
        selection = json.loads(chosen_file.read_text())
        if selection.get("sft_weights", bench.start["sft_weights"]) != bench.start["sft_weights"]:
            raise SystemExit(
                f"[ablations] {chosen_file} was chosen from the SFT weights {selection['sft_weights']}, "
                f"but {bench.sft_dir} holds {bench.start['sft_weights']}: run --select again"
            )
        bench.rl, non_default = settings_chosen_on_dev(selection, str(chosen_file.relative_to(bench.work)))
        say(f"RL settings chosen on dev: {bench.rl}")
    else:
        non_default[", ".join(RL_KEYS.values())] = (
            f"from issue 26's analysis, NOT chosen on dev: no {chosen_file} (run --select first)"
        )
    progress = Progress(bench.runs / "progress.jsonl", run_key(args, bench.scale, bench.rl, bench.start))
    finished_before = set(progress.done)
    if finished_before and not args.worker:
        say(f"{len(finished_before)} finished (variant, seed) runs reused from {progress.path}")

    def report(variant: str, seed: int, row: dict[str, Any], seconds: float) -> None:
        say(
            f"{variant} seed {seed}: test sampled {row['success']:.3f} greedy {row['success_greedy']:.3f} tokens "
            f"{row.get('reasoner_tokens', 0)} updates {row.get('updates', '-')} ({seconds:.0f} s)"
        )

    # oat seed 0 fixes the budget every other run spends; the SFT evaluations need nothing, so a second worker
    # does them meanwhile
    run_all(
        [("oat", 0, lambda: bench.oat_family("oat", 0, None))]
        + [
            ("sft", seed, lambda seed=seed: {**bench.sft_eval(seed), "reasoner_tokens": 0, "wall_s": 0.0})
            for seed in range(seeds)
        ],
        progress,
        claims,
        bench.runs,
        report,
    )
    first = progress.get("oat", 0)
    assert first is not None
    budget = first["reasoner_tokens"]
    # sft_more: as many optimizer steps as oat seed 0, each on as many rows as one of its optimizer steps
    steps = max(first["updates"], 1)
    rows_per_step = max(round(first["rows_per_update"] / bench.rl.steps_per_epoch), 1)
    if not args.worker:
        say(f"budget: {budget} reasoner tokens, {steps} optimizer steps (oat seed 0)")

    def compute(variant: str, seed: int) -> Any:
        if variant == "trl_grpo":
            return lambda: bench.trl_grpo(seed, budget)
        if variant == "sft_more":
            return lambda: bench.sft_more(seed, budget, steps, rows_per_step)
        return lambda: bench.oat_family(variant, seed, budget)

    # seed by seed, so an interrupted run's finished seeds already make a table (``--seeds K`` prints it from
    # progress.jsonl); the lr0 control, which only confirms that nothing moves, after all the others
    order = [(v, seed) for seed in range(seeds) for v in variants if v != "lr0"]
    order += [("lr0", seed) for seed in range(seeds) if "lr0" in variants]
    run_all(
        [(v, seed, compute(v, seed)) for v, seed in order if (v, seed) != ("oat", 0)],
        progress,
        claims,
        bench.runs,
        report,
    )
    if args.worker:
        return
    wait_for(workers, "ablations")
    reused = [key for key in finished_before if key[0] in ("sft", *variants) and key[1] < seeds]
    sft_runs = [{**progress.get("sft", seed), "seed": seed} for seed in range(seeds)]  # type: ignore[dict-item]
    runs = {
        v: [{**progress.get(v, seed), "seed": seed} for seed in range(seeds)]  # type: ignore[dict-item]
        for v in variants
    }
    png = bench.runs / "ablations_curves.png"
    sft_sampled = statistics.fmean(r["success"] for r in sft_runs)
    plot_curves(runs, sft_sampled, png, args.setting)
    everything = {"sft": sft_runs, **runs}
    records = task_records(everything)
    paired = paired_from_records(records)  # from the committed records alone: anyone can recompute it
    phases = bench.clock.summary()
    record = {
        "benchmark": "ablations",
        "setting": args.setting,
        "split": args.split,
        "quick": args.quick,
        "scale": bench.scale.name,
        "jobs": args.jobs,  # phases count this process's time; wall and cpu seconds include the workers'
        "seeds": seeds,
        "test_tasks": bench.scale.test_tasks,
        "eval_samples_per_task": bench.scale.eval_samples,
        **bench.start,
        "cpu": cpu_profile(),
        "budget_reasoner_tokens": budget,
        "oat_optimizer_steps": steps,
        "rl_settings": asdict(bench.rl),
        "non_default_settings": non_default,
        "paired": paired,
        "png": str(png),
        "wall_seconds": round(time.perf_counter() - t_start, 1),
        "cpu_seconds": round(PhaseClock._cpu(), 1),
        "reused_runs": [f"{v}-s{seed}" for v, seed in reused],  # finished before this invocation (a resume)
        "phases": phases,
        "full_estimate": full_estimate(runs, phases, bench.scale) if args.quick else {},
        "variants": summarize(everything),
        "records": records,
    }
    (bench.runs / "ablations.json").write_text(json.dumps(record, indent=1) + "\n")
    emit(record, args.json_out)


if __name__ == "__main__":
    main()
