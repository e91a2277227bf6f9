"""Wire formats shared by the memory systems (``rollout``) and the programmatic agents (``data``): prompt templates,
their renderers, and tolerant parsers. One home for each format: memory systems render with these functions, the
scripted reasoner / action agent / oracle experts read with them, and SFT rows are the exact rendered messages.

Parsers never raise on model output: they return what they could read plus a list of errors.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = [
    "ACTION_AGENT_SYSTEM",
    "ADMISSIBLE_ACTIONS_PREFIX",
    "CONSOLIDATE_SYSTEM",
    "LONG_CONTEXT_REASONER_SYSTEM",
    "MEMORY_CONTEXT_PREFIX",
    "NOTHING_RELEVANT",
    "PHASE1_SYSTEM",
    "PHASE2_SYSTEM",
    "PROACTIVE_PHASES",
    "RECALL_SYSTEM",
    "RETRIEVAL_REASONER_SYSTEM",
    "SAM_FAILED_PAGES_PREFIX",
    "SAM_REASONER_SYSTEM",
    "SAM_TOOLS",
    "TOOL_ERROR_PREFIX",
    "BankView",
    "ParsedToolCalls",
    "SamConsolidatePrompt",
    "SamContext",
    "SamRecallFailed",
    "SamRecallPrompt",
    "SamRecalled",
    "ToolCall",
    "answer_body",
    "json_answer",
    "parse_bank",
    "parse_intervention",
    "parse_memory_context",
    "parse_phase_prompt",
    "parse_sam_consolidate_prompt",
    "parse_sam_memory_block",
    "parse_sam_recall_failures",
    "parse_sam_recall_prompt",
    "parse_sam_recalled",
    "parse_sam_tool_result",
    "parse_tool_calls",
    "parse_window",
    "read_sam_context",
    "render_admissible_actions",
    "render_bank",
    "render_intervention",
    "render_memory_context",
    "render_phase1_prompt",
    "render_phase2_prompt",
    "render_proactive_prompt",
    "render_sam_consolidate_prompt",
    "render_sam_memory_block",
    "render_sam_recall_prompt",
    "render_sam_recalled",
    "render_tool_call",
    "render_tool_error",
    "render_window",
]

# ----------------------------------------------------------------------------------------------------------------
# Tool calls: JSON inside <tool_call> tags (Hermes/Qwen2.5 style), Qwen3-Coder's XML-ish form, or a bare JSON object.


@dataclass
class ToolCall:
    """One parsed tool call."""

    name: str
    arguments: dict[str, Any]
    raw: str = ""


@dataclass
class ParsedToolCalls:
    """Every well-formed call found in a text, in order, and a description of every malformed one."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


# A fragment ends at its closing tag, at the next opening tag, or at the end of the text: a stray opening tag must not
# swallow the well-formed call that follows it (it becomes an error of its own instead).
_TAGGED = re.compile(r"<tool_call>(.*?)(</tool_call>|(?=<tool_call>)|\Z)", re.DOTALL)
_XML_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)(?:</function>|(?=<function=)|$)", re.DOTALL)
_XML_PARAM = re.compile(r"<parameter=([^>\s]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)


def _xml_value(raw: str) -> Any:
    value = raw.strip()
    if value[:1] in "[{" or value in ("true", "false", "null") or re.fullmatch(r"-?\d+(\.\d+)?", value or "x"):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _from_json_object(obj: Any, raw: str) -> ToolCall | str:
    if not isinstance(obj, dict):
        return f"tool call is not a JSON object: {raw[:80]!r}"
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return f"arguments of {name!r} are not JSON: {args[:80]!r}"
    if not isinstance(name, str) or not name:
        return f"tool call without a name: {raw[:80]!r}"
    if not isinstance(args, dict):
        return f"arguments of {name!r} are not an object"
    return ToolCall(name=name, arguments=args, raw=raw)


def _parse_one(body: str) -> ToolCall | str:
    body_stripped = body.strip()
    fn = _XML_FUNCTION.search(body_stripped)
    if fn is not None:
        name = fn.group(1).strip()
        if not fn.group(0).rstrip().endswith("</function>"):
            return f"truncated tool call {name!r} (no </function>)"
        args = {m.group(1).strip(): _xml_value(m.group(2)) for m in _XML_PARAM.finditer(fn.group(2))}
        return ToolCall(name=name, arguments=args, raw=body)
    try:
        obj = json.loads(body_stripped)
    except json.JSONDecodeError as exc:
        return f"tool call is not valid JSON ({exc.msg}): {body_stripped[:80]!r}"
    return _from_json_object(obj, body)


_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def answer_body(text: Any) -> str:
    """A model's answer without its ``<think>`` blocks, stripped ("" for a non-string)."""
    return _THINK.sub("", text).strip() if isinstance(text, str) else ""


def json_answer(body: str, kind: type[dict] | type[list]) -> Any:
    """The JSON object (``kind`` dict) or list (``kind`` list) an answer body is, or None when it is not one."""
    if not body.startswith("{" if kind is dict else "["):
        return None
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, kind) else None


