"""Sticky endpoint choice: every request of one tree goes to the same server.

An ``openai`` engine with several endpoints normally sends each request to the least-loaded one, which spreads a
tree's calls (and so its shared prefix) over every server's prefix cache. :class:`StickyEngine` holds one engine per
endpoint instead and routes a request by a hash of its task id (a tree is one task's tree, so the hash of the task id
is the hash of the tree id): the frozen reasoner's, the committee's and the judge's prefix caches then see a tree's
whole history. Requests without a task id route by a hash of their prompt.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from memrl.rollout.engines.base import EngineFront, GenerationRequest, GenerationResult

__all__ = ["StickyEngine", "sticky_index"]


def sticky_index(key: str, n: int) -> int:
    """The endpoint (0..n-1) that serves ``key``: stable across processes and runs (unlike Python's ``hash``)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") % n


def _route_key(request: GenerationRequest) -> str:
    task_id = request.metadata.get("task_id")
    if task_id is not None:
        return str(task_id)
    if request.prompt_ids is not None:
        return json.dumps(request.prompt_ids)
    return json.dumps([m.model_dump(mode="json") for m in request.messages or []])


class StickyEngine(EngineFront):
    """One engine per endpoint; a request goes to ``engines[sticky_index(task id, n)]``, the engines concurrently.
    What it can do is what every endpoint can (:class:`~memrl.rollout.engines.base.EngineFront`)."""

    def endpoint_of(self, request: GenerationRequest) -> int:
        """The index of the engine that serves ``request``."""
        return sticky_index(_route_key(request), len(self.engines))

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Split the requests by endpoint, generate on every endpoint at once, return the results in request order."""
        return self._split(requests, "generate")

    def generate_each(self, requests: list[GenerationRequest]) -> list[GenerationResult | Exception]:
        """:meth:`generate` where a failed request yields its exception in its place (each endpoint's own
        ``generate_each``), so one failure neither sinks nor re-runs its endpoint's other requests."""
        return self._split(requests, "generate_each")

    async def agenerate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """:meth:`generate` for callers inside an event loop: every endpoint's own ``agenerate``, concurrently."""
        parts = self._parts(requests)
        answers = await asyncio.gather(
            *(self.engines[endpoint].agenerate([requests[i] for i in indices]) for endpoint, indices in parts.items())
        )
        out: list[Any] = [None] * len(requests)
        for indices, results in zip(parts.values(), answers, strict=True):
            for i, result in zip(indices, results, strict=True):
                out[i] = result
        return out

    def _parts(self, requests: list[GenerationRequest]) -> dict[int, list[int]]:
        parts: dict[int, list[int]] = {}
        for i, request in enumerate(requests):
            parts.setdefault(self.endpoint_of(request), []).append(i)
        return parts

    def _split(self, requests: list[GenerationRequest], method: str) -> list[Any]:
        parts = self._parts(requests)
        out: list[Any] = [None] * len(requests)

        def run(item: tuple[int, list[int]]) -> None:
            endpoint, indices = item
            answers = getattr(self.engines[endpoint], method)([requests[i] for i in indices])
            for i, result in zip(indices, answers, strict=True):
                out[i] = result

        if len(parts) == 1:
            run(next(iter(parts.items())))
        else:
            with ThreadPoolExecutor(max_workers=len(parts), thread_name_prefix="sticky") as pool:
                list(pool.map(run, parts.items()))
        return out
