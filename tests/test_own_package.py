"""Bring your own agent, from outside the checkout: memrl installed as a wheel into a fresh venv, and a folder with
its own package defining a task (a Gym-style game), a memory system and a reward term, named only in its YAML, trains
with `memrl train oat-grpo`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.commands import run_ok
from tests.wheel_venv import wheel_venv

GAME = '''
import random


class WordGame:
    """A word is shown first; after `gap` rooms the door asks for it."""

    task = "Remember the password and say it at the door."

    def __init__(self, gap: int = 3):
        self.gap = gap

    def reset(self, seed):
        rng = random.Random(seed)
        self.word = rng.choice(["apple", "river", "stone", "cloud", "ember", "maple"])
        self.pos = 0
        return f"the password is {self.word}"

    def step(self, action):
        if self.pos < self.gap:
            self.pos += 1
            if self.pos < self.gap:
                return f"an empty room {self.pos}", 0.0, False, {"admissible_actions": ["walk"]}
            return "a door asks for the password", 0.0, False, {}
        won = action == f"say {self.word}"
        return ("the door opens" if won else "the door stays shut"), float(won), True, {"outcome": float(won)}
'''

MEMORY = '''
from typing import Any, Literal

from memrl.api import MemoryConfigBase, MemoryRequest, MemorySystem, RoleSampling, register_memory


class DiaryConfig(MemoryConfigBase):
    name: Literal["diary"] = "diary"
    sampling: dict[str, RoleSampling] = {"diary": RoleSampling(temperature=1.0, max_tokens=12)}


@register_memory("diary", config=DiaryConfig)
class Diary(MemorySystem):
    """One diary line per observation, written by the memory model; the reasoner sees the diary and the last turn."""

    name = "diary"

    def __init__(self, config: DiaryConfig):
        super().__init__()
        self.config = config

    def reset(self, task, metadata):
        self.task, self.lines, self.last, self.pending = task, [], None, None

    def on_turn(self, turn):
        self.last = turn
        self.pending = MemoryRequest("diary", [{"role": "user", "content": turn.observation}],
                                     self.config.sampling["diary"])

    def next_memory_request(self):
        return self.pending

    def on_memory_result(self, request, call):
        self.lines.append(call.text.strip()[:60])
        self.pending = None

    def reasoner_messages(self, system_prompt):
        diary = "\\n".join(self.lines)
        return [{"role": "system", "content": "act"}, {"role": "user", "content": f"{self.task}\\n{diary}"},
                {"role": "user", "content": self.last.observation if self.last else ""}]
'''

REASONER = """
import json
import re

from memrl.api import register_reasoner


@register_reasoner("word_player")
class WordPlayer:
    name = "word-player"

    def respond(self, messages, rng, metadata):
        text = "\\n".join(m.content for m in messages)
        if "admissible actions" in messages[-1].content or "password is" in messages[-1].content:
            action = "walk"
        else:
            found = re.findall(r"password is (\\w+)", text)
            action = f"say {found[-1] if found else 'nothing'}"
        return "<tool_call>" + json.dumps({"name": "act", "arguments": {"action": action}}) + "</tool_call>"
"""

TERMS = '''
from memrl.api import register_reward


@register_reward("shares_letters")
def shares_letters(node, tree):
    """The share of the prompt's letters (a-z) that the diary line repeats."""
    if node.call is None:
        return None
    seen = set(node.call.messages[-1].content) & set("abcdefghijklmnopqrstuvwxyz")
    return len(seen & set(node.call.text)) / max(len(seen), 1)
'''

CONFIG = """command: train oat-grpo
run: {{output_dir: runs, name: own, seed: 0}}
policy: {{base: {model}, dtype: float32}}
engine: {{backend: hf, name: policy, model: {model}, dtype: float32, batch_size: 16}}
reasoner: {{backend: scripted, name: reasoner, scripted_policy: "myagent.reasoner:WordPlayer"}}
memory: {{entry: "myagent.memory:Diary"}}
train_tasks: {{entry: "myagent.game:WordGame", params: {{gap: 2}}, max_steps: 8, count: 16, seed: 0}}
eval_tasks: {{count: 2, seed: 1000}}
tasks_per_iteration: 2
tree: {{branch_roles: [diary], branch_factor: 2, max_branch_depth: 2, max_leaves: 4}}
credit: {{terms: [{{entry: "myagent.terms:shares_letters", weight: 0.5}}], advantage: grpo_std}}
trainer: {{lr: 1.0e-3, bf16: false, lora: {{enabled: false}}}}
loop: {{iterations: 2, checkpoint_every: 1}}
eval_samples: 0
"""


# protects: a built wheel in a fresh venv trains a user's own package
@pytest.mark.slow
def test_a_wheel_trains_a_package_of_your_own(tmp_path: Path, tiny_model_dir: Path) -> None:
    python, _ = wheel_venv(tmp_path)
    venv = python.parent.parent
    user = tmp_path / "my_project"
    package = user / "myagent"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name, text in (("game", GAME), ("memory", MEMORY), ("reasoner", REASONER), ("terms", TERMS)):
        (package / f"{name}.py").write_text(text)
    (user / "config.yaml").write_text(CONFIG.format(model=tiny_model_dir))
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "WANDB_MODE": "offline",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    run_ok([str(venv / "bin" / "memrl"), "train", "oat-grpo", "--config", "config.yaml"], cwd=user, env=env)
    run = user / "runs" / "own"
    resolved = (run / "config.yaml").read_text()
    assert "myagent.memory:Diary" in resolved and "myagent.terms:shares_letters" in resolved
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r["step"] >= 0]
    assert len(trained) == 2 and trained[-1]["updates"] >= 1 and trained[0]["memory_calls_trained"] > 0
    nodes = [n for line in (run / "trees_last.jsonl").read_text().splitlines() for n in json.loads(line)["nodes"]]
    assert {n["call"]["role"] for n in nodes if n["kind"] == "memory"} == {"diary"}
    where = run_ok([str(python), "-c", "import memrl.api; print(memrl.api.__file__)"], cwd=user, env=env).stdout
    assert "/site-packages/memrl/" in where  # the wheel's memrl, not the checkout's
