"""Branching a restored memory step: siblings of a rollout that share its seeds (:func:`sibling_fork`), the pending
call asked again for fresh samples (:func:`resampled_request`), and one engine call per engine for a batch of such
requests (:func:`generate_grouped`). Detection and pivot-turn groups both branch this way.
"""

from __future__ import annotations

import dataclasses

from memrl.rollout.engines.base import Engine, GenerationRequest, GenerationResult, sample_seed
from memrl.rollout.loop import EngineSet, PendingCall, Rollout

__all__ = ["generate_grouped", "resampled_request", "sibling_fork"]


def sibling_fork(base: Rollout) -> Rollout:
    """``base.fork`` keeping the rollout id (siblings share the seeds of every later call: common random numbers), with
    the recorded history shared rather than deep-copied (its records are never modified once made)."""
    calls, events = base.memory_calls, base.events
    base.memory_calls, base.events = [], []
    try:
        twin = base.fork(base.rollout_id)
    finally:
        base.memory_calls, base.events = calls, events
    twin.memory_calls, twin.events = list(calls), list(events)
    return twin


def resampled_request(call: PendingCall, n: int, salt: int, temperature: float | None = None) -> GenerationRequest:
    """The pending request asking for ``n`` samples under a derived seed (fresh samples, reproducible)."""
    base = call.request.sampling.seed if call.request.sampling.seed is not None else 0
    sampling = dataclasses.replace(call.request.sampling, n=n, seed=sample_seed(base, salt))
    if temperature is not None:
        sampling = dataclasses.replace(sampling, temperature=temperature)
    return GenerationRequest(
        messages=call.request.messages,
        prompt_ids=call.request.prompt_ids,
        sampling=sampling,
        metadata=dict(call.request.metadata),
    )


def generate_grouped(
    engines: EngineSet, calls: list[PendingCall], requests: list[GenerationRequest]
) -> list[GenerationResult]:
    """One engine call per engine for all ``requests`` (results in request order)."""
    results: list[GenerationResult | None] = [None] * len(requests)
    batches: dict[int, tuple[Engine, list[int]]] = {}
    for i, call in enumerate(calls):
        engine = engines.for_call(call)
        batches.setdefault(id(engine), (engine, []))[1].append(i)
    for engine, indices in batches.values():
        for i, result in zip(indices, engine.generate([requests[i] for i in indices]), strict=True):
            results[i] = result
    return [r for r in results if r is not None]
