"""SAM, State-Adaptive Memory ("SAM: State-Adaptive Memory for Long-Horizon Reasoning Agent" (arXiv 2605.24468), section
2.2): pages, cues and intent-driven recall behind the memory-system interface.

**Write path.** Every reasoner step is a *unit*: the reasoner's reply (reason/act) and the observation that came back,
never split. Units accumulate in the live context; once it reaches capacity (``live_capacity_tokens``, or
``live_capacity_turns`` when set) the oldest units are cut until what stays raw fits ``keep_recent_tokens`` (and
``keep_recent_turns``), and the cut units are packed, in order, into pages of at most ``page_tokens`` tokens of page
text (and at most ``page_turns`` units: ``page_turns: 1`` gives the one-turn pages of the embedded default). A unit
larger than the budget becomes a page of its own. The newest unit, and the turn that carries the question (an
observation matching ``pin_pattern``, or a question-answering ``user`` turn) with every turn after it, are never
cut; the task message is not a unit (it heads the reasoner's context). Each page goes to the page store and the
memory model writes its cue (role ``consolidate``, :func:`~memrl.data.formats.render_sam_consolidate_prompt`), one call
per page, oldest first, before the reasoner's next call.

**Read path.** The reasoner's ``memory`` tool takes ``intent`` and ``page_ids`` (at most ``max_recall_pages``). The
memory model reads the selected pages in page order, one call per page (role ``recall``,
:func:`~memrl.data.formats.render_sam_recall_prompt`), each call seeing the running extraction so far; its output is the
new extraction (:data:`~memrl.data.formats.NOTHING_RELEVANT` empties it). The last extraction goes back to the reasoner
as :func:`~memrl.data.formats.render_sam_recalled` and stays in the live context as that step's unit.

**The reasoner's messages** (active context = cue bank + recent raw context + recalled content)::

    system     SAM_REASONER_SYSTEM
    user       task: ... / memory cues: / p0: cue / p1: cue ...   (render_sam_memory_block)
    user       first observation (while it is still live)
    assistant  <tool_call>{"name": "act", ...}</tool_call>          one pair per live unit
    tool       observation
    assistant  <tool_call>{"name": "memory", "arguments": {"intent": ..., "page_ids": [...]}}</tool_call>
    user       recalled for: ... / pages: 3,7 / [failed pages: p7 (empty output)] / extraction
               (or "error: ..." when every page failed)

**Malformed memory outputs never stop the loop.** Outputs are cleaned (cut at an end-of-text marker, stripped; cues
folded to one line and capped at ``max_cue_tokens``). Empty text, text without letters or digits, a tool call
(complete or truncated) and output cut at ``max_tokens`` are errors: the call's :class:`~memrl.data.schemas.MemoryCall`
gets ``error``, the run counts ``sam_<role>_errors`` and ``sam_error_<kind>``, and the output contributes nothing
(a page whose cue failed is listed as ``(no cue)``; a recall whose every page failed is a tool error). When only
some pages of a recall failed, the reasoner gets what the others gave plus a ``failed pages:`` line naming each
failed page and why (counted as ``sam_partial_recalls``), so it can retry them instead of trusting a silent gap.
Invalid tool calls (no intent, page ids that are not numbers or do not exist, too many pages, an empty store) are
tool errors with a clear message, counted as ``sam_tool_errors`` and ``sam_error_<kind>``. Other garbage passes
through as text.

All per-episode state is plain data (lists, dicts, dataclasses), so a rollout deep-copies at any pending call. Token
counts use the ``count_tokens`` callable (default :func:`memrl.data.envs.base.count_tokens`; :func:`make_token_counter`
wraps a real tokenizer and is shared, not copied, by ``copy.deepcopy``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, model_validator

from memrl.data.config import ConfigModel, RegexPattern
from memrl.data.envs.base import count_tokens as approximate_count_tokens
from memrl.data.formats import (
    NOTHING_RELEVANT,
    SAM_REASONER_SYSTEM,
    ToolCall,
    parse_tool_calls,
    render_sam_consolidate_prompt,
    render_sam_memory_block,
    render_sam_recall_prompt,
    render_sam_recalled,
)
from memrl.data.schemas import MemoryCall, Message
from memrl.data.tasks.common import as_messages
from memrl.data.tasks.sam import render_page
from memrl.rollout.memory.base import MemoryRequest, MemorySystem, RoleSampling, ToolResult, Turn, register_memory
from memrl.rollout.memory.workflow import action_of

__all__ = [
    "MISSING_CUE",
    "LiveUnit",
    "Page",
    "PagedMemory",
    "PagingConfig",
    "RecallJob",
    "SamConfig",
    "SamMemory",
    "TokenCounter",
    "TokenizerCounter",
    "make_token_counter",
    "parse_page_ids",
]

TokenCounter = Callable[[str], int]
MISSING_CUE = "(no cue)"
# What the reasoner is told about a page the memory model failed on: short, since it stays in the live context.
_BRIEF_ERRORS = {
    "tool_call": "a tool call, not memory text",
    "truncated": "output cut at max_tokens",
    "empty": "empty output",
    "no_text": "no letters or digits",
}


class TokenizerCounter:
    """``len(tokenizer.encode(text))`` without special tokens; copies of a memory system share it (and the
    tokenizer)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(self, text: str) -> int:
        """Tokens of ``text``."""
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def _chat(self, messages: list[dict[str, str]], generation_prompt: bool) -> int:
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=True, return_dict=False
        )
        return len(ids)

    def message(self, role: str, content: str) -> int:
        """Tokens of one message as the chat template renders it (the template's markup included)."""
        return self._chat([{"role": role, "content": content}], False)

    def generation_prompt(self) -> int:
        """Tokens the chat template adds to open the assistant's reply."""
        probe = [{"role": "user", "content": "x"}]
        return self._chat(probe, True) - self._chat(probe, False)

    def __deepcopy__(self, memo: dict[int, Any]) -> TokenizerCounter:
        return self


