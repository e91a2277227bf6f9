"""Group-relative advantages (GRPO), shared by OAT-GRPO sibling groups and pivot-turn groups.

For a group of K responses to one shared context with rewards r_1..r_K:

    A_k = (r_k - mean(r)) / (std(r) + eps)     scale = "std"   (GRPO; std is the population std)
    A_k =  r_k - mean(r)                        scale = "none"  (Dr. GRPO: no length/std bias)

A group whose rewards do not vary (or has one member) carries no signal: every A_k is 0 and it is counted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

__all__ = ["AdvantageScale", "group_advantages", "is_zero_variance"]

AdvantageScale = Literal["std", "none"]


def is_zero_variance(rewards: Sequence[float], tol: float = 1e-9) -> bool:
    """True when a group cannot rank its members: fewer than two rewards, or all equal."""
    return len(rewards) < 2 or max(rewards) - min(rewards) <= tol


def group_advantages(rewards: Sequence[float], scale: AdvantageScale = "std", eps: float = 1e-6) -> list[float]:
    """Advantages of one group (see the module docstring); zeros for a zero-variance group."""
    if is_zero_variance(rewards):
        return [0.0] * len(rewards)
    mean = sum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if scale == "none":
        return centred
    if scale != "std":
        raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")
    std = math.sqrt(sum(c * c for c in centred) / len(centred))
    return [c / (std + eps) for c in centred]
