"""The packed-attention path (memrl.train.attention): packed rows give the log-probs and the gradients of per-row
padded ones on every kernel a device runs, no [L, L] tensor exists on the way, and every other forward is untouched.

Kernels: on CPU each row's own causal SDPA call (``per_row_sdpa``), and FlexAttention's forward (torch has no
FlexAttention backward on CPU); on CUDA ``varlen_attn`` and FlexAttention in bf16 (forward and backward), per-row SDPA
in fp32. Stated tolerances, packed against a right-padded batch with an attention mask and full logits: fp32 log-probs
1e-4 absolute, gradients 1e-4 relative (||packed - padded|| / ||padded|| over all weights; kernel reduction order
only: measured on CPU, log-probs 9.5e-7, gradients 3.8e-7 on the tiny model and 2.4e-7 on the GQA shape); bf16
log-probs 0.05 (as test_gpu_packing.py states for bf16 rounding in every layer) and gradients 5e-2 (the fused loss's
bf16 gradients alone measured 1.1e-2 in test_gpu_fused_loss.py; here two layers and two different kernels, a flash
varlen one against SDPA with a padding mask, round on top); a leak across rows or a lost scale moves either by O(1).
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import memrl.train.attention as attention
from memrl.train.attention import (
    KERNELS,
    PackedRows,
    attention_over_rows,
    document_block_mask,
    packed_kernel_for,
    use_packed_attention,
)
from memrl.train.logprobs import pack_rows, packed_hidden_states, token_loss_and_logprobs
from tests.gpu.models import ROW_LENGTHS, padded_batch, random_rows, tiny_causal_lm

TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (0.05, 5e-2)}  # (log-prob absolute, gradient relative)
# (kernel, dtype) per device: what the trainer runs there, plus FlexAttention where varlen_attn is missing.
CASES = [
    pytest.param("cpu", "per_row_sdpa", torch.float32, id="cpu-per_row_sdpa-fp32"),
    pytest.param("cuda", "varlen", torch.bfloat16, marks=pytest.mark.gpu, id="cuda-varlen-bf16"),
    pytest.param("cuda", "flex", torch.bfloat16, marks=pytest.mark.gpu, id="cuda-flex-bf16"),
    pytest.param("cuda", "per_row_sdpa", torch.float32, marks=pytest.mark.gpu, id="cuda-per_row_sdpa-fp32"),
]


def rows_for(device: str) -> list[tuple[list[int], list[int]]]:
    """Rows of very different lengths (700-token prompt to 1-token response); on CPU a third of each."""
    lengths = ROW_LENGTHS if device == "cuda" else [(max(p // 3, 1), max(r // 3, 1)) for p, r in ROW_LENGTHS]
    return random_rows(seed=3, lengths=lengths)


def token_weights(rows: list[tuple[list[int], list[int]]], device: torch.device) -> torch.Tensor:
    """A fixed weight per response token (signs mixed), so every token's gradient counts."""
    g = torch.Generator().manual_seed(1)
    return torch.randn(sum(len(r) for _, r in rows), generator=g).to(device)


def model_for(name: str, device: torch.device, dtype: torch.dtype, tiny_model_dir: Path) -> torch.nn.Module:
    """``qwen3-gqa``: 4 query heads over 2 key/value heads; ``tiny``: the project's tiny model (2 x 128, 2 heads)."""
    if name == "qwen3-gqa":
        return tiny_causal_lm("qwen3", "sdpa", device, dtype)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype, attn_implementation="sdpa")
    return model.to(device).eval()


