"""A local OpenAI-compatible chat endpoint that misbehaves on purpose, and keeps its own log.

Each request (attempt) draws from a seeded RNG: ``fail`` of them get HTTP 500, ``hang`` of them are never answered
(held until the client gives up and closes the connection, at most ``hang_s``: a condition, not a race between the
server's sleep and the client's timeout on a loaded machine), the rest get a 200 answer at once. Reference requests
(model ``ref``) are answered with a fixed recall text; judge requests (model ``judge``) with a score list for every
candidate. The server stops answering after ``max_requests`` and the whole thing is bounded by ``max_seconds``.

:class:`PlanServer` is the other kind: each fault planned per request (redirects, a redirect loop, 429 with an absurd
``Retry-After``, a gzip bomb, a 10 MB answer, an HTML page with 200, a wrong JSON schema, ``NaN`` usage, a drip-fed
body), for the runtime-fault tests (tests/test_runtime_faults.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import re
import select
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that speaks HTTP/1.1 (keep-alive, as the clients under test expect) and logs nothing."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def drip(self, count: int) -> None:
        """A 200 whose headers promise 1000 bytes, then a byte every 0.2 s, ``count`` of them (until the client
        leaves)."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "1000")
        self.end_headers()
        for _ in range(count):
            try:
                self.wfile.write(b" ")
                self.wfile.flush()
            except OSError:
                return
            time.sleep(0.2)


class LocalServer(ThreadingHTTPServer):
    """A threaded HTTP server on a free port of 127.0.0.1, serving from a daemon thread from the start; a client that
    gives up mid-request (its timeout, a redirect loop it cut short) is expected here, not an error."""

    request_queue_size = 128  # the default backlog of 5 would refuse bursts before they reach the handler
    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.port = self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class PlannedServer:
    """A :class:`LocalServer` whose faults are planned in the request path: attempt k of ``/<tag>/<plan>/v1/...``
    follows item k of the comma-separated ``plan`` (the last item repeats). ``attempts[tag]`` counts the requests."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.attempts: dict[str, int] = defaultdict(int)
        self.lock = threading.Lock()
        self.httpd = LocalServer(handler)
        self.port = self.httpd.port

    def next_attempt(self, tag: str, plan: str) -> tuple[int, str]:
        """Count an attempt of ``tag`` (call it holding :attr:`lock`): its number k and the plan's item k."""
        k = self.attempts[tag]
        self.attempts[tag] += 1
        steps = plan.split(",")
        return k, steps[min(k, len(steps) - 1)]

    def url(self, tag: str, plan: str) -> str:
        """The API base whose attempts follow ``plan``."""
        return f"http://127.0.0.1:{self.port}/{tag}/{plan}/v1"

    def close(self) -> None:
        self.httpd.close()


@dataclass
class Attempt:
    """One request the server received: which logical request (payload hash), which model, what it did."""

    key: str
    model: str
    outcome: str  # ok | error | hang | refused


