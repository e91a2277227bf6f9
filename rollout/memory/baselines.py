"""Baseline memory systems behind the same interface as SAM: long-context, BM25 retrieval, embedding retrieval.

- **Long-context** (:class:`LongContextMemory`): the whole history, raw, truncated to the reasoner's window: the
  system prompt and the task message are always kept, then the most recent turns that fit ``window_tokens`` (whole
  turns, oldest dropped first; the newest turn is kept even when it alone overflows). The reasoner has no memory tool
  (:data:`~memrl.data.formats.LONG_CONTEXT_REASONER_SYSTEM`). With a tokenizer's counter
  (:class:`~memrl.rollout.memory.sam.TokenizerCounter`) a message costs what the chat template renders it to and the
  generation prompt what the template adds, so the count is the engine's prompt length for templates that render
  messages independently (ChatML); with a plain text counter a message costs ``count_tokens(content) +
  message_overhead_tokens`` and the prompt adds ``prompt_overhead_tokens``.
- **Retrieval** (:class:`BM25Memory`, :class:`EmbeddingMemory`): the live context is paged exactly as SAM's
  (:class:`~memrl.rollout.memory.sam.PagingConfig`), but no memory model writes cues: the raw pages are indexed. The
  reasoner's ``memory(intent)`` tool (:data:`~memrl.data.formats.RETRIEVAL_REASONER_SYSTEM`; page ids, if given, are
  ignored) returns the raw text of the ``top_k`` pages that match the intent best, best first, as
  :func:`~memrl.data.formats.render_sam_recalled` content (``page N:`` then the page text, per page). BM25 uses
  ``bm25s`` over lower-cased word tokens (single digits kept: ``pen 4`` is not ``pen 2``; English stopwords dropped)
  plus
  adjacent-word bigrams (``brass_key``: a page that names the brass key outranks pages that say "brass" and "key"
  apart; measured here on 200-token pages, needle pages in the top 3: 24/30 with words alone, 30/30 with bigrams); the
  embedding baseline uses :mod:`memrl.rollout.memory.embedders` (the packaged MiniLM by default), embedding new pages in
  one batch at query time. Pages that share no term with the intent (BM25 score 0) are not returned.

The reasoner's messages are SAM's shape with an empty cue bank (``task: ...`` / ``memory cues: none``), so the
scripted reasoner (:class:`~memrl.data.tasks.sam.SamReasoner`) reads them unchanged.
"""

from __future__ import annotations

import abc
import dataclasses
import itertools
from typing import Any, Literal

import numpy as np
from pydantic import Field

from memrl.data.config import ConfigModel
from memrl.data.envs.base import count_tokens as approximate_count_tokens
from memrl.data.formats import (
    LONG_CONTEXT_REASONER_SYSTEM,
    NOTHING_RELEVANT,
    RETRIEVAL_REASONER_SYSTEM,
    ToolCall,
    parse_sam_recalled,
    render_sam_memory_block,
    render_sam_recalled,
)
from memrl.data.schemas import Message
from memrl.rollout.memory.base import MemorySystem, ToolResult, Turn, register_memory
from memrl.rollout.memory.embedders import Embedder, EmbedderName, make_embedder, top_k
from memrl.rollout.memory.sam import LiveUnit, Page, PagedMemory, PagingConfig, TokenCounter, TokenizerCounter

__all__ = [
    "BM25Config",
    "BM25Memory",
    "EmbeddingConfig",
    "EmbeddingMemory",
    "LongContextConfig",
    "LongContextMemory",
    "RetrievalMemory",
    "bm25_rank",
]

_TOKEN_PATTERN = r"(?u)\b\w+\b"


class LongContextConfig(ConfigModel):
    """The long-context baseline: the reasoner's window and the chat template's per-message cost."""

    name: Literal["long_context"] = "long_context"  # selects this memory system
    window_tokens: int = Field(32768, ge=1, description="the reasoner's window: its prompt never exceeds this")
    message_overhead_tokens: int = Field(5, ge=0, description="template tokens around each message")
    prompt_overhead_tokens: int = Field(3, ge=0, description="template tokens of the generation prompt")


