"""Programmatic oracle experts for every memory role (they see the true state; error knobs make them imperfect).
They implement :class:`~data.schemas.ScriptedPolicy`, the scripted engine's interface."""

from data.experts.proactive import ProactiveOracle, ProactiveOracleConfig
from data.experts.sam import SamOracle, SamOracleConfig

__all__ = ["ProactiveOracle", "ProactiveOracleConfig", "SamOracle", "SamOracleConfig"]
