"""Log-probs of response tokens only, from packed rows, in chunks over tokens.

A micro-batch is one packed sequence: its rows laid end to end with position ids restarting at 0 per row (no padding),
and its forward carries the rows' cumulative lengths, so each row attends to itself alone through a variable-length
kernel and no ``[L, L]`` mask is built (:mod:`memrl.train.attention`). The LM head is applied only to the positions
that predict a response token, ``chunk_tokens`` positions at a time: no ``[tokens, vocab]`` tensor over the whole
micro-batch ever exists, and the prompt's logits are never computed.

For the training pass the surrogate loss is separable over tokens (``loss = sum_t token_loss_t(log pi_theta(y_t))``),
so :class:`FusedTokenLoss` computes each chunk's gradient with respect to the hidden states and the LM-head weight
while the chunk's logits are alive (as Liger's fused linear losses do) and keeps only those: the backward pass does
not recompute the logits. Under ZeRO-3 the LM-head weight is partitioned outside its module's forward, so the loss is
built from per-chunk checkpointed calls of the module instead (one recomputed chunk of logits at a time).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from memrl.train.attention import packed_forward

__all__ = [
    "FusedTokenLoss",
    "PackedBatch",
    "TokenLoss",
    "pack_rows",
    "packed_hidden_states",
    "response_token_logprobs",
    "token_loss_and_logprobs",
]

# token_loss(logprobs of a chunk, slice of the chunk in the micro-batch's response tokens) -> per-token loss
TokenLoss = Callable[[torch.Tensor, slice], torch.Tensor]


@dataclass
class PackedBatch:
    """Rows packed into one sequence, and where their response tokens are.

    ``positions[k]`` is the packed position whose logits predict response token ``targets[k]``; ``token_row[k]`` is the
    row (index into the packed rows) it belongs to. Row ``i`` spans ``cu_seqlens[i]:cu_seqlens[i + 1]``.
    """

    input_ids: torch.Tensor  # [1, total tokens]
    position_ids: torch.Tensor  # [1, total tokens], restarting at 0 for every row
    positions: torch.Tensor  # [response tokens]
    targets: torch.Tensor  # [response tokens]
    token_row: torch.Tensor  # [response tokens]
    response_lengths: list[int]
    cu_seqlens: torch.Tensor  # [rows + 1] int32: where each row starts, then the packed length
    max_length: int  # the longest row

    @property
    def n_tokens(self) -> int:
        """Packed length (every token of every row)."""
        return int(self.input_ids.shape[1])


def pack_rows(sequences: Sequence[tuple[Sequence[int], Sequence[int]]], device: torch.device | str) -> PackedBatch:
    """Pack ``(prompt_ids, response_ids)`` pairs end to end (see the module docstring)."""
    ids: list[int] = []
    pos: list[int] = []
    positions: list[int] = []
    targets: list[int] = []
    token_row: list[int] = []
    starts: list[int] = [0]
    for row, (prompt, response) in enumerate(sequences):
        if not prompt:
            raise ValueError(f"row {row} has an empty prompt: its first response token has no position predicting it")
        offset = len(ids)
        ids.extend(prompt)
        ids.extend(response)
        pos.extend(range(len(prompt) + len(response)))
        start = offset + len(prompt) - 1  # position t predicts token t + 1
        positions.extend(range(start, start + len(response)))
        targets.extend(response)
        token_row.extend([row] * len(response))
        starts.append(len(ids))

    def as_tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return PackedBatch(
        as_tensor(ids).unsqueeze(0),
        as_tensor(pos).unsqueeze(0),
        as_tensor(positions),
        as_tensor(targets),
        as_tensor(token_row),
        [len(r) for _, r in sequences],
        torch.tensor(starts, dtype=torch.int32, device=device),
        max((len(p) + len(r) for p, r in sequences), default=0),
    )


@contextmanager
def _capture_head_input(head: torch.nn.Module, store: dict[str, torch.Tensor]) -> Any:
    """While active, the LM head records its input and is applied to zero positions (its output is unused)."""

    def grab(_module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        store["hidden"] = args[0]
        return (args[0][:, :0], *args[1:])

    handle = head.register_forward_pre_hook(grab)
    try:
        yield
    finally:
        handle.remove()


def packed_hidden_states(model: Any, head: torch.nn.Module, batch: PackedBatch, **forward_kwargs: Any) -> torch.Tensor:
    """[response tokens, hidden]: the final hidden states at ``batch.positions``.

    ``model`` is called as prepared (DDP / DeepSpeed wrappers run their hooks); ``head`` is its output-embedding module.
    No attention mask is passed: the forward carries the row boundaries (:func:`memrl.train.attention.packed_forward`),
    so each row attends to itself through a variable-length kernel. ``forward_kwargs`` go to the model (PEFT's
    ``adapter_names``).
    """
    store: dict[str, torch.Tensor] = {}
    with _capture_head_input(head, store), packed_forward(model, batch.cu_seqlens, batch.max_length) as rows_kwargs:
        model(
            input_ids=batch.input_ids,
            position_ids=batch.position_ids,
            use_cache=False,
            **rows_kwargs,
            **forward_kwargs,
        )
    return store["hidden"][0].index_select(0, batch.positions)


def _chunk_logprobs(logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool) -> tuple[torch.Tensor, Any]:
    logits = logits.float()
    log_norm = torch.logsumexp(logits, dim=-1)
    chosen = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)
            entropy = log_norm - torch.einsum("nv,nv->n", probs, logits)
    return chosen - log_norm, entropy


@torch.no_grad()
def response_token_logprobs(
    hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, *, chunk_tokens: int, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """([N] log-probs, [N] entropies or None) of ``targets`` from ``hidden`` [N, H], ``chunk_tokens`` at a time (fp32,
    temperature 1: the definition the engines report). No gradient: the scoring passes of pi_old and pi_ref."""
    lps, ents = [], []
    for start in range(0, hidden.shape[0], chunk_tokens):
        sl = slice(start, start + chunk_tokens)
        lp, ent = _chunk_logprobs(head(hidden[sl]), targets[sl], with_entropy)
        lps.append(lp)
        ents.append(ent)
    entropy = torch.cat(ents) if with_entropy and ents else None
    return torch.cat(lps) if lps else hidden.new_zeros(0, dtype=torch.float32), entropy


class FusedTokenLoss(torch.autograd.Function):
    """``sum_t token_loss_t(log softmax(h_t W^T)[y_t])`` with both gradients computed chunk by chunk in the forward.

    Returns (loss, [N] detached log-probs, [N] entropies or an empty tensor). As d log p(y)/d logits = onehot(y) - p,
    with g_t = d loss / d log p_t and G_t = g_t (onehot(y_t) - p_t): d loss/d h_t = G_t W, d loss/d W = sum_t G_t^T h_t.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        token_loss: TokenLoss,
        chunk_tokens: int,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Loss, log-probs and entropies; the gradients are kept for :meth:`backward`."""
        want_weight = ctx.needs_input_grad[1]
        grad_hidden = torch.zeros_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if want_weight else None
        total = hidden.new_zeros((), dtype=torch.float32)
        lps, ents = [], []
        for start in range(0, hidden.shape[0], chunk_tokens):
            sl = slice(start, start + chunk_tokens)
            h, y = hidden[sl], targets[sl]
            logits = F.linear(h, weight).float()
            log_norm = torch.logsumexp(logits, dim=-1)
            lp = logits.gather(-1, y.unsqueeze(-1)).squeeze(-1) - log_norm
            log_probs = logits.sub_(log_norm.unsqueeze(-1))  # in place: the raw logits are not needed any more
            if with_entropy:
                probs = log_probs.exp()
                ents.append(-torch.einsum("nv,nv->n", probs, log_probs))
                del log_probs
            else:
                probs = log_probs.exp_()
            with torch.enable_grad():
                lp_leaf = lp.detach().requires_grad_(True)
                chunk_loss = token_loss(lp_leaf, sl).sum()
                (g,) = torch.autograd.grad(chunk_loss, lp_leaf)
            total += chunk_loss.detach()
            lps.append(lp)
            grad_logits = probs.mul_(-g.unsqueeze(-1))
            grad_logits.scatter_add_(-1, y.unsqueeze(-1), g.unsqueeze(-1))
            grad_logits = grad_logits.to(hidden.dtype)
            grad_hidden[sl] = grad_logits @ weight
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.t().float(), h.float())
            del probs, grad_logits
        ctx.save_for_backward(grad_hidden, grad_weight if grad_weight is not None else torch.empty(0))
        ctx.want_weight = want_weight
        ctx.weight_dtype = weight.dtype
        logprobs = torch.cat(lps) if lps else hidden.new_zeros(0, dtype=torch.float32)
        entropy = torch.cat(ents) if ents else hidden.new_zeros(0, dtype=torch.float32)
        ctx.mark_non_differentiable(logprobs, entropy)
        return total, logprobs, entropy

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, *_: Any) -> tuple[Any, ...]:  # type: ignore[override]
        """The gradients computed in :meth:`forward`, times the loss's upstream gradient."""
        grad_hidden, grad_weight = ctx.saved_tensors
        dh = grad_hidden * grad_loss.to(grad_hidden.dtype)
        dw = (grad_weight * grad_loss).to(ctx.weight_dtype) if ctx.want_weight else None
        return dh, dw, None, None, None, None


