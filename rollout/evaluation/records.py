"""Evaluation records: their keys, token-usage fields, horizon bins and how a question is asked (the benchmark's own
wording). Records are plain dicts (JSON-ready) keyed by :func:`item_key` (dataset, episode, item, system, model).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from memrl.data.envs.base import turn_tokens
from memrl.data.schemas import Episode, QAPair, TokenUsage
from memrl.rollout.memory.sam import TokenCounter

__all__ = [
    "Scorer",
    "asked_as",
    "chunks",
    "conversation_tokens",
    "episode_horizon",
    "horizon_label",
    "item_key",
    "scored",
    "usage_dict",
]


Scorer = Callable[[list[dict[str, Any]]], list[dict[str, float]]]
"""Maps a batch of records to one score dict per record (the runner passes :mod:`memrl.rewards.scorers` through
this)."""


def item_key(dataset: str, episode_id: str, item_id: str, system: str, model: str) -> str:
    """The resume key of one item: a rerun skips every record whose key is already written."""
    return "|".join((dataset, episode_id, item_id, system, model))


def usage_dict(usage: TokenUsage) -> dict[str, int]:
    """Token usage as a JSON-ready dict, with ``spent`` (prefill not served from cache plus generated tokens)."""
    return {
        "prompt": usage.prompt_tokens,
        "cached": usage.cached_prompt_tokens,
        "completion": usage.completion_tokens,
        "calls": usage.calls,
        "spent": usage.spent,
    }


def horizon_label(tokens: int) -> str:
    """A horizon bucket: the smallest power of two of K tokens that holds ``tokens`` (``<=4K tok``)."""
    k = 1
    while k * 1024 < tokens:
        k *= 2
    return f"<={k}K tok"


def conversation_tokens(episode: Episode, count_tokens: TokenCounter | None = None) -> int:
    """The length of an episode's recorded trajectory in tokens (every action and observation), counted with
    ``count_tokens`` or, without one, with the task generators' own count (:func:`memrl.data.envs.base.turn_tokens`), so
    recorded lengths and generated ``horizon_tokens`` fall in the same bins."""
    if count_tokens is None:
        return max(1, sum(turn_tokens(t.action, t.observation) for t in episode.trajectory))
    return count_tokens("\n".join(f"{t.action}\n{t.observation}" for t in episode.trajectory))


def episode_horizon(episode: Episode, length: int) -> str:
    """The horizon bin: the generator's target length when it has one, else the bucket of the recorded length
    (``episode.horizon_tokens`` when the file gives it, else ``length``)."""
    target = episode.metadata.get("target_tokens")
    if isinstance(target, int):
        return f"{target} tok"
    return horizon_label(episode.horizon_tokens or length)


def asked_as(qa: QAPair) -> str:
    """The question as the benchmark's own prompt asks it (LoCoMo adds its date instruction to temporal questions
    and the two options to adversarial ones, in ``metadata.asked_as``), else the question."""
    asked = qa.metadata.get("asked_as")
    return asked if isinstance(asked, str) and asked else qa.question


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """Consecutive slices of ``items`` of ``size`` (at least 1) items each, the last one shorter."""
    for start in range(0, len(items), max(size, 1)):
        yield items[start : start + max(size, 1)]


def scored(
    records: list[dict[str, Any]], scorer: Scorer | None, on_progress: Callable[[int], None] | None
) -> list[dict[str, Any]]:
    """A batch of finished records with the scorer's scores attached (``record["scores"]``), progress reported."""
    if scorer is not None:
        for record, scores in zip(records, scorer(records), strict=True):
            record["scores"] = scores
    if on_progress is not None:
        on_progress(len(records))
    return records
