"""The scripted players of a proactive task (each a :class:`~memrl.data.schemas.ScriptedPolicy`): the frozen action
agent (:class:`ActionAgent`), which acts on what its window and the reminder show, and a non-privileged Phase 1
(:class:`BankWriter`), which banks what the agent has seen.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any

from memrl.data.formats import (
    parse_memory_context,
    parse_phase_prompt,
    parse_tool_calls,
    parse_window,
    render_tool_call,
)
from memrl.data.registry import register_reasoner
from memrl.data.tasks.common import content_of, role_of
from memrl.data.tasks.proactive.world import FACTS, fact_value, parse_next, subtask_by_name

__all__ = ["ActionAgent", "BankWriter"]


@register_reasoner("action_agent")
class ActionAgent:
    """The scripted action agent (a :class:`~memrl.data.schemas.ScriptedPolicy`): follows the ``next:`` line, acts on
    the facts its context shows (window + reminder), else falls back to its default command.

    A reminder that does not name the next subtask's fact distracts it with probability ``distraction`` (a wasted
    ``pwd``). The draw is keyed by (``seed``, task id, step) when the request names them (the agent loop's and
    :func:`~memrl.data.tasks.proactive.reference.simulate_proactive`'s requests do), so counterfactual branches of
    one episode share their draws (common random numbers: a branch differs from its sibling by its memory decisions
    only); otherwise it comes from the request's seeded generator.
    """

    name = "action-agent"

    def __init__(self, distraction: float = 0.3, seed: int = 0) -> None:
        if not 0.0 <= distraction <= 1.0:
            raise ValueError(f"distraction must be in [0, 1], got {distraction}")
        self.distraction = distraction
        self.seed = seed

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        """Reply with one ``act`` tool call."""
        context, reminder, last_obs, last_action = [], None, "", None
        for m in messages:
            role, text = role_of(m), content_of(m)
            if role == "system":
                continue
            if role == "user" and (r := parse_memory_context(text)) is not None:
                reminder = r
                continue
            if role == "assistant":
                calls = parse_tool_calls(text).calls
                last_action = str(calls[0].arguments.get("action", "")) if calls else text
                context.append(last_action)
                continue
            context.append(text)
            last_obs = text
        distracted = reminder is not None and self.distracted(rng, metadata)
        return render_tool_call("act", {"action": self.decide(context, reminder, last_obs, last_action, distracted)})

    def distracted(self, rng: random.Random, metadata: dict[str, Any]) -> bool:
        """Whether an irrelevant reminder at this call costs a step (see the class docstring)."""
        if self.distraction in (0.0, 1.0):
            return self.distraction == 1.0
        if "task_id" in metadata and "step" in metadata:
            key = f"{self.seed}/{metadata['task_id']}/{metadata['step']}".encode()
            draw = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") / 2**64
        else:
            draw = rng.random()
        return draw < self.distraction

    @staticmethod
    def decide(
        context: list[str], reminder: str | None, last_obs: str, last_action: str | None, distracted: bool = True
    ) -> str:
        """The command for the next subtask given what is visible (``distracted``: an irrelevant reminder costs a
        double-check)."""
        nxt = parse_next(last_obs)
        if nxt is None:
            return "ls"
        sub = subtask_by_name(nxt[0])
        if sub is None:
            return "ls"
        seen = "\n".join(context)
        if reminder is not None:
            if sub.fact is not None and fact_value(sub.fact, reminder) is not None:
                seen += "\n" + reminder
            elif distracted and last_action != "pwd":
                # an irrelevant reminder: the agent stops to double-check (a wasted step), but only once in a row,
                # so a standing memory context (full-bank exposure, forced reminders) slows it down, not livelocks it
                return "pwd"
        if sub.fact is None:
            return sub.default
        value = fact_value(sub.fact, seen)
        if value is not None:
            return sub.correct.format(v=value)
        if last_action == sub.default and sub.discover:
            return sub.discover
        return sub.default


_FAILURE = re.compile(r"(?im)^(error: .*|bash: .*command not found|cp: cannot stat .*)$")


class BankWriter:
    """A scripted, non-privileged Phase 1 (a :class:`~memrl.data.schemas.ScriptedPolicy` for the ``bank_edit`` role): it
    records what the agent has seen and nothing else. It reads only its prompt (task statement, recent window, bank),
    never the task's plan, its fact values or its pivots, so it cannot flag which entry the next subtask will need.

    Per memory step: the status notes the subtask the window ends on; every fact the statement or the window states
    (any kind of :data:`~memrl.data.tasks.proactive.world.FACTS`) is saved once as its canonical sentence (a changed
    value rewrites its entry); every failed command in the window is saved once as a procedural
    ``failed: COMMAND -> ERROR`` entry. Nothing is ever deleted: the bank keeps what was observed, relevant later or
    not.
    """

    name = "bank-writer"

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        """Bank tool calls for a Phase 1 prompt; empty text for any other prompt."""
        parsed = parse_phase_prompt(messages)
        if parsed is None or parsed[0] != 1:
            return ""
        _, task, window, bank = parsed
        calls = []
        if (nxt := parse_next(window or task)) is not None:
            status = f"at subtask {nxt[1]} of {nxt[2]}: {nxt[0]}"
            if status != bank.status:
                calls.append(render_tool_call("memory_update_status", {"content": status}))
        known = [*bank.knowledge.items(), *bank.procedural.items()]
        saved = {content for _, content in known}
        steps = parse_window(window)
        for _, action, observation in steps:
            failure = _FAILURE.search(observation)
            content = f"failed: {action} -> {failure.group(1)}" if failure and action else None
            if content is not None and content not in saved:
                calls.append(render_tool_call("memory_save_procedural", {"content": content}))
                saved.add(content)
        visible = "\n".join([task, *(f"{a}\n{o}" for _, a, o in steps)])
        for kind, fact in FACTS.items():
            value = fact_value(kind, visible)
            if value is None or fact.sentence(value) in saved:
                continue
            stale = [i for i, content in known if _states(kind, content)]  # the same fact, another value
            tool = "memory_save_knowledge" if fact.memory == "knowledge" else "memory_save_procedural"
            args = {"content": fact.sentence(value), **({"id": stale[-1]} if stale else {})}
            calls.append(render_tool_call(tool, args))
            saved.add(fact.sentence(value))
        return "\n".join(calls)


def _states(kind: str, content: str) -> bool:
    """Whether a bank entry is the canonical sentence of a ``kind`` fact (any value)."""
    value = fact_value(kind, content)
    return value is not None and content == FACTS[kind].sentence(value)
