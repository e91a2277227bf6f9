"""The openai backend: retries, timeouts, deadlines, rate limits, load spreading and key handling against a local
fault-injecting HTTP server; token-in/token-out against a real vLLM OpenAI-compatible server (CPU)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch

from memrl.data.schemas import Message
from memrl.rollout.engines import (
    EndpointConfig,
    EngineConfig,
    EngineError,
    GenerationRequest,
    SamplingParams,
    build_engine,
    chat_prompt_ids,
)
from memrl.rollout.engines.openai_engine import OpenAIEngine, TokenBucket
from tests.fault_server import PlannedServer, QuietHandler

KEY = "sk-test-0123456789-secret"

OK_COMPLETION = {
    "choices": [
        {"text": "ok", "token_ids": [5, 6], "logprobs": {"token_logprobs": [-1.0, -2.0]}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 1}},
}
OK_CHAT = {
    "choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2},
}


class FaultServer(PlannedServer):
    """Answers ``/<tag>/<plan>/v1/...``: attempt k of a tag follows item k of the comma-separated plan (the last item
    repeats). Items: ok, 400, 429, 500, 503, slow (sleeps 3 s, then ok), drop (closes without answering), drip
    (headers, then a byte every 0.2 s), garbage (200 with a non-JSON body), pause (0.3 s, then ok)."""

    def __init__(self) -> None:
        self.headers: dict[str, list[dict[str, str]]] = defaultdict(list)
        self.bodies: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.in_flight: dict[str, int] = defaultdict(int)
        self.max_in_flight: dict[str, int] = defaultdict(int)
        server = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                _, tag, plan, *_ = self.path.split("/")
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    _, action = server.next_attempt(tag, plan)
                    server.headers[tag].append(dict(self.headers))
                    server.bodies[tag].append(body)
                    server.in_flight[tag] += 1
                    server.max_in_flight[tag] = max(server.max_in_flight[tag], server.in_flight[tag])
                self.tag, self.counted = tag, True
                try:
                    self.act(action, OK_CHAT if self.path.endswith("/chat/completions") else OK_COMPLETION)
                finally:
                    self.leave()

            def leave(self) -> None:
                """The request stops counting as in flight: before its answer is sent, since a client that has the
                answer may send its next request at once (counting after the write raced with it)."""
                if self.counted:
                    self.counted = False
                    with server.lock:
                        server.in_flight[self.tag] -= 1

            def act(self, action: str, ok: dict[str, Any]) -> None:
                if action in ("slow", "pause"):
                    time.sleep(3.0 if action == "slow" else 0.3)
                    action = "ok"
                if action == "drop":
                    self.close_connection = True
                    return
                if action == "drip":
                    self.drip(100)
                    return
                status = 200 if action in ("ok", "garbage") else int(action)
                payload = (
                    b"<html>oops</html>"
                    if action == "garbage"
                    else json.dumps(ok if status == 200 else {"error": {"message": f"injected {status}"}}).encode()
                )
                self.leave()
                self.send_response(status)
                if status == 429:
                    self.send_header("Retry-After", "0")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        super().__init__(Handler)


@pytest.fixture(scope="module")
def faults():
    server = FaultServer()
    yield server
    server.close()


def engine_for(*urls: str, api: str = "completions", tokenizer: Any = None, **kw: Any) -> OpenAIEngine:
    endpoint_kw = kw.pop("endpoint", {})
    endpoints = [EndpointConfig(url=u, model="m", **endpoint_kw) for u in urls]
    options = {"request_timeout_s": 5.0, "max_retries": 5, "backoff_base_s": 0.01, "backoff_max_s": 0.05, **kw}
    return OpenAIEngine(endpoints, tokenizer=tokenizer if tokenizer is not None else _IdTokenizer(), api=api, **options)


class _IdTokenizer:
    """Enough of a tokenizer for prompt-id requests (the fault server never looks at prompts)."""

    def apply_chat_template(self, messages: list[dict[str, str]], **kw: Any) -> list[int]:
        return [1, 2, 3]


def ids_request(n: int = 1, seed: int | None = 1) -> GenerationRequest:
    return GenerationRequest(prompt_ids=[1, 2, 3], sampling=SamplingParams(n=n, seed=seed, max_tokens=4))


def test_retries_recover_from_429_500_drops_timeouts_and_garbage(faults) -> None:
    url = faults.url("recover", "429,500,drop,slow,garbage,503,ok")
    with engine_for(url, request_timeout_s=1.0, max_retries=6) as engine:
        (res,) = engine.generate([ids_request()])
        stats = engine.stats()[f"{url} (m)"]
    assert faults.attempts["recover"] == 7
    assert res.completions[0].response_ids == [5, 6] and res.completions[0].logprobs == [-1.0, -2.0]
    assert res.completions[0].text == "ok" and res.prompt_ids == [1, 2, 3]
    assert stats.failed_attempts == 6 and stats.requests == 1
    body = faults.bodies["recover"][-1]
    assert body["prompt"] == [1, 2, 3] and body["return_token_ids"] is True and body["logprobs"] == 0
    assert body["model"] == "m" and body["n"] == 1


def test_retry_budget_ends_in_one_clear_error(faults) -> None:
    url = faults.url("budget", "503")
    with engine_for(url, max_retries=2) as engine, pytest.raises(EngineError) as err:
        engine.generate([ids_request()])
    message = str(err.value)
    assert url in message and "HTTP 503" in message and "3 attempt(s)" in message
    assert faults.attempts["budget"] == 3


def test_client_errors_are_not_retried(faults) -> None:
    url = faults.url("bad", "400")
    with engine_for(url) as engine, pytest.raises(EngineError, match="HTTP 400"):
        engine.generate([ids_request(n=1)])
    assert faults.attempts["bad"] == 1


def test_no_call_hangs_past_its_timeout_or_deadline(faults) -> None:
    url = faults.url("drip", "drip")
    start = time.monotonic()
    with engine_for(url, request_timeout_s=0.5, max_retries=1) as engine, pytest.raises(EngineError, match="timeout"):
        engine.generate([ids_request()])
    # two attempts of 0.5 s each (the server would drip for 20 s); generous slack for a loaded machine
    assert time.monotonic() - start < 10.0
    slow = faults.url("deadline", "slow")
    start = time.monotonic()
    with (
        engine_for(slow, request_timeout_s=30.0, deadline_s=1.0, max_retries=10) as engine,
        pytest.raises(EngineError, match=r"timeout after 1\.0 s.*deadline"),
    ):
        engine.generate([ids_request()])
    assert time.monotonic() - start < 10.0
    assert faults.attempts["deadline"] == 1


def test_load_spreads_over_endpoints_and_fails_over(faults) -> None:
    a, b = faults.url("spread-a", "pause"), faults.url("spread-b", "pause")
    with engine_for(a, b, endpoint={"max_concurrency": 2}) as engine:
        results = engine.generate([ids_request(n=4, seed=s) for s in range(3)])
    assert all(len(r.completions) == 4 for r in results)
    assert faults.attempts["spread-a"] + faults.attempts["spread-b"] == 12
    assert faults.attempts["spread-a"] >= 3 and faults.attempts["spread-b"] >= 3
    assert faults.max_in_flight["spread-a"] <= 2 and faults.max_in_flight["spread-b"] <= 2
    down, up = faults.url("down", "500"), faults.url("up", "ok")
    with engine_for(down, up) as engine:
        results = engine.generate([ids_request(n=2, seed=s) for s in range(4)])
    assert all(c.text == "ok" for r in results for c in r.completions)
    assert faults.attempts["up"] == 8


def test_concurrency_is_bounded_per_endpoint(faults) -> None:
    url = faults.url("bounded", "pause")
    with engine_for(url, endpoint={"max_concurrency": 2}) as engine:
        engine.generate([ids_request(n=6)])
    assert faults.attempts["bounded"] == 6 and faults.max_in_flight["bounded"] <= 2


def test_usage_and_cost_accounting(faults) -> None:
    url = faults.url("cost", "ok")
    prices = {"input_usd_per_mtok": 1.0, "cached_input_usd_per_mtok": 0.5, "output_usd_per_mtok": 2.0}
    with engine_for(url, endpoint=prices) as engine:
        (res,) = engine.generate([ids_request(n=3)])
        stats = engine.stats()[f"{url} (m)"]
    assert (res.usage.prompt_tokens, res.usage.completion_tokens, res.usage.cached_prompt_tokens) == (9, 6, 3)
    assert res.usage.cost_usd == pytest.approx(3 * (2 * 1.0 + 1 * 0.5 + 2 * 2.0) / 1e6)
    assert stats.requests == 3 and stats.cost_usd == pytest.approx(res.usage.cost_usd)
    seeds = [b["seed"] for b in faults.bodies["cost"]]
    assert len(set(seeds)) == 3


def test_chat_api_sends_messages(faults) -> None:
    url = faults.url("chat", "ok")
    messages = [Message(role="system", content="s"), Message(role="user", content="hi")]
    with OpenAIEngine([EndpointConfig(url=url, model="gpt-x")], request_timeout_s=5.0) as engine:
        assert engine.api == "chat"
        (res,) = engine.generate([GenerationRequest(messages=messages, sampling=SamplingParams(stop=["\n"]))])
        with pytest.raises(EngineError, match="chat API needs messages"):
            engine.generate([ids_request()])
    assert res.completions[0].text == "ok" and res.completions[0].response_ids == [] and res.prompt_ids == []
    assert res.usage.prompt_tokens == 3 and res.usage.completion_tokens == 2
    body = faults.bodies["chat"][0]
    assert body["messages"] == [m.model_dump() for m in messages] and body["stop"] == ["\n"]
    assert "prompt" not in body and "return_token_ids" not in body


def test_api_keys_come_from_the_environment_and_are_never_shown(faults, monkeypatch, caplog) -> None:
    monkeypatch.setenv("MEMRL_TEST_KEY", KEY)
    ok, failing = faults.url("key-ok", "ok"), faults.url("key-bad", "429,500,503")
    caplog.set_level(logging.DEBUG)
    with engine_for(ok, endpoint={"api_key_env": "MEMRL_TEST_KEY"}) as engine:
        engine.generate([ids_request()])
        assert KEY not in repr(engine._endpoints)
    assert faults.headers["key-ok"][0]["Authorization"] == f"Bearer {KEY}"
    with (
        engine_for(failing, max_retries=2, endpoint={"api_key_env": "MEMRL_TEST_KEY"}) as engine,
        pytest.raises(EngineError) as err,
    ):
        engine.generate([ids_request()])
    assert KEY not in str(err.value)
    assert "retry" in caplog.text and KEY not in caplog.text
    monkeypatch.delenv("MEMRL_TEST_KEY")
    with pytest.raises(EngineError, match="MEMRL_TEST_KEY"):
        engine_for(ok, endpoint={"api_key_env": "MEMRL_TEST_KEY"})


def test_agenerate_from_a_running_event_loop(faults) -> None:
    url = faults.url("async", "ok")

    async def main(engine: OpenAIEngine) -> list[str]:
        results = await asyncio.gather(engine.agenerate([ids_request()]), engine.agenerate([ids_request(seed=2)]))
        return [r[0].completions[0].text for r in results]

    with engine_for(url) as engine:
        assert asyncio.run(main(engine)) == ["ok", "ok"]
    with pytest.raises(EngineError, match="closed"):
        engine.generate([ids_request()])


def test_token_bucket_paces_requests_and_tokens() -> None:
    now = [0.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    async def run() -> None:
        bucket = TokenBucket(120, clock=lambda: now[0], sleep=sleep)  # 2 per second, holds 2
        for _ in range(6):
            await bucket.take(1, deadline=100.0)
        assert now[0] == pytest.approx(2.0)  # 2 at once, then one every 0.5 s
        tokens = TokenBucket(6000, clock=lambda: now[0], sleep=sleep)  # 100 per second, holds 100
        await tokens.take(250, deadline=100.0)  # larger than the bucket: admitted when full, leaves a debt
        before = now[0]
        await tokens.take(50, deadline=100.0)
        assert now[0] - before == pytest.approx(2.0)  # repay 150, then 50 more at 100 per second
        tokens.adjust(-1000)  # a refund never overfills
        assert tokens.level == pytest.approx(100.0)
        slow = TokenBucket(60, clock=lambda: now[0], sleep=sleep)  # 1 per second
        await slow.take(1, deadline=now[0])
        with pytest.raises(TimeoutError):
            await slow.take(1, deadline=now[0] + 0.5)

    asyncio.run(run())


def test_rate_limits_apply_per_endpoint(faults) -> None:
    url = faults.url("rpm", "ok")
    # one request per second: the second sample cannot start before the deadline, so the call fails at once
    with (
        engine_for(url, endpoint={"requests_per_minute": 60.0}, deadline_s=0.6, max_retries=0) as engine,
        pytest.raises(EngineError, match="rate limit"),
    ):
        engine.generate([ids_request(n=3)])
    assert faults.attempts["rpm"] <= 1


# ----------------------------------------------------------------------------------------------------------------
# A real vLLM OpenAI-compatible server on the tiny model


@torch.no_grad()
def _forward_logprobs(model: Any, prompt: list[int], response: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
    return logp[len(prompt) - 1 :].gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)


# protects: the OpenAI engine against a real vLLM server: prompt ids, sampled tokens and log-probs (equal to
# transformers'), usage and prefix-cache hits; the fast tests use a fake server
@pytest.mark.slow
@pytest.mark.vllm
def test_token_in_token_out_against_vllm_server(vllm_server_16k: tuple[str, Path]) -> None:
    from memrl.rollout.models import load_causal_lm

    vllm_server, tiny_model_dir = vllm_server_16k  # the session's server (tests/conftest.py)

    cfg = EngineConfig(
        backend="openai",
        tokenizer=str(tiny_model_dir),
        endpoints=[EndpointConfig(url=vllm_server, model="tiny", max_concurrency=4)],
        request_timeout_s=120,
    )
    engine = build_engine(cfg)
    long_system = "memory notes: " + " ".join(f"t{i}: item {i} in box {i % 5}." for i in range(40))
    messages = [Message(role="system", content=long_system), Message(role="user", content="where is item 3?")]
    request = GenerationRequest(messages=messages, sampling=SamplingParams(n=3, seed=4, max_tokens=16))
    with engine:
        (res,) = engine.generate([request])
        (again,) = engine.generate([request])
    with OpenAIEngine([EndpointConfig(url=vllm_server, model="tiny")], request_timeout_s=120) as chat_engine:
        (chat,) = chat_engine.generate(
            [GenerationRequest(messages=messages, sampling=SamplingParams(max_tokens=8, seed=1))]
        )
    assert engine.api == "completions"
    assert res.prompt_ids == chat_prompt_ids(engine.tokenizer, messages) and len(res.prompt_ids) > 128
    assert [c.response_ids for c in res.completions] == [c.response_ids for c in again.completions]
    assert len({tuple(c.response_ids) for c in res.completions}) == 3
    model = load_causal_lm(tiny_model_dir, dtype="float32").eval()
    diffs = torch.cat(
        [
            (_forward_logprobs(model, res.prompt_ids, c.response_ids) - torch.tensor(c.logprobs)).abs()
            for c in res.completions
        ]
    )
    print(f"vLLM server vs transformers log-prob mean abs diff {diffs.mean().item():.2e}")
    assert diffs.mean().item() < 1e-4
    assert res.usage.prompt_tokens == 3 * len(res.prompt_ids)
    assert res.usage.completion_tokens == sum(len(c.response_ids) for c in res.completions)
    # the repeat is served from the server's prefix cache (blocks of 128 tokens on CPU)
    assert again.usage.cached_prompt_tokens >= 3 * 128
    assert chat.completions[0].text and chat.usage.prompt_tokens > 0 and chat.completions[0].response_ids == []