def make_token_counter(tokenizer: Any = None) -> TokenCounter:
    """The token counter of a memory system: the tokenizer's when given, else the approximate counter."""
    return approximate_count_tokens if tokenizer is None else TokenizerCounter(tokenizer)


class PagingConfig(ConfigModel):
    """How the live context is cut into pages (shared by SAM and the retrieval baselines)."""

    page_tokens: int = Field(1024, ge=1, description="page budget: tokens of page text")
    page_turns: int | None = Field(None, ge=1, description="at most this many turns per page (1: one-turn pages)")
    live_capacity_tokens: int = Field(2048, ge=1, description="cut pages once the live context has this many tokens")
    live_capacity_turns: int | None = Field(None, ge=1, description="... or this many turns")
    keep_recent_tokens: int = Field(1024, ge=0, description="after a cut, at most this many tokens stay raw")
    keep_recent_turns: int | None = Field(None, ge=0, description="... and at most this many turns")
    pin_pattern: RegexPattern = Field(
        r"(?m)^question: ", description="an observation matching it is never cut, nor later ones"
    )

    @model_validator(mode="after")
    def _consistent(self) -> PagingConfig:
        if self.keep_recent_tokens >= self.live_capacity_tokens:
            raise ValueError("keep_recent_tokens must be below live_capacity_tokens")
        capacity, keep = self.live_capacity_turns, self.keep_recent_turns
        if capacity is not None and keep is not None and keep >= capacity:
            raise ValueError("keep_recent_turns must be below live_capacity_turns")
        return self


class SamConfig(PagingConfig):
    """SAM's settings. One-turn pages (the embedded default's choice)::

    {name: sam, page_turns: 1, live_capacity_turns: 4, keep_recent_turns: 3}
    """

    name: Literal["sam"] = "sam"  # selects this memory system
    max_recall_pages: int = Field(4, ge=1, description="at most this many page ids per memory call")
    max_cue_tokens: int = Field(48, ge=1, description="a longer cue is cut to this many tokens")
    end_markers: list[str] = Field(["<|endoftext|>", "<|im_end|>"], description="memory outputs end at these")
    expert_metadata: list[str] = Field(
        ["gold_entities", "evidence_steps"],
        description="episode metadata keys passed on in memory requests (the oracle expert reads them; model engines "
        "ignore request metadata)",
    )
    sampling: dict[str, RoleSampling] = {
        "consolidate": RoleSampling(temperature=1.0, max_tokens=64),
        "recall": RoleSampling(temperature=1.0, max_tokens=128),
    }


@dataclass
class LiveUnit:
    """One reasoner step in the live context: its reply, the observation, and their token counts."""

    step: int
    action_text: str
    observation: str
    role: str
    context_tokens: int  # tokens the reply and the observation take in the reasoner's context
    page_tokens: int  # tokens of the unit's page text
    pinned: bool = False
    messages: list[Message] = field(default_factory=list)  # as the reasoner sees it, built once

    def __post_init__(self) -> None:
        if not self.messages:
            if self.action_text:
                self.messages.append(Message(role="assistant", content=self.action_text))
            self.messages.append(Message(role=self.role, content=self.observation))  # type: ignore[arg-type]


