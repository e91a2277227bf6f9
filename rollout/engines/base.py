"""The one engine interface every model call in memrl goes through (policy, reasoner, committee, judge, expert).

Token-in / token-out: a :class:`GenerationResult` carries the exact prompt ids the engine consumed and, for each of
the ``n`` samples, the response ids, the per-token log-probs of the sampled tokens, the text and the finish reason.
A list of requests is one call, so backends can batch (vLLM) or run them concurrently (OpenAI-compatible).

Conventions every backend follows (so results are comparable across backends and with the trainer):

- Chat messages are rendered to prompt ids by the engine itself with the tokenizer's chat template
  (:func:`chat_prompt_ids`); the ids are sent to the model and returned unchanged.
- ``logprobs[i]`` is the log-probability of ``response_ids[i]`` under the model's *raw* distribution: log-softmax of
  the unprocessed logits (temperature 1, no top-k/top-p), whatever sampling settings drew the token.
- Sample ``i`` of a request seeded with ``s`` draws with seed :func:`sample_seed(s, i) <sample_seed>`; an unseeded
  request takes the next seed of the engine's own counter, so a run is reproducible.
- A stop string ends a sample: ``response_ids`` keep the token that completed it, ``text`` stops before it and the
  finish reason is ``stop``. An end-of-sequence token is kept in ``response_ids`` and left out of ``text``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import hashlib
import importlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from memrl.data.registry import ComponentError, Registration, Registry, check_protocol, is_entry
from memrl.data.schemas import MemoryCall, Message

__all__ = [
    "BUILTIN_ENGINES",
    "ENGINES",
    "Completion",
    "Engine",
    "EngineError",
    "EngineFront",
    "EngineProbe",
    "GenerationRequest",
    "GenerationResult",
    "SamplingParams",
    "Usage",
    "chat_prompt_ids",
    "engine_registration",
    "find_stop",
    "register_engine",
    "release_freed_memory",
    "request_prompt_ids",
    "sample_seed",
    "set_torch_threads",
    "to_memory_call",
    "torch_threads",
    "unknown_backend",
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
    ignore_eos: bool = False

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
    """Token accounting of one request (all samples). ``cached_prompt_tokens`` were served from a prefix cache.

    Each sample is its own prefill, so ``prompt_tokens`` is the prompt length times ``n`` and ``cached_prompt_tokens``
    the sum over samples (later samples of a request usually hit the blocks the first one cached).
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    cost_usd: float = 0.0


