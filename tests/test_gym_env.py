"""The Gym-style environment adapter (memrl.data.envs.gym): tasks named by import path, memory-call trees over a
user's environment, re-entry by replay (checked step by step) or snapshot/restore, failures counted per episode."""

from __future__ import annotations

import copy
import random
import re
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "gym_env"))

from components import VaultPlayer  # noqa: E402
from vault_game import VaultGame  # noqa: E402

from memrl.data.envs.gym import GymTask, ReplayMismatchError  # noqa: E402
from memrl.data.errors import UserCodeError  # noqa: E402
from memrl.data.tasks import TaskSetConfig, load_tasks  # noqa: E402
from memrl.rollout.agents import task_rollout  # noqa: E402
from memrl.rollout.engines.scripted import ScriptedEngine  # noqa: E402
from memrl.rollout.loop import EngineSet, run_rollouts  # noqa: E402
from memrl.rollout.tree import TreeConfig, build_trees  # noqa: E402

MEMORY = {"entry": "components:NotesMemory", "every": 1, "window": 1}


class NoteWriter:
    """A scripted memory model: keeps the vault code in its note half of the time, else writes filler."""

    name = "note-writer"

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        found = re.search(r"vault code is \d{3}", messages[-1].content)
        return found.group(0) if found and rng.random() < 0.5 else f"nothing {rng.randint(0, 99)}"


class SnapshotVault(VaultGame):
    """The vault game with snapshot/restore."""

    def snapshot(self) -> Any:
        return copy.deepcopy(self.__dict__)

    def restore(self, state: Any) -> None:
        self.__dict__.update(copy.deepcopy(state))


class NoisyVault(VaultGame):
    """Not deterministic given the seed: the posters change between runs."""

    runs = 0

    def reset(self, seed: int) -> str:
        NoisyVault.runs += 1
        first = super().reset(seed)
        self.decoys = [f"{NoisyVault.runs % 900 + 100}"] * self.corridor
        return first


class FlakyVault(VaultGame):
    """Raises in the corridor of odd seeds."""

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self.pos == 2 and self.code and int(self.code) % 2:
            raise ConnectionError("the game server went away")
        return super().step(action)


def engines() -> EngineSet:
    return EngineSet(
        reasoner=ScriptedEngine(VaultPlayer(), name="reasoner"), memory=ScriptedEngine(NoteWriter(), name="memory")
    )


def trees_of(entry: str, reentry: str = "auto", count: int = 3) -> list[Any]:
    tasks = load_tasks(TaskSetConfig(entry=entry, params={"corridor": 3}, count=count, reentry=reentry), "t")
    cfg = TreeConfig(branch_roles=["note"], branch_factor=2, max_leaves=8, max_branch_depth=3)
    trees, _ = build_trees(tasks, lambda task, rid: task_rollout(task, MEMORY, seed=1, rollout_id=rid), engines(), cfg)
    return trees


def test_a_gym_env_named_by_import_path_builds_memory_call_trees() -> None:
    cfg = TaskSetConfig(entry="vault_game:VaultGame", params={"corridor": 3}, count=3)
    assert cfg.family == "gym"
    trees = trees_of("vault_game:VaultGame")
    groups: dict[str, list[str]] = {}
    for tree in trees:
        for n in tree.nodes:
            if n.kind == "memory":
                groups.setdefault(n.group_id, []).append(n.call.text)
    assert any(len(set(texts)) >= 2 for texts in groups.values())  # sibling notes that differ
    outcomes = {n.outcome for t in trees for n in t.nodes if n.kind == "leaf"}
    assert outcomes == {0.0, 1.0}  # the code kept in a note opens the vault; a filler note does not
    leaf = next(n for t in trees for n in t.nodes if n.kind == "leaf")
    assert leaf.metadata["stats"]["env_steps"] >= 4 and leaf.metadata["stats"]["env_reentry_replay"] >= 1


