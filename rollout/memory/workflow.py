"""Shared machinery of the multi-call memory systems Mage, MemMA and AMA-Agent.

**Job queue.** Memory work that needs several memory-model calls is a queue of :class:`Job` records (plain data, so a
rollout deep-copies at any pending call). :meth:`JobQueueMemory.next_memory_request` first finishes the queued jobs,
then ingests the next buffered turn; a job either asks for a memory-model call (a :class:`MemoryRequest` whose
metadata names the job and its phase) or finishes without one. Turns are buffered by :meth:`JobQueueMemory.on_turn`
and ingested in order, so a whole trajectory fed at once is processed exactly as if it had arrived turn by turn.

**Question-answering mode** (AMA-Bench style), the same for the three systems:

1. ``reset(task, metadata)``; the agent loop also feeds the environment's first observation as
   ``Turn(step=0, action_text="", role="user")`` (the *start* turn).
2. every recorded trajectory turn as ``Turn(step=turn_idx, action_text=action, observation=observation,
   role="tool")`` (turn ids in memory are AMA-Bench's ``turn_idx``, made distinct by
   :func:`~memrl.data.schemas.turn_steps`); :func:`feed_episode` does steps 2 and 3.
3. the question as a ``user`` turn with empty ``action_text`` at a step > 0 (the last ``turn_idx`` + 1).
4. the loop asks :meth:`~JobQueueMemory.next_memory_request` until it returns None (ingestion calls in trajectory
   order, then the question's retrieval calls), then :meth:`~memrl.rollout.memory.base.MemorySystem.reasoner_messages`
   returns the reasoner's prompt: the task, the system's support for the question, and the question as the last line.
   The reasoner replies ``answer(answer)``.

Turns that arrive without a reasoner call before them (steps 2-3) are *replayed*: nothing can re-execute them, which
matters to Mage's Revise.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from memrl.data.config import ConfigModel
from memrl.data.formats import ToolCall, parse_tool_calls
from memrl.data.schemas import MemoryCall, Message, turn_steps
from memrl.data.schemas import Turn as TrajectoryTurn
from memrl.rollout.memory.base import MemoryRequest, MemorySystem, RoleSampling, ToolResult, Turn
from memrl.rollout.memory.embedders import Embedder, make_embedder

__all__ = ["EmbeddingJobQueueMemory", "Inbound", "Job", "JobQueueMemory", "action_of", "feed_episode", "truncate"]


def action_of(action_text: str) -> str:
    """The environment action a turn carries: the argument of an ``act`` tool call, or the text itself (replayed
    trajectories carry the action, not a tool call)."""
    parsed = parse_tool_calls(action_text)
    for call in parsed.calls:
        if call.name == "act":
            return str(call.arguments.get("action", ""))
    if parsed.calls:
        call = parsed.calls[0]
        return f"{call.name}({', '.join(f'{k}={v}' for k, v in call.arguments.items())})"
    return action_text.strip()


def truncate(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis (limit <= 0 keeps everything)."""
    return text if limit <= 0 or len(text) <= limit else text[: max(limit - 3, 0)] + "..."


def feed_episode(memory: MemorySystem, trajectory: Sequence[TrajectoryTurn | dict[str, Any]], question: str) -> None:
    """Feed a recorded trajectory (AMA-Bench turns) and then the question, as the question-answering protocol says."""
    turns = [raw if isinstance(raw, TrajectoryTurn) else TrajectoryTurn.model_validate(raw) for raw in trajectory]
    steps = turn_steps(turns)
    for step, turn in zip(steps, turns, strict=True):
        memory.on_turn(Turn(step=step, action_text=turn.action, observation=turn.observation, role="tool"))
    memory.on_turn(Turn(step=steps[-1] + 1 if steps else 1, action_text="", observation=question, role="user"))


@dataclass
class Job:
    """One unit of queued memory work; ``data`` holds its progress (plain, deep-copyable values)."""

    job_id: int
    kind: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Inbound:
    """A buffered turn (``kind`` ``start``, ``env`` or ``question``; ``replayed`` when no reasoner call made it) or a
    reasoner tool call (``kind`` ``tool``), kept in arrival order."""

    kind: str
    turn: Turn
    replayed: bool
    call: ToolCall | None = None


