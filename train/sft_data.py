"""The data of ``memrl sft``: which per-role datasets to train on (:class:`SFTDataConfig`), their rows checked against
the schema, a role mixture, a held-out split, and the rows as a conversational prompt-completion dataset."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from memrl.data.config import ConfigError, ConfigModel
from memrl.data.distill import load_sft_examples, role_file
from memrl.data.schemas import SFTExample

__all__ = ["SFTDataConfig", "load_role_rows", "mix_rows", "sft_dataset", "split_eval"]


class SFTDataConfig(ConfigModel):
    """Which per-role datasets to train on and how to mix them."""

    dir: str | None = Field(None, description="a `memrl data distill` output directory (<role>.jsonl / .arrow)")
    roles: list[str] | dict[str, float] = Field(
        ..., description="roles to train on: a list concatenates them, a {role: weight} map mixes them by share"
    )
    files: dict[str, str] = Field({}, description="role -> JSONL file or Arrow directory (overrides dir)")
    mixture_rows: int | None = Field(None, ge=1, description="rows of a weighted mixture (default: all rows)")
    eval_fraction: float = Field(0.0, ge=0.0, lt=1.0, description="share of each role held out for eval loss")
    max_eval_rows: int = Field(256, ge=1, description="cap on the held-out rows of each role")
    chat_template_kwargs: dict[str, Any] = Field({}, description="passed to the chat template, e.g. enable_thinking")

    @field_validator("roles")
    @classmethod
    def _some_roles(cls, roles: list[str] | dict[str, float]) -> list[str] | dict[str, float]:
        if not roles:
            raise ValueError("name at least one role")
        if isinstance(roles, dict) and any(w <= 0 for w in roles.values()):
            raise ValueError("mixture weights must be positive")
        return roles

    @model_validator(mode="after")
    def _sources(self) -> SFTDataConfig:
        missing = [r for r in self.role_names if r not in self.files and self.dir is None]
        if missing:
            raise ValueError(f"no dataset for roles {missing}: set data.dir or data.files")
        return self

    @property
    def role_names(self) -> list[str]:
        """The roles, in config order."""
        return list(self.roles)

    def source(self, role: str) -> Path:
        """The dataset of ``role``: ``files[role]``, else ``<dir>/<role>.jsonl``, else ``<dir>/<role>.arrow``."""
        if role in self.files:
            return Path(self.files[role])
        assert self.dir is not None
        jsonl = role_file(self.dir, role)
        return jsonl if jsonl.exists() else role_file(self.dir, role, ".arrow")


def load_role_rows(cfg: SFTDataConfig) -> dict[str, list[SFTExample]]:
    """The validated rows of every configured role."""
    out = {}
    for role in cfg.role_names:
        path = cfg.source(role)
        if not path.exists():
            raise ConfigError(f"dataset of role {role!r} not found: {path}")
        rows = load_sft_examples(path)
        if not rows:
            raise ConfigError(f"dataset of role {role!r} is empty: {path}")
        if (stray := next((i for i, r in enumerate(rows) if r.role != role), None)) is not None:
            where = f"{path}:{stray + 1}" if path.suffix == ".jsonl" else f"{path} row {stray}"
            raise ConfigError(
                f"{where}: field 'role': {rows[stray].role!r} in the dataset of role {role!r}; "
                "each role's file holds that role's rows only"
            )
        out[role] = rows
    return out


def mix_rows(
    rows: dict[str, list[SFTExample]], weights: dict[str, float] | None, total: int | None, seed: int
) -> list[SFTExample]:
    """Concatenate the roles (``weights`` None) or draw a mixture of ``total`` rows (default: all rows) in which each
    role has its weight's share: a role short of its share is repeated whole, then topped up with a random subset.
    Deterministic for ``seed``."""
    if weights is None:
        return [r for role_rows in rows.values() for r in role_rows]
    rng = random.Random(seed)
    size = total or sum(len(v) for v in rows.values())
    norm = sum(weights.values())
    out: list[SFTExample] = []
    for role, role_rows in rows.items():
        share = round(size * weights[role] / norm)
        order = list(role_rows)
        rng.shuffle(order)
        out += order * (share // len(order)) + order[: share % len(order)]
    rng.shuffle(out)
    return out


def split_eval(
    rows: dict[str, list[SFTExample]], fraction: float, cap: int, seed: int
) -> tuple[dict[str, list[SFTExample]], list[SFTExample]]:
    """Hold out ``fraction`` of each role (at most ``cap`` rows, none of a one-row role) for the eval loss; returns the
    remaining rows per role and the held-out rows. Deterministic for ``seed``."""
    if fraction <= 0:
        return rows, []
    rng = random.Random(seed)
    train, held = {}, []
    for role, role_rows in rows.items():
        order = list(role_rows)
        rng.shuffle(order)
        n = min(cap, max(1, round(len(order) * fraction))) if len(order) > 1 else 0
        held += order[:n]
        train[role] = order[n:]
    return train, held


def sft_dataset(rows: list[SFTExample], chat_template_kwargs: dict[str, Any] | None = None) -> Any:
    """Rows as a conversational prompt-completion ``datasets.Dataset``: the prompt is every message the memory
    model saw, the completion its final assistant message, so assistant turns inside the prompt stay out of the
    loss."""
    import datasets

    records = []
    for r in rows:
        record: dict[str, Any] = {
            "prompt": [m.model_dump() for m in r.messages[:-1]],
            "completion": [r.messages[-1].model_dump()],
        }
        if chat_template_kwargs:
            record["chat_template_kwargs"] = dict(chat_template_kwargs)
        records.append(record)
    return datasets.Dataset.from_list(records)
