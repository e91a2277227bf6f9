"""docs/configs.md is generated from the config models and must match them."""

from __future__ import annotations

from memrl.launch.config_reference import DEFAULT_OUT, main, reference
from memrl.launch.jobs import JOBS


def test_committed_reference_is_up_to_date() -> None:
    assert main(["--check"]) == 0, "docs/configs.md is stale: run python -m memrl.launch.config_reference"


def test_reference_covers_every_command_with_types_defaults_bounds_and_meanings() -> None:
    text = reference()
    for job in JOBS:
        assert f"## `memrl {' '.join(job.path)}`" in text
    # a line comment in the model's source becomes the key's meaning, its Field bounds its bounds column; a nested
    # section links to its table
    horizon = "| `horizon` | int | `12` | >= 1, <= 100000 | tour steps before the question, for distillation and RL |"
    assert horizon in text
    assert "| `run` | RunConfig | (section) |  | see [RunConfig](#runconfig) |" in text
    assert "| `policy` | PolicySpec | **required** |" in text  # a key without a default is marked required
    assert "| `trainer.lr` | float | `1e-05` | >= 0, <= 1 |" in text
    assert DEFAULT_OUT.name == "configs.md"
