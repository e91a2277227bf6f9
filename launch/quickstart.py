"""``memrl quickstart``: the whole pipeline on the embedded default (tiny model, CPU, no network, nothing to download).

Stages, each in its own folder of the run directory:

1. ``model``: build the tiny random-initialised Qwen3 memory model and its offline tokenizer (cached), or with
   ``base_model: smollm2`` convert SmolLM2-135M-Instruct from its GGUF (cached; ``configs/quickstart_smollm2.yaml``
   runs the whole pipeline on it, on the real-text ``dialogue`` tasks).
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
temperature 1) and fully greedy. With ``paired_eval`` the untrained, SFT and exported RL models are also run greedy on
the same held-out tasks, and the differences between them get paired 95% bootstrap intervals (``paired`` in
``summary.json``).
"""

from __future__ import annotations

import json
import logging
import resource
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator

from memrl.data.config import ConfigError, ConfigModel, RunConfig
from memrl.data.experts.sam import SamOracleConfig
from memrl.data.run_dir import prepare_run_dir
from memrl.data.tasks import DialogueParams, TaskSetConfig
from memrl.data.tasks.sam import SamTaskParams
from memrl.rewards.credit import CreditConfig
from memrl.rollout.memory.base import RoleSampling
from memrl.rollout.memory.sam import SamConfig
from memrl.rollout.models import TinyModelSpec
from memrl.rollout.tree import TreeConfig
from memrl.train.group_trainer import GroupTrainerConfig
from memrl.train.online import LoopConfig
from memrl.train.policy import LoraSettings, PolicySpec

__all__ = ["QuickstartConfig", "heldout_results", "run_quickstart"]

log = logging.getLogger(__name__)


_SAM_STYLE = ("sam", "dialogue")


def _task_params(horizon: int) -> SamTaskParams:
    return SamTaskParams(horizon_steps=horizon, facts_per_obs=1, containers_per_room=2, repeat_evidence_frac=0.5)


def _task_set(cfg: QuickstartConfig, count: int, seed: int, horizon: int) -> TaskSetConfig:
    """``count`` tasks of the configured family at ``horizon`` (the dialogue family tells the same SAM episodes); a
    registered family of its own (e.g. ``ms_textworld``) gets ``task_params`` and no horizon."""
    if cfg.task_family not in _SAM_STYLE:
        return TaskSetConfig(family=cfg.task_family, params=dict(cfg.task_params), count=count, seed=seed)
    params = _task_params(horizon)
    return TaskSetConfig(
        family=cfg.task_family, count=count, seed=seed, sam=params, dialogue=DialogueParams(**params.model_dump())
    )


class QuickstartSFT(ConfigModel):
    """The SFT stage of the quickstart."""

    max_steps: int = Field(300, ge=1, le=10**6)  # optimizer steps of the SFT stage
    batch_size: int = Field(32, ge=1, le=2**16)  # examples per SFT step (rows mixed = max_steps x batch_size)
    lr: float = Field(2e-3, gt=0, le=1)  # SFT learning rate
    role_weights: dict[str, float] = {"consolidate": 0.4, "recall": 0.6}  # share of the SFT mixture per memory role
    max_length: int = Field(512, ge=16)  # tokens per SFT example at most
    lora: LoraSettings = LoraSettings(enabled=False)  # LoRA SFT (RL and evaluation run the adapter on its base)
    bf16: bool = False  # bf16 mixed precision (faster on CPUs with native bf16 for a model of SmolLM2's size)


# The quickstart's keys that are the OAT-GRPO stage's own, passed to its config unchanged.
RL_KEYS = ("memory", "tasks_per_iteration", "tree", "credit", "trainer", "loop", "eval_samples")


