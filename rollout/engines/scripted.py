"""The scripted backend: a programmatic agent (:class:`memrl.data.schemas.ScriptedPolicy`) behind the engine interface.

Sample ``i`` of a request calls ``policy.respond(messages, rng, metadata)`` with ``rng = random.Random(seed_i)``,
``seed_i = sample_seed(request seed, i)`` (an unseeded request takes the engine's next counter seed), so a run is
reproducible. With a tokenizer the engine reports token-in/token-out results like a model engine would: prompt ids from
the chat template, response ids = the tokenised reply plus end-of-sequence, and usage whose cached prompt tokens come
from a simulated vLLM prefix cache (:class:`~memrl.rollout.engines.prefix_cache.PrefixCacheSimulator`). Log-probs are
empty: a scripted agent has no distribution. Without a tokenizer only the text is returned and usage stays zero.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

from memrl.data.schemas import ScriptedPolicy
from memrl.rollout.engines.base import (
    Completion,
    Engine,
    EngineError,
    EngineFront,
    EngineProbe,
    GenerationRequest,
    GenerationResult,
    Usage,
    chat_prompt_ids,
    find_stop,
    register_engine,
    sample_seed,
)
from memrl.rollout.engines.config import EngineConfig, load_scripted_policy
from memrl.rollout.engines.prefix_cache import PrefixCacheSimulator

__all__ = ["DelayedEngine", "DelayedPolicy", "ScriptedEngine"]


@register_engine("scripted")
class ScriptedEngine(Engine):
    """Answer requests with a :class:`ScriptedPolicy`; optional tokenizer for token ids and cache accounting."""

    def __init__(
        self,
        policy: ScriptedPolicy,
        *,
        tokenizer: Any = None,
        seed: int = 0,
        name: str | None = None,
        block_size: int = 16,
        cache_tokens: int = 1 << 22,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.policy = policy
        self.answers_inline = getattr(policy, "answers_inline", True)  # False on a policy that takes its time
        self.tokenizer = tokenizer
        self.seed = seed
        self.name = name or f"scripted:{getattr(policy, 'name', type(policy).__name__)}"
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.cache = PrefixCacheSimulator(block_size, cache_tokens)

    @classmethod
    def from_config(cls, cfg: EngineConfig, policy: ScriptedPolicy | None = None) -> ScriptedEngine:
        """Build from an :class:`EngineConfig` (``tokenizer`` or ``model`` names the tokenizer, if any); ``policy``
        (default: the one ``scripted_policy`` names, with ``scripted_kwargs``) is the agent."""
        if policy is None:
            if not cfg.scripted_policy:
                raise ValueError("backend 'scripted' needs 'scripted_policy' in the config or a policy argument")
            policy = load_scripted_policy(cfg.scripted_policy, cfg.scripted_kwargs)
        return cls(
            policy,
            tokenizer=cfg.load_tokenizer(),
            seed=cfg.seed,
            name=cfg.name,
            block_size=cfg.prefix_cache_block_size,
            cache_tokens=cfg.prefix_cache_tokens,
            chat_template_kwargs=cfg.chat_template_kwargs,
        )

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Call the policy once per sample; with a tokenizer, count tokens and simulated cache hits."""
        results: list[GenerationResult] = []
        finished: list[tuple[list[int], list[int]]] = []
        for req in requests:
            if req.messages is None:
                raise EngineError(f"{self.name}: a scripted agent answers chat messages, not raw prompt ids")
            sp = req.sampling
            seed = self.request_seed(sp)
            prompt_ids = (
                chat_prompt_ids(self.tokenizer, req.messages, self.chat_template_kwargs) if self.tokenizer else []
            )
            completions: list[Completion] = []
            usage = Usage()
            for i in range(sp.n):
                rng = random.Random(sample_seed(seed, i))
                text = self.policy.respond(list(req.messages), rng, dict(req.metadata))
                if not isinstance(text, str):
                    raise EngineError(f"{self.name}: respond() returned {type(text).__name__}, expected str")
                completion = self._complete(text, sp.stop, sp.max_tokens)
                completions.append(completion)
                if self.tokenizer is not None:
                    usage.prompt_tokens += len(prompt_ids)
                    usage.completion_tokens += len(completion.response_ids)
                    usage.cached_prompt_tokens += self.cache.lookup(prompt_ids)
                    finished.append((prompt_ids, completion.response_ids))
            results.append(self._result(prompt_ids, completions, usage))
        # Generated blocks become reusable only after the batch's prompts were scheduled, as in vLLM.
        for prompt_ids, response_ids in finished:
            self.cache.insert(prompt_ids, response_ids)
        return results

    def probe_logprobs(self, prompts: list[list[int]], max_tokens: int) -> list[EngineProbe]:
        """A scripted agent has no distribution: an answer without log-probs (the weight-sync check skips it)."""
        return [EngineProbe(self.name, self.policy_version, [[] for _ in prompts], [[] for _ in prompts])]

    def load_adapter(self, path: str, version: int) -> None:
        """A scripted agent has no weights: it only takes the version (so a fleet of scripted workers syncs)."""
        self.policy_version = version

    def update_weights(self, weights: Any, version: int) -> None:
        """A scripted agent has no weights: it only takes the version."""
        self.policy_version = version

    def _complete(self, text: str, stops: list[str], max_tokens: int) -> Completion:
        cut = find_stop(text, stops)
        finish = "stop"
        if self.tokenizer is None:
            text = text if cut is None else text[:cut]
            return Completion(response_ids=[], logprobs=[], text=text, finish_reason=finish)
        tok = self.tokenizer
        if cut is None:
            ids = [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
        else:
            # Keep the tokens up to the one that completes the stop string, like a model engine would.
            stop = next(s for s in stops if s and text.startswith(s, cut))
            ids = tok.encode(text[: cut + len(stop)], add_special_tokens=False)
            text = text[:cut]
        if len(ids) > max_tokens:
            ids = ids[:max_tokens]
            text = tok.decode(ids, skip_special_tokens=True)
            finish = "length"
        return Completion(response_ids=ids, logprobs=[], text=text, finish_reason=finish)


class DelayedPolicy:
    """A scripted policy that answers like ``policy`` after ``latency_s`` seconds per call: an engine of simulated
    latency (benchmarks/rollout_scaling.py, the fleet's fault tests). ``policy`` is an import path
    ``"package.module:Class"`` built with ``kwargs``."""

    answers_inline = False  # it sleeps: the tree scheduler sends it to a thread like a model engine

    def __init__(self, policy: str, latency_s: float, kwargs: dict[str, Any] | None = None) -> None:
        from memrl.rollout.engines.config import load_scripted_policy

        self.inner = load_scripted_policy(policy, kwargs)
        self.latency_s = latency_s
        self.name = f"delayed:{getattr(self.inner, 'name', policy)}"

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        """Sleep, then answer as the wrapped policy."""
        time.sleep(self.latency_s)
        return self.inner.respond(messages, rng, metadata)


class DelayedEngine(EngineFront):
    """``engine`` behind a simulated latency: every request is answered ``latency_s`` after the engine started on
    it, and the engine works on at most ``capacity`` requests at a time (None: any number, an engine with spare
    capacity such as vLLM with continuous batching below its limits; 1: a saturated engine whose requests queue).
    ``latency_s`` may be a function of the requests (a slow task, jitter). ``concurrent_requests`` says whether the
    tree scheduler sends requests one by one (an endpoint; each returns when done) or batches what waits (an in-process
    engine; a batch returns when its last request is done)."""

    answers_inline = False  # it sleeps: the tree scheduler answers it in a thread

    def __init__(
        self,
        engine: Engine,
        latency_s: float | Callable[[list[GenerationRequest]], float],
        *,
        capacity: int | None = None,
        concurrent_requests: bool = True,
    ) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be None or >= 1, got {capacity}")
        super().__init__([engine], engine.name)
        self.engine = engine
        self.latency_s = latency_s
        self.capacity = capacity
        self._concurrent_requests = concurrent_requests
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None  # a semaphore serves one loop

    @property
    def concurrent_requests(self) -> bool:  # type: ignore[override]
        """As set: the scheduler sends requests one by one (True) or batches what waits (False)."""
        return self._concurrent_requests

    def _seconds(self, requests: list[GenerationRequest]) -> float:
        latency = self.latency_s(requests) if callable(self.latency_s) else self.latency_s
        rounds = 1 if self.capacity is None else -(-len(requests) // self.capacity)
        return latency * rounds

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Wait the latency (one round per ``capacity`` requests), then answer."""
        time.sleep(self._seconds(requests))
        return self.engine.generate(requests)

    async def agenerate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """:meth:`generate` without holding the event loop; with a capacity, calls in flight queue for it."""
        if self.capacity is None:
            await asyncio.sleep(self._seconds(requests))
            return self.engine.generate(requests)
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(self.capacity))
        slots = self._slots[1]
        for start in range(0, len(requests), self.capacity):
            async with slots:
                await asyncio.sleep(self._seconds(requests[start : start + self.capacity]))
        return self.engine.generate(requests)
