"""Packed rows (position ids restarting per row, no padding, no mask) give the same log-probs as a padded batch.

The trainer's micro-batch is its rows laid end to end (memrl.train.logprobs.pack_rows); RoPE reads the restarting
position ids and attention the rows' boundaries (memrl.train.attention; flash-attention reads them from the position
ids). Checked on rows of very different lengths through SDPA and eager
attention (and flash-attention 2 where it is installed), in fp32 (CPU and CUDA) and bf16 (CUDA; bf16 CPU attention
kernels are too slow to be worth it), with the packed path's own response-only LM head against the full logits.
"""

from __future__ import annotations

import importlib
import importlib.util

import pytest
import torch

from memrl.train.logprobs import pack_rows, packed_hidden_states, response_token_logprobs
from tests.gpu.models import ROW_LENGTHS, padded_logprobs, random_rows, tiny_causal_lm

# fp32: kernel reduction order only. bf16: both paths round activations to 8 bits of mantissa in every layer, and the
# padded and packed batches run different kernels (a padding mask against a block-diagonal one) and tile their matrix
# products differently. Measured on CPU bf16 (SDPA): packed vs padded 0.002, either vs fp32 0.003; a row attending to
# its neighbours moves log-probs by 0.28 (in fp32 too), which the test also checks it would catch.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 0.05}
ATTENTION = [
    "sdpa",
    "eager",
    pytest.param(
        "flash_attention_2",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="flash-attn is not installed"),
        ],
    ),
]


def packed_logprobs(
    model: torch.nn.Module,
    rows: list[tuple[list[int], list[int]]],
    *,
    restart_positions: bool = True,
    chunk_tokens: int = 64,
) -> list[torch.Tensor]:
    """The trainer's scoring path: packed rows, hidden states at the response positions, chunked LM head."""
    device = next(model.parameters()).device
    batch = pack_rows(rows, device)
    if not restart_positions:  # one long causal sequence: rows see their neighbours (what the test must catch)
        batch.position_ids = torch.arange(batch.n_tokens, device=device).unsqueeze(0)
        batch.cu_seqlens = torch.tensor([0, batch.n_tokens], dtype=torch.int32, device=device)
        batch.max_length = batch.n_tokens
    head = model.get_output_embeddings()
    with torch.no_grad():
        hidden = packed_hidden_states(model, head, batch)
        lp, _ = response_token_logprobs(hidden, head, batch.targets, chunk_tokens=chunk_tokens)
    return list(lp.split(batch.response_lengths))


def worst_row_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def row_lengths(device: torch.device) -> list[tuple[int, int]]:
    """The CUDA rows; on CPU a third of each length (the same spread, a fast suite's cost)."""
    return ROW_LENGTHS if device.type == "cuda" else [(max(p // 3, 1), max(r // 3, 1)) for p, r in ROW_LENGTHS]


def dtypes_for(device: torch.device) -> list[torch.dtype]:
    return [torch.float32, torch.bfloat16] if device.type == "cuda" else [torch.float32]


@pytest.mark.parametrize("attn", ATTENTION)
def test_packed_rows_equal_padded_rows(device: torch.device, attn: str) -> None:
    if attn == "flash_attention_2" and device.type != "cuda":
        pytest.skip("flash-attention runs on CUDA only")
    rows = random_rows(lengths=row_lengths(device))
    for dtype in dtypes_for(device):
        if attn == "flash_attention_2" and dtype == torch.float32:
            continue  # flash-attention takes half precision only
        model = tiny_causal_lm("qwen3", attn, device, dtype)
        packed, padded = packed_logprobs(model, rows), padded_logprobs(model, rows)
        assert all(torch.isfinite(x).all() for x in packed)
        diff = worst_row_difference(packed, padded)
        assert diff <= TOLERANCE[dtype], f"{attn} {dtype}: packed vs padded log-probs differ by {diff:.4g}"
        # The comparison can fail: without the per-row position restart every row after the first attends to the
        # rows before it, far outside the tolerance.
        leaked = worst_row_difference(packed_logprobs(model, rows, restart_positions=False), padded)
        assert leaked > 3 * TOLERANCE[dtype], f"{attn} {dtype}: a leak across rows moves log-probs by only {leaked}"


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="Qwen3.5's gated-delta-net layers (transformers' torch path, and fla's without cu_seqlens) ignore position "
    "ids: packed rows carry the recurrent state and conv1d window of the rows before them",
)
def test_packed_rows_equal_padded_rows_qwen3_5_hybrid(device: torch.device) -> None:
    if not hasattr(importlib.import_module("transformers"), "Qwen3_5TextConfig"):
        pytest.skip("this transformers has no Qwen3.5")
    rows = random_rows(lengths=row_lengths(device))
    model = tiny_causal_lm("qwen3_5", "sdpa", device, torch.float32)
    diff = worst_row_difference(packed_logprobs(model, rows), padded_logprobs(model, rows))
    assert diff <= TOLERANCE[torch.float32], f"Qwen3.5 hybrid: packed vs padded log-probs differ by {diff:.4g}"


def test_response_only_logprobs_equal_full_logits(device: torch.device) -> None:
    rows = random_rows(seed=1, lengths=row_lengths(device))
    for dtype in dtypes_for(device):
        model = tiny_causal_lm("qwen3", "sdpa", device, dtype)
        batch = pack_rows(rows, device)
        with torch.no_grad():
            logits = model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False).logits[0]
            full = logits.float().log_softmax(-1)[batch.positions].gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)
        for chunk in (7, 64, 4096):  # a ragged last chunk, several chunks, one chunk
            (ours,) = [torch.cat(packed_logprobs(model, rows, chunk_tokens=chunk))]
            diff = float((ours - full).abs().max())
            # fp32: the same numbers; bf16: the head's matrix product over a subset of rows may tile differently
            tolerance = 1e-5 if dtype == torch.float32 else 2e-2
            assert diff <= tolerance, f"{dtype}, chunk {chunk}: response-only vs full-logits log-probs differ by {diff}"


def test_packed_rows_reach_sdpa_without_a_dense_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer's packed forward hands SDPA no mask as large as the packed sequence squared (before the packed
    attention path, transformers' SDPA read packed rows through a dense [1, 1, L, L] mask with is_causal=False)."""
    import transformers.integrations.sdpa_attention as sdpa_attention

    model = tiny_causal_lm("qwen3", "sdpa", torch.device("cpu"), torch.float32)
    rows = random_rows(0, [(48, 16), (40, 24)])
    batch = pack_rows(rows, "cpu")
    masks: list[tuple[int, ...] | None] = []
    kernel = sdpa_attention.torch.nn.functional.scaled_dot_product_attention

    def spy(*args: object, attn_mask: torch.Tensor | None = None, **kwargs: object) -> torch.Tensor:
        masks.append(None if attn_mask is None else tuple(attn_mask.shape))
        return kernel(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(sdpa_attention.torch.nn.functional, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        packed_hidden_states(model, model.get_output_embeddings(), batch)
    assert masks, "the model did not call SDPA"
    square = batch.n_tokens * batch.n_tokens
    assert all(shape is None or shape[-1] * shape[-2] < square for shape in masks), masks