class JobQueueMemory(MemorySystem):
    """A memory system whose work is a queue of jobs over buffered turns (see the module docstring).

    Subclasses implement :meth:`_ingest`, :meth:`_request`, :meth:`_consume`, :meth:`_start_tool` and
    :meth:`reasoner_messages` (and :meth:`_on_start`, :meth:`_on_question` where the start or the question needs
    work); they finish a tool with :meth:`_finish_tool`. ``config`` is the system's settings (its ``sampling`` holds
    each memory role's sampling; ``config_model`` its class, whose defaults serve when no config is given); a
    subclass empties its own per-episode structures in :meth:`_clear` (calling ``super()._clear()``), which runs at
    construction and at every :meth:`reset`.
    """

    config_model: type[ConfigModel]

    def __init__(self, config: Any = None) -> None:
        super().__init__()
        self.config = config if config is not None else self.config_model()
        self._role_sampling: dict[str, RoleSampling] = dict(self.config.sampling)
        self._clear()

    def _clear(self) -> None:
        """Empty the job queue, the inbox and the episode's state."""
        self.task = ""
        self.start_observation = ""
        self.question: str | None = None
        self._jobs: list[Job] = []
        self._inbox: list[Inbound] = []
        self._next_job_id = 0
        self._tool_step: int | None = None
        self._tool_result: ToolResult | None = None
        self._awaiting_turn = False
        self._transient: list[str] = []

    # ---------------------------------------------------------------------------------------------------------
    # Hooks for subclasses

    @abc.abstractmethod
    def _ingest(self, item: Inbound) -> None:
        """Process one buffered environment turn (deterministic work, and queue jobs that need the memory model)."""

    def _on_start(self, turn: Turn) -> None:
        """The episode's start observation arrived (kept as ``start_observation``)."""

    def _on_question(self, turn: Turn) -> None:
        """The question arrived (kept as ``question``): queue the work that answers it."""

    @abc.abstractmethod
    def _request(self, job: Job) -> MemoryRequest | None:
        """The memory-model call ``job`` needs next, or None when it is finished. Asked twice in a row it must return
        the same request: deterministic progress made on the way is recorded in ``job.data`` so it is not repeated."""

    @abc.abstractmethod
    def _consume(self, job: Job, text: str) -> None:
        """Take the memory model's answer to the call :meth:`_request` asked for."""

    def _start_tool(self, call: ToolCall, step: int) -> ToolResult | Job:
        """Start a reasoner tool call: an immediate result, or a job that ends with :meth:`_finish_tool`."""
        raise NotImplementedError(f"{self.name} has no tool {call.name!r}")

    # ---------------------------------------------------------------------------------------------------------
    # Helpers

    def _new_job(self, kind: str, **data: Any) -> Job:
        job = Job(self._next_job_id, kind, dict(data))
        self._next_job_id += 1
        return job

    def _enqueue(self, job: Job) -> None:
        self._jobs.append(job)

    def _call(self, job: Job, role: str, messages: list[Message], phase: str = "", **metadata: Any) -> MemoryRequest:
        """A memory-model request on behalf of ``job`` (its role's sampling settings, job id and phase recorded)."""
        sampling = self._role_sampling.get(role, RoleSampling(temperature=0.0, max_tokens=256))
        return MemoryRequest(
            role=role,
            messages=messages,
            sampling=sampling,
            metadata={"job": job.job_id, "job_kind": job.kind, "phase": phase or job.kind, **metadata},
        )

    def _finish_tool(self, result: ToolResult) -> None:
        self._tool_result = result

    def _take(self, item: Inbound) -> None:
        if item.kind == "start":
            self.start_observation = item.turn.observation
            self._on_start(item.turn)
        elif item.kind == "question":
            self.question = item.turn.observation
            self._on_question(item.turn)
        else:
            self._ingest(item)

    def _pump(self) -> MemoryRequest | None:
        while True:
            if self._jobs:
                job = self._jobs[0]
                request = self._request(job)
                if request is not None:
                    return request
                self._jobs = [j for j in self._jobs if j is not job]
                continue
            if self._inbox:
                item = self._inbox.pop(0)
                if item.call is None:
                    self._take(item)
                    continue
                outcome = self._start_tool(item.call, item.turn.step)
                if isinstance(outcome, ToolResult):
                    self._tool_result = outcome
                else:
                    self._enqueue(outcome)
                continue
            return None

    # ---------------------------------------------------------------------------------------------------------
    # MemorySystem interface

    def reset(self, task: str, metadata: dict[str, Any]) -> None:
        """Start a new episode with empty memory."""
        self._clear()
        self.task = task

    def on_turn(self, turn: Turn) -> None:
        """Buffer a turn; it is ingested by the next :meth:`next_memory_request`."""
        replayed = not self._awaiting_turn
        self._awaiting_turn = False
        if self._tool_step is not None and turn.step == self._tool_step and turn.role == "user":
            self._tool_step = None  # the loop's record of our own tool's result: already handled
            return
        if turn.role == "user" and not turn.action_text:
            kind = "start" if turn.step == 0 else "question"
        else:
            kind = "env"
        self._inbox.append(Inbound(kind, turn, replayed))

    def after_reasoner_call(self) -> None:
        """Drop transient notes; the next turn is the reasoner's own."""
        self._transient = []
        self._awaiting_turn = True

    def next_memory_request(self) -> MemoryRequest | None:
        """Finish queued jobs and buffered turns; the first memory-model call they need, or None."""
        return self._pump()

    def on_memory_result(self, request: MemoryRequest, call: MemoryCall) -> None:
        """Hand the answer to the job that asked for it."""
        if not self._jobs or self._jobs[0].job_id != request.metadata.get("job"):
            self.count(f"{self.name}_orphan_result")
            return
        if call.error:
            self.count(f"{self.name}_call_errors")
        self._consume(self._jobs[0], call.text if isinstance(call.text, str) else "")

    def on_tool_call(self, call: ToolCall, step: int) -> None:
        """Start a memory tool (after any buffered turns); its result may need memory-model calls first."""
        self._tool_step = step
        self._tool_result = None
        self._awaiting_turn = True  # the loop records the tool's result as this step's turn
        self._inbox.append(Inbound("tool", Turn(step=step, action_text="", observation=""), False, call))
        self._pump()

    def tool_result(self) -> ToolResult | None:
        """The finished tool result (taken once)."""
        if self._tool_result is None:
            self._pump()
        result, self._tool_result = self._tool_result, None
        return result

    def _system_message(self, system_prompt: str, default: str) -> Message:
        return Message(role="system", content=system_prompt or default)


class EmbeddingJobQueueMemory(JobQueueMemory):
    """A :class:`JobQueueMemory` that embeds what it stores with ``embedder`` (default: the one ``config.embedder``
    names)."""

    def __init__(self, config: Any = None, embedder: Embedder | None = None) -> None:
        super().__init__(config)
        self.embedder = embedder or make_embedder(self.config.embedder)
