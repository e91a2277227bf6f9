"""`memrl data synth`: splits in JSONL and Arrow, stats, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memrl.data.config import load_config
from memrl.data.io import read_arrow, read_jsonl
from memrl.data.schemas import Episode
from memrl.data.synth import SynthConfig, run_synth

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
    from memrl.launch.cli import main

    assert main(["data", "synth", *SMALL, f"run.output_dir={tmp_path}", "run.name=cli"]) == 0
    assert (tmp_path / "cli" / "train.jsonl").is_file()
    assert main(["data", "synth", "sources=[{family: ama, count: 1}]", f"run.output_dir={tmp_path}"]) == 2


def test_unknown_keys_are_config_errors() -> None:
    from memrl.data.config import ConfigError

    with pytest.raises(ConfigError, match="unknown key"):
        load_config(SynthConfig, None, ["sources=[{family: sam, colour: red}]"])


@pytest.mark.parametrize(
    ("source", "unread"),
    [
        ("{family: proactive, target_tokens: [4096]}", "target_tokens not read by family 'proactive'"),
        ("{family: proactive, noise: 0.3}", "noise not read by family 'proactive'"),
        ("{family: sam, env: gridworld, qa_per_type: 5}", "env, qa_per_type not read by family 'sam'"),
        ("{family: sam, noise: 0.5}", "noise not read by family 'sam'"),
    ],
)
def test_options_a_family_does_not_read_are_config_errors(source: str, unread: str) -> None:
    from memrl.data.config import ConfigError

    with pytest.raises(ConfigError, match=rf"sources\.0.*option\(s\) {unread}"):
        load_config(SynthConfig, None, [f"sources=[{source}]"])


def test_params_are_checked_against_the_family_at_load() -> None:
    from memrl.data.config import ConfigError

    with pytest.raises(ConfigError, match=r"params of a gridworld ama source: field 'chain_lenght'"):
        load_config(
            SynthConfig,
            None,
            ["sources=[{family: ama, env: gridworld, target_tokens: [4096], params: {chain_lenght: 2}}]"],
        )
    with pytest.raises(ConfigError, match=r"params of a sam source: field 'n_evidence'"):
        load_config(SynthConfig, None, ["sources=[{family: sam, target_tokens: [4096], params: {n_evidence: 3}}]"])
    with pytest.raises(ConfigError, match=r"params of a proactive source: field 'facts': unknown kinds \['colour'\]"):
        load_config(SynthConfig, None, ["sources=[{family: proactive, params: {facts: [interpreter, colour]}}]"])


def test_a_runs_config_yaml_loads_again(tmp_path: Path) -> None:
    # config.yaml spells out every option, the unread defaults of sam / proactive sources included
    out = _run(tmp_path, "r")
    again = load_config(SynthConfig, out / "config.yaml")
    assert [s.family for s in again.sources] == ["ama", "ama", "sam", "proactive"]


CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def test_tiny_recipe_loads_and_writes_every_family(tmp_path: Path) -> None:
    from memrl.data.tasks import check_episode_qa

    cfg = load_config(SynthConfig, CONFIGS / "synth_tiny.yaml", [f"run.output_dir={tmp_path}", "arrow=false"])
    assert cfg.command == "data synth"
    assert {s.family for s in cfg.sources} == {"ama", "sam", "proactive"}
    assert {s.env for s in cfg.sources if s.family == "ama"} == {"textworld", "gridworld"}
    assert run_synth(cfg) == 0
    episodes = read_jsonl(tmp_path / "synth-tiny" / "train.jsonl", Episode)
    assert {e.metadata["family"] for e in episodes} == {"ama", "sam", "proactive"}
    assert all(check_episode_qa(e) == [] for e in episodes)


def test_ama_bins_recipe_covers_both_worlds_at_every_bin() -> None:
    from memrl.data.synth import build_episodes

    cfg = load_config(SynthConfig, CONFIGS / "synth_ama_bins.yaml")
    assert cfg.command == "data synth"
    bins = [4096, 8192, 16384, 32768, 65536, 131072]
    assert {(s.env, tuple(s.target_tokens)) for s in cfg.sources} == {
        ("textworld", tuple(bins)),
        ("gridworld", tuple(bins)),
    }
    # the recipe's difficulty vectors at the two smallest bins, one episode each, keep this fast (every bin is
    # covered with the default vectors in test_data_envs.py, and the recipe's stats.json reports each bin's error)
    small = cfg.model_copy(
        update={
            "sources": [s.model_copy(update={"count": 1, "target_tokens": bins[:2]}) for s in cfg.sources],
            "eval_fraction": 0.0,
        }
    )
    train, held = build_episodes(small)
    assert not held and len(train) == 4
    for episode in train:
        target = episode.metadata["target_tokens"]
        assert episode.horizon_tokens is not None and abs(episode.horizon_tokens - target) / target < 0.10
