"""A simulated automatic prefix cache that counts cached prompt tokens the way vLLM does.

vLLM's prefix cache (v1) keys full KV blocks by a hash chained over everything before them, so a block can only be
reused together with its whole prefix. For a prompt of ``L`` tokens it serves the longest run of leading full blocks
that are cached, but never the last prompt token (its logits must be computed), so at most
``(L - 1) // block_size`` blocks hit. Blocks are cached as soon as their KV is computed: the prompt's full blocks at
scheduling time (a later request in the same batch already hits them) and the generated tokens' full blocks as they
are produced (every generated token but the last is fed back through the model). Eviction is least recently used,
and a request's blocks are freed tail first (as vLLM frees them), so a shared prefix outlives its branches.

The scripted engine uses this so a frozen scripted reasoner's token accounting includes cached prefill exactly as a
vLLM reasoner would report it (``RequestOutput.num_cached_tokens``); tests compare both on the same token streams.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

__all__ = ["PrefixCacheSimulator"]


class PrefixCacheSimulator:
    """Block-hash LRU cache of token prefixes (``block_size`` tokens per block, ``capacity_tokens`` in total)."""

    def __init__(self, block_size: int = 16, capacity_tokens: int = 1 << 20) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if capacity_tokens < block_size:
            raise ValueError(f"capacity_tokens ({capacity_tokens}) must hold at least one block of {block_size}")
        self.block_size = block_size
        self.capacity_blocks = capacity_tokens // block_size
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.lookups = 0
        self.hit_tokens = 0
        self.evictions = 0

    def __len__(self) -> int:
        """Number of cached blocks."""
        return len(self._blocks)

    def _hashes(self, ids: Sequence[int], n_blocks: int, namespace: Hashable) -> list[int]:
        out: list[int] = []
        parent = hash(("memrl-prefix", namespace))
        b = self.block_size
        for i in range(n_blocks):
            parent = hash((parent, tuple(ids[i * b : (i + 1) * b])))
            out.append(parent)
        return out

    def lookup(self, prompt_ids: Sequence[int], namespace: Hashable = None) -> int:
        """Cached prompt tokens for a new request, then cache the prompt's full blocks (as vLLM does on scheduling).

        ``namespace`` separates caches that must not share blocks (vLLM keys blocks by LoRA adapter as well).
        """
        hashes = self._hashes(prompt_ids, len(prompt_ids) // self.block_size, namespace)
        hit = 0
        for h in hashes[: (len(prompt_ids) - 1) // self.block_size] if prompt_ids else []:
            if h not in self._blocks:
                break
            hit += 1
        self._touch(hashes)
        self.lookups += 1
        self.hit_tokens += hit * self.block_size
        return hit * self.block_size

    def insert(self, prompt_ids: Sequence[int], response_ids: Sequence[int], namespace: Hashable = None) -> None:
        """Cache the full blocks of a finished sample: the prompt plus every generated token but the last."""
        computed = list(prompt_ids) + list(response_ids[:-1])
        self._touch(self._hashes(computed, len(computed) // self.block_size, namespace))

    def clear(self) -> None:
        """Drop every cached block (vLLM's ``reset_prefix_cache``)."""
        self._blocks.clear()

    def _touch(self, hashes: list[int]) -> None:
        for h in reversed(hashes):
            if h in self._blocks:
                self._blocks.move_to_end(h)
            else:
                self._blocks[h] = None
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
            self.evictions += 1
