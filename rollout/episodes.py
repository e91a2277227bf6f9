"""Episodes whose agent loop is the user's own: an ``async def run(task, memory, reasoner) -> Outcome`` episode
function, or a black-box agent in its own process (:mod:`memrl.rollout.http_agent`), as rollouts the tree builder,
the harness and distillation drive like memrl's own (:class:`EpisodeRollout`).

**The episode function** (verl's ``AgentLoopBase.run``, AReaL's ``RolloutWorkflow.arun_episode``)::

    async def run(task, memory, reasoner) -> Outcome | float:
        obs = MyGame().reset(task.seed)                       # task: TaskInfo(task_id, seed, params)
        note = await memory.generate([{"role": "user", "content": obs}], role="note")   # the trained memory model
        reply = await reasoner.generate([...])                # the frozen reasoner
        ...
        return Outcome(score=1.0)                             # or a number in [0, 1]

It runs in a thread of its own (with its own event loop, so it may await anything else too). Every ``generate`` is a
model call memrl answers: memory calls with the policy engine (token ids and log-probs recorded as a
:class:`~memrl.data.schemas.MemoryCall`, sampled as ``memory.sampling[role]`` says), reasoner calls with the frozen
reasoner engine.

**Branching by prefix replay.** A memory-call tree samples the memory model K times at one call: each sibling is a new
run of the episode from the start in which every call before the branch point is answered from the log (no engine
call), and the request of every replayed call (its role and messages, by digest) must equal the logged one; the
branch-point call then takes its own sample. An episode that does not replay (its requests depend on anything but its
seed and the answers it got) raises :class:`~memrl.data.envs.gym.ReplayMismatchError` naming the episode, the call and
both requests, never a silently wrong tree.

**Failures.** An episode that raises, runs past its time limit (``episode_timeout_s``) or makes more than ``max_steps``
model calls ends as failed: outcome 0, counted in the leaf's stats (``episode_errors`` / ``episode_timeouts``) and
the iteration's metrics, its traceback in the run's log; so does one whose score is outside [0, 1]
(``episode_bad_outcomes``); the run goes on. A return value that is not an outcome at all, and an HTTP agent process
that exited, stop the run (:class:`~memrl.data.errors.UserCodeError`): every later episode would fail the same way.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import queue
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from memrl.data.envs.gym import ReplayMismatchError
from memrl.data.errors import UserError
from memrl.data.registry import ComponentError, check_protocol, import_entry, register_reasoner
from memrl.data.schemas import EpisodeTrace, MemoryCall, Message, TokenUsage
from memrl.data.tasks.external import ExternalTask, Outcome
from memrl.data.user_code import describe, log_user_traceback
from memrl.rollout.engines.base import Completion, GenerationRequest, GenerationResult, SamplingParams, to_memory_call
from memrl.rollout.episode_calls import (
    BadOutcome,
    CallChannel,
    EpisodeCancelled,
    ExternalCall,
    MemoryClient,
    ReasonerClient,
    episode_outcome,
    request_digest,
)
from memrl.rollout.loop import PendingCall, call_seed, memory_call_usage, reasoner_call_usage
from memrl.rollout.memory.base import MemoryRequest, RoleSampling
from memrl.rollout.memory.external import ExternalMemoryConfig

__all__ = [
    "EpisodeDriver",
    "EpisodeRollout",
    "FunctionDriver",
    "NoReasoner",
    "close_drivers",
    "episode_name",
    "external_rollout",
    "request_digest",
]

log = logging.getLogger(__name__)


class EpisodeDriver(Protocol):
    """Runs one episode somewhere (a thread, an agent process) and feeds its calls and its end into a channel."""

    def start(self, task: ExternalTask, episode_id: str, channel: CallChannel) -> None:
        """Start the episode; return at once."""

    def stop(self, episode_id: str) -> None:
        """Stop it (best effort: its calls are refused from now on)."""


class FunctionDriver:
    """Runs an ``async def run(task, memory, reasoner)`` episode function in a daemon thread with its own event loop."""

    def __init__(self, entry: str) -> None:
        self.entry = entry
        self.fn = import_entry(entry, "episode function")
        check_protocol(self.fn, "episode function", coroutine=True)

    def start(self, task: ExternalTask, episode_id: str, channel: CallChannel) -> None:
        """Start the episode in its own thread."""

        def main() -> None:
            try:
                value = asyncio.run(self.fn(task.info, MemoryClient(channel), ReasonerClient(channel)))
                channel.items.put(
                    ("done", episode_outcome(value, f"episode function {self.entry} (episode {episode_id})"))
                )
            except BaseException as exc:  # the episode's own failure: it ends as failed, the run goes on
                channel.items.put(("error", exc))

        threading.Thread(target=main, name=f"memrl-episode-{episode_id}", daemon=True).start()

    def stop(self, episode_id: str) -> None:
        """Nothing to do: the closed channel fails the episode's next call."""


