"""MemMA's prompt templates and output parsers ("MemMA: Coordinating the Memory Cycle..." (arXiv 2603.18718), section
4): Meta-Thinker (construction guidance and retrieval critique), Memory Manager, Query Reasoner, Answer Agent, and the
self-evolution calls (probe QA, verify, repair, consolidate). Parsers never raise on model output."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from memrl.data.formats import answer_body, json_answer
from memrl.data.schemas import Message

__all__ = [
    "MEMMA_REASONER_SYSTEM",
    "Edit",
    "parse_memma_answer",
    "parse_memma_consolidation",
    "parse_memma_critique",
    "parse_memma_edits",
    "parse_memma_probes",
    "parse_memma_query",
    "parse_memma_repair",
    "parse_yes_no",
    "render_memma_answer",
    "render_memma_consolidate",
    "render_memma_critique",
    "render_memma_entries",
    "render_memma_guidance",
    "render_memma_manage",
    "render_memma_probe",
    "render_memma_query",
    "render_memma_repair",
    "render_memma_verify",
]

MEMMA_REASONER_SYSTEM = (
    "You solve the task step by step. Tools: act(action) acts in the environment; memory(query) searches your "
    "long-term memory and returns evidence with a proposed answer; answer(answer) ends the task. Reply with one tool "
    "call."
)

_GUIDANCE_SYSTEM = (
    "You are the Meta-Thinker of a memory system. Read the new chunk against the existing memory and give short focus "
    "points for the Memory Manager: what is important to retain, what is redundant with existing entries, and what "
    "conflicts with them and how to resolve it."
)
_MANAGE_SYSTEM = (
    "You are the Memory Manager. Edit the memory for the new chunk, following the guidance. One atomic edit per line: "
    "ADD: <fact> | UPDATE <id>: <fact> | DELETE <id> | NONE."
)
_CRITIQUE_SYSTEM = (
    "You are the Meta-Thinker. Judge whether the evidence suffices to answer the question (coverage, consistency, "
    "specificity). Answer ANSWERABLE, or NOT ANSWERABLE: <what is missing and how to retrieve it>."
)
_QUERY_SYSTEM = (
    "You are the Query Reasoner. Write the next search query that retrieves the evidence the diagnosis says is "
    "missing. Reply with the query only."
)
_ANSWER_SYSTEM = "You are the Answer Agent. Answer the question from the evidence only. Reply with a short answer."
_PROBE_SYSTEM = (
    "Write question-answer pairs that test whether the memory captured the session: facts from the session, links to "
    "earlier context, and temporal order. One pair per line: Q: <question> A: <answer>."
)
_VERIFY_SYSTEM = "Is the predicted answer correct with respect to the gold answer? Answer yes or no."
_REPAIR_SYSTEM = (
    "A probe question failed against the memory. Diagnose whether the information is missing from memory or stored "
    "in a form that is hard to retrieve, and propose one fact to write. Reply:\ndiagnosis: missing | hard_to_retrieve"
    "\nfact: <fact>"
)
_CONSOLIDATE_SYSTEM = (
    "Decide how a candidate fact enters the memory: SKIP if an entry already states it, MERGE <id>: <merged entry> if "
    "it complements that entry, INSERT if it is new."
)


def _msgs(system: str, user: str) -> list[Message]:
    return [Message(role="system", content=system), Message(role="user", content=user)]


def render_memma_entries(entries: Sequence[tuple[str, str]]) -> str:
    """One line per memory entry: ``[id] text``."""
    return "\n".join(f"[{i}] {t}" for i, t in entries) if entries else "(empty)"


def render_memma_guidance(task: str, view: str, chunk: str) -> list[Message]:
    """Meta-Thinker construction guidance for a new chunk (``memma_meta_think``, phase ``construct``)."""
    return _msgs(_GUIDANCE_SYSTEM, f"task: {task}\nmemory:\n{view}\nnew chunk:\n{chunk}\nguidance:")


def render_memma_manage(task: str, view: str, guidance: str | None, chunk: str) -> list[Message]:
    """Memory Manager edits for a new chunk (``memma_manage``); ``guidance`` None under the /C ablation."""
    guide = f"guidance: {guidance}\n" if guidance is not None else ""
    return _msgs(_MANAGE_SYSTEM, f"task: {task}\nmemory:\n{view}\n{guide}new chunk:\n{chunk}\nedits:")


def render_memma_critique(question: str, queries: Sequence[str], evidence: str) -> list[Message]:
    """Meta-Thinker retrieval critique (``memma_meta_think``, phase ``critique``)."""
    asked = " | ".join(queries)
    return _msgs(_CRITIQUE_SYSTEM, f"question: {question}\nqueries so far: {asked}\nevidence:\n{evidence}\nverdict:")


def render_memma_query(question: str, queries: Sequence[str], evidence: str, diagnosis: str) -> list[Message]:
    """Query Reasoner's next query (``memma_query``)."""
    asked = "\n".join(f"- {q}" for q in queries)
    user = f"question: {question}\nqueries so far:\n{asked}\nevidence:\n{evidence}\ndiagnosis: {diagnosis}\nnext query:"
    return _msgs(_QUERY_SYSTEM, user)


