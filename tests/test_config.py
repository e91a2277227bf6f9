from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
import yaml

from memrl.data.config import ConfigError, ConfigModel, RunConfig, config_hash, load_config
from memrl.data.run_dir import prepare_run_dir


class OptimSection(ConfigModel):
    lr: float = 1e-5
    warmup_steps: int = 0


class EngineSection(ConfigModel):
    backend: Literal["vllm", "hf", "openai", "scripted"] = "hf"
    model: str


class Endpoint(ConfigModel):
    url: str
    api_key_env: str = "OPENAI_API_KEY"


class ToyConfig(ConfigModel):
    command: Literal["toy"] = "toy"
    run: RunConfig = RunConfig()
    train: OptimSection = OptimSection()
    engine: EngineSection
    endpoints: list[Endpoint] = []


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cfg.yaml"
    p.write_text(text)
    return p


def test_load_file_and_defaults(tmp_path: Path) -> None:
    cfg = load_config(ToyConfig, write(tmp_path, "engine:\n  model: tiny\ntrain:\n  lr: 0.001\n"))
    assert cfg.engine.model == "tiny"
    assert cfg.train.lr == pytest.approx(1e-3)
    assert cfg.train.warmup_steps == 0


def test_dotted_overrides_win_and_are_typed(tmp_path: Path) -> None:
    path = write(tmp_path, "engine:\n  model: tiny\n")
    cfg = load_config(ToyConfig, path, ["train.lr=1e-6", "train.warmup_steps=7", "engine.backend=vllm"])
    assert cfg.train.lr == pytest.approx(1e-6)
    assert cfg.train.warmup_steps == 7
    assert cfg.engine.backend == "vllm"


def test_override_creates_missing_section() -> None:
    cfg = load_config(ToyConfig, None, ["engine.model=m", "run.seed=3"])
    assert cfg.run.seed == 3 and cfg.engine.model == "m"


def test_unknown_key_in_file_names_file_line_and_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, "engine:\n  model: tiny\ntrain:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError) as info:
        load_config(ToyConfig, path)
    msg = str(info.value)
    assert "unknown key 'train.lrr'" in msg
    assert f"{path}:4" in msg
    assert "did you mean 'train.lr'" in msg


def test_unknown_key_inside_list_item(tmp_path: Path) -> None:
    path = write(tmp_path, "engine:\n  model: tiny\nendpoints:\n  - url: http://x\n    api_key_evn: K\n")
    with pytest.raises(ConfigError) as info:
        load_config(ToyConfig, path)
    assert "did you mean 'endpoints.0.api_key_env'" in str(info.value)


def test_unknown_override_key_suggests() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(ToyConfig, None, ["engine.model=m", "train.warmup=3"])
    msg = str(info.value)
    assert "unknown key 'train.warmup'" in msg and "did you mean 'train.warmup_steps'" in msg


def test_unknown_top_level_key_without_close_match_lists_valid_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(ToyConfig, write(tmp_path, "engine:\n  model: m\nzzzzzz: 1\n"))
    assert "valid keys here" in str(info.value) and "engine" in str(info.value)


def test_wrong_type_names_key_and_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(ToyConfig, write(tmp_path, "engine:\n  model: m\ntrain:\n  warmup_steps: many\n"))
    msg = str(info.value)
    assert "train.warmup_steps" in msg and "'many'" in msg and ":4" in msg


def test_wrong_literal_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(ToyConfig, None, ["engine.model=m", "engine.backend=tgi"])
    assert "engine.backend" in str(info.value) and "command-line override" in str(info.value)


def test_missing_required_value() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(ToyConfig, None, [])
    assert "missing required value 'engine'" in str(info.value)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match=r"config file not found: nope\.yaml"):
        load_config(ToyConfig, "nope.yaml")


def test_invalid_yaml_reports_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cfg.yaml:3: invalid YAML"):
        load_config(ToyConfig, write(tmp_path, "engine:\n  model: m\n bad: 1\n"))


def test_malformed_override() -> None:
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(ToyConfig, None, ["engine.model"])


def test_resolved_config_written_and_reloadable(tmp_path: Path) -> None:
    cfg = load_config(ToyConfig, None, ["engine.model=m", f"run.output_dir={tmp_path}", "run.name=r1"])
    run_dir = prepare_run_dir(cfg, cfg.run, "toy")
    written = run_dir / "config.yaml"
    assert written.is_file()
    data = yaml.safe_load(written.read_text())
    assert data["train"]["lr"] == pytest.approx(1e-5)  # defaults are explicit
    again = load_config(ToyConfig, written)
    assert again == cfg and config_hash(again) == config_hash(cfg)


def test_existing_run_dir_needs_resume(tmp_path: Path) -> None:
    cfg = load_config(ToyConfig, None, ["engine.model=m", f"run.output_dir={tmp_path}", "run.name=r1"])
    prepare_run_dir(cfg, cfg.run, "toy")
    with pytest.raises(ConfigError, match="--resume"):
        prepare_run_dir(cfg, cfg.run, "toy")
    cfg.run.resume = True
    assert prepare_run_dir(cfg, cfg.run, "toy").is_dir()


SHIPPED = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_config_validates_against_its_command(path: Path) -> None:
    """Each recipe under configs/ names its command, and that command's config class accepts it as written."""
    from memrl.launch.jobs import JOBS

    command = yaml.safe_load(path.read_text())["command"]
    jobs = {" ".join(job.path): job for job in JOBS}
    assert command in jobs, f"{path.name}: unknown command {command!r}"
    cfg = load_config(jobs[command].load("config"), path)
    assert cfg.command == command