@dataclass
class FaultServer:
    fail: float = 0.3
    hang: float = 0.1
    hang_s: float = 120.0
    seed: int = 0
    max_requests: int = 2000
    max_seconds: float = 600.0
    log: list[Attempt] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()
        self._start = time.monotonic()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                key = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
                with server._lock:
                    over = (
                        len(server.log) >= server.max_requests or time.monotonic() - server._start > server.max_seconds
                    )
                    draw = server._rng.random()
                    outcome = (
                        "refused"
                        if over
                        else "error"
                        if draw < server.fail
                        else "hang"
                        if draw < server.fail + server.hang
                        else "ok"
                    )
                    server.log.append(Attempt(key, body.get("model", ""), outcome))
                if outcome in ("error", "refused"):
                    self._reply(500, {"error": "injected failure"})
                    return
                if outcome == "hang":  # never answered: wait for the client to leave (EOF), at most hang_s
                    with contextlib.suppress(OSError, ValueError):
                        select.select([self.connection], [], [], server.hang_s)
                    self.close_connection = True
                    return
                self._reply(200, server.answer(body))

            def _reply(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

        self.httpd = LocalServer(Handler)
        self.url = f"http://127.0.0.1:{self.httpd.port}/v1"

    @staticmethod
    def answer(body: dict[str, Any]) -> dict[str, Any]:
        content = body["messages"][-1]["content"]
        if body.get("model") == "judge":
            n = len(re.findall(r"^\(\d+\) ", content, re.MULTILINE))
            text = json.dumps([{"candidate": i + 1, "relevance": 7, "coverage": 6, "consistency": 9} for i in range(n)])
        else:
            text = "the key is in drawer 5 of the kitchen"
        return {
            "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5},
        }

    def close(self) -> None:
        self.httpd.close()

    def counts(self, model: str) -> dict[str, int]:
        """Attempts by outcome, and logical requests (payload hashes) answered at least once / never."""
        attempts = [a for a in self.log if a.model == model]
        by_key: dict[str, list[str]] = {}
        for a in attempts:
            by_key.setdefault(a.key, []).append(a.outcome)
        return {
            "attempts": len(attempts),
            "ok": sum(a.outcome == "ok" for a in attempts),
            "failed_attempts": sum(a.outcome != "ok" for a in attempts),
            "requests": len(by_key),
            "answered": sum("ok" in v for v in by_key.values()),
            "unanswered": sum("ok" not in v for v in by_key.values()),
        }


CHAT_OK = {
    "choices": [{"message": {"role": "assistant", "content": "answer(drawer 5)"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2},
}
COMPLETION_OK = {
    "choices": [
        {"text": "ok", "token_ids": [5, 6], "logprobs": {"token_logprobs": [-1.0, -2.0]}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2},
}
BOMB_BYTES = 80 << 20  # decompressed size of the gzip bomb (over the engine's 64 MiB answer limit)
_bomb: list[bytes] = []


def gzip_bomb() -> bytes:
    """80 MiB of zeros, gzip-compressed to about 80 KB (built once)."""
    if not _bomb:
        import zlib

        packer = zlib.compressobj(9, zlib.DEFLATED, 31)
        block = bytes(1 << 20)
        _bomb.append(b"".join(packer.compress(block) for _ in range(BOMB_BYTES >> 20)) + packer.flush())
    return _bomb[0]


class PlanServer(PlannedServer):
    """An OpenAI-compatible endpoint whose every fault is planned: ``url(tag, plan)`` answers attempt k of ``tag``
    with item k of the comma-separated ``plan`` (the last item repeats). Items: ``ok``; an HTTP status (``500``,
    ``503``, ``400``); ``retry-huge`` (429 with ``Retry-After: 1000000000``); ``retry-date`` (429 with an HTTP-date
    a year ahead); ``redirect`` / ``redirect307`` (302 / 307 to the same API path under tag ``<tag>-moved`` answering
    ``ok``); ``loop`` (302 to itself); ``hops`` (302 to a new address every time: an endless chain); ``html`` (200 with
    an HTML page); ``schema`` (200 with JSON that has no ``choices``); ``nan`` (200 whose ``usage`` is ``NaN``);
    ``bomb`` (200 with a gzip bomb: :data:`BOMB_BYTES` once decompressed); ``drip`` (200 headers, then a byte every
    0.2 s). ``attempts[tag]`` counts requests, ``auth[tag]`` the Authorization headers they carried."""

    def __init__(self) -> None:
        self.auth: dict[str, list[str | None]] = defaultdict(list)
        self.methods: dict[str, list[str]] = defaultdict(list)
        server = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def _handle(self, method: str) -> None:
                _, tag, plan, *rest = self.path.split("/")
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                with server.lock:
                    k, action = server.next_attempt(tag, plan)
                    server.auth[tag].append(self.headers.get("Authorization"))
                    server.methods[tag].append(method)
                tail = "/".join(rest)
                ok = CHAT_OK if tail.endswith("chat/completions") else COMPLETION_OK
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up and left
                    self._act(action, tag, plan, tail, k, ok)

            def _send(
                self,
                status: int,
                body: bytes,
                headers: dict[str, str] | None = None,
                content_type: str = "application/json",
            ) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _act(self, action: str, tag: str, plan: str, tail: str, k: int, ok: dict[str, Any]) -> None:
                if action == "ok":
                    self._send(200, json.dumps(ok).encode())
                elif action.isdigit():
                    self._send(int(action), json.dumps({"error": {"message": f"injected {action}"}}).encode())
                elif action == "retry-huge":
                    self._send(429, b'{"error": "slow down"}', {"Retry-After": "1000000000"})
                elif action == "retry-date":
                    self._send(429, b'{"error": "slow down"}', {"Retry-After": "Fri, 01 Jan 2100 00:00:00 GMT"})
                elif action in ("redirect", "redirect307"):
                    status = 302 if action == "redirect" else 307
                    where = f"http://localhost:{server.port}/{tag}-moved/ok/{tail}"  # another origin: localhost
                    self._send(status, b"", {"Location": where})
                elif action == "loop":
                    self._send(302, b"", {"Location": self.path})
                elif action == "hops":
                    self._send(302, b"", {"Location": f"/{tag}-{k}/{plan}/{tail}"})
                elif action == "html":
                    self._send(200, b"<html><body><h1>Welcome to nginx!</h1></body></html>", content_type="text/html")
                elif action == "schema":
                    self._send(200, json.dumps({"object": "list", "data": [{"text": "ok"}]}).encode())
                elif action == "nan":
                    body = json.dumps(
                        {**ok, "usage": {"prompt_tokens": float("nan"), "completion_tokens": float("nan")}}
                    )
                    self._send(200, body.encode())
                elif action == "huge":  # a 10 MB answer to a request of a few tokens (max_tokens ignored)
                    text = "the key is in drawer 5. " * 420_000
                    body = {
                        **ok,
                        "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                    }
                    self._send(200, json.dumps(body).encode())
                elif action == "bomb":
                    self._send(200, gzip_bomb(), {"Content-Encoding": "gzip"})
                elif action == "drip":
                    self.drip(200)
                else:
                    raise ValueError(f"unknown plan item {action!r}")

        super().__init__(Handler)
