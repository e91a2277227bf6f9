"""Settings of pivot detection and pivot-turn groups: the pre-filters, the counterfactual budget, group sampling."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from memrl.data.config import ConfigModel, RegexPattern

__all__ = ["DetectConfig", "PivotGroupConfig", "PrefilterConfig"]


_STATE_CHANGE = (
    r"(?i)^\s*(rm|mv|cp|ln|mkdir|touch|chmod|chown|tee|truncate|sed\s+-i|pip3?\s+install|apt(-get)?\s+install"
    r"|python[\d.]*\s+\S+\.py|git\s+(commit|push|checkout|reset|merge|rebase|apply)|load|make|black)\b|>"
)


_TOOL_ERROR = r"(?im)^(error|fatal|traceback)\b|command not found|cannot stat|no such file|refused|failed"


class PrefilterConfig(ConfigModel):
    """Cheap pre-filters that pick candidate steps before any counterfactual is run."""

    state_change: bool = Field(True, description="the step precedes a state-changing command")
    tool_error: bool = Field(True, description="the step follows a tool error")
    repeat: bool = Field(True, description="the step precedes a command the window already holds")
    every_step: bool = Field(False, description="every memory step is a candidate (no pre-filter)")
    state_change_pattern: RegexPattern = _STATE_CHANGE  # a state-changing command
    error_pattern: RegexPattern = _TOOL_ERROR  # an observation that is a tool error


class DetectConfig(ConfigModel):
    """Counterfactual resampling at candidate steps."""

    prefilter: PrefilterConfig = PrefilterConfig()
    alternatives: int = Field(
        12,
        ge=2,
        description="the budget: distinct decisions continued per candidate at most (the recorded one "
        "too); tried in the order recorded, silence, every bank entry, policy samples; what it cuts is logged",
    )
    silence: bool = Field(True, description="always try <no_intervention/>")
    policy_samples: int = Field(2, ge=0, description="fresh samples of the memory engine per candidate")
    bank_reminders: bool = Field(True, description="try a reminder restating each bank entry, every one of them")
    min_spread: float = Field(0.5, gt=0, description="outcome spread that marks a pivot")
    max_candidates_per_rollout: int | None = Field(None, ge=1)  # first N candidate steps per rollout; None: all


class PivotGroupConfig(ConfigModel):
    """Pivot-turn groups: G samples per pivot from the restored state."""

    at: Literal["pivots", "all_turns"] = Field(
        "pivots",
        description="where groups are sampled: detected pivots (plus non_pivots_per_iteration labelled "
        "non-pivots), or all_turns: any memory step of the labelled rollouts, no detection (the ablation of pivot "
        "focus; it draws pivots_per_iteration + non_pivots_per_iteration steps)",
    )
    group_size: int = Field(8, ge=2)  # G: samples per pivot
    phases: Literal["phase2", "phase1+2"] = "phase2"  # sample Phase 2, or Phase 1 with each sample's own Phase 2
    pivots_per_iteration: int = Field(16, ge=1)  # pivots drawn from the pool per iteration
    non_pivots_per_iteration: int = Field(
        0,
        ge=0,
        description="labelled non-pivot candidates grouped too: with a per-reminder cost they teach silence "
        "where a reminder changes no outcome (0: pivots only)",
    )
    temperature: float | None = Field(None, ge=0, description="sampling temperature at the pivot (None: the role's)")
