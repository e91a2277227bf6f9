"""AMA-Agent's prompt templates and output parsers ("AMA-Bench: Evaluating Long-Horizon Memory for Agentic Applications"
(arXiv 2602.22769), section 5 and appendix D): causality-graph construction, the sufficiency self-check with its
routing, and trajectory-script / keyword generation. Parsers never raise."""

from __future__ import annotations

import re

from memrl.data.formats import answer_body, json_answer
from memrl.data.schemas import Message

__all__ = [
    "AMA_REASONER_SYSTEM",
    "parse_ama_record",
    "parse_ama_search",
    "parse_ama_sufficiency",
    "render_ama_build",
    "render_ama_search",
    "render_ama_sufficiency",
]

AMA_REASONER_SYSTEM = (
    "You solve the task step by step. Tools: act(action) acts in the environment; retrieve(query) searches the memory "
    "of the whole trajectory (a causality graph of the states it went through) and returns evidence with turn ids; "
    "answer(answer) ends the task. Reply with one tool call."
)

_BUILD_SYSTEM = (
    "You build a causality graph of an agent's trajectory. For the current turn, write the environment and object "
    "state after it, the earlier turns whose states caused it, and the objects it involves. Reply:\nstate: <state "
    "after this turn>\ncauses: <earlier turn ids, comma-separated, or none>\nobjects: <objects, comma-separated>"
)
_SUFFICIENCY_SYSTEM = (
    "Judge whether the retrieved evidence suffices to answer the question. Answer SUFFICIENT, or INSUFFICIENT: graph "
    "<what is missing> when states, causes or effects around the retrieved turns are missing, or INSUFFICIENT: "
    "keyword <what is missing> when exact matching or counting over the whole trajectory is needed."
)
_SEARCH_SYSTEM = (
    "Find the missing information in the trajectory. Either write a Python script in a ```python block: the file "
    'trajectory.json in the working directory holds the list of turns {"turn_idx", "action", "observation"}; '
    "print only what answers the need, with turn ids. Or reply with one line keywords: <comma-separated keywords> "
    "for a plain keyword search."
)


def render_ama_build(task: str, previous: str, current: str, states: str) -> list[Message]:
    """Messages for one state node from an adjacent turn pair (``ama_graph_build``)."""
    user = f"task: {task}\nprevious turn: {previous}\ncurrent turn: {current}\nrecent states:\n{states}\nrecord:"
    return [Message(role="system", content=_BUILD_SYSTEM), Message(role="user", content=user)]


def render_ama_sufficiency(question: str, evidence: str) -> list[Message]:
    """Messages for the sufficiency self-check and routing (``ama_sufficiency``)."""
    return [
        Message(role="system", content=_SUFFICIENCY_SYSTEM),
        Message(role="user", content=f"question: {question}\nevidence:\n{evidence}\nverdict:"),
    ]


def render_ama_search(question: str, missing: str, example: str) -> list[Message]:
    """Messages asking for a trajectory script or keywords (``ama_keyword_script``)."""
    user = f"question: {question}\nmissing: {missing}\nexample turn: {example}\nsearch:"
    return [Message(role="system", content=_SEARCH_SYSTEM), Message(role="user", content=user)]


def parse_ama_record(text: str) -> tuple[str, list[int] | None, list[str], bool]:
    """(state, causes, objects, readable) from a graph-build answer. ``causes`` is None when the answer names none
    (not even ``none``); ``readable`` is False when no field could be read."""
    body = answer_body(text)
    state, causes, objects, found = "", None, [], False
    if (obj := json_answer(body, dict)) is not None:
        state = str(obj.get("state", "")).strip()
        raw = obj.get("causes")
        causes = [int(c) for c in raw if isinstance(c, int) or str(c).isdigit()] if isinstance(raw, list) else None
        objects = (
            [str(o).strip().lower() for o in obj.get("objects", []) if str(o).strip()]
            if isinstance(obj.get("objects"), list)
            else []
        )
        return state, causes, objects, bool(state or causes or objects)
    for line in body.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip().lower().lstrip("-* "), value.strip()
        if key == "state":
            state, found = value, True
        elif key == "causes":
            found = True
            causes = [int(n) for n in re.findall(r"\d+", value)]
        elif key == "objects":
            found = True
            objects = [o.strip().lower() for o in value.split(",") if o.strip() and o.strip().lower() != "none"]
    return state, causes, objects, found


def parse_ama_sufficiency(text: str) -> tuple[bool | None, str | None, str]:
    """(sufficient, route ``graph``/``keyword``/None, what is missing); sufficient is None when unreadable."""
    body = answer_body(text)
    match = re.search(r"\b(insufficient|not sufficient|sufficient)\b", body, re.IGNORECASE)
    if match is None:
        return None, None, ""
    if match.group(1).lower() == "sufficient":
        return True, None, ""
    rest = body[match.end() :].lstrip(" :.-\n")
    route_match = re.match(r"(graph|keyword|script)\b\s*[:.-]?\s*", rest, re.IGNORECASE)
    route = None
    if route_match:
        route = "graph" if route_match.group(1).lower() == "graph" else "keyword"
        rest = rest[route_match.end() :]
    return False, route, rest.strip()


_CODE = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|\Z)", re.DOTALL)


def parse_ama_search(text: str) -> tuple[str | None, str | list[str]]:
    """(``script``, code) for a fenced Python block, (``keywords``, [words]) for a ``keywords:`` line, else
    (None, "")."""
    body = answer_body(text)
    code = _CODE.search(body)
    if code and code.group(1).strip():
        return "script", code.group(1)
    for line in body.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower().lstrip("-* ") in ("keywords", "keyword"):
            words = [w.strip().strip("\"'") for w in value.split(",") if w.strip().strip("\"'")]
            if words:
                return "keywords", words
    return None, ""
