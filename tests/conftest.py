"""Shared fixtures: the tiny model (built once per machine, cached under .cache/models) and offline settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def model_cache() -> Path:
    """Where tiny models are cached between test runs."""
    return Path(os.environ.get("MEMRL_MODEL_CACHE", ROOT / ".cache" / "models"))


@pytest.fixture(scope="session")
def tiny_model_dir(model_cache: Path) -> Path:
    """The default tiny model (2 layers x 128, head_dim 64), built on first use."""
    from memrl.rollout.models import TinyModelSpec, ensure_tiny_model

    return ensure_tiny_model(model_cache, TinyModelSpec())