def token_loss_and_logprobs(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    targets: torch.Tensor,
    token_loss: TokenLoss,
    *,
    chunk_tokens: int,
    with_entropy: bool = False,
    fused: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(loss, [N] detached log-probs, [N] entropies or None) of the training pass, chunked over tokens.

    ``fused`` (default: whenever the head is a bias-free linear whose weight is not ZeRO-3-partitioned) selects
    :class:`FusedTokenLoss`; otherwise each chunk of the head is a checkpointed module call, recomputed in backward.
    """
    weight = getattr(head, "weight", None)
    if fused is None:
        fused = isinstance(head, torch.nn.Linear) and head.bias is None and not hasattr(weight, "ds_id")
    if fused:
        loss, logprobs, entropy = FusedTokenLoss.apply(hidden, weight, targets, token_loss, chunk_tokens, with_entropy)
        return loss, logprobs, entropy if with_entropy else None

    def chunk(h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return _chunk_logprobs(head(h), y, False)[0]

    total = hidden.new_zeros((), dtype=torch.float32)
    lps, ents = [], []
    for start in range(0, hidden.shape[0], chunk_tokens):
        sl = slice(start, start + chunk_tokens)
        lp = checkpoint(chunk, hidden[sl], targets[sl], use_reentrant=False)
        total = total + token_loss(lp, sl).sum()
        lps.append(lp.detach())
        if with_entropy:
            with torch.no_grad():
                ents.append(_chunk_logprobs(head(hidden[sl].detach()), targets[sl], True)[1])
    logprobs = torch.cat(lps) if lps else hidden.new_zeros(0, dtype=torch.float32)
    return total, logprobs, (torch.cat(ents) if with_entropy and ents else None)