_DRIVERS: dict[str, Any] = {}
_DRIVERS_LOCK = threading.Lock()


def _driver(task: ExternalTask) -> Any:
    """The driver of a task's family (one per process: an HTTP agent's server and process are shared)."""
    key = task.entry if task.kind == "episode" else json.dumps(task.params, sort_keys=True)
    with _DRIVERS_LOCK:
        if not _DRIVERS:
            atexit.register(close_drivers)  # a rollout worker's agents stop with it
        if key not in _DRIVERS:
            if task.kind == "episode":
                assert task.entry is not None
                _DRIVERS[key] = FunctionDriver(task.entry)
            else:
                from memrl.rollout.http_agent import HttpAgentDriver

                _DRIVERS[key] = HttpAgentDriver.from_params(task.params)
        return _DRIVERS[key]


def close_drivers() -> None:
    """Stop every HTTP agent this process started and its model endpoint (the recipes call it at the end)."""
    with _DRIVERS_LOCK:
        drivers = list(_DRIVERS.values())
        _DRIVERS.clear()
    for driver in drivers:
        close = getattr(driver, "close", None)
        if callable(close):
            close()


@dataclass
class _Logged:
    digest: str
    kind: str
    role: str
    messages: list[Message]
    completion: Completion


@dataclass
class _View:
    """What the tree builder and the harness read of a rollout's memory (its name and counts)."""

    name: str
    stats: dict[str, int] = field(default_factory=dict)


