"""The proactive memory agent ("Remember When It Matters: Proactive Memory Agent for Long-Horizon Agents", section 3): a
memory bank, two-phase memory steps, triggers and transient injection, with the paper's Table 2 ablations as
configuration switches.

**Bank** B = (status, knowledge, procedural). ``status`` is the memory model's private progress note: it appears in
the memory model's prompts only, never in the action agent's context. Knowledge entries hold stable facts
(requirements, environment facts), procedural entries hold attempts and outcomes (failed commands, fixes). Every entry
has a short id (``kN`` / ``pN``, one counter for both types), its content, its creation step and access statistics
(``shown``: rendered in a memory-model prompt; ``used``: delivered to the action agent). Once a type holds more than
``max_entries_per_type`` entries, prompts show only that many of them: the most relevant to the recent window under
BM25 (``bm25s``), in creation order.

**Memory step** at step t (the number of action-agent calls made so far), when the trigger g(t) fires:

1. Phase 1, role ``bank_edit`` (:func:`~memrl.data.formats.render_phase1_prompt`: task, recent window of
   ``window`` steps, bank). The reply is zero or more tool calls, JSON or the XML-ish form
   (:func:`~memrl.data.formats.parse_tool_calls`):
   ``memory_update_status(content)``, ``memory_save_knowledge(content[, id])``, ``memory_save_procedural(content[,
   id])``, ``memory_delete(id)``; applied in order (a save with the ``id`` of an existing entry of its type rewrites
   that entry). A malformed call, an unknown tool, a bad argument or an unknown id is skipped and recorded in the
   :class:`~memrl.data.schemas.MemoryCall`'s ``error`` and in the stats; it never stops the step.
2. Phase 2, role ``intervene`` (:func:`~memrl.data.formats.render_phase2_prompt` over the updated bank). The reply is
   ``<context_for_action>reminder</context_for_action>`` or ``<no_intervention/>``; a missing tag is silence, an
   unclosed or empty tag is a recorded error and also silence (:func:`~memrl.data.formats.parse_intervention`).

With ``cite_entries``, a reminder that cites bank entries (``k2``, ``k2, p5``, or ids then ``:`` and the entry's text
as the bank line shows it, ``k2: requirement: ...``) restates those entries: the action agent receives their exact
contents (joined by ``; ``), never the model's copy of them. A compact, structured Phase 2 output for small models; an
unknown id is a recorded error and the step stays silent.

A reminder goes into the next action-agent call only, as a transient ``memory context:`` user message after the
action agent's history (:func:`~memrl.data.formats.render_memory_context`); :meth:`ProactiveMemory.after_reasoner_call`
drops it, so it never enters the persistent history. The action agent's context is otherwise its own history: the
task statement, then its replies (verbatim) and the observations, cut to the last ``action_window`` steps
(0 keeps everything; the scripted proactive tasks give their agent a window, see
:func:`memrl.rollout.agents.build_proactive_rollout`).

**Trigger** g(t): the first step, then every ``trigger_every`` steps (0: no periodic trigger); optionally also after a
tool error (the last observation matches ``error_pattern``) and after a repeated command (the last command already
appears among the earlier steps of the window).

**Variants** (the paper's Table 2):

- ``full``: Phase 1 then Phase 2 (selective reminder or silence).
- ``full_bank``: Phase 1 only; the whole bank except ``status`` is the memory context of every action-agent call.
- ``always_inject``: Phase 1 then Phase 2, without silence. The Phase 2 prompt is unchanged (so a model trained on
  it needs no new prompt); when the answer is silence or malformed, the system injects the bank entry most relevant
  to the recent window instead (BM25; ties and all-zero scores go to the newest entry). The call keeps the model's own
  text, so training data stay what the model said; ``forced_injections`` counts the replacements. With an empty
  bank there is nothing to inject and the step stays silent.
- ``injection_only``: no bank: Phase 1 is skipped and Phase 2 sees an empty bank (task and window only).
- ``no_memory``: no memory model at all.

All state is plain data (dataclasses, lists, strings), so a rollout deep-copies at any pending call: pivot-turn GRPO
restores a step and samples G alternative Phase 2 decisions from one state.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import bm25s
from pydantic import Field

from memrl.data.config import ConfigModel, RegexPattern
from memrl.data.formats import (
    PROACTIVE_PHASES,
    ToolCall,
    parse_intervention,
    parse_tool_calls,
    render_bank,
    render_memory_context,
    render_proactive_prompt,
    render_window,
)
from memrl.data.schemas import MemoryCall, Message
from memrl.data.tasks.common import as_messages
from memrl.rollout.memory.base import MemoryRequest, MemorySystem, RoleSampling, Turn, register_memory
from memrl.rollout.memory.workflow import action_of, truncate

__all__ = [
    "BANK_TOOLS",
    "BankEntry",
    "MemoryBank",
    "ProactiveConfig",
    "ProactiveMemory",
    "bm25_scores",
    "render_exposed_bank",
]

BANK_TOOLS = ("memory_update_status", "memory_save_knowledge", "memory_save_procedural", "memory_delete")
_action_of = functools.lru_cache(maxsize=1 << 16)(action_of)  # every prompt re-reads the window's replies
_CITATION = re.compile(r"\s*([kKpP]\d+(?:\s*[,;\s]\s*[kKpP]\d+)*)\s*(?::.*)?", re.DOTALL)
Variant = Literal["full", "full_bank", "always_inject", "injection_only", "no_memory"]


class ProactiveConfig(ConfigModel):
    """The proactive memory agent's settings; ``variant`` selects the paper's ablations (see the module docstring)."""

    name: Literal["proactive"] = "proactive"  # selects this memory system
    variant: Variant = "full"  # Table 2 ablation: full, full_bank, always_inject, injection_only, no_memory
    window: int = Field(8, ge=1, description="k: steps of recent trajectory the memory model sees")
    action_window: int = Field(0, ge=0, description="steps of history in the action agent's context (0: all)")
    trigger_every: int = Field(1, ge=0, description="N: memory step at t = 0 and every N steps (0: first step only)")
    trigger_on_error: bool = False  # g(t) also fires after a tool error (error_pattern)
    trigger_on_repeat: bool = False  # g(t) also fires after a command repeated in the window
    error_pattern: RegexPattern = Field(
        r"(?im)^(error|fatal|traceback)\b|command not found|cannot stat|no such file",
        description="an observation matching this regex is a tool error (for trigger_on_error)",
    )
    max_entries_per_type: int = Field(16, ge=1, description="entries per type shown in prompts (BM25 prefilter)")
    max_entry_chars: int = Field(400, ge=0, description="bank entries and status are cut to this length (0: whole)")
    cite_entries: bool = Field(False, description="a reminder citing entry ids restates those entries")
    sampling: dict[str, RoleSampling] = {
        "bank_edit": RoleSampling(temperature=1.0, max_tokens=256),
        "intervene": RoleSampling(temperature=1.0, max_tokens=128),
    }

    @property
    def uses_bank(self) -> bool:
        """Whether Phase 1 runs (every variant but injection-only and no memory)."""
        return self.variant in ("full", "full_bank", "always_inject")

    @property
    def uses_phase2(self) -> bool:
        """Whether Phase 2 runs."""
        return self.variant in ("full", "always_inject", "injection_only")


@dataclass
class BankEntry:
    """One knowledge or procedural memory with its metadata and access statistics."""

    entry_id: str
    kind: Literal["knowledge", "procedural"]
    content: str
    created_step: int
    updated_step: int
    shown: int = 0  # rendered in a memory-model prompt
    used: int = 0  # delivered to the action agent (quoted by a reminder, or exposed with the full bank)


@dataclass
class MemoryBank:
    """B = (status, knowledge, procedural) as plain data."""

    status: str = ""
    entries: list[BankEntry] = field(default_factory=list)
    next_id: int = 1

    def of(self, kind: str) -> list[BankEntry]:
        """The entries of one type, in creation order."""
        return [e for e in self.entries if e.kind == kind]

    def find(self, entry_id: str) -> BankEntry | None:
        """The entry with this id, or None."""
        return next((e for e in self.entries if e.entry_id == entry_id), None)


def render_exposed_bank(bank: MemoryBank) -> str:
    """The bank as the full-bank ablation shows it to the action agent: entries only, never the status."""
    full = render_bank("", _pairs(bank.of("knowledge")), _pairs(bank.of("procedural")))
    return full.split("\n", 1)[1]  # render_bank's first line is the status line


def _pairs(entries: list[BankEntry]) -> list[tuple[str, str]]:
    return [(e.entry_id, e.content) for e in entries]


def _tokens(texts: list[str]) -> list[list[str]]:
    return bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)


def bm25_scores(documents: list[str], query: str) -> list[float]:
    """BM25 score of each document for ``query`` (all zero when either side has no indexable word)."""
    docs, (q,) = _tokens(documents), _tokens([query])
    if not q or not any(docs):
        return [0.0] * len(documents)
    index = bm25s.BM25()
    index.index(docs, show_progress=False)
    return [float(s) for s in index.get_scores(q)]


def _as_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, int | float | bool):  # the XML-ish form reads "5432" or "true" as JSON scalars
        return json.dumps(value)
    return None


@register_memory("proactive", config=ProactiveConfig)
class ProactiveMemory(MemorySystem):
    """The proactive memory agent behind the memory-system interface (see the module docstring)."""

    name = "proactive"

    def __init__(self, config: ProactiveConfig | None = None) -> None:
        super().__init__()
        self.config = config or ProactiveConfig()
        self._error_re = re.compile(self.config.error_pattern)
        self.reset("", {})

    # ---------------------------------------------------------------------------------------------------------
    # Episode state

    def reset(self, task: str, metadata: dict[str, Any]) -> None:
        """Start an episode: empty bank, no history, no pending memory step."""
        self.task = task
        self.bank = MemoryBank()
        self.turns: list[tuple[int, str, str, str]] = []  # (step, reasoner reply, observation, message role)
        self.step = 0
        self._planned_step: int | None = None
        self._queue: list[str] = []  # roles still to call at this memory step
        self._triggers: list[str] = []
        self._request: MemoryRequest | None = None
        self._reminder: str | None = None  # transient: the next action-agent call only

    def on_turn(self, turn: Turn) -> None:
        """Record an action-agent step (the task statement is step 0)."""
        self.turns.append((turn.step, turn.action_text, turn.observation, turn.role))
        self.step = turn.step

    # ---------------------------------------------------------------------------------------------------------
    # The action agent's context

    def reasoner_messages(self, system_prompt: str) -> list[Message]:
        """System prompt, the last ``action_window`` steps of history, then the transient memory context if any."""
        k = self.config.action_window
        turns = self.turns[-k:] if k else self.turns
        messages = [Message(role="system", content=system_prompt)]
        for step, reply, observation, role in turns:
            if step > 0:
                messages.append(Message(role="assistant", content=reply))
            messages.append(Message(role="tool" if role == "tool" else "user", content=observation))
        context = self._transient_context()
        if context is not None:
            messages.append(Message(role="user", content=render_memory_context(context)))
        return messages

    def _transient_context(self) -> str | None:
        if self.config.variant == "full_bank":
            return render_exposed_bank(self.bank) if self.bank.entries else None
        return self._reminder

    def after_reasoner_call(self) -> None:
        """The action agent consumed its context: count the delivery and drop the reminder."""
        if self.config.variant == "full_bank":
            if self.bank.entries:
                self.count("bank_exposures")
                for entry in self.bank.entries:
                    entry.used += 1
            return
        if self._reminder is None:
            return
        self.count("reminders_injected")
        text = self._reminder.lower()
        for entry in self.bank.entries:
            if entry.content.lower() in text or re.search(rf"\b{re.escape(entry.entry_id)}\b", text):
                entry.used += 1
        self._reminder = None

    # ---------------------------------------------------------------------------------------------------------
    # Trigger and memory-model requests

    def triggers(self, t: int) -> list[str]:
        """Why g(t) fires at step ``t`` (empty: no memory step): ``first``, ``schedule``, ``error``, ``repeat``."""
        cfg = self.config
        fired = []
        if t == 0:
            fired.append("first")
        elif cfg.trigger_every and t % cfg.trigger_every == 0:
            fired.append("schedule")
        if t > 0 and self.turns:
            _, reply, observation, _ = self.turns[-1]
            if cfg.trigger_on_error and self._error_re.search(observation):
                fired.append("error")
            if cfg.trigger_on_repeat:
                earlier = {_action_of(r) for s, r, _, _ in self.turns[-cfg.window : -1] if s > 0}
                if _action_of(reply) in earlier:
                    fired.append("repeat")
        return fired

    def next_memory_request(self) -> MemoryRequest | None:
        """Phase 1 / Phase 2 of this step's memory step, while any is left."""
        if self._planned_step != self.step:
            self._planned_step = self.step
            self._triggers = self.triggers(self.step) if self.config.variant != "no_memory" else []
            self._queue, self._request = [], None
            if self._triggers:
                self.count("memory_steps")
                for trigger in self._triggers:
                    self.count(f"triggers_{trigger}")
                self._queue = [
                    r for r, on in (("bank_edit", self.config.uses_bank), ("intervene", self.config.uses_phase2)) if on
                ]
        if not self._queue:
            return None
        if self._request is None:  # built once per call, so asking again neither changes it nor recounts stats
            self._request = self._build_request(self._queue[0])
        return self._request

    def _build_request(self, role: str) -> MemoryRequest:
        bank_text = self._prompt_bank() if self.config.uses_bank else render_bank("", [], [])
        messages = as_messages(render_proactive_prompt(role, self.task, self._window_text(), bank_text))
        sampling = self.config.sampling.get(role, RoleSampling())
        metadata = {
            "memory_step": self.step,
            "phase": PROACTIVE_PHASES[role],
            "triggers": list(self._triggers),
        }
        return MemoryRequest(role=role, messages=messages, sampling=sampling, metadata=metadata)

    def _window(self) -> list[tuple[int, str, str]]:
        return [
            (s, " ".join(_action_of(r).split()) if s > 0 else "", o) for s, r, o, _ in self.turns[-self.config.window :]
        ]

    def _window_text(self) -> str:
        return render_window(self._window())

    def _prompt_bank(self) -> str:
        """The bank for a memory-model prompt: status, then per type the entries the prefilter keeps."""
        query = self._window_text()
        shown = []
        for kind in ("knowledge", "procedural"):
            entries = self.bank.of(kind)
            limit = self.config.max_entries_per_type
            if len(entries) > limit:
                scores = bm25_scores([e.content for e in entries], query)
                # best score first, the newer entry first among equals; then back to creation order
                ranked = sorted(range(len(entries)), key=lambda i: (-scores[i], -i))[:limit]
                entries = [entries[i] for i in sorted(ranked)]
                self.count("prefilter_dropped", len(self.bank.of(kind)) - limit)
            for entry in entries:
                entry.shown += 1
            shown.append(entries)
        return render_bank(self.bank.status, _pairs(shown[0]), _pairs(shown[1]))

    # ---------------------------------------------------------------------------------------------------------
    # Memory-model results

    def on_memory_result(self, request: MemoryRequest, call: MemoryCall) -> None:
        """Apply Phase 1's bank edits or take Phase 2's decision; errors go to ``call.error`` and the stats."""
        if not self._queue or self._queue[0] != request.role:
            raise RuntimeError(f"proactive: unexpected {request.role!r} result (waiting for {self._queue})")
        self._queue.pop(0)
        self._request = None
        if request.role == "bank_edit":
            self.count("bank_edit_calls")
            applied, errors = self.apply_bank_edits(call.text)
            call.metadata["applied"] = applied
        else:
            self.count("intervene_calls")
            errors = self._intervene(call)
        if errors:
            call.error = "; ".join(errors)
            self.count(f"{request.role}_errors", len(errors))

    def apply_bank_edits(self, text: str) -> tuple[list[str], list[str]]:
        """Apply every well-formed bank tool call in ``text`` in order; returns (applied tool names, errors)."""
        parsed = parse_tool_calls(text)
        errors = list(parsed.errors)
        if parsed.errors:
            self.count("bank_edit_malformed", len(parsed.errors))
        applied = []
        for call in parsed.calls:
            error = self._apply(call)
            if error is None:
                applied.append(call.name)
                self.count(f"op_{call.name}")
            else:
                errors.append(error)
        return applied, errors

    def _apply(self, call: ToolCall) -> str | None:
        if call.name not in BANK_TOOLS:
            self.count("bank_edit_unknown_tool")
            return f"unknown tool {call.name!r}"
        args = call.arguments
        if call.name == "memory_delete":
            entry = self._lookup(args.get("id"))
            if isinstance(entry, str):
                return f"memory_delete: {entry}"
            self.bank.entries.remove(entry)
            return None
        content = _as_text(args.get("content"))
        if not content:
            self.count("bank_edit_bad_args")
            return f"{call.name}: missing or empty content"
        content = truncate(" ".join(content.split()), self.config.max_entry_chars)
        if call.name == "memory_update_status":
            self.bank.status = content
            return None
        kind: Literal["knowledge", "procedural"] = "knowledge" if call.name.endswith("knowledge") else "procedural"
        if args.get("id") is not None:
            entry = self._lookup(args.get("id"))
            if isinstance(entry, str):
                return f"{call.name}: {entry}"
            if entry.kind != kind:
                self.count("bank_edit_bad_args")
                return f"{call.name}: {entry.entry_id} is a {entry.kind} entry"
            entry.content, entry.updated_step = content, self.step
            return None
        entry_id = f"{kind[0]}{self.bank.next_id}"
        self.bank.next_id += 1
        self.bank.entries.append(BankEntry(entry_id, kind, content, self.step, self.step))
        return None

    def _lookup(self, raw: Any) -> BankEntry | str:
        entry_id = _as_text(raw)
        if not entry_id:
            self.count("bank_edit_bad_args")
            return "missing id"
        entry = self.bank.find(entry_id.lower())
        if entry is None:
            self.count("bank_edit_unknown_id")
            return f"unknown id {entry_id!r}"
        return entry

    def delivered(self, text: str) -> tuple[str | None, str | None, list[str] | None]:
        """What a Phase 2 output delivers to the action agent now: (reminder or None, error or None, cited ids or
        None). With ``cite_entries`` a citation becomes the cited entries' exact contents (an unknown id: silence and
        an error)."""
        reminder, error = parse_intervention(text)
        cited = _CITATION.fullmatch(reminder) if reminder is not None and self.config.cite_entries else None
        if cited is None:
            return reminder, error, None
        ids = re.findall(r"[kp]\d+", cited.group(1).lower())
        entries = [self.bank.find(i) for i in ids]
        if any(e is None for e in entries):
            return None, f"unknown entry id in {ids}", ids
        return "; ".join(e.content for e in entries if e is not None), error, ids

    def _intervene(self, call: MemoryCall) -> list[str]:
        reminder, error, ids = self.delivered(call.text)
        if ids is not None:
            call.metadata["cited"] = ids
            if reminder is None:
                self.count("intervene_unknown_id")
        forced = False
        if reminder is None and self.config.variant == "always_inject":
            reminder = self._most_relevant_entry()
            forced = reminder is not None
            if forced:
                self.count("forced_injections")
        self.count("reminders" if reminder is not None else "silences")
        self._reminder = reminder
        call.metadata.update(reminder=reminder, forced=forced)
        return [error] if error else []

    def _most_relevant_entry(self) -> str | None:
        entries = self.bank.entries
        if not entries:
            return None
        scores = bm25_scores([e.content for e in entries], self._window_text())
        best = max(range(len(entries)), key=lambda i: (scores[i], entries[i].created_step, i))
        return entries[best].content