def parse_tool_calls(text: str) -> ParsedToolCalls:
    """Find every tool call in ``text``: ``<tool_call>{json}</tool_call>``, ``<tool_call><function=NAME>
    <parameter=P>V</parameter></function></tool_call>``, or (when no tag is present) bare JSON objects with a
    ``name``. Never raises; a truncated or malformed call is reported in ``errors``."""
    out = ParsedToolCalls()
    if not isinstance(text, str):
        out.errors.append("output is not text")
        return out
    found_tag = False
    for match in _TAGGED.finditer(text):
        found_tag = True
        closed = bool(match.group(2))
        why = "no </tool_call>" if match.end() == len(text) else "a new <tool_call> began before </tool_call>"
        parsed = _parse_one(match.group(1))
        if isinstance(parsed, str):
            out.errors.append(parsed if closed else f"truncated tool call ({why}): {parsed}")
        elif not closed:
            out.errors.append(f"truncated tool call {parsed.name!r} ({why})")
        else:
            out.calls.append(parsed)
    if not found_tag:
        for match in _XML_FUNCTION.finditer(text):
            parsed = _parse_one(match.group(0))
            (out.errors.append(parsed) if isinstance(parsed, str) else out.calls.append(parsed))
        if not out.calls and not out.errors:
            decoder = json.JSONDecoder()
            index = text.find("{")
            while index != -1:
                try:
                    obj, end = decoder.raw_decode(text, index)
                except json.JSONDecodeError:
                    index = text.find("{", index + 1)
                    continue
                if isinstance(obj, dict) and "name" in obj:
                    parsed = _from_json_object(obj, text[index:end])
                    (out.errors.append(parsed) if isinstance(parsed, str) else out.calls.append(parsed))
                index = text.find("{", end)
    return out


def render_tool_call(name: str, arguments: dict[str, Any], style: str = "json") -> str:
    """Render one tool call as ``<tool_call>{json}</tool_call>`` (style ``json``) or the XML-ish form (``xml``)."""
    if style == "json":
        return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "</tool_call>"
    if style == "xml":
        params = "".join(
            f"<parameter={k}>{v if isinstance(v, str) else json.dumps(v)}</parameter>" for k, v in arguments.items()
        )
        return f"<tool_call><function={name}>{params}</function></tool_call>"
    raise ValueError(f"unknown tool-call style {style!r}")


# ----------------------------------------------------------------------------------------------------------------
# SAM memory-model prompts ("SAM: State-Adaptive Memory for Long-Horizon Reasoning Agent", arXiv 2605.24468, section
# 2.2). The user messages are short on purpose: tiny models read them.

CONSOLIDATE_SYSTEM = "Write one compact memory cue for the page: what it establishes and what may matter later."
RECALL_SYSTEM = "Read the page under the intent. Update the extraction with what serves the intent."
NOTHING_RELEVANT = "nothing relevant"


def render_sam_consolidate_prompt(page_id: int, page_text: str) -> list[dict[str, str]]:
    """Messages for writing the cue of page ``page_id``."""
    return [
        {"role": "system", "content": CONSOLIDATE_SYSTEM},
        {"role": "user", "content": f"page {page_id}:\n{page_text}\ncue:"},
    ]


def render_sam_recall_prompt(intent: str, page_id: int, page_text: str, so_far: str) -> list[dict[str, str]]:
    """Messages for reading one selected page under ``intent``, carrying the running extraction ``so_far``."""
    return [
        {"role": "system", "content": RECALL_SYSTEM},
        {
            "role": "user",
            "content": f"intent: {intent}\npage {page_id}:\n{page_text}\nso far: {so_far or NOTHING_RELEVANT}\nrecall:",
        },
    ]


