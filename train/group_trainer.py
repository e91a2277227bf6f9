"""The group policy-gradient trainer shared by OAT-GRPO and pivot-turn GRPO.

It consumes :class:`memrl.data.schemas.Group` s: each sample becomes a row (:mod:`memrl.train.rows`: shared prompt ids
+ response ids, the group advantage, the rollout engine's log-probs). Before the update the trainer recomputes the old
log-probs (and the KL reference's) with the current weights; then it runs ``update_epochs`` passes of
``optimizer_steps_per_epoch`` optimizer steps, minimising :func:`memrl.train.surrogate.surrogate_loss` (the loss that
runs).

Memory scales with the response, not the context: a micro-batch is its rows packed end to end without padding
(:mod:`memrl.train.logprobs`), each row attending to itself alone through a variable-length kernel with no square mask
(:mod:`memrl.train.attention`), the LM head runs only on positions that predict response tokens, a chunk of tokens at
a time, and micro-batches are cut by a token budget (``max_tokens_per_micro_batch``) or into ``micro_batches`` row
slices.

Distributed runs (DDP or DeepSpeed ZeRO-2/3 through accelerate) split the rows across processes, balancing tokens: each
process scores pi_old / pi_ref on its own share (the per-token results, a few floats per token, are then all-gathered)
and trains on its share of each optimizer step. Every micro-batch loss is normalised by the *global* token (or
sequence) count of its optimizer step and rescaled for the accumulation and the data-parallel gradient mean, so 1
process and N processes compute the same update; the LR schedule advances once per optimizer step.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from memrl.data.config import ConfigModel
from memrl.data.schemas import Group
from memrl.train import surrogate
from memrl.train.attention import rows_can_share_a_sequence, use_packed_attention
from memrl.train.logprobs import (
    PackedBatch,
    pack_rows,
    packed_hidden_states,
    response_token_logprobs,
    token_loss_and_logprobs,
)
from memrl.train.policy import LoraSettings, PolicySpec, load_policy, save_policy
from memrl.train.precision import warn_if_cpu_bf16_slow
from memrl.train.rows import Row, advantage_shares, rows_from_groups, split_across_ranks, token_budget_bins

__all__ = [
    "GroupTrainer",
    "GroupTrainerConfig",
    "batch_metrics",
    "lr_factor",
    "make_accelerator",
    "summarize_steps",
]


class GroupTrainerConfig(ConfigModel):
    """Optimisation settings of the group trainer."""

    lr: float = Field(1e-5, ge=0, le=1)  # AdamW learning rate (0: the no-update control of the ablations)
    weight_decay: float = Field(0.0, ge=0, le=1)  # AdamW weight decay
    adam_betas: tuple[float, float] = (0.9, 0.999)  # AdamW (beta1, beta2)
    max_grad_norm: float = Field(1.0, gt=0, le=1e12)  # gradient-norm clipping threshold
    warmup_steps: int = Field(0, ge=0, le=10**7)  # linear LR warmup, in optimizer steps (0: none)
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"  # after warmup: constant, or a decay
    lr_decay_steps: int | None = Field(None, ge=1, le=10**7)  # optimizer steps of the decay (then held at its floor)
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0)  # the decay's floor, as a fraction of lr
    # the first update's rows are a fixed probe; their tokens were sampled by the initial policy, so the k3 estimate
    # of KL(pi_initial || pi_theta) on them is unbiased
    probe_rows: int = Field(32, ge=0, le=10**5)  # rows of the KL-to-initial probe logged as kl_initial_probe (0: off)
    # re-scoring the probe is a forward over its rows: after every this many updates (and at an online loop's last
    # iteration) only, its cost logged as kl_probe_s
    probe_every: int = Field(10, ge=1, le=10**6)  # updates between two KL-to-initial probes
    # 2 x 2 optimizer steps per batch (the old default, 1 x 1, stays selectable): one step per batch
    # never moves the policy away from pi_old inside an update, so approx_kl read ~1e-14 and clip_fraction 0
    update_epochs: int = Field(2, ge=1, le=1000)  # passes over each update's rows
    optimizer_steps_per_epoch: int = Field(2, ge=1, le=10**4)  # optimizer steps each pass is split into
    # per process and optimizer step (gradient accumulation) when max_tokens_per_micro_batch is None; with a token
    # budget, the DeepSpeed accumulation count it is configured with
    micro_batches: int = Field(1, ge=1, le=10**4)
    # token budget of a micro-batch: rows packed without padding, a row longer than the budget alone; None: split
    # each process's rows of an optimizer step into micro_batches slices
    max_tokens_per_micro_batch: int | None = Field(None, ge=1, le=10**8)
    logit_chunk_tokens: int = Field(256, ge=1, le=10**7)  # response positions with full-vocabulary logits at once
    log_entropy: bool = True  # compute the policy entropy over response tokens (a metric only)
    gradient_checkpointing: bool = False  # recompute the layers' activations in backward (long contexts on GPU)
    clip_low: float = Field(0.2, ge=0, lt=1)  # eps_low: ratio clipped below at 1 - clip_low
    clip_high: float = Field(0.2, ge=0, le=100)  # eps_high: ratio clipped above at 1 + clip_high
    aggregation: surrogate.Aggregation = "token-mean"  # loss mean over all response tokens, or per sequence first
    kl_coef: float = Field(0.0, ge=0, le=1e3)  # beta: weight of the k3 KL to the reference model; 0: off
    # the KL reference: "initial" is the model RL starts from (a LoRA run from an SFT adapter: a frozen copy with
    # policy.adapter merged; a fresh LoRA: its adapter switched off); "initial-adapter" the same model as a frozen
    # second adapter beside the trained one (no second copy of the base); "base" is policy.base itself
    kl_reference: Literal["initial", "initial-adapter", "base"] = "initial"
    tis_cap: float | None = Field(None, gt=0, le=1e6)  # cap of the truncated importance weight pi_old/pi_rollout
    skip_zero_advantage: bool = True  # drop groups whose advantages are all zero
    bf16: bool = False  # autocast forward passes (faster on GPUs and CPUs with native bf16; memrl warns on others)
    deepspeed: str | None = None  # a configs/deepspeed name (zero2, zero3, zero2_cpu, ...) or a JSON path
    lora: LoraSettings = LoraSettings()
    seed: int = Field(0, ge=0, lt=2**32)  # RNG seed of the row shuffling and of a fresh LoRA adapter's init

    @model_validator(mode="after")
    def _decay_has_a_length(self) -> GroupTrainerConfig:
        if self.lr_schedule != "constant" and self.lr_decay_steps is None:
            raise ValueError(f"lr_schedule={self.lr_schedule!r} decays over lr_decay_steps optimizer steps: set it")
        return self


def lr_factor(step: int, cfg: GroupTrainerConfig) -> float:
    """The multiplier of ``cfg.lr`` at optimizer step ``step`` (0-based): linear warmup, then the schedule."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant" or cfg.lr_decay_steps is None:
        return 1.0
    progress = min((step - cfg.warmup_steps) / cfg.lr_decay_steps, 1.0)
    shape = 1.0 - progress if cfg.lr_schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def batch_metrics(groups: list[Group], rows: list[Row]) -> dict[str, Any]:
    """What an update is given: groups, rows, rewards, and the advantages of the rows it trains on.

    ``zero_variance_group_fraction`` counts sibling groups whose rewards r tie (the outcome ties, a stricter count,
    come from credit assignment); a one-sample group (flat mode, Phase 2 follow-ups) carries an advantage computed
    elsewhere, so the fraction is over groups of two or more and zero advantages are counted apart.
    ``advantage_mean`` is over trained rows: non-zero when the batch pushes the policy down more than up. Where the
    advantage comes from (outcome-tied groups, identical rows): :func:`memrl.train.rows.advantage_shares`."""
    siblings = [g for g in groups if len(g.samples) > 1]
    samples = [s for g in groups for s in g.samples]
    metrics: dict[str, Any] = {
        "groups": float(len(groups)),
        "single_sample_groups": float(len(groups) - len(siblings)),
        "zero_advantage_sample_fraction": sum(abs(s.advantage) <= 1e-12 for s in samples) / max(len(samples), 1),
        "rows": float(len(rows)),
        "trained_tokens": float(sum(len(r.response_ids) for r in rows)),
    }
    if siblings:
        metrics["zero_variance_group_fraction"] = sum(g.zero_variance for g in siblings) / len(siblings)
    if rewards := [s.reward for s in samples]:
        mean = sum(rewards) / len(rewards)
        metrics["reward_mean"] = mean
        metrics["reward_std"] = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    metrics.update(advantage_shares(rows))
    if advs := [r.advantage for r in rows]:
        metrics.update(
            advantage_mean=sum(advs) / len(advs),
            advantage_min=min(advs),
            advantage_max=max(advs),
            advantage_abs_mean=sum(abs(a) for a in advs) / len(advs),
        )
    return metrics


