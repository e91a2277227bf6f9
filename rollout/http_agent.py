"""A black-box agent in its own process (any language; it never imports memrl), trained against over HTTP: memrl serves
the memory model (and the frozen reasoner) behind an OpenAI-compatible endpoint and starts episodes on the agent.

**The agent protocol** (what the agent implements; docs/own_agent.md)::

    GET  /health                                   -> 200 when ready to start episodes
    POST /episodes  {"task": {...}, "seed": 3, "episode_id": "train-3--r.1--9f2c",
                     "memory": {"base_url": "http://127.0.0.1:PORT/episodes/<episode_id>/v1", "model": "memory"}}
                    -> {"outcome": 0.0..1.0, "answer": "..."}   (when the episode is over)

Episodes run concurrently: the agent must serve requests in parallel (e.g. a threading HTTP server). During an episode
the agent calls the endpoint at ``memory.base_url`` with any OpenAI client (the episode is named by the URL)::

    POST {base_url}/chat/completions {"model": "memory", "messages": [...], "metadata": {"role": "note"},
                                      "max_tokens": 32}
    -> an OpenAI chat completion; ``choices[0].message.content`` is the reply, and ``memrl`` carries the token ids and
       log-probs memrl recorded (``prompt_token_ids``, ``token_ids``, ``logprobs``)

``model: "memory"`` is the trained memory model (its sampling is the run's ``memory.sampling[role]``; the request may
lower ``max_tokens``), ``model: "reasoner"`` the frozen reasoner memrl runs (optional: the agent may bring its own).

**Security and validation.** The endpoint listens on 127.0.0.1 unless ``serve_host`` says otherwise; anywhere else it
requires ``Authorization: Bearer <token>`` with the token read from the environment variable ``token_env`` (default
``MEMRL_ENDPOINT_TOKEN``; never logged). Every request is validated like any other input: body size (4 MiB at most),
JSON, the model name, message roles and sizes, ``max_tokens``, the episode id (unknown: 404; finished or stopped: 409),
and a call arriving while the episode waits on another is refused (409). The agent's answer to ``POST /episodes`` is
validated too (a number in [0, 1]).

**Branching** is by prefix replay (:mod:`memrl.rollout.episodes`): a sibling is a new episode (a new ``episode_id``,
the same task and seed) whose earlier calls are answered from the log, checked by request digest.

When memrl starts the agent (``command``) it passes ``MEMRL_AGENT_PORT`` (where the agent must listen, on 127.0.0.1)
and ``MEMRL_ENDPOINT`` (the endpoint's root URL), waits for ``GET /health`` and stops the process at the end of the run.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import re
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from memrl.data.errors import UserCodeError
from memrl.data.registry import ComponentError
from memrl.data.tasks.external import ExternalTask, HttpAgentParams
from memrl.rollout.episode_calls import BadOutcome, CallChannel, EpisodeCancelled, episode_outcome

__all__ = ["HttpAgentDriver", "ModelEndpoint"]

log = logging.getLogger(__name__)

MAX_BODY = 4 << 20
_PATH = re.compile(r"^/episodes/([A-Za-z0-9._-]{1,200})/v1/chat/completions$")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class _Episode:
    def __init__(self, channel: CallChannel) -> None:
        self.channel = channel
        self.busy = threading.Lock()  # one call at a time per episode


class ModelEndpoint:
    """The OpenAI-compatible endpoint memrl serves to agents (module docstring): one per process, routing each request
    to its episode's channel by the id in the URL."""

    def __init__(
        self, host: str = "127.0.0.1", token_env: str = "MEMRL_ENDPOINT_TOKEN", call_timeout_s: float = 600.0
    ) -> None:
        self.host = host
        self.token: str | None = None
        if not _loopback(host):
            self.token = os.environ.get(token_env)
            if not self.token:
                raise ComponentError(
                    f"serve_host {host!r} is not loopback: the model endpoint then requires a bearer "
                    f"token; set the environment variable {token_env}"
                )
        self.call_timeout_s = call_timeout_s
        self.episodes: dict[str, _Episode] = {}
        self.finished: set[str] = set()
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # the request line only, never headers
                log.debug("endpoint: " + format, *args)

            def do_GET(self) -> None:
                if self.path.rstrip("/") in ("/v1/models", "/models"):
                    self._send(
                        200,
                        {
                            "object": "list",
                            "data": [{"id": "memory", "object": "model"}, {"id": "reasoner", "object": "model"}],
                        },
                    )
                else:
                    self._send(404, _error("not found"))

            def do_POST(self) -> None:
                status, body = endpoint.handle(self.path, self.headers, self.rfile)
                self._send(status, body)

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, name="memrl-endpoint", daemon=True)
        self.thread.start()
        log.info(f"model endpoint for agents on http://{host}:{self.port}")

    @property
    def root(self) -> str:
        """The endpoint's root URL."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def base_url(self, episode_id: str) -> str:
        """The OpenAI base URL of one episode."""
        return f"{self.root}/episodes/{episode_id}/v1"

    def open(self, episode_id: str, channel: CallChannel) -> None:
        """Route calls of ``episode_id`` to ``channel``."""
        with self.lock:
            self.episodes[episode_id] = _Episode(channel)

    def close_episode(self, episode_id: str) -> None:
        """Refuse later calls of ``episode_id`` (409)."""
        with self.lock:
            if self.episodes.pop(episode_id, None) is not None:
                self.finished.add(episode_id)

    def _count(self, key: str) -> None:
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1

    def handle(self, path: str, headers: Any, body: Any) -> tuple[int, dict[str, Any]]:
        """One request: (HTTP status, JSON body). Every field is validated (module docstring)."""
        if self.token is not None:
            given = str(headers.get("Authorization", ""))
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                self._count("rejected_auth")
                return 401, _error("missing or wrong bearer token")
        match = _PATH.match(path.split("?", 1)[0])
        if match is None:
            self._count("rejected_path")
            return 404, _error("not found: POST /episodes/<episode_id>/v1/chat/completions")
        try:
            length = int(headers.get("Content-Length", "-1"))
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self._count("rejected_size")
            return 413, _error(f"the body needs a Content-Length of at most {MAX_BODY} bytes")
        try:
            request = json.loads(body.read(length) or b"null")
        except (ValueError, UnicodeDecodeError):
            self._count("rejected_json")
            return 400, _error("the body is not JSON")
        if not isinstance(request, dict):
            return 400, _error("the body must be a JSON object")
        episode_id = match.group(1)
        with self.lock:
            episode = self.episodes.get(episode_id)
            finished = episode_id in self.finished
        if episode is None:
            self._count("rejected_episode")
            return (
                (409, _error(f"episode {episode_id} is over"))
                if finished
                else (404, _error(f"unknown episode {episode_id}"))
            )
        model = request.get("model", "memory")
        if model not in ("memory", "reasoner"):
            episode.channel.rejected += 1
            return 400, _error("model: 'memory' (the trained memory model) or 'reasoner' (the frozen reasoner)")
        metadata = request.get("metadata") or {}
        role = metadata.get("role", "memory") if isinstance(metadata, dict) else None
        if model == "reasoner":
            role = "reasoner"
        max_tokens = request.get("max_completion_tokens", request.get("max_tokens"))
        stop = request.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or len(stop) > 16 or not all(isinstance(s, str) and s for s in stop):
            episode.channel.rejected += 1
            return 400, _error("stop: a string or a list of at most 16 non-empty strings")
        if not episode.busy.acquire(blocking=False):
            self._count("rejected_concurrent")
            episode.channel.rejected += 1
            return 409, _error("this episode already waits on a call: its calls are sequential")
        try:
            try:
                call = episode.channel.post(model, role, request.get("messages"), max_tokens, stop)
            except ValueError as exc:
                self._count("rejected_request")
                episode.channel.rejected += 1
                return 400, _error(str(exc))
            try:
                completion = call.reply.result(timeout=self.call_timeout_s)
            except EpisodeCancelled as exc:
                return 409, _error(f"episode {episode_id} was stopped: {exc}")
            except TimeoutError:
                return 504, _error("no answer in time")
        finally:
            episode.busy.release()
        self._count(f"calls_{model}")
        return 200, {
            "id": f"chatcmpl-{episode_id}-{int(time.time() * 1000)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": completion.text},
                    "finish_reason": "length" if completion.finish_reason == "length" else "stop",
                }
            ],
            "usage": {"completion_tokens": len(completion.response_ids)},
            "memrl": {"token_ids": list(completion.response_ids), "logprobs": list(completion.logprobs)},
        }

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error"}}


class HttpAgentDriver:
    """Starts episodes on a black-box agent (module docstring); owns the model endpoint and, with ``command``, the
    agent's process."""

    def __init__(self, params: HttpAgentParams) -> None:
        self.params = params
        self.endpoint = ModelEndpoint(params.serve_host, params.token_env, params.episode_timeout_s)
        self.process: subprocess.Popen[bytes] | None = None
        self.stderr_path: Path | None = None
        if params.command is not None:
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            self._start_agent(params.command, port)
        else:
            assert params.url is not None
            self.url = params.url.rstrip("/")
        self.client = httpx.Client(timeout=httpx.Timeout(params.episode_timeout_s, connect=10.0))
        self._wait_healthy()

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> HttpAgentDriver:
        """A driver from the family's parameters (``HttpAgentParams`` fields)."""
        return cls(HttpAgentParams.model_validate(params))

    def _start_agent(self, command: list[str], port: int) -> None:
        import tempfile

        env = {**os.environ, "MEMRL_AGENT_PORT": str(port), "MEMRL_ENDPOINT": self.endpoint.root}
        handle = tempfile.NamedTemporaryFile(prefix="memrl-agent-", suffix=".log", delete=False)  # noqa: SIM115
        self.stderr_path = Path(handle.name)
        try:
            self.process = subprocess.Popen(
                command, cwd=self.params.cwd, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as exc:
            raise ComponentError(f"http_agent command {command!r} could not start: {exc}") from None
        finally:
            handle.close()
        log.info(f"started the agent (pid {self.process.pid}): {' '.join(command)}")

    def _tail(self) -> str:
        if self.stderr_path is None or not self.stderr_path.exists():
            return ""
        return self.stderr_path.read_text(errors="replace")[-2000:]

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.params.start_timeout_s
        last = ""
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                tail = self._tail()
                self.close()
                raise UserCodeError(
                    f"the HTTP agent ({' '.join(self.params.command or [])}) exited with code "
                    f"{self.process.returncode} before it answered GET /health; its output ends with:\n{tail}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
                last = "GET /health did not return 200"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}"
            time.sleep(0.2)
        self.close()
        raise UserCodeError(
            f"the HTTP agent at {self.url} did not answer GET /health with 200 within "
            f"{self.params.start_timeout_s:g} s ({last})"
        )

    def start(self, task: ExternalTask, episode_id: str, channel: CallChannel) -> None:
        """POST /episodes in a thread; its answer (or failure) ends the episode."""
        self.endpoint.open(episode_id, channel)
        payload = {
            "task": task.params.get("task", {}),
            "seed": task.seed,
            "episode_id": episode_id,
            "memory": {"base_url": self.endpoint.base_url(episode_id), "model": "memory"},
        }

        def main() -> None:
            try:
                response = self.client.post(f"{self.url}/episodes", json=payload)
                if response.status_code != 200:
                    raise RuntimeError(f"POST /episodes answered {response.status_code}: {response.text[:300]}")
                body = response.json()
                if not isinstance(body, dict):
                    raise RuntimeError("POST /episodes answered JSON that is not an object")
                score = body.get("outcome", body.get("score"))
                where = f"the HTTP agent's POST /episodes (episode {episode_id})"
                try:
                    outcome = episode_outcome({"score": score, "answer": body.get("answer")}, where)
                except UserCodeError as exc:  # a malformed outcome fails this episode only (the agent's protocol)
                    raise BadOutcome(str(exc)) from None
                channel.items.put(("done", outcome))
            except BadOutcome as exc:
                channel.items.put(("error", exc))
            except Exception as exc:
                channel.items.put(("error", self._exited(episode_id, exc) or exc))

        threading.Thread(target=main, name=f"memrl-agent-{episode_id}", daemon=True).start()

    def _exited(self, episode_id: str, exc: Exception) -> UserCodeError | None:
        """The error that stops the run when the agent process memrl started has exited (every later episode would
        fail the same way), None while it runs (or when memrl did not start it)."""
        if self.process is None:
            return None
        try:  # a dropped or refused connection: the process may be on its way out
            self.process.wait(timeout=2.0 if isinstance(exc, httpx.TransportError) else 0.0)
        except subprocess.TimeoutExpired:
            return None
        return UserCodeError(
            f"the HTTP agent ({' '.join(self.params.command or [])}, pid {self.process.pid}) exited with code "
            f"{self.process.returncode} during episode {episode_id}; its output ends with:\n{self._tail()}"
        )

    def stop(self, episode_id: str) -> None:
        """Refuse the episode's later calls."""
        self.endpoint.close_episode(episode_id)

    def close(self) -> None:
        """Stop the agent process (SIGTERM, then SIGKILL after 10 s) and the endpoint."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if getattr(self, "client", None) is not None:
            self.client.close()
        self.endpoint.close()
        if self.stderr_path is not None:
            self.stderr_path.unlink(missing_ok=True)
