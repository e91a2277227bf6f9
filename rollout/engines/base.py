"""The one engine interface every model call in memrl goes through (policy, reasoner, committee, judge, expert).

Token-in / token-out: a :class:`GenerationResult` carries the exact prompt ids the engine consumed and, for each of
the ``n`` samples, the response ids, the per-token log-probs of the sampled tokens, the text and the finish reason.
A list of requests is one call, so backends can batch (vLLM) or run them concurrently (OpenAI-compatible).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from data.schemas import MemoryCall, Message

__all__ = [
    "Completion",
    "Engine",
    "EngineError",
    "GenerationRequest",
    "GenerationResult",
    "SamplingParams",
    "Usage",
    "to_memory_call",
]


class EngineError(RuntimeError):
    """A generation that could not be completed (names the backend/endpoint and the cause)."""


@dataclass
class SamplingParams:
    """Sampling settings of one request; ``n`` samples share the prompt."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logprobs: bool = True

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")


@dataclass
class GenerationRequest:
    """Chat ``messages`` (rendered with the engine's chat template) or raw ``prompt_ids``; exactly one is set."""

    messages: list[Message] | None = None
    prompt_ids: list[int] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt_ids is None):
            raise ValueError("set exactly one of messages or prompt_ids")


@dataclass
class Completion:
    """One sample: response token ids, the engine's log-prob of each sampled token, decoded text, finish reason."""

    response_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str


@dataclass
class Usage:
    """Token accounting of one request (all samples). ``cached_prompt_tokens`` were served from a prefix cache."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    cost_usd: float = 0.0


@dataclass
class GenerationResult:
    """The answer to one :class:`GenerationRequest`."""

    prompt_ids: list[int]
    completions: list[Completion]
    usage: Usage
    engine: str
    policy_version: int = 0


class Engine(abc.ABC):
    """A text generator. Subclasses implement :meth:`generate`; use as a context manager for clean shutdown."""

    name: str = "engine"
    policy_version: int = 0

    @abc.abstractmethod
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Generate for every request (one batched call); results are in request order."""

    def close(self) -> None:  # noqa: B027 - optional hook, most engines hold nothing
        """Release processes, sockets and memory held by the engine."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def to_memory_call(
    call_id: str,
    role: str,
    request: GenerationRequest,
    result: GenerationResult,
    sample: int = 0,
    *,
    step: int = 0,
    error: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> MemoryCall:
    """Record sample ``sample`` of ``result`` as a :class:`MemoryCall` (token ids and log-probs kept as is)."""
    completion = result.completions[sample]
    return MemoryCall(
        call_id=call_id,
        role=role,
        messages=list(request.messages or []),
        prompt_ids=list(result.prompt_ids),
        response_ids=list(completion.response_ids),
        logprobs=list(completion.logprobs),
        text=completion.text,
        finish_reason=completion.finish_reason,
        policy_version=result.policy_version,
        engine=result.engine,
        step=step,
        prompt_tokens=len(result.prompt_ids),
        completion_tokens=len(completion.response_ids),
        error=error,
        metadata=dict(metadata or {}),
    )
