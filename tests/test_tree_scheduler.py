"""The asynchronous tree scheduler: the same trees as lock-step wavefronts whatever the timing, a slow branch never
holds up the others, and the memory model and the reasoner generate at the same time."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import pytest

from benchmarks.textworld_tree import dumped
from memrl.data.tasks.sam import SamTask
from memrl.rollout.agents import sam_engines, sam_rollout
from memrl.rollout.engines.base import GenerationRequest
from memrl.rollout.engines.scripted import DelayedEngine
from memrl.rollout.loop import EngineSet
from memrl.rollout.memory.sam import SamConfig
from memrl.rollout.models import load_tokenizer
from memrl.rollout.tree import TreeConfig, build_trees

CONFIG = SamConfig(page_turns=1, live_capacity_turns=4, keep_recent_turns=3)


def sam_tasks(n: int) -> list[SamTask]:
    return [SamTask({"horizon_steps": 16, "n_evidence": 2, "facts_per_obs": 2}, seed=s) for s in range(n)]


def make(task: Any, rollout_id: str) -> Any:
    return sam_rollout(task, CONFIG, rollout_id=rollout_id)


def engines(tokenizer: Any = None) -> EngineSet:
    return sam_engines(oracle={"verbatim": 1, "omission": 1}, max_pages=2, tokenizer=tokenizer)


@pytest.mark.parametrize("budgets", [{"max_leaves": 3}, {"reasoner_token_budget": 8000}])
def test_async_builds_the_wavefronts_trees_whatever_the_timing(budgets: dict[str, int], tiny_model_dir: Any) -> None:
    """Random per-call latencies (two different draws) reorder every branch's progress; the trees stay those of the
    lock-step scheduler, with the budget binding (some trainable actions are sampled once)."""
    tokenizer = load_tokenizer(str(tiny_model_dir))
    tasks = sam_tasks(4)
    cfg = TreeConfig(branch_factor=2, **budgets)
    reference, _ = build_trees(tasks, make, engines(tokenizer), cfg.model_copy(update={"scheduler": "wavefront"}))
    for draw in (1, 2):
        jitter = random.Random(draw)
        base = engines(tokenizer)
        jittery = EngineSet(
            reasoner=DelayedEngine(base.reasoner, lambda _, r=jitter: r.uniform(0.0, 0.004)),
            memory=DelayedEngine(base.memory, lambda _, r=jitter: r.uniform(0.0, 0.004)),
        )
        trees, stats = build_trees(tasks, make, jittery, cfg)
        assert stats.wavefronts == 0 and list(map(dumped, trees)) == list(map(dumped, reference))
    nodes = [n for t in reference for n in t.nodes if n.kind == "memory"]
    assert {n.metadata["samples"] for n in nodes} == {1, 2}  # branched, and past the budget sampled once
    assert max(sum(n.kind == "leaf" for n in t.nodes) for t in reference) <= budgets.get("max_leaves", 16)


def test_a_slow_branch_does_not_hold_up_the_others() -> None:
    """One tree's first reasoner call (an endpoint's) is answered only once every other tree has made all of its
    reasoner calls: under the asynchronous scheduler the others run to their leaves meanwhile (under lock-step
    wavefronts they would wait for it, and the call would time out)."""
    tasks = sam_tasks(4)
    reference, _ = build_trees(tasks, make, engines(), TreeConfig(branch_factor=2, scheduler="wavefront"))
    remaining = {t.task_id: t.reasoner_usage.calls for t in reference[1:]}
    slow_task, others_done, waited = tasks[0].task_id, threading.Event(), []

    class Endpoint(DelayedEngine):
        async def agenerate(self, requests: list[GenerationRequest]) -> list[Any]:
            (request,) = requests  # an endpoint gets each request on its own
            task_id = request.metadata["task_id"]
            if task_id == slow_task and not waited:
                waited.append(await asyncio.to_thread(others_done.wait, 30.0))
            if task_id in remaining:
                remaining[task_id] -= 1
                if not any(remaining.values()):
                    others_done.set()
            return self.engine.generate(requests)

    base = engines()
    trees, _ = build_trees(
        tasks, make, EngineSet(reasoner=Endpoint(base.reasoner, 0.0), memory=base.memory), TreeConfig(branch_factor=2)
    )
    assert waited == [True]  # the other trees finished while the slow call was out
    assert list(map(dumped, trees)) == list(map(dumped, reference))


def test_the_memory_model_and_the_reasoner_generate_at_the_same_time() -> None:
    """With every call taking a while, some memory-model batch is in flight while a reasoner call is."""
    spans: dict[str, list[tuple[float, float]]] = {"sam-oracle": [], "reasoner": []}

    class Timed(DelayedEngine):
        async def agenerate(self, requests: list[GenerationRequest]) -> list[Any]:
            start = time.perf_counter()
            results = await super().agenerate(requests)
            spans[self.name].append((start, time.perf_counter()))
            return results

    base = engines()
    eng = EngineSet(reasoner=Timed(base.reasoner, 0.01), memory=Timed(base.memory, 0.01, concurrent_requests=False))
    build_trees(sam_tasks(4), make, eng, TreeConfig(branch_factor=2))
    overlaps = sum(1 for a, b in spans["sam-oracle"] for c, d in spans["reasoner"] if a < d and c < b)
    assert overlaps > 0 and len(spans["sam-oracle"]) > 1


def test_a_scripted_reasoner_answers_at_once_so_every_branch_is_in_each_memory_batch() -> None:
    """With a scripted reasoner (it answers in the scheduler's loop) and a batching memory model, every branch that
    is still running is in every memory batch: the memory model is called once per memory call of the longest path.
    (Answered in a thread, the reasoner lets branches that make two memory calls in a row, a two-page recall, drift
    into cohorts that take turns on the memory model.) The trees are the lock-step scheduler's."""
    batches: list[list[GenerationRequest]] = []

    class Recording(DelayedEngine):
        async def agenerate(self, requests: list[GenerationRequest]) -> list[Any]:
            batches.append(requests)
            return await super().agenerate(requests)

    tasks = [SamTask({"horizon_steps": 24, "n_evidence": 2, "facts_per_obs": 2}, seed=s) for s in range(6)]
    cfg = TreeConfig(branch_factor=2, max_leaves=8)
    base = sam_engines(oracle={"verbatim": 1, "omission": 1}, max_pages=3)
    reference, _ = build_trees(tasks, make, base, cfg.model_copy(update={"scheduler": "wavefront"}))
    assert base.reasoner.answers_inline and not Recording(base.memory, 0.0).answers_inline
    memory = Recording(base.memory, 0.001, concurrent_requests=False)
    trees, _ = build_trees(tasks, make, EngineSet(reasoner=base.reasoner, memory=memory), cfg)
    assert list(map(dumped, trees)) == list(map(dumped, reference))

    def on_path(leaf: str, r: GenerationRequest) -> bool:  # a request of the leaf's rollout or of one it forked from
        task, rollout = leaf.split("/", 1)
        made_by = str(r.metadata["rollout_id"])
        return r.metadata["task_id"] == task and (rollout == made_by or rollout.startswith(made_by + "."))

    sent = [r for batch in batches for r in batch]
    leaves = [f"{t.task_id}/{n.metadata['rollout_id']}" for t in trees for n in t.nodes if n.kind == "leaf"]
    longest = max(sum(on_path(leaf, r) for r in sent) for leaf in leaves)
    assert len(leaves) > len(tasks) and longest > 0 and len(batches) == longest, (len(batches), longest)


def test_continuous_batching_joins_the_same_rows_at_the_same_steps_whatever_the_timing(tiny_model_dir: Any) -> None:
    """The transformers engine decodes continuously (rows join the running batch between steps); the tree scheduler
    holds its next step until every call that follows from a completed one is sent (Engine.lockstep), so which rows
    join at which step, and so every tree, is a function of the build, not of how fast the scheduler's loop runs:
    random pauses in the loop (two draws) change nothing."""
    from memrl.rollout.engines import continuous_batching
    from memrl.rollout.engines.config import EngineConfig
    from memrl.rollout.engines.factory import build_engine
    from memrl.rollout.memory.base import RoleSampling
    from memrl.rollout.tree import _Schedule

    sampling = {"consolidate": RoleSampling(temperature=0.0, max_tokens=12), "recall": RoleSampling(max_tokens=5)}
    config = CONFIG.model_copy(update={"sampling": sampling})
    memory = build_engine(EngineConfig(backend="hf", model=str(tiny_model_dir), dtype="float32"))
    assert memory.concurrent_requests
    tokenizer = load_tokenizer(str(tiny_model_dir))
    joins: list[tuple[int, int]] = []  # (steps decoded before it, rows joining)
    steps = [0]
    join, step, move = continuous_batching.RunningBatch.join, continuous_batching.RunningBatch.step, _Schedule.move

    def logged_join(self: Any, decoder: Any, rows: list[Any]) -> None:
        joins.append((steps[0], len(rows)))
        join(self, decoder, rows)

    def counted_step(self: Any, decoder: Any) -> None:
        steps[0] += 1
        step(self, decoder)

    def build(draw: int) -> tuple[list[Any], list[tuple[int, int]]]:
        jitter = random.Random(draw)

        def slow_move(self: Any, items: list[Any], results: list[Any]) -> list[Any]:
            time.sleep(jitter.uniform(0.0, 0.01))
            return move(self, items, results)

        joins.clear()
        steps[0] = 0
        _Schedule.move = slow_move  # type: ignore[method-assign]
        try:
            trees, _ = build_trees(
                sam_tasks(3),
                lambda task, rid: sam_rollout(task, config, rollout_id=rid),
                EngineSet(reasoner=engines(tokenizer).reasoner, memory=memory),
                TreeConfig(branch_factor=2, max_leaves=4),
            )
        finally:
            _Schedule.move = move  # type: ignore[method-assign]
        return list(map(dumped, trees)), list(joins)

    continuous_batching.RunningBatch.join, continuous_batching.RunningBatch.step = logged_join, counted_step
    try:
        first, second = build(1), build(2)
    finally:
        continuous_batching.RunningBatch.join, continuous_batching.RunningBatch.step = join, step
        memory.close()
    assert first == second
    assert any(rows > 1 for _, rows in first[1]) and len(first[1]) > 10
