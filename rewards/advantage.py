"""Group-relative advantages (GRPO) from an outcome and shaping terms, shared by OAT-GRPO sibling groups and pivot-turn
groups.

A group is K responses to one shared context. Each member k has an *outcome* o_k (OAT: the node value V(n); pivot
groups: the continuation's verifier outcome) and a *shaping* term s_k (the weighted, centred shaping terms, costs and
penalties, already summed: OAT's lambda (c(n) - c_bar) minus the format penalty; pivot's minus the reminder cost and
the format penalty). The reward is r_k = o_k + s_k and, with c_k = r_k - mean(r):

    scale = "group_std"          A_k = c_k / (max(std(r), std_floor) + eps)   GRPO (std: the population std)
    scale = "none"               A_k = c_k                                    Dr. GRPO ("Understanding R1-Zero-Like
                                                                              Training", arXiv 2503.20783)
    scale = "batch_std"          A_k = c_k / (max(S_r, std_floor) + eps)      one scale for the batch: S_r is the
                                                                              pooled within-group std of r
    scale = "batch_outcome_std"  A_k = c_k / (max(S_o, std_floor) + eps)      the same over the outcomes: shaping is
                                                                              measured in units of the outcome's spread

S_r and S_o pool every member of the batch's groups of two or more (sum of squared deviations from the group mean over
the member count). A batch whose outcomes vary in no group has S_o = 0: under ``batch_outcome_std`` it gives no
advantage at all.

**Why the options.** Under ``group_std`` a group whose outcomes tie differs only in its shaping, and dividing by that
group's std turns any shaping difference, however small (a committee score of 0.61 against 0.60, a 0.1 reminder cost),
into an advantage of about +-1: the shaping term outvotes the outcome (an audit of the powered runs). Two more
switches keep shaping from producing an update on its own:

- ``tied_groups: zero``: shaping only inside outcome-informative groups; a group whose outcomes tie gets A = 0, so its
  rows are not trained (and do not dilute the token-mean loss of the rows that are);
- ``outcome_free_batch: skip``: a batch in which no group's outcomes vary gets A = 0 everywhere, so the trainer skips
  the update. Shrinking advantages does not shrink an AdamW step (the step is normalised by the gradient's running
  magnitude), so a batch whose only signal is shaping would otherwise still move the policy by about lr per step.

A group whose rewards do not vary (or has one member) carries no signal: every A_k is 0.

Named settings (:data:`ADVANTAGE_PRESETS`; a config may give the name instead of the fields, e.g.
``credit.advantage=dr_grpo``):

- ``informative_only`` (**the default**): group std, shaping only inside outcome-informative groups (so a batch
  without outcome signal trains nothing);
- ``grpo_std``: the paper's formula (SAM, arXiv 2605.24468; GRPO), memrl's earlier default: group std, no floor,
  shaping in tied groups, every batch updates;
- ``dr_grpo``: no std division, otherwise as ``grpo_std``;
- ``dr_grpo_gated``: no std division, and no update from a batch without outcome signal;
- ``std_floor``: group std with a floor of 0.25 (about half the std of a group of binary outcomes that split), and no
  update from a batch without outcome signal;
- ``batch_outcome_std``: one scale per batch, the pooled std of the outcomes (no update without outcome signal).

**Why ``informative_only`` is the default.** It is the one setting under which a shaping term can never move the policy
on its own, whatever the batch: an outcome-tied group trains nothing, a batch without outcome signal makes no optimizer
step (AdamW included), and tied rows leave the token-mean loss of the informative ones alone; inside an informative
group the committee (or a cost) still ranks the members. On the same batch of trees it takes the share of the update's
|A| that comes from committee-only groups from 19-28% to 0, and on pivot-turn groups at every memory step the share
from cost-only groups from 84% to 0 (``benchmarks/advantage_shares.py``, docs/results/shaping.md). ``grpo_std`` stays
selectable for replicating the paper.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, model_validator

from memrl.data.config import ConfigModel

__all__ = [
    "ADVANTAGE_PRESETS",
    "AdvantageConfig",
    "AdvantageScale",
    "group_advantages",
    "is_zero_variance",
    "shaped_batch_advantages",
    "shaped_group_advantages",
]

AdvantageScale = Literal["std", "none"]


class AdvantageConfig(ConfigModel):
    """How a group's outcomes and shaping become advantages (:mod:`memrl.rewards.advantage`). A preset name may stand
    for the whole section: ``informative_only`` (the default), ``grpo_std`` (the paper's formula), ``dr_grpo``,
    ``dr_grpo_gated``, ``std_floor``, ``batch_outcome_std``."""

    scale: Literal["group_std", "none", "batch_std", "batch_outcome_std"] = "group_std"  # divisor of r - mean(r)
    std_floor: float = Field(0.0, ge=0, le=1e6)  # the std divided by is at least this (group_std and the batch scales)
    eps: float = Field(1e-6, ge=0, le=1)  # added to the std when dividing by it
    tied_groups: Literal["shaping", "zero"] = "zero"  # a group whose outcomes tie: A = 0, or ranked by shaping
    outcome_free_batch: Literal["update", "skip"] = "update"  # a batch with no outcome variance: train, or A = 0

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        if isinstance(data, str):
            if data not in cls.presets:
                hint = {"std": "grpo_std", "none": "dr_grpo"}.get(data)
                known = ", ".join(cls.presets)
                raise ValueError(
                    f"unknown advantage preset {data!r}"
                    + (f" (the former {data!r} is now {hint!r})" if hint else "")
                    + f"; presets: {known}"
                )
            return dict(cls.presets[data])
        return data

    @property
    def preset(self) -> str | None:
        """The preset these settings equal, if any."""
        mine = self.model_dump()
        for name, fields in _PRESET_FIELDS.items():
            if mine == {**AdvantageConfig.model_construct().model_dump(), **fields}:
                return name
        return None


def _spec(scale: str = "group_std", floor: float = 0.0, tied: str = "shaping", batch: str = "update") -> dict[str, Any]:
    return {"scale": scale, "std_floor": floor, "tied_groups": tied, "outcome_free_batch": batch}


_PRESET_FIELDS: dict[str, dict[str, Any]] = {
    "informative_only": _spec(tied="zero"),
    "grpo_std": _spec(),
    "dr_grpo": _spec("none"),
    "dr_grpo_gated": _spec("none", batch="skip"),
    "std_floor": _spec(floor=0.25, batch="skip"),
    "batch_outcome_std": _spec("batch_outcome_std"),
}
AdvantageConfig.presets = _PRESET_FIELDS
ADVANTAGE_PRESETS: dict[str, AdvantageConfig] = {name: AdvantageConfig(**f) for name, f in _PRESET_FIELDS.items()}
"""The named advantage settings (module docstring): ``informative_only`` is the default, ``grpo_std`` the paper's
formula."""


def is_zero_variance(rewards: Sequence[float], tol: float = 1e-9) -> bool:
    """True when a group cannot rank its members: fewer than two rewards, or all equal."""
    return len(rewards) < 2 or max(rewards) - min(rewards) <= tol


def _centred(values: Sequence[float]) -> list[float]:
    mean = sum(values) / len(values) if values else 0.0
    return [v - mean for v in values]


def _pooled_std(groups: Sequence[Sequence[float]]) -> float:
    """The pooled within-group population std over groups of two or more (0 when there are none)."""
    sq, n = 0.0, 0
    for values in groups:
        if len(values) > 1:
            sq += sum(c * c for c in _centred(values))
            n += len(values)
    return math.sqrt(sq / n) if n else 0.0


def shaped_batch_advantages(
    groups: Sequence[tuple[Sequence[float], Sequence[float]]], cfg: AdvantageConfig
) -> list[list[float]]:
    """The advantages of every group of one batch: ``groups`` holds each group's (outcomes, shaping), the batch-level
    options (``batch_std``, ``batch_outcome_std``, ``outcome_free_batch``) see them all (module docstring)."""
    terms = []
    for outcomes, shaping in groups:
        if len(outcomes) != len(shaping):
            raise ValueError(f"a group has {len(outcomes)} outcomes but {len(shaping)} shaping terms")
        terms.append(
            ([float(o) for o in outcomes], [float(o) + float(s) for o, s in zip(outcomes, shaping, strict=True)])
        )
    outcome_signal = any(not is_zero_variance(o) for o, _ in terms)
    if cfg.outcome_free_batch == "skip" and not outcome_signal:
        return [[0.0] * len(o) for o, _ in terms]
    kept = [not (cfg.tied_groups == "zero" and is_zero_variance(o)) and not is_zero_variance(r) for o, r in terms]
    batch_scale = 1.0
    if cfg.scale in ("batch_std", "batch_outcome_std"):
        which = 1 if cfg.scale == "batch_std" else 0
        pooled = _pooled_std([t[which] for t, keep in zip(terms, kept, strict=True) if keep])
        if cfg.scale == "batch_outcome_std" and pooled <= 1e-12:
            return [[0.0] * len(o) for o, _ in terms]
        batch_scale = max(pooled, cfg.std_floor) + cfg.eps
    out = []
    for (_, rewards), keep in zip(terms, kept, strict=True):
        if not keep:
            out.append([0.0] * len(rewards))
            continue
        centred = _centred(rewards)
        if cfg.scale == "none":
            out.append(centred)
        elif cfg.scale == "group_std":
            std = math.sqrt(sum(c * c for c in centred) / len(centred))
            out.append([c / (max(std, cfg.std_floor) + cfg.eps) for c in centred])
        else:
            out.append([c / batch_scale for c in centred])
    return out


def shaped_group_advantages(outcomes: Sequence[float], shaping: Sequence[float], cfg: AdvantageConfig) -> list[float]:
    """The advantages of one group on its own (a batch of one group: a caller with a batch of groups passes them all
    to :func:`shaped_batch_advantages`, so the batch-level options see the batch)."""
    return shaped_batch_advantages([(outcomes, shaping)], cfg)[0]


def group_advantages(rewards: Sequence[float], scale: AdvantageScale = "std", eps: float = 1e-6) -> list[float]:
    """Plain GRPO advantages of one group of rewards with no shaping: ``std`` divides the centred rewards by the
    group's std, ``none`` does not; zeros for a zero-variance group."""
    if scale not in ("std", "none"):
        raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")
    cfg = AdvantageConfig(scale="group_std" if scale == "std" else "none", eps=eps)
    return shaped_group_advantages(rewards, [0.0] * len(rewards), cfg)