def test_replay_gives_the_trees_snapshot_restore_gives() -> None:
    def summary(trees: list[Any]) -> list[Any]:
        return [[(n.node_id, n.call.text if n.call else None, n.outcome) for n in t.nodes] for t in trees]

    by_replay = trees_of("test_gym_env:SnapshotVault", reentry="replay")
    by_snapshot = trees_of("test_gym_env:SnapshotVault", reentry="snapshot")
    assert summary(by_replay) == summary(by_snapshot)
    stats = [n.metadata["stats"] for t in by_snapshot for n in t.nodes if n.kind == "leaf"]
    assert any(s.get("env_reentry_snapshot") for s in stats) and not any(s.get("env_reentry_replay") for s in stats)


def test_a_non_deterministic_env_is_one_clear_error() -> None:
    with pytest.raises(ReplayMismatchError) as err:
        trees_of("test_gym_env:NoisyVault", count=1)
    message = str(err.value)
    assert "episode 't-0'" in message and "diverged at step 1 (action 'go north')" in message
    assert "the locker code is" in message and "replay gave" in message and "snapshot()/restore()" in message


def test_an_env_that_raises_fails_its_episode_not_the_run() -> None:
    trees = trees_of("test_gym_env:FlakyVault", count=4)
    leaves = [n for t in trees for n in t.nodes if n.kind == "leaf"]
    failed = [n for n in leaves if n.metadata["stats"].get("env_errors")]
    assert failed and all(n.outcome == 0.0 for n in failed)
    assert len(failed) < len(leaves)  # the other episodes ran to the end


def test_admissible_actions_reach_the_reasoner_but_not_the_memory() -> None:
    (task,) = load_tasks(TaskSetConfig(entry="vault_game:VaultGame", params={"corridor": 1}, count=1), "t")
    seen: list[list[str]] = []

    def record(rollout: Any, call: Any, result: Any) -> None:
        if call.kind == "reasoner":
            seen.append([m.content for m in call.request.messages])

    rollout = task_rollout(task, MEMORY, seed=0)
    (trace,) = run_rollouts([rollout], engines(), on_result=record)
    assert any(msgs[-1] == "admissible actions:\ngo north" for msgs in seen)
    assert all("admissible actions" not in t.observation for t in rollout.memory.turns)
    assert trace.outcome in (0.0, 1.0)


class NoStep:
    def reset(self, seed: int) -> str:
        return "hello"


def test_a_class_without_step_is_refused_naming_it() -> None:
    with pytest.raises(
        ValueError,
        match=r"test_gym_env:NoStep does not implement the Gym-style environment "
        r"protocol: missing method 'step'",
    ):
        TaskSetConfig(entry="test_gym_env:NoStep")


def test_a_wrong_step_return_names_the_protocol() -> None:
    class Bad(VaultGame):
        def step(self, action: str) -> Any:
            return "just text"

    task = GymTask.__new__(GymTask)
    from memrl.data.envs.gym import GymFactory

    task.__init__(GymFactory(Bad), seed=0, task_id="x")
    task.reset()
    with pytest.raises(UserCodeError, match=r"step\(action\) returned str \(episode 'x'\); the protocol is"):
        task.step("go north")


class PromptedVault(VaultGame):
    reasoner_system = "You are a careful vault cracker. Answer with one tool call."


def test_an_env_class_sets_the_reasoners_system_prompt() -> None:
    (own,) = load_tasks(TaskSetConfig(entry="test_gym_env:PromptedVault", params={"corridor": 1}, count=1), "t")
    (plain,) = load_tasks(TaskSetConfig(entry="vault_game:VaultGame", params={"corridor": 1}, count=1), "t")
    assert task_rollout(own, MEMORY, seed=0).reasoner_system == PromptedVault.reasoner_system
    default = task_rollout(plain, MEMORY, seed=0)
    assert default.reasoner_system == default.memory.reasoner_system != PromptedVault.reasoner_system