_CONSOLIDATE_RE = re.compile(r"\Apage (\d+):\n(.*)\ncue:\Z", re.DOTALL)
_RECALL_RE = re.compile(r"\Aintent: (.*?)\npage (\d+):\n(.*)\nso far: (.*)\nrecall:\Z", re.DOTALL)


def _last_user(messages: list[Any]) -> str:
    for m in reversed(messages):
        role = m["role"] if isinstance(m, dict) else m.role
        if role == "user":
            return m["content"] if isinstance(m, dict) else m.content
    return ""


class SamConsolidatePrompt(NamedTuple):
    """What a ``consolidate`` call asks the memory model: write the cue of page ``page_id`` from its text."""

    page_id: int
    page_text: str


class SamRecallPrompt(NamedTuple):
    """What a ``recall`` call asks the memory model: read page ``page_id`` under ``intent`` and return the updated
    extraction (``so_far`` is the extraction of the pages read before it in this recall; empty for the first)."""

    intent: str
    page_id: int
    page_text: str
    so_far: str


def parse_sam_consolidate_prompt(messages: list[Any]) -> SamConsolidatePrompt | None:
    """(page id, page text) from consolidation messages, or None when they are not one."""
    m = _CONSOLIDATE_RE.match(_last_user(messages))
    return SamConsolidatePrompt(int(m.group(1)), m.group(2)) if m else None


def parse_sam_recall_prompt(messages: list[Any]) -> SamRecallPrompt | None:
    """(intent, page id, page text, extraction so far) from recall messages, or None when they are not one."""
    m = _RECALL_RE.match(_last_user(messages))
    if not m:
        return None
    so_far = m.group(4)
    return SamRecallPrompt(m.group(1), int(m.group(2)), m.group(3), "" if so_far == NOTHING_RELEVANT else so_far)


SAM_REASONER_SYSTEM = (
    "You solve the task step by step. Tools: act(action) acts in the environment; memory(intent, page_ids) recalls "
    "earlier pages listed under memory cues; answer(answer) ends the task. Reply with one tool call."
)
# The reasoner's system prompts under the baselines (memrl.rollout.memory.baselines): the same task, other tools.
RETRIEVAL_REASONER_SYSTEM = (
    "You solve the task step by step. Tools: act(action) acts in the environment; memory(intent) retrieves the "
    "earlier pages most relevant to the intent; answer(answer) ends the task. Reply with one tool call."
)
LONG_CONTEXT_REASONER_SYSTEM = (
    "You solve the task step by step. Tools: act(action) acts in the environment; answer(answer) ends the task. "
    "Reply with one tool call."
)


def render_sam_memory_block(task: str, cues: list[tuple[int, str]]) -> str:
    """The reasoner's first user message: the task and the cue bank (one line per page)."""
    lines = [f"task: {task}", "memory cues:" if cues else "memory cues: none"]
    lines += [f"p{page_id}: {cue}" for page_id, cue in cues]
    return "\n".join(lines)


def parse_sam_memory_block(text: str) -> tuple[str, dict[int, str]]:
    """(task, {page id: cue}) from :func:`render_sam_memory_block` output."""
    task, cues = "", {}
    for line in text.split("\n"):
        if line.startswith("task: "):
            task = line[len("task: ") :]
        else:
            m = re.match(r"p(\d+): (.*)\Z", line)
            if m:
                cues[int(m.group(1))] = m.group(2)
    return task, cues


SAM_FAILED_PAGES_PREFIX = "failed pages: "


def render_sam_recalled(intent: str, page_ids: list[int], content: str, failed: list[str] | None = None) -> str:
    """The message that carries recalled content back to the reasoner; ``failed`` (e.g. ``["p3 (empty output)"]``)
    names the pages the memory model could not read, on a line of its own before the content."""
    pages = ",".join(str(p) for p in page_ids)
    note = f"{SAM_FAILED_PAGES_PREFIX}{'; '.join(failed)}\n" if failed else ""
    return f"recalled for: {intent}\npages: {pages}\n{note}{content}"


_RECALLED_RE = re.compile(
    rf"recalled for: (.*?)\npages: ([\d,]*)\n(?:{re.escape(SAM_FAILED_PAGES_PREFIX)}([^\n]*)\n)?(.*)\Z", re.DOTALL
)