class EpisodeRollout:
    """One run of an external episode, advanced one model call at a time like :class:`~memrl.rollout.loop.Rollout`
    (``pending`` / ``advance`` / ``fork`` / ``trace``); see the module docstring. ``replay``: the calls a fork
    answers from its parent's log before its own."""

    def __init__(
        self,
        task: ExternalTask,
        sampling: ExternalMemoryConfig,
        *,
        seed: int = 0,
        rollout_id: str = "r",
        metadata: dict[str, Any] | None = None,
        replay: list[_Logged] | None = None,
        driver: Any = None,
    ) -> None:
        self.env = task
        self.task = task
        self.sampling = sampling
        self.seed = seed
        self.rollout_id = rollout_id
        self.metadata = {"family": task.family, "memory": "external", **(metadata or {})}
        self.memory = _View(name="external")
        self._done = False
        self.answer: str | None = None
        self.outcome: float | None = None
        self.stats: dict[str, int] = {}
        self.memory_calls: list[MemoryCall] = []
        self.reasoner_usage = TokenUsage()
        self.memory_usage = TokenUsage()
        self.peak_context_tokens = 0
        self.log: list[_Logged] = []
        self._replay = list(replay or [])
        self.last_reentry: dict[str, Any] | None = None  # set by fork(): how this run re-entered its state
        self._pending: PendingCall | None = None
        self._call: ExternalCall | None = None
        self._driver = driver or _driver(task)
        self._started = time.monotonic()
        self._channel = CallChannel()
        self.episode_id = episode_name(task.task_id, rollout_id)
        self._driver.start(task, self.episode_id, self._channel)

    # ---------------------------------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """Whether the episode is over (waits for its next call or its end: an episode decides that itself)."""
        if not self._done and self._pending is None:
            self.pending()
        return self._done

    def pending(self) -> PendingCall | None:
        """The next model call this episode needs (replayed calls are answered on the way), or None when done."""
        while not self._done and self._pending is None:
            item = self._next_item()
            if item is None:
                return None
            kind, value = item
            if kind == "done":
                self._finish(value)
            elif kind == "error":
                self._fail("episode_bad_outcomes" if isinstance(value, BadOutcome) else "episode_errors", value)
            else:
                self._take(value)
        return self._pending

    def _next_item(self) -> tuple[str, Any] | None:
        left = self.task.timeout_s - (time.monotonic() - self._started)
        try:
            return self._channel.items.get(timeout=max(left, 0.0))
        except queue.Empty:
            self._fail("episode_timeouts", TimeoutError(f"no call or outcome within {self.task.timeout_s:g} s"))
            return None

    def _take(self, call: ExternalCall) -> None:
        digest = request_digest(call.kind, call.role, call.messages)
        index = len(self.log)
        if index < len(self._replay):
            logged = self._replay[index]
            if logged.digest != digest:
                self._stop()
                raise ReplayMismatchError(
                    f"replay of episode {self.task.task_id!r} (seed {self.task.seed}) diverged at model call {index} "
                    f"({call.kind} {call.role!r}): the logged request was {_render(logged.messages)!r} but the replay "
                    f"sent {_render(call.messages)!r}. Branching re-runs the episode with the earlier answers "
                    f"replayed, so its requests must depend only on its seed and those answers"
                )
            self.log.append(logged)
            call.reply.set_result(logged.completion)
            return
        if len(self.log) >= self.task.max_steps:
            call.reply.set_exception(EpisodeCancelled(f"more than {self.task.max_steps} model calls"))
            self._fail("episode_errors", RuntimeError(f"more than {self.task.max_steps} model calls"))
            return
        self._call = call
        self._pending = self._request(call, index)

    def _request(self, call: ExternalCall, index: int) -> PendingCall:
        if call.kind == "memory":
            _warn_unnamed_role(call.role, self.sampling, self.task)
            s = self.sampling.role(call.role)
        else:
            s = RoleSampling(temperature=0.0, max_tokens=128)
        max_tokens = min(call.max_tokens, s.max_tokens) if call.max_tokens else s.max_tokens
        seed = call_seed(self.seed, self.task.task_id, self.rollout_id, index + 1)
        params = SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            max_tokens=max_tokens,
            stop=[*s.stop, *call.stop],
            seed=seed,
            logprobs=call.kind == "memory",
        )
        meta = {
            "task_id": self.task.task_id,
            "role": call.role,
            "rollout_id": self.rollout_id,
            "step": index,
            "episode_id": self.episode_id,
        }
        request = GenerationRequest(messages=list(call.messages), sampling=params, metadata=meta)
        memory = MemoryRequest(call.role, list(call.messages), s) if call.kind == "memory" else None
        return PendingCall(kind=call.kind, role=call.role, request=request, memory_request=memory)

    def advance(self, result: GenerationResult, sample: int = 0) -> MemoryCall | None:
        """Answer the pending call with sample ``sample`` of the engine's result; returns the memory call it made."""
        pending, call = self._pending, self._call
        if pending is None or call is None:
            raise RuntimeError("advance() without a pending call")
        self._pending = self._call = None
        completion = result.completions[sample]
        self.log.append(
            _Logged(
                request_digest(call.kind, call.role, call.messages), call.kind, call.role, call.messages, completion
            )
        )
        record = None
        if call.kind == "memory":
            record = to_memory_call(
                f"{self.task.task_id}/{self.rollout_id}/m{len(self.memory_calls)}",
                call.role,
                pending.request,
                result,
                sample,
                step=len(self.log) - 1,
            )
            self.memory_calls.append(record)
            self.memory_usage = self.memory_usage + memory_call_usage(record, result, sample)
        else:
            self.reasoner_usage = self.reasoner_usage + reasoner_call_usage(result, sample)
            self.peak_context_tokens = max(
                self.peak_context_tokens, len(result.prompt_ids) or result.usage.prompt_tokens
            )
        call.reply.set_result(completion)
        return record

    def fork(self, rollout_id: str) -> EpisodeRollout:
        """A new run of the episode that replays this one's calls (the logged answers) and stops at the same pending
        call, ready for its own sample (the module docstring)."""
        if self._pending is None or self._call is None:
            raise RuntimeError("fork() needs a pending call (the branch point)")
        twin = EpisodeRollout(
            self.task,
            self.sampling,
            seed=self.seed,
            rollout_id=rollout_id,
            metadata=self.metadata,
            replay=self.log,
            driver=self._driver,
        )
        twin.memory_calls = list(self.memory_calls)  # the prefix's records are shared, as Rollout.fork shares them
        twin.memory_usage, twin.reasoner_usage = self.memory_usage, self.reasoner_usage
        twin.peak_context_tokens = self.peak_context_tokens
        twin.stats = dict(self.stats)
        twin.pending()
        expected = request_digest(self._call.kind, self._call.role, self._call.messages)
        got = twin._call
        if got is None or request_digest(got.kind, got.role, got.messages) != expected:
            sent = _render(got.messages) if got is not None else f"no call (the episode ended: {twin.stats})"
            twin._stop()
            raise ReplayMismatchError(
                f"replay of episode {self.task.task_id!r} (seed {self.task.seed}) diverged at model call "
                f"{len(self.log)} ({self._call.kind} {self._call.role!r}, the branch point): the logged request was "
                f"{_render(self._call.messages)!r} but the replay sent {sent!r}"
            )
        twin.stats["episode_replayed_calls"] = twin.stats.get("episode_replayed_calls", 0) + len(self.log)
        twin.last_reentry = {"mode": "replay", "replayed_steps": len(self.log)}
        return twin

    # ---------------------------------------------------------------------------------------------------------
    def _finish(self, outcome: Outcome) -> None:
        self.outcome = float(outcome.score)
        self.answer = outcome.answer
        self._done = True
        self._stop()

    def _fail(self, key: str, exc: BaseException) -> None:
        if isinstance(exc, (ComponentError, UserError)):  # every episode would fail so (replay mismatches too)
            self._stop()
            raise exc
        self.stats[key] = self.stats.get(key, 0) + 1
        self.metadata["failure"] = describe(exc)
        log.warning(f"episode {self.episode_id}: {describe(exc)} (counted as failed, {key})")
        if key == "episode_errors" and exc.__traceback__ is not None:
            log_user_traceback(f"episode {self.episode_id} ({self.task.entry or self.task.family}) raised", exc)
        self.outcome, self._done = 0.0, True
        if self._call is not None:
            self._call.reply.set_exception(EpisodeCancelled(str(exc)))
        self._pending = self._call = None
        self._stop()

    def _stop(self) -> None:
        if self._channel.rejected:  # an HTTP agent's invalid requests, counted in the iteration's metrics
            self.stats["agent_rejected_requests"] = self._channel.rejected
        self._channel.close()
        while True:  # refuse calls the episode already queued, so its thread (or agent) unwinds
            try:
                kind, value = self._channel.items.get_nowait()
            except queue.Empty:
                break
            if kind == "call" and not value.reply.done():
                value.reply.set_exception(EpisodeCancelled("the episode was stopped"))
        self._driver.stop(self.episode_id)

    def trace(self) -> EpisodeTrace:
        """The run's record (memory calls with token ids, outcome, stats)."""
        return EpisodeTrace(
            trace_id=f"{self.task.task_id}/{self.rollout_id}",
            task_id=self.task.task_id,
            memory_system="external",
            answer=self.answer,
            outcome=self.outcome,
            memory_calls=list(self.memory_calls),
            reasoner_usage=self.reasoner_usage,
            memory_usage=self.memory_usage,
            peak_context_tokens=self.peak_context_tokens,
            stats=dict(self.stats),
            metadata=dict(self.metadata),
        )