class QuickstartConfig(ConfigModel):
    """The embedded default of ``memrl quickstart`` (every value measured to fit minutes on 2 CPU cores)."""

    command: Literal["quickstart"] = "quickstart"  # the command this config is for
    run: RunConfig = RunConfig(output_dir="runs")
    base_model: Literal["tiny", "smollm2"] = "tiny"  # tiny: random-init Qwen3 (model); smollm2: SmolLM2-135M-Instruct
    model: TinyModelSpec = TinyModelSpec()
    model_cache: str = ".cache/models"  # directory the base model is built (or converted) into and reused from
    task_family: str = "sam"  # sam, dialogue, or a registered family with an oracle (ms_textworld: TextWorld games)
    task_params: dict[str, Any] = {}  # the family's parameters (families other than sam and dialogue)
    max_model_len: int | None = Field(None, ge=16, le=10**7)  # vLLM context length (rollouts, evals); None: the model's
    horizon: int = Field(12, ge=1, le=10**5)  # tour steps before the question, for distillation and RL
    eval_horizons: list[int] = [12, 24]  # horizons (tour steps) of the held-out eval task sets
    distill_tasks: int = Field(600, ge=1, le=10**6)  # SAM tasks the oracle is run on to make SFT data
    eval_tasks_per_horizon: int = Field(60, ge=1, le=10**5)  # held-out tasks per eval horizon
    # first seed of the held-out tasks (+ 1000 x horizon); the dialogue test split: 400000
    eval_seed: int = Field(200_000, ge=0, lt=2**32)
    paired_eval: bool = False  # also run untrained, SFT and exported RL greedy on the held-out tasks: paired intervals
    expert: SamOracleConfig = SamOracleConfig(defer_to_later=0.9)
    memory: SamConfig = SamConfig(
        page_turns=1,
        live_capacity_turns=4,
        keep_recent_turns=3,
        sampling={
            "consolidate": RoleSampling(temperature=0.0, max_tokens=64),
            "recall": RoleSampling(temperature=1.0, max_tokens=64),
        },
    )
    reasoner_max_pages: int = Field(2, ge=1, le=1000)  # page ids the scripted reasoner asks for per recall
    sft: QuickstartSFT = QuickstartSFT()
    rl_tasks: int = Field(512, ge=1, le=10**6)  # SAM tasks in the RL training set
    tasks_per_iteration: int = Field(16, ge=1, le=10**5)  # tasks rolled out per RL iteration
    tree: TreeConfig = TreeConfig(branch_factor=4, max_branch_depth=2, max_leaves=16)
    credit: CreditConfig = CreditConfig(terms=[{"name": "committee", "weight": 0.5}])
    # lr and the KL weight: what benchmarks/ablations.py --select chose on dev; 2 x 2 optimizer steps per batch (the
    # trainer's default); trainer.update_epochs=1 trainer.optimizer_steps_per_epoch=1 trainer.kl_coef=0 is the old one
    trainer: GroupTrainerConfig = GroupTrainerConfig(lr=2e-4, kl_coef=0.05, lora=LoraSettings(enabled=False))
    loop: LoopConfig = LoopConfig(iterations=24, checkpoint_every=12)
    eval_samples: int = Field(2, ge=0, le=1000)  # sampled eval runs per task (plus one greedy)
    evaluate_untrained: bool = True  # also evaluate the untrained model (greedy) as a baseline, and pair it
    export: bool = True  # export the RL model as a HF checkpoint + model card at the end

    @property
    def sam_style(self) -> bool:
        """Whether the family is SAM-style: sized by horizons, its expert SAM's oracle."""
        return self.task_family in _SAM_STYLE

    @field_validator("task_family")
    @classmethod
    def _family(cls, family: str) -> str:
        if family in _SAM_STYLE:
            return family
        from memrl.data.registry import TASK_FAMILIES

        reg = TASK_FAMILIES.get(family)
        if reg.extra.get("kind", "env") != "env" or not reg.extra.get("oracle"):
            raise ValueError(
                f"{family!r} has no oracle expert to distil (the quickstart runs sam, dialogue or a "
                f"registered family of memrl's task interface with an oracle)"
            )
        return family

    @field_validator("task_params")
    @classmethod
    def _params(cls, params: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        family = info.data.get("task_family")
        if family in _SAM_STYLE:
            if params:
                raise ValueError(f"the {family} family is sized by horizon and eval_horizons, not task_params")
            return params
        from memrl.data.registry import TASK_FAMILIES

        config = TASK_FAMILIES.get(family).config if family else None
        if config is not None:
            try:
                config.model_validate(params)
            except ValidationError as exc:  # name the key inside task_params
                raise ValueError(
                    "; ".join(
                        f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)
                    )
                ) from None
        return params


