"""The episode-function and HTTP-agent shapes (memrl.rollout.episodes, memrl.rollout.http_agent): trees by prefix
replay checked by request digest, failures counted per episode, protocol errors named, the agent endpoint's
validation and bearer token."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "episode_fn"))

from memrl.data.envs.gym import ReplayMismatchError  # noqa: E402
from memrl.data.errors import UserCodeError  # noqa: E402
from memrl.data.registry import ComponentError  # noqa: E402
from memrl.data.tasks import TaskSetConfig, load_tasks  # noqa: E402
from memrl.data.tasks.external import Outcome  # noqa: E402
from memrl.rollout.agents import task_rollout  # noqa: E402
from memrl.rollout.engines.scripted import ScriptedEngine  # noqa: E402
from memrl.rollout.episode_calls import CallChannel  # noqa: E402
from memrl.rollout.episodes import close_drivers  # noqa: E402
from memrl.rollout.http_agent import ModelEndpoint  # noqa: E402
from memrl.rollout.loop import EngineSet  # noqa: E402
from memrl.rollout.tree import TreeConfig, build_trees  # noqa: E402

MEMORY = {"name": "external", "sampling": {"note": {"temperature": 1.0, "max_tokens": 16}}}
TREE = TreeConfig(branch_roles=["note"], branch_factor=2, max_leaves=8, max_branch_depth=3)


class NoteWriter:
    """A scripted memory model: keeps the vault code in its note half of the time, else writes filler."""

    name = "note-writer"

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        found = re.search(r"vault code is \d{3}", messages[-1].content)
        return found.group(0) if found and rng.random() < 0.5 else f"nothing {rng.randint(0, 99)}"


class Echo:
    name = "echo"

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        return "ok " + messages[-1].content[:20]


def engines() -> EngineSet:
    return EngineSet(reasoner=ScriptedEngine(Echo(), name="reasoner"), memory=ScriptedEngine(NoteWriter(), name="m"))


def trees(tasks: TaskSetConfig) -> list[Any]:
    built, _ = build_trees(
        load_tasks(tasks, "t"), lambda task, rid: task_rollout(task, MEMORY, seed=1, rollout_id=rid), engines(), TREE
    )
    return built


def check_branched(built: list[Any]) -> None:
    groups: dict[str, list[str]] = {}
    for tree in built:
        for n in tree.nodes:
            if n.kind == "memory":
                groups.setdefault(n.group_id, []).append(n.call.text)
    assert any(len(set(texts)) >= 2 for texts in groups.values())
    assert {n.outcome for t in built for n in t.nodes if n.kind == "leaf"} == {0.0, 1.0}
    stats = [n.metadata["stats"] for t in built for n in t.nodes if n.kind == "leaf"]
    assert any(s.get("episode_replayed_calls") for s in stats)  # siblings re-ran the episode with the prefix replayed


# ------------------------------------------------------------------------------------------------ episode function
def test_an_episode_function_builds_trees_by_prefix_replay() -> None:
    cfg = TaskSetConfig(entry="episode:run", params={"corridor": 3, "max_turns": 8}, count=3)
    assert cfg.family == "episode"
    check_branched(trees(cfg))


calls = {"n": 0}


async def drifting(task: Any, memory: Any, reasoner: Any) -> Outcome:
    """Not replayable: its second request depends on a counter outside the episode."""
    await memory.generate([{"role": "user", "content": "start"}], role="note")
    calls["n"] += 1
    await memory.generate([{"role": "user", "content": f"run {calls['n']}"}], role="note")
    return Outcome(score=1.0)


async def crashing(task: Any, memory: Any, reasoner: Any) -> float:
    await memory.generate([{"role": "user", "content": "hello"}], role="note")
    if task.seed % 2:
        raise RuntimeError("the agent crashed")
    return 1.0


async def sleepy(task: Any, memory: Any, reasoner: Any) -> float:
    await memory.generate([{"role": "user", "content": "hello"}], role="note")
    if task.seed % 2:
        await asyncio.sleep(30)
    return 0.5


async def says_yes(task: Any, memory: Any, reasoner: Any) -> str:
    return "yes"


def plain(task: Any, memory: Any, reasoner: Any) -> float:
    return 1.0


def test_an_episode_that_does_not_replay_is_one_clear_error() -> None:
    with pytest.raises(ReplayMismatchError) as err:
        trees(TaskSetConfig(entry="test_episode_shapes:drifting", count=1))
    message = str(err.value)
    assert "episode 't-0'" in message and "diverged at model call 1 (memory 'note'" in message
    assert re.search(r"the logged request was 'user: run (\d+)' but the replay sent 'user: run (?!\1)\d+'", message)


def test_an_episode_that_raises_or_times_out_fails_alone() -> None:
    built = trees(TaskSetConfig(entry="test_episode_shapes:crashing", count=4))
    leaves = [n for t in built for n in t.nodes if n.kind == "leaf"]
    failed = [n for n in leaves if n.metadata["stats"].get("episode_errors")]
    assert failed and len(failed) < len(leaves) and all(n.outcome == 0.0 for n in failed)
    built = trees(TaskSetConfig(entry="test_episode_shapes:sleepy", count=2, episode_timeout_s=1.0))
    by_task = {t.task_id: [n for n in t.nodes if n.kind == "leaf"] for t in built}
    assert all(n.metadata["stats"].get("episode_timeouts") and n.outcome == 0.0 for n in by_task["t-1"])
    assert all(n.outcome == 0.5 for n in by_task["t-0"])


def test_protocol_errors_name_the_function() -> None:
    with pytest.raises(
        UserCodeError,
        match=r"test_episode_shapes:says_yes \(episode t-0--r--\w+\) returned str; it must return an Outcome",
    ):
        trees(TaskSetConfig(entry="test_episode_shapes:says_yes", count=1))
    with pytest.raises(
        ValueError, match="test_episode_shapes:plain is a plain function: an episode function must be 'async def run"
    ):
        TaskSetConfig(entry="test_episode_shapes:plain")
    with pytest.raises(ValueError, match="memory: 'sam' is a memory system of memrl's agent loop"):
        task_rollout(load_tasks(TaskSetConfig(entry="episode:run", count=1), "t")[0], {"name": "sam"})


# ------------------------------------------------------------------------------------------------------ HTTP agent
def test_an_http_agent_in_its_own_process_builds_trees_and_is_stopped() -> None:
    cfg = TaskSetConfig(
        family="http_agent",
        count=3,
        params={
            "command": [sys.executable, "-S", str(ROOT / "examples" / "http_agent" / "agent.py")],  # -S: no memrl
            "task": {"corridor": 3, "max_turns": 8},
            "episode_timeout_s": 60,
        },
    )
    try:
        check_branched(trees(cfg))
        from memrl.rollout.episodes import _DRIVERS
        from memrl.rollout.http_agent import HttpAgentDriver

        (driver,) = [d for d in _DRIVERS.values() if isinstance(d, HttpAgentDriver)]
        process = driver.process
        assert process is not None and process.poll() is None
        assert driver.endpoint.counts.get("calls_memory", 0) > 0
    finally:
        close_drivers()
    assert process.poll() is not None  # memrl stopped the agent it started


def test_an_agent_that_never_gets_healthy_is_named_and_stopped() -> None:
    cfg = TaskSetConfig(
        family="http_agent",
        count=1,
        params={"command": [sys.executable, "-c", "import time; time.sleep(60)"], "start_timeout_s": 1.0},
    )
    (task,) = load_tasks(cfg, "t")
    with pytest.raises(UserCodeError, match=r"did not answer GET /health with 200 within 1 s"):
        task_rollout(task, MEMORY)


def post(url: str, body: Any, headers: dict[str, str] | None = None, raw: bytes | None = None) -> httpx.Response:
    data = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(url, content=data, headers={"Content-Type": "application/json", **(headers or {})}, timeout=10)


def test_the_endpoint_validates_every_request() -> None:
    endpoint = ModelEndpoint()
    try:
        assert endpoint.host == "127.0.0.1"
        channel = CallChannel()
        endpoint.open("ep-1", channel)
        url = endpoint.base_url("ep-1") + "/chat/completions"
        assert post(endpoint.base_url("nope") + "/chat/completions", {"messages": []}).status_code == 404
        assert post(url, None, raw=b"{not json").status_code == 400
        assert post(url, {"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}).status_code == 400
        bad = post(url, {"model": "memory", "messages": [{"role": "robot", "content": "x"}]})
        assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]
        assert post(url, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}).status_code == 400
        assert post(url, None, raw=b"x" * (5 << 20)).status_code == 413
        endpoint.close_episode("ep-1")
        assert post(url, {"messages": [{"role": "user", "content": "x"}]}).status_code == 409
        assert channel.items.empty()  # nothing invalid reached the episode
        assert channel.rejected == 3  # the refusals of a known episode count in its stats (agent_rejected_requests)
    finally:
        endpoint.close()


def test_off_loopback_needs_a_bearer_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMRL_ENDPOINT_TOKEN", raising=False)
    with pytest.raises(ComponentError, match="set the environment variable MEMRL_ENDPOINT_TOKEN"):
        ModelEndpoint(host="0.0.0.0")
    monkeypatch.setenv("MEMRL_ENDPOINT_TOKEN", "s3cret-token")
    endpoint = ModelEndpoint(host="0.0.0.0")
    try:
        endpoint.open("ep-2", CallChannel())
        url = f"http://127.0.0.1:{endpoint.port}/episodes/ep-2/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}
        assert post(url, body).status_code == 401
        assert post(url, body, {"Authorization": "Bearer wrong"}).status_code == 401
        assert post(url, body, {"Authorization": "Bearer s3cret-token"}).status_code == 400  # past the token check
    finally:
        endpoint.close()
    assert "s3cret-token" not in json.dumps(endpoint.counts) and os.environ["MEMRL_ENDPOINT_TOKEN"]