@dataclass
class Page:
    """A raw page in the page store."""

    page_id: int
    text: str
    steps: list[int]
    tokens: int


@dataclass
class RecallJob:
    """A running ``memory`` tool call: the pages still to read and the running extraction."""

    intent: str
    page_ids: list[int]
    index: int = 0
    so_far: str = ""
    read: int = 0  # pages whose output was usable
    errors: list[str] = field(default_factory=list)  # full messages, for the all-pages-failed tool error
    failed: list[str] = field(default_factory=list)  # brief notes (``p3 (empty output)``) shown to the reasoner


def parse_page_ids(value: Any) -> list[int] | None:
    """Page ids as a reasoner may write them: a list (or a single value, or a comma/space separated string) of
    numbers or ``pN`` names; duplicates dropped, order kept. None when something is not a page number."""
    if value is None:
        return []
    items = re.split(r"[,\s]+", value.strip()) if isinstance(value, str) else value
    if not isinstance(items, list):
        items = [items]
    out: list[int] = []
    for item in items:
        if isinstance(item, bool):
            return None
        if isinstance(item, int):
            number = item
        elif isinstance(item, str) and re.fullmatch(r"[pP]?-?\d+", item.strip()):
            number = int(item.strip().lstrip("pP"))
        elif isinstance(item, str) and not item.strip():
            continue
        else:
            return None
        if number not in out:
            out.append(number)
    return out


class PagedMemory(MemorySystem):
    """The live context and its paging (see the module docstring): the base of SAM and the retrieval baselines.

    Subclasses render the memory block (:meth:`memory_block`) and react to new pages (:meth:`_on_page`).
    """

    reasoner_system = SAM_REASONER_SYSTEM

    def __init__(self, paging: PagingConfig, count_tokens: TokenCounter | None = None) -> None:
        super().__init__()
        self.paging = paging
        self.count_tokens = count_tokens or approximate_count_tokens
        self._pin = re.compile(paging.pin_pattern)
        self._clear()

    def _clear(self) -> None:
        self.task = ""
        self.episode: dict[str, Any] = {}
        self.live: list[LiveUnit] = []
        self.pages: list[Page] = []

    # ---------------------------------------------------------------------------------------------------------
    def reset(self, task: str, metadata: dict[str, Any]) -> None:
        """Start an episode: empty live context, empty page store, fresh stats."""
        self._clear()
        self.stats = {}
        self.task = task
        self.episode = dict(metadata)

    def on_turn(self, turn: Turn) -> None:
        """Add the step to the live context and cut pages if it reached capacity."""
        pinned = bool(self.live and self.live[-1].pinned) or self._is_question(turn)
        page_text = render_page(
            [(action_of(turn.action_text) if turn.action_text else "", turn.observation)], [turn.step]
        )
        self.live.append(
            LiveUnit(
                step=turn.step,
                action_text=turn.action_text,
                observation=turn.observation,
                role=turn.role,
                context_tokens=self.count_tokens(turn.action_text) + self.count_tokens(turn.observation),
                page_tokens=self.count_tokens(page_text),
                pinned=pinned,
            )
        )
        for page in self._cut():
            self._on_page(page)

    def _is_question(self, turn: Turn) -> bool:
        if turn.role == "user" and not turn.action_text and turn.step > 0:
            return True  # question-answering mode: the question arrives as a user turn
        return self._pin.search(turn.observation) is not None

    def _cut(self) -> list[Page]:
        cfg = self.paging
        tokens = sum(u.context_tokens for u in self.live)
        turns = len(self.live)
        full = tokens >= cfg.live_capacity_tokens or (
            cfg.live_capacity_turns is not None and turns >= cfg.live_capacity_turns
        )
        if not full:
            return []
        limit = next((i for i, u in enumerate(self.live) if u.pinned), turns - 1)
        limit = min(limit, turns - 1)
        keep_turns = turns if cfg.keep_recent_turns is None else cfg.keep_recent_turns
        cut = 0
        while cut < limit and (tokens > cfg.keep_recent_tokens or turns - cut > keep_turns):
            tokens -= self.live[cut].context_tokens
            cut += 1
        if cut == 0:
            return []
        evicted, self.live = self.live[:cut], self.live[cut:]
        return self._pack(evicted)

    def _pack(self, units: list[LiveUnit]) -> list[Page]:
        cfg = self.paging
        pages: list[Page] = []
        current: list[LiveUnit] = []
        size = 0
        for unit in units:
            grown = size + unit.page_tokens + (1 if current else 0)  # the newline that joins units
            if current and (grown > cfg.page_tokens or (cfg.page_turns is not None and len(current) >= cfg.page_turns)):
                pages.append(self._new_page(current))
                current, size = [], 0
                grown = unit.page_tokens
            current.append(unit)
            size = grown
        if current:
            pages.append(self._new_page(current))
        return pages

    def _new_page(self, units: list[LiveUnit]) -> Page:
        text = render_page(
            [(action_of(u.action_text) if u.action_text else "", u.observation) for u in units], [u.step for u in units]
        )
        page = Page(page_id=len(self.pages), text=text, steps=[u.step for u in units], tokens=self.count_tokens(text))
        self.pages.append(page)
        self.count(f"{self.name}_pages")
        if page.tokens > self.paging.page_tokens:
            self.count(f"{self.name}_oversized_pages")
        return page

    def _on_page(self, page: Page) -> None:
        """A page left the live context (subclasses index it or queue its cue)."""

    # ---------------------------------------------------------------------------------------------------------
    def memory_block(self) -> str:
        """The reasoner's first user message: the task (and what the system shows of its memory)."""
        return render_sam_memory_block(self.task, [])

    def reasoner_messages(self, system_prompt: str) -> list[Message]:
        """System prompt, memory block, then the live units as (assistant reply, observation) pairs."""
        messages = [
            Message(role="system", content=system_prompt or self.reasoner_system),
            Message(role="user", content=self.memory_block()),
        ]
        for unit in self.live:
            messages += unit.messages
        return messages

    def _tool_error(self, kind: str, message: str) -> ToolResult:
        self.count(f"{self.name}_tool_errors")
        self.count(f"{self.name}_error_{kind}")
        return ToolResult(content="", error=message)


