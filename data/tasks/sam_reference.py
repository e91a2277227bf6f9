"""The reference loop of SAM tasks: :func:`simulate_sam` runs the scripted reasoner (:class:`SamReasoner`) with a
memory behaviour (e.g. the oracle expert of :mod:`memrl.data.experts.sam`) or with no memory, so the task's success
rates can be measured inside ``data``, without the agent loop of ``rollout``."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from memrl.data.envs.base import count_tokens
from memrl.data.formats import (
    NOTHING_RELEVANT,
    SAM_REASONER_SYSTEM,
    parse_tool_calls,
    render_sam_consolidate_prompt,
    render_sam_memory_block,
    render_sam_recall_prompt,
    render_sam_recalled,
)
from memrl.data.schemas import Message, ScriptedPolicy
from memrl.data.tasks.common import as_messages
from memrl.data.tasks.sam import SamTask, render_page

__all__ = ["SamRun", "simulate_sam"]


@dataclass
class SamRun:
    """The result of :func:`simulate_sam`."""

    answer: str | None
    outcome: float
    steps: int
    recalls: int
    pages: int
    peak_context_tokens: int


def simulate_sam(
    task: SamTask,
    reasoner: ScriptedPolicy,
    memory: ScriptedPolicy | None,
    *,
    live_turns: int = 4,
    page_turns: int = 4,
    seed: int = 0,
    metadata: dict[str, Any] | None = None,
) -> SamRun:
    """Run ``reasoner`` on ``task`` with SAM-style memory: raw turns beyond ``live_turns`` are cut into pages of
    ``page_turns`` turns; ``memory`` (a policy answering :func:`~memrl.data.formats.render_sam_consolidate_prompt` and
    :func:`~memrl.data.formats.render_sam_recall_prompt` messages, e.g. the oracle expert) writes each page's cue and
    reads pages under the reasoner's intent. ``memory=None`` keeps the live window only (pages are dropped).

    This is the reference for the agent loop's SAM system (``rollout``): the same message shapes, in-process.
    """
    rng = random.Random(seed)
    meta = {"task_id": task.task_id, "gold_entities": task.gold_entities, **(metadata or {})}
    live: list[tuple[int, str, str]] = [(0, "", task.reset())]
    pages: list[str] = []
    cues: list[tuple[int, str]] = []
    tail: list[Message] = []  # memory calls and recalled content since the last act
    recalls, peak, step = 0, 0, 0
    answer: str | None = None
    while step < task.max_steps:
        step += 1
        messages = [
            Message(role="system", content=SAM_REASONER_SYSTEM),
            Message(role="user", content=render_sam_memory_block(task.task, cues)),
        ]
        for i, (_, action, observation) in enumerate(live):
            if action:
                messages.append(Message(role="assistant", content=action))
            messages.append(Message(role="user" if i == 0 and not action else "tool", content=observation))
        messages += tail
        peak = max(peak, sum(count_tokens(m.content) for m in messages))
        reply = reasoner.respond(messages, rng, meta)
        calls = parse_tool_calls(reply).calls
        if not calls:
            live.append((step, reply, "error: no tool call in the reply"))
            continue
        call = calls[0]
        if call.name == "answer":
            answer = str(call.arguments.get("answer", ""))
            break
        if call.name == "memory":
            recalls += 1
            intent = str(call.arguments.get("intent", ""))
            ids = [int(i) for i in call.arguments.get("page_ids", []) if 0 <= int(i) < len(pages)]
            so_far = ""
            for page_id in ids if memory is not None else []:
                prompt = as_messages(render_sam_recall_prompt(intent, page_id, pages[page_id], so_far))
                out = memory.respond(prompt, rng, {**meta, "role": "recall"}).strip()
                so_far = "" if out == NOTHING_RELEVANT else out
            tail += [
                Message(role="assistant", content=reply),
                Message(role="user", content=render_sam_recalled(intent, ids, so_far or NOTHING_RELEVANT)),
            ]
            continue
        observation, _ = task.step(str(call.arguments.get("action", "")))
        live.append((step, reply, observation))
        tail = []
        while len(live) > live_turns + page_turns - 1:
            page, live = live[:page_turns], live[page_turns:]
            text = render_page([(_act_text(a), o) for _, a, o in page], [n for n, _, _ in page])
            page_id = len(pages)
            pages.append(text)
            if memory is not None:
                prompt = as_messages(render_sam_consolidate_prompt(page_id, text))
                cues.append((page_id, memory.respond(prompt, rng, {**meta, "role": "consolidate"}).strip()))
    return SamRun(answer, task.finish(answer), step, recalls, len(pages), peak)


def _act_text(reply: str) -> str:
    calls = parse_tool_calls(reply).calls
    if calls and calls[0].name == "act":
        return str(calls[0].arguments.get("action", ""))
    return reply
