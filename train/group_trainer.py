"""The group policy-gradient trainer shared by OAT-GRPO and pivot-turn GRPO.

It consumes :class:`data.schemas.Group` s: each sample becomes a row (shared prompt ids + response ids, the group
advantage, the rollout engine's log-probs). Before the update the trainer recomputes the old log-probs with the
current weights; then it runs ``update_epochs`` passes of ``optimizer_steps_per_epoch`` optimizer steps, each made of
``micro_batches`` micro-batches per process (gradient accumulation), minimising
:func:`train.surrogate.clipped_surrogate`.

Distributed runs (DDP or DeepSpeed ZeRO-2/3 through accelerate) shard each optimizer step's rows across processes.
Every micro-batch loss is normalised by the *global* token (or sequence) count of its optimizer step and rescaled for
accelerate's accumulation and the data-parallel gradient mean, so 1 process and N processes compute the same update.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass
from typing import Any

import torch

from data.config import ConfigModel
from data.schemas import Group
from train.policy import LoraSettings, PolicySpec, load_policy, response_logprobs, save_policy
from train.surrogate import Aggregation, clipped_surrogate

__all__ = ["GroupTrainer", "GroupTrainerConfig", "Row", "make_accelerator", "rows_from_groups"]


class GroupTrainerConfig(ConfigModel):
    """Optimisation settings of the group trainer."""

    lr: float = 1e-5  # AdamW learning rate
    weight_decay: float = 0.0  # AdamW weight decay
    adam_betas: tuple[float, float] = (0.9, 0.999)  # AdamW (beta1, beta2)
    max_grad_norm: float = 1.0  # gradient-norm clipping threshold
    warmup_steps: int = 0  # linear LR warmup, in optimizer steps (0: none)
    update_epochs: int = 1  # passes over each update's rows
    optimizer_steps_per_epoch: int = 1  # optimizer steps each pass is split into
    micro_batches: int = 1  # per process and optimizer step (gradient accumulation)
    clip_low: float = 0.2  # eps_low: ratio clipped below at 1 - clip_low
    clip_high: float = 0.2  # eps_high: ratio clipped above at 1 + clip_high
    aggregation: Aggregation = "token-mean"  # loss mean over all response tokens, or per sequence first
    kl_coef: float = 0.0  # beta: weight of the k3 KL to the reference (base) model; 0: off
    tis_cap: float | None = None  # cap of the truncated importance weight pi_old/pi_rollout; None: off
    skip_zero_advantage: bool = True  # drop groups whose advantages are all zero
    bf16: bool = False  # autocast forward passes (several times faster on recent CPUs and on GPUs)
    deepspeed: str | None = None  # a configs/deepspeed name (zero2, zero3, zero2_cpu, ...) or a JSON path
    lora: LoraSettings = LoraSettings()
    seed: int = 0  # RNG seed of the row shuffling


@dataclass
class Row:
    """One training row: prompt + response token ids, the advantage, and the rollout engine's log-probs."""

    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float
    rollout_logprobs: list[float]
    reward: float = 0.0
    policy_version: int = 0


def rows_from_groups(groups: list[Group], *, skip_zero_advantage: bool = True) -> list[Row]:
    """Flatten groups into rows (zero-variance groups are dropped when ``skip_zero_advantage``)."""
    rows = []
    for group in groups:
        if skip_zero_advantage and all(s.advantage == 0.0 for s in group.samples):
            continue
        for s in group.samples:
            if not s.response_ids:
                continue
            rows.append(
                Row(
                    list(group.prompt_ids),
                    list(s.response_ids),
                    s.advantage,
                    list(s.rollout_logprobs),
                    s.reward,
                    s.policy_version,
                )
            )
    return rows


@dataclass
class _Batch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor  # over next-token positions [B, T-1]
    advantages: torch.Tensor
    rollout_logprobs: torch.Tensor
    has_rollout_logprobs: bool


