"""The reference loop of proactive tasks: :func:`simulate_proactive` runs a scripted action agent with a proactive
memory behaviour (the oracle of :mod:`memrl.data.experts.proactive`, or any Phase 1 + Phase 2 policy) or with none,
in-process and with the agent loop's message shapes; :func:`find_pivot` says whether a point of an episode is a pivot.
A task's constructor runs this loop with ideal reminders to find its pivots and its step budget.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from memrl.data.formats import (
    ACTION_AGENT_SYSTEM,
    parse_intervention,
    parse_tool_calls,
    render_bank,
    render_memory_context,
    render_proactive_prompt,
    render_tool_call,
    render_window,
)
from memrl.data.schemas import Message, ScriptedPolicy, Turn
from memrl.data.tasks.common import as_messages
from memrl.data.tasks.proactive.world import (
    FACTS,
    REQUIREMENTS,
    ProactiveParams,
    TermState,
    fact_value,
    parse_next,
    subtask_by_name,
)

__all__ = ["ProactiveRun", "SimulatedTask", "find_pivot", "simulate_proactive", "window_messages"]


class SimulatedTask(Protocol):
    """What :func:`simulate_proactive` needs of a task: :class:`~memrl.data.tasks.proactive.task.ProactiveTask`, whose
    constructor runs the loop (so this module cannot import it)."""

    task_id: str
    task: str  # the statement
    facts: list[str]
    params: ProactiveParams
    s: TermState
    max_steps: int

    def reset(self) -> str:
        """Start the episode; the first observation."""

    def step(self, action: str) -> tuple[str, bool]:
        """Execute a command: (observation, over)."""

    def finish(self, answer: str | None = None) -> float:
        """The outcome."""

    def truth(self) -> dict[str, Any]:
        """What an oracle may know."""


@dataclass
class ProactiveRun:
    """The result of :func:`simulate_proactive`."""

    outcome: float
    steps: int
    turns: list[Turn]
    reminders: int = 0
    wasted: int = 0
    pivots: list[dict[str, Any]] = field(default_factory=list)
    fact_turns: list[tuple[int, str]] = field(default_factory=list)
    memory_calls: list[tuple[str, list[Message], str]] = field(default_factory=list)


@dataclass
class _Bank:
    status: str = ""
    knowledge: dict[str, str] = field(default_factory=dict)
    procedural: dict[str, str] = field(default_factory=dict)
    next_id: int = 1

    def apply(self, reply: str) -> None:
        for call in parse_tool_calls(reply).calls:
            content = str(call.arguments.get("content", ""))
            if call.name == "memory_update_status":
                self.status = content
            elif call.name in ("memory_save_knowledge", "memory_save_procedural"):
                prefix, store = ("k", self.knowledge) if call.name.endswith("knowledge") else ("p", self.procedural)
                store[f"{prefix}{self.next_id}"] = content
                self.next_id += 1
            elif call.name == "memory_delete":
                entry = str(call.arguments.get("id", ""))
                self.knowledge.pop(entry, None)
                self.procedural.pop(entry, None)

    def render(self) -> str:
        return render_bank(self.status, list(self.knowledge.items()), list(self.procedural.items()))


def window_messages(turns: list[tuple[str, str]], k: int, reminder: str | None) -> list[Message]:
    """The action agent's messages: system prompt, the last ``k`` turns (the statement is turn 0, a user message),
    then the transient reminder if any."""
    messages = [Message(role="system", content=ACTION_AGENT_SYSTEM)]
    start = max(0, len(turns) - k)
    for i in range(start, len(turns)):
        action, observation = turns[i]
        if i == 0:
            messages.append(Message(role="user", content=observation))
        else:
            messages.append(Message(role="assistant", content=render_tool_call("act", {"action": action})))
            messages.append(Message(role="tool", content=observation))
    if reminder:
        messages.append(Message(role="user", content=render_memory_context(reminder)))
    return messages


def find_pivot(turns: list[tuple[str, str]], k: int) -> dict[str, Any] | None:
    """The pivot at this point of an episode, or None. ``turns`` are the (action, observation) pairs so far (turn 0
    is ``("", task statement)``); the step is a pivot when the next subtask needs a fact that the episode has shown
    but the agent's last ``k`` turns do not: a reminder of it changes the agent's next action. Returns ``step``,
    ``subtask`` (1-based), ``name``, ``fact``, ``requirement`` (missing it violates the task) and ``reminder`` (the
    fact's canonical sentence)."""
    nxt = parse_next(turns[-1][1])
    sub = subtask_by_name(nxt[0]) if nxt else None
    if nxt is None or sub is None or sub.fact is None:
        return None
    start = max(0, len(turns) - k)
    visible = "\n".join(o if i == 0 else f"{a}\n{o}" for i, (a, o) in enumerate(turns) if i >= start)
    value = fact_value(sub.fact, "\n".join(f"{a}\n{o}" for a, o in turns))
    if value is None or fact_value(sub.fact, visible) is not None:
        return None
    return {
        "step": len(turns) - 1,
        "subtask": nxt[1],
        "name": sub.name,
        "fact": sub.fact,
        "requirement": sub.fact in REQUIREMENTS,
        "reminder": FACTS[sub.fact].sentence(value),
    }


def simulate_proactive(
    task: SimulatedTask,
    agent: ScriptedPolicy,
    memory: ScriptedPolicy | None,
    *,
    k: int | None = None,
    trigger_every: int = 1,
    seed: int = 0,
    ideal_reminders: bool = False,
) -> ProactiveRun:
    """Run ``agent`` on ``task`` with a proactive memory agent: at the first step and every ``trigger_every`` steps
    ``memory`` answers the Phase 1 prompt (bank tool calls, applied in order) and then the Phase 2 prompt (a
    reminder, injected once into the next agent call). ``memory=None`` runs the agent on its window alone.
    ``ideal_reminders`` injects exactly the needed fact whenever it is out of sight (how pivots are found).

    This is the reference for the agent loop's proactive system (``rollout``): the same message shapes, in-process.
    """
    k = k or task.params.window
    rng = random.Random(seed)
    meta = {"task_id": task.task_id, "truth": task.truth()}
    turns: list[tuple[str, str]] = [("", task.reset())]
    bank = _Bank()
    run = ProactiveRun(outcome=0.0, steps=0, turns=[])
    over = False
    while not over and task.s.steps < task.max_steps:
        t = len(turns) - 1
        window = [(i, a, o) for i, (a, o) in enumerate(turns)][max(0, len(turns) - k) :]
        window_text = render_window(window)
        reminder: str | None = None
        if memory is not None and t % trigger_every == 0:
            prompt = as_messages(render_proactive_prompt("bank_edit", task.task, window_text, bank.render()))
            reply = memory.respond(prompt, rng, {**meta, "role": "bank_edit", "step": t})
            run.memory_calls.append(("bank_edit", prompt, reply))
            bank.apply(reply)
            prompt = as_messages(render_proactive_prompt("intervene", task.task, window_text, bank.render()))
            reply = memory.respond(prompt, rng, {**meta, "role": "intervene", "step": t})
            run.memory_calls.append(("intervene", prompt, reply))
            reminder = parse_intervention(reply)[0]
        pivot = find_pivot(turns, k)
        if pivot is not None:
            run.pivots.append(pivot)
            if ideal_reminders:
                reminder = pivot["reminder"]
        if reminder:
            run.reminders += 1
        reply = agent.respond(window_messages(turns, k, reminder), rng, {"task_id": task.task_id, "step": t})
        calls = parse_tool_calls(reply).calls
        action = str(calls[0].arguments.get("action", "")) if calls else reply
        if action == "pwd":
            run.wasted += 1
        observation, over = task.step(action)
        turns.append((action, observation))
        for kind in task.facts:
            if fact_value(kind, observation) is not None:
                run.fact_turns.append((len(turns) - 1, kind))
    run.fact_turns += [(0, kind) for kind in task.facts if fact_value(kind, turns[0][1])]
    run.steps = task.s.steps
    run.outcome = task.finish(None)
    run.turns = [Turn(turn_idx=i, action=a or "start", observation=o) for i, (a, o) in enumerate(turns)]
    return run
