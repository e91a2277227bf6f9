"""Proactive task family: behavioural state decay (the failure mode named by "Remember When It Matters: Proactive Memory
Agent for Long-Horizon Agents") in a terminal-like environment with executable state.

The task statement (the first observation) lists requirements (the interpreter to use, where the result goes, a
directory never to touch); some commands fail with a diagnostic until a flag is used (``pip install`` needs
``--user``); the environment has stable facts (``db_port`` in ``config.yaml``). Every observation ends with
``next: SUBTASK (subtask i of n)``. The scripted :class:`ActionAgent` sees only what its context holds (the last
``k`` steps; the statement only while it is inside that window) plus an optional reminder (a transient
``memory context:`` message). When the fact a subtask needs is out of sight it falls back to a default command: it
violates a requirement (fatal), repeats a command that failed before (a wasted step), or has to re-read a file (a
wasted step). A reminder that does not name the next subtask's fact distracts the agent with probability
``distraction`` (default 0.3; a real model mostly ignores an irrelevant reminder): it stops to double-check, a wasted
step (``pwd``; never twice in a row). Over-intervention is a graded cost: the step budget forgives ``slack`` wasted
steps (default 2), so a few needless reminders are harmless and many are fatal.

Pivots (steps where a reminder changes the agent's action, :func:`find_pivot`) are computed by a reference run and
stored in the episode metadata: the ground truth for pivot detection. A pivot whose fact is a requirement
(``requirement: true``: interpreter, output location, protected directory) is fatal to miss; the others cost wasted
steps. :func:`simulate_proactive` is the reference loop with a memory behaviour (the oracle of
:mod:`memrl.data.experts.proactive`) or without memory.

One concept a module: :mod:`.world` (fact kinds, plan subtasks, the task's knobs and terminal state), :mod:`.agents`
(the scripted action agent and Phase 1 bank writer), :mod:`.reference` (the reference loop and :func:`find_pivot`),
:mod:`.task` (:class:`ProactiveTask`); this package exports their public names.
"""

from memrl.data.tasks.proactive.agents import ActionAgent, BankWriter
from memrl.data.tasks.proactive.reference import ProactiveRun, find_pivot, simulate_proactive, window_messages
from memrl.data.tasks.proactive.task import ProactiveTask
from memrl.data.tasks.proactive.world import (
    FACT_KINDS,
    FACTS,
    REQUIREMENTS,
    Fact,
    ProactiveParams,
    Subtask,
    TermState,
    fact_value,
    parse_next,
    subtask_by_name,
)

__all__ = [
    "FACTS",
    "FACT_KINDS",
    "REQUIREMENTS",
    "ActionAgent",
    "BankWriter",
    "Fact",
    "ProactiveParams",
    "ProactiveRun",
    "ProactiveTask",
    "Subtask",
    "TermState",
    "fact_value",
    "find_pivot",
    "parse_next",
    "simulate_proactive",
    "subtask_by_name",
    "window_messages",
]
