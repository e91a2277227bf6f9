"""The three worked examples (examples/*: a Gym env, an episode function, an HTTP agent in its own process), each
trained by `memrl train oat-grpo --config examples/<x>/config.yaml` on the tiny model: 2 iterations with K = 2, a
sibling group of distinct actions, a trainer step that changes the weights; and the same components through
`memrl data distill` and `memrl eval`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file
from test_own_agent import vault_eval_config

ROOT = Path(__file__).resolve().parents[1]
MEMRL = [sys.executable, "-m", "memrl.launch.cli"]

# protects: each worked example trains, distils and evaluates through `memrl` as a user runs it (its own files)
pytestmark = pytest.mark.slow


def memrl(*args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}
    return subprocess.run(
        [*MEMRL, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def weights(folder: Path) -> dict[str, object]:
    return load_file(str(folder / "model.safetensors"))


@pytest.mark.parametrize("example", ["gym_env", "episode_fn", "http_agent"])
def test_an_example_trains_with_oat_grpo(example: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    # The tiny model never wins these games, so every group ties on the outcome: the default advantage
    # (informative_only) trains nothing there, the paper's grpo_std lets the shaping terms rank the siblings.
    done = memrl(
        "train",
        "oat-grpo",
        "--config",
        f"examples/{example}/config.yaml",
        f"policy.base={tiny_model_dir}",
        f"engine.model={tiny_model_dir}",
        f"run.output_dir={tmp_path}",
        "run.name=run",
        "credit.advantage=grpo_std",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 0]
    assert len(steps) == 2 and steps[-1]["updates"] >= 1 and steps[0]["memory_calls_trained"] > 0
    groups: dict[str, set[str]] = {}
    for line in (run / "trees_last.jsonl").read_text().splitlines():
        for node in json.loads(line)["nodes"]:
            if node["kind"] == "memory" and node["metadata"].get("samples", 1) >= 2:
                groups.setdefault(node["group_id"], set()).add(node["call"]["text"])
    assert any(len(texts) >= 2 for texts in groups.values())  # K = 2 siblings that differ
    newest = max((run / "policy").glob("v*"))  # the last version the trainer saved
    assert newest.name != "v00000"
    before, after = weights(tiny_model_dir), weights(newest)
    assert any(not before[k].equal(after[k]) for k in before)  # the trainer's steps changed the weights
    if example == "http_agent":
        log = (run / "run.log").read_text()
        pid = int(log.split("started the agent (pid ")[1].split(")")[0])
        assert pid != os.getpid() and not Path(f"/proc/{pid}").exists()  # its own process, stopped at the end


def test_the_gym_example_distils_and_evaluates_through_its_components(tmp_path: Path) -> None:
    done = memrl(
        "data", "distill", "--config", "examples/gym_env/distill.yaml", f"run.output_dir={tmp_path}", "tasks.count=6"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sft = tmp_path / "gym-vault-distill" / "sft"
    rows = [json.loads(line) for line in (sft / "note.jsonl").read_text().splitlines()]
    assert rows and all(r["messages"][-1]["role"] == "assistant" for r in rows)
    assert any("vault code is" in r["messages"][-1]["content"] for r in rows)
    from memrl.train.sft_data import SFTDataConfig, load_role_rows

    assert len(load_role_rows(SFTDataConfig(dir=str(sft), roles=["note"]))["note"]) == len(rows)
    config = vault_eval_config(tmp_path, corridor=3, count=4, baselines=("long_context",))
    env_path = str(ROOT / "examples" / "gym_env")
    done = subprocess.run(
        [*MEMRL, "eval", "--config", str(config)],
        cwd=env_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in (tmp_path / "eval" / "results.jsonl").read_text().splitlines()]
    by_system = {s: [r["outcome"] for r in results if r["system"] == s] for s in {r["system"] for r in results}}
    assert by_system["notes"] == [1.0] * 4  # the expert's notes keep the code through the corridor
    assert by_system["long_context"] == [1.0] * 4  # the whole history is in the context (no memory model needed)


def test_a_component_missing_its_protocol_stops_before_any_run_folder(tmp_path: Path) -> None:
    (tmp_path / "badgame.py").write_text("class Game:\n    def reset(self, seed):\n        return 'hi'\n")
    config = tmp_path / "config.yaml"
    config.write_text(
        f"policy: {{base: x}}\nrun: {{output_dir: {tmp_path / 'runs'}}}\ntrain_tasks: {{entry: 'badgame:Game'}}\n"
    )
    done = memrl("train", "oat-grpo", "--config", str(config))
    assert done.returncode == 2
    assert "badgame:Game does not implement the Gym-style environment protocol: missing method 'step'" in done.stderr
    assert not (tmp_path / "runs").exists()