@dataclass
class EngineProbe:
    """An engine's greedy answer to the weight-sync probe (:meth:`Engine.probe_logprobs`): per prompt, the response
    ids and their log-probs (empty where the engine has no distribution, e.g. a scripted agent), the policy version
    it serves and which engine it is (a fleet names the worker)."""

    engine: str
    version: int
    response_ids: list[list[int]]
    logprobs: list[list[float]]


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
    seed: int = 0
    concurrent_requests: bool = False
    """True when requests are served independently and concurrently (an HTTP endpoint with continuous batching):
    the asynchronous tree scheduler then sends each request the moment it is ready instead of batching what waits."""
    answers_inline: bool = False
    """True when the engine answers in this process at next to no cost (a scripted agent): the asynchronous tree
    scheduler then answers its calls at once instead of in a thread, so the branches it answers join the memory
    model's next batch."""
    greedy_is_deterministic: bool = False
    """True when a greedy request (temperature 0) is a function of the prompt, the sampling limits and the served
    weights, up to floating-point effects of the rows computed beside it (the transformers engine): the tree
    scheduler then computes equal greedy requests once per build."""

    @contextlib.contextmanager
    def lockstep(self) -> Iterator[None]:
        """While active, an engine that decodes continuously (rows joining a running batch) holds its next decode step
        after each :meth:`agenerate` call it completes, until the caller :meth:`settle` s it: the caller first sends
        every call that follows from the answer, so which rows decode together is a function of the calls, not of
        thread timing (continuous batching stays reproducible). It holds from the start too, until the caller settles
        once after sending its first calls. Others ignore it."""
        yield

    def settle(self) -> None:  # noqa: B027 - optional hook, only continuously decoding engines hold steps
        """The caller has sent every call that follows from one completed :meth:`agenerate` call (see
        :meth:`lockstep`)."""

    @abc.abstractmethod
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Generate for every request (one batched call); results are in request order."""

    async def agenerate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """:meth:`generate` for callers inside an event loop; by default the blocking call runs in a thread, so the
        loop (and the other engines) go on meanwhile."""
        return await asyncio.to_thread(self.generate, requests)

    def generate_each(self, requests: list[GenerationRequest]) -> list[GenerationResult | Exception]:
        """Like :meth:`generate`, but a request that fails yields its exception in its place instead of failing the
        batch. Engines whose requests are independent (HTTP endpoints) override this so each request fails alone;
        the default makes one batched call and, only if that raises, asks again one request at a time."""
        try:
            return list(self.generate(requests))
        except Exception:
            if len(requests) == 1:
                raise
        out: list[GenerationResult | Exception] = []
        for request in requests:
            try:
                out.append(self.generate([request])[0])
            except Exception as exc:  # recorded per request by the caller
                out.append(exc)
        return out

    def _result(self, prompt_ids: list[int], completions: list[Completion], usage: Usage) -> GenerationResult:
        """One request's result, stamped with this engine's name and the policy version it serves."""
        return GenerationResult(
            prompt_ids=prompt_ids,
            completions=completions,
            usage=usage,
            engine=self.name,
            policy_version=self.policy_version,
        )

    def request_seed(self, sampling: SamplingParams) -> int:
        """The request's seed, or for an unseeded request the next seed of this engine's counter."""
        if sampling.seed is not None:
            return sampling.seed
        counter = self.__dict__.setdefault("_unseeded_counter", itertools.count())
        return sample_seed(self.seed, -1 - next(counter))

    def load_adapter(self, path: str, version: int) -> None:
        """Serve the LoRA adapter in directory ``path`` as policy ``version`` (backends with adapters only)."""
        raise EngineError(f"{self.name}: this backend cannot load adapters")

    def use_base(self, version: int = 0) -> None:
        """Serve the base weights again (after :meth:`load_adapter`)."""
        raise EngineError(f"{self.name}: this backend cannot load adapters")

    def update_weights(self, weights: Any, version: int) -> None:
        """Replace the full weights (a state dict or a directory of safetensors) and serve them as ``version``."""
        raise EngineError(f"{self.name}: this backend cannot update weights")

    def probe_logprobs(self, prompts: list[list[int]], max_tokens: int) -> list[EngineProbe]:
        """Greedy ``max_tokens`` tokens (end-of-sequence ignored) for each prompt, with their log-probs: what the
        weight-sync check compares with the trainer's log-probs of the same tokens (memrl.train.weight_sync). One
        answer; a fleet returns one per worker."""
        sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=0, ignore_eos=True)
        results = self.generate([GenerationRequest(prompt_ids=list(p), sampling=sampling) for p in prompts])
        return [
            EngineProbe(
                self.name,
                self.policy_version,
                [list(r.completions[0].response_ids) for r in results],
                [list(r.completions[0].logprobs) for r in results],
            )
        ]

    def sleep(self) -> None:  # noqa: B027 - optional hook, only engines that hold GPU memory sleep
        """Free accelerator memory between rollouts (the trainer updates meanwhile); the next use wakes the engine."""

    def close(self) -> None:  # noqa: B027 - optional hook, most engines hold nothing
        """Free the processes, sockets and memory the engine holds."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EngineFront(Engine):
    """An engine in front of others (a router, a recorder, a simulated latency): the one rule by which it passes on
    what the engines behind it are. It has a capability (``concurrent_requests``, ``answers_inline``,
    ``greedy_is_deterministic``) only when every engine behind it has it, serves the newest policy version among
    them, and passes :meth:`lockstep`, :meth:`settle` and :meth:`close` on to each. A subclass overrides a
    capability only where it changes it (a simulated latency does not answer inline)."""

    def __init__(self, engines: list[Engine], name: str) -> None:
        if not engines:
            raise ValueError(f"{type(self).__name__} needs at least one engine behind it")
        self.engines = engines
        self.name = name

    @property
    def concurrent_requests(self) -> bool:  # type: ignore[override]
        """Every engine behind serves requests independently."""
        return all(engine.concurrent_requests for engine in self.engines)

    @property
    def answers_inline(self) -> bool:  # type: ignore[override]
        """Every engine behind answers in this process at next to no cost."""
        return all(engine.answers_inline for engine in self.engines)

    @property
    def greedy_is_deterministic(self) -> bool:  # type: ignore[override]
        """Every engine behind computes a greedy request as a function of the request and its weights."""
        return all(engine.greedy_is_deterministic for engine in self.engines)

    @property
    def policy_version(self) -> int:  # type: ignore[override]
        """The newest policy version served behind it."""
        return max(engine.policy_version for engine in self.engines)

    @contextlib.contextmanager
    def lockstep(self) -> Iterator[None]:
        """Every engine behind in lockstep (:meth:`Engine.lockstep`)."""
        with contextlib.ExitStack() as stack:
            for engine in self.engines:
                stack.enter_context(engine.lockstep())
            yield

    def settle(self) -> None:
        """Settle every engine behind."""
        for engine in self.engines:
            engine.settle()

    def close(self) -> None:
        """Close every engine behind."""
        for engine in self.engines:
            engine.close()


def sample_seed(seed: int, index: int) -> int:
    """The seed of sample ``index`` of a request seeded with ``seed``.

    A hash rather than ``seed + index``, so neighbouring request seeds never share samples. Fits in 63 bits.
    """
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def chat_prompt_ids(
    tokenizer: Any, messages: list[Message], chat_template_kwargs: dict[str, Any] | None = None
) -> list[int]:
    """Render ``messages`` with the tokenizer's chat template plus the generation prompt, as token ids."""
    ids = tokenizer.apply_chat_template(
        [m.model_dump() for m in messages],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        **(chat_template_kwargs or {}),
    )
    return [int(i) for i in ids]


