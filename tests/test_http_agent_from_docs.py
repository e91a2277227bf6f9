"""A second HTTP agent, written from docs/own_agent.md's "black-box agent over HTTP" section alone (not from the
example): its own game (a shopping errand whose item is named once, at the start), its own memory role
(``summary``), the standard library's ``http.client`` and a threading ``socketserver``; memrl starts it as another
process and trains its memory model for two OAT-GRPO iterations on the tiny model."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.commands import run_ok

# protects: a second HTTP agent written from the docs alone trains through memrl as its own process (the docs'
# protocol, not only the shipped example)
pytestmark = pytest.mark.slow

AGENT = r"""
import http.client, json, os, random, socketserver, urllib.parse
from http.server import BaseHTTPRequestHandler, HTTPServer

ITEMS = ["apples", "bread", "candles", "dates", "eggs", "flour", "grapes", "honey"]


def memory(base_url, messages):
    url = urllib.parse.urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=300)
    body = {"model": "memory", "messages": messages, "metadata": {"role": "summary"}}
    conn.request("POST", url.path + "/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    reply = json.loads(conn.getresponse().read())
    conn.close()
    return reply["choices"][0]["message"]["content"]


def episode(task, seed, base_url):
    rng = random.Random(seed)
    item = rng.choice(ITEMS)
    summary = ""
    for shop in range(int(task.get("shops", 3))):
        seen = f"shop {shop}: the window shows {rng.choice(ITEMS)}"
        if shop == 0:
            seen = f"mother says: buy {item}. " + seen
        summary = memory(base_url, [
            {"role": "system", "content": "Keep what the shopper must remember, in one line."},
            {"role": "user", "content": f"so far: {summary}\nnow: {seen}"},
        ])
    return 1.0 if item in summary else 0.0


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        outcome = episode(request["task"], request["seed"], request["memory"]["base_url"])
        data = json.dumps({"outcome": outcome}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class Server(socketserver.ThreadingMixIn, HTTPServer):
    daemon_threads = True


Server(("127.0.0.1", int(os.environ["MEMRL_AGENT_PORT"])), Handler).serve_forever()
"""


def test_an_http_agent_written_from_the_docs_trains(tiny_model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "shopper.py").write_text(AGENT)
    config = tmp_path / "config.yaml"
    config.write_text(f"""command: train oat-grpo
run: {{output_dir: {tmp_path / "runs"}, name: shopper, seed: 0}}
policy: {{base: {tiny_model_dir}, dtype: float32}}
engine: {{backend: hf, name: policy, model: {tiny_model_dir}, dtype: float32, batch_size: 32}}
memory: {{name: external, sampling: {{summary: {{temperature: 1.0, max_tokens: 12}}}}}}
train_tasks:
  family: http_agent
  params: {{command: [{sys.executable}, {tmp_path / "shopper.py"}], task: {{shops: 3}}, episode_timeout_s: 120}}
  count: 16
eval_tasks: {{count: 2, seed: 1000}}
tasks_per_iteration: 2
tree: {{branch_roles: [summary], branch_factor: 2, max_branch_depth: 2, max_leaves: 4}}
credit: {{terms: [{{name: length, weight: 0.1}}], advantage: grpo_std}}
trainer: {{lr: 1.0e-3, update_epochs: 1, optimizer_steps_per_epoch: 1, bf16: false, lora: {{enabled: false}}}}
loop: {{iterations: 2, eval_every: 0, checkpoint_every: 1}}
eval_samples: 0
""")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}
    run_ok(
        [sys.executable, "-m", "memrl.launch.cli", "train", "oat-grpo", "--config", str(config)], cwd=tmp_path, env=env
    )
    run = tmp_path / "runs" / "shopper"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 0]
    assert len(steps) == 2 and steps[0]["memory_calls_trained"] > 0 and steps[-1]["updates"] >= 1
    assert steps[0]["reentry_replay"] > 0 and steps[0]["replay_verified"] == steps[0]["reentry_replay"]
    nodes = [n for line in (run / "trees_last.jsonl").read_text().splitlines() for n in json.loads(line)["nodes"]]
    assert {n["call"]["role"] for n in nodes if n["kind"] == "memory"} == {"summary"}
    log = (run / "run.log").read_text()
    pid = int(log.split("started the agent (pid ")[1].split(")")[0])
    assert pid != os.getpid() and not Path(f"/proc/{pid}").exists()  # another process, stopped at the end
