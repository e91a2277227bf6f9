"""A local OpenAI-compatible chat endpoint that misbehaves on purpose, and keeps its own log.

Each request (attempt) draws from a seeded RNG: ``fail`` of them get HTTP 500, ``hang`` of them are held past the
client's timeout (then answered; the client has gone), the rest get a 200 answer. Reference requests (model ``ref``)
are answered with a fixed recall text; judge requests (model ``judge``) with a score list for every candidate. The
server stops answering after ``max_requests`` and the whole thing is bounded by ``max_seconds``.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


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
    hang_s: float = 1.0
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
                    over = (len(server.log) >= server.max_requests
                            or time.monotonic() - server._start > server.max_seconds)
                    draw = server._rng.random()
                    outcome = "refused" if over else "error" if draw < server.fail else \
                        "hang" if draw < server.fail + server.hang else "ok"
                    server.log.append(Attempt(key, body.get("model", ""), outcome))
                if outcome in ("error", "refused"):
                    self._reply(500, {"error": "injected failure"})
                    return
                if outcome == "hang":
                    time.sleep(server.hang_s)
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

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # the default backlog of 5 would refuse bursts before they reach the log

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    @staticmethod
    def answer(body: dict[str, Any]) -> dict[str, Any]:
        content = body["messages"][-1]["content"]
        if body.get("model") == "judge":
            n = len(re.findall(r"^\(\d+\) ", content, re.MULTILINE))
            text = json.dumps([{"candidate": i + 1, "relevance": 7, "coverage": 6, "consistency": 9}
                               for i in range(n)])
        else:
            text = "the key is in drawer 5 of the kitchen"
        return {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5}}

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

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
