"""What OAT-GRPO's tree credit and oracle reward add: an ablation suite on a task setting where credit assignment
matters ("SAM: State-Adaptive Memory for Long-Horizon Reasoning Agent" (arXiv 2605.24468), section 2.3; issue 18).

One shared SFT checkpoint (the tiny Qwen3 memory model distilled from a limited, noisy SAM expert on the setting's
SFT tasks), then, per seed and at equal reasoner-token budgets (training rollouts only; held-out evaluation is not
counted):

- ``oat``: OAT-GRPO, memory-call trees branching at every recall, r = V(n) + lambda (c(n) - c_bar), lambda 0.5;
- ``tree_lambda0``: the same trees without the committee term (lambda 0);
- ``flat``: memrl's flat GRPO (G independent trajectories per task, the trajectory outcome on every memory action);
- ``trl_grpo``: TRL ``GRPOTrainer`` as the external peer, in its own loop: its prompts are the recall contexts of the
  SFT model's own trajectories on the training tasks, its reward the trajectory outcome after the episode continues
  from that recall (later memory calls by the current policy, synced into the continuation engine every step);
- ``sft_more``: no RL; the budget buys more expert trajectories (the same noisy expert, rejection-sampled) and SFT
  continues on them from the shared checkpoint;
- ``shuffled_reward``: OAT-GRPO with the leaf outcomes permuted across the batch (a control: no task signal).

The budget B is what ``oat`` seed 0 spends in ``--iterations`` iterations; every other run stops rolling out once it
has spent B (its later iterations make no update). Held-out success on the setting's test split (sampled as trained,
and greedy) per variant and seed, mean and 95% confidence interval over seeds (Student t), the pooled binomial
interval over all test runs, reasoner tokens, wall time, and the learning curve (test success against reasoner
tokens) as a PNG. OAT-GRPO's success at the budget where flat GRPO ends is read off its curve (linear
interpolation). ``--split dev`` runs everything on the dev split (for tuning; report test).

    python benchmarks/ablations.py --quick            # ~15 min on 2 CPU cores
    python benchmarks/ablations.py                    # the full setting (README: measured time)

One JSON line last, with a ``variants`` key named by variant.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VARIANTS = ("oat", "tree_lambda0", "flat", "trl_grpo", "sft_more", "shuffled_reward")


SFT_STEPS = 300  # the shared SFT checkpoint: the same for --quick and the full setting, so both can reuse it


@dataclass(frozen=True)
class Scale:
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


QUICK = Scale(test_tasks=24, train_tasks=128, tasks_per_iteration=4, iterations=4, max_iterations=8,
              eval_every=2, branch_factor=2, max_leaves=8, flat_group_size=4, trl_prompts_per_step=4)
FULL = Scale(test_tasks=60, train_tasks=512, tasks_per_iteration=8, iterations=8, max_iterations=16,
             eval_every=4, branch_factor=2, max_leaves=8, flat_group_size=4, trl_prompts_per_step=8)


def ci95(values: list[float]) -> list[float]:
    """Student-t 95% interval of the mean of ``values`` (a point when there is one value)."""
    from memrl.rollout.evaluation.stats import t_interval

    mean = statistics.fmean(values)
    return t_interval(values) or [mean, mean]


def pooled_ci95(values: list[float], runs_per_value: int) -> list[float]:
    """Normal-approximation 95% interval of a success rate pooled over every test run of every seed."""
    n = len(values) * runs_per_value
    p = statistics.fmean(values)
    half = 1.96 * math.sqrt(max(p * (1 - p), 1e-12) / n)
    return [max(0.0, p - half), min(1.0, p + half)]


def interpolate(curve: list[tuple[float, float]], x: float) -> float | None:
    """y at ``x`` on a piecewise-linear curve of (x, y) points sorted by x; past its last point the last y (a run
    that stopped at its budget keeps its final policy); None before its first point."""
    if not curve or x < curve[0][0]:
        return None
    for (x0, y0), (x1, y1) in itertools.pairwise(curve):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return curve[-1][1]


# ----------------------------------------------------------------------------------------------------------------
class Bench:
    """Shared state of one benchmark run: the setting, the SFT checkpoint, the test tasks, the engines' configs."""

    def __init__(self, args: argparse.Namespace) -> None:
        from memrl.data.tasks import TaskSetConfig, load_tasks
        from memrl.data.tasks.sam import SAM_SETTINGS
        from memrl.rollout.memory.base import RoleSampling
        from memrl.rollout.memory.sam import SamConfig

        self.args = args
        self.scale = QUICK if args.quick else FULL
        self.setting = SAM_SETTINGS[args.setting]
        self.work = Path(args.work)  # the shared SFT checkpoint lives here; the runs under quick/ or full/
        self.runs = self.work / ("quick" if args.quick else "full") / args.split
        self.runs.mkdir(parents=True, exist_ok=True)
        self.memory = SamConfig(
            page_turns=1, live_capacity_turns=4, keep_recent_turns=3,
            sampling={"consolidate": RoleSampling(temperature=0.0, max_tokens=48),
                      "recall": RoleSampling(temperature=1.0, max_tokens=64)},
        )
        seed = self.setting.test_seed if args.split == "test" else self.setting.dev_seed
        self.test_tasks = load_tasks(TaskSetConfig(count=self.scale.test_tasks, seed=seed, sam=self.setting.test),
                                     args.split)
        self.train_set = TaskSetConfig(count=self.scale.train_tasks, seed=self.setting.train_seed,
                                       sam=self.setting.train)
        self.base: Path | None = None
        self.sft_dir: Path | None = None
        self.sft_evals: dict[int, dict[str, Any]] = {}

    # ------------------------------------------------------------------------------------------------ shared SFT
    def prepare(self) -> dict[str, Any]:
        """Tiny model, distillation of the setting's expert, SFT: the shared checkpoint (reused when present)."""
        from memrl.data.config import RunConfig
        from memrl.data.experts.sam import SamOracleConfig
        from memrl.data.tasks import TaskSetConfig
        from memrl.rollout.expert_traces import DistillRunConfig, distill
        from memrl.rollout.models import TinyModelSpec, ensure_tiny_model

        t0 = time.perf_counter()
        self.base = ensure_tiny_model(self.args.model_cache, TinyModelSpec())
        self.sft_dir = self.work / "sft" / "final"
        stats: dict[str, Any] = {}
        if not (self.sft_dir / "config.json").exists():
            tasks = TaskSetConfig(count=self.setting.distill_tasks, seed=0, sam=self.setting.sft)
            distill_cfg = DistillRunConfig(
                run=RunConfig(output_dir=str(self.work), name="distill", seed=0), tasks=tasks,
                sam_oracle=SamOracleConfig(**self.setting.expert), sam_memory=self.memory, reasoner_max_pages=2,
                tokenizer=str(self.base),
            )
            stats = distill(distill_cfg, self.work / "distill")
            self._sft(self.work / "distill", self.base, self.work, "sft", SFT_STEPS, seed=0)
        return {"distill_traces": stats.get("traces"), "distill_rows": stats.get("rows"),
                "seconds": round(time.perf_counter() - t0, 1)}

    def _sft(self, data_dir: Path, base: Path, out: Path, name: str, steps: int, seed: int, lr: float = 2e-3) -> Path:
        from memrl.data.config import RunConfig
        from memrl.train.policy import LoraSettings, PolicySpec
        from memrl.train.sft import SFTDataConfig, SFTRunConfig, SFTTrainConfig, run_sft

        cfg = SFTRunConfig(
            run=RunConfig(output_dir=str(out), name=name, seed=seed), model=PolicySpec(base=str(base)),
            lora=LoraSettings(enabled=False),
            data=SFTDataConfig(dir=str(data_dir), roles={"consolidate": 0.4, "recall": 0.6}, mixture_rows=steps * 32),
            train=SFTTrainConfig(max_steps=steps, batch_size=32, lr=lr, warmup=0.05, max_length=512, save_steps=0,
                                 logging_steps=50),
        )
        run_sft(cfg)
        return out / name / "final"

    def reasoner_config(self, seed: int) -> Any:
        from memrl.train.oat_grpo import default_reasoner

        return default_reasoner(str(self.base), seed).model_copy(
            update={"scripted_kwargs": {"max_pages": 2, "recall_budget": 2}})

    def evaluate(self, model_dir: Path, seed: int) -> dict[str, Any]:
        """Held-out success of a saved memory model (sampled once per task as trained, plus greedy)."""
        from memrl.rollout.engines.config import EngineConfig
        from memrl.rollout.engines.factory import build_engine
        from memrl.rollout.evaluation.tasks import evaluate_sam_memory
        from memrl.train.oat_grpo import summarize_eval

        engine = build_engine(EngineConfig(backend="hf", name="memory", model=str(model_dir), dtype="float32",
                                           batch_size=64))
        try:
            return summarize_eval(evaluate_sam_memory(self.test_tasks, engine, self.memory, samples=1,
                                                      reasoner=build_engine(self.reasoner_config(seed)), seed=seed,
                                                      progress=None))
        finally:
            engine.close()

    def sft_eval(self, seed: int) -> dict[str, Any]:
        """The shared SFT checkpoint's held-out figures under ``seed`` (every run of that seed starts from them)."""
        if seed not in self.sft_evals:
            self.sft_evals[seed] = self.evaluate(self.sft_dir, seed)  # type: ignore[arg-type]
        return self.sft_evals[seed]

    # ------------------------------------------------------------------------------------------------ memrl RL
    def oat_family(self, variant: str, seed: int, budget: int | None) -> dict[str, Any]:
        """``oat``, ``tree_lambda0``, ``flat`` and ``shuffled_reward`` through ``memrl train oat-grpo``."""
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
        tree = TreeConfig(mode="flat" if variant == "flat" else "tree", branch_roles=["recall"],
                          branch_factor=s.branch_factor, max_leaves=s.max_leaves, flat_group_size=s.flat_group_size)
        credit = CreditConfig(committee_weight=0.0 if variant in ("tree_lambda0", "flat") else 0.5,
                              shuffle_outcomes=variant == "shuffled_reward")
        iterations = s.iterations if budget is None else s.max_iterations
        cfg = OATGRPOConfig(
            run=RunConfig(output_dir=str(self.runs), name=f"{variant}-s{seed}", seed=seed),
            policy=PolicySpec(base=str(self.sft_dir)),
            engine=EngineConfig(backend="hf", name="policy", model=str(self.sft_dir), dtype="float32", batch_size=64),
            reasoner=self.reasoner_config(seed), memory=self.memory, train_tasks=self.train_set,
            tasks_per_iteration=s.tasks_per_iteration, tree=tree, credit=credit,
            trainer=GroupTrainerConfig(lr=2e-4, lora=LoraSettings(enabled=False)),
            loop=LoopConfig(iterations=iterations, eval_every=s.eval_every, checkpoint_every=iterations,
                            keep_checkpoints=1),
            eval_samples=1, reasoner_token_budget=budget,
        )
        run_dir = prepare_run_dir(cfg, cfg.run, "train-oat-grpo")
        logger = MetricsLogger(run_dir, None, cfg.model_dump(mode="json"), name=run_dir.name, console=False)
        t0 = time.perf_counter()
        result = train_oat_grpo(cfg, run_dir, logger=logger, eval_tasks=self.test_tasks,
                                initial_eval=self.sft_eval(seed))
        logger.close()
        spent, by_iteration = 0, {}
        for h in result["history"]:
            spent += int(h.get("reasoner_tokens", 0))
            by_iteration[h["iteration"]] = spent
        curve = [(0.0 if e["iteration"] < 0 else float(by_iteration[e["iteration"]]), e["success"],
                  e["success_greedy"]) for e in result["evals"]]
        last = result["evals"][-1]
        return {"success": last["success"], "success_greedy": last["success_greedy"], "reasoner_tokens": spent,
                "updates": result["updates"], "wall_s": round(time.perf_counter() - t0, 1), "curve": curve,
                "sft": result["evals"][0]}

    # ------------------------------------------------------------------------------------------------ SFT only
    def sft_more(self, seed: int, budget: int) -> dict[str, Any]:
        """Spend the budget on more expert trajectories and continue SFT on them from the shared checkpoint."""
        from memrl.data.config import RunConfig
        from memrl.data.experts.sam import SamOracleConfig
        from memrl.data.tasks import TaskSetConfig, load_tasks
        from memrl.rollout.engines.factory import build_engine
        from memrl.rollout.evaluation.tasks import evaluate_sam_memory
        from memrl.rollout.expert_traces import DistillRunConfig, distill
        from memrl.rollout.models import load_tokenizer

        t0 = time.perf_counter()
        probe = load_tasks(TaskSetConfig(count=16, seed=self.setting.train_seed, sam=self.setting.sft), "probe")
        expert = evaluate_sam_memory(probe, None, self.memory, samples=0, tokenizer=load_tokenizer(str(self.base)),
                                     reasoner=build_engine(self.reasoner_config(seed)), seed=seed, progress=None)
        per_task = max(float(expert["reasoner_tokens_per_task"]), 1.0)
        extra = max(1, math.ceil(budget / per_task))
        out = self.runs / f"sft_more-s{seed}"
        tasks = TaskSetConfig(count=extra, seed=500_000 + 10_000 * seed, sam=self.setting.sft)
        distill(DistillRunConfig(
            run=RunConfig(output_dir=str(out), name="distill", seed=seed), tasks=tasks,
            sam_oracle=SamOracleConfig(**self.setting.expert), sam_memory=self.memory, reasoner_max_pages=2,
            tokenizer=str(self.base),
        ), out / "distill")
        steps = max(10, round(SFT_STEPS * extra / self.setting.distill_tasks))
        # continued at the RL variants' learning rate: a fresh 2e-3 warm restart undoes the shared checkpoint
        model = self._sft(out / "distill", self.sft_dir, out, "sft", steps, seed=seed, lr=2e-4)  # type: ignore[arg-type]
        result = self.evaluate(model, seed)
        return {"success": result["success"], "success_greedy": result["success_greedy"],
                "reasoner_tokens": round(extra * per_task), "extra_expert_tasks": extra, "sft_steps": steps,
                "wall_s": round(time.perf_counter() - t0, 1)}

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
        memory_engine = build_engine(EngineConfig(backend="hf", name="continuation", model=str(self.sft_dir),
                                                  dtype="float32", batch_size=64))
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
                rows.append({"prompt": [{"role": m.role, "content": m.content} for m in call.request.messages],
                             "state": len(states)})
                states.append(snapshot)

        collect = [sam_rollout(t, self.memory, seed=seed, rollout_id="c")
                   for t in tasks[: 2 * self.scale.tasks_per_iteration]]
        run_rollouts(collect, engines, on_result=on_result)
        spent[0] += sum(r.reasoner_usage.spent for r in collect)
        if not rows:
            raise RuntimeError("trl_grpo: the SFT model's trajectories made no recall: no prompt to train on")

        # 2. reward: continue the episode from the snapshot with the completion as that recall's page read
        def reward(prompts: list[Any], completions: list[Any], state: list[int], completion_ids: list[list[int]],
                   **_: Any) -> list[float]:
            forks = []
            for i, (completion, ids, key) in enumerate(zip(completions, completion_ids, state, strict=True)):
                text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
                rollout = states[key].fork(f"g{i}")
                rollout.advance(GenerationResult(prompt_ids=[], completions=[Completion(ids, [0.0] * len(ids), text,
                                                                                         "stop")],
                                                 usage=Usage(completion_tokens=len(ids)), engine="trl"))
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
            output_dir=str(self.runs / f"trl_grpo-s{seed}"), seed=seed, learning_rate=2e-4,
            num_generations=k, per_device_train_batch_size=k * self.scale.trl_prompts_per_step,
            max_completion_length=64, temperature=1.0, top_p=1.0, beta=0.0, max_steps=10_000,
            logging_steps=5, save_strategy="no", report_to=[], use_cpu=not torch.cuda.is_available(), bf16=False,
            dataloader_num_workers=0, disable_tqdm=True,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows),
                              processing_class=tokenizer, callbacks=[SyncAndBudget()])
        trainer.train()
        out = self.runs / f"trl_grpo-s{seed}" / "final"
        trainer.save_model(str(out))
        tokenizer.save_pretrained(str(out))
        memory_engine.close()
        result = self.evaluate(out, seed)
        return {"success": result["success"], "success_greedy": result["success_greedy"],
                "reasoner_tokens": spent[0], "updates": trainer.state.global_step, "prompts": len(rows),
                "wall_s": round(time.perf_counter() - t0, 1)}


