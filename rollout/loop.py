"""The agent loop: a frozen reasoner acting in a task environment through a memory system.

A :class:`Rollout` is a state machine over plain data: :meth:`Rollout.pending` names the next model call it needs
(a memory-model call the memory system asked for, or the reasoner's next step), :meth:`Rollout.advance` consumes the
engine's answer. Nothing calls an engine inside a rollout, so a driver can batch the pending calls of many rollouts
into one engine call per wavefront (:func:`run_rollouts`), and a rollout can be forked with ``copy.deepcopy`` at a
pending memory call: the tree builder's branching point.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from memrl.data.formats import parse_tool_calls, render_tool_error
from memrl.data.schemas import EpisodeTrace, MemoryCall, Message, TokenUsage, TraceEvent
from memrl.data.tracking import progress_bar
from memrl.data.user_code import in_episode
from memrl.rollout.engines.base import Engine, GenerationRequest, GenerationResult, SamplingParams, to_memory_call
from memrl.rollout.memory.base import MemoryRequest, MemorySystem, RoleSampling, Turn

__all__ = [
    "EngineSet",
    "PendingCall",
    "Rollout",
    "TaskEnv",
    "as_messages",
    "call_seed",
    "memory_call_usage",
    "reasoner_call_usage",
    "run_rollouts",
]


class TaskEnv(Protocol):
    """What the loop needs of a task environment (the data package's task families implement it).

    Environments must survive ``copy.deepcopy`` (rollouts fork at memory calls).
    """

    task_id: str
    task: str
    max_steps: int

    def reset(self) -> str:
        """Start the episode; return the first observation."""
        ...

    def step(self, action: str) -> tuple[str, bool]:
        """Apply an action; return the observation and whether the episode is over."""
        ...

    def finish(self, answer: str | None) -> float:
        """End the episode (with the reasoner's answer, if any) and return the verifier's outcome in [0, 1]."""
        ...


@dataclass
class PendingCall:
    """The next model call a rollout needs."""

    kind: Literal["memory", "reasoner"]
    role: str
    request: GenerationRequest
    memory_request: MemoryRequest | None = None


@dataclass
class EngineSet:
    """The engines of a run: the frozen reasoner, the memory model, and optional per-role memory engines."""

    reasoner: Engine
    memory: Engine
    by_role: dict[str, Engine] = field(default_factory=dict)

    def for_call(self, call: PendingCall) -> Engine:
        """The engine that answers ``call``."""
        if call.kind == "reasoner":
            return self.reasoner
        return self.by_role.get(call.role, self.memory)


def as_messages(items: Sequence[Any]) -> list[Message]:
    """Chat messages as :class:`Message` s (a user's memory system may build ``{"role", "content"}`` dicts)."""
    return [m if isinstance(m, Message) else Message.model_validate(m) for m in items]


def call_seed(*parts: Any) -> int:
    """The sampling seed of one model call, a pure function of its parts (rollout seed, task, rollout path, call)."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def memory_call_usage(record: MemoryCall, result: GenerationResult, sample: int) -> TokenUsage:
    """The tokens of one memory call (sample ``sample`` of ``result``): the prompt's cached tokens count once, on the
    request's first sample."""
    return TokenUsage(
        prompt_tokens=record.prompt_tokens,
        completion_tokens=record.completion_tokens,
        cached_prompt_tokens=result.usage.cached_prompt_tokens if sample == 0 else 0,
        calls=1,
    )


def reasoner_call_usage(result: GenerationResult, sample: int) -> TokenUsage:
    """The tokens of one reasoner call: the request's prompt (and its cached part) and the sample's response."""
    return TokenUsage(
        prompt_tokens=result.usage.prompt_tokens,
        cached_prompt_tokens=result.usage.cached_prompt_tokens,
        completion_tokens=len(result.completions[sample].response_ids) or result.usage.completion_tokens,
        calls=1,
    )


class Rollout:
    """One agent-loop run of one task: reasoner + memory system + environment, advanced one model call at a time."""

    def __init__(
        self,
        env: TaskEnv,
        memory: MemorySystem,
        *,
        reasoner_system: str,
        reasoner_sampling: RoleSampling | None = None,
        seed: int = 0,
        rollout_id: str = "r",
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.env = env
        self.memory = memory
        self.reasoner_system = reasoner_system
        self.reasoner_sampling = reasoner_sampling or RoleSampling(temperature=0.0, max_tokens=128)
        self.seed = seed
        self.rollout_id = rollout_id
        self.metadata = dict(metadata or {})
        self.step = 0
        self.done = False
        self.answer: str | None = None
        self.outcome: float | None = None
        self.events: list[TraceEvent] = []
        self.memory_calls: list[MemoryCall] = []
        self.reasoner_usage = TokenUsage()
        self.memory_usage = TokenUsage()
        self.peak_context_tokens = 0
        self.stats: dict[str, int] = {}
        self._pending: PendingCall | None = None
        self._tool_started_at: int | None = None
        self._tool_reply = ""
        self._tool_calls: list[str] = []
        self._tool_usage: dict[str, int] = {}
        self._calls_made = 0
        self.memory.reset(env.task, {"task_id": env.task_id, **self.metadata})
        first = env.reset()
        self.memory.on_turn(Turn(step=0, action_text="", observation=first, role="user"))

    # ---------------------------------------------------------------------------------------------------------
    def pending(self) -> PendingCall | None:
        """The next model call this rollout needs (the same object until :meth:`advance`), or None when done."""
        if self.done:
            return None
        if self._pending is None:
            self._pending = self._next_call()
        return self._pending

    def _request_metadata(self, role: str) -> dict[str, Any]:
        return {"task_id": self.env.task_id, "role": role, "rollout_id": self.rollout_id, "step": self.step}

    def _sampling(self, s: RoleSampling, logprobs: bool = True) -> SamplingParams:
        """The engine's sampling settings of a role's next call, seeded by the rollout and the call's index."""
        return SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            max_tokens=s.max_tokens,
            stop=list(s.stop),
            seed=call_seed(self.seed, self.env.task_id, self.rollout_id, self._calls_made),
            logprobs=logprobs,
        )

    def _next_call(self) -> PendingCall:
        self._calls_made += 1
        request = self.memory.next_memory_request()
        if request is not None:
            gen = GenerationRequest(
                messages=as_messages(request.messages),
                sampling=self._sampling(request.sampling),
                metadata={**self._request_metadata(request.role), **request.metadata},
            )
            return PendingCall(kind="memory", role=request.role, request=gen, memory_request=request)
        if self._tool_started_at is not None:
            raise RuntimeError(f"{self.memory.name}: a memory tool is running but no memory call or result is ready")
        messages = as_messages(self.memory.reasoner_messages(self.reasoner_system))
        transient = getattr(self.env, "transient_context", None)
        if callable(transient) and (extra := transient()):  # e.g. a Gym env's admissible actions: this call only,
            messages = [*messages, Message(role="user", content=str(extra))]  # never a turn the memory keeps
        params = self._sampling(self.reasoner_sampling, logprobs=False)
        gen = GenerationRequest(messages=messages, sampling=params, metadata=self._request_metadata("reasoner"))
        return PendingCall(kind="reasoner", role="reasoner", request=gen)

    def add_turn(self, turn: Turn) -> None:
        """Give the memory system a turn the loop did not produce: a replayed trajectory turn or a question
        (question-answering mode, :mod:`memrl.rollout.memory.workflow`).

        Allowed only while no memory call is pending (its answer would be lost) and no memory tool is running. A
        cached pending reasoner call is dropped, so the next :meth:`pending` sees the new turn. The step counter
        moves up to ``turn.step``, so the reasoner's later steps are numbered after the replayed turns."""
        if self.done:
            raise RuntimeError("add_turn() on a finished rollout")
        if self._tool_started_at is not None or (self._pending is not None and self._pending.kind == "memory"):
            raise RuntimeError("add_turn() while a memory call is pending or a memory tool is running")
        self._pending = None
        self.step = max(self.step, turn.step)
        self.memory.on_turn(turn)

    @property
    def last_reentry(self) -> dict[str, Any] | None:
        """How this fork re-entered its state (``mode``: snapshot or replay, ``replayed_steps``) when its task
        re-enters one (a Gym environment); None for a task copied in memory."""
        return getattr(self.env, "last_reentry", None)

    def fork(self, rollout_id: str) -> Rollout:
        """A deep copy that continues independently (used to branch at a pending memory call)."""
        # Records already made (events, memory calls) are never mutated: the twin shares them instead of copying.
        memo: dict[int, Any] = {id(r): r for r in (*self.events, *self.memory_calls)}
        twin = copy.deepcopy(self, memo)
        twin.rollout_id = rollout_id
        return twin

    # ---------------------------------------------------------------------------------------------------------
    def advance(self, result: GenerationResult, sample: int = 0) -> MemoryCall | None:
        """Consume sample ``sample`` of the engine's answer to :meth:`pending`; returns the memory call it made."""
        call = self._pending
        if call is None:
            raise RuntimeError("advance() without a pending call")
        self._pending = None
        if call.kind == "memory":
            return self._advance_memory(call, result, sample)
        self._advance_reasoner(result, sample)
        return None

    def _advance_memory(self, call: PendingCall, result: GenerationResult, sample: int) -> MemoryCall:
        assert call.memory_request is not None
        call_id = f"{self.env.task_id}/{self.rollout_id}/m{len(self.memory_calls)}"
        record = to_memory_call(
            call_id,
            call.role,
            call.request,
            result,
            sample,
            step=self.step,
            metadata=dict(call.memory_request.metadata),
        )
        self.memory.on_memory_result(call.memory_request, record)
        self.memory_calls.append(record)
        if self._tool_started_at is not None:
            self._tool_calls.append(call_id)
        self.memory_usage = self.memory_usage + memory_call_usage(record, result, sample)
        self._finish_tool_if_ready()
        return record

    def _advance_reasoner(self, result: GenerationResult, sample: int) -> None:
        completion = result.completions[sample]
        usage = reasoner_call_usage(result, sample)
        self.reasoner_usage = self.reasoner_usage + usage
        self.peak_context_tokens = max(self.peak_context_tokens, len(result.prompt_ids) or usage.prompt_tokens)
        self.memory.after_reasoner_call()
        self.step += 1
        reply = completion.text
        usage_fields = {
            "reasoner_prompt_tokens": usage.prompt_tokens,
            "reasoner_cached_tokens": usage.cached_prompt_tokens,
            "reasoner_completion_tokens": usage.completion_tokens,
        }
        parsed = parse_tool_calls(reply)
        if not parsed.calls:
            error = parsed.errors[0] if parsed.errors else "no tool call in the reply"
            self._count("reasoner_malformed")
            self._record_turn("error", reply, render_tool_error(error), error=error, **usage_fields)
        else:
            tool = parsed.calls[0]
            if tool.name == "answer":
                answer = tool.arguments.get("answer")
                self.events.append(
                    TraceEvent(step=self.step, kind="answer", reply=reply, observation="", **usage_fields)
                )
                self._finish(str(answer) if answer is not None else None)
                return
            if tool.name == "act":
                action = str(tool.arguments.get("action", ""))
                observation, over = self.env.step(action)
                self._record_turn("act", reply, observation, **usage_fields)
                if over:
                    self._finish(None)
                    return
            elif tool.name in self.memory.tools:
                self._tool_started_at = self.step
                self._tool_reply = reply
                self._tool_calls = []
                self._tool_usage = usage_fields
                self.memory.on_tool_call(tool, self.step)
                self._finish_tool_if_ready()
            else:
                error = f"unknown tool {tool.name!r}"
                self._count("reasoner_unknown_tool")
                self._record_turn("error", reply, render_tool_error(error), error=error, **usage_fields)
        if not self.done and self._tool_started_at is None and self.step >= self.env.max_steps:
            self.events.append(TraceEvent(step=self.step, kind="limit", observation="step limit reached"))
            self._finish(None)

    def _finish_tool_if_ready(self) -> None:
        if self._tool_started_at is None:
            return
        result = self.memory.tool_result()
        if result is None:
            return
        if result.error:
            self._count("memory_tool_errors")
        observation = result.content if not result.error else render_tool_error(result.error)
        self._record_turn(
            "memory_tool",
            self._tool_reply,
            observation,
            error=result.error,
            memory_call_ids=list(self._tool_calls),
            **self._tool_usage,
        )
        self._tool_started_at = None
        if not self.done and self.step >= self.env.max_steps:
            self.events.append(TraceEvent(step=self.step, kind="limit", observation="step limit reached"))
            self._finish(None)

    def _record_turn(self, kind: str, reply: str, observation: str, **fields: Any) -> None:
        self.events.append(TraceEvent(step=self.step, kind=kind, reply=reply, observation=observation, **fields))
        role = "user" if kind == "memory_tool" else "tool"
        self.memory.on_turn(Turn(step=self.step, action_text=reply, observation=observation, role=role))

    def _finish(self, answer: str | None) -> None:
        self.answer = answer
        self.outcome = float(self.env.finish(answer))
        self.done = True
        partial = getattr(self.env, "partial_outcome", None)  # a Gym env's rewards so far: the outcome with partial
        if isinstance(partial, float):  # credit, beside the configured one (evaluation reports both)
            self.metadata = {**self.metadata, "partial_outcome": partial}
        env_stats = getattr(self.env, "stats", None)
        if isinstance(env_stats, dict):  # an adapter's counts (env steps, env errors, ...): into the leaf's stats
            for key, value in env_stats.items():
                self.stats[key] = self.stats.get(key, 0) + int(value)

    def _count(self, key: str) -> None:
        self.stats[key] = self.stats.get(key, 0) + 1

    # ---------------------------------------------------------------------------------------------------------
    def trace(self) -> EpisodeTrace:
        """The run's record (memory calls with token ids, events with token accounting, outcome, stats)."""
        stats = {**self.memory.stats, **self.stats}
        return EpisodeTrace(
            trace_id=f"{self.env.task_id}/{self.rollout_id}",
            task_id=self.env.task_id,
            memory_system=self.memory.name,
            answer=self.answer,
            outcome=self.outcome,
            events=list(self.events),
            memory_calls=list(self.memory_calls),
            reasoner_usage=self.reasoner_usage,
            memory_usage=self.memory_usage,
            peak_context_tokens=self.peak_context_tokens,
            stats=stats,
            metadata=dict(self.metadata),
        )


def run_rollouts(
    rollouts: Sequence[Rollout],
    engines: EngineSet,
    *,
    progress: str | None = None,
    on_memory_call: Callable[[Rollout, MemoryCall], None] | None = None,
    on_result: Callable[[Rollout, PendingCall, GenerationResult], None] | None = None,
) -> list[EpisodeTrace]:
    """Drive rollouts to the end in lockstep: each wavefront sends every pending call to its engine in one batch.

    ``on_result`` sees every call with the engine's answer before the rollout consumes it (offline labelled rollouts
    record them for deterministic replay)."""
    active = [r for r in rollouts if not r.done]
    bar = progress_bar(total=len(active), desc=progress, disable=progress is None, leave=False)
    while active:
        batches: dict[int, tuple[Engine, list[tuple[Rollout, PendingCall]]]] = {}
        for rollout in active:
            with in_episode(rollout.env.task_id, rollout.rollout_id):
                call = rollout.pending()
            assert call is not None
            engine = engines.for_call(call)
            batches.setdefault(id(engine), (engine, []))[1].append((rollout, call))
        for engine, items in batches.values():
            results = engine.generate([call.request for _, call in items])
            for (rollout, call), result in zip(items, results, strict=True):
                if on_result is not None:
                    on_result(rollout, call, result)
                with in_episode(rollout.env.task_id, rollout.rollout_id):
                    record = rollout.advance(result)
                if record is not None and on_memory_call is not None:
                    on_memory_call(rollout, record)
        still = [r for r in active if not r.done]
        bar.update(len(active) - len(still))
        active = still
    bar.close()
    return [r.trace() for r in rollouts]
