"""`memrl data synth`: splits in JSONL and Arrow, stats, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data.config import load_config
from data.io import read_arrow, read_jsonl
from data.schemas import Episode
from data.synth import SynthConfig, run_synth

SMALL = [
    "sources=[{family: ama, env: gridworld, count: 2, target_tokens: [1024, 2048]},"
    " {family: ama, env: textworld, count: 2, target_tokens: [1024]},"
    " {family: sam, count: 4, params: {horizon_steps: 12}},"
    " {family: proactive, count: 4, params: {n_subtasks: 10}}]",
    "eval_fraction=0.5",
]


def _run(tmp_path: Path, name: str, seed: int = 0) -> Path:
    cfg = load_config(SynthConfig, None, [*SMALL, f"run.output_dir={tmp_path}", f"run.name={name}", f"run.seed={seed}"])
    assert run_synth(cfg) == 0
    return tmp_path / name


def _arrow_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*.arrow"))}


def test_same_config_and_seed_give_identical_files(tmp_path: Path) -> None:
    a, b = _run(tmp_path, "a"), _run(tmp_path, "b")
    for name in ("train.jsonl", "eval.jsonl", "stats.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    for split in ("train.arrow", "eval.arrow"):
        assert _arrow_bytes(a / split) == _arrow_bytes(b / split)
    c = _run(tmp_path, "c", seed=1)
    assert (a / "train.jsonl").read_bytes() != (c / "train.jsonl").read_bytes()


def test_splits_stats_and_arrow_agree(tmp_path: Path) -> None:
    out = _run(tmp_path, "s")
    train = read_jsonl(out / "train.jsonl", Episode)
    held = read_jsonl(out / "eval.jsonl", Episode)
    assert read_arrow(out / "train.arrow", Episode) == train
    assert len(train) == 7 and len(held) == 7  # half of each of the 14 episodes (2+2+2 ama, 4 sam, 4 proactive)
    assert not {e.episode_id for e in train} & {e.episode_id for e in held}
    stats = json.loads((out / "stats.json").read_text())
    assert stats["train"]["episodes"] == 7
    assert set(stats["train"]["qa_by_type"]) == {"A", "B", "C", "D"}
    assert sum(stats["train"]["token_histogram"].values()) == 7
    assert all(err < 0.1 for err in stats["train"]["max_relative_target_error"].values())
    assert (out / "config.yaml").is_file()


def test_cli_runs_the_job(tmp_path: Path) -> None:
    from launch.cli import main

    assert main(["data", "synth", *SMALL, f"run.output_dir={tmp_path}", "run.name=cli"]) == 0
    assert (tmp_path / "cli" / "train.jsonl").is_file()
    assert main(["data", "synth", "sources=[{family: ama, count: 1}]", f"run.output_dir={tmp_path}"]) == 2


def test_unknown_keys_are_config_errors() -> None:
    from data.config import ConfigError

    with pytest.raises(ConfigError, match="unknown key"):
        load_config(SynthConfig, None, ["sources=[{family: sam, colour: red}]"])