# ----------------------------------------------------------------------------------------------------------------
def summarize(runs: dict[str, list[dict[str, Any]]], runs_per_task: int) -> dict[str, Any]:
    """Per variant: mean and 95% intervals of test success (sampled, greedy), tokens and wall time."""
    out: dict[str, Any] = {}
    for variant, rows in runs.items():
        if not rows:
            continue
        sampled = [r["success"] for r in rows]
        greedy = [r["success_greedy"] for r in rows]
        out[variant] = {
            "mean": {"success": statistics.fmean(sampled), "success_greedy": statistics.fmean(greedy),
                     "reasoner_tokens": statistics.fmean(r["reasoner_tokens"] for r in rows),
                     "wall_s": statistics.fmean(r["wall_s"] for r in rows)},
            "ci95": {"success": ci95(sampled), "success_greedy": ci95(greedy)},
            "ci95_pooled": {"success": pooled_ci95(sampled, runs_per_task),
                            "success_greedy": pooled_ci95(greedy, runs_per_task)},
            "seeds": [{k: v for k, v in r.items() if k not in ("curve", "sft")} for r in rows],
        }
    return out


def plot_curves(runs: dict[str, list[dict[str, Any]]], sft: float, path: Path) -> None:
    """Test success (sampled) against training reasoner tokens, mean over seeds, one line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for variant, rows in runs.items():
        if not rows:
            continue
        if rows[0].get("curve"):
            n = min(len(r["curve"]) for r in rows)
            xs = [statistics.fmean(r["curve"][i][0] for r in rows) for i in range(n)]
            ys = [statistics.fmean(r["curve"][i][1] for r in rows) for i in range(n)]
            ax.plot(xs, ys, marker="o", label=variant)
        else:
            ax.plot([0, statistics.fmean(r["reasoner_tokens"] for r in rows)],
                    [sft, statistics.fmean(r["success"] for r in rows)], marker="s", linestyle="--", label=variant)
    ax.set_xlabel("training reasoner tokens")
    ax.set_ylabel("held-out test success (sampled)")
    ax.set_title("SAM multihop: learning curves (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the small setting (~15 min on 2 CPU cores)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of the variants")
    parser.add_argument("--setting", default="multihop", help="a name of memrl.data.tasks.sam.SAM_SETTINGS")
    parser.add_argument("--split", choices=["dev", "test"], default="test")
    parser.add_argument("--work", default="runs/ablations", help="output directory (the SFT checkpoint is reused)")
    parser.add_argument("--model-cache", default=".cache/models")
    parser.add_argument("--prepare-only", action="store_true", help="build the shared SFT checkpoint and stop")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    if "oat" not in variants:
        parser.error("the budget is what 'oat' seed 0 spends: keep 'oat' in --variants")

    t_start = time.perf_counter()
    bench = Bench(args)
    prep = bench.prepare()
    print(f"[ablations] shared SFT checkpoint {bench.sft_dir} ({prep})", flush=True)
    if args.prepare_only:
        return
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    first = bench.oat_family("oat", 0, None)
    budget = first["reasoner_tokens"]
    runs["oat"].append({"seed": 0, **first})
    progress = bench.runs / "progress.jsonl"  # partial results survive an interrupted run
    with progress.open("a") as f:
        f.write(json.dumps({"variant": "oat", "seed": 0, **{k: v for k, v in first.items() if k != "sft"}}) + "\n")
    print(f"[ablations] budget: {budget} reasoner tokens (oat seed 0, {bench.scale.iterations} iterations)",
          flush=True)
    for seed in range(args.seeds):
        for variant in variants:
            if variant == "oat" and seed == 0:
                continue
            t0 = time.perf_counter()
            if variant == "trl_grpo":
                row = bench.trl_grpo(seed, budget)
            elif variant == "sft_more":
                row = bench.sft_more(seed, budget)
            else:
                row = bench.oat_family(variant, seed, budget)
            runs[variant].append({"seed": seed, **row})
            with progress.open("a") as f:
                f.write(json.dumps({"variant": variant, "seed": seed,
                                    **{k: v for k, v in row.items() if k != "sft"}}) + "\n")
            print(f"[ablations] {variant} seed {seed}: sampled {row['success']:.3f} greedy "
                  f"{row['success_greedy']:.3f} tokens {row['reasoner_tokens']} ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
    sft_evals = [bench.sft_eval(seed) for seed in range(args.seeds)]
    sft_sampled = statistics.fmean(e["success"] for e in sft_evals)
    sft_greedy = statistics.fmean(e["success_greedy"] for e in sft_evals)
    png = bench.runs / "ablations_curves.png"
    plot_curves(runs, sft_sampled, png)
    summary = summarize(runs, bench.scale.test_tasks)
    at_flat: dict[str, Any] = {}
    if runs.get("flat"):
        flat_end = statistics.fmean(r["reasoner_tokens"] for r in runs["flat"])
        per_seed = [interpolate([(x, y) for x, y, _ in r["curve"]], flat_end) for r in runs["oat"]]
        per_seed_g = [interpolate([(x, g) for x, _, g in r["curve"]], flat_end) for r in runs["oat"]]
        at_flat = {"flat_final_reasoner_tokens": flat_end,
                   "oat_final_reasoner_tokens": [r["reasoner_tokens"] for r in runs["oat"]],
                   "oat_success": [p for p in per_seed if p is not None],
                   "oat_success_greedy": [p for p in per_seed_g if p is not None]}
        if at_flat["oat_success"]:
            at_flat["oat_success_mean"] = statistics.fmean(at_flat["oat_success"])
            at_flat["oat_success_ci95"] = ci95(at_flat["oat_success"])
        if at_flat["oat_success_greedy"]:
            at_flat["oat_success_greedy_mean"] = statistics.fmean(at_flat["oat_success_greedy"])
            at_flat["oat_success_greedy_ci95"] = ci95(at_flat["oat_success_greedy"])
    record = {
        "benchmark": "ablations",
        "setting": args.setting,
        "split": args.split,
        "quick": args.quick,
        "seeds": args.seeds,
        "test_tasks": bench.scale.test_tasks,
        "budget_reasoner_tokens": budget,
        "sft": {"success": sft_sampled, "success_greedy": sft_greedy,
                "ci95": {"success": ci95([e["success"] for e in sft_evals]),
                         "success_greedy": ci95([e["success_greedy"] for e in sft_evals])}},
        "oat_at_flat_budget": at_flat,
        "png": str(png),
        "wall_seconds": round(time.perf_counter() - t_start, 1),
        "variants": summary,
    }
    (bench.runs / "ablations.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