def parse_sam_recalled(text: str) -> tuple[str, list[int], str] | None:
    """(intent, page ids, content) from :func:`render_sam_recalled` output (the failed-pages line is not content),
    or None."""
    m = _RECALLED_RE.match(text)
    if not m:
        return None
    return m.group(1), [int(p) for p in m.group(2).split(",") if p], m.group(4)


def parse_sam_recall_failures(text: str) -> list[str]:
    """The failed-page notes of :func:`render_sam_recalled` output (empty when every page was read)."""
    m = _RECALLED_RE.match(text)
    return m.group(3).split("; ") if m and m.group(3) else []


TOOL_ERROR_PREFIX = "error: "
"""How a tool error reaches the reasoner: ``error: <what went wrong>`` as the observation of its call."""


def render_tool_error(message: str) -> str:
    """The observation the reasoner gets for a tool call that failed (``error: <message>``)."""
    return f"{TOOL_ERROR_PREFIX}{message}"


SAM_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "act",
            "description": "act in the environment",
            "parameters": {
                "type": "object",
                "properties": {"action": {"type": "string"}},
                "required": ["action"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "memory",
            "description": "recall what earlier pages (listed under 'memory cues' as pN: cue) hold about an intent",
            "parameters": {
                "type": "object",
                "properties": {
                    "intent": {"type": "string", "description": "what to recall"},
                    "page_ids": {
                        "type": "array",
                        "items": {"type": "integer"},
                        "description": "page numbers from the memory cues (p3 is 3)",
                    },
                },
                "required": ["intent", "page_ids"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "answer",
            "description": "end the task with an answer",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string"}},
                "required": ["answer"],
            },
        },
    },
]
"""The tools SAM's reasoner has (:data:`SAM_REASONER_SYSTEM` names them), as OpenAI function schemas. A reply calls
one as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (:func:`render_tool_call`)."""


@dataclass(frozen=True)
class SamRecalled:
    """A recall that came back: what the memory model extracted from ``page_ids`` under ``intent`` (``content`` is
    :data:`NOTHING_RELEVANT` when it found nothing) and the pages it could not read (``p3 (empty output)``): those
    may be asked for again."""

    intent: str
    page_ids: list[int]
    content: str
    failed_pages: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SamRecallFailed:
    """A ``memory`` call that gave nothing: the call was invalid (no intent, unknown pages, too many pages, an empty
    memory) or the memory model failed on every page. ``error`` says which; asking again with other arguments (or
    acting on) is the reasoner's choice, the recall did happen."""

    error: str


def parse_sam_tool_result(text: str) -> SamRecalled | SamRecallFailed | None:
    """The result of a ``memory`` call from the message that carries it back to the reasoner (a ``user`` message
    after the assistant's ``memory`` call): :class:`SamRecalled`, :class:`SamRecallFailed` (``error: ...``), or None
    when ``text`` is neither."""
    if text.startswith(TOOL_ERROR_PREFIX):
        return SamRecallFailed(text[len(TOOL_ERROR_PREFIX) :])
    parsed = parse_sam_recalled(text)
    if parsed is None:
        return None
    return SamRecalled(parsed[0], parsed[1], parsed[2], parse_sam_recall_failures(text))


ADMISSIBLE_ACTIONS_PREFIX = "admissible actions:\n"


def render_admissible_actions(actions: list[str]) -> str:
    """The transient message that lists the actions the environment accepts now (a Gym environment's
    ``info["admissible_actions"]``), shown with the reasoner's next call only."""
    return ADMISSIBLE_ACTIONS_PREFIX + "\n".join(str(a) for a in actions)


@dataclass
class SamContext:
    """SAM's reasoner context read back (:func:`read_sam_context`): the task and cue bank of the first user message,
    the observations in order (``act`` results, the first observation), the ``memory`` calls the reasoner made and
    their results in order, the admissible actions of this call (empty when the environment gives none), and the
    system prompt."""

    system: str = ""
    task: str = ""
    cues: dict[int, str] = field(default_factory=dict)
    observations: list[str] = field(default_factory=list)
    memory_calls: list[ToolCall] = field(default_factory=list)
    recalls: list[SamRecalled | SamRecallFailed] = field(default_factory=list)
    admissible_actions: list[str] = field(default_factory=list)
    last_result: SamRecalled | SamRecallFailed | None = None  # the latest call's result when it was ``memory``