def _peak_rss_gib() -> float:
    """Peak resident memory of this process and its children (vLLM runs in-process on CPU)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return round(max(own, children) / (1 << 20), 3)


class _Stages:
    """Times every stage and prints a banner per stage; :meth:`figures` writes a stage's figures to
    ``stage_figures.json`` (and the console) as soon as the stage has them, so an interrupted run keeps them."""

    def __init__(self, run_dir: Path | None = None) -> None:
        self.times: dict[str, float] = {}
        self.start = time.perf_counter()
        self.run_dir = run_dir
        self.figures_so_far: dict[str, Any] = {}

    def figures(self, stage: str, figures: dict[str, Any], line: str) -> None:
        """Record ``stage``'s figures now (atomically, beside the earlier stages') and print ``line``."""
        from memrl.data.io import atomic_write_text

        self.figures_so_far[stage] = figures
        if self.run_dir is not None:
            atomic_write_text(self.run_dir / "stage_figures.json", json.dumps(self.figures_so_far, indent=2) + "\n")
        log.info(f"[quickstart] {stage}: {line}")

    def run(self, name: str, title: str, fn: Any) -> Any:
        log.info(f"\n[quickstart] === {name}: {title}")
        t0 = time.perf_counter()
        out = fn()
        self.times[name] = round(time.perf_counter() - t0, 1)
        log.info(f"[quickstart] {name} done in {self.times[name]:.0f} s")
        return out


def run_quickstart(cfg: QuickstartConfig) -> int:
    """Run every stage (see the module docstring) and write the report; returns 0."""
    from memrl.data.registry import import_entry
    from memrl.data.tasks import family_of, load_tasks
    from memrl.data.tracking import MetricsLogger
    from memrl.launch.report import write_report
    from memrl.rollout.engines.config import EngineConfig
    from memrl.rollout.engines.factory import build_engine
    from memrl.rollout.engines.scripted import ScriptedEngine
    from memrl.rollout.evaluation.tasks import evaluate_memory, evaluate_sam_memory
    from memrl.rollout.expert_traces import DistillRunConfig, distill
    from memrl.rollout.loop import EngineSet
    from memrl.rollout.models import ensure_smollm2, ensure_tiny_model
    from memrl.train.export import ExportConfig, export_model
    from memrl.train.oat_grpo import OATGRPOConfig, default_reasoner, family_reasoner, summarize_eval, train_oat_grpo
    from memrl.train.sft import SFTRunConfig, SFTTrainConfig, run_sft
    from memrl.train.sft_data import SFTDataConfig

    run_dir = prepare_run_dir(cfg, cfg.run, "quickstart")
    stages = _Stages(run_dir)
    log.info(f"[quickstart] run directory: {run_dir}")

    if cfg.base_model == "smollm2":
        base = stages.run(
            "model",
            "SmolLM2-135M-Instruct from its GGUF (converted once, cached)",
            lambda: ensure_smollm2(cfg.model_cache),
        )
    else:
        base = stages.run(
            "model",
            "tiny Qwen3 memory model + offline tokenizer",
            lambda: ensure_tiny_model(cfg.model_cache, cfg.model),
        )
    train_set = _task_set(cfg, cfg.distill_tasks, 0, cfg.horizon)
    distill_cfg = DistillRunConfig(
        run=RunConfig(output_dir=str(run_dir), name="distill", seed=cfg.run.seed),
        tasks=train_set,
        sam_oracle=cfg.expert,
        sam_memory=cfg.memory,
        reasoner_max_pages=cfg.reasoner_max_pages,
        tokenizer=str(base),
    )
    distill_stats = stages.run(
        "distill",
        "the privileged oracle inside SAM -> SFT datasets per role",
        lambda: distill(distill_cfg, run_dir / "distill"),
    )
    traces, rows = distill_stats["traces"], distill_stats["rows"]
    stages.figures(
        "distill",
        {"traces": traces, "rows": rows},
        f"{traces['kept']} of {traces['total']} expert trajectories kept, {rows['kept']} SFT rows",
    )

    sft_cfg = SFTRunConfig(
        run=RunConfig(output_dir=str(run_dir), name="sft", seed=cfg.run.seed),
        model=PolicySpec(base=str(base)),
        lora=cfg.sft.lora,
        data=SFTDataConfig(
            dir=str(run_dir / "distill"),
            roles=dict(cfg.sft.role_weights),
            mixture_rows=cfg.sft.max_steps * cfg.sft.batch_size,
        ),
        train=SFTTrainConfig(
            max_steps=cfg.sft.max_steps,
            batch_size=cfg.sft.batch_size,
            lr=cfg.sft.lr,
            warmup=0.05,
            max_length=cfg.sft.max_length,
            save_steps=0,
            bf16=cfg.sft.bf16,
        ),
    )
    stages.run("sft", "TRL SFTTrainer on cue writing + recall", lambda: run_sft(sft_cfg))
    sft_summary = json.loads((run_dir / "sft" / "summary.json").read_text())
    stages.figures(
        "sft",
        {k: sft_summary.get(k) for k in ("global_step", "first_logged_loss", "last_logged_loss")},
        f"{sft_summary.get('global_step')} steps, loss {sft_summary.get('first_logged_loss') or 0:.3f} -> "
        f"{sft_summary.get('last_logged_loss') or 0:.3f}",
    )
    sft_dir = run_dir / "sft" / "final"
    # A LoRA SFT stage leaves an adapter: RL and evaluation run it on its base.
    sft_policy = (
        PolicySpec(base=str(base), adapter=str(sft_dir)) if cfg.sft.lora.enabled else PolicySpec(base=str(sft_dir))
    )

    sam_style = cfg.task_family in _SAM_STYLE
    if sam_style:
        eval_tasks = [
            t
            for h in cfg.eval_horizons
            for t in load_tasks(_task_set(cfg, cfg.eval_tasks_per_horizon, cfg.eval_seed + 1000 * h, h), f"eval{h}")
        ]
        reasoner_cfg = default_reasoner(str(base), cfg.run.seed).model_copy(
            update={"scripted_kwargs": {"max_pages": cfg.reasoner_max_pages, "recall_budget": 2}}
        )
    else:
        eval_tasks = load_tasks(_task_set(cfg, cfg.eval_tasks_per_horizon, cfg.eval_seed, 0), "eval")
        reasoner_cfg = family_reasoner(train_set, str(base), cfg.run.seed)

    greedy_outcomes: dict[str, dict[str, float]] = {}  # model -> task id -> greedy outcome (paired_eval)

    def evaluate_with(
        model_dir: Path | None, samples: int, adapter: str | None = None, keep_as: str | None = None
    ) -> dict[str, Any]:
        reasoner = build_engine(reasoner_cfg)
        engine = (
            build_engine(
                EngineConfig.vllm(
                    "memory",
                    model_dir,
                    max_model_len=cfg.max_model_len,
                    enable_lora=adapter is not None,
                    max_lora_rank=64,
                )
            )
            if model_dir is not None
            else None
        )
        try:
            if adapter is not None and engine is not None:
                engine.load_adapter(adapter, version=1)
            if sam_style:
                result = evaluate_sam_memory(
                    eval_tasks, engine, cfg.memory, samples=samples, reasoner=reasoner, seed=cfg.run.seed
                )
            else:  # the family's oracle expert when no model is given
                memory = engine or ScriptedEngine(
                    import_entry(str(family_of(train_set).extra["oracle"]))(cfg.expert), name="oracle"
                )
                result = evaluate_memory(
                    eval_tasks,
                    EngineSet(reasoner=reasoner, memory=memory),
                    cfg.memory,
                    samples=samples,
                    seed=cfg.run.seed,
                )
        finally:
            if engine is not None:
                engine.close()
        if keep_as is not None:
            greedy_outcomes[keep_as] = {
                r["episode_id"]: float(r["outcome"] or 0.0) for r in result["records"] if not r["sampled"]
            }
        return summarize_eval(result)

    baselines: dict[str, dict[str, Any]] = {}

    def heldout_line(figures: dict[str, Any]) -> str:
        sampled = figures.get("success") if cfg.eval_samples else None
        return (
            f"held-out success {'n/a' if sampled is None else f'{sampled:.1%}'} sampled, "
            f"{figures['success_greedy']:.1%} greedy"
        )

    baselines["oracle expert (upper bound)"] = stages.run(
        "eval-oracle", "the oracle expert as memory model", lambda: evaluate_with(None, cfg.eval_samples)
    )
    stages.figures(
        "eval-oracle", baselines["oracle expert (upper bound)"], heldout_line(baselines["oracle expert (upper bound)"])
    )
    if cfg.evaluate_untrained:
        # Greedy only: the untrained model writes max-length noise on every call, and one run per task shows it.
        label = "untrained tiny model" if cfg.base_model == "tiny" else "untrained SmolLM2-135M-Instruct"
        baselines[label] = stages.run(
            "eval-untrained",
            "the untrained model as memory model (greedy)",
            lambda: evaluate_with(Path(base), 0, keep_as="untrained"),
        )
        stages.figures(
            "eval-untrained", baselines[label], f"held-out success {baselines[label]['success_greedy']:.1%} greedy"
        )

    oat_cfg = OATGRPOConfig(
        run=RunConfig(output_dir=str(run_dir), name="rl", seed=cfg.run.seed, wandb=cfg.run.wandb),
        policy=sft_policy,
        reasoner=reasoner_cfg,
        engine=EngineConfig.vllm("policy", sft_policy.base, max_model_len=cfg.max_model_len),
        train_tasks=_task_set(cfg, cfg.rl_tasks, 100_000, cfg.horizon),
        eval_tasks=TaskSetConfig(family=cfg.task_family, count=0),
        **{key: getattr(cfg, key) for key in RL_KEYS},
    )
    logger = MetricsLogger(
        run_dir, cfg.run.wandb, cfg.model_dump(mode="json"), name=run_dir.name, console=True, logging=cfg.run.logging
    )
    rl = stages.run(
        "rl",
        "OAT-GRPO with vLLM rollouts (held-out eval before and after)",
        lambda: train_oat_grpo(
            oat_cfg, prepare_run_dir(oat_cfg, oat_cfg.run, "rl"), logger=logger, eval_tasks=eval_tasks
        ),
    )
    logger.close()
    evals = rl["evals"]
    before, after = evals[0], evals[-1]
    stages.figures(
        "rl",
        {"before": before, "after": after, "iterations": rl["iterations_run"], "updates": rl["updates"]},
        f"SFT {heldout_line(before)}; after OAT-GRPO {heldout_line(after)}",
    )

    # The held-out figures go into the exported model card, so they are written before the export.
    results = heldout_results(cfg, before, after, baselines)
    results_path = run_dir / "heldout_results.json"
    results_path.write_text(json.dumps(results, indent=2) + "\n")
    export_checks: dict[str, Any] | None = None
    if cfg.export:
        export_cfg = ExportConfig(
            run=RunConfig(output_dir=str(run_dir), name="export"),
            policy=rl_policy(rl, sft_policy),
            reference_base=str(base),
            recipe=str(run_dir / "config.yaml"),
            results=str(results_path),
            model_name=f"memrl-quickstart-{cfg.task_family}-{cfg.base_model}",
        )
        export_checks = stages.run(
            "export",
            "Hugging Face checkpoint + model card, verified in transformers and vLLM",
            lambda: export_model(export_cfg, run_dir / "export" / "model"),
        )
        stages.figures(
            "export",
            {k: export_checks.get(k) for k in ("path", "ok", "failures", "differs_from_base")},
            f"{export_checks['path']} {'verified' if export_checks['ok'] else 'FAILED'}",
        )
    paired: dict[str, Any] | None = None
    if cfg.paired_eval:
        if not cfg.export:
            raise ConfigError("paired_eval runs the exported RL model: set export: true")
        stages.run(
            "eval-sft",
            "the SFT model (greedy, paired)",
            lambda: evaluate_with(Path(sft_policy.base), 0, adapter=sft_policy.adapter, keep_as="sft"),
        )
        stages.run(
            "eval-rl",
            "the exported SFT + OAT-GRPO model (greedy, paired)",
            lambda: evaluate_with(run_dir / "export" / "model", 0, keep_as="rl"),
        )
        paired = paired_differences(greedy_outcomes)

    summary = {
        **{
            k: results[k] for k in ("success_sft", "success_rl", "success_sft_greedy", "success_rl_greedy", "baselines")
        },
        "eval_before": before,
        "eval_after": after,
        "distill": {"traces": distill_stats["traces"], "rows": distill_stats["rows"]},
        "rl_iterations": rl["iterations_run"],
        "rl_updates": rl["updates"],
        "reasoner_tokens_rl": sum(h.get("reasoner_tokens", 0) for h in rl["history"]),
        "export": export_checks,
        "paired": paired,
        "stage_s": stages.times,
        "base_model_dir": str(base),
        "sft_model_dir": sft_policy.base if sft_policy.adapter is None else sft_policy.adapter,
        "wall_s": round(time.perf_counter() - stages.start, 1),
        "peak_rss_gib": _peak_rss_gib(),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_report(run_dir, cfg, summary, rl["history"])
    _print_table(summary, _sampled_roles(cfg))
    log.info(f"\n[quickstart] report: {run_dir / 'report.md'}")
    return 0


def rl_policy(rl: dict[str, Any], sft_policy: PolicySpec) -> PolicySpec:
    """The RL run's final policy: its full weights, or its LoRA adapter on the model RL started from."""
    if rl.get("lora"):
        if sft_policy.adapter is not None:
            raise ConfigError(
                "RL with a LoRA trainer on a LoRA SFT policy cannot be exported as one model: "
                "use full-weight SFT (sft.lora.enabled: false) or a full-weight trainer"
            )
        return PolicySpec(base=sft_policy.base, adapter=rl["policy_dir"])
    return PolicySpec(base=rl["policy_dir"])


