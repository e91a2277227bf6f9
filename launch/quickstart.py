"""``memrl quickstart``: the whole pipeline on the embedded default (tiny model, CPU, no network, nothing to download).

Stages, each in its own folder of the run directory:

1. ``model``: build the tiny random-initialised Qwen3 memory model and its offline tokenizer (cached).
2. ``distill``: run the SAM oracle expert inside SAM over synthetic tasks; keep the correct trajectories; write one
   chat-format SFT dataset per memory role (cue writing, recall). The expert is *privileged*: it sees the true state
   and leaves a fact out when it knows a later page restates it. That never hurts the expert, so those traces pass
   rejection sampling, but a student that imitates it cannot see the later page (an imitation gap).
3. ``sft``: TRL SFTTrainer on both roles.
4. ``rl``: OAT-GRPO with vLLM rollouts: memory-call trees branching at every recall, the oracle as committee with
   the offline judge, group updates, weight sync; held-out success before (the SFT model) and after.
5. ``export``: a Hugging Face checkpoint with a model card that records the held-out results
   (``heldout_results.json``), verified in transformers and vLLM.
6. ``report.md`` + PNG plots + ``summary.json``.

Held-out success is reported two ways: with the memory model decoded as it is trained (cues greedy, recall sampled at
temperature 1) and fully greedy.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from memrl.data.config import ConfigModel, RunConfig
from memrl.data.experts.sam import SamOracleConfig
from memrl.data.run_dir import prepare_run_dir
from memrl.data.tasks import TaskSetConfig
from memrl.data.tasks.sam import SamTaskParams
from memrl.rewards.credit import CreditConfig
from memrl.rollout.memory.base import RoleSampling
from memrl.rollout.memory.sam import SamConfig
from memrl.rollout.models import TinyModelSpec
from memrl.rollout.tree import TreeConfig
from memrl.train.group_trainer import GroupTrainerConfig
from memrl.train.online import LoopConfig
from memrl.train.policy import LoraSettings

__all__ = ["QuickstartConfig", "heldout_results", "run_quickstart"]


def _task_params(horizon: int) -> SamTaskParams:
    return SamTaskParams(horizon_steps=horizon, facts_per_obs=1, containers_per_room=2, repeat_evidence_frac=0.5)


class QuickstartSFT(ConfigModel):
    """The SFT stage of the quickstart."""

    max_steps: int = Field(300, ge=1, le=10**6)  # optimizer steps of the SFT stage
    batch_size: int = Field(32, ge=1, le=2**16)  # examples per SFT step (rows mixed = max_steps x batch_size)
    lr: float = Field(2e-3, gt=0, le=1)  # SFT learning rate
    role_weights: dict[str, float] = {"consolidate": 0.4, "recall": 0.6}  # share of the SFT mixture per memory role


class QuickstartConfig(ConfigModel):
    """The embedded default of ``memrl quickstart`` (every value measured to fit minutes on 2 CPU cores)."""

    command: Literal["quickstart"] = "quickstart"  # the command this config is for
    run: RunConfig = RunConfig(output_dir="runs")
    model: TinyModelSpec = TinyModelSpec()
    model_cache: str = ".cache/models"  # directory the tiny model is built into and reused from
    horizon: int = Field(12, ge=1, le=10**5)  # tour steps before the question, for distillation and RL
    eval_horizons: list[int] = [12, 24]  # horizons (tour steps) of the held-out eval task sets
    distill_tasks: int = Field(600, ge=1, le=10**6)  # SAM tasks the oracle is run on to make SFT data
    eval_tasks_per_horizon: int = Field(60, ge=1, le=10**5)  # held-out tasks per eval horizon
    expert: SamOracleConfig = SamOracleConfig(defer_to_later=0.9)
    memory: SamConfig = SamConfig(
        page_turns=1, live_capacity_turns=4, keep_recent_turns=3,
        sampling={"consolidate": RoleSampling(temperature=0.0, max_tokens=64),
                  "recall": RoleSampling(temperature=1.0, max_tokens=64)},
    )
    reasoner_max_pages: int = Field(2, ge=1, le=1000)  # page ids the scripted reasoner asks for per recall
    sft: QuickstartSFT = QuickstartSFT()
    rl_tasks: int = Field(512, ge=1, le=10**6)  # SAM tasks in the RL training set
    tasks_per_iteration: int = Field(16, ge=1, le=10**5)  # tasks rolled out per RL iteration
    tree: TreeConfig = TreeConfig(branch_factor=4, max_branch_depth=2, max_leaves=16)
    credit: CreditConfig = CreditConfig(committee_weight=0.5)
    trainer: GroupTrainerConfig = GroupTrainerConfig(lr=2e-4, lora=LoraSettings(enabled=False))
    loop: LoopConfig = LoopConfig(iterations=24, checkpoint_every=12)
    eval_samples: int = Field(2, ge=0, le=1000)  # sampled eval runs per task (plus one greedy)
    evaluate_untrained: bool = True  # also evaluate the untrained model (greedy) as a baseline
    export: bool = True  # export the RL model as a HF checkpoint + model card at the end


def _peak_rss_gib() -> float:
    """Peak resident memory of this process and its children (vLLM runs in-process on CPU)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return round(max(own, children) / (1 << 20), 3)