class BM25Config(PagingConfig):
    """BM25 retrieval over raw pages."""

    name: Literal["bm25"] = "bm25"  # selects this memory system
    top_k: int = Field(3, ge=1, description="pages returned per memory call")
    k1: float = 1.5  # BM25 term-frequency saturation k1
    b: float = 0.75  # BM25 length normalisation b


class EmbeddingConfig(PagingConfig):
    """Embedding retrieval over raw pages."""

    name: Literal["embedding"] = "embedding"  # selects this memory system
    top_k: int = Field(3, ge=1, description="pages returned per memory call")
    embedder: EmbedderName = "minilm"  # minilm (all-MiniLM-L6-v2) or hashing (bag of words, no model)


@register_memory("long_context", config=LongContextConfig)
class LongContextMemory(MemorySystem):
    """Full history, truncated to the window (see the module docstring)."""

    name = "long_context"
    reasoner_system = LONG_CONTEXT_REASONER_SYSTEM

    def __init__(self, config: LongContextConfig | None = None, count_tokens: TokenCounter | None = None) -> None:
        super().__init__()
        self.config = config or LongContextConfig()
        self.count_tokens = count_tokens or approximate_count_tokens
        self.task = ""
        self.turns: list[LiveUnit] = []

    def reset(self, task: str, metadata: dict[str, Any]) -> None:
        """Start an episode with an empty history."""
        self.stats = {}
        self.task = task
        self.turns = []

    def _message_tokens(self, message: Message) -> int:
        if isinstance(self.count_tokens, TokenizerCounter):
            return self.count_tokens.message(message.role, message.content)
        return self.count_tokens(message.content) + self.config.message_overhead_tokens

    def on_turn(self, turn: Turn) -> None:
        """Keep the step (its token cost counted once)."""
        unit = LiveUnit(
            step=turn.step,
            action_text=turn.action_text,
            observation=turn.observation,
            role=turn.role,
            context_tokens=0,
            page_tokens=0,
        )
        unit.context_tokens = sum(self._message_tokens(m) for m in unit.messages)
        self.turns.append(unit)

    def reasoner_messages(self, system_prompt: str) -> list[Message]:
        """System prompt and task message, then the most recent whole turns that fit the window."""
        cfg = self.config
        head = [
            Message(role="system", content=system_prompt or self.reasoner_system),
            Message(role="user", content=render_sam_memory_block(self.task, [])),
        ]
        if isinstance(self.count_tokens, TokenizerCounter):
            used = self.count_tokens.generation_prompt()
        else:
            used = cfg.prompt_overhead_tokens
        used += sum(self._message_tokens(m) for m in head)
        first = len(self.turns)
        while first > 0:
            cost = self.turns[first - 1].context_tokens
            if first < len(self.turns) and used + cost > cfg.window_tokens:
                break
            used += cost
            first -= 1
        if first:
            self.stats["long_context_dropped_turns"] = max(self.stats.get("long_context_dropped_turns", 0), first)
        messages = list(head)
        for unit in self.turns[first:]:
            messages += unit.messages
        return messages