def read_sam_context(messages: list[Any]) -> SamContext:
    """Everything a reasoner under SAM is shown, read from its messages (dicts or ``Message`` objects): the system
    prompt, the task and cue bank (:func:`render_sam_memory_block`), observations (``tool`` messages and the first
    observation), its own ``memory`` calls (assistant messages) and their results (:func:`parse_sam_tool_result`),
    and the transient admissible actions. The live context keeps only recent turns: older ones are in pages, which
    only a ``memory`` call reads."""
    out = SamContext()
    after_memory_call = False
    for m in messages:
        role = m["role"] if isinstance(m, dict) else m.role
        text = m["content"] if isinstance(m, dict) else m.content
        if role == "system":
            out.system = text
        elif role == "assistant":
            calls = parse_tool_calls(text).calls[:1]  # the loop runs a reply's first call
            after_memory_call = bool(calls) and calls[0].name == "memory"
            out.memory_calls += [c for c in calls if c.name == "memory"]
        elif role == "user" and text.startswith("task: ") and not out.task:
            out.task, out.cues = parse_sam_memory_block(text)
        elif role == "user" and text.startswith(ADMISSIBLE_ACTIONS_PREFIX):
            out.admissible_actions = text[len(ADMISSIBLE_ACTIONS_PREFIX) :].split("\n")
        elif role == "user" and after_memory_call and (result := parse_sam_tool_result(text)) is not None:
            out.recalls.append(result)
            out.last_result, after_memory_call = result, False
        else:
            out.observations.append(text)
            out.last_result, after_memory_call = None, False
    return out


# ----------------------------------------------------------------------------------------------------------------
# Proactive memory agent ("Remember When It Matters: Proactive Memory Agent for Long-Horizon Agents", section 3.3):
# Phase 1 bank tools, Phase 2 reminder or silence.

PHASE1_SYSTEM = (
    "You manage the memory bank of an agent. Return zero or more tool calls: memory_update_status(content), "
    "memory_save_knowledge(content), memory_save_procedural(content), memory_delete(id)."
)
PHASE2_SYSTEM = (
    "Decide whether the agent needs a reminder before its next action. Answer <context_for_action>reminder"
    "</context_for_action> or <no_intervention/>."
)

# As for tool calls, a nested opening tag ends the fragment before it.
_INTERVENTION_RE = re.compile(
    r"<context_for_action>(.*?)(</context_for_action>|(?=<context_for_action>)|\Z)", re.DOTALL
)


def parse_intervention(text: str) -> tuple[str | None, str | None]:
    """(reminder or None for silence, error or None). A missing tag means silence. The reminder is the first
    closed, non-empty ``<context_for_action>`` block; an unclosed or empty block before it (or instead of it) is the
    error, so a stray opening tag is reported without hiding the reminder that follows it."""
    if not isinstance(text, str):
        return None, "output is not text"
    error: str | None = None
    for match in _INTERVENTION_RE.finditer(text):
        reminder = match.group(1).strip()
        if match.group(2) and reminder:
            return reminder, error
        if error is None and match.group(2):
            error = "empty <context_for_action>"
        elif error is None:
            nested = match.end() < len(text)
            error = "unclosed <context_for_action>" + (" (a new one began before its closing tag)" if nested else "")
    return None, error


def render_intervention(reminder: str | None) -> str:
    """The Phase 2 output for a reminder, or ``<no_intervention/>`` for silence."""
    return f"<context_for_action>{reminder}</context_for_action>" if reminder else "<no_intervention/>"


# ----------------------------------------------------------------------------------------------------------------
# Proactive memory agent: the action agent's prompt, the window / bank renderings, Phase 1 / Phase 2 prompts, and the
# transient memory context. The scripted action agent and the oracle experts of ``data`` read exactly these shapes.

ACTION_AGENT_SYSTEM = (
    "You are a terminal agent. Follow the task. Reply with one tool call act(action) whose action is a shell command."
)
MEMORY_CONTEXT_PREFIX = "memory context: "


def render_memory_context(reminder: str) -> str:
    """The transient user message that carries a Phase 2 reminder into the action agent's next call."""
    return f"{MEMORY_CONTEXT_PREFIX}{reminder}"


def parse_memory_context(text: str) -> str | None:
    """The reminder of a :func:`render_memory_context` message, or None."""
    return text[len(MEMORY_CONTEXT_PREFIX) :] if text.startswith(MEMORY_CONTEXT_PREFIX) else None


