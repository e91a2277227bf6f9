"""The seams of bringing your own agent: every command loads a config the same way (its folder and the working
directory on the import path), a family without a default memory system asks for one, SAM's protocol through
``memrl.api``, outcome semantics (won / outcome / truncated), re-entry counts in the metrics."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEMRL = [sys.executable, "-m", "memrl.launch.cli"]

GAME = """
class Game:
    task = "say hi"
    def reset(self, seed):
        return "hello"
    def step(self, action):
        return "bye", 1.0, True, {"won": True}
"""


def memrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([*MEMRL, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_config_show_imports_components_beside_the_config(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "hello_game.py").write_text(GAME)
    (folder / "config.yaml").write_text(
        "command: train oat-grpo\npolicy: {base: x}\nmemory: {name: long_context}\n"
        "train_tasks: {entry: 'hello_game:Game'}\ncredit: {terms: [{name: length, weight: 0.1}]}\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shown = memrl("config", "show", "--config", str(folder / "config.yaml"), cwd=elsewhere)
    assert shown.returncode == 0, shown.stderr
    assert "entry: hello_game:Game" in shown.stdout


def test_a_gym_family_without_memory_must_name_one(tmp_path: Path) -> None:
    (tmp_path / "hello_game.py").write_text(GAME)
    config = tmp_path / "config.yaml"
    config.write_text(
        "command: train oat-grpo\npolicy: {base: x}\ntrain_tasks: {entry: 'hello_game:Game'}\n"
        "credit: {terms: [{name: length, weight: 0.1}]}\n"
    )
    shown = memrl("config", "show", "--config", str(config), cwd=tmp_path)
    assert shown.returncode == 2
    assert "key 'memory': task family 'hello_game:Game' has no default memory system" in shown.stderr
    assert "sam, " in shown.stderr and "long_context" in shown.stderr  # the choices
    (tmp_path / "distill.yaml").write_text(
        "command: data distill\ntasks: {entry: 'hello_game:Game'}\n"
        "reasoner: {backend: scripted, name: r, scripted_policy: sam}\n"
        "expert: {backend: scripted, name: e, scripted_policy: sam}\n"
    )
    distill = memrl(
        "data", "distill", "--config", str(tmp_path / "distill.yaml"), f"run.output_dir={tmp_path}", cwd=tmp_path
    )
    assert distill.returncode == 2 and "memory: task family 'hello_game:Game' has no default" in distill.stderr
    assert not (tmp_path / "distill").exists()


def courier_folder(root: Path) -> Path:
    """The courier game of docs/own_agent.md (its ``write`` blocks) saved under ``root``; ``root`` on sys.path."""
    from tests.tutorial_blocks import parse_page

    for block in parse_page(ROOT / "docs" / "own_agent.md"):
        if block.get("write") and block.get("write")[-1].startswith("courier/"):
            path = root / block.get("write")[-1]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.script())
    sys.path.insert(0, str(root / "courier"))
    return root / "courier"


class _SilentExpert:
    """An expert memory model that writes cues but never recalls anything (empty output)."""

    def __init__(self, expert: object) -> None:
        self.expert = expert

    def respond(self, messages: list, rng: object, metadata: dict) -> str:
        return "" if metadata["role"] == "recall" else self.expert.respond(messages, rng, metadata)


def test_a_reasoner_and_expert_on_memrl_api_play_sam(tmp_path: Path) -> None:
    courier_folder(tmp_path)
    try:
        from agents import CourierExpert, CourierPlayer

        from memrl.api import SamRecalled, SamRecallFailed, read_sam_context
        from memrl.data.tasks import TaskSetConfig, load_tasks
        from memrl.rollout.agents import task_rollout
        from memrl.rollout.engines.scripted import ScriptedEngine
        from memrl.rollout.loop import EngineSet, run_rollouts

        memory = {"name": "sam", "page_turns": 1, "live_capacity_turns": 3, "keep_recent_turns": 2}
        tasks = load_tasks(TaskSetConfig(entry="courier:CourierGame", params={"corridor": 4}, max_steps=12, count=4))
        seen: list = []

        class Watching(CourierPlayer):
            def respond(self, messages, rng, metadata):
                seen.append(read_sam_context(messages))
                return super().respond(messages, rng, metadata)

        for expert, won in ((CourierExpert(), 1.0), (_SilentExpert(CourierExpert()), 0.0)):
            seen.clear()
            engines = EngineSet(reasoner=ScriptedEngine(Watching()), memory=ScriptedEngine(expert))
            traces = run_rollouts([task_rollout(t, memory, rollout_id="r") for t in tasks], engines)
            assert [t.outcome for t in traces] == [won] * 4
            results = [c.last_result for c in seen if c.last_result is not None]
            assert results and all(isinstance(r, SamRecalled if won else SamRecallFailed) for r in results)
            assert any("the parcel's room" in c.cues.values() for c in seen)  # the expert's cue in the bank
            if not won:  # a failed recall is a result: two of them and the player gives up (no endless asking)
                assert max(len(c.memory_calls) for c in seen) == 2
                assert "the memory model gave no usable recall" in results[0].error
    finally:
        sys.path.remove(str(tmp_path / "courier"))
        for name in ("agents", "courier"):
            sys.modules.pop(name, None)
