"""Mage's prompt templates and output parsers ("Memory as Execution State Management" (arXiv 2606.06090)): the memory
model's Compress and Maintain calls and the reasoner's view of the execution state S = (C, R, H). Parsers never raise on
model output."""

from __future__ import annotations

import re
from collections.abc import Sequence

from memrl.data.formats import answer_body, json_answer
from memrl.data.schemas import Message

__all__ = [
    "MAGE_COMPRESS_SYSTEM",
    "MAGE_MAINTAIN_SYSTEM",
    "mage_reasoner_system",
    "parse_mage_summary",
    "parse_mage_verdict",
    "render_mage_compress",
    "render_mage_maintain",
    "render_mage_state",
    "render_mage_steps",
]

MAGE_COMPRESS_SYSTEM = (
    "You compress a finished subgoal of an agent. Write one short summary of what the steps below established "
    "(state reached, facts found, constraints met or broken) so the agent can continue without the raw steps."
)
MAGE_MAINTAIN_SYSTEM = (
    "You check a memory write before it is trusted. Given the task, the raw steps and their summary, answer PASS if "
    "the summary is faithful to the steps and the subgoal was carried out correctly for the task; otherwise answer "
    "FAIL: followed by a diagnosis of what is missing or wrong."
)


def mage_reasoner_system(compress: bool = True, revise: bool = True) -> str:
    """The reasoner's system prompt, listing the tools this configuration offers."""
    tools = ["act(action) acts in the environment"]
    if compress:
        tools.append("compress(summary) marks the current subgoal complete and replaces the recent steps by summary")
    if revise:
        tools.append(
            "revise(step, reason) returns to the boundary @step of a compressed summary and continues from "
            "there on a new branch"
        )
    tools.append("answer(answer) ends the task")
    return (
        "You solve the task step by step. Your memory is an execution-state tree: summaries of finished subgoals "
        "(each tagged with its boundary @step), the recent raw steps, and hints from earlier attempts. Tools: "
        + "; ".join(tools)
        + ". Reply with one tool call."
    )


def render_mage_steps(steps: Sequence[tuple[int, str, str]], limit: int = 0) -> str:
    """One line per bottom-layer node: ``[id] action -> observation`` (observations cut to ``limit`` chars)."""
    lines = []
    for node_id, action, observation in steps:
        obs = observation if limit <= 0 or len(observation) <= limit else observation[: limit - 3] + "..."
        lines.append(f"[{node_id}] {action or '(start)'} -> {obs}")
    return "\n".join(lines) if lines else "(none)"


def _summaries(compressed: Sequence[tuple[int, str]]) -> str:
    return "\n".join(f"[@{b}] {content}" for b, content in compressed) if compressed else "(none)"


def render_mage_compress(task: str, compressed: Sequence[tuple[int, str]], steps_text: str) -> list[Message]:
    """Messages asking the memory model to summarise the raw steps since the last boundary."""
    user = f"task: {task}\ncompressed so far:\n{_summaries(compressed)}\nsteps:\n{steps_text}\nsummary:"
    return [Message(role="system", content=MAGE_COMPRESS_SYSTEM), Message(role="user", content=user)]


def render_mage_maintain(task: str, steps_text: str, summary: str) -> list[Message]:
    """Messages asking the memory model to validate a new summary against the task and the steps it covers."""
    user = f"task: {task}\nsteps:\n{steps_text}\nsummary: {summary}\nverdict:"
    return [Message(role="system", content=MAGE_MAINTAIN_SYSTEM), Message(role="user", content=user)]


def render_mage_state(
    task: str,
    start: str,
    compressed: Sequence[str],
    hints: Sequence[str],
    recent: str,
    notices: Sequence[str] = (),
    question: str | None = None,
) -> str:
    """The reasoner's user message: task, compressed state C, hints H, raw state R, notices, and the question."""
    parts = [f"task: {task}"]
    if start:
        parts.append(f"start: {start}")
    parts.append("compressed state:\n" + ("\n".join(compressed) if compressed else "(none)"))
    if hints:
        parts.append("hints:\n" + "\n".join(f"- {h}" for h in hints))
    parts.append("recent steps:\n" + recent)
    parts += [f"memory: {n}" for n in notices]
    if question is not None:
        parts.append(f"question: {question}")
    return "\n".join(parts)


def parse_mage_summary(text: str) -> str:
    """The summary in a Compress answer (an optional ``summary:`` prefix dropped), or "" when there is none."""
    if not isinstance(text, str):
        return ""
    body = re.sub(r"<think>.*?</think>", "", text, flags=re.DOTALL).strip()
    body = re.sub(r"\A(summary\s*:\s*)", "", body, flags=re.IGNORECASE).strip()
    return body


_VERDICT = re.compile(r"\A(?:verdict\s*:\s*)?\**\s*(PASS|FAIL)\b\**\s*[:\-.,]?\s*(.*)\Z", re.IGNORECASE | re.DOTALL)


def parse_mage_verdict(text: str) -> tuple[bool | None, str]:
    """(passed, diagnosis) from a Maintain answer: ``PASS`` / ``FAIL: diagnosis`` or a JSON object with
    ``pass``/``valid`` and ``diagnosis``/``feedback``. ``passed`` is None when the answer cannot be read."""
    if not isinstance(text, str):
        return None, ""
    body = answer_body(text)
    if (obj := json_answer(body, dict)) is not None:
        flag = next((obj[k] for k in ("pass", "passed", "valid", "ok") if k in obj), None)
        diagnosis = next((str(obj[k]) for k in ("diagnosis", "feedback", "reason", "note") if k in obj), "")
        if isinstance(flag, bool):
            return flag, diagnosis.strip()
        return None, diagnosis.strip()
    match = _VERDICT.match(body)
    if match is None:
        return None, ""
    return match.group(1).upper() == "PASS", match.group(2).strip()
