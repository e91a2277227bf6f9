"""Tree and flat rollouts over the fake counting task: structure, budgets, batching, groups."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest
from fakes import CountEnv, FakeEngine, RecallAwareMemory

from memrl.rewards.credit import CreditConfig, assign_credit, assign_flat_credit
from memrl.rewards.groups import trees_to_groups
from memrl.rollout.engines.base import Engine
from memrl.rollout.engines.scripted import DelayedEngine
from memrl.rollout.engines.sticky import StickyEngine
from memrl.rollout.loop import EngineSet, Rollout
from memrl.rollout.memory.base import MemoryRequest, RoleSampling
from memrl.rollout.tree import TreeConfig, build_trees
from memrl.rollout.worker import _Recording


def make(task: str, rollout_id: str) -> Rollout:
    return Rollout(CountEnv(task), RecallAwareMemory(), reasoner_system="sys", seed=0, rollout_id=rollout_id)


def engines(marker: str | None = "part b#1") -> tuple[FakeEngine, FakeEngine, EngineSet]:
    reasoner, memory = FakeEngine("reasoner", good_marker=marker), FakeEngine("memory")
    return reasoner, memory, EngineSet(reasoner=reasoner, memory=memory)


def test_tree_branches_at_every_trainable_call_up_to_depth() -> None:
    _, _, eng = engines()
    (tree,), stats = build_trees(["t0"], make, eng, TreeConfig(branch_factor=2, max_branch_depth=2, max_leaves=8))
    nodes = {n.node_id: n for n in tree.nodes}
    root = nodes["root"]
    assert len(root.children) == 2  # first recall call: two siblings
    level2 = [c for k in root.children for c in nodes[k].children]
    assert len(level2) == 4 and all(nodes[c].kind == "memory" for c in level2)
    leaves = [n for n in tree.nodes if n.kind == "leaf"]
    assert len(leaves) == 4
    # the answer is right only where the second call's sample 1 was taken
    assert sorted(leaf.outcome for leaf in leaves) == [0.0, 0.0, 1.0, 1.0]
    for key in root.children:  # siblings share one parent context
        kids = [nodes[c] for c in nodes[key].children]
        assert len({tuple(k.call.prompt_ids) for k in kids}) == 1 and len({k.group_id for k in kids}) == 1
    # wavefront batching: one engine call per engine per wavefront, never one per sequence
    assert stats.engine_calls["memory"] == 2 and stats.engine_calls["reasoner"] == 5
    assert tree.reasoner_usage.calls == 3 + 1 + 4  # 3 ticks + memory tool call (shared), then 4 answers


def test_leaf_budget_limits_branching() -> None:
    _, _, eng = engines()
    (tree,), _ = build_trees(["t0"], make, eng, TreeConfig(branch_factor=2, max_branch_depth=2, max_leaves=3))
    assert sum(n.kind == "leaf" for n in tree.nodes) == 3


def test_batch_of_tasks_shares_wavefronts() -> None:
    _, memory, eng = engines()
    trees, stats = build_trees([f"t{i}" for i in range(5)], make, eng, TreeConfig(branch_factor=4, max_branch_depth=1))
    assert len(trees) == 5 and all(sum(n.kind == "leaf" for n in t.nodes) == 4 for t in trees)
    assert stats.engine_calls["memory"] == 2 and stats.engine_calls["reasoner"] == 5
    assert max(memory.batch_sizes) == 5 * 4  # the second memory call of every branch of every tree in one batch


def test_credit_and_groups_from_a_tree() -> None:
    _, _, eng = engines()
    (tree,), _ = build_trees(["t0"], make, eng, TreeConfig(branch_factor=2, max_branch_depth=2, max_leaves=8))
    stats = assign_credit(tree, CreditConfig(terms=[]))
    groups = trees_to_groups([tree])
    assert stats.groups == 3 and len(groups) == 3
    first = next(g for g in groups if len(g.samples) == 2 and all(s.reward == 0.5 for s in g.samples))
    assert first.zero_variance  # the first call does not matter: both of its subtrees score 1/2
    deep = [g for g in groups if not g.zero_variance]
    assert len(deep) == 2 and all(
        sorted(s.advantage for s in g.samples) == pytest.approx([-1.0, 1.0], abs=1e-4) for g in deep
    )


def test_flat_mode_gives_each_trajectory_its_outcome() -> None:
    _, memory, eng = engines(marker="part a#0")  # every trajectory samples #0 at n=1: all succeed
    (tree,), _ = build_trees(["t0"], make, eng, TreeConfig(mode="flat", flat_group_size=3))
    leaves = [n for n in tree.nodes if n.kind == "leaf"]
    assert len(leaves) == 3 and all(leaf.outcome == 1.0 for leaf in leaves)
    assert sum(n.kind == "memory" for n in tree.nodes) == 6  # two trainable calls per trajectory
    credit = assign_flat_credit(tree, CreditConfig())
    assert credit.zero_variance_groups == 1
    groups = trees_to_groups([tree], source="flat")
    assert len(groups) == 6 and all(len(g.samples) == 1 for g in groups)
    assert max(memory.batch_sizes) == 3


def test_a_sam_recall_is_one_node_and_the_tree_expands_at_every_recall() -> None:
    """SAM's node (arXiv 2605.24468): one recall (all the pages it reads) is one memory action; the tree branches at
    the next recall along each path, so a two-hop question (two recalls) gives two branching levels within the leaf
    budget."""
    from memrl.data.tasks.sam import SamTask
    from memrl.rollout.agents import sam_engines, sam_rollout
    from memrl.rollout.memory.sam import SamConfig

    tasks = [SamTask({"horizon_steps": 16, "n_evidence": 2, "facts_per_obs": 2}, seed=s) for s in range(3)]
    config = SamConfig(page_turns=1, live_capacity_turns=4, keep_recent_turns=3)
    engines = sam_engines(oracle={"verbatim": 1, "omission": 1}, max_pages=2)
    trees, _ = build_trees(
        tasks,
        lambda task, rid: sam_rollout(task, config, rollout_id=rid),
        engines,
        TreeConfig(branch_factor=2, max_leaves=16),
    )
    deepest = 0
    for tree in trees:
        nodes = {n.node_id: n for n in tree.nodes}
        recalls = [n for n in tree.nodes if n.kind == "memory"]
        for node in recalls:
            assert node.call.metadata["read_index"] == 0  # a node starts a recall ...
            pages = node.call.metadata["page_ids"]
            assert [c.metadata["read_index"] for c in node.follow_up_calls] == list(range(1, len(pages)))
            assert {c.metadata["intent"] for c in node.follow_up_calls} <= {node.call.metadata["intent"]}
            parent = nodes[node.parent_id]
            assert node.depth == parent.depth + 1
        deepest = max([deepest, *(n.depth for n in recalls)])
        assign_credit(tree, CreditConfig(terms=[]))
        groups = trees_to_groups([tree])
        follow_ups = [g for g in groups if g.group_id.rsplit("/", 1)[-1].startswith("f")]
        assert len(follow_ups) == sum(len(n.follow_up_calls) for n in recalls)
        for g in follow_ups:  # a later page of a recall carries its action's advantage
            assert len(g.samples) == 1 and g.samples[0].advantage == nodes[g.samples[0].node_id].advantage
    assert deepest >= 2  # the second recall of a path branches too: depth is not used up inside one recall


class GreedySecondPart(RecallAwareMemory):
    """The memory tool's second call is a greedy consolidation: every sibling of the first call's branching makes it
    with the same prompt."""

    def next_memory_request(self) -> MemoryRequest | None:
        request = super().next_memory_request()
        if request is None or request.messages[0].content != "part b":
            return request
        return MemoryRequest(role="consolidate", messages=request.messages, sampling=RoleSampling(temperature=0.0))


class DeterministicFake(FakeEngine):
    greedy_is_deterministic = True


class ConcurrentDeterministicFake(DeterministicFake):
    """Requests sent one by one and answered after a pause: equal greedy requests are in flight at once."""

    concurrent_requests = True

    async def agenerate(self, requests: list) -> list:
        await asyncio.sleep(0.002)
        return self.generate(requests)


@pytest.mark.parametrize("scheduler", ["async", "wavefront", "async-concurrent"])
def test_equal_greedy_calls_are_computed_once_and_the_trees_stay_the_same(scheduler: str) -> None:
    """Siblings repeat each other's greedy calls until their paths part: with sharing on, an equal greedy request to
    an engine whose greedy answer is a pure function of the request takes the answer already computed in the build
    (one per extra sibling) or being computed (an engine taking requests one by one), the engine generates only the
    rest, and the trees are those built without sharing. An engine that does not say so (a scripted policy may read
    its seed) is never shared."""
    fake = ConcurrentDeterministicFake if scheduler == "async-concurrent" else DeterministicFake
    scheduler = scheduler.removesuffix("-concurrent")

    def build(engine: FakeEngine, share: bool) -> tuple[list, int, int]:
        def make_greedy(task: str, rollout_id: str) -> Rollout:
            return Rollout(CountEnv(task), GreedySecondPart(), reasoner_system="sys", seed=0, rollout_id=rollout_id)

        cfg = TreeConfig(branch_factor=3, max_branch_depth=1, scheduler=scheduler, share_greedy_calls=share)
        eng = EngineSet(reasoner=FakeEngine("reasoner"), memory=engine)
        trees, stats = build_trees(["t0", "t1"], make_greedy, eng, cfg)
        return [t.model_dump(mode="json") for t in trees], stats.shared_greedy_calls, sum(engine.batch_sizes)

    unshared, none, rows = build(fake("memory"), share=False)
    shared, hits, fewer = build(fake("memory"), share=True)
    assert shared == unshared and none == 0
    assert hits == 5 and fewer == rows - hits  # "part b" of 3 siblings x 2 trees, one prompt: generated once
    assert build(FakeEngine("memory"), share=True)[1] == 0


class LockstepFake(DeterministicFake):
    """Counts the lockstep sections it enters and the settles it gets."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.locksteps, self.settles = 0, 0

    @contextlib.contextmanager
    def lockstep(self) -> Iterator[None]:
        self.locksteps += 1
        yield

    def settle(self) -> None:
        self.settles += 1


