"""Pivot-turn rewards ("Remember When It Matters: Proactive Memory Agent for Long-Horizon Agents", section 4.5);
:func:`memrl.rewards.groups.pivot_groups` makes the trainer groups.

Each of the G samples at a pivot is scored by its continuation's verifier outcome, minus an optional per-reminder
cost, minus a format penalty for a malformed output:

    r = outcome - reminder_cost * reminders - format_penalty * [malformed]

``reminders`` is 1 when the sampled decision injects a reminder (``cost_scope: decision``), or every reminder injected
from the pivot to the end of the episode (``cost_scope: continuation``: charges the whole intervention budget the
sample's branch spent). A Phase 2 output is well formed when it is exactly ``<no_intervention/>`` or one non-empty
``<context_for_action>...</context_for_action>`` (surrounding whitespace allowed); a truncated output (finish reason
``length``) is malformed too. With ``strict_format: false`` only what :func:`~memrl.data.formats.parse_intervention`
reports (an unclosed or empty tag) counts. A Phase 1 output is malformed when any tool call in it failed to parse or
apply. Malformed outputs are scored, never raised.

The outcome is the term the costs and penalties shape: :func:`pivot_terms` splits r into (outcome, shaping), and the
iteration's groups get their advantages together from
:func:`memrl.rewards.advantage.shaped_batch_advantages` under ``advantage`` (memrl's default preset,
``informative_only``, and every other preset but the paper's GRPO formula ``grpo_std``, which stays selectable, keep
a cost from setting a unit-size advantage in a group whose continuations all pass or all fail). In ``phase1+2`` groups
the sampled Phase 1 outputs form the group; each sample's own Phase 2 call becomes a one-sample group carrying the same
advantage (as trajectories do in flat mode), so both phases learn from the branch's outcome.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from memrl.data.config import ConfigModel
from memrl.data.formats import parse_intervention
from memrl.data.schemas import MemoryCall
from memrl.rewards.advantage import AdvantageConfig
from memrl.rollout.pivots import PivotSample

__all__ = ["PivotRewardConfig", "is_malformed", "pivot_reward", "pivot_terms"]

_STRICT = re.compile(r"\A\s*(?:<no_intervention/>|<context_for_action>(.*)</context_for_action>)\s*\Z", re.DOTALL)


class PivotRewardConfig(ConfigModel):
    """Reward of a pivot-turn sample and the group advantage."""

    reminder_cost: float = Field(0.0, ge=0, description="subtracted per reminder")
    cost_scope: Literal["decision", "continuation"] = "decision"  # charge the decision's reminder, or all to the end
    format_penalty: float = Field(0.5, ge=0, description="subtracted for a malformed output")
    strict_format: bool = True  # exact Phase 2 format; false: only what parse_intervention rejects
    advantage: AdvantageConfig = AdvantageConfig()  # advantages from outcome and shaping: a preset or fields


def is_malformed(call: MemoryCall, strict: bool = True) -> bool:
    """Whether a Phase 2 (``intervene``) or Phase 1 (``bank_edit``) output breaks its format (see the module
    docstring)."""
    if call.finish_reason == "length":
        return True
    if call.role != "intervene":
        return call.error is not None
    if not strict:
        return parse_intervention(call.text)[1] is not None
    match = _STRICT.match(call.text)
    if match is None:
        return True
    body = match.group(1)
    return body is not None and (not body.strip() or "context_for_action>" in body)


def pivot_terms(sample: PivotSample, cfg: PivotRewardConfig) -> tuple[float, float]:
    """(outcome, shaping) of one sample: the verifier outcome, and minus its reminder cost and format penalty."""
    if cfg.cost_scope == "decision":
        reminders = int(sample.reminder is not None)
    else:
        reminders = sample.reminders_after
    calls = [sample.call] + ([sample.followup] if sample.followup is not None else [])
    malformed = any(is_malformed(c, cfg.strict_format) for c in calls)
    return sample.outcome, -(cfg.reminder_cost * reminders + (cfg.format_penalty if malformed else 0.0))


def pivot_reward(sample: PivotSample, cfg: PivotRewardConfig) -> float:
    """The reward of one sample, r = outcome + shaping (see the module docstring)."""
    outcome, shaping = pivot_terms(sample, cfg)
    return outcome + shaping