def summarize_steps(steps: list[dict[str, float]], *, log_entropy: bool) -> dict[str, float]:
    """An update's diagnostics over its optimizer steps: token-weighted means, the largest approx_kl and clip
    fraction of any step, and the ratio range over all of them."""
    tokens = max(sum(d["tokens"] for d in steps), 1.0)
    out = {
        key: sum(d[key] * d["tokens"] for d in steps) / tokens
        for key in ("approx_kl", "clip_fraction", "kl_ref") + (("entropy",) if log_entropy else ())
    }
    out.update(
        approx_kl_max=max((d["approx_kl"] for d in steps), default=0.0),
        clip_fraction_max=max((d["clip_fraction"] for d in steps), default=0.0),
        ratio_min=min((d["ratio_min"] for d in steps), default=1.0),
        ratio_max=max((d["ratio_max"] for d in steps), default=1.0),
        loss=sum(d["loss"] for d in steps) / max(len(steps), 1),
        grad_norm=sum(d["grad_norm"] for d in steps) / max(len(steps), 1),
        optimizer_step_count=float(len(steps)),
    )
    return out


@dataclass
class _MicroBatch:
    """A micro-batch's packed rows and what its loss compares their log-probs with (flat over response tokens)."""

    batch: PackedBatch
    old_logprobs: torch.Tensor
    advantages: torch.Tensor  # A_i of each token's row
    row_lengths: torch.Tensor  # |y_i| of each token's row
    ref_logprobs: torch.Tensor | None
    rollout_logprobs: torch.Tensor | None
    padding: bool  # an empty micro-batch run for the collectives: its loss is multiplied by 0

    def terms(
        self, cfg: GroupTrainerConfig, normalizer: float, logprobs: torch.Tensor, sl: slice = slice(None)
    ) -> surrogate.SurrogateTerms:
        """:func:`memrl.train.surrogate.surrogate_loss` for the tokens ``sl`` of this micro-batch."""
        return surrogate.surrogate_loss(
            logprobs,
            self.old_logprobs[sl],
            self.advantages[sl],
            self.row_lengths[sl],
            aggregation=cfg.aggregation,
            normalizer=normalizer,
            clip_low=cfg.clip_low,
            clip_high=cfg.clip_high,
            ref_logprobs=self.ref_logprobs[sl] if self.ref_logprobs is not None else None,
            kl_coef=cfg.kl_coef,
            rollout_logprobs=self.rollout_logprobs[sl] if self.rollout_logprobs is not None else None,
            tis_cap=cfg.tis_cap,
        )