@register_memory("sam", config=SamConfig)
class SamMemory(PagedMemory):
    """SAM behind the memory-system interface (see the module docstring)."""

    name = "sam"
    tools = ("memory",)

    def __init__(self, config: SamConfig | None = None, count_tokens: TokenCounter | None = None) -> None:
        self.config = config or SamConfig()
        super().__init__(self.config, count_tokens)

    def _clear(self) -> None:
        super()._clear()
        self.cues: dict[int, str] = {}
        self._to_consolidate: list[int] = []
        self._recall: RecallJob | None = None
        self._result: ToolResult | None = None

    # ---------------------------------------------------------------------------------------------------------
    # Write path
    def _on_page(self, page: Page) -> None:
        self._to_consolidate.append(page.page_id)

    def memory_block(self) -> str:
        """The task and the cue bank."""
        return render_sam_memory_block(self.task, sorted(self.cues.items()))

    # ---------------------------------------------------------------------------------------------------------
    # Memory-model calls
    def _request(self, role: str, prompt: list[dict[str, str]], **metadata: Any) -> MemoryRequest:
        expert = {k: self.episode[k] for k in self.config.expert_metadata if k in self.episode}
        sampling = self.config.sampling.get(role, RoleSampling())
        return MemoryRequest(
            role=role, messages=as_messages(prompt), sampling=sampling, metadata={**expert, **metadata}
        )

    def next_memory_request(self) -> MemoryRequest | None:
        """Cues of new pages first (oldest first), then the pages of a running recall, one call per page."""
        if self._to_consolidate:
            page = self.pages[self._to_consolidate[0]]
            return self._request(
                "consolidate", render_sam_consolidate_prompt(page.page_id, page.text), page_id=page.page_id
            )
        job = self._recall
        if job is not None and job.index < len(job.page_ids):
            page = self.pages[job.page_ids[job.index]]
            prompt = render_sam_recall_prompt(job.intent, page.page_id, page.text, job.so_far)
            # Pages after the first continue the same memory action (one recall = one node of a memory-call tree).
            return self._request(
                "recall",
                prompt,
                page_id=page.page_id,
                intent=job.intent,
                page_ids=list(job.page_ids),
                read_index=job.index,
                continues_action=job.index > 0,
            )
        return None

    def _clean(self, call: MemoryCall) -> tuple[str, str | None, str | None]:
        """(cleaned text, error kind, error message) of a memory-model output."""
        text = call.text if isinstance(call.text, str) else ""
        for marker in self.config.end_markers:
            if marker and marker in text:
                text = text[: text.index(marker)]
        text = text.strip()
        if "<tool_call>" in text or "</tool_call>" in text or "<function=" in text:
            parsed = parse_tool_calls(text)
            detail = parsed.errors[0] if parsed.errors else "a tool call"
            return "", "tool_call", f"output is a tool call, not memory text ({detail})"
        if call.finish_reason == "length":
            return "", "truncated", "output cut at max_tokens"
        if not text:
            return "", "empty", "empty output"
        if not any(ch.isalnum() for ch in text):
            return "", "no_text", f"output has no letters or digits: {text[:40]!r}"
        return text, None, None

    def on_memory_result(self, request: MemoryRequest, call: MemoryCall) -> None:
        """Take a cue or one page's recall; errors are recorded on ``call`` and counted."""
        page_id = request.metadata.get("page_id")
        if request.role == "consolidate" and self._to_consolidate and self._to_consolidate[0] == page_id:
            self._to_consolidate.pop(0)
            self.count("sam_consolidate_calls")
            text, kind, message = self._clean(call)
            if kind is not None:
                self._call_error(call, "consolidate", kind, message)
                self.cues[page_id] = MISSING_CUE
            else:
                self.cues[page_id] = self._compact_cue(text)
            return
        job = self._recall
        if (
            request.role == "recall"
            and job is not None
            and job.index < len(job.page_ids)
            and job.page_ids[job.index] == page_id
        ):
            self.count("sam_recall_calls")
            text, kind, message = self._clean(call)
            if kind is not None:
                self._call_error(call, "recall", kind, message)
                job.errors.append(f"page {page_id}: {message}")
                job.failed.append(f"p{page_id} ({_BRIEF_ERRORS.get(kind, kind)})")
            else:
                job.read += 1
                job.so_far = "" if text.lower() == NOTHING_RELEVANT else text
            job.index += 1
            if job.index == len(job.page_ids):
                self._finish_recall(job)
            return
        self.count("sam_orphan_results")
        call.error = call.error or "no memory call of this system was waiting for this result"

    def _call_error(self, call: MemoryCall, role: str, kind: str, message: str | None) -> None:
        call.error = message
        self.count(f"sam_{role}_errors")
        self.count(f"sam_error_{kind}")

    def _compact_cue(self, text: str) -> str:
        cue = " ".join(text.split())  # one line in the bank
        if self.count_tokens(cue) <= self.config.max_cue_tokens:
            return cue
        self.count("sam_cue_truncated")
        words = cue.split(" ")
        lo, hi = 0, len(words)  # the longest word prefix that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.count_tokens(" ".join(words[:mid])) <= self.config.max_cue_tokens:
                lo = mid
            else:
                hi = mid - 1
        return " ".join(words[:lo]) or MISSING_CUE

    # ---------------------------------------------------------------------------------------------------------
    # Read path
    def _page_range(self) -> str:
        return f"p0-p{len(self.pages) - 1}" if len(self.pages) > 1 else "p0"

    def on_tool_call(self, call: ToolCall, step: int) -> None:
        """Check the reasoner's ``memory(intent, page_ids)`` call and start reading, or answer with a tool error."""
        self._result = None
        self._recall = None
        intent = call.arguments.get("intent")
        ids = parse_page_ids(call.arguments.get("page_ids"))
        cap = self.config.max_recall_pages
        if not isinstance(intent, str) or not intent.strip():
            self._result = self._tool_error("missing_intent", "memory needs an intent: say what to recall")
        elif ids is None:
            self._result = self._tool_error("bad_page_ids", "page_ids must be a list of page numbers such as [0, 3]")
        elif not self.pages:
            self._result = self._tool_error("no_pages", "memory is empty: no pages have been written yet")
        elif not ids:
            self._result = self._tool_error(
                "no_page_ids",
                f"memory needs page_ids: up to {cap} page numbers from the memory cues ({self._page_range()})",
            )
        elif unknown := [i for i in ids if not 0 <= i < len(self.pages)]:
            self._result = self._tool_error(
                "unknown_pages",
                f"no page {', '.join(f'p{i}' for i in unknown)} in memory (pages are {self._page_range()})",
            )
        elif len(ids) > cap:
            self._result = self._tool_error("too_many_pages", f"at most {cap} pages per memory call, got {len(ids)}")
        else:
            self.count("sam_recalls")
            self._recall = RecallJob(intent=intent.strip(), page_ids=sorted(ids))

    def _finish_recall(self, job: RecallJob) -> None:
        self._recall = None
        if job.read == 0:
            self._result = self._tool_error(
                "recall_failed", "the memory model gave no usable recall (" + "; ".join(job.errors) + ")"
            )
            return
        if not job.so_far:
            self.count("sam_empty_recalls")
        if job.failed:
            self.count("sam_partial_recalls")
        content = render_sam_recalled(job.intent, job.page_ids, job.so_far or NOTHING_RELEVANT, job.failed)
        self._result = ToolResult(content=content)

    def tool_result(self) -> ToolResult | None:
        """The finished recall (or tool error), taken once."""
        result, self._result = self._result, None
        return result
