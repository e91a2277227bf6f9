"""The ``openai`` backend: OpenAI-compatible HTTP endpoints (``vllm serve`` processes, gateways to frontier models).

Two APIs:

- ``completions`` (the default when a tokenizer is configured): token-in/token-out against a vLLM server. Messages are
  rendered to prompt ids here with the chat template and sent as ``prompt: [ids]`` with ``return_token_ids`` and
  ``logprobs: 0``; the server returns the sampled ids and their log-probs under its ``logprobs_mode`` (vLLM's default
  ``raw_logprobs``: log-softmax of the unprocessed logits, temperature 1, no top-k/top-p), the same definition as every
  memrl backend. A server that returns no token ids yields text only.
- ``chat`` (the default without a tokenizer): ``/chat/completions`` with the messages, for frontier gateways. Results
  carry text, finish reason and the server's usage; no token ids or log-probs.

Each sample is one HTTP request (seed ``sample_seed(request seed, i)``), so samples spread over endpoints and retry
independently. Requests run on a private asyncio loop (one background thread per engine, so :meth:`generate` works
from synchronous and asynchronous callers alike) with, per endpoint, bounded concurrency and request/token rate
limits (token buckets that refill continuously and hold one second of budget, so a rolling per-minute window is never
exceeded). A sample goes to the endpoint with the most free capacity, and a retry prefers another endpoint.
429, 408, 5xx, timeouts, dropped connections and unparseable answers (not JSON, an HTML page with 200, a body without
``choices``, an answer larger than :data:`MAX_BODY_BYTES` once decompressed: a gzip bomb) are retried with exponential
backoff and jitter, honouring ``Retry-After`` up to ``backoff_max_s`` (a server asking for an hour waits that long at
most); other 4xx fail at once. Redirects (301/302/303/307/308) are followed, the POST kept, at most
:data:`MAX_REDIRECTS` of them (a loop fails at once); the API key is not sent to another host. Every attempt has a
timeout over the whole exchange (a drip-fed body included) and the whole call a deadline, so a call never hangs.
Usage counts that are not finite non-negative numbers (``NaN``) are ignored, the answer kept. A request that fails
after its retries raises one :class:`EndpointError` naming the endpoint, its last status and what to check; callers
that can go on without one answer use :meth:`OpenAIEngine.generate_each`, where it costs that request only. API keys
are read from the environment variables the endpoints name, sent only as a bearer header, and never logged, stored in
results or written anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import math
import os
import random
import threading
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from memrl.data.errors import RunFault
from memrl.rollout.engines.base import (
    Completion,
    Engine,
    EngineError,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    Usage,
    chat_prompt_ids,
    register_engine,
    sample_seed,
)
from memrl.rollout.engines.config import EndpointConfig, EngineConfig

__all__ = ["EndpointError", "EndpointStats", "OpenAIEngine", "TokenBucket"]

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529})
REDIRECT_STATUS = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 5  # redirects followed per attempt
MAX_BODY_BYTES = 64 << 20  # an answer larger than this once decompressed is refused (a gzip bomb)
MAX_CHARS_PER_TOKEN = 64  # an answer's text is cut at max_tokens times this before anything tokenises it


class EndpointError(EngineError, RunFault):
    """An OpenAI-compatible endpoint that kept failing after its retries (or answered with a status that retrying
    cannot fix): the message names the engine, the endpoint and the last thing that went wrong. A command that
    cannot go on without the answer stops with it as one line (exit 2); one that can counts the request as failed."""


_CHECK = (
    "check that the server is up and answers the OpenAI API at that URL (or raise the engine's max_retries, "
    "request_timeout_s or deadline_s)"
)


class TokenBucket:
    """A continuously refilling budget of ``per_minute`` units a minute holding at most one second's worth.

    A request larger than the capacity is admitted when the bucket is full and drives it negative, so later requests
    wait for the debt. ``clock`` and ``sleep`` are injectable for tests.
    """

    def __init__(
        self,
        per_minute: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.rate = per_minute / 60.0
        self.capacity = max(1.0, self.rate)
        self.level = self.capacity
        self._clock, self._sleep = clock, sleep
        self._stamp = clock()

    def _refill(self) -> None:
        now = self._clock()
        self.level = min(self.capacity, self.level + (now - self._stamp) * self.rate)
        self._stamp = now

    async def take(self, amount: float, deadline: float) -> None:
        """Wait until ``amount`` fits (or the bucket is full), then spend it; raise TimeoutError past ``deadline``."""
        need = min(amount, self.capacity)
        while True:
            self._refill()
            if self.level >= need:
                self.level -= amount
                return
            wait = (need - self.level) / self.rate
            if self._clock() + wait > deadline:
                raise TimeoutError("rate limit wait would pass the deadline")
            await self._sleep(wait)

    def adjust(self, amount: float) -> None:
        """Charge (positive) or refund (negative) units after the real cost is known."""
        self._refill()
        self.level = min(self.capacity, self.level - amount)


@dataclass
class EndpointStats(Usage):
    """What one endpoint did: the tokens and cost of what it answered (:class:`Usage`), the requests answered and
    the attempts that failed."""

    requests: int = 0
    failed_attempts: int = 0


@dataclass
class _Endpoint:
    cfg: EndpointConfig
    model: str
    headers: dict[str, str] = field(repr=False)
    semaphore: asyncio.Semaphore
    requests: TokenBucket | None
    tokens: TokenBucket | None
    assigned: int = 0
    stats: EndpointStats = field(default_factory=EndpointStats)
    warned_usage: bool = False
    warned_length: bool = False

    @property
    def label(self) -> str:
        return f"{self.cfg.url} ({self.model})"

    def cost(self, prompt: int, cached: int, completion: int) -> float:
        cached_price = self.cfg.cached_input_usd_per_mtok
        if cached_price is None:
            cached_price = self.cfg.input_usd_per_mtok
        dollars = (prompt - cached) * self.cfg.input_usd_per_mtok + cached * cached_price
        return (dollars + completion * self.cfg.output_usd_per_mtok) / 1e6


class _Retry(Exception):
    """One failed attempt that may be retried: ``status`` says what happened, ``wait`` is the server's Retry-After."""

    def __init__(self, status: str, wait: float = 0.0) -> None:
        super().__init__(status)
        self.status, self.wait = status, wait