def _collate(rows: list[Row], pad_id: int, device: torch.device) -> _Batch:
    lengths = [len(r.prompt_ids) + len(r.response_ids) for r in rows]
    width = max(lengths)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    resp = torch.zeros((len(rows), width - 1), dtype=torch.float32)
    roll = torch.zeros((len(rows), width - 1), dtype=torch.float32)
    for i, r in enumerate(rows):
        seq = r.prompt_ids + r.response_ids
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        start = len(r.prompt_ids) - 1  # position t predicts token t + 1
        resp[i, start : start + len(r.response_ids)] = 1.0
        if r.rollout_logprobs:
            roll[i, start : start + len(r.response_ids)] = torch.tensor(r.rollout_logprobs)
    adv = torch.tensor([r.advantage for r in rows], dtype=torch.float32)
    has_roll = all(bool(r.rollout_logprobs) for r in rows)
    return _Batch(ids.to(device), attn.to(device), resp.to(device), adv.to(device), roll.to(device), has_roll)


def make_accelerator(cfg: GroupTrainerConfig) -> Any:
    """The accelerator of a group-trainer run: plain (DDP under torchrun) or DeepSpeed ZeRO from ``cfg.deepspeed``.

    With no dataloader to infer them from, DeepSpeed's "auto" sizes are filled in here: one row per micro-batch and
    ``micro_batches`` accumulation steps (the trainer normalises its losses itself, so the row count is nominal).
    """
    from accelerate import Accelerator, DeepSpeedPlugin

    from data.config import resolve_deepspeed_config

    mixed = "bf16" if cfg.bf16 else "no"
    if cfg.deepspeed is None:
        return Accelerator(
            cpu=not torch.cuda.is_available(), mixed_precision=mixed, gradient_accumulation_steps=cfg.micro_batches
        )
    ds = json.loads(resolve_deepspeed_config(cfg.deepspeed).read_text())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    ds.update(
        train_micro_batch_size_per_gpu=1,
        gradient_accumulation_steps=cfg.micro_batches,
        train_batch_size=cfg.micro_batches * world,
        gradient_clipping=cfg.max_grad_norm,
    )
    plugin = DeepSpeedPlugin(hf_ds_config=ds)
    if not torch.cuda.is_available():
        # accelerate only pairs DeepSpeed with a GPU backend; on CPU (DS_ACCELERATOR=cpu) it must be told to use
        # DeepSpeed and gloo explicitly, before its shared state is first created.
        from accelerate import PartialState

        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        PartialState(backend="gloo")
    return Accelerator(deepspeed_plugin=plugin, mixed_precision=mixed, gradient_accumulation_steps=cfg.micro_batches)