@pytest.mark.parametrize("front", ["recording", "sticky", "delayed"])
def test_an_engine_in_front_of_others_passes_on_what_they_are(front: str) -> None:
    """A fleet worker's recorder, a sticky router and a simulated latency in front of engines that compute greedy
    calls deterministically keep greedy calls shared (5 of them here) and put every engine behind in lockstep; in front
    of one engine that does not say so among others, nothing is shared."""

    def put_in_front(behind: list[FakeEngine]) -> Engine:
        if front == "recording":
            return _Recording(behind[0]) if len(behind) == 1 else _Recording(StickyEngine(behind, "memory"))
        if front == "sticky":
            return StickyEngine(behind, "memory")
        return DelayedEngine(StickyEngine(behind, "memory"), 0.0, concurrent_requests=False)

    def shared(behind: list[FakeEngine]) -> int:
        def make_greedy(task: str, rollout_id: str) -> Rollout:
            return Rollout(CountEnv(task), GreedySecondPart(), reasoner_system="sys", seed=0, rollout_id=rollout_id)

        cfg = TreeConfig(branch_factor=3, max_branch_depth=1, scheduler="async", share_greedy_calls=True)
        eng = EngineSet(reasoner=FakeEngine("reasoner"), memory=put_in_front(behind))
        return build_trees(["t0", "t1"], make_greedy, eng, cfg)[1].shared_greedy_calls

    first, second = LockstepFake("memory"), LockstepFake("memory")
    assert shared([first]) == 5 and shared([first, second]) == 5
    assert (first.locksteps, second.locksteps) == (2, 1) and first.settles > 0 and second.settles > 0
    assert shared([LockstepFake("memory"), FakeEngine("memory")]) == 0
