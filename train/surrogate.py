"""The training loss of the group trainer (shared by OAT-GRPO and pivot-turn GRPO): one function, the one that runs.

The clipped surrogate is PPO's ("Proximal Policy Optimization Algorithms", arXiv 1707.06347) with the asymmetric
clip of DAPO ("DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv 2503.14476). Per response token
t of row i (rho = ratio, eps = clip range, A_i = the row's group advantage):

    rho_t   = exp(log pi_theta(y_t) - log pi_old(y_t))              old = recomputed by the trainer before the update
    pg_t    = -min(rho_t * A_i, clip(rho_t, 1 - eps_low, 1 + eps_high) * A_i)
    w_t     = min(exp(log pi_old(y_t) - log pi_rollout(y_t)), tis_cap)   truncated importance sampling (optional):
              corrects for the rollout engine sampling from slightly different numbers than the trainer computes
    kl_t    = exp(r_t) - r_t - 1,  r_t = log pi_ref(y_t) - log pi_theta(y_t)   (k3 estimator, optional)
    loss_t  = w_t * pg_t + beta * kl_t

and the loss of an optimizer step is the weighted sum over its response tokens

    L = sum_t c_t * loss_t,   c_t = 1 / N_tokens           (token-mean: every response token of the step counts once)
                              c_t = 1 / (|y_i| * N_rows)    (sequence-mean: every row counts once)

with N_tokens / N_rows counted over the whole optimizer step (all its micro-batches and processes), so summing the
micro-batches' losses gives the step's mean. :func:`surrogate_loss` returns the summands c_t * loss_t; the trainer
sums them chunk by chunk (the fused LM-head gradient of :mod:`memrl.train.logprobs` needs a loss separable over
tokens). Edit this function and training changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["Aggregation", "SurrogateTerms", "surrogate_loss"]

Aggregation = Literal["token-mean", "sequence-mean"]


@dataclass
class SurrogateTerms:
    """The per-token summands of the loss (``weighted``: c_t * loss_t) and detached diagnostics."""

    weighted: torch.Tensor  # c_t * loss_t: the step's loss is their sum
    log_ratio: torch.Tensor  # detached log rho_t
    was_clipped: torch.Tensor  # detached: 1 where the min picked the clipped branch
    kl: torch.Tensor | None  # detached k3 KL to the reference
    tis_weight: torch.Tensor | None  # the truncated importance weight w_t

    @property
    def approx_kl(self) -> torch.Tensor:
        """Per-token 0.5 * (log rho_t)^2: the approximate KL(pi_old || pi_theta) the trainer logs."""
        return 0.5 * self.log_ratio.pow(2)


def surrogate_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    row_lengths: torch.Tensor,
    *,
    aggregation: Aggregation,
    normalizer: float,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    rollout_logprobs: torch.Tensor | None = None,
    tis_cap: float | None = None,
) -> SurrogateTerms:
    """c_t * loss_t of the module docstring for a flat run of response tokens.

    Every tensor argument is per token: ``advantages`` holds A_i of each token's row, ``row_lengths`` |y_i|;
    ``normalizer`` is N_tokens (token-mean) or N_rows (sequence-mean) of the whole optimizer step.
    """
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    tis_weight = None
    if tis_cap is not None and rollout_logprobs is not None:
        tis_weight = torch.exp(old_logprobs - rollout_logprobs).clamp(max=tis_cap).detach()
        loss = loss * tis_weight
    kl = None
    if ref_logprobs is not None and kl_coef:
        log_ref_ratio = ref_logprobs - logprobs
        kl = torch.exp(log_ref_ratio) - log_ref_ratio - 1.0
        loss = loss + kl_coef * kl
        kl = kl.detach()
    if aggregation == "token-mean":
        c = torch.full_like(loss, 1.0 / normalizer)
    elif aggregation == "sequence-mean":
        c = 1.0 / (row_lengths.to(loss.dtype).clamp(min=1.0) * normalizer)
    else:
        raise ValueError(f"aggregation must be 'token-mean' or 'sequence-mean', got {aggregation!r}")
    was_clipped = (clipped < unclipped).detach().to(logprobs.dtype)
    return SurrogateTerms(c * loss, log_ratio.detach(), was_clipped, kl, tis_weight)