_WARNED_ROLES: set[str] = set()


def _warn_unnamed_role(role: str, sampling: ExternalMemoryConfig, task: ExternalTask) -> None:
    """One warning per process for memory calls under a role ``memory.sampling`` does not name: they are sampled
    with the defaults and no tree branches on them, so nothing is trained on them."""
    if role in sampling.sampling or role in _WARNED_ROLES:
        return
    _WARNED_ROLES.add(role)
    named = ", ".join(sorted(sampling.sampling)) or "none"
    log.warning(
        f"{task.entry or task.family} calls the memory model with role {role!r}, which memory.sampling does not name "
        f"(it names: {named}): those calls are not trained; add {role!r} to memory.sampling and tree.branch_roles"
    )


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def episode_name(task_id: str, rollout_id: str) -> str:
    """A fresh episode id (URL-safe): the task, the rollout path and a random suffix."""
    return f"{_UNSAFE.sub('_', task_id)}--{_UNSAFE.sub('_', rollout_id)}--{secrets.token_hex(4)}"


def _render(messages: list[Message], limit: int = 300) -> str:
    text = " | ".join(f"{m.role}: {m.content}" for m in messages)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def external_rollout(
    task: ExternalTask, memory: Any, *, seed: int = 0, rollout_id: str = "r", metadata: dict[str, Any] | None = None
) -> EpisodeRollout:
    """The rollout of an episode-function or HTTP-agent task; ``memory`` is the ``external`` config (or a mapping)
    giving its roles' sampling."""
    from memrl.rollout.memory.registry import parse_memory_config

    cfg = parse_memory_config(memory or {"name": "external"})
    if not isinstance(cfg, ExternalMemoryConfig):
        raise ComponentError(
            f"memory: {getattr(cfg, 'name', cfg)!r} is a memory system of memrl's agent loop; an "
            f"episode function or an HTTP agent runs its own memory: use memory: {{name: external, "
            f"sampling: {{ROLE: {{...}}}}}}"
        )
    return EpisodeRollout(task, cfg, seed=seed, rollout_id=rollout_id, metadata=metadata)


@register_reasoner("none")
class NoReasoner:
    """The reasoner of a run whose agent brings its own: any call is an error saying how to configure one."""

    name = "no-reasoner"

    def respond(self, messages: list[Any], rng: Any, metadata: dict[str, Any]) -> str:
        """Refuse."""
        raise ComponentError(
            "this run has no reasoner engine (the task family registers none): set reasoner: in the "
            "config to an engine your episode's reasoner.generate() calls should reach"
        )
