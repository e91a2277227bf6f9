"""The model calls of an episode that runs outside memrl's agent loop (an episode function's thread, an HTTP agent's
process): a channel that carries each call to the rollout (:class:`memrl.rollout.episodes.EpisodeRollout`) and its
answer back, the clients an episode function calls through, the validation every call gets, and how an episode's end
is read (:func:`episode_outcome`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

from memrl.data.errors import UserCodeError
from memrl.data.schemas import Message
from memrl.data.tasks.external import Outcome
from memrl.rollout.engines.base import Completion
from memrl.rollout.loop import as_messages

__all__ = [
    "BadOutcome",
    "CallChannel",
    "EpisodeCancelled",
    "ExternalCall",
    "MemoryClient",
    "ReasonerClient",
    "check_call",
    "episode_outcome",
    "request_digest",
]

MAX_MESSAGES = 1024  # messages per model call at most
MAX_CHARS = 2_000_000  # characters per model call at most


class BadOutcome(ValueError):
    """An episode ended with a score outside [0, 1] (or NaN): that episode fails (``episode_bad_outcomes``)."""


class EpisodeCancelled(Exception):
    """Raised inside an episode whose rollout was stopped (timed out, or over its call budget)."""


@dataclass
class ExternalCall:
    """One model call an episode made: the episode waits on ``reply`` for the completion."""

    kind: Literal["memory", "reasoner"]
    role: str
    messages: list[Message]
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    reply: concurrent.futures.Future[Completion] = field(default_factory=concurrent.futures.Future)


def request_digest(kind: str, role: str, messages: list[Message]) -> str:
    """What replay compares: sha256 of the call's kind, role and messages."""
    blob = json.dumps([kind, role, [[m.role, m.content] for m in messages]], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def check_call(kind: str, role: str, messages: Any, max_tokens: Any = None) -> tuple[list[Message], int | None]:
    """Validate a model call an episode or an agent makes (sizes and types); a ValueError says what is wrong."""
    if not isinstance(role, str) or not role or len(role) > 64:
        raise ValueError("role: a non-empty string of at most 64 characters")
    if not isinstance(messages, list) or not messages or len(messages) > MAX_MESSAGES:
        raise ValueError(f"messages: a non-empty list of at most {MAX_MESSAGES} chat messages")
    try:
        out = as_messages(messages)
    except Exception as exc:
        raise ValueError(
            f"messages: each needs role (system/user/assistant/tool) and content (a string): {exc}"
        ) from None
    if sum(len(m.content) for m in out) > MAX_CHARS:
        raise ValueError(f"messages: more than {MAX_CHARS:,} characters")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= 1_000_000
    ):
        raise ValueError("max_tokens: an integer in [1, 1000000]")
    return out, max_tokens


class CallChannel:
    """The calls of one running episode, in order, then its end (``("call", ExternalCall)``, ``("done", Outcome)``,
    ``("error", exception)``)."""

    def __init__(self) -> None:
        self.items: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.closed = threading.Event()
        self.rejected = 0  # requests of this episode the endpoint refused as invalid (an HTTP agent's)

    def post(
        self,
        kind: Literal["memory", "reasoner"],
        role: str,
        messages: Any,
        max_tokens: int | None = None,
        stop: list[str] | None = None,
    ) -> ExternalCall:
        """Queue a call (the caller waits on its ``reply``)."""
        checked, max_tokens = check_call(kind, role, messages, max_tokens)
        call = ExternalCall(kind, role, checked, max_tokens, list(stop or []))
        if self.closed.is_set():
            call.reply.set_exception(EpisodeCancelled("the episode was stopped"))
        else:
            self.items.put(("call", call))
        return call

    def close(self) -> None:
        """No more answers: every later call fails with :class:`EpisodeCancelled`."""
        self.closed.set()


class MemoryClient:
    """What an episode function calls the memory model through (``memory`` in ``run(task, memory, reasoner)``)."""

    def __init__(self, channel: CallChannel) -> None:
        self._channel = channel

    async def generate(
        self, messages: list[Any], *, role: str = "memory", max_tokens: int | None = None, stop: list[str] | None = None
    ) -> str:
        """The memory model's reply to ``messages`` as role ``role`` (sampled as the run's ``memory.sampling[role]``
        says; ``max_tokens`` / ``stop`` may tighten it)."""
        call = self._channel.post("memory", role, messages, max_tokens, stop)
        return (await asyncio.wrap_future(call.reply)).text


class ReasonerClient:
    """What an episode function calls the frozen reasoner through (``reasoner`` in ``run(task, memory, reasoner)``)."""

    def __init__(self, channel: CallChannel) -> None:
        self._channel = channel

    async def generate(
        self, messages: list[Any], *, max_tokens: int | None = None, stop: list[str] | None = None
    ) -> str:
        """The frozen reasoner's reply to ``messages``."""
        call = self._channel.post("reasoner", "reasoner", messages, max_tokens, stop)
        return (await asyncio.wrap_future(call.reply)).text


def episode_outcome(value: Any, where: str) -> Outcome:
    """An episode's return value as an :class:`Outcome` (a number, an Outcome, or a mapping with ``score``)."""
    if isinstance(value, Outcome):
        out = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out = Outcome(score=float(value))
    elif isinstance(value, dict) and "score" in value:
        out = Outcome(score=value["score"], answer=value.get("answer"), info=dict(value.get("info") or {}))
    else:
        raise UserCodeError(
            f"{where} returned {type(value).__name__}; it must return an Outcome(score=...) or a number in [0, 1]"
        )
    if isinstance(out.score, bool) or not isinstance(out.score, (int, float)) or not 0 <= out.score <= 1:
        raise BadOutcome(f"{where} returned the score {out.score!r}; a score is a number in [0, 1]")
    return out