def paired_differences(outcomes: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Greedy held-out success of each model and the paired differences between them (same tasks), each with a
    95% percentile-bootstrap interval over tasks."""
    from memrl.rollout.evaluation.stats import bootstrap_ci

    def summary(values: list[float]) -> dict[str, Any]:
        return {"mean": sum(values) / len(values), "ci95": bootstrap_ci(values), "tasks": len(values)}

    out: dict[str, Any] = {name: summary(list(v.values())) for name, v in outcomes.items()}
    for a, b in (("sft", "untrained"), ("rl", "sft"), ("rl", "untrained")):
        if a in outcomes and b in outcomes:
            shared = sorted(set(outcomes[a]) & set(outcomes[b]))
            out[f"{a}-{b}"] = summary([outcomes[a][t] - outcomes[b][t] for t in shared])
    return out


def heldout_results(
    cfg: QuickstartConfig, before: dict[str, Any], after: dict[str, Any], baselines: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """Held-out success inside SAM of the SFT model and the SFT + OAT-GRPO model (sampled as trained, and greedy),
    overall and per horizon, beside the baselines: what the exported model card records."""
    horizons = [k.split("/", 1)[1] for k in before if k.startswith("success/")]
    return {
        "eval": (
            f"held-out SAM tasks: horizons {cfg.eval_horizons} x {cfg.eval_tasks_per_horizon} tasks; "
            + (
                f"sampled = {_sampled_roles(cfg)}, mean of {cfg.eval_samples} run(s) per task"
                if cfg.eval_samples
                else "sampled = not run (eval_samples 0)"
            )
            + "; greedy = every call greedy"
        ),
        "success_sft": before["success"],
        "success_rl": after["success"],
        "success_sft_greedy": before["success_greedy"],
        "success_rl_greedy": after["success_greedy"],
        "per_horizon": {
            h: {
                "sft": before.get(f"success/{h}"),
                "rl": after.get(f"success/{h}"),
                "sft_greedy": before.get(f"success_greedy/{h}"),
                "rl_greedy": after.get(f"success_greedy/{h}"),
            }
            for h in horizons
        },
        "baselines": {
            name: {"success": v["success"], "success_greedy": v["success_greedy"]} for name, v in baselines.items()
        },
    }


def _sampled_roles(cfg: QuickstartConfig) -> str:
    return ", ".join(
        f"{role} {'greedy' if s.temperature == 0 else f'at temperature {s.temperature:g}'}"
        for role, s in cfg.memory.sampling.items()
    )


def _print_table(summary: dict[str, Any], sampled: str) -> None:
    rows = [(name, v["success"], v["success_greedy"]) for name, v in summary["baselines"].items()]
    rows += [
        ("SFT", summary["success_sft"], summary["success_sft_greedy"]),
        ("SFT + OAT-GRPO", summary["success_rl"], summary["success_rl_greedy"]),
    ]
    log.info(f"\n[quickstart] held-out success inside SAM (sampled: {sampled} | greedy)")

    def pct(x: float | None) -> str:
        return "   n/a" if x is None else f"{x:>6.1%}"

    for name, sampled, greedy in rows:
        log.info(f"  {name:<28} {pct(sampled)}   {pct(greedy)}")
    log.info(f"  wall {summary['wall_s']:.0f} s, peak RSS {summary['peak_rss_gib']:.2f} GiB")
