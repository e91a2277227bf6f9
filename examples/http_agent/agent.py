"""The vault game played by a black-box agent in its own process, over HTTP (docs/own_agent.md, "HTTP agent").

Nothing here imports memrl: any language could do the same. The agent serves two routes:

    GET  /health     -> 200
    POST /episodes   {"task": {...}, "seed": 3, "episode_id": "...", "memory": {"base_url": ..., "model": "memory"}}
                     -> {"outcome": 1.0}

and plays one episode per POST (requests are served in parallel threads): every second turn it asks the memory model
for one line worth remembering, through the OpenAI-compatible endpoint memrl serves at ``memory.base_url``
(``POST {base_url}/chat/completions``; the role goes in ``metadata.role``). memrl starts it with the port to listen on
in ``MEMRL_AGENT_PORT`` (``python agent.py --port 8700`` starts it by hand); with ``MEMRL_ENDPOINT_TOKEN`` set it
sends that bearer token.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gym_env"))  # the same game as the Gym example

from vault_game import VaultGame

NOTE_PROMPT = "Write one short line: what must be remembered?"


def chat(base_url: str, messages: list[dict[str, str]], role: str) -> str:
    """One call of the memory model memrl serves (an OpenAI chat completion)."""
    body = json.dumps({"model": "memory", "messages": messages, "metadata": {"role": role}}).encode()
    headers = {"Content-Type": "application/json"}
    if token := os.environ.get("MEMRL_ENDPOINT_TOKEN"):
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"{base_url}/chat/completions", data=body, headers=headers)
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.load(response)["choices"][0]["message"]["content"]


def player(context: list[str], admissible: list[str]) -> str:
    """Walk north; at the vault enter the vault code found in the context (else a wrong guess)."""
    if admissible != ["enter <code>"]:
        return "go north"
    found = re.findall(r"vault code is (\d{3})", "\n".join(context))
    return f"enter {found[-1] if found else '000'}"


def play(task: dict[str, Any], seed: int, base_url: str) -> float:
    """One episode; its outcome in [0, 1]."""
    game = VaultGame(corridor=int(task.get("corridor", 3)))
    seen, notes, admissible = [game.reset(seed)], [], ["go north"]
    for turn in range(int(task.get("max_turns", 12))):
        if turn % 2 == 1:
            note = chat(
                base_url,
                [{"role": "system", "content": NOTE_PROMPT}, {"role": "user", "content": "\n".join(seen[-2:])}],
                role="note",
            )
            notes.append(note.strip().split("\n")[0][:120])
        observation, reward, done, info = game.step(player(notes + seen[-2:], admissible))
        seen.append(observation)
        admissible = info.get("admissible_actions", admissible)
        if done:
            return float(info.get("outcome", reward))
    return 0.0


class Handler(BaseHTTPRequestHandler):
    """GET /health and POST /episodes."""

    def do_GET(self) -> None:
        self.reply(200, {"status": "ok"} if self.path == "/health" else {"error": "not found"})

    def do_POST(self) -> None:
        if self.path != "/episodes":
            return self.reply(404, {"error": "not found"})
        try:
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            outcome = play(request.get("task") or {}, int(request["seed"]), request["memory"]["base_url"])
        except Exception as exc:  # the episode failed: say so, memrl counts it as failed
            return self.reply(500, {"error": f"{type(exc).__name__}: {exc}"})
        self.reply(200, {"outcome": outcome})

    def reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    """Serve on 127.0.0.1 at --port (default: MEMRL_AGENT_PORT)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=int(os.environ.get("MEMRL_AGENT_PORT", "8700")))
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
