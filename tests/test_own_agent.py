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
