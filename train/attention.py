"""Attention over packed rows without a square mask.

A training micro-batch is its rows laid end to end in one sequence (:func:`memrl.train.logprobs.pack_rows`). Read
through transformers' SDPA or eager attention, such a sequence becomes a dense ``[1, 1, L, L]`` block-diagonal mask
with ``is_causal=False``: the kernel computes the whole ``L x L`` square and holds the mask, so a 32K-token micro-batch
costs the square of its budget however short its rows are. Here each row attends to itself only, and the cost follows
the sum of its rows' squared lengths:

- ``varlen``: CUDA in bf16/fp16 where the installed torch has ``torch.nn.attention.varlen.varlen_attn`` (PyTorch's
  flash-attention varlen kernel, torch >= 2.10), with the packer's cumulative row lengths;
- ``flex``: CUDA in half precision without ``varlen_attn``: FlexAttention with a document :class:`BlockMask` built
  from the row boundaries at block granularity (``(L / 128)^2`` entries, never ``L^2``);
- ``per_row_sdpa``: the CPU, fp32 and attention dropout: each row its own causal SDPA call (``is_causal=True``).

The path is a registered attention implementation (transformers' ``AttentionInterface`` and
``AttentionMaskInterface``) wrapping the model's own ``sdpa`` or ``eager`` one: a forward that carries the row
boundaries (``cu_seq_lens_q`` / ``max_length_q``, the keyword arguments transformers' flash path reads) runs the
packed kernel and builds no mask; every other forward (padded batches, generation) runs the wrapped implementation
unchanged. The boundaries travel with the forward's keyword arguments, so PEFT and DeepSpeed wrappers pass them on and
gradient checkpointing's recomputation sees them again. Flash-attention and FlexAttention models already read packed
rows without a dense mask and are left as they are; models with recurrent layers (Qwen3.5's gated delta net) or
sliding-window layers keep one row per forward or their own implementation.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import math
import sys
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F

__all__ = [
    "KERNELS",
    "PackedRows",
    "attention_over_rows",
    "document_block_mask",
    "packed_forward",
    "packed_kernel_for",
    "repeats_kv_heads",
    "rows_can_share_a_sequence",
    "use_packed_attention",
]

logger = logging.getLogger(__name__)

PREFIX = "memrl_packed_"  # the registered name of the packed path over the wrapped implementation
WRAPPED = ("sdpa", "eager")  # the implementations that would read packed rows through a dense mask
FLEX_BLOCK = 128  # FlexAttention's default sparse block size

# Set while a packed forward builds its masks: the registered mask functions then build none.
_building_packed_masks: ContextVar[bool] = ContextVar("memrl_building_packed_masks", default=False)


@dataclass(frozen=True)
class PackedRows:
    """What a packed-attention kernel reads: query ``[1, H, T, D]``, key and value ``[1, H_kv, T, D]``, the row
    boundaries ``cu_seqlens`` (``[rows + 1]`` on the tensors' device), the longest row, the softmax scale and the
    attention dropout."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    cu_seqlens: torch.Tensor
    max_length: int
    scaling: float
    dropout: float = 0.0

    @property
    def groups(self) -> int:
        """Query heads per key/value head (1 without grouped-query attention)."""
        heads, kv_heads = self.query.shape[1], self.key.shape[1]
        if heads % kv_heads:
            raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} key/value heads")
        return heads // kv_heads


Kernel = Callable[[PackedRows], torch.Tensor]  # -> [1, T, H, D]


def rows_can_share_a_sequence(config: Any) -> bool:
    """Whether a model with this config can read several rows packed into one sequence.

    Attention layers restart at every row through the position ids, but recurrent layers do not: Qwen3.5's gated
    delta net (``layer_types`` entries ``linear_attention``) carries its state and conv window from one row into the
    next, so each row of such a model gets a micro-batch of its own.
    """
    configs = [config, getattr(config, "text_config", None)]
    return not any("linear_attention" in (getattr(c, "layer_types", None) or ()) for c in configs if c is not None)