def render_memma_answer(question: str, evidence: str) -> list[Message]:
    """Answer Agent (``memma_answer``)."""
    return _msgs(_ANSWER_SYSTEM, f"question: {question}\nevidence:\n{evidence}\nanswer:")


def render_memma_probe(task: str, view: str, session: str, count: int) -> list[Message]:
    """Probe QA generation for a finished session (``memma_probe``)."""
    return _msgs(_PROBE_SYSTEM, f"task: {task}\nearlier memory:\n{view}\nsession:\n{session}\nwrite {count} pairs:")


def render_memma_verify(question: str, gold: str, predicted: str) -> list[Message]:
    """Probe verification judge (``memma_verify``)."""
    return _msgs(_VERIFY_SYSTEM, f"question: {question}\ngold answer: {gold}\npredicted answer: {predicted}\ncorrect:")


def render_memma_repair(question: str, gold: str, predicted: str, evidence: str, view: str) -> list[Message]:
    """Evidence-grounded repair proposal for a failed probe (``memma_repair``)."""
    user = (
        f"question: {question}\ngold answer: {gold}\npredicted answer: {predicted}\nretrieved evidence:\n"
        f"{evidence}\nmemory:\n{view}\nrepair:"
    )
    return _msgs(_REPAIR_SYSTEM, user)


def render_memma_consolidate(candidate: str, closest: str) -> list[Message]:
    """Semantic consolidation of one repair fact (``memma_consolidate``)."""
    return _msgs(_CONSOLIDATE_SYSTEM, f"candidate: {candidate}\nclosest entries:\n{closest}\ndecision:")


# ----------------------------------------------------------------------------------------------------------------
# Parsers


@dataclass
class Edit:
    """One atomic Memory Manager edit."""

    op: str  # ADD, UPDATE, DELETE, NONE
    entry_id: str | None = None
    text: str = ""


_EDIT = re.compile(r"\A[-*\d.)\s]*(ADD|UPDATE|DELETE|NONE)\b\s*(\[?[A-Za-z]*\d+\]?)?\s*[:\-]?\s*(.*)\Z", re.IGNORECASE)


def parse_memma_edits(text: str) -> tuple[list[Edit], list[str]]:
    """Edits from a Memory Manager answer: one per line (``ADD: fact``, ``UPDATE m3: fact``, ``DELETE m3``, ``NONE``)
    or a JSON list of ``{"op", "id", "text"}``; unreadable lines are reported as errors."""
    body = answer_body(text)
    edits: list[Edit] = []
    errors: list[str] = []
    if (items := json_answer(body, list)) is not None:
        for item in items:
            if isinstance(item, dict) and str(item.get("op", "")).upper() in ("ADD", "UPDATE", "DELETE", "NONE"):
                entry = item.get("id")
                edits.append(
                    Edit(
                        str(item["op"]).upper(),
                        str(entry) if entry is not None else None,
                        str(item.get("text", "")).strip(),
                    )
                )
            else:
                errors.append(f"not an edit: {str(item)[:60]!r}")
        return edits, errors
    for line in body.splitlines():
        if not line.strip():
            continue
        match = _EDIT.match(line.strip())
        if match is None:
            errors.append(f"not an edit: {line[:60]!r}")
            continue
        op, entry, rest = match.group(1).upper(), match.group(2), match.group(3).strip()
        entry_id = entry.strip("[]") if entry else None
        if op in ("UPDATE", "DELETE") and entry_id is None:
            errors.append(f"{op} without an entry id: {line[:60]!r}")
            continue
        if op in ("ADD", "UPDATE") and not rest:
            errors.append(f"{op} without text: {line[:60]!r}")
            continue
        if op == "ADD" and entry_id is not None:
            rest = f"{entry} {rest}".strip()  # "ADD 3 apples ..." : the number belongs to the fact
            entry_id = None
        edits.append(Edit(op, entry_id, rest))
    return edits, errors


