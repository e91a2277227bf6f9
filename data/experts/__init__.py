"""Programmatic oracle experts for every memory role (they see the true state; error knobs make them imperfect).
They implement :class:`~memrl.data.schemas.ScriptedPolicy`, the scripted engine's interface."""

from memrl.data.experts.proactive import ProactiveOracle, ProactiveOracleConfig
from memrl.data.experts.sam import SamOracle, SamOracleConfig

__all__ = ["ProactiveOracle", "ProactiveOracleConfig", "SamOracle", "SamOracleConfig"]