@dataclass
class _Sample:
    completion: Completion
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost: float


@register_engine("openai")
class OpenAIEngine(Engine):
    """Any OpenAI-compatible endpoints behind the engine interface (see the module docstring)."""

    concurrent_requests = True

    def __init__(
        self,
        endpoints: list[EndpointConfig],
        *,
        model: str | None = None,
        tokenizer: Any = None,
        api: str = "auto",
        name: str = "openai",
        seed: int = 0,
        request_timeout_s: float = 120.0,
        deadline_s: float = 1800.0,
        max_retries: int = 6,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not endpoints:
            raise EngineError(f"{name}: no endpoints configured")
        if api == "completions" and tokenizer is None:
            raise EngineError(f"{name}: the completions API sends token ids and needs a tokenizer")
        self.name = name
        self.seed = seed
        self.tokenizer = tokenizer
        self.api = api if api != "auto" else ("completions" if tokenizer is not None else "chat")
        self.request_timeout_s = request_timeout_s
        self.deadline_s = deadline_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._rng = random.Random(seed)
        headers = [self._headers(ep) for ep in endpoints]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"memrl-{name}", daemon=True)
        self._thread.start()
        self._closed = False

        async def setup() -> tuple[httpx.AsyncClient, list[_Endpoint]]:
            eps = []
            for ep, hdr in zip(endpoints, headers, strict=True):
                ep_model = ep.model or model
                if not ep_model:
                    raise EngineError(f"{name}: endpoint {ep.url} has no model (set endpoints[].model or model)")
                eps.append(
                    _Endpoint(
                        cfg=ep,
                        model=ep_model,
                        headers=hdr,
                        semaphore=asyncio.Semaphore(ep.max_concurrency),
                        requests=TokenBucket(ep.requests_per_minute) if ep.requests_per_minute else None,
                        tokens=TokenBucket(ep.tokens_per_minute) if ep.tokens_per_minute else None,
                    )
                )
            connections = sum(ep.max_concurrency for ep in endpoints)
            client = httpx.AsyncClient(
                timeout=httpx.Timeout(request_timeout_s),
                limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
                follow_redirects=False,  # followed in _exchange, the POST and its body kept
            )
            return client, eps

        try:
            self._client, self._endpoints = self._run(setup(), timeout=30.0)
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_config(cls, cfg: EngineConfig) -> OpenAIEngine:
        """Build from an :class:`EngineConfig`; ``tokenizer`` enables token-in/token-out completions."""
        tokenizer = None
        if cfg.tokenizer:
            from memrl.rollout.models import load_tokenizer

            tokenizer = load_tokenizer(cfg.tokenizer, trust_remote_code=cfg.trust_remote_code, revision=cfg.revision)
        return cls(
            list(cfg.endpoints),
            model=cfg.model,
            tokenizer=tokenizer,
            api=cfg.api,
            **cfg.engine_settings(),
            **cfg.retry_settings(),
        )

    def _headers(self, ep: EndpointConfig) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if ep.api_key_env:
            key = os.environ.get(ep.api_key_env)
            if not key:
                raise EngineError(f"{self.name}: environment variable {ep.api_key_env} (key for {ep.url}) is not set")
            headers["Authorization"] = f"Bearer {key}"
        return headers

    # ------------------------------------------------------------------------------------------------------------
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Run every sample of every request concurrently; blocks until done (at most ``deadline_s``)."""
        return self._run(self._generate(requests), timeout=self.deadline_s + 30.0)

    def generate_each(self, requests: list[GenerationRequest]) -> list[GenerationResult | Exception]:
        """:meth:`generate` where a request that runs out of retries (or fails for good) yields its
        :class:`EngineError` in its place and every other request still gets its answer."""
        return self._run(self._generate(requests, per_request=True), timeout=self.deadline_s + 30.0)

    async def agenerate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """:meth:`generate` for callers already inside an event loop."""
        if self._closed:
            raise EngineError(f"{self.name}: the engine is closed")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._generate(requests), self._loop))

    def stats(self) -> dict[str, EndpointStats]:
        """Per-endpoint request, failure, token and cost counters (keyed by URL and model)."""
        return {ep.label: ep.stats for ep in self._endpoints}

    def close(self) -> None:
        """Close connections and stop the background loop; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        client = getattr(self, "_client", None)
        if client is not None and self._loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(client.aclose(), self._loop).result(timeout=10.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10.0)
        if not self._thread.is_alive():
            self._loop.close()

    def _run(self, coro: Any, timeout: float) -> Any:
        if self._closed:
            coro.close()
            raise EngineError(f"{self.name}: the engine is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout=timeout)
        except TimeoutError:
            future.cancel()
            raise EngineError(f"{self.name}: no answer within {timeout:.0f} s") from None

    # ------------------------------------------------------------------------------------------------------------
    async def _generate(
        self, requests: list[GenerationRequest], per_request: bool = False
    ) -> list[GenerationResult | Exception]:
        deadline = time.monotonic() + self.deadline_s
        prompts: list[list[int]] = []
        for r, req in enumerate(requests):
            if self.api == "chat":
                if req.messages is None:
                    raise EngineError(f"{self.name}: request {r} has prompt ids, but the chat API needs messages")
                prompts.append([])
            elif req.prompt_ids is not None:
                prompts.append(list(req.prompt_ids))
            else:
                prompts.append(chat_prompt_ids(self.tokenizer, req.messages or [], self.chat_template_kwargs))
        tasks: list[list[asyncio.Task[_Sample]]] = []
        for req, prompt_ids in zip(requests, prompts, strict=True):
            seed = self.request_seed(req.sampling)
            tasks.append(
                [
                    asyncio.ensure_future(self._sample(req, prompt_ids, sample_seed(seed, i), deadline))
                    for i in range(req.sampling.n)
                ]
            )
        flat = [t for samples in tasks for t in samples]
        try:
            outcomes = await asyncio.gather(*flat, return_exceptions=per_request)
        except BaseException:
            for task in flat:
                task.cancel()
            await asyncio.gather(*flat, return_exceptions=True)
            raise
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome  # cancellation / interrupt: never a per-request failure
        results: list[GenerationResult | Exception] = []
        for prompt_ids, request_tasks in zip(prompts, tasks, strict=True):
            failed = [t.exception() for t in request_tasks if t.exception() is not None]
            if failed:  # only reached with per_request: otherwise gather raised the first failure
                results.append(failed[0])
                continue
            samples = [t.result() for t in request_tasks]
            usage = Usage(
                prompt_tokens=sum(s.prompt_tokens for s in samples),
                completion_tokens=sum(s.completion_tokens for s in samples),
                cached_prompt_tokens=sum(s.cached_tokens for s in samples),
                cost_usd=sum(s.cost for s in samples),
            )
            results.append(self._result(prompt_ids, [s.completion for s in samples], usage))
        return results

    def _choose(self, avoid: _Endpoint | None) -> _Endpoint:
        candidates = [ep for ep in self._endpoints if ep is not avoid] or self._endpoints
        load = {id(ep): ep.assigned / ep.cfg.max_concurrency for ep in candidates}
        best = min(load.values())
        return self._rng.choice([ep for ep in candidates if load[id(ep)] == best])

    async def _sample(self, req: GenerationRequest, prompt_ids: list[int], seed: int, deadline: float) -> _Sample:
        sp = req.sampling
        payload = self._payload(req, prompt_ids, seed)
        estimate = (len(prompt_ids) or sum(len(m.content) for m in req.messages or []) // 4) + sp.max_tokens
        tried: list[str] = []
        endpoint: _Endpoint | None = None
        last = "no attempt made"
        for attempt in range(self.max_retries + 1):
            endpoint = self._choose(avoid=endpoint)
            if endpoint.label not in tried:
                tried.append(endpoint.label)
            endpoint.assigned += 1  # counted from the choice on, so a burst of samples spreads evenly
            try:
                body = await self._attempt(endpoint, payload, estimate, deadline)
                return self._parse(endpoint, body, prompt_ids, sp, estimate)
            except _Retry as failure:
                endpoint.stats.failed_attempts += 1
                last = failure.status
                wait = failure.wait
            except EngineError:
                endpoint.stats.failed_attempts += 1
                raise
            finally:
                endpoint.assigned -= 1
            if attempt == self.max_retries:
                break
            cap = min(self.backoff_max_s, self.backoff_base_s * 2**attempt)
            delay = min(self.backoff_max_s, max(wait, cap / 2 + self._rng.uniform(0, cap / 2)))
            if wait > self.backoff_max_s:
                last += f" (Retry-After {wait:.0f} s, waited backoff_max_s {self.backoff_max_s:g} s)"
            if time.monotonic() + delay >= deadline:
                last += f"; the {self.deadline_s:.0f} s deadline left no time to retry"
                break
            log.warning("%s: %s failed (%s); retry %d in %.2f s", self.name, endpoint.label, last, attempt + 1, delay)
            await asyncio.sleep(delay)
        assert endpoint is not None
        raise EndpointError(
            f"{self.name}: request failed after {attempt + 1} attempt(s); last endpoint {endpoint.label} -> {last}"
            + (f" (endpoints tried: {', '.join(tried)})" if len(tried) > 1 else "")
            + f"; {_CHECK}"
        )

    async def _attempt(self, ep: _Endpoint, payload: dict[str, Any], estimate: int, deadline: float) -> dict[str, Any]:
        """One HTTP exchange: wait for a slot and the rate limits (until the deadline), then post with a timeout."""
        url = ep.cfg.url.rstrip("/") + ("/chat/completions" if self.api == "chat" else "/completions")
        try:
            await asyncio.wait_for(ep.semaphore.acquire(), max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise _Retry("no free request slot before the deadline") from None
        try:
            try:
                if ep.requests is not None:
                    await ep.requests.take(1, deadline)
                if ep.tokens is not None:
                    await ep.tokens.take(estimate, deadline)
            except TimeoutError:
                raise _Retry("rate limit would hold the request past the deadline") from None
            timeout = min(self.request_timeout_s, deadline - time.monotonic())
            try:
                # An outer bound on the whole exchange: per-read timeouts never fire on a server that drip-feeds bytes.
                status, headers, body = await asyncio.wait_for(
                    self._exchange(ep, url, {**payload, "model": ep.model}), max(0.0, timeout)
                )
            except asyncio.TimeoutError:
                raise _Retry(f"timeout after {max(0.0, timeout):.1f} s") from None
            except httpx.TimeoutException as exc:
                raise _Retry(f"timeout ({type(exc).__name__})") from None
            except httpx.TransportError as exc:
                raise _Retry(f"connection error ({type(exc).__name__})") from None
            except httpx.DecodingError as exc:
                raise _Retry(f"an answer that does not decode ({exc})") from None
        finally:
            ep.semaphore.release()
        if status == 200:
            try:
                return json.loads(body)
            except (ValueError, UnicodeDecodeError):
                kind = headers.get("content-type", "no content type")
                snippet = body[:120].decode("utf-8", "replace").replace("\n", " ")
                raise _Retry(f"HTTP 200 with a body that is not JSON ({kind}: {snippet!r})") from None
        snippet = body[:300].decode("utf-8", "replace").replace("\n", " ")
        if status in RETRYABLE_STATUS:
            raise _Retry(f"HTTP {status}: {snippet}", _retry_after(headers.get("retry-after")))
        check = (
            f"check the API key{f' in ${ep.cfg.api_key_env}' if ep.cfg.api_key_env else ''} and the model name"
            if status in (401, 403)
            else _CHECK
        )
        raise EndpointError(f"{self.name}: {ep.label} -> HTTP {status} (not retryable): {snippet}; {check}")

    async def _exchange(self, ep: _Endpoint, url: str, payload: dict[str, Any]) -> tuple[int, httpx.Headers, bytes]:
        """POST ``payload`` to ``url``, following redirects with the POST kept (at most :data:`MAX_REDIRECTS`; the
        API key stays with its own host), and read the answer up to :data:`MAX_BODY_BYTES` once decompressed."""
        headers = {**ep.headers, "Accept-Encoding": "gzip, deflate"}  # encodings decoded in bounded steps here
        seen = [url]
        origin = urlsplit(url)[:2]
        while True:
            request = self._client.build_request("POST", url, json=payload, headers=headers)
            response = await self._client.send(request, stream=True)
            try:
                if response.status_code in REDIRECT_STATUS and "location" in response.headers:
                    target = str(response.url.join(response.headers["location"]))
                    if target in seen or len(seen) > MAX_REDIRECTS:
                        hops = [*seen, target]
                        chain = " -> ".join(hops if len(hops) <= 3 else [hops[0], "...", hops[-1]])
                        what = "a redirect loop" if target in seen else f"more than {MAX_REDIRECTS} redirects"
                        raise EndpointError(
                            f"{self.name}: {ep.label} -> {what} ({chain}); set the endpoint's url to "
                            "the address that answers"
                        )
                    if urlsplit(target)[:2] != origin:
                        headers.pop("Authorization", None)  # the key is for the configured host only
                    if len(seen) == 1:
                        log.warning(
                            "%s: %s redirects (HTTP %d) to %s; set the endpoint's url to it to save a round trip",
                            self.name,
                            ep.label,
                            response.status_code,
                            target,
                        )
                    seen.append(target)
                    url = target
                    continue
                return response.status_code, response.headers, await _bounded_body(response)
            finally:
                await response.aclose()

    def _payload(self, req: GenerationRequest, prompt_ids: list[int], seed: int) -> dict[str, Any]:
        sp = req.sampling
        payload: dict[str, Any] = {
            "max_tokens": sp.max_tokens,
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "seed": seed,
            "n": 1,
        }
        if sp.stop:
            payload["stop"] = list(sp.stop)
        if self.api == "chat":
            payload["messages"] = [m.model_dump() for m in req.messages or []]
            return payload
        # vLLM extensions of the completions API: token ids in and out, raw log-probs of the sampled tokens.
        payload.update(prompt=prompt_ids, return_token_ids=True, skip_special_tokens=True)
        if sp.logprobs:
            payload["logprobs"] = 0
        if sp.top_k > 0:
            payload["top_k"] = sp.top_k
        if sp.ignore_eos:
            payload["ignore_eos"] = True
        return payload

    def _count(self, ep: _Endpoint, value: Any, fallback: int) -> int:
        """A usage count, or ``fallback`` when the server sent something that is not a finite non-negative number
        (``NaN``, a string): the answer is kept, its usage estimated (warned once per endpoint)."""
        if value is None:
            return fallback
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
            return int(value)
        if not ep.warned_usage:
            ep.warned_usage = True
            log.warning(
                "%s: %s reports usage %r, not a token count: usage of its answers is estimated from their token ids",
                self.name,
                ep.label,
                value,
            )
        return fallback

    def _bounded(
        self, ep: _Endpoint, max_tokens: int, text: str, ids: list[int], logprobs: list[float], finish: str
    ) -> tuple[str, list[int], list[float], str]:
        """An answer longer than the ``max_tokens`` asked for (more token ids, or more than
        :data:`MAX_CHARS_PER_TOKEN` characters a token), cut there before anything tokenises it (finish_reason
        ``length``), with one warning per endpoint: a server that ignores ``max_tokens`` would otherwise stall the
        reasoner's context on megabytes of text."""
        limit = max_tokens * MAX_CHARS_PER_TOKEN
        if len(ids) <= max_tokens and len(text) <= limit:
            return text, ids, logprobs, finish
        if not ep.warned_length:
            ep.warned_length = True
            log.warning(
                f"{self.name}: {ep.label} answered {len(text):,} characters ({len(ids):,} token ids) to a request of "
                f"at most {max_tokens} tokens; cut to {max_tokens} tokens ({limit:,} characters) and finish_reason "
                f"'length' (this endpoint ignores max_tokens; said once)"
            )
        if len(ids) > max_tokens and self.tokenizer is not None:  # the text of the token ids kept
            return self.tokenizer.decode(ids[:max_tokens]), ids[:max_tokens], logprobs[:max_tokens], "length"
        return text[:limit], ids[:max_tokens], logprobs[:max_tokens], "length"

    def _parse(
        self, ep: _Endpoint, body: dict[str, Any], prompt_ids: list[int], sp: SamplingParams, estimate: int
    ) -> _Sample:
        try:
            choice = body["choices"][0]
            usage = body.get("usage") or {}
            if self.api == "chat":
                text = choice["message"].get("content") or ""
                ids: list[int] = []
                logprobs: list[float] = []
            else:
                text = choice.get("text") or ""
                ids = [int(t) for t in choice.get("token_ids") or []]
                raw = ((choice.get("logprobs") or {}).get("token_logprobs")) or []
                logprobs = [float(x) for x in raw] if sp.logprobs and len(raw) == len(ids) else []
            if not isinstance(text, str):
                raise TypeError(f"the answer's text is a {type(text).__name__}, not a string")
            finish = choice.get("finish_reason") or "stop"
            if not isinstance(finish, str):
                raise TypeError(f"finish_reason is a {type(finish).__name__}, not a string")
            if not isinstance(usage, dict):
                usage = {}
            details = usage.get("prompt_tokens_details")
            prompt_tokens = self._count(ep, usage.get("prompt_tokens"), len(prompt_ids))
            completion_tokens = self._count(ep, usage.get("completion_tokens"), len(ids))
            cached = self._count(ep, details.get("cached_tokens") if isinstance(details, dict) else None, 0)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise _Retry(f"HTTP 200 with an unexpected body ({type(exc).__name__}: {exc})") from None
        text, ids, logprobs, finish = self._bounded(ep, sp.max_tokens, text, ids, logprobs, finish)
        cost = ep.cost(prompt_tokens, cached, completion_tokens)
        stats = ep.stats
        stats.requests += 1
        stats.prompt_tokens += prompt_tokens
        stats.cached_prompt_tokens += cached
        stats.completion_tokens += completion_tokens
        stats.cost_usd += cost
        if ep.tokens is not None:
            ep.tokens.adjust(prompt_tokens + completion_tokens - estimate)
        completion = Completion(response_ids=ids, logprobs=logprobs, text=text, finish_reason=finish)
        return _Sample(completion, prompt_tokens, cached, completion_tokens, cost)


async def _bounded_body(response: httpx.Response) -> bytes:
    """The answer's body, decompressed here in steps of at most what is left of :data:`MAX_BODY_BYTES`: a gzip
    bomb (80 KB that inflate to gigabytes) is refused after inflating the limit, never held whole."""
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity", "gzip", "x-gzip", "deflate"):
        raise _Retry(
            f"HTTP {response.status_code} with an answer in content encoding {encoding!r} (asked for gzip or deflate)"
        )
    inflate = zlib.decompressobj(47) if encoding not in ("", "identity") else None  # 32 + 15: zlib or gzip header
    chunks: list[bytes] = []
    size = 0
    try:
        async for raw in response.aiter_raw():
            pending = raw
            while pending:
                if inflate is None:
                    data, pending = pending, b""
                else:
                    data = inflate.decompress(pending, min(1 << 20, MAX_BODY_BYTES + 1 - size))  # 1 MiB at a time
                    pending = inflate.unconsumed_tail
                size += len(data)
                if size > MAX_BODY_BYTES:
                    chunks.clear()  # the exception's traceback keeps this frame alive until a garbage collection
                    raise _Retry(
                        f"HTTP {response.status_code} with an answer larger than {MAX_BODY_BYTES >> 20} MiB "
                        "once decompressed: refused"
                    )
                chunks.append(data)
    except zlib.error as exc:
        raise _Retry(f"HTTP {response.status_code} with a {encoding} answer that does not decompress ({exc})") from None
    return b"".join(chunks)


def _retry_after(value: str | None) -> float:
    """The seconds a ``Retry-After`` header asks for (a number or an HTTP date); 0 when absent or unreadable. The
    caller caps it at its ``backoff_max_s``."""
    if value is None:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return 0.0
        if when is None:
            return 0.0
        seconds = when.timestamp() - time.time()
    return seconds if math.isfinite(seconds) and seconds > 0 else (math.inf if seconds == math.inf else 0.0)