def _check_engine(obj: Any) -> None:
    check_protocol(obj, "engine", methods=("from_config", "generate"))
    if not (isinstance(obj, type) and issubclass(obj, Engine)):
        raise ComponentError(f"engine {getattr(obj, '__module__', '?')}:{obj.__qualname__} must subclass Engine")


ENGINES: Registry[Any] = Registry("engine backend", _check_engine)
"""Engine backends by name (``EngineConfig.backend``): a registered :class:`Engine` subclass with a
``from_config(cfg)`` classmethod (``from_config(cfg, policy)`` where a scripted policy object can be passed in)."""

BUILTIN_ENGINES = {
    "vllm": "memrl.rollout.engines.vllm_engine",
    "hf": "memrl.rollout.engines.hf_engine",
    "openai": "memrl.rollout.engines.openai_engine",
    "scripted": "memrl.rollout.engines.scripted",
}
"""The built-in backends and the modules that register them: a module is imported when its backend is first built,
so a run imports only the heavy dependencies (vLLM, transformers, httpx) of the engines it uses."""


def register_engine(name: str) -> Any:
    """Class decorator: an :class:`Engine` subclass selectable by ``engine: {backend: NAME}``."""
    return ENGINES.decorator(name)


def unknown_backend(backend: str) -> str | None:
    """Why ``backend`` names no engine (None when it is a built-in, a registered name or an import path)."""
    if is_entry(backend) or backend in BUILTIN_ENGINES or backend in ENGINES:
        return None
    known = sorted({*BUILTIN_ENGINES, *ENGINES.names()})
    return (
        f"unknown engine backend {backend!r}; registered: {', '.join(known)} "
        f"(or your own Engine subclass by import path, 'package.module:Class')"
    )


def engine_registration(backend: str) -> Registration[Any]:
    """The registration of ``backend``: a built-in name (its module imported first), a registered name, or an import
    path ``package.module:Class``; a :class:`~memrl.data.registry.ComponentError` saying what is wrong otherwise."""
    if error := unknown_backend(backend):
        raise ComponentError(error)
    if backend in BUILTIN_ENGINES and backend not in ENGINES:
        importlib.import_module(BUILTIN_ENGINES[backend])
    reg = ENGINES.get(backend)
    if not reg.name:  # an unregistered class named by import path
        _check_engine(reg.obj)
    return reg


def request_prompt_ids(
    requests: list[GenerationRequest],
    tokenizer: Any,
    chat_template_kwargs: dict[str, Any] | None,
    max_model_len: int,
    engine: str,
) -> list[list[int]]:
    """Each request's prompt token ids: its own ``prompt_ids``, else its messages rendered with the chat template. An
    :class:`EngineError` naming ``engine`` and the request when a prompt is empty or leaves no room to generate."""
    prompts: list[list[int]] = []
    for r, req in enumerate(requests):
        ids = (
            list(req.prompt_ids)
            if req.prompt_ids is not None
            else chat_prompt_ids(tokenizer, req.messages or [], chat_template_kwargs)
        )
        if not ids:
            raise EngineError(f"{engine}: request {r} has an empty prompt")
        if len(ids) >= max_model_len:
            raise EngineError(f"{engine}: request {r} has {len(ids)} prompt tokens, max_model_len is {max_model_len}")
        prompts.append(ids)
    return prompts


def set_torch_threads(n: int) -> None:
    """Set torch's intra-op CPU threads for the whole process.

    Calls the builtin directly because vLLM's CPU worker replaces ``torch.set_num_threads`` with a no-op.
    """
    import torch

    torch._C.set_num_threads(n)


def release_freed_memory() -> None:
    """Collect garbage and hand the pages the C heap keeps after frees back to the OS (glibc's ``malloc_trim``; the
    collection alone elsewhere), and empty the CUDA cache. After a large CPU training stage the allocator otherwise
    keeps the peak's pages: an SFT stage of SmolLM2-135M left its process at 19 GiB, and as two processes then built
    their RL engines a 24 GiB machine had 0.4 GiB free."""
    import ctypes
    import gc
    import sys

    import torch

    gc.collect()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # not glibc: musl has no malloc_trim
            ctypes.CDLL("libc.so.6").malloc_trim(0)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch CPU threads (None: leave them alone), then restore the caller's count.

    CPU engines generate with one thread by default: on a shared 2-core machine two threads were 4x (vLLM) to 12x
    (transformers, tiny model) slower, because OpenMP workers spin while the other core is busy.
    """
    if n is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    set_torch_threads(n)
    try:
        yield
    finally:
        set_torch_threads(before)


def find_stop(text: str, stops: list[str]) -> int | None:
    """Index in ``text`` where the earliest of ``stops`` begins, or None."""
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else None


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
    # A chat-API endpoint returns text without token ids: count its tokens from the server's usage instead of as 0.
    n = max(1, len(result.completions))
    prompt_tokens = len(result.prompt_ids) or result.usage.prompt_tokens // n
    completion_tokens = len(completion.response_ids) or result.usage.completion_tokens // n
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
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        error=error,
        metadata=dict(metadata or {}),
    )
