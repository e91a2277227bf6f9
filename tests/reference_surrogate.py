"""A readable, padded reference of the clipped surrogate (the one the tests hold the training loss to).

Token tensors are [batch, tokens] with a mask; ``advantages`` is [batch]. Production code has one loss,
:func:`memrl.train.surrogate.surrogate_loss`, computed over packed response tokens; this one is written as the
formula reads, for comparison only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ReferenceOutput:
    """The aggregated loss and its diagnostics."""

    loss: torch.Tensor
    clip_fraction: float
    approx_kl_old: float
    kl_ref: float
    tis_weight_mean: float


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, how: str, normalizer: float | None = None) -> torch.Tensor:
    """Token-mean (over every masked token) or sequence-mean (per row first, then over rows with tokens)."""
    mask = mask.to(per_token.dtype)
    if how == "token-mean":
        denominator = normalizer if normalizer is not None else mask.sum().clamp(min=1.0)
        return (per_token * mask).sum() / denominator
    per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    has_tokens = (mask.sum(-1) > 0).to(per_token.dtype)
    denominator = normalizer if normalizer is not None else has_tokens.sum().clamp(min=1.0)
    return (per_seq * has_tokens).sum() / denominator


def clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    aggregation: str = "token-mean",
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    rollout_logprobs: torch.Tensor | None = None,
    tis_cap: float | None = None,
    normalizer: float | None = None,
) -> ReferenceOutput:
    """loss_t = w_t * -min(rho_t A, clip(rho_t) A) + beta * k3(pi_ref, pi_theta), then aggregated."""
    adv = advantages.unsqueeze(-1)
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    weight = torch.ones_like(per_token)
    if tis_cap is not None and rollout_logprobs is not None:
        weight = torch.exp(old_logprobs - rollout_logprobs).clamp(max=tis_cap).detach()
    per_token = per_token * weight
    kl = torch.zeros_like(per_token)
    if ref_logprobs is not None and kl_coef:
        d = ref_logprobs - logprobs
        kl = torch.exp(d) - d - 1.0
        per_token = per_token + kl_coef * kl
    loss = aggregate(per_token, mask, aggregation, normalizer)
    with torch.no_grad():
        return ReferenceOutput(
            loss,
            float(aggregate((clipped < unclipped).to(per_token.dtype), mask, "token-mean")),
            float(aggregate(0.5 * (logprobs - old_logprobs).pow(2), mask, "token-mean")),
            float(aggregate(kl.detach(), mask, "token-mean")),
            float(aggregate(weight, mask, "token-mean")),
        )
