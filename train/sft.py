"""``memrl sft``: supervised fine-tuning of a memory model on distilled expert rows (TRL ``SFTTrainer``).

The data are the per-role datasets of :mod:`memrl.data.distill` (``<dir>/<role>.jsonl`` or ``.arrow``): one role, the
plain concatenation of several (``roles: [consolidate, recall]``) or a weighted mixture
(``roles: {consolidate: 1, recall: 3}``, weights are shares of the mixture). Rows become conversational
prompt-completion examples (prompt = the messages the memory model saw, completion = the expert's output); TRL renders
them with the tokenizer's chat template and takes the loss where its completion mask and, with
``assistant_only_loss``, the template's ``{% generation %}`` span agree: exactly the final assistant message and its
closing end-of-turn token.

Training is TRL's: PEFT LoRA (``lora.enabled``) or full weights, any accelerate / DeepSpeed setup (``train.deepspeed``
names a file under ``configs/deepspeed/`` or a path; ``accelerate launch --config_file configs/accelerate/...`` works
too), bf16 mixed precision, checkpoints every ``train.save_steps`` in ``<run_dir>/checkpoints`` and ``--resume`` from
the newest complete one (a checkpoint is complete once its ``trainer_state.json``, written last, is there).
``train.batch_size`` is global: the per-device micro-batch and gradient accumulation follow from the world size, so
1 and N processes take the same optimizer steps.

Outputs in the run directory: ``config.yaml`` (resolved), ``metrics.jsonl`` (every logged step), ``summary.json``,
and ``final/``: full weights (a base directory vLLM and transformers load) or the LoRA adapter (vLLM's
``LoRARequest`` path), each with safetensors, the tokenizer and its chat template, plus ``memrl_sft.json`` naming
the base the adapter belongs to.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from memrl.data.config import (
    ConfigError,
    ConfigModel,
    LoggingConfig,
    RunConfig,
    WandbConfig,
    config_hash,
    resolve_deepspeed_config,
)
from memrl.data.io import atomic_write_text, storage_error
from memrl.data.run_dir import shared_run_dir
from memrl.data.schemas import SFTExample
from memrl.data.tracking import progress_bar
from memrl.rollout.engines.base import release_freed_memory
from memrl.train.checkpoint import record_saved, resume_point, verify_trainer_checkpoint
from memrl.train.policy import LoraSettings, PolicySpec
from memrl.train.precision import warn_if_cpu_bf16_slow
from memrl.train.sft_data import SFTDataConfig, load_role_rows, mix_rows, sft_dataset, split_eval

__all__ = [
    "SFTRunConfig",
    "SFTTrainConfig",
    "build_sft_trainer",
    "check_inputs",
    "checkpoint_step",
    "latest_checkpoint",
    "run_sft",
    "sft_args",
]

log = logging.getLogger(__name__)

# SFTConfig fields this module derives from the memrl config; `train.sft_args` may not set them.
_MANAGED_ARGS = {
    "output_dir", "run_name", "report_to", "max_steps", "num_train_epochs", "per_device_train_batch_size",
    "per_device_eval_batch_size", "gradient_accumulation_steps", "learning_rate", "bf16", "use_cpu", "deepspeed",
    "assistant_only_loss", "save_steps", "save_strategy", "seed", "data_seed", "model_init_kwargs",
    "eval_strategy", "eval_steps",
}  # fmt: skip


class SFTTrainConfig(ConfigModel):
    """Optimisation, precision, parallelism and checkpointing of the SFT stage."""

    max_steps: int | None = Field(300, ge=1, le=10**8, description="optimizer steps (None: train `epochs` epochs)")
    epochs: float = Field(1.0, gt=0, le=10**4)  # epochs to train when max_steps is None
    batch_size: int = Field(32, ge=1, le=2**16, description="rows per optimizer step, over all processes")
    per_device_batch_size: int | None = Field(None, ge=1, description="micro-batch (default: batch_size / world)")
    lr: float = Field(2e-5, gt=0, le=1)  # peak learning rate
    lr_scheduler: str = "linear"  # transformers LR scheduler type (linear, cosine, constant, ...)
    warmup: float = Field(0.03, ge=0, description="warmup steps, or a fraction of the steps when < 1")
    # first_step: the warm-up's first optimizer step trains at lr / warmup steps; zero: transformers' own warm-up,
    # whose first step runs at lr 0 (a wasted step: the whole warm-up of a short run)
    warmup_start: Literal["first_step", "zero"] = "first_step"
    weight_decay: float = Field(0.0, ge=0, le=1)  # AdamW weight decay
    max_grad_norm: float = Field(1.0, gt=0, le=1e6)  # gradient-norm clipping threshold
    max_length: int | None = Field(1024, ge=8, description="tokens per row (longer rows are cut at the end)")
    bf16: bool = Field(
        False, description="bf16 mixed precision (GPUs, CPUs with native bf16; far slower on other CPUs: memrl warns)"
    )
    gradient_checkpointing: bool = False  # recompute activations in backward (less memory, slower)
    deepspeed: str | None = Field(None, description="DeepSpeed JSON: a name under configs/deepspeed/ or a path")
    # log metrics every N steps; None: about 20 points over the run (1 to 25 steps); at least 4 points in any case
    logging_steps: int | None = Field(None, ge=1)
    save_steps: int = Field(100, ge=0, description="checkpoint every N steps (0: only the final model)")
    # stop once this optimizer step is done, with a checkpoint of it and no final model; `--resume` goes on from there
    # on the schedule of max_steps (a run longer than one sitting: a Slurm time limit, a machine lent for an hour)
    stop_at_step: int | None = Field(None, ge=1, le=10**8)
    save_total_limit: int | None = Field(2, ge=1)  # checkpoints kept on disk; None: all
    eval_steps: int | None = Field(None, ge=1, description="eval loss every N steps (needs data.eval_fraction)")
    progress: bool = True  # show the progress bar
    sft_args: dict[str, Any] = Field({}, description="further trl.SFTConfig fields, e.g. {packing: true}")

    @field_validator("sft_args")
    @classmethod
    def _unmanaged(cls, extra: dict[str, Any]) -> dict[str, Any]:
        clash = sorted(set(extra) & _MANAGED_ARGS)
        if clash:
            raise ValueError(f"{clash} are set from the memrl config (train.*, run.*), not through sft_args")
        return extra


class SFTRunConfig(ConfigModel):
    """Config of ``memrl sft``."""

    command: Literal["sft"] = "sft"  # the command this config is for
    run: RunConfig = RunConfig()
    model: PolicySpec
    lora: LoraSettings = LoraSettings()
    data: SFTDataConfig
    train: SFTTrainConfig = SFTTrainConfig()


# ----------------------------------------------------------------------------------------------------------------
# Inputs


def check_inputs(cfg: SFTRunConfig) -> None:
    """Before anything is created: every role's dataset is read and each row checked against its schema (file:line:
    field), and a named DeepSpeed config exists."""
    load_role_rows(cfg.data)
    if cfg.train.deepspeed:
        resolve_deepspeed_config(cfg.train.deepspeed)


# ----------------------------------------------------------------------------------------------------------------
# Checkpoints


def _complete(path: Path) -> bool:
    return (path / "trainer_state.json").is_file()


def checkpoint_step(path: Path) -> int:
    """The optimizer step a ``checkpoint-N`` directory holds."""
    return int(path.name.rsplit("-", 1)[1])


def _checkpoints(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and p.name.startswith("checkpoint-") and p.name[11:].isdigit()]
    return sorted(found, key=checkpoint_step)


def latest_checkpoint(folder: str | Path) -> Path | None:
    """The newest intact ``checkpoint-N`` directory under ``folder`` (a kill mid-save leaves an incomplete one
    without ``trainer_state.json``, which the Trainer writes last; a damaged one is reported and skipped), or None
    when the run never saved one; a run whose saved checkpoints are all gone or damaged is an error
    (:func:`~memrl.train.checkpoint.resume_point`, as for the online loops)."""
    complete = [p for p in _checkpoints(Path(folder)) if _complete(p)]
    return resume_point(Path(folder), complete, verify_trainer_checkpoint)


@contextlib.contextmanager
def _torn_checkpoints_removed(ckpt_dir: Path, main: bool) -> Iterator[None]:
    """The Trainer writes ``checkpoint-N`` in place: when training stops mid-save (a full disk, the file-size limit,
    a signal), the main process removes the torn folder (no ``trainer_state.json``), and a write the storage refused
    is one :class:`~memrl.data.io.StorageError` naming the folder."""
    try:
        yield
    except BaseException as exc:
        if main:
            for torn in _checkpoints(ckpt_dir):
                if not _complete(torn):
                    shutil.rmtree(torn, ignore_errors=True)
        if isinstance(exc, Exception) and (error := storage_error(exc, ckpt_dir, "sft checkpoint")) is not None:
            raise error from exc
        raise


def _stop_at_step_callback(step: int) -> Any:
    """A ``TrainerCallback`` that ends training with a checkpoint once optimizer step ``step`` is done."""
    from transformers import TrainerCallback

    class StopAtStep(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if state.global_step >= step:
                control.should_save = True
                control.should_training_stop = True
            return control

    return StopAtStep()


def _journal_callback(ckpt_dir: Path) -> Any:
    """Record each complete checkpoint in the run's checkpoint journal, which tells a resume whose checkpoints are
    all gone from a run that never saved one."""
    from transformers import TrainerCallback

    class JournalSaves(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.is_world_process_zero:  # called after the Trainer wrote trainer_state.json, its last file
                record_saved(ckpt_dir, f"checkpoint-{state.global_step}")

    return JournalSaves()


# ----------------------------------------------------------------------------------------------------------------
# Trainer


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _batch_layout(cfg: SFTTrainConfig, world: int) -> tuple[int, int]:
    """(per-device micro-batch, gradient accumulation steps) giving ``cfg.batch_size`` rows per optimizer step."""
    per_device = cfg.per_device_batch_size or max(1, cfg.batch_size // world)
    accumulation, rest = divmod(cfg.batch_size, per_device * world)
    if rest or accumulation < 1:
        raise ConfigError(
            f"train.batch_size {cfg.batch_size} is not a multiple of per-device batch {per_device} x {world} "
            "process(es)"
        )
    return per_device, accumulation


def logging_interval(t: SFTTrainConfig) -> int:
    """Steps between loss logs: ``train.logging_steps``, or about 20 points over the run (1 to 25 steps), and never
    fewer than 4 points (the first step's included) over a run of known length: an 8-step run logs every 2 steps,
    not only its first."""
    if t.max_steps is None:
        return t.logging_steps or 10
    steps = t.logging_steps or min(max(t.max_steps // 20, 1), 25)
    return min(steps, max(t.max_steps // 3, 1))


def no_step_at_lr_zero(scheduler: Any, warmup_steps: int) -> None:
    """Make the linear warm-up of a transformers LR schedule start at ``lr / warmup`` instead of 0: transformers'
    warm-up gives optimizer step 1 the factor 0/warmup, a step spent at lr 0 (the whole first step of a short run).
    The warm-up steps take the factors of steps 1..warmup instead (the last of them the full lr); the schedule after
    the warm-up is unchanged. Schedulers other than ``LambdaLR`` are left as they are."""
    from torch.optim.lr_scheduler import LambdaLR

    if warmup_steps <= 0 or not isinstance(scheduler, LambdaLR):
        return
    scheduler.lr_lambdas = [
        (lambda step, f=f: f(step + 1) if step < warmup_steps else f(step)) for f in scheduler.lr_lambdas
    ]
    for group, base, factor in zip(
        scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True
    ):
        group["lr"] = base * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]


def sft_args(cfg: SFTRunConfig, output_dir: Path, has_eval: bool) -> Any:
    """The ``trl.SFTConfig`` of ``cfg`` (creating it initialises the distributed state of a launched run)."""
    import torch
    from trl import SFTConfig

    t = cfg.train
    if t.bf16:
        warn_if_cpu_bf16_slow("train.bf16 (sft.bf16 in a quickstart config)")
    per_device, accumulation = _batch_layout(t, _world_size())
    wandb_on = (cfg.run.wandb.enabled or "wandb" in cfg.run.logging.backends) and cfg.run.wandb.mode != "disabled"
    kwargs: dict[str, Any] = {
        "output_dir": str(output_dir),
        "max_steps": t.max_steps if t.max_steps is not None else -1,
        "num_train_epochs": t.epochs,
        "per_device_train_batch_size": per_device,
        "per_device_eval_batch_size": per_device,
        "gradient_accumulation_steps": accumulation,
        "learning_rate": t.lr,
        "lr_scheduler_type": t.lr_scheduler,
        "warmup_steps": t.warmup,
        "weight_decay": t.weight_decay,
        "max_grad_norm": t.max_grad_norm,
        "max_length": t.max_length,
        "bf16": t.bf16,
        "use_cpu": not torch.cuda.is_available(),
        "gradient_checkpointing": t.gradient_checkpointing,
        "deepspeed": str(resolve_deepspeed_config(t.deepspeed)) if t.deepspeed else None,
        "assistant_only_loss": True,
        "logging_steps": logging_interval(t),
        "logging_first_step": True,
        "save_strategy": "steps" if t.save_steps else "no",
        "save_steps": max(t.save_steps, 1),
        "save_total_limit": t.save_total_limit,
        "eval_strategy": "steps" if has_eval and t.eval_steps else "no",
        "eval_steps": t.eval_steps,
        "seed": cfg.run.seed,
        "data_seed": cfg.run.seed,
        "report_to": ["wandb"] if wandb_on else [],
        "disable_tqdm": not t.progress,
        "model_init_kwargs": {
            "dtype": cfg.model.dtype,
            "trust_remote_code": cfg.model.trust_remote_code,
            "use_safetensors": True,
        },
        "trust_remote_code": cfg.model.trust_remote_code,
        **t.sft_args,
    }
    if t.deepspeed and not torch.cuda.is_available():
        from memrl.train.group_trainer import skip_deepspeed_shm_op

        skip_deepspeed_shm_op()
    try:
        args = SFTConfig(**kwargs)
    except TypeError as exc:  # an unknown sft_args key
        raise ConfigError(f"train.sft_args: {exc}") from None
    if args.deepspeed_plugin is not None and args.distributed_state.num_processes > 1:
        import deepspeed

        # On CPU the process group comes up through gloo, not DeepSpeed; ZeRO-3 partitions the model while it loads
        # and needs DeepSpeed's view of the world then (it adopts the existing group).
        deepspeed.init_distributed()
    return args


def _peft_config(lora: LoraSettings) -> Any:
    from peft import LoraConfig

    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )


def build_sft_trainer(
    cfg: SFTRunConfig,
    args: Any,
    train_rows: list[SFTExample],
    eval_rows: list[SFTExample] | None = None,
    callbacks: list[Any] | None = None,
) -> Any:
    """A TRL ``SFTTrainer`` over conversational rows: a fresh LoRA on the base (``lora.enabled``), the spec's adapter
    trained further, or full weights; loss on the assistant span only."""
    from trl import SFTTrainer

    from memrl.rollout.models import load_tokenizer

    tokenizer = load_tokenizer(cfg.model.base, trust_remote_code=cfg.model.trust_remote_code)
    peft_config = None
    if cfg.model.adapter:
        from memrl.train.policy import load_policy

        model, _ = load_policy(cfg.model, cfg.lora, trainable=True)
    else:
        # TRL loads the base itself so DeepSpeed ZeRO-3 can partition it while loading.
        model = cfg.model.base
        peft_config = _peft_config(cfg.lora) if cfg.lora.enabled else None
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=sft_dataset(train_rows, cfg.data.chat_template_kwargs),
        eval_dataset=sft_dataset(eval_rows, cfg.data.chat_template_kwargs) if eval_rows else None,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=callbacks,
    )
    from transformers import PrinterCallback, ProgressCallback

    create_scheduler = trainer.create_scheduler

    def scheduler_without_a_step_at_lr_zero(num_training_steps: int, optimizer: Any = None) -> Any:
        scheduler = create_scheduler(num_training_steps, optimizer)
        if cfg.train.warmup_start == "first_step":
            no_step_at_lr_zero(scheduler, args.get_warmup_steps(num_training_steps))
        return scheduler

    trainer.create_scheduler = scheduler_without_a_step_at_lr_zero
    # the Trainer's own progress callbacks write to stdout/stderr, which the CLI sends to run.log
    for own in (ProgressCallback, PrinterCallback):
        trainer.remove_callback(own)
    trainer.add_callback(_console_progress(show_bar=not args.disable_tqdm))
    return trainer


def _console_progress(show_bar: bool) -> Any:
    """The Trainer's progress bar and log lines (``{'loss': ...}``, floats to 4 significant digits) on memrl's console:
    transformers' ``ProgressCallback`` with memrl's bars and the ``memrl.train.sft`` logger."""
    from tqdm.auto import tqdm
    from transformers import ProgressCallback
    from transformers.trainer_utils import has_length

    class ConsoleProgress(ProgressCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.current_step = 0
            if state.is_world_process_zero and show_bar:
                self.training_bar = progress_bar(total=state.max_steps, dynamic_ncols=True)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.training_bar is not None:
                super().on_step_end(args, state, control, **kwargs)

        def on_prediction_step(
            self, args: Any, state: Any, control: Any, eval_dataloader: Any = None, **kwargs: Any
        ) -> None:
            if state.is_world_process_zero and show_bar and has_length(eval_dataloader):
                if self.prediction_bar is None:
                    self.prediction_bar = progress_bar(
                        total=len(eval_dataloader), leave=self.training_bar is None, dynamic_ncols=True
                    )
                self.prediction_bar.update(1)

        def on_log(
            self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
        ) -> None:
            if not state.is_world_process_zero or (show_bar and self.training_bar is None):
                return  # as the Trainer's own: with a bar, lines of the training loop only
            shown = {}
            for key, value in (logs or {}).items():
                if isinstance(value, str) and len(value) > self.max_str_len:
                    value = f"[String too long to display, length: {len(value)} > {self.max_str_len}.]"
                shown[key] = f"{value:.4g}" if isinstance(value, float) else value
            shown.pop("total_flos", None)
            bar = self.training_bar
            # clear the bar while the line is written, as tqdm.write does
            with tqdm.external_write_mode(file=bar.fp if bar is not None else None):
                log.info(str(shown))

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.training_bar is not None:
                self.training_bar.close()
                self.training_bar = None

    return ConsoleProgress()


def _metrics_callback(run_dir: Path, resume_step: int, main: bool, tracking: LoggingConfig) -> Any:
    """A ``TrainerCallback`` that appends every log to ``metrics.jsonl`` and the TensorBoard / MLflow backends of
    ``run.logging`` (main process; records after ``resume_step`` are dropped first, they are redone; wandb is the
    Trainer's own callback) and keeps the losses for the summary."""
    from transformers import TrainerCallback

    from memrl.data.tracking import MetricsLogger

    class MetricsToJsonl(TrainerCallback):
        def __init__(self) -> None:
            others = tracking.model_copy(update={"backends": [b for b in tracking.backends if b != "wandb"]})
            self.logger = (
                MetricsLogger(run_dir, None, console=False, resume_from_step=resume_step, logging=others)
                if main
                else None
            )
            self.losses: dict[str, list[float]] = {"loss": [], "eval_loss": []}

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            logs = dict(logs or {})
            for key, seen in self.losses.items():
                if key in logs:
                    seen.append(float(logs[key]))
            if self.logger is not None:
                self.logger.log(state.global_step, logs)

    return MetricsToJsonl()


def _init_wandb(wandb_cfg: WandbConfig, run_dir: Path, config: dict[str, Any]) -> None:
    """Start (or, on resume, continue) the wandb run the Trainer's wandb callback then logs to."""
    import wandb

    id_file = run_dir / "wandb_id"
    run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
    atomic_write_text(id_file, run_id + "\n")
    wandb.init(
        project=wandb_cfg.project,
        entity=wandb_cfg.entity,
        mode=wandb_cfg.mode,
        tags=list(wandb_cfg.tags),
        dir=str(run_dir),
        name=run_dir.name,
        id=run_id,
        resume="allow",
        config=config,
    )


def _save_final(trainer: Any, cfg: SFTRunConfig, final: Path, roles: list[str]) -> None:
    """Write the final adapter or full weights (safetensors), tokenizer and chat template into ``final``."""
    from peft import PeftModel

    from memrl.train.policy import save_policy

    accelerator = trainer.accelerator
    state_dict = accelerator.get_state_dict(trainer.model_wrapped)
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(trainer.model)
        # A gathered (DeepSpeed) state dict holds tied weights as separate copies; keep one name per parameter,
        # as an unsharded save does.
        named = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
        state_dict = {k: v for k, v in state_dict.items() if k in named}
        save_policy(model, final, trainer.processing_class, state_dict=state_dict)  # whole or absent
        info = {
            "kind": "lora" if isinstance(model, PeftModel) else "full",
            "base": cfg.model.base,
            "base_dir": str(Path(cfg.model.base).resolve()) if Path(cfg.model.base).exists() else None,
            "started_from_adapter": cfg.model.adapter,
            "roles": roles,
            "global_step": trainer.state.global_step,
            "config_hash": config_hash(cfg),
        }
        atomic_write_text(final / "memrl_sft.json", json.dumps(info, indent=2) + "\n")
    accelerator.wait_for_everyone()


def run_sft(cfg: SFTRunConfig, *, callbacks: list[Any] | None = None) -> int:
    """Run the SFT stage (see the module docstring); ``callbacks`` are extra ``TrainerCallback`` s."""
    rows = load_role_rows(cfg.data)
    rows, eval_rows = split_eval(rows, cfg.data.eval_fraction, cfg.data.max_eval_rows, cfg.run.seed)
    weights = cfg.data.roles if isinstance(cfg.data.roles, dict) else None
    train_rows = mix_rows(rows, weights, cfg.data.mixture_rows, cfg.run.seed)

    provisional = Path(cfg.run.output_dir) / (cfg.run.name or "sft") / "checkpoints"
    args = sft_args(cfg, provisional, bool(eval_rows))  # initialises the process group
    state = args.distributed_state
    run_dir = shared_run_dir(cfg, cfg.run, "sft", state)
    ckpt_dir = run_dir / "checkpoints"
    args.output_dir = str(ckpt_dir)
    main = state.is_main_process

    resume_from = latest_checkpoint(ckpt_dir) if cfg.run.resume else None
    if main:
        for stale in _checkpoints(ckpt_dir):
            if not _complete(stale):  # torn by a kill mid-save; the Trainer would otherwise count it
                shutil.rmtree(stale, ignore_errors=True)
        counts = {role: len(v) for role, v in rows.items()}
        log.info(
            f"sft: {len(train_rows)} train rows from {counts}, {len(eval_rows)} eval rows; "
            f"{'LoRA' if cfg.lora.enabled or cfg.model.adapter else 'full'} on {cfg.model.base}; run dir {run_dir}"
            + (f"; resuming from {resume_from.name}" if resume_from else "")
            + (
                "; --resume found no complete checkpoint yet: starting from step 0"
                if cfg.run.resume and not resume_from
                else ""
            )
        )
        if "wandb" in args.report_to:
            _init_wandb(cfg.run.wandb, run_dir, cfg.model_dump(mode="json"))

    resume_step = checkpoint_step(resume_from) if resume_from else 0
    # A run restarted from scratch (no complete checkpoint) drops every earlier record.
    metrics = _metrics_callback(run_dir, resume_step if resume_from else -1, main, cfg.run.logging)
    # The eval loss before training comes from inside train(): DeepSpeed engines exist only there.
    args.eval_on_start = bool(eval_rows) and resume_from is None
    stop = [] if cfg.train.stop_at_step is None else [_stop_at_step_callback(cfg.train.stop_at_step)]
    trainer = build_sft_trainer(
        cfg, args, train_rows, eval_rows, [metrics, _journal_callback(ckpt_dir), *stop, *(callbacks or [])]
    )
    start = time.perf_counter()
    with _torn_checkpoints_removed(ckpt_dir, main):
        result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    elapsed = time.perf_counter() - start
    stopped_early = trainer.state.global_step < trainer.state.max_steps
    if eval_rows and not stopped_early:
        trainer.evaluate()
    if metrics.logger is not None:
        metrics.logger.close()  # the TensorBoard / MLflow runs end after the last evaluation
    final = run_dir / "final"
    if stopped_early:
        log.info(
            f"sft: stopped at step {trainer.state.global_step} of {trainer.state.max_steps} (train.stop_at_step): "
            "its checkpoint is saved; --resume goes on from it"
        )
    else:
        _save_final(trainer, cfg, final, cfg.data.role_names)

    if main:
        steps_done = trainer.state.global_step - resume_step
        losses, evals = metrics.losses["loss"], metrics.losses["eval_loss"]
        summary = {
            "global_step": trainer.state.global_step,
            "steps_this_run": steps_done,
            "steps_per_s": result.metrics.get("train_steps_per_second"),  # the training loop only
            "wall_s": round(elapsed, 2),  # train() end to end, DeepSpeed engine setup included
            "train_loss": float(result.training_loss) if not math.isnan(result.training_loss) else None,
            "first_logged_loss": losses[0] if losses else None,
            "last_logged_loss": losses[-1] if losses else None,
            "eval_loss_before": evals[0] if evals and resume_from is None else None,
            "eval_loss_after": evals[-1] if evals else None,
            "train_rows": len(train_rows),
            "eval_rows": len(eval_rows),
            "world_size": state.num_processes,
            "final_dir": str(final),
            "resumed_from": resume_from.name if resume_from else None,
        }
        if not stopped_early:  # a run stopped early is not finished: no summary, so --resume goes on
            atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        log.info(json.dumps(summary))
    if main and "wandb" in args.report_to:
        import wandb

        wandb.finish()
    del trainer, result
    release_freed_memory()  # the stage's peak pages, which a process going on to rollouts would otherwise keep
    return 0