def skip_deepspeed_shm_op() -> None:
    """Keep DeepSpeed's CPU backend from compiling its shared-memory all-reduce op.

    On CPU, DeepSpeed's torch backend JIT-builds ``deepspeed_shm_comm`` as it starts (one to two minutes of C++ on
    two cores, again whenever another interpreter's build replaced the cached one). Only DeepSpeed's inference
    all-reduce uses that op; ZeRO training reduces through the gloo process group, so the op is marked unavailable.
    """
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def make_accelerator(cfg: GroupTrainerConfig) -> Any:
    """The accelerator of a group-trainer run: plain (DDP under torchrun) or DeepSpeed ZeRO from ``cfg.deepspeed``.

    With no dataloader to infer them from, DeepSpeed's "auto" sizes are filled in here: one row per micro-batch and
    ``micro_batches`` accumulation steps (the trainer normalises its losses itself, so the row count is nominal).
    """
    from accelerate import Accelerator, DeepSpeedPlugin

    from memrl.data.config import resolve_deepspeed_config

    mixed = "bf16" if cfg.bf16 else "no"
    if cfg.bf16:
        warn_if_cpu_bf16_slow("trainer.bf16")
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

        skip_deepspeed_shm_op()
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
        model, self.tokenizer = load_policy(policy, cfg.lora, init_seed=cfg.seed)
        self.packs_rows = rows_can_share_a_sequence(model.config)
        use_packed_attention(model)
        self.is_peft = hasattr(model, "disable_adapter")
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # pi_ref (kl_reference): a LoRA policy's own adapter switched off when that gives it exactly (a fresh LoRA, or
        # "base"); the SFT adapter as a frozen second adapter ("initial-adapter"); otherwise a frozen copy (full
        # weights, or the SFT adapter merged into the base for "initial").
        self._frozen_reference = None
        self._reference_adapter: str | None = None
        from_adapter = self.is_peft and policy.adapter is not None and cfg.kl_reference == "initial"
        if cfg.kl_coef and self.is_peft and policy.adapter is not None and cfg.kl_reference == "initial-adapter":
            self._reference_adapter = "reference"
            model.load_adapter(policy.adapter, adapter_name=self._reference_adapter, is_trainable=False)
        elif cfg.kl_coef and (not self.is_peft or from_adapter):
            reference, _ = load_policy(
                policy if from_adapter else policy.model_copy(update={"adapter": None}),
                LoraSettings(enabled=False),
                trainable=False,
            )
            if from_adapter:
                reference = reference.merge_and_unload()
            self._frozen_reference = reference.eval().requires_grad_(False).to(self.accelerator.device)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.adam_betas)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        # Not prepared: accelerate's scheduler wrapper steps once per process under DDP; this one is stepped once per
        # optimizer step, and checkpointed with the accelerator state.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))
        self.accelerator.register_for_checkpointing(self.scheduler)
        self.version = 0
        self.updates = 0
        self.scored_rows = 0  # rows this process scored in the last step (pi_old; pi_ref scores the same rows)
        self._rng = random.Random(cfg.seed)
        self._probe: list[Row] = []  # the fixed probe rows and their log-probs under the initial policy
        self._probe_initial: list[torch.Tensor] = []

    # ----------------------------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Where this process computes."""
        return self.accelerator.device

    def _head(self, model: Any) -> torch.nn.Module:
        return self.accelerator.unwrap_model(model).get_output_embeddings()

    def _micro_batches(self, ids: list[int], rows: list[Row]) -> list[list[list[int]]]:
        """For every process, its micro-batches of ``ids`` (balanced shares; budget bins or ``micro_batches`` slices,
        one row each for a model whose rows cannot share a packed sequence), padded with empty micro-batches to the
        same count on every process (collectives run in every forward)."""
        lengths = [len(r) for r in rows]
        shares = split_across_ranks(ids, lengths, self.accelerator.num_processes)
        budget = self.cfg.max_tokens_per_micro_batch
        if budget is not None:
            per_rank = [token_budget_bins(share, lengths, budget) for share in shares]
        else:
            k = self.cfg.micro_batches
            per_rank = []
            for share in shares:
                size = math.ceil(len(share) / k) if share else 0
                per_rank.append([share[i * size : (i + 1) * size] for i in range(k)])
        if not self.packs_rows:  # a recurrent layer would carry one row's state into the next: one row per forward
            per_rank = [[[i] for micro in micros for i in micro] for micros in per_rank]
        count = max(len(m) for m in per_rank)
        return [m + [[]] * (count - len(m)) for m in per_rank]

    def _global_sum(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        return (
            float(self.accelerator.reduce(t, reduction="sum").item()) if self.accelerator.num_processes > 1 else value
        )

    @torch.no_grad()
    def _score(self, rows: list[Row], *, reference: bool) -> list[torch.Tensor]:
        """Per-row log-probs of the response tokens under the current (or reference) weights.

        Each process scores its own share of ``rows`` in the update's micro-batches; the results are all-gathered.
        """
        mine = self._micro_batches(list(range(len(rows))), rows)[self.accelerator.process_index]
        shortest = min(range(len(rows)), key=lambda i: len(rows[i]))
        if reference and self._frozen_reference is not None:
            model: Any = self._frozen_reference
        else:
            model = self.model
        head = self._head(model)
        scored: dict[int, torch.Tensor] = {}
        for micro in mine:
            ids = micro or [shortest]  # an empty micro-batch still runs a forward: ZeRO-3 gathers in every one
            batch = pack_rows([(rows[i].prompt_ids, rows[i].response_ids) for i in ids], self.device)
            with self.accelerator.autocast():
                if reference and self._reference_adapter is not None:
                    hidden = packed_hidden_states(model, head, batch, adapter_names=[self._reference_adapter])
                elif reference and self._frozen_reference is None:
                    with self.accelerator.unwrap_model(model).disable_adapter():
                        hidden = packed_hidden_states(model, head, batch)
                else:
                    hidden = packed_hidden_states(model, head, batch)
                lp, _ = response_token_logprobs(hidden, head, batch.targets, chunk_tokens=self.cfg.logit_chunk_tokens)
            if micro:
                for i, part in zip(ids, lp.float().cpu().split(batch.response_lengths), strict=True):
                    scored[i] = part
        self.scored_rows = sum(len(m) for m in mine)
        if self.accelerator.num_processes > 1:
            shares: list[Any] = [None] * self.accelerator.num_processes
            torch.distributed.all_gather_object(shares, scored)
            scored = {i: lp for share in shares for i, lp in share.items()}
        return [scored[i] for i in range(len(rows))]

    def _loss_scale(self, n_micro: int) -> float:
        """What undoes the accumulation divisor and the data-parallel mean, so a micro-batch's gradient is that of
        its share of the optimizer step's global token (or sequence) mean."""
        from accelerate.utils import DistributedType

        if self.accelerator.distributed_type == DistributedType.DEEPSPEED:
            divisor = self.model.gradient_accumulation_steps()  # DeepSpeed divides by its configured count
        else:
            divisor = n_micro
        return float(divisor * self.accelerator.num_processes)

    def step(self, groups: list[Group], *, probe: bool | None = None) -> dict[str, Any]:
        """One policy update on ``groups``: score pi_old (and pi_ref), then ``update_epochs`` passes of
        ``optimizer_steps_per_epoch`` optimizer steps over shuffled rows. Returns the update's metrics (identical on
        every process); ``optimizer_steps`` lists each step's diagnostics against the batch's pi_old. The KL probe
        (``kl_initial_probe``, with its cost ``kl_probe_s``) runs after every ``probe_every``-th update, or as
        ``probe`` says."""
        cfg = self.cfg
        start = time.perf_counter()
        rows = rows_from_groups(groups, skip_zero_advantage=cfg.skip_zero_advantage)
        metrics: dict[str, Any] = batch_metrics(groups, rows)
        if not rows:
            metrics["skipped"] = 1.0
            return metrics
        old, ref = self._score_old_and_ref(rows)
        gaps = [
            (old[i] - torch.tensor(r.rollout_logprobs)).abs().mean().item()
            for i, r in enumerate(rows)
            if r.rollout_logprobs
        ]
        if gaps:
            metrics["train_rollout_logprob_gap"] = sum(gaps) / len(gaps)
        per_step: list[dict[str, float]] = []
        order = list(range(len(rows)))
        for _ in range(cfg.update_epochs):
            self._rng.shuffle(order)
            size = math.ceil(len(order) / cfg.optimizer_steps_per_epoch)
            for s in range(cfg.optimizer_steps_per_epoch):
                if step_ids := order[s * size : (s + 1) * size]:
                    per_step.append(self._optimizer_step(step_ids, rows, old, ref))
        self.updates += len(per_step)
        self.version += 1
        if cfg.probe_rows and not self._probe:
            self._probe, self._probe_initial = rows[: cfg.probe_rows], old[: cfg.probe_rows]
        if self._probe and (probe if probe is not None else self.version % cfg.probe_every == 0):
            t_probe = time.perf_counter()
            metrics["kl_initial_probe"] = self.probe_kl()
            metrics["kl_probe_s"] = time.perf_counter() - t_probe
        metrics.update(summarize_steps(per_step, log_entropy=cfg.log_entropy))
        metrics["optimizer_steps"] = per_step
        metrics["response_length"] = sum(len(r.response_ids) for r in rows) / len(rows)
        metrics["train_tokens_per_s"] = sum(d["tokens"] for d in per_step) / max(time.perf_counter() - start, 1e-9)
        metrics["lr"] = float(self.scheduler.get_last_lr()[0])
        metrics["policy_version"] = float(self.version)
        return metrics

    def probe_kl(self) -> float:
        """KL(pi_initial || pi_theta) per token on the fixed probe rows: the k3 estimate e^r - r - 1 with
        r = log pi_theta - log pi_initial, over tokens the initial policy sampled. The probe is fixed at the run's
        first update and travels in checkpoints (:meth:`probe_state`), so after a resume it still measures the
        distance to the policy the run started from."""
        scored_rows = self.scored_rows  # what the update scored, not the probe
        self.model.eval()
        now = self._score(self._probe, reference=False)
        self.model.train()
        self.scored_rows = scored_rows
        r = torch.cat(now) - torch.cat(self._probe_initial)
        return float((torch.exp(r) - r - 1.0).mean())

    def logprobs_of(self, pairs: list[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
        """The current policy's log-probs of each ``(prompt ids, response ids)`` pair's response tokens, without
        dropout, as an update scores them (the weight-sync check, memrl.train.weight_sync; every process calls it)."""
        scored_rows, training = self.scored_rows, self.model.training
        self.model.eval()
        try:
            return self._score([Row(list(p), list(r), 0.0, []) for p, r in pairs], reference=False)
        finally:
            self.model.train(training)
            self.scored_rows = scored_rows

    def _score_old_and_ref(self, rows: list[Row]) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """pi_old (and pi_ref when the KL term is on) of every row, without dropout: with it, the ratio would
        differ from 1 before any update."""
        self.model.eval()
        old = self._score(rows, reference=False)
        ref = self._score(rows, reference=True) if self.cfg.kl_coef else None
        self.model.train()
        return old, ref

    def _micro_batch(
        self, ids: list[int], rows: list[Row], old: list[torch.Tensor], ref: list[torch.Tensor] | None, padding: bool
    ) -> _MicroBatch:
        """Pack rows ``ids`` with their per-token targets."""
        picked = [rows[i] for i in ids]
        batch = pack_rows([(r.prompt_ids, r.response_ids) for r in picked], self.device)
        with_rollout = all(bool(r.rollout_logprobs) for r in picked)
        return _MicroBatch(
            batch=batch,
            old_logprobs=torch.cat([old[i] for i in ids]).to(self.device),
            advantages=torch.tensor([r.advantage for r in picked], device=self.device)[batch.token_row],
            row_lengths=torch.tensor(batch.response_lengths, device=self.device)[batch.token_row],
            ref_logprobs=torch.cat([ref[i] for i in ids]).to(self.device) if ref is not None else None,
            rollout_logprobs=torch.tensor([x for r in picked for x in r.rollout_logprobs], device=self.device)
            if with_rollout
            else None,
            padding=padding,
        )

    def _optimizer_step(
        self, step_ids: list[int], rows: list[Row], old: list[torch.Tensor], ref: list[torch.Tensor] | None
    ) -> dict[str, float]:
        """Accumulate the gradient of this process's micro-batches of ``step_ids``, then one optimizer step.

        Returns the step's diagnostics over every process: the loss, approx_kl / clip fraction / ratio range of
        the log-probs the step's forward saw against pi_old (0 and 1 on the first step of an update, moved after),
        the KL to the reference, entropy, gradient norm and trained tokens."""
        cfg = self.cfg
        step_rows = [rows[i] for i in step_ids]
        normalizer = float(
            sum(len(r.response_ids) for r in step_rows) if cfg.aggregation == "token-mean" else len(step_rows)
        )
        micro_batches = self._micro_batches(step_ids, rows)[self.accelerator.process_index]
        # accumulate exactly this step's micro-batches (their count can differ from step to step): accelerate syncs
        # gradients when its micro-step counter reaches the accumulation count
        self.accelerator.gradient_accumulation_steps = len(micro_batches)
        self.accelerator.step = 0
        scale = self._loss_scale(len(micro_batches))
        shortest = min(step_ids, key=lambda i: len(rows[i]))
        sums = dict.fromkeys(("loss", "clipped", "approx_kl", "kl_ref", "entropy", "tokens"), 0.0)
        ratio_min, ratio_max, grad_norm = math.inf, -math.inf, 0.0
        for ids in micro_batches:
            micro = self._micro_batch(ids or [shortest], rows, old, ref, padding=not ids)
            with self.accelerator.accumulate(self.model):
                loss, logprobs, entropy = self._micro_batch_loss(micro, normalizer)
                self.accelerator.backward(loss * scale)
                if self.accelerator.sync_gradients:
                    norm = self.accelerator.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                    grad_norm = float(norm) if norm is not None else 0.0
                self.optimizer.step()
                if self.accelerator.sync_gradients:
                    self.scheduler.step()
                self.optimizer.zero_grad()
            if micro.padding:
                continue
            with torch.no_grad():
                terms = micro.terms(cfg, normalizer, logprobs)
            sums["loss"] += float(loss.detach())
            sums["clipped"] += float(terms.was_clipped.sum())
            sums["approx_kl"] += float(terms.approx_kl.sum())
            sums["kl_ref"] += float(terms.kl.sum()) if terms.kl is not None else 0.0
            sums["entropy"] += float(entropy.sum()) if entropy is not None else 0.0
            sums["tokens"] += float(logprobs.numel())
            ratio_min = min(ratio_min, float(terms.log_ratio.min().exp()))
            ratio_max = max(ratio_max, float(terms.log_ratio.max().exp()))
        totals = {k: self._global_sum(v) for k, v in sums.items()}
        tokens = max(totals["tokens"], 1.0)
        return {
            "loss": totals["loss"],
            "approx_kl": totals["approx_kl"] / tokens,
            "clip_fraction": totals["clipped"] / tokens,
            "kl_ref": totals["kl_ref"] / tokens,
            "entropy": totals["entropy"] / tokens,
            "ratio_min": self._global_extreme(ratio_min, "min"),
            "ratio_max": self._global_extreme(ratio_max, "max"),
            "grad_norm": grad_norm,
            "tokens": totals["tokens"],
            "rows": float(len(step_rows)),
        }

    def _micro_batch_loss(self, micro: _MicroBatch, normalizer: float) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """(this micro-batch's share of the step's loss, its detached log-probs, entropies or None): the loss is the
        sum of :func:`memrl.train.surrogate.surrogate_loss`'s summands, computed chunk by chunk with the LM head."""
        cfg = self.cfg
        weight = 0.0 if micro.padding else 1.0  # a padding micro-batch runs forward and backward with no effect

        def token_loss(logprobs: torch.Tensor, sl: slice) -> torch.Tensor:
            return micro.terms(cfg, normalizer, logprobs, sl).weighted * weight

        with self.accelerator.autocast():
            hidden = packed_hidden_states(self.model, self._head(self.model), micro.batch)
            return token_loss_and_logprobs(
                hidden,
                self._head(self.model),
                micro.batch.targets,
                token_loss,
                chunk_tokens=cfg.logit_chunk_tokens,
                with_entropy=cfg.log_entropy and not micro.padding,
            )

    def _global_extreme(self, value: float, how: Literal["min", "max"]) -> float:
        """The min or max of ``value`` over processes (a process with no tokens reports +-inf)."""
        if self.accelerator.num_processes == 1:
            return value
        gathered = self.accelerator.gather(torch.tensor([value], dtype=torch.float64, device=self.device))
        return float(gathered.max() if how == "max" else gathered.min())

    # ----------------------------------------------------------------------------------------------------------
    def rng_state(self) -> Any:
        """The state of the row-shuffling generator (saved in checkpoints)."""
        return self._rng.getstate()

    def set_rng_state(self, state: Any) -> None:
        """Restore :meth:`rng_state` (JSON-loaded lists are turned back into the tuples ``random`` expects)."""

        def as_tuple(x: Any) -> Any:
            return tuple(as_tuple(v) for v in x) if isinstance(x, list) else x

        self._rng.setstate(as_tuple(state))

    def probe_state(self) -> dict[str, Any] | None:
        """The KL-to-initial probe for a checkpoint: its rows' token ids and their log-probs under the initial
        policy (None before the first update fixed it)."""
        if not self._probe:
            return None
        return {
            "prompt_ids": [r.prompt_ids for r in self._probe],
            "response_ids": [r.response_ids for r in self._probe],
            "initial_logprobs": [lp.tolist() for lp in self._probe_initial],
        }

    def set_probe_state(self, state: dict[str, Any] | None) -> None:
        """Restore :meth:`probe_state` (None: no probe yet; the next update fixes it)."""
        if state is None:
            self._probe, self._probe_initial = [], []
            return
        self._probe = [
            Row(list(p), list(r), 0.0, []) for p, r in zip(state["prompt_ids"], state["response_ids"], strict=True)
        ]
        self._probe_initial = [torch.tensor(lp, dtype=torch.float32) for lp in state["initial_logprobs"]]

    def save_merged_policy(self, out_dir: str) -> str:
        """Save a LoRA policy's weights with its adapter folded in, as full safetensors (a copy is merged: the
        trained base and adapter stay as they are)."""
        import copy

        if self.accelerator.is_main_process:
            unwrapped = self.accelerator.unwrap_model(self.model)
            merged = copy.deepcopy(unwrapped).merge_and_unload(adapter_names=[unwrapped.active_adapter])
            save_policy(merged, out_dir, self.tokenizer)
            del merged
        self.accelerator.wait_for_everyone()
        return out_dir

    def save_policy(self, out_dir: str) -> str:
        """Save the adapter (LoRA) or the full weights as safetensors for the rollout engine and for export."""
        unwrapped = self.accelerator.unwrap_model(self.model)
        state = self.accelerator.get_state_dict(self.model)
        if self.accelerator.is_main_process:
            save_policy(unwrapped, out_dir, self.tokenizer if not self.is_peft else None, state_dict=state)
        self.accelerator.wait_for_everyone()
        return out_dir