class _Stages:
    """Times every stage and prints a banner per stage."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.start = time.perf_counter()

    def run(self, name: str, title: str, fn: Any) -> Any:
        print(f"\n[quickstart] === {name}: {title}", flush=True)
        t0 = time.perf_counter()
        out = fn()
        self.times[name] = round(time.perf_counter() - t0, 1)
        print(f"[quickstart] {name} done in {self.times[name]:.0f} s", flush=True)
        return out


def run_quickstart(cfg: QuickstartConfig) -> int:
    """Run every stage (see the module docstring) and write the report; returns 0."""
    from memrl.data.tasks import load_tasks
    from memrl.data.tracking import MetricsLogger
    from memrl.launch.report import write_report
    from memrl.rollout.engines.config import EngineConfig
    from memrl.rollout.engines.factory import build_engine
    from memrl.rollout.evaluation.tasks import evaluate_sam_memory
    from memrl.rollout.expert_traces import DistillRunConfig, distill
    from memrl.rollout.models import ensure_tiny_model
    from memrl.train.export import ExportConfig, export_model
    from memrl.train.oat_grpo import OATGRPOConfig, default_reasoner, summarize_eval, train_oat_grpo
    from memrl.train.policy import PolicySpec
    from memrl.train.sft import SFTDataConfig, SFTRunConfig, SFTTrainConfig, run_sft

    run_dir = prepare_run_dir(cfg, cfg.run, "quickstart")
    stages = _Stages()
    print(f"[quickstart] run directory: {run_dir}", flush=True)

    base = stages.run("model", "tiny Qwen3 memory model + offline tokenizer",
                      lambda: ensure_tiny_model(cfg.model_cache, cfg.model))
    train_set = TaskSetConfig(count=cfg.distill_tasks, seed=0, sam=_task_params(cfg.horizon))
    distill_cfg = DistillRunConfig(
        run=RunConfig(output_dir=str(run_dir), name="distill", seed=cfg.run.seed), tasks=train_set,
        sam_oracle=cfg.expert, sam_memory=cfg.memory, reasoner_max_pages=cfg.reasoner_max_pages, tokenizer=str(base),
    )
    distill_stats = stages.run("distill", "the privileged oracle inside SAM -> SFT datasets per role",
                               lambda: distill(distill_cfg, run_dir / "distill"))

    sft_cfg = SFTRunConfig(
        run=RunConfig(output_dir=str(run_dir), name="sft", seed=cfg.run.seed),
        model=PolicySpec(base=str(base)), lora=LoraSettings(enabled=False),
        data=SFTDataConfig(dir=str(run_dir / "distill"), roles=dict(cfg.sft.role_weights),
                           mixture_rows=cfg.sft.max_steps * cfg.sft.batch_size),
        train=SFTTrainConfig(max_steps=cfg.sft.max_steps, batch_size=cfg.sft.batch_size, lr=cfg.sft.lr,
                             warmup=0.05, max_length=512, save_steps=0, logging_steps=25),
    )
    stages.run("sft", "TRL SFTTrainer on cue writing + recall", lambda: run_sft(sft_cfg))
    sft_dir = run_dir / "sft" / "final"

    eval_tasks = [t for h in cfg.eval_horizons for t in load_tasks(
        TaskSetConfig(count=cfg.eval_tasks_per_horizon, seed=200_000 + 1000 * h, sam=_task_params(h)), f"eval{h}")]
    reasoner_cfg = default_reasoner(str(base), cfg.run.seed).model_copy(
        update={"scripted_kwargs": {"max_pages": cfg.reasoner_max_pages, "recall_budget": 2}})

    def evaluate_with(model_dir: Path | None, samples: int) -> dict[str, Any]:
        reasoner = build_engine(reasoner_cfg)
        engine = build_engine(EngineConfig(backend="vllm", name="memory", model=str(model_dir), dtype="float32")) \
            if model_dir is not None else None
        try:
            return summarize_eval(evaluate_sam_memory(eval_tasks, engine, cfg.memory, samples=samples,
                                                      reasoner=reasoner, seed=cfg.run.seed))
        finally:
            if engine is not None:
                engine.close()

    baselines: dict[str, dict[str, Any]] = {}
    baselines["oracle expert (upper bound)"] = stages.run("eval-oracle", "the oracle expert as memory model",
                                                          lambda: evaluate_with(None, cfg.eval_samples))
    if cfg.evaluate_untrained:
        # Greedy only: the untrained model writes max-length noise on every call, and one run per task shows it.
        baselines["untrained tiny model"] = stages.run("eval-untrained", "the untrained model as memory model (greedy)",
                                                       lambda: evaluate_with(Path(base), 0))

    oat_cfg = OATGRPOConfig(
        run=RunConfig(output_dir=str(run_dir), name="rl", seed=cfg.run.seed, wandb=cfg.run.wandb),
        policy=PolicySpec(base=str(sft_dir)), reasoner=reasoner_cfg, memory=cfg.memory,
        train_tasks=TaskSetConfig(count=cfg.rl_tasks, seed=100_000, sam=_task_params(cfg.horizon)),
        eval_tasks=TaskSetConfig(count=0), tasks_per_iteration=cfg.tasks_per_iteration, tree=cfg.tree,
        credit=cfg.credit, trainer=cfg.trainer, loop=cfg.loop, eval_samples=cfg.eval_samples,
    )
    logger = MetricsLogger(run_dir, cfg.run.wandb, cfg.model_dump(mode="json"), name=run_dir.name, console=True)
    rl = stages.run("rl", "OAT-GRPO with vLLM rollouts (held-out eval before and after)",
                    lambda: train_oat_grpo(oat_cfg, prepare_run_dir(oat_cfg, oat_cfg.run, "rl"), logger=logger,
                                           eval_tasks=eval_tasks))
    logger.close()
    evals = rl["evals"]
    before, after = evals[0], evals[-1]

    # The held-out figures go into the exported model card, so they are written before the export.
    results = heldout_results(cfg, before, after, baselines)
    results_path = run_dir / "heldout_results.json"
    results_path.write_text(json.dumps(results, indent=2) + "\n")
    export_checks: dict[str, Any] | None = None
    if cfg.export:
        export_cfg = ExportConfig(
            run=RunConfig(output_dir=str(run_dir), name="export"), policy=PolicySpec(base=rl["policy_dir"]),
            reference_base=str(base), recipe=str(run_dir / "config.yaml"), results=str(results_path),
            model_name="memrl-quickstart-sam-tiny",
        )
        export_checks = stages.run("export", "Hugging Face checkpoint + model card, verified in transformers and vLLM",
                                   lambda: export_model(export_cfg, run_dir / "export" / "model"))

    summary = {
        **{k: results[k] for k in ("success_sft", "success_rl", "success_sft_greedy", "success_rl_greedy",
                                   "baselines")},
        "eval_before": before,
        "eval_after": after,
        "distill": {"traces": distill_stats["traces"], "rows": distill_stats["rows"]},
        "rl_iterations": rl["iterations_run"],
        "rl_updates": rl["updates"],
        "reasoner_tokens_rl": sum(h.get("reasoner_tokens", 0) for h in rl["history"]),
        "export": export_checks,
        "stage_s": stages.times,
        "wall_s": round(time.perf_counter() - stages.start, 1),
        "peak_rss_gib": _peak_rss_gib(),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_report(run_dir, cfg, summary, rl["history"])
    _print_table(summary)
    print(f"\n[quickstart] report: {run_dir / 'report.md'}", flush=True)
    return 0


def heldout_results(cfg: QuickstartConfig, before: dict[str, Any], after: dict[str, Any],
                    baselines: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Held-out success inside SAM of the SFT model and the SFT + OAT-GRPO model (sampled as trained, and greedy),
    overall and per horizon, beside the baselines: what the exported model card records."""
    horizons = [k.split("/", 1)[1] for k in before if k.startswith("success/")]
    return {
        "eval": (f"held-out SAM tasks: horizons {cfg.eval_horizons} x {cfg.eval_tasks_per_horizon} tasks; sampled = "
                 f"recall at temperature 1, mean of {cfg.eval_samples} run(s) per task; greedy = every call greedy"),
        "success_sft": before["success"],
        "success_rl": after["success"],
        "success_sft_greedy": before["success_greedy"],
        "success_rl_greedy": after["success_greedy"],
        "per_horizon": {h: {"sft": before.get(f"success/{h}"), "rl": after.get(f"success/{h}"),
                            "sft_greedy": before.get(f"success_greedy/{h}"),
                            "rl_greedy": after.get(f"success_greedy/{h}")} for h in horizons},
        "baselines": {name: {"success": v["success"], "success_greedy": v["success_greedy"]}
                      for name, v in baselines.items()},
    }


def _print_table(summary: dict[str, Any]) -> None:
    rows = [(name, v["success"], v["success_greedy"]) for name, v in summary["baselines"].items()]
    rows += [("SFT", summary["success_sft"], summary["success_sft_greedy"]),
             ("SFT + OAT-GRPO", summary["success_rl"], summary["success_rl_greedy"])]
    print("\n[quickstart] held-out success inside SAM (recall sampled at T=1 | greedy)")
    def pct(x: float | None) -> str:
        return "   n/a" if x is None else f"{x:>6.1%}"

    for name, sampled, greedy in rows:
        print(f"  {name:<28} {pct(sampled)}   {pct(greedy)}")
    print(f"  wall {summary['wall_s']:.0f} s, peak RSS {summary['peak_rss_gib']:.2f} GiB")
