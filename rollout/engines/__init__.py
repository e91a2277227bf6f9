"""Inference engines: one interface (:mod:`memrl.rollout.engines.base`) over vLLM, transformers, OpenAI-compatible HTTP
endpoints and scripted agents. Backends import their heavy dependencies only when built (:func:`build_engine`).
"""

from memrl.rollout.engines.base import (
    Completion,
    Engine,
    EngineError,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    Usage,
    chat_prompt_ids,
    sample_seed,
    to_memory_call,
)
from memrl.rollout.engines.config import EndpointConfig, EngineConfig, load_scripted_policy
from memrl.rollout.engines.factory import build_engine
from memrl.rollout.engines.prefix_cache import PrefixCacheSimulator

__all__ = [
    "Completion",
    "EndpointConfig",
    "Engine",
    "EngineConfig",
    "EngineError",
    "GenerationRequest",
    "GenerationResult",
    "PrefixCacheSimulator",
    "SamplingParams",
    "Usage",
    "build_engine",
    "chat_prompt_ids",
    "load_scripted_policy",
    "sample_seed",
    "to_memory_call",
]
