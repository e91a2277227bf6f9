"""The chunked fused log-prob + loss (memrl.train.logprobs.FusedTokenLoss, and the checkpointed per-chunk path used
under ZeRO-3) in bf16 against an fp32 autograd reference over full logits: loss, log-probs, entropies, and the
gradients of the hidden states and of the LM-head weight.

The token loss is the trainer's own: the clipped surrogate with truncated importance weights (memrl.train.surrogate)
times the token-mean weights c_t. Stated tolerances: gradients by relative error ||ours - ref|| / ||ref||, fp32 1e-5,
bf16 3e-2 (bf16 operands alone give 1e-3 to 1e-2; here the logits are rounded to bf16 too, as the trainer's head
computes them: measured 1.1e-2 on CPU); the loss by its error over sum_t |loss_t|, fp32 1e-5, bf16 1e-3 (measured
1.4e-4); a log-prob or entropy by absolute error, fp32 1e-4 / 1e-3, bf16 0.1 (logits of size ~5 round by ~0.02;
measured 0.044 and 0.031).
"""

from __future__ import annotations

import pytest
import torch

from memrl.train.logprobs import response_token_logprobs, token_loss_and_logprobs
from memrl.train.surrogate import surrogate_loss

# (response tokens, hidden, vocab): ragged chunks on both; the CUDA shape is closer to a real head (hidden x vocab).
SHAPES = {"cpu": (300, 64, 2000), "cuda": (3000, 1024, 32_000)}
CHUNK = 128
TOLERANCE = {
    torch.float32: {"grad": 1e-5, "loss": 1e-5, "logprob": 1e-4, "entropy": 1e-3},
    torch.bfloat16: {"grad": 3e-2, "loss": 1e-3, "logprob": 0.1, "entropy": 0.1},
}


def relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours.float() - ref.float()).norm() / ref.float().norm())


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "checkpointed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_chunked_loss_matches_fp32_autograd(device: torch.device, dtype: torch.dtype, fused: bool) -> None:
    n, hidden_size, vocab = SHAPES[device.type]
    g = torch.Generator().manual_seed(0)
    hidden = (torch.randn(n, hidden_size, generator=g)).to(device)
    weight = (torch.randn(vocab, hidden_size, generator=g) * hidden_size**-0.5 * 3).to(device)
    targets = torch.randint(0, vocab, (n,), generator=g).to(device)
    response_lengths = [n // 3, n // 3, n - 2 * (n // 3)]
    advantages = torch.cat([torch.full((k,), a) for k, a in zip(response_lengths, [1.3, -0.7, 0.4], strict=True)])
    row_lengths = torch.cat([torch.full((k,), float(k)) for k in response_lengths]).to(device)
    head = torch.nn.Linear(hidden_size, vocab, bias=False, device=device, dtype=dtype)
    with torch.no_grad():
        head.weight.copy_(weight)
        # pi_old as the trainer scores it (same precision, no grad). In fp32 it is moved so that ratios clip on both
        # sides; in bf16 it is left where the trainer has it (ratio 1 up to rounding): a ratio the rounding pushes
        # across a clip boundary switches its token's gradient on or off, which no tolerance can state.
        old, _ = response_token_logprobs(hidden.to(dtype), head, targets, chunk_tokens=CHUNK)
        if dtype == torch.float32:
            old = old + 0.3 * torch.randn(n, generator=g).to(device)
        rollout = old + 0.5 * torch.randn(n, generator=g).to(device)  # TIS weights exp(old - rollout), some capped
    advantages = advantages.to(device)

    def token_loss(logprobs: torch.Tensor, sl: slice) -> torch.Tensor:
        # the trainer's own loss (train/surrogate.py), token-mean over the n tokens
        terms = surrogate_loss(
            logprobs,
            old[sl],
            advantages[sl],
            row_lengths[sl],
            aggregation="token-mean",
            normalizer=float(n),
            clip_low=0.2,
            clip_high=0.28,
            rollout_logprobs=rollout[sl],
            tis_cap=2.0,
        )
        return terms.weighted

    # fp32 autograd reference over the full [n, vocab] logits, on the inputs rounded to ``dtype`` and upcast
    h_ref = hidden.to(dtype).float().clone().requires_grad_(True)
    w_ref = weight.to(dtype).float().clone().requires_grad_(True)
    log_probs = torch.log_softmax(h_ref @ w_ref.T, -1)
    lp_ref = log_probs.gather(-1, targets.unsqueeze(-1))[:, 0]
    per_token_ref = token_loss(lp_ref, slice(None))
    loss_ref = per_token_ref.sum()
    loss_ref.backward()
    entropy_ref = -(log_probs.exp() * log_probs).sum(-1).detach()

    h = hidden.to(dtype).clone().requires_grad_(True)
    loss, lp, entropy = token_loss_and_logprobs(
        h, head, targets, token_loss, chunk_tokens=CHUNK, with_entropy=True, fused=fused
    )
    loss.backward()

    tol = TOLERANCE[dtype]
    assert torch.isfinite(loss) and torch.isfinite(h.grad).all() and torch.isfinite(head.weight.grad).all()
    assert h.grad.dtype == dtype and head.weight.grad.dtype == dtype
    loss_error = abs(float(loss.detach()) - float(loss_ref.detach())) / float(per_token_ref.detach().abs().sum())
    assert loss_error <= tol["loss"], f"loss {float(loss.detach())} vs {float(loss_ref.detach())}"
    assert float((lp - lp_ref.detach()).abs().max()) <= tol["logprob"]
    assert entropy is not None and float((entropy - entropy_ref).abs().max()) <= tol["entropy"]
    assert relative_error(h.grad, h_ref.grad) <= tol["grad"], "d loss / d hidden"
    assert relative_error(head.weight.grad, w_ref.grad) <= tol["grad"], "d loss / d head weight"
    # The upstream gradient scales both (the trainer backpropagates loss * accumulation scale)
    h.grad = None
    head.weight.grad = None
    loss, _, _ = token_loss_and_logprobs(h, head, targets, token_loss, chunk_tokens=CHUNK, fused=fused)
    (loss * 3.0).backward()
    assert relative_error(h.grad, 3.0 * h_ref.grad) <= tol["grad"]