class RetrievalMemory(PagedMemory):
    """Paged live context plus a ``memory(intent)`` tool that returns the best-matching raw pages."""

    tools = ("memory",)
    reasoner_system = RETRIEVAL_REASONER_SYSTEM

    def __init__(self, config: BM25Config | EmbeddingConfig, count_tokens: TokenCounter | None = None) -> None:
        self.config = config
        super().__init__(config, count_tokens)

    def _clear(self) -> None:
        super()._clear()
        self._result: ToolResult | None = None
        self._copies: set[int] = set()  # pages that hold only retrieval results: never retrieved themselves

    @abc.abstractmethod
    def rank(self, intent: str, k: int) -> list[int]:
        """Ids of the ``k`` pages that match ``intent`` best, best first."""

    def _new_page(self, units: list[LiveUnit]) -> Page:
        """A page of the cut units; a retrieval result is kept by reference (its intent and page ids), never with the
        raw pages it returned: those are in the store already, and a page holding them would be retrieved and nested
        again by every later retrieval (the text doubled with each repeat: 7.8 MB of page text after 17 retrievals of
        one TextWorld episode). A page of nothing but retrieval results is not retrieved itself (its words are the
        intent's, so it would outrank the pages it points at)."""
        kept, copies = [], 0
        for unit in units:
            recalled = parse_sam_recalled(unit.observation) if unit.role == "user" else None
            if recalled is not None:
                reference = render_sam_recalled(recalled[0], recalled[1], "(retrieved)")
                unit = dataclasses.replace(unit, observation=reference, messages=[])
                copies += 1
            kept.append(unit)
        page = super()._new_page(kept)
        if copies == len(units):
            self._copies.add(page.page_id)
        return page

    def on_tool_call(self, call: ToolCall, step: int) -> None:
        """Answer ``memory(intent)`` with the raw text of the top pages."""
        intent = call.arguments.get("intent")
        if not isinstance(intent, str) or not intent.strip():
            self._result = self._tool_error("missing_intent", "memory needs an intent: say what to recall")
            return
        if not self.pages:
            self._result = self._tool_error("no_pages", "memory is empty: no pages have been written yet")
            return
        self.count(f"{self.name}_recalls")
        k = self.config.top_k
        ids = [i for i in self.rank(intent.strip(), k + len(self._copies)) if i not in self._copies][:k]
        content = "\n".join(f"page {i}:\n{self.pages[i].text}" for i in ids)
        if not ids:
            self.count(f"{self.name}_empty_recalls")
        self._result = ToolResult(content=render_sam_recalled(intent.strip(), ids, content or NOTHING_RELEVANT))

    def tool_result(self) -> ToolResult | None:
        """The retrieval result (taken once)."""
        result, self._result = self._result, None
        return result


def bm25_rank(documents: list[str], query: str, k: int, *, k1: float = 1.5, b: float = 0.75) -> list[int]:
    """Indices of the ``k`` documents with the highest BM25 score for ``query`` (score > 0 only), best first, ties by
    index. Tokens: lower-cased words without English stopwords, plus adjacent-word bigrams."""
    import bm25s

    def tokenize(texts: list[str]) -> list[list[str]]:
        words = bm25s.tokenize(
            texts, token_pattern=_TOKEN_PATTERN, stopwords="en", return_ids=False, show_progress=False
        )
        return [w + [f"{a}_{b}" for a, b in itertools.pairwise(w)] for w in words]

    query_tokens = tokenize([query])
    if not documents or not query_tokens[0]:
        return []
    retriever = bm25s.BM25(k1=k1, b=b)
    retriever.index(tokenize(documents), show_progress=False)
    scores = retriever.get_scores(query_tokens[0])
    order = sorted(range(len(documents)), key=lambda i: (-float(scores[i]), i))
    return [i for i in order[:k] if scores[i] > 0]


@register_memory("bm25", config=BM25Config)
class BM25Memory(RetrievalMemory):
    """BM25 retrieval over raw pages (``bm25s``); the index is built per query from the page store."""

    name = "bm25"

    def __init__(self, config: BM25Config | None = None, count_tokens: TokenCounter | None = None) -> None:
        super().__init__(config or BM25Config(), count_tokens)

    def rank(self, intent: str, k: int) -> list[int]:
        """BM25 top pages for the intent."""
        cfg = self.config
        assert isinstance(cfg, BM25Config)
        return bm25_rank([p.text for p in self.pages], intent, k, k1=cfg.k1, b=cfg.b)


@register_memory("embedding", config=EmbeddingConfig)
class EmbeddingMemory(RetrievalMemory):
    """Cosine-similarity retrieval over raw pages with a sentence embedder (shared by copies, never copied)."""

    name = "embedding"

    def __init__(
        self,
        config: EmbeddingConfig | None = None,
        count_tokens: TokenCounter | None = None,
        embedder: Embedder | None = None,
    ) -> None:
        config = config or EmbeddingConfig()
        self.embedder = embedder or make_embedder(config.embedder)
        super().__init__(config, count_tokens)

    def _clear(self) -> None:
        super()._clear()
        self.vectors: list[np.ndarray] = []  # one per page, embedded lazily in page order

    def rank(self, intent: str, k: int) -> list[int]:
        """Embed pages not embedded yet (one batch), then the pages most similar to the intent."""
        fresh = [p.text for p in self.pages[len(self.vectors) :]]
        if fresh:
            self.vectors.extend(self.embedder.embed(fresh))
        query = self.embedder.embed([intent])[0]
        return [i for i, _ in top_k(np.stack(self.vectors), query, k)]