def packed_loss(model: torch.nn.Module, rows: list, weights: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The trainer's path: packed rows, hidden states at response positions, the fused chunked loss; backward."""
    model.zero_grad(set_to_none=True)
    batch = pack_rows(rows, weights.device)
    head = model.get_output_embeddings()
    hidden = packed_hidden_states(model, head, batch)
    loss, logprobs, _ = token_loss_and_logprobs(
        hidden, head, batch.targets, lambda lp, sl: lp * weights[sl], chunk_tokens=64
    )
    loss.backward()
    return logprobs, {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}


def padded_loss(model: torch.nn.Module, rows: list, weights: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The reference: one right-padded batch with an attention mask, full logits, the same weighted sum; backward."""
    model.zero_grad(set_to_none=True)
    device = weights.device
    ids, mask = padded_batch(rows, device)
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
    lps = []
    for i, (p, r) in enumerate(rows):
        lp = logits[i, len(p) - 1 : len(p) - 1 + len(r)].log_softmax(-1)
        lps.append(lp.gather(-1, torch.tensor(r, device=device).unsqueeze(-1)).squeeze(-1))
    logprobs = torch.cat(lps)
    (logprobs * weights).sum().backward()
    return logprobs.detach(), {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}


def gradient_error(ours: dict, ref: dict) -> float:
    assert ours.keys() == ref.keys()
    num = math.sqrt(sum(float((ours[n] - ref[n]).norm()) ** 2 for n in ref))
    return num / math.sqrt(sum(float(ref[n].norm()) ** 2 for n in ref))


@pytest.mark.parametrize("model_name", ["tiny", "qwen3-gqa"])
@pytest.mark.parametrize(("device", "kernel", "dtype"), CASES)
def test_packed_logprobs_and_gradients_equal_padded_rows(
    device: str,
    kernel: str,
    dtype: torch.dtype,
    model_name: str,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dev = torch.device(device)
    if device == "cuda" and kernel == "varlen" and attention._varlen() is None:
        pytest.skip("this torch has no varlen_attn")
    if model_name == "tiny" and device == "cuda":
        pytest.skip("the tiny model is the CPU quickstart's; the CUDA cases run the GQA shape")
    model = model_for(model_name, dev, dtype, tiny_model_dir)
    chosen: list[str] = []
    natural = packed_kernel_for

    def force(device: torch.device, dtype: torch.dtype, dropout: float = 0.0) -> str:
        chosen.append(natural(device, dtype, dropout))
        return kernel

    monkeypatch.setattr(attention, "packed_kernel_for", force)
    rows = rows_for(device)
    weights = token_weights(rows, dev)
    lp, grads = packed_loss(model, rows, weights)
    ref_lp, ref_grads = padded_loss(model, rows, weights)
    assert chosen, "the packed forward did not reach the packed attention path"
    if kernel != "flex":
        assert set(chosen) == {kernel}, f"{device} {dtype} would take {set(chosen)}, not {kernel}"
    lp_tol, grad_tol = TOLERANCE[dtype]
    assert float((lp - ref_lp).abs().max()) <= lp_tol
    assert gradient_error(grads, ref_grads) <= grad_tol


def test_gradient_checkpointing_recomputes_through_the_packed_path() -> None:
    """The row boundaries travel with the forward's keyword arguments, so the layers' recomputation in backward sees
    them again (a recompute that lost them would attend across rows and change the gradients)."""
    model = tiny_causal_lm("qwen3", "sdpa", torch.device("cpu"), torch.float32)
    rows = rows_for("cpu")
    weights = token_weights(rows, torch.device("cpu"))
    ref_lp, ref_grads = padded_loss(model, rows, weights)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()  # transformers checkpoints its layers in training mode only (the model has no dropout)
    recomputed: list[int] = []
    hook = model.model.layers[0].register_forward_pre_hook(lambda *_: recomputed.append(1))
    lp, grads = packed_loss(model, rows, weights)
    hook.remove()
    assert len(recomputed) == 2, "the layer ran once in forward and once more in backward"
    assert float((lp - ref_lp).abs().max()) <= TOLERANCE[torch.float32][0]
    assert gradient_error(grads, ref_grads) <= TOLERANCE[torch.float32][1]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_forward_equals_padded_rows_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """FlexAttention's forward with the document block mask (its backward needs a GPU: the CUDA cases above)."""
    model = tiny_causal_lm("qwen3", "sdpa", torch.device("cpu"), torch.float32)
    rows = rows_for("cpu")
    weights = token_weights(rows, torch.device("cpu"))
    monkeypatch.setattr(attention, "packed_kernel_for", lambda *a, **k: "flex")
    batch = pack_rows(rows, "cpu")
    head = model.get_output_embeddings()
    with torch.no_grad():
        hidden = packed_hidden_states(model, head, batch)
        _, lp, _ = token_loss_and_logprobs(
            hidden, head, batch.targets, lambda lp, sl: lp * weights[sl], chunk_tokens=64
        )
    ref_lp, _ = padded_loss(model, rows, weights)
    assert float((lp - ref_lp).abs().max()) <= TOLERANCE[torch.float32][0]


@pytest.mark.parametrize("lengths", [[5, 17, 1, 40, 9], [16, 16, 32], [70], [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3]])
def test_document_block_mask_marks_exactly_the_blocks_rows_reach(lengths: list[int]) -> None:
    """Block by block against the dense mask: the blocks it marks are those with an allowed pair, and a block it
    marks full (skipping the mask function) has every pair allowed; its mask function is the dense mask."""
    block = 8
    length = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    row = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    q, kv = torch.arange(length)[:, None], torch.arange(length)[None, :]
    dense = (row[:, None] == row[None, :]) & (q >= kv)
    mask = document_block_mask(cu, length, block=block)
    n = -(-length // block)
    padded = torch.zeros(n * block, n * block, dtype=torch.bool)
    padded[:length, :length] = dense
    blocks = padded.view(n, block, n, block).permute(0, 2, 1, 3)
    any_pair = blocks.flatten(2).any(-1)
    in_range = torch.zeros(n * block, dtype=torch.bool)
    in_range[:length] = True
    whole = in_range.view(n, block).all(-1)
    all_pairs = blocks.flatten(2).all(-1) & whole[:, None] & whole[None, :]

    def marked(num: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            out[i, idx[0, 0, i, : int(num[0, 0, i])].long()] = True
        return out

    partial = marked(mask.kv_num_blocks, mask.kv_indices)
    full = marked(mask.full_kv_num_blocks, mask.full_kv_indices)
    assert not (partial & full).any()
    assert torch.equal(partial | full, any_pair)
    assert not (full & ~all_pairs).any()
    assert torch.equal(full, all_pairs), "a block every pair of which is allowed should skip the mask function"
    mod = mask.mask_mod(None, None, q, kv)
    assert torch.equal(mod, dense)


class _LargestShapes(TorchDispatchMode):
    """Records the shape of every tensor any operation returns."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


def test_packed_forward_and_backward_allocate_no_square_tensor() -> None:
    """No tensor of the packed forward and backward has two dimensions as long as the packed sequence (the dense
    mask, its float copy, or the [heads, L, L] scores of an L x L attention would)."""
    model = tiny_causal_lm("qwen3", "sdpa", torch.device("cpu"), torch.float32)
    rows = random_rows(seed=2, lengths=[(150, 40), (3, 1), (60, 90), (1, 10), (100, 5)])
    weights = token_weights(rows, torch.device("cpu"))
    length = sum(len(p) + len(r) for p, r in rows)
    with _LargestShapes() as seen:
        packed_loss(model, rows, weights)
    assert seen.shapes, "nothing was recorded"
    square = [s for s in seen.shapes if sum(d >= length for d in s) >= 2]
    assert not square, f"tensors as long as the packed sequence ({length}) in two dimensions: {square[:5]}"
    assert max(max(s, default=0) for s in seen.shapes) >= length  # the check sees the packed activations


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_unpacked_forwards_run_the_model_s_own_attention(implementation: str) -> None:
    """With the packed path installed, a padded batch (and generation) computes what the plain model does."""
    rows = random_rows(seed=4, lengths=[(30, 5), (12, 3)])
    plain = tiny_causal_lm("qwen3", implementation, torch.device("cpu"), torch.float32)
    wrapped = tiny_causal_lm("qwen3", implementation, torch.device("cpu"), torch.float32)
    assert use_packed_attention(wrapped) and use_packed_attention(wrapped)  # idempotent
    assert wrapped.config._attn_implementation == f"memrl_packed_{implementation}"
    ids, mask = padded_batch(rows, torch.device("cpu"))
    with torch.no_grad():
        assert torch.equal(
            plain(input_ids=ids, attention_mask=mask).logits, wrapped(input_ids=ids, attention_mask=mask).logits
        )
        prompt = ids[:1, :30]
        kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
        assert torch.equal(plain.generate(prompt, **kwargs), wrapped.generate(prompt, **kwargs))


def test_models_that_read_packed_rows_otherwise_are_left_alone() -> None:
    if hasattr(importlib.import_module("transformers"), "Qwen3_5TextConfig"):
        hybrid = tiny_causal_lm("qwen3_5", "sdpa", torch.device("cpu"), torch.float32)
        assert not use_packed_attention(hybrid) and hybrid.config._attn_implementation == "sdpa"
    flex = tiny_causal_lm("qwen3", "flex_attention", torch.device("cpu"), torch.float32)
    assert not use_packed_attention(flex) and flex.config._attn_implementation == "flex_attention"


def test_kernel_choice_follows_device_dtype_and_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert packed_kernel_for(cpu, torch.float32) == "per_row_sdpa"
    assert packed_kernel_for(cpu, torch.bfloat16) == "per_row_sdpa"
    assert packed_kernel_for(cuda, torch.float32) == "per_row_sdpa"
    assert packed_kernel_for(cuda, torch.bfloat16, dropout=0.1) == "per_row_sdpa"
    monkeypatch.setattr(attention, "_varlen", lambda: (object(), frozenset()))
    assert packed_kernel_for(cuda, torch.bfloat16) == "varlen" and packed_kernel_for(cuda, torch.float16) == "varlen"
    monkeypatch.setattr(attention, "_varlen", lambda: None)
    assert packed_kernel_for(cuda, torch.bfloat16) == "flex"


@pytest.mark.parametrize(
    "params",
    [
        frozenset({"is_causal"}),  # torch 2.10: a causal flag, no grouped-query option, no scale
        frozenset({"window_size", "enable_gqa", "scale"}),  # torch 2.12+
    ],
    ids=["is_causal", "window_size"],
)
def test_varlen_call_adapts_to_the_installed_signature(params: frozenset[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``varlen_attn``'s keyword names moved between torch releases: the call adapts (a causal window or flag,
    grouped-query heads natively or repeated, the scale passed or folded into the queries) and computes the per-row
    result, checked on CPU through a stand-in with each signature that computes per-row SDPA from the boundaries."""
    calls: list[dict] = []

    def stand_in(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs):  # type: ignore[no-untyped-def]
        assert set(kwargs) <= params
        calls.append(kwargs)
        assert kwargs.get("window_size", (-1, 0)) == (-1, 0) and kwargs.get("is_causal", True)
        if not kwargs.get("enable_gqa"):
            assert k.shape[1] == q.shape[1], "K/V must be repeated where the kernel has no grouped-query option"
        out = KERNELS["per_row_sdpa"](
            PackedRows(
                q.transpose(0, 1)[None],
                k.transpose(0, 1)[None],
                v.transpose(0, 1)[None],
                cu_q,
                max_q,
                scaling=kwargs.get("scale", q.shape[-1] ** -0.5),
            )
        )
        return out[0]

    monkeypatch.setattr(attention, "_varlen", lambda: (stand_in, params))
    g = torch.Generator().manual_seed(0)
    lengths = [7, 1, 20, 4]
    q = torch.randn(1, 4, sum(lengths), 16, generator=g)
    k, v = torch.randn(1, 2, sum(lengths), 16, generator=g), torch.randn(1, 2, sum(lengths), 16, generator=g)
    cu = torch.tensor([0, 7, 8, 28, 32], dtype=torch.int32)
    scaling = 0.3  # not head_dim ** -0.5: the scale must reach the kernel one way or the other
    ours = attention_over_rows(q, k, v, cu, 20, scaling=scaling, kernel="varlen")
    ref = attention_over_rows(q, k, v, cu, 20, scaling=scaling, kernel="per_row_sdpa")
    assert calls and torch.allclose(ours, ref, atol=1e-6)
    manual = []
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        scores = (q[0, :, s:e] @ k[0].repeat_interleave(2, 0)[:, s:e].transpose(-1, -2)) * scaling
        scores = scores.masked_fill(torch.ones(e - s, e - s, dtype=torch.bool).triu(1), float("-inf"))
        manual.append((scores.softmax(-1) @ v[0].repeat_interleave(2, 0)[:, s:e]).transpose(0, 1))
    assert torch.allclose(ref[0], torch.cat(manual), atol=1e-5)
