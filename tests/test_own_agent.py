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