def render_window(steps: list[tuple[int, str, str]]) -> str:
    """The memory agent's recent window: ``[step N] action: A`` then the observation, for each (N, A, O)."""
    return "\n".join(f"[step {n}] action: {a}\n{o}" for n, a, o in steps)


_WINDOW_HEAD = re.compile(r"^\[step (\d+)\] action: (.*)$", re.MULTILINE)


def parse_window(text: str) -> list[tuple[int, str, str]]:
    """(step, action, observation) triples from :func:`render_window` output."""
    heads = list(_WINDOW_HEAD.finditer(text))
    out = []
    for i, m in enumerate(heads):
        end = heads[i + 1].start() - 1 if i + 1 < len(heads) else len(text)
        out.append((int(m.group(1)), m.group(2), text[m.end() + 1 : end] if m.end() < end else ""))
    return out


@dataclass
class BankView:
    """A rendered memory bank read back: the private status and the entries by id (``kN`` knowledge, ``pN``
    procedural)."""

    status: str = ""
    knowledge: dict[str, str] = field(default_factory=dict)
    procedural: dict[str, str] = field(default_factory=dict)


def render_bank(status: str, knowledge: list[tuple[str, str]], procedural: list[tuple[str, str]]) -> str:
    """The bank as the memory model reads it: ``status:``, then ``knowledge:`` and ``procedural:`` entry lines."""
    lines = [f"status: {status or 'none'}", "knowledge:" if knowledge else "knowledge: none"]
    lines += [f"{i}: {c}" for i, c in knowledge]
    lines.append("procedural:" if procedural else "procedural: none")
    lines += [f"{i}: {c}" for i, c in procedural]
    return "\n".join(lines)


def parse_bank(text: str) -> BankView:
    """:func:`render_bank` output read back."""
    bank = BankView()
    section = None
    for line in text.split("\n"):
        if line.startswith("status: "):
            bank.status = "" if line == "status: none" else line[len("status: ") :]
        elif line.startswith("knowledge:"):
            section = bank.knowledge
        elif line.startswith("procedural:"):
            section = bank.procedural
        elif section is not None and (m := re.match(r"([kp]\d+): (.*)\Z", line)):
            section[m.group(1)] = m.group(2)
    return bank


def _proactive_body(task: str, window: str, bank: str, tail: str) -> str:
    return f"task: {task}\nrecent steps:\n{window or 'none'}\nbank:\n{bank}\n{tail}"


def render_phase1_prompt(task: str, window: str, bank: str) -> list[dict[str, str]]:
    """Phase 1 messages (bank management): the task, the recent window (:func:`render_window`) and the bank
    (:func:`render_bank`); the reply is zero or more bank tool calls."""
    return [
        {"role": "system", "content": PHASE1_SYSTEM},
        {"role": "user", "content": _proactive_body(task, window, bank, "tool calls:")},
    ]


def render_phase2_prompt(task: str, window: str, bank: str) -> list[dict[str, str]]:
    """Phase 2 messages (reminder or silence) over the updated bank."""
    return [
        {"role": "system", "content": PHASE2_SYSTEM},
        {"role": "user", "content": _proactive_body(task, window, bank, "decision:")},
    ]


PROACTIVE_PHASES = {"bank_edit": 1, "intervene": 2}  # a proactive memory role's phase


def render_proactive_prompt(role: str, task: str, window: str, bank: str) -> list[dict[str, str]]:
    """The messages of a proactive memory role: :func:`render_phase1_prompt` for ``bank_edit``,
    :func:`render_phase2_prompt` for ``intervene``."""
    render = render_phase1_prompt if PROACTIVE_PHASES[role] == 1 else render_phase2_prompt
    return render(task, window, bank)


_PHASE_RE = re.compile(r"\Atask: (.*?)\nrecent steps:\n(.*)\nbank:\n(.*)\n(tool calls|decision):\Z", re.DOTALL)


def parse_phase_prompt(messages: list[Any]) -> tuple[int, str, str, BankView] | None:
    """(phase 1 or 2, task, window text, bank) from Phase 1 / Phase 2 messages, or None."""
    m = _PHASE_RE.match(_last_user(messages))
    if not m:
        return None
    window = "" if m.group(2) == "none" else m.group(2)
    return (1 if m.group(4) == "tool calls" else 2), m.group(1), window, parse_bank(m.group(3))
