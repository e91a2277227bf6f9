"""The clipped policy-gradient surrogate of the group trainer (shared by OAT-GRPO and pivot-turn GRPO).

Per response token t of sample i (paper symbols: rho = ratio, epsilon = clip range, A = group advantage):

    rho_t   = exp(log pi_theta(y_t) - log pi_old(y_t))              old = recomputed by the trainer before the update
    pg_t    = -min(rho_t * A_i, clip(rho_t, 1 - eps_low, 1 + eps_high) * A_i)
    w_t     = min(exp(log pi_old(y_t) - log pi_rollout(y_t)), tis_cap)   truncated importance sampling (optional):
              corrects for the rollout engine sampling from slightly different numbers than the trainer computes
    kl_t    = exp(r_t) - r_t - 1,  r_t = log pi_ref(y_t) - log pi_theta(y_t)   (k3 estimator, optional)
    loss_t  = w_t * pg_t + beta * kl_t

Aggregation: ``token-mean`` averages loss_t over every response token of the batch; ``sequence-mean`` averages each
sample's tokens first, then the samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

__all__ = [
    "Aggregation",
    "SurrogateOutput",
    "SurrogateTerms",
    "aggregate",
    "clipped_surrogate",
    "surrogate_terms",
    "token_weights",
]

Aggregation = Literal["token-mean", "sequence-mean"]


@dataclass
class SurrogateOutput:
    """The loss to backpropagate and detached diagnostics."""

    loss: torch.Tensor
    clip_fraction: float
    approx_kl_old: float
    kl_ref: float
    tis_weight_mean: float


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, how: Aggregation, normalizer: float | None = None
) -> torch.Tensor:
    """Reduce a [batch, tokens] tensor over the response tokens selected by ``mask``.

    ``normalizer`` replaces the batch's own token (token-mean) or sequence (sequence-mean) count: a micro-batch
    divides by the count of its whole optimizer step, so accumulated micro-batches sum to the step's mean.
    """
    mask = mask.to(per_token.dtype)
    if how == "token-mean":
        denominator = normalizer if normalizer is not None else mask.sum().clamp(min=1.0)
        return (per_token * mask).sum() / denominator
    if how == "sequence-mean":
        per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        has_tokens = (mask.sum(-1) > 0).to(per_token.dtype)
        denominator = normalizer if normalizer is not None else has_tokens.sum().clamp(min=1.0)
        return (per_seq * has_tokens).sum() / denominator
    raise ValueError(f"aggregation must be 'token-mean' or 'sequence-mean', got {how!r}")


@dataclass
class SurrogateTerms:
    """The per-token pieces of the loss: ``per_token`` (w_t * pg_t + beta * kl_t) and what the diagnostics need."""

    per_token: torch.Tensor
    was_clipped: torch.Tensor  # detached: 1 where the min picked the clipped branch
    log_ratio: torch.Tensor  # detached log pi_theta - log pi_old
    kl: torch.Tensor | None  # detached k3 KL to the reference
    tis_weight: torch.Tensor | None  # the truncated importance weight w_t


def surrogate_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    rollout_logprobs: torch.Tensor | None = None,
    tis_cap: float | None = None,
) -> SurrogateTerms:
    """loss_t of the module docstring, token by token (every argument broadcasts against ``logprobs``)."""
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    weight = None
    if tis_cap is not None and rollout_logprobs is not None:
        weight = torch.exp(old_logprobs - rollout_logprobs).clamp(max=tis_cap).detach()
        per_token = per_token * weight
    kl = None
    if ref_logprobs is not None and kl_coef:
        log_ref_ratio = ref_logprobs - logprobs
        kl = torch.exp(log_ref_ratio) - log_ref_ratio - 1.0
        per_token = per_token + kl_coef * kl
        kl = kl.detach()
    was_clipped = (clipped < unclipped).detach().to(logprobs.dtype)
    return SurrogateTerms(per_token, was_clipped, log_ratio.detach(), kl, weight)


def clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    aggregation: Aggregation = "token-mean",
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    rollout_logprobs: torch.Tensor | None = None,
    tis_cap: float | None = None,
    normalizer: float | None = None,
) -> SurrogateOutput:
    """Loss of the module docstring. Token tensors are [batch, tokens]; ``advantages`` is [batch]."""
    terms = surrogate_terms(
        logprobs,
        old_logprobs,
        advantages.unsqueeze(-1),
        clip_low=clip_low,
        clip_high=clip_high,
        ref_logprobs=ref_logprobs,
        kl_coef=kl_coef,
        rollout_logprobs=rollout_logprobs,
        tis_cap=tis_cap,
    )
    loss = aggregate(terms.per_token, mask, aggregation, normalizer)
    with torch.no_grad():
        tis_mean = float(aggregate(terms.tis_weight, mask, "token-mean")) if terms.tis_weight is not None else 1.0
        kl_value = float(aggregate(terms.kl, mask, "token-mean")) if terms.kl is not None else 0.0
        clip_fraction = float(aggregate(terms.was_clipped, mask, "token-mean"))
        approx_kl = float(aggregate(0.5 * terms.log_ratio.pow(2), mask, "token-mean"))
    return SurrogateOutput(loss, clip_fraction, approx_kl, kl_value, tis_mean)


def token_weights(
    response_lengths: list[int], aggregation: Aggregation, normalizer: float, device: torch.device | str
) -> torch.Tensor:
    """Per-token weights c_t with ``aggregate(x, mask, aggregation, normalizer) == sum_t c_t x_t`` for rows laid end to
    end (``response_lengths`` tokens each): 1 / normalizer (token-mean) or 1 / (len_i * normalizer) (sequence-mean)."""
    lengths = torch.tensor(response_lengths, dtype=torch.float32, device=device)
    if aggregation == "token-mean":
        per_row = torch.full_like(lengths, 1.0 / normalizer)
    elif aggregation == "sequence-mean":
        per_row = 1.0 / (lengths.clamp(min=1.0) * normalizer)
    else:
        raise ValueError(f"aggregation must be 'token-mean' or 'sequence-mean', got {aggregation!r}")
    return per_row.repeat_interleave(torch.tensor(response_lengths, device=device))
