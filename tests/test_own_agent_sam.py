"""A new environment of one's own, outside the repository, through every command: docs/own_agent.md's courier game
(a Gym-style class, a frozen reasoner and a SAM expert written against ``memrl.api`` only) saved in a temporary
folder, then the page's commands: ``config show``, ``data distill``, ``sft`` (20 steps), ``train oat-grpo`` (2
iterations) and ``eval``, each checked by what it wrote. About two minutes on a 2-core CPU."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest

from tests.commands import run_ok
from tests.tutorial_blocks import ROOT, parse_page

# protects: a user's own Gym environment, reasoner and SAM expert (memrl.api only) from a folder outside the
# repository through config show, distill, sft, train and eval on the CLI
pytestmark = pytest.mark.slow


def test_the_courier_game_goes_through_every_command_from_a_folder_of_its_own(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    blocks = [b for b in parse_page(ROOT / "docs" / "own_agent.md") if "courier/" in b.code or b.get("write")]
    for block in blocks:
        if block.get("write") and block.get("write")[-1].startswith("courier/"):
            path = tmp_path / block.get("write")[-1]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.script())
    (commands,) = [b for b in blocks if b.language == "bash" and "memrl eval --config courier/eval.yaml" in b.code]
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "tiny-model").symlink_to(tiny_model_dir, target_is_directory=True)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": "offline",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    }
    outputs = {}
    for line in commands.code.replace("\\\n", " ").splitlines():
        argv = shlex.split(line)
        assert argv[0] == "memrl"
        done = run_ok([sys.executable, "-m", "memrl.launch.cli", *argv[1:]], cwd=tmp_path, env=env, timeout=600)
        outputs[" ".join(argv[1:3])] = done.stdout
    assert "entry: courier:CourierGame" in outputs["config show"]
    runs = tmp_path / "runs"
    recalls = [json.loads(x) for x in (runs / "courier-distill" / "sft" / "recall.jsonl").read_text().splitlines()]
    assert recalls and all("deliver the parcel to room" in r["messages"][-1]["content"] for r in recalls)
    assert (runs / "courier-sft" / "final" / "model.safetensors").is_file()
    rows = [json.loads(x) for x in (runs / "courier" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r["step"] >= 0]
    assert len(trained) == 2 and trained[0]["memory_calls_trained"] > 0 and trained[-1]["updates"] >= 1
    results = [json.loads(x) for x in (runs / "courier-eval" / "results.jsonl").read_text().splitlines()]
    by_model = {m: [r["outcome"] for r in results if r["model"] == m] for m in ("expert", "trained")}
    assert by_model["expert"] == [1.0] * 4 and len(by_model["trained"]) == 4