class GroupTrainer:
    """Clipped-surrogate updates on groups; owns the policy, optimizer and scheduler (see module docstring)."""

    def __init__(self, policy: PolicySpec, cfg: GroupTrainerConfig, *, accelerator: Any = None) -> None:
        self.cfg = cfg
        self.accelerator = accelerator or make_accelerator(cfg)
        if self.accelerator.gradient_accumulation_steps != cfg.micro_batches:
            raise ValueError(
                f"the accelerator accumulates {self.accelerator.gradient_accumulation_steps} steps but "
                f"micro_batches is {cfg.micro_batches}"
            )
        model, self.tokenizer = load_policy(policy, cfg.lora)
        self.is_peft = hasattr(model, "disable_adapter")
        self._frozen_reference = None
        if cfg.kl_coef and not self.is_peft:
            self._frozen_reference, _ = load_policy(
                policy.model_copy(update={"adapter": None}), LoraSettings(enabled=False), trainable=False
            )
            self._frozen_reference.eval().requires_grad_(False)
            self._frozen_reference.to(self.accelerator.device)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.adam_betas)
        warmup = max(cfg.warmup_steps, 0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
        )
        self.model, self.optimizer, self.scheduler = self.accelerator.prepare(model, optimizer, scheduler)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.version = 0
        self.updates = 0
        self._rng = random.Random(cfg.seed)

    # ----------------------------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Where this process computes."""
        return self.accelerator.device

    def _shard(self, rows: list[Row]) -> list[Row]:
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        return rows[rank::world]

    def _micro(self, rows: list[Row]) -> list[list[Row]]:
        k = self.cfg.micro_batches
        size = math.ceil(len(rows) / k) if rows else 0
        return [rows[i * size : (i + 1) * size] for i in range(k)]

    def _global_sum(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        return (
            float(self.accelerator.reduce(t, reduction="sum").item()) if self.accelerator.num_processes > 1 else value
        )

    @torch.no_grad()
    def _score(self, rows: list[Row], *, reference: bool) -> list[torch.Tensor]:
        """Per-row log-probs of the response tokens under the current (or reference) weights."""
        out = []
        model = self.model
        for chunk in [rows[i : i + 16] for i in range(0, len(rows), 16)]:
            batch = _collate(chunk, self.pad_id, self.device)
            with self.accelerator.autocast():
                if reference and self.is_peft:
                    with self.accelerator.unwrap_model(model).disable_adapter():
                        lp, _ = response_logprobs(model, batch.input_ids, batch.attention_mask)
                elif reference:
                    lp, _ = response_logprobs(self._frozen_reference, batch.input_ids, batch.attention_mask)
                else:
                    lp, _ = response_logprobs(model, batch.input_ids, batch.attention_mask)
            for i, row in enumerate(chunk):
                out.append(lp[i, : len(row.prompt_ids) + len(row.response_ids) - 1].float().cpu())
        return out

    def step(self, groups: list[Group]) -> dict[str, float]:
        """One policy update on ``groups``; returns the step's metrics (identical on every process)."""
        cfg = self.cfg
        start = time.perf_counter()
        all_rows = rows_from_groups(groups, skip_zero_advantage=cfg.skip_zero_advantage)
        # A one-sample group (flat mode, Phase 2 follow-ups) carries an advantage computed elsewhere: it has no
        # variance to speak of, so the fraction is over groups of two or more and zero advantages are counted apart.
        siblings = [g for g in groups if len(g.samples) > 1]
        samples = [s for g in groups for s in g.samples]
        metrics: dict[str, float] = {
            "groups": float(len(groups)),
            "single_sample_groups": float(len(groups) - len(siblings)),
            "zero_advantage_sample_fraction": sum(abs(s.advantage) <= 1e-12 for s in samples) / max(len(samples), 1),
            "rows": float(len(all_rows)),
        }
        if siblings:
            metrics["zero_variance_group_fraction"] = sum(g.zero_variance for g in siblings) / len(siblings)
        rewards = [s.reward for g in groups for s in g.samples]
        if rewards:
            mean = sum(rewards) / len(rewards)
            metrics["reward_mean"] = mean
            metrics["reward_std"] = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        advs = [r.advantage for r in all_rows]
        if advs:
            metrics.update(
                advantage_mean=sum(advs) / len(advs),
                advantage_min=min(advs),
                advantage_max=max(advs),
                advantage_abs_mean=sum(abs(a) for a in advs) / len(advs),
            )
        if not all_rows:
            metrics["skipped"] = 1.0
            return metrics
        # pi_old and pi_ref without dropout: with it, the ratio would differ from 1 before any update
        self.model.eval()
        order = list(range(len(all_rows)))
        old = dict(zip(order, self._score(all_rows, reference=False), strict=True))
        ref = dict(zip(order, self._score(all_rows, reference=True), strict=True)) if cfg.kl_coef else None
        self.model.train()
        gaps = [
            (
                old[i][len(r.prompt_ids) - 1 : len(r.prompt_ids) - 1 + len(r.response_ids)]
                - torch.tensor(r.rollout_logprobs)
            )
            .abs()
            .mean()
            .item()
            for i, r in enumerate(all_rows)
            if r.rollout_logprobs
        ]
        if gaps:
            metrics["train_rollout_logprob_gap"] = sum(gaps) / len(gaps)
        sums = {"loss": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0, "kl_ref": 0.0, "entropy": 0.0, "grad_norm": 0.0}
        n_micro = n_steps = 0
        tokens = 0
        for _ in range(cfg.update_epochs):
            self._rng.shuffle(order)
            per_step = math.ceil(len(order) / cfg.optimizer_steps_per_epoch)
            for s in range(cfg.optimizer_steps_per_epoch):
                step_ids = order[s * per_step : (s + 1) * per_step]
                if not step_ids:
                    continue
                step_rows = [all_rows[i] for i in step_ids]
                total_tokens = sum(len(r.response_ids) for r in step_rows)
                norm = float(total_tokens) if cfg.aggregation == "token-mean" else float(len(step_rows))
                mine = self._shard(step_ids)
                for micro_ids in self._micro(mine):
                    dummy = not micro_ids
                    ids = micro_ids or [step_ids[0]]
                    rows = [all_rows[i] for i in ids]
                    batch = _collate(rows, self.pad_id, self.device)
                    mask = batch.response_mask * (0.0 if dummy else 1.0)
                    old_lp = torch.zeros_like(mask)
                    ref_lp = torch.zeros_like(mask) if ref is not None else None
                    for j, i in enumerate(ids):
                        old_lp[j, : old[i].shape[0]] = old[i].to(self.device)
                        if ref_lp is not None:
                            ref_lp[j, : ref[i].shape[0]] = ref[i].to(self.device)
                    with self.accelerator.accumulate(self.model):
                        with self.accelerator.autocast():
                            lp, ent = response_logprobs(
                                self.model, batch.input_ids, batch.attention_mask, with_entropy=True
                            )
                        out = clipped_surrogate(
                            lp,
                            old_lp,
                            batch.advantages,
                            mask,
                            clip_low=cfg.clip_low,
                            clip_high=cfg.clip_high,
                            aggregation=cfg.aggregation,
                            ref_logprobs=ref_lp,
                            kl_coef=cfg.kl_coef,
                            rollout_logprobs=batch.rollout_logprobs if batch.has_rollout_logprobs else None,
                            tis_cap=cfg.tis_cap,
                            normalizer=norm,
                        )
                        # accelerate divides by the accumulation steps and DP averages over processes: undo both so
                        # the update is the global token (or sequence) mean of the optimizer step.
                        scale = self.accelerator.gradient_accumulation_steps * self.accelerator.num_processes
                        self.accelerator.backward(out.loss * scale)
                        if self.accelerator.sync_gradients:
                            grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                            sums["grad_norm"] += float(grad_norm) if grad_norm is not None else 0.0
                            n_steps += 1
                        self.optimizer.step()
                        self.scheduler.step()
                        self.optimizer.zero_grad()
                    if not dummy:
                        n_micro += 1
                        sums["loss"] += float(out.loss.detach())
                        sums["clip_fraction"] += out.clip_fraction
                        sums["approx_kl"] += out.approx_kl_old
                        sums["kl_ref"] += out.kl_ref
                        sums["entropy"] += float((ent * batch.response_mask).sum() / batch.response_mask.sum())
                        tokens += int(batch.response_mask.sum())
        self.updates += n_steps
        self.version += 1
        for key in ("clip_fraction", "approx_kl", "kl_ref", "entropy"):
            metrics[key] = self._global_sum(sums[key]) / max(self._global_sum(n_micro), 1)
        metrics["loss"] = self._global_sum(sums["loss"]) / max(n_steps, 1)
        metrics["grad_norm"] = sums["grad_norm"] / max(n_steps, 1)
        metrics["response_length"] = sum(len(r.response_ids) for r in all_rows) / len(all_rows)
        elapsed = time.perf_counter() - start
        metrics["train_tokens_per_s"] = self._global_sum(tokens) / max(elapsed, 1e-9)
        metrics["lr"] = float(self.scheduler.get_last_lr()[0])
        metrics["policy_version"] = float(self.version)
        return metrics

    # ----------------------------------------------------------------------------------------------------------
    def rng_state(self) -> Any:
        """The state of the row-shuffling generator (saved in checkpoints)."""
        return self._rng.getstate()

    def set_rng_state(self, state: Any) -> None:
        """Restore :meth:`rng_state` (JSON-loaded lists are turned back into the tuples ``random`` expects)."""

        def as_tuple(x: Any) -> Any:
            return tuple(as_tuple(v) for v in x) if isinstance(x, list) else x

        self._rng.setstate(as_tuple(state))

    def save_policy(self, out_dir: str) -> str:
        """Save the adapter (LoRA) or the full weights as safetensors for the rollout engine and for export."""
        unwrapped = self.accelerator.unwrap_model(self.model)
        state = self.accelerator.get_state_dict(self.model)
        if self.accelerator.is_main_process:
            save_policy(unwrapped, out_dir, self.tokenizer if not self.is_peft else None, state_dict=state)
        self.accelerator.wait_for_everyone()
        return out_dir