def parse_memma_critique(text: str) -> tuple[bool | None, str]:
    """(answerable, diagnosis) from a retrieval critique; answerable is None when the answer cannot be read."""
    body = answer_body(text)
    obj = json_answer(body, dict)
    if obj is not None and isinstance(obj.get("answerable"), bool):
        return obj["answerable"], str(obj.get("diagnosis", "")).strip()
    head = body.lower()
    match = re.search(r"\b(not[\s_-]*answerable|unanswerable|insufficient|answerable|sufficient)\b", head)
    if match is None:
        return None, ""
    negative = match.group(1).startswith(("not", "un", "in"))
    diagnosis = body[match.end() :].lstrip(" :.-\n").strip()
    return (not negative), diagnosis


def _first_line(body: str, prefixes: Sequence[str]) -> str:
    for line in body.splitlines():
        stripped = line.strip().strip("`\"'")
        if not stripped:
            continue
        for prefix in prefixes:
            if stripped.lower().startswith(prefix):
                stripped = stripped[len(prefix) :].strip()
        return stripped.strip("\"'")
    return ""


def parse_memma_query(text: str) -> str:
    """The next query (first non-empty line, a ``query:`` prefix dropped), or ""."""
    return _first_line(answer_body(text), ("next query:", "query:"))


def parse_memma_answer(text: str) -> str:
    """The Answer Agent's answer (an ``answer:`` prefix dropped), or ""."""
    body = answer_body(text)
    return re.sub(r"\Aanswer\s*:\s*", "", body, flags=re.IGNORECASE).strip()


_PAIR = re.compile(
    r"Q\s*\d*\s*[:.)]\s*(.+?)\s*(?:\n\s*)?A\s*\d*\s*[:.)]\s*(.+?)(?=\n\s*Q\s*\d*\s*[:.)]|\Z)", re.DOTALL | re.IGNORECASE
)


def parse_memma_probes(text: str, limit: int) -> list[tuple[str, str]]:
    """Up to ``limit`` (question, answer) pairs: ``Q: ... A: ...`` (same or next line) or a JSON list."""
    body = answer_body(text)
    pairs: list[tuple[str, str]] = []
    if (items := json_answer(body, list)) is not None:
        for item in items:
            if isinstance(item, dict) and item.get("question") and item.get("answer"):
                pairs.append((str(item["question"]).strip(), str(item["answer"]).strip()))
        return pairs[:limit]
    for match in _PAIR.finditer(body):
        question, answer = match.group(1).strip(), match.group(2).strip().splitlines()[0].strip()
        if question and answer:
            pairs.append((question, answer))
    return pairs[:limit]


def parse_yes_no(text: str) -> bool | None:
    """The last yes/no (or correct/incorrect) in ``text``, or None."""
    words = re.findall(r"\b(yes|no|correct|incorrect|true|false)\b", answer_body(text).lower())
    if not words:
        return None
    return words[-1] in ("yes", "correct", "true")


def parse_memma_repair(text: str) -> tuple[str, str]:
    """(diagnosis, fact) from a repair proposal; a bare text is taken as the fact."""
    body = answer_body(text)
    diagnosis, fact = "", ""
    for line in body.splitlines():
        low = line.strip().lower()
        if low.startswith("diagnosis:"):
            diagnosis = line.split(":", 1)[1].strip()
        elif low.startswith("fact:"):
            fact = line.split(":", 1)[1].strip()
    if not fact and body and "diagnosis:" not in body.lower():
        fact = body.splitlines()[0].strip()
    return diagnosis, fact


_CONSOLIDATION = re.compile(
    r"\A\W*(SKIP|MERGE|INSERT)\b\s*(\[?[A-Za-z]*\d+\]?)?\s*[:\-]?\s*(.*)\Z", re.IGNORECASE | re.DOTALL
)


def parse_memma_consolidation(text: str) -> tuple[str, str | None, str] | None:
    """(SKIP | MERGE | INSERT, entry id for MERGE, merged text) or None when unreadable."""
    match = _CONSOLIDATION.match(answer_body(text))
    if match is None:
        return None
    action = match.group(1).upper()
    entry = match.group(2).strip("[]") if match.group(2) else None
    return action, entry, match.group(3).strip()
