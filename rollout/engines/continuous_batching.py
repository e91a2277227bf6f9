"""Continuous batching for the transformers engine: rows join the running batch between decode steps and leave it
the step they end, as in vLLM's scheduler ("Efficient Memory Management for Large Language Model Serving with
PagedAttention", arXiv 2309.06180), without its paged memory.

With ``model.generate`` a batch runs until its longest row is done and a request that arrives meanwhile waits for the
whole batch; in a memory-call tree that is most of the time (a branch's next call waits behind its cousins' longer
ones, and consolidations and recalls, drawn with different settings, took turns). Here one thread owns the model and
a batch of rows, each with its own KV cache rows, left-padded to a common width:

- **join**: rows that arrived are prefilled together (one forward pass, left-padded), their first token is drawn,
  and their cache rows are padded to the batch's width (or the batch's to theirs) and stacked under it;
- **step**: one forward pass feeds every row its last drawn token (its own position id) and draws its next one;
- **leave**: a row that drew an end-of-sequence token, reached its limit or completed a stop string is finished
  (its future gets its token ids and log-probs) and its cache rows are dropped; padding columns no row needs any more
  are cut off.

Each row draws with its own ``torch.Generator`` (seeded per sample) and the same transforms as before whatever its
neighbours, and its log-probs are those of the raw logits (module :mod:`~memrl.rollout.engines.hf_engine`). Models
whose cache is not one plain key/value tensor per layer (sliding-window or recurrent layers) cannot have rows padded
and stacked; :func:`supports_continuous_batching` says so, and the engine runs them through ``generate``.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from memrl.rollout.engines.base import EngineError, SamplingParams, find_stop, torch_threads

__all__ = ["CallState", "Row", "RowDecoder", "RunningBatch", "draw", "left_padded", "supports_continuous_batching"]

logger = logging.getLogger(__name__)


def supports_continuous_batching(model: Any) -> bool:
    """True when the model's KV cache is one plain (full-attention) key/value tensor pair per layer."""
    try:
        layers = DynamicCache(config=model.config).layers
    except Exception:  # a config transformers cannot build a cache from
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


@dataclass
class CallState:
    """The rows of one call still running, and whether its completion holds the next step (lockstep)."""

    running: int
    holds: bool


@dataclass
class Row:
    """One sample being generated: its prompt, settings, limit, generator, and what it has drawn so far."""

    prompt: list[int]
    sampling: SamplingParams
    limit: int  # tokens it may draw (max_tokens, capped by the context)
    generator: torch.Generator
    done: Future[tuple[list[int], list[float]]] = field(default_factory=Future)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    call: CallState | None = None


def left_padded(rows: list[Row], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' prompts as one left-padded batch: token ids and attention mask, ``(rows, longest prompt)``."""
    width = max(len(r.prompt) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row.prompt) :] = torch.tensor(row.prompt)
        mask[i, width - len(row.prompt) :] = 1
    return ids, mask


def draw(logits: torch.Tensor, rows: list[Row]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's next token under its own settings and generator, and its log-prob under the raw logits.

    Temperature 0 is the argmax; otherwise the logits are divided by the temperature, cut to the top k and to the
    smallest set reaching top p, and one token is drawn with the row's generator."""
    logits = logits.float()
    chosen = logits.argmax(-1)
    settings: dict[tuple[float, float, int], list[int]] = {}
    for i, row in enumerate(rows):
        s = row.sampling
        if s.temperature > 0:
            settings.setdefault((s.temperature, s.top_p, s.top_k), []).append(i)
    for (temperature, top_p, top_k), index in settings.items():
        x = logits[index] / temperature
        if 0 < top_k < x.shape[-1]:
            kth = torch.topk(x, top_k, dim=-1).values[:, -1:]
            x = x.masked_fill(x < kth, -math.inf)
        if top_p < 1.0:
            sorted_x, order = torch.sort(x, dim=-1, descending=True)
            cum = torch.softmax(sorted_x, -1).cumsum(-1)
            drop = cum - torch.softmax(sorted_x, -1) >= top_p  # keep the smallest set reaching top_p
            x = x.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), -math.inf)
        probs = torch.softmax(x, -1)
        for j, i in enumerate(index):
            chosen[i] = torch.multinomial(probs[j], 1, generator=rows[i].generator)[0]
    return chosen, torch.log_softmax(logits, -1).gather(-1, chosen[:, None]).squeeze(-1)