@cache
def _varlen() -> tuple[Callable[..., torch.Tensor], frozenset[str]] | None:
    """(``varlen_attn``, its keyword names) where the installed torch has it, else None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


def packed_kernel_for(device: torch.device, dtype: torch.dtype, dropout: float = 0.0) -> str:
    """The kernel of :data:`KERNELS` that packed rows take on ``device`` in ``dtype`` (see the module docstring)."""
    if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and dropout == 0.0:
        return "varlen" if _varlen() is not None else "flex"
    return "per_row_sdpa"


def repeats_kv_heads() -> bool:
    """Whether grouped-query keys and values are repeated to every query head before ``varlen_attn`` (the installed
    torch's has no ``enable_gqa``): the repeated copies are then saved for its backward."""
    found = _varlen()
    return found is not None and "enable_gqa" not in found[1]


def _varlen_rows(rows: PackedRows) -> torch.Tensor:
    """``varlen_attn`` over ``[T, H, D]`` views; its causal flag and grouped-query option as the installed torch names
    them (torch 2.10: ``is_causal``; later: ``window_size=(-1, 0)`` and ``enable_gqa``)."""
    found = _varlen()
    if found is None:
        raise RuntimeError("this torch has no torch.nn.attention.varlen.varlen_attn")
    if rows.dropout:
        raise ValueError("varlen_attn has no attention dropout: use the per_row_sdpa kernel")
    varlen_attn, params = found
    q, k, v = (x[0].transpose(0, 1).contiguous() for x in (rows.query, rows.key, rows.value))
    groups = rows.groups
    kwargs: dict[str, Any] = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    if groups > 1:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if "scale" in params:
        kwargs["scale"] = rows.scaling
    else:  # the kernel's own scale is head_dim ** -0.5
        q = q * (rows.scaling * math.sqrt(q.shape[-1]))
    cu = rows.cu_seqlens.to(torch.int32)
    return varlen_attn(q, k, v, cu, cu, rows.max_length, rows.max_length, **kwargs).unsqueeze(0)


def _per_row_sdpa(rows: PackedRows) -> torch.Tensor:
    """One causal SDPA call per row, on views of the packed tensors: no mask, memory of one row's attention."""
    gqa = rows.groups > 1
    outs = [
        F.scaled_dot_product_attention(
            rows.query[:, :, start:end],
            rows.key[:, :, start:end],
            rows.value[:, :, start:end],
            dropout_p=rows.dropout,
            is_causal=True,
            scale=rows.scaling,
            enable_gqa=gqa,
        )
        for start, end in itertools.pairwise(rows.cu_seqlens.tolist())
    ]
    return torch.cat(outs, dim=2).transpose(1, 2)


def document_block_mask(cu_seqlens: torch.Tensor, length: int, block: int = FLEX_BLOCK) -> Any:
    """FlexAttention's :class:`BlockMask` of causal attention within each row, from the row boundaries alone.

    Tokens are grouped in blocks of ``block``; for each query block the key blocks it touches span from the block
    holding its first row's start to its own diagonal, and of those the ones every query of the block fully sees
    (behind the block's first token, after its last token's row start) skip the mask function. Only block-level
    ``(L / block)^2`` tables are built; the mask function compares row ids token by token in the partial blocks.
    """
    from torch.nn.attention.flex_attention import BlockMask

    device = cu_seqlens.device
    cu = cu_seqlens.to(torch.long)
    n_blocks = -(-length // block)
    tokens = torch.arange(length, device=device)
    row = torch.searchsorted(cu[1:], tokens, right=True)
    row_start = cu[row]
    first = torch.arange(n_blocks, device=device) * block
    last = torch.clamp(first + block, max=length) - 1
    touched_lo, touched_hi = row_start[first] // block, last // block
    full_lo = -(-row_start[last] // block)
    full_hi = (first + 1) // block - 1  # key blocks wholly at or before the block's first query
    full_hi = torch.where(last - first + 1 == block, full_hi, full_lo - 1)  # a short last block: never full
    j = torch.arange(n_blocks, device=device)[None, :]
    full = (j >= full_lo[:, None]) & (j <= full_hi[:, None])
    partial = (j >= touched_lo[:, None]) & (j <= touched_hi[:, None]) & ~full

    def as_kv_blocks(which: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        order = torch.argsort((~which).to(torch.int8), dim=-1, stable=True)  # the marked blocks first, in order
        return which.sum(-1).to(torch.int32)[None, None], order.to(torch.int32)[None, None]

    padded_row = torch.cat([row, torch.full((n_blocks * block - length,), -1, device=device, dtype=row.dtype)])

    def same_row_causal(_b: Any, _h: Any, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return (padded_row[q_idx] == padded_row[kv_idx]) & (q_idx >= kv_idx)

    kv_num, kv_idx = as_kv_blocks(partial)
    full_num, full_idx = as_kv_blocks(full)
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block, mask_mod=same_row_causal, seq_lengths=(length, length)
    )


_last_block_mask: list[tuple[weakref.ref[torch.Tensor], int, Any]] = []


def _flex_rows(rows: PackedRows) -> torch.Tensor:
    """FlexAttention with :func:`document_block_mask` (compiled on CUDA; built once per micro-batch, not per layer)."""
    from torch.nn.attention.flex_attention import flex_attention

    if rows.dropout:
        raise ValueError("FlexAttention has no attention dropout: use the per_row_sdpa kernel")
    length = rows.query.shape[2]
    if _last_block_mask and _last_block_mask[0][0]() is rows.cu_seqlens and _last_block_mask[0][1] == length:
        block_mask = _last_block_mask[0][2]
    else:
        block_mask = document_block_mask(rows.cu_seqlens, length)
        _last_block_mask[:] = [(weakref.ref(rows.cu_seqlens), length, block_mask)]
    kernel = _compiled_flex() if rows.query.is_cuda else flex_attention
    out = kernel(
        rows.query, rows.key, rows.value, block_mask=block_mask, scale=rows.scaling, enable_gqa=rows.groups > 1
    )
    return out.transpose(1, 2)


@cache
def _compiled_flex() -> Callable[..., torch.Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True)


KERNELS: dict[str, Kernel] = {"varlen": _varlen_rows, "flex": _flex_rows, "per_row_sdpa": _per_row_sdpa}


def attention_over_rows(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_length: int,
    *,
    scaling: float,
    dropout: float = 0.0,
    kernel: str | None = None,
) -> torch.Tensor:
    """[1, T, H, D]: causal attention of each row of a packed sequence to itself (query ``[1, H, T, D]``, key and
    value ``[1, H_kv, T, D]``), through ``kernel`` (default: :func:`packed_kernel_for` the query)."""
    if query.shape[0] != 1 or key.shape[2] != query.shape[2]:
        raise ValueError(f"packed rows are one sequence of queries and keys; got {tuple(query.shape)}")
    device = query.device.type
    if device == "cuda" and torch.is_autocast_enabled(device):  # fp32 weights under autocast: the autocast dtype
        dtype = torch.get_autocast_dtype(device)
        query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    name = kernel or packed_kernel_for(query.device, query.dtype, dropout)
    return KERNELS[name](PackedRows(query, key, value, cu_seqlens, max_length, scaling, dropout))


def _wrapped_forward(base: str, module: torch.nn.Module) -> Callable[..., Any]:
    """The implementation ``base`` of the module's model: transformers' registered one, or the modelling file's own
    ``eager_attention_forward``."""
    if base == "eager":
        eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if eager is None:
            raise RuntimeError(f"{type(module).__name__} has no eager_attention_forward beside it to fall back on")
        return eager
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[base]


def _packed_attention(base: str) -> Callable[..., tuple[torch.Tensor, None]]:
    def forward(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        cu_seqlens = kwargs.get("cu_seq_lens_q")
        if cu_seqlens is None:
            return _wrapped_forward(base, module)(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = attention_over_rows(
            query, key, value, cu_seqlens, int(kwargs["max_length_q"]), scaling=scale, dropout=dropout
        )
        return out, None

    forward.__name__ = f"{PREFIX}{base}"
    return forward


def _packed_mask(base: str) -> Callable[..., Any]:
    def mask(*args: Any, **kwargs: Any) -> Any:
        if _building_packed_masks.get():
            return None
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

        return ALL_MASK_ATTENTION_FUNCTIONS[base](*args, **kwargs)

    return mask


def _hf_model(model: torch.nn.Module) -> Any:
    """The Hugging Face model inside ``model`` (itself, or under PEFT / DDP / DeepSpeed wrappers)."""
    from transformers import PreTrainedModel

    found = next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)
    if found is None:
        raise TypeError(f"no transformers PreTrainedModel inside {type(model).__name__}")
    return found


def use_packed_attention(model: torch.nn.Module) -> bool:
    """Route the packed forwards of ``model`` (any wrapper) through this module's path; True when they now take it.

    Only an ``sdpa`` or ``eager`` model whose rows can share a sequence and that has no sliding-window layers is
    switched (its config then names ``memrl_packed_<implementation>``, and every unpacked forward still runs that
    implementation); other models are left as they are and False is returned. Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    config = _hf_model(model).config
    current = config._attn_implementation
    if isinstance(current, str) and current.startswith(PREFIX):
        return True
    layer_types = getattr(config, "layer_types", None) or ()
    if current not in WRAPPED or not rows_can_share_a_sequence(config) or "sliding_attention" in layer_types:
        return False
    name = PREFIX + current
    AttentionInterface.register(name, _packed_attention(current))
    AttentionMaskInterface.register(name, _packed_mask(current))
    config._attn_implementation = name
    logger.info("packed rows reach attention through %s (%s kept for unpacked forwards)", name, current)
    return True


@contextmanager
def packed_forward(model: torch.nn.Module, cu_seqlens: torch.Tensor, max_length: int) -> Iterator[dict[str, Any]]:
    """The keyword arguments a forward of ``model`` over packed rows passes on (row boundaries, or nothing where the
    model reads packed rows on its own); while active, the packed path's mask functions build no mask."""
    if not use_packed_attention(model):
        yield {}
        return
    token = _building_packed_masks.set(True)
    try:
        yield {
            "cu_seq_lens_q": cu_seqlens,
            "cu_seq_lens_k": cu_seqlens,
            "max_length_q": max_length,
            "max_length_k": max_length,
        }
    finally:
        _building_packed_masks.reset(token)