class RowDecoder:
    """The thread that owns one engine's model and decodes every row submitted to it (module docstring)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine  # the transformers engine: its model, tokenizer, device, pad and stop ids, batch size
        self.inbox: queue.SimpleQueue[list[Row] | None] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()
        self.settled = threading.Condition()
        self.held = 0  # completed calls whose callers have not settled them yet (lockstep)
        self.closing = False

    def submit(self, rows: list[Row], holds: bool = False) -> None:
        """Queue rows (one call); their futures complete as each row ends. With ``holds``, the step after the call
        completes waits for :meth:`settle`."""
        call = CallState(running=len(rows), holds=holds)
        for row in rows:
            row.call = call
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name=f"memrl-{self.engine.name}-rows", daemon=True)
                self.thread.start()
        self.inbox.put(rows)

    def hold(self) -> None:
        """Hold the next step until one more :meth:`settle`."""
        with self.settled:
            self.held += 1

    def settle(self, calls: int = 1) -> None:
        """``calls`` completed calls were settled by their callers (more than are held: all of them)."""
        with self.settled:
            self.held = max(0, self.held - calls)
            self.settled.notify_all()

    def end(self, row: Row) -> None:
        """Finish a row (its call holds the next step if it was the call's last row and asked to)."""
        if row.call is not None:
            row.call.running -= 1
            if row.call.running == 0 and row.call.holds:
                with self.settled:
                    self.held += 1
        row.done.set_result((row.ids, row.logprobs))

    def close(self) -> None:
        """Stop the thread; rows still queued or running fail with an :class:`EngineError`."""
        with self.lock:
            thread, self.thread = self.thread, None
        if thread is not None:
            with self.settled:
                self.closing = True
                self.settled.notify_all()
            self.inbox.put(None)
            thread.join()

    # ---------------------------------------------------------------------------------------------------- the thread
    def _run(self) -> None:
        batch = RunningBatch()
        waiting: deque[Row] = deque()
        closing = False
        while not closing:
            closing = self._collect(waiting, block=not batch.rows and not waiting)
            with self.settled:  # lockstep: every call that follows from a completed one is sent before the next step
                while self.held and not self.closing:
                    self.settled.wait()
            closing = self._collect(waiting, block=False) or closing
            room = self.engine.batch_size - len(batch.rows)
            joining = [waiting.popleft() for _ in range(min(room, len(waiting)))]
            try:
                with torch.inference_mode(), torch_threads(self.engine.cpu_threads):
                    if joining:
                        batch.join(self, joining)
                    elif batch.rows:
                        batch.step(self)
            except Exception as exc:  # the model failed: every row in flight fails with it
                logger.exception("engine %s: generation failed", self.engine.name)
                error = EngineError(f"{self.engine.name}: generation failed: {exc}")
                for row in [*batch.rows, *joining]:
                    if not row.done.done():
                        row.done.set_exception(error)
                batch = RunningBatch()
        for row in [*batch.rows, *waiting]:
            row.done.set_exception(EngineError(f"{self.engine.name}: the engine was closed during generation"))

    def _collect(self, waiting: deque[Row], block: bool) -> bool:
        """Move submitted rows to ``waiting`` (waiting for the first when ``block``); True when closing."""
        while True:
            try:
                rows = self.inbox.get(block=block)
            except queue.Empty:
                return False
            if rows is None:
                return True
            waiting.extend(rows)
            block = False


class _GrowingLayer(DynamicLayer):
    """One layer's keys and values in buffers with room to grow: a decode step writes its column in place, where
    ``DynamicLayer`` concatenates (a copy of the whole cache every step, most of a step's time on wide batches)."""

    ROOM = 256  # columns added when the buffer is full

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self.replace(keys, values)

    def replace(self, keys: torch.Tensor, values: torch.Tensor, room: int = ROOM) -> None:
        """Hold ``keys`` and ``values`` (rows, heads, length, dim) in new buffers ``room`` columns longer."""
        rows, heads, length, dim = keys.shape
        self.key_buffer = keys.new_zeros((rows, heads, length + room, dim))
        self.value_buffer = values.new_zeros((rows, heads, length + room, dim))
        self.key_buffer[:, :, :length] = keys
        self.value_buffer[:, :, :length] = values
        self.length = length
        self.keys, self.values = self.key_buffer[:, :, :length], self.value_buffer[:, :, :length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        n = key_states.shape[2]
        if self.length + n > self.key_buffer.shape[2]:
            self.replace(self.keys, self.values, room=max(self.ROOM, n))
        self.key_buffer[:, :, self.length : self.length + n] = key_states
        self.value_buffer[:, :, self.length : self.length + n] = value_states
        self.length += n
        self.keys, self.values = self.key_buffer[:, :, : self.length], self.value_buffer[:, :, : self.length]
        return self.keys, self.values


class RunningBatch:
    """The running rows, their KV cache (left-padded to one width), its attention mask, and each row's last drawn
    token."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros((0, 0), dtype=torch.long)
        self.next_ids = torch.zeros((0,), dtype=torch.long)  # each row's last drawn token, not yet in the cache

    def join(self, decoder: RowDecoder, rows: list[Row]) -> None:
        """Prefill ``rows`` in one forward pass, draw their first tokens and stack them under the running rows."""
        engine = decoder.engine
        device = engine.device
        ids, mask = left_padded(rows, engine.pad_id)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=engine.model.config)
        out = engine.model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            position_ids=positions.to(device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        chosen, logprobs = draw(out.logits[:, -1], rows)
        cache.layers = [_GrowingLayer(layer.keys, layer.values) for layer in cache.layers]
        if self.cache is None:
            self.cache, self.mask = cache, mask.to(device)
        else:
            self._stack(cache, mask.to(device))
        self.rows += rows
        self.next_ids = torch.cat([self.next_ids.to(device), chosen])
        self._record(decoder, chosen, logprobs, first=len(self.rows) - len(rows))

    def step(self, decoder: RowDecoder) -> None:
        """Feed every row its last drawn token and draw the next one."""
        engine = decoder.engine
        assert self.cache is not None
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.rows), 1))], 1)
        positions = self.mask.sum(-1, keepdim=True) - 1
        out = engine.model(
            input_ids=self.next_ids[:, None],
            attention_mask=self.mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        chosen, logprobs = draw(out.logits[:, -1], self.rows)
        self.next_ids = chosen
        self._record(decoder, chosen, logprobs, first=0)

    def _stack(self, cache: DynamicCache, mask: torch.Tensor) -> None:
        """Pad the running rows' cache and the new rows' to one width (on the left) and stack them."""
        assert self.cache is not None
        width = max(self.mask.shape[1], mask.shape[1])
        for old, new in zip(self.cache.layers, cache.layers, strict=True):
            assert isinstance(old, _GrowingLayer)
            old.replace(
                torch.cat([_pad_left(old.keys, width), _pad_left(new.keys, width)]),
                torch.cat([_pad_left(old.values, width), _pad_left(new.values, width)]),
            )
        self.mask = torch.cat([F.pad(m, (width - m.shape[1], 0)) for m in (self.mask, mask)])

    def _record(self, decoder: RowDecoder, chosen: torch.Tensor, logprobs: torch.Tensor, first: int) -> None:
        """Append the drawn tokens of rows ``first``.. (``chosen``: theirs); finish the rows that ended and drop them
        from the batch."""
        tokens, values = chosen.tolist(), logprobs.tolist()
        ended = []
        for i, (row, token, value) in enumerate(zip(self.rows[first:], tokens, values, strict=True), start=first):
            row.ids.append(token)
            row.logprobs.append(value)
            if len(row.ids) >= row.limit or _ends(decoder.engine, row, token):
                ended.append(i)
        if not ended:
            return
        for i in ended:
            decoder.end(self.rows[i])
        keep = [i for i in range(len(self.rows)) if i not in set(ended)]
        self.rows = [self.rows[i] for i in keep]
        if not self.rows:
            self.cache, self.mask, self.next_ids = None, self.mask[:0, :0], self.next_ids[:0]
            return
        index = torch.tensor(keep, device=self.mask.device)
        self.mask, self.next_ids = self.mask[index], self.next_ids[index]
        assert self.cache is not None
        unused = int((self.mask.cumsum(-1) == 0).sum(-1).min())  # leading columns every row pads
        for layer in self.cache.layers:
            assert isinstance(layer, _GrowingLayer)
            layer.replace(layer.keys[index, :, unused:], layer.values[index, :, unused:])
        self.mask = self.mask[:, unused:]


def _ends(engine: Any, row: Row, token: int) -> bool:
    """Whether ``token`` ends the row: an end-of-sequence token (unless ignored) or the last token of a stop string."""
    s = row.sampling
    if not s.ignore_eos and token in engine.stop_ids:
        return True
    return bool(s.stop) and find_stop(engine.tokenizer.decode(row.ids, skip_special_tokens=True), s.stop) is not None


def _pad_left(x: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad a ``(rows, heads, length, dim)`` tensor on the left of its length to ``width``."""
    return F.pad(x, (0, 0, width - x.shape[2], 0))
