"""Memory-call trees (OAT-GRPO rollouts: "SAM: State-Adaptive Memory for Long-Horizon Reasoning Agent", arXiv
2605.24468, section 2.3) and the flat baseline.

**What a node is.** A tree node is one *memory action* as the paper defines it: one consolidation (the cue of one
page) or one recall (the reconstruction, under one intent, from the pages the agent selected). A recall reads its
pages one model call per page, each seeing the running extraction; the calls after the first (request metadata
``continues_action``) belong to the same node (``TreeNode.follow_up_calls``) and never branch. So the node's output is
the extraction the reasoner receives, its depth counts memory actions along the path, and its siblings are the K
samples of the same action from one parent context.

Tree mode: every rollout runs until its next action of a trainable memory role (``branch_roles``). There the memory
model is sampled K times from the same parent context; each sample goes to its own fork of the rollout (its own copy of
the frozen reasoner's state), which runs on to the next trainable action, where it branches again, or to the end of
the task (a leaf, scored by the task's verifier). The tree expands at every trainable action along a path while the
budgets allow; past a budget the action is sampled once and becomes a single-member node (it carries no advantage).

Budgets are *split* among siblings, so whether a branch may branch depends only on its own path, never on how far
its cousins have got (which the asynchronous scheduler leaves to timing):

- ``max_leaves``: the root may end with at most this many leaves; a branch with allowance A branches K ways only if
  A >= K, and its children share A (A // K each, the remainder to the first ones);
- ``reasoner_token_budget``: the root's allowance of reasoner tokens; a branch spends its allowance on its own
  reasoner calls, branches only while some is left, and its children share what is left equally;
- ``max_branch_depth``: only the first this many memory actions on a path branch.

**Identical siblings** (``merge_identical_siblings``, on by default). A sampled sibling whose action has the same token
ids as an earlier sibling's (every model call of it) is the same action: it is merged into that node, its subtree
moves under it, and V(n) pools both copies' leaves (``metadata["copies"]``). So a Monte-Carlo difference between two
copies of one text is never trained as a preference; the tree's metadata counts ``branched_nodes`` and
``merged_siblings``. Dynamic sampling (``informative_groups``) is done by the recipe (:mod:`memrl.train.oat_grpo`).

**One action, one credit: branch at the first differing call** (:func:`branch_at_first_difference`, applied by credit
assignment after the committee has scored the whole actions: ``credit.shared_prefix: branch``, the default). Every
call of a multi-call action is trained with its node's advantage. Siblings that make the same first page read and
differ only in later ones would otherwise train that first read, the same prompt and the same response, once per
sibling with opposite advantages (the copies cancel in the gradient but still count in the token-mean loss). So the
tree branches where the siblings' calls first differ: the shared calls become one node among the siblings (its V(n)
pools their leaves), and under it the differing continuations form their own sibling group, on one shared prompt.

Flat mode (vanilla GRPO over trajectories): G independent rollouts per task; every trainable action of a trajectory
is a node of that trajectory's chain and shares its outcome.

Token accounting: ``MemoryCallTree.reasoner_usage`` counts every reasoner call once. A node's ``reasoner_usage`` /
``memory_usage`` is its continuation cost: what its branch spent after it, up to the next node or the end.

**Schedulers** (``scheduler``). ``async`` (the default): every branch advances as soon as its own call returns, so
the memory model and the frozen reasoner generate at the same time and a slow branch never holds up the others. An
engine that batches in-process (vLLM's ``LLM``, transformers without continuous batching) gets every call that is
waiting for it as one batch while its previous batch runs; an engine whose requests are independent
(``Engine.concurrent_requests``: an HTTP endpoint, the transformers engine's continuous batching) gets each request the
moment it is ready; an engine that answers at next to no cost in this process (``Engine.answers_inline``: a scripted
reasoner) answers at once, so the branches it answers join the memory model's next batch. (Sent to a thread like the
others, a scripted reasoner's answers arrive while the memory model's batch runs, and the branches split into two
cohorts that take turns on the memory model, each batch about half as large.) The build runs its engines in
``Engine.lockstep``: an engine that decodes continuously holds its next step after a completed call until the calls
that follow from it are sent, so which rows decode together does not depend on thread timing. ``wavefront``:
lock-step; every pending call of every branch goes to its engine as one request list, one engine after the other.
Both build the same trees on engines whose answers do not depend on their batch (a scripted engine): node ids come
from the rollout path, budgets are split, and every request carries its own seed; only batch compositions, and so
prefix-cache hits, differ. On a model, a token's logits can differ in their last bits with the rows computed beside
it, so a near-tie may be decided differently; a given build reproduces run to run with a scripted reasoner.

**Equal greedy calls are computed once** (``share_greedy_calls``, on by default). Siblings are copies of one rollout
that differ in one sampled action: until their paths part, they make the same greedy calls (a consolidation of the
same page under the same cue bank). On an engine that says a greedy answer is a function of the request
(``Engine.greedy_is_deterministic``: the transformers engine), a greedy request equal to one already answered in
this build (prompt, sampling limits, served weights; not the seed, which greedy decoding does not read), or being
generated, takes that answer instead of being generated again (``TreeRolloutStats.shared_greedy_calls`` counts them);
an answer already known is handed out in the scheduler's loop at once, one being generated with it. Each branch
receives the same tokens, log-probs and usage the first one did; a build without sharing computes them again in other
batches, so its trees can part from the shared build's at a near-tie (above). vLLM engines share nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from memrl.data.config import ConfigModel
from memrl.data.schemas import MemoryCall, MemoryCallTree, TokenUsage, TreeNode
from memrl.data.tracking import progress_bar
from memrl.data.user_code import in_episode
from memrl.rollout.engines.base import Engine, GenerationResult
from memrl.rollout.loop import EngineSet, PendingCall, Rollout

__all__ = [
    "TreeConfig",
    "TreeRolloutStats",
    "branch_at_first_difference",
    "build_trees",
    "check_trained_sampling",
    "merge_identical_siblings",
]


class TreeConfig(ConfigModel):
    """Budgets of tree (or flat) rollouts, and how their calls are scheduled."""

    mode: Literal["tree", "flat"] = "tree"  # tree: K-way branching at memory calls; flat: G rollouts per task
    branch_roles: list[str] = ["recall"]  # trained roles (recall, consolidate): their actions are nodes and branch
    branch_factor: int = Field(4, ge=1, le=64)  # K siblings per trainable call
    max_branch_depth: int | None = Field(None, ge=1, le=10**4)  # branch the first N actions of a path (None: all)
    max_leaves: int = Field(16, ge=1, le=4096)  # leaves per tree at most; split among siblings at every branching
    reasoner_token_budget: int | None = Field(None, ge=1, le=10**10)  # reasoner tokens per tree, split at branches
    flat_group_size: int = Field(4, ge=1, le=4096)  # G trajectories per task in flat mode
    scheduler: Literal["async", "wavefront"] = "async"  # async: each branch advances when its own call returns
    # (a Monte-Carlo difference between two copies of one text is never trained as a preference)
    merge_identical_siblings: bool = True  # siblings with equal token ids are one node whose V(n) pools their leaves
    share_greedy_calls: bool = True  # an equal greedy request answered once per build (module docstring)
    # dynamic sampling (DAPO): build more trees until the batch holds this many sibling groups whose V(n) differ
    informative_groups: int = Field(0, ge=0)  # dynamic sampling: outcome-informative groups wanted per batch (0: off)
    max_extra_trees: int = Field(0, ge=0)  # dynamic sampling: trees built beyond the iteration's tasks at most


def check_trained_sampling(role: str, temperature: float, top_p: float, where: str = "memory.sampling") -> None:
    """Refuse a trained role sampled with a transform the trainer's log-probs do not apply.

    The policy-gradient ratio compares the trainer's log-probs (raw logits: temperature 1, the full vocabulary) with
    the rollout's; a sample drawn at temperature != 1 or with top_p < 1 comes from another distribution, so the ratio
    and the rollout log-probs would be wrong for every trained token."""
    if temperature != 1.0 or top_p < 1.0:
        raise ValueError(
            f"{where}.{role}: role {role!r} is trained (tree.branch_roles) but sampled at temperature {temperature} "
            f"and top_p {top_p}; the trainer's log-probs are those of temperature 1 and top_p 1, so set "
            f"{where}.{role}.temperature=1.0 and top_p=1.0 or remove {role!r} from tree.branch_roles"
        )


@dataclass
class TreeRolloutStats:
    """Engine traffic of one :func:`build_trees` call (``wavefronts``: the wavefront scheduler's lock-steps)."""

    engine_calls: dict[str, int] = field(default_factory=dict)
    wavefronts: int = 0
    shared_greedy_calls: int = 0  # greedy requests answered from an equal one of this build (share_greedy_calls)

    def count(self, engine: Engine) -> None:
        """Record one call of ``engine``."""
        self.engine_calls[engine.name] = self.engine_calls.get(engine.name, 0) + 1


@dataclass
class _TreeState:
    task_id: str
    nodes: dict[str, TreeNode]
    usage: TokenUsage = field(default_factory=TokenUsage)
    live: int = 1  # branches still running: the tree is done at 0
    reentry: dict[str, int] = field(default_factory=dict)  # states re-entered by the forks (count_reentries)


@dataclass
class _Branch:
    rollout: Rollout
    tree: _TreeState
    node_id: str  # the tree node this rollout continues from
    leaves: int  # the most leaves this branch may still end as (its share of max_leaves)
    tokens: float | None  # reasoner tokens this branch may still spend and branch (its share of the budget)
    usage_since_node: TokenUsage = field(default_factory=TokenUsage)
    memory_usage_since_node: TokenUsage = field(default_factory=TokenUsage)


_Call = tuple[_Branch, PendingCall, int]  # a branch, its pending call, and how many samples the call draws


@dataclass
class _GreedyShare:
    """The greedy answers of one build, by engine and request (module docstring: equal greedy calls)."""

    enabled: bool
    stats: TreeRolloutStats
    answers: dict[tuple[Any, ...], GenerationResult] = field(default_factory=dict)
    # greedy requests being generated, and the equal calls sent meanwhile (answered with them, in the same step)
    in_flight: dict[tuple[Any, ...], list[Any]] = field(default_factory=dict)

    def key(self, engine: Engine, request: Any) -> tuple[Any, ...] | None:
        """What makes two greedy requests to ``engine`` the same computation; None for one that is not shared."""
        s = request.sampling
        if not self.enabled or not engine.greedy_is_deterministic or s.temperature != 0:
            return None
        prompt = (
            tuple(request.prompt_ids)
            if request.prompt_ids is not None
            else tuple(m.model_dump_json() for m in request.messages)
        )
        limits = (s.n, s.top_p, s.top_k, s.max_tokens, tuple(s.stop), s.logprobs, s.ignore_eos)
        return (id(engine), engine.policy_version, limits, prompt)

    def to_send(self, engine: Engine, items: list[_Call]) -> tuple[list[int], list[tuple[Any, ...] | None]]:
        """The indices of ``items`` the engine must generate (the first of each new greedy request), and every
        item's key."""
        keys = [self.key(engine, call.request) for _, call, _ in items]
        send, seen = [], set(self.answers) | set(self.in_flight)
        for i, k in enumerate(keys):
            if k is None or k not in seen:
                send.append(i)
                if k is not None:
                    seen.add(k)
        return send, keys

    def known(self, engine: Engine, items: list[_Call]) -> list[_Call]:
        """The calls whose greedy answer this build has already computed."""
        if not self.answers:
            return []
        return [item for item in items if (k := self.key(engine, item[1].request)) is not None and k in self.answers]

    def answer(
        self, keys: list[tuple[Any, ...] | None], send: list[int], results: list[GenerationResult]
    ) -> list[GenerationResult]:
        """Every item's result: the engine's for the ones sent, the shared answer for the others."""
        out: list[GenerationResult | None] = [None] * len(keys)
        for i, result in zip(send, results, strict=True):
            out[i] = result
            if keys[i] is not None:
                self.answers[keys[i]] = result  # type: ignore[index]
        for i, k in enumerate(keys):
            if out[i] is None:
                out[i] = self.answers[k]  # type: ignore[index]
                self.stats.shared_greedy_calls += 1
        return out  # type: ignore[return-value]


# a trainable action about to be taken: the rollout at its state, the pending call, the samples, their node ids
OnAction = Callable[[Rollout, PendingCall, GenerationResult, list[str]], None]


def build_trees(
    tasks: Sequence[Any],
    make_rollout: Callable[[Any, str], Rollout],
    engines: EngineSet,
    cfg: TreeConfig,
    *,
    config_hash: str = "",
    progress: str | None = None,
    on_action: OnAction | None = None,
) -> tuple[list[MemoryCallTree], TreeRolloutStats]:
    """Roll every task out as a memory-call tree (or G flat trajectories) and return the trees, in task order.

    ``on_action(state, call, result, node_ids)`` sees every trainable action before it is taken: the rollout at its
    state (to :meth:`~memrl.rollout.loop.Rollout.fork`, never to advance), the pending call, the engine's n samples
    and the node ids they become (a benchmark replays continuations from there for a ground truth)."""
    stats = TreeRolloutStats()
    trees: list[_TreeState] = []
    branches: list[_Branch] = []
    for task in tasks:
        starts = (
            [make_rollout(task, "r")]
            if cfg.mode == "tree"
            else [make_rollout(task, f"r{g}") for g in range(cfg.flat_group_size)]
        )
        state = _TreeState(
            task_id=starts[0].env.task_id, nodes={"root": TreeNode(node_id="root", kind="root")}, live=len(starts)
        )
        trees.append(state)
        budget = None if cfg.reasoner_token_budget is None else float(cfg.reasoner_token_budget)
        branches.extend(
            _Branch(rollout=r, tree=state, node_id="root", leaves=cfg.max_leaves, tokens=budget) for r in starts
        )

    bar = progress_bar(total=len(tasks), desc=progress, disable=progress is None, leave=False)

    def advance(branch: _Branch, call: PendingCall, result: GenerationResult, n: int) -> list[_Branch]:
        running = []
        with in_episode(branch.rollout.env.task_id, branch.rollout.rollout_id):
            advanced = _advance(branch, call, result, n, cfg, on_action)
        for b in advanced:
            if not b.rollout.done:
                running.append(b)
                continue
            _close_leaf(b)
            if b.tree.live == 0:
                bar.update(1)
        return running

    for b in branches:  # an episode over before its first model call (it failed at once): a leaf all the same
        if b.rollout.done:
            _close_leaf(b)
            if b.tree.live == 0:
                bar.update(1)
    branches = [b for b in branches if not b.rollout.done]
    schedule = _Schedule(engines, cfg, stats, advance, _GreedyShare(cfg.share_greedy_calls, stats))
    try:
        if cfg.scheduler == "wavefront":
            _run_wavefronts(branches, schedule)
        else:
            _run_blocking(_run_async(branches, schedule))
    finally:
        bar.close()
    out = []
    for t in trees:
        branched = sum(n.kind == "memory" and n.metadata.get("samples", 1) > 1 for n in t.nodes.values())
        merged = merge_identical_siblings(t.nodes) if cfg.merge_identical_siblings else 0
        out.append(
            MemoryCallTree(
                tree_id=f"{t.task_id}/{cfg.mode}",
                task_id=t.task_id,
                root_id="root",
                nodes=_in_path_order(t.nodes),
                reasoner_usage=t.usage,
                config_hash=config_hash,
                metadata={
                    "mode": cfg.mode,
                    "branched_nodes": branched,
                    "merged_siblings": merged,
                    **({"reentry": t.reentry} if t.reentry else {}),
                },
            )
        )
    return out, stats


def _action_key(node: TreeNode) -> tuple[Any, ...]:
    """What makes two sibling actions the same action: the token ids of every model call of it (the text, for an
    engine that returns no token ids, e.g. a scripted expert without a tokenizer)."""
    if node.call is None:
        return ("node", node.node_id)
    return (node.call.role, *((tuple(c.response_ids) or c.text) for c in (node.call, *node.follow_up_calls)))


def merge_identical_siblings(nodes: dict[str, TreeNode]) -> int:
    """Merge sibling memory nodes (one ``group_id``) whose action has the same token ids into the first of them, in
    place: the copies' children move under it, so V(n) pools every copy's leaves, and their continuation costs add
    up. ``metadata["copies"]`` counts the samples the node stands for. Returns the number of nodes merged away."""
    groups: dict[str, list[TreeNode]] = {}
    for node in nodes.values():
        if node.kind == "memory" and node.group_id is not None:
            groups.setdefault(node.group_id, []).append(node)
    merged = 0
    for members in groups.values():
        first_of: dict[tuple[Any, ...], TreeNode] = {}
        for node in sorted(members, key=lambda n: _path_key(n.node_id)):
            first = first_of.setdefault(_action_key(node), node)
            if first is node:
                continue
            for child in node.children:
                nodes[child].parent_id = first.node_id
            first.children = [*first.children, *node.children]
            first.reasoner_usage = first.reasoner_usage + node.reasoner_usage
            first.memory_usage = first.memory_usage + node.memory_usage
            first.metadata = {
                **first.metadata,
                "copies": first.metadata.get("copies", 1) + 1,
                "merged": [*first.metadata.get("merged", []), node.node_id],
            }
            assert node.parent_id is not None
            parent = nodes[node.parent_id]
            parent.children = [c for c in parent.children if c != node.node_id]
            del nodes[node.node_id]
            merged += 1
    return merged


def _call_key(call: MemoryCall) -> tuple[Any, ...]:
    """What makes two model calls the same trained row: role, prompt and response (token ids, else the text)."""
    return (
        call.role,
        tuple(call.prompt_ids) or tuple(m.content for m in call.messages),
        tuple(call.response_ids) or call.text,
    )


def _calls(node: TreeNode) -> list[MemoryCall]:
    return [c for c in (node.call, *node.follow_up_calls) if c is not None]


def branch_at_first_difference(tree: MemoryCallTree) -> int:
    """One action, one credit: siblings whose actions agree on their first calls share those calls, in place.

    Siblings that make the same first call(s) (same prompt, same response) and differ later become one node holding
    the shared calls (id ``<first sibling>^<calls>``, in the siblings' group, V(n) pooling their leaves, c(n) the mean
    of theirs); under it, each sibling keeps only its calls from the first one that differs, and they form a sibling
    group of their own (``<group>><shared node>``), whose calls share a prompt. Nested agreements branch again, so
    every distinct row is one node's call and no identical row is trained against itself with opposite advantages.
    Actions equal in every call are left to :func:`merge_identical_siblings`; a sibling whose action ends inside the
    shared calls keeps the siblings apart. Returns the number of shared nodes made (``metadata["shared_prefixes"]``;
    ``metadata["prefix_shared_siblings"]`` counts the siblings moved under one)."""
    nodes = {n.node_id: n for n in tree.nodes}
    groups: dict[str, list[TreeNode]] = {}
    for node in tree.nodes:
        if node.kind == "memory" and node.call is not None and node.group_id is not None:
            groups.setdefault(node.group_id, []).append(node)
    made: list[TreeNode] = []
    for group_id, members in groups.items():
        if len(members) > 1:
            _share_prefixes(nodes, members, 0, members[0].parent_id, group_id, made)
    if not made:
        return 0
    for node in nodes.values():
        node.children = []
    for node in nodes.values():
        if node.parent_id is not None:
            nodes[node.parent_id].children.append(node.node_id)
    made_ids = {n.node_id for n in made}
    moved = sum(n.parent_id in made_ids and n.node_id not in made_ids for n in nodes.values())
    tree.nodes = _in_path_order(nodes)
    tree.metadata = {**tree.metadata, "shared_prefixes": len(made), "prefix_shared_siblings": moved}
    return len(made)


def _share_prefixes(
    nodes: dict[str, TreeNode],
    members: list[TreeNode],
    start: int,
    parent_id: str | None,
    group_id: str,
    made: list[TreeNode],
) -> None:
    """Place ``members`` (which agree on their calls before ``start``) as siblings under ``parent_id`` in
    ``group_id``: each keeps its calls from ``start`` on, and members agreeing further share a node."""
    parts: dict[tuple[Any, ...], list[TreeNode]] = {}
    calls = {m.node_id: _calls(m) for m in members}
    for m in members:
        parts.setdefault(_call_key(calls[m.node_id][start]), []).append(m)
    for part in parts.values():
        shared = start + 1
        longest = min(len(calls[m.node_id]) for m in part)
        while shared < longest and len({_call_key(calls[m.node_id][shared]) for m in part}) == 1:
            shared += 1
        if len(part) == 1 or any(len(calls[m.node_id]) <= shared for m in part):
            for m in part:  # alone, or equal to another up to its end (merging is not this function's job)
                own = calls[m.node_id][start:]
                m.call, m.follow_up_calls, m.parent_id, m.group_id = own[0], own[1:], parent_id, group_id
            continue
        first = min(part, key=lambda n: _path_key(n.node_id))
        scores = [m.committee_score for m in part]
        node = TreeNode(
            node_id=f"{first.node_id}^{shared}",
            parent_id=parent_id,
            depth=first.depth,
            kind="memory",
            call=calls[first.node_id][start],
            follow_up_calls=calls[first.node_id][start + 1 : shared],
            group_id=group_id,
            committee_score=None if any(c is None for c in scores) else sum(scores) / len(scores),  # type: ignore[misc]
            metadata={
                "shared_by": sorted((m.node_id for m in part), key=_path_key),
                "calls": [start, shared],
                "copies": sum(m.metadata.get("copies", 1) for m in part),
            },
        )
        nodes[node.node_id] = node
        made.append(node)
        _share_prefixes(nodes, part, shared, node.node_id, f"{group_id}>{node.node_id}", made)


Advance = Callable[[_Branch, PendingCall, GenerationResult, int], list[_Branch]]
_Queues = dict[int, tuple[Engine, list[_Call]]]  # per engine (by id): the engine and the calls queued for it


@dataclass
class _Schedule:
    """What a scheduler drives: the engines, the tree settings, the build's counters, the step that moves a branch on
    with its call's result, and the greedy answers shared within the build."""

    engines: EngineSet
    cfg: TreeConfig
    stats: TreeRolloutStats
    advance: Advance
    share: _GreedyShare

    def queue(self, branch: _Branch, queues: _Queues) -> None:
        """Queue the branch's pending call for the engine that answers it."""
        call, n = _next_call(branch, self.cfg)
        engine = self.engines.for_call(call)
        queues.setdefault(id(engine), (engine, []))[1].append((branch, call, n))

    def answer(self, engine: Engine, items: list[_Call]) -> list[GenerationResult]:
        """The engine's answers to the calls, generated here and now (an equal greedy request once)."""
        send, keys = self.share.to_send(engine, items)
        answers = engine.generate([items[i][1].request for i in send]) if send else []
        if send:
            self.stats.count(engine)
        return self.share.answer(keys, send, answers)

    async def answer_async(
        self, engine: Engine, items: list[_Call]
    ) -> tuple[list[_Call], list[GenerationResult], bool]:
        """:meth:`answer` in the event loop: the calls answered, their answers, and whether the engine was called. A
        greedy call equal to one being generated by another call is answered with that one (and returned by it)."""
        share = self.share
        send, keys = share.to_send(engine, items)
        sending = {keys[i] for i in send if keys[i] is not None}
        kept = [i for i, k in enumerate(keys) if k is None or k in sending or k in share.answers]
        for i in sorted(set(range(len(items))) - set(kept)):
            share.in_flight[keys[i]].append(items[i])  # type: ignore[index]
        share.in_flight.update({k: [] for k in sending})
        try:
            answers = await engine.agenerate([items[i][1].request for i in send]) if send else []
        finally:
            parked = {k: share.in_flight.pop(k) for k in sending}
        if send:
            self.stats.count(engine)
        answered = [items[i] for i in kept]
        results = share.answer([keys[i] for i in kept], [kept.index(i) for i in send], answers)
        for k, calls in parked.items():
            answered += calls
            results += [share.answers[k]] * len(calls)
            self.stats.shared_greedy_calls += len(calls)
        return answered, results, bool(send)

    def move(self, items: list[_Call], results: list[GenerationResult]) -> list[_Branch]:
        """Move every branch on with its call's result; the branches still running."""
        running = []
        for (branch, call, n), result in zip(items, results, strict=True):
            running.extend(self.advance(branch, call, result, n))
        return running


def _run_wavefronts(active: list[_Branch], schedule: _Schedule) -> None:
    """Lock-step: every pending call goes to its engine in one request list per engine, then every branch moves."""
    active = [b for b in active if not b.rollout.done]
    while active:
        schedule.stats.wavefronts += 1
        batches: _Queues = {}
        for branch in active:
            schedule.queue(branch, batches)
        active = []
        for engine, items in batches.values():
            active.extend(schedule.move(items, schedule.answer(engine, items)))


async def _run_async(active: list[_Branch], schedule: _Schedule) -> None:
    """Each branch advances as soon as its own call returns; engines generate concurrently (module docstring)."""
    waiting: _Queues = {}  # calls not sent yet
    busy: set[int] = set()  # batching engines with a batch in flight
    in_flight: set[asyncio.Task[tuple[list[_Call], list[GenerationResult], bool, Engine]]] = set()
    to_settle: list[Engine] = []  # engines whose completed calls' follow-ups are being sent (Engine.lockstep)

    async def generate(engine: Engine, items: list[_Call]) -> tuple[list[_Call], list[GenerationResult], bool, Engine]:
        return (*await schedule.answer_async(engine, items), engine)

    def send(engine: Engine, items: list[_Call]) -> None:
        in_flight.add(asyncio.create_task(generate(engine, items)))

    def answer_inline() -> None:
        # engines that answer at next to no cost (Engine.answers_inline) and greedy calls answered earlier in the
        # build answer here, until no such call waits, so the branches they answer join the batch that is sent next
        # instead of waiting one batch behind it (and, on a lockstep engine, the same batch whatever the timing)
        while ready := [
            (key, engine, items if engine.answers_inline else schedule.share.known(engine, items))
            for key, (engine, items) in waiting.items()
        ]:
            ready = [(key, engine, items) for key, engine, items in ready if items]
            if not ready:
                return
            for key, engine, items in ready:
                answered = {id(item) for item in items}
                left = [item for item in waiting[key][1] if id(item) not in answered]
                if left:
                    waiting[key] = (engine, left)
                else:
                    del waiting[key]
                for running in schedule.move(items, schedule.answer(engine, items)):
                    schedule.queue(running, waiting)

    for branch in active:
        if not branch.rollout.done:
            schedule.queue(branch, waiting)
    each = schedule.engines
    engines = {id(e): e for e in (each.reasoner, each.memory, *each.by_role.values())}
    with contextlib.ExitStack() as lockstep:
        for engine in engines.values():
            lockstep.enter_context(engine.lockstep())
        to_settle.extend(engines.values())  # their first calls, sent below
        try:
            while True:
                answer_inline()
                for key, (engine, items) in list(waiting.items()):
                    if engine.concurrent_requests:
                        for item in items:
                            send(engine, [item])
                    elif key not in busy:
                        busy.add(key)
                        send(engine, items)
                    else:
                        continue
                    del waiting[key]
                if to_settle:
                    await asyncio.sleep(0)  # the calls just sent reach their engines before those go on
                    for engine in to_settle:
                        engine.settle()
                    to_settle.clear()
                if not in_flight:  # nothing waits either: a waiting call's engine always has a batch in flight
                    break
                done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    in_flight.discard(task)
                    items, results, called, engine = task.result()
                    busy.discard(id(engine))
                    if called:
                        to_settle.append(engine)
                    for running in schedule.move(items, results):
                        schedule.queue(running, waiting)
        finally:
            for task in in_flight:
                task.cancel()


def _run_blocking(coroutine: Any) -> None:
    """Run the scheduler's event loop here, or in a thread of its own when this thread already runs one (a notebook,
    an async actor)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(coroutine)
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="memrl-trees") as pool:
        pool.submit(asyncio.run, coroutine).result()


def _continues_action(call: PendingCall) -> bool:
    """A later model call of the memory action already under way (a recall's second page): part of that node."""
    return bool(call.request.metadata.get("continues_action"))


def _next_call(branch: _Branch, cfg: TreeConfig) -> tuple[PendingCall, int]:
    """The branch's pending call, with the number of samples it draws (K where the branch may branch, else 1)."""
    with in_episode(branch.rollout.env.task_id, branch.rollout.rollout_id):
        call = branch.rollout.pending()
    assert call is not None
    n = _samples_for(call, branch, cfg)
    call.request.sampling.n = n
    return call, n


def _samples_for(call: PendingCall, branch: _Branch, cfg: TreeConfig) -> int:
    if call.kind == "memory" and call.role in cfg.branch_roles:
        check_trained_sampling(call.role, call.request.sampling.temperature, call.request.sampling.top_p)
    if cfg.mode != "tree" or call.kind != "memory" or call.role not in cfg.branch_roles or _continues_action(call):
        return 1
    depth = branch.tree.nodes[branch.node_id].depth
    if cfg.max_branch_depth is not None and depth >= cfg.max_branch_depth:
        return 1
    if branch.leaves < cfg.branch_factor:
        return 1
    if branch.tokens is not None and branch.tokens <= 0:
        return 1
    return cfg.branch_factor


def _advance(
    branch: _Branch,
    call: PendingCall,
    result: GenerationResult,
    n: int,
    cfg: TreeConfig,
    on_action: OnAction | None = None,
) -> list[_Branch]:
    """Consume the engine's answer to the branch's call: the branch moves on, or forks into n siblings."""
    if call.kind == "reasoner":
        spent = TokenUsage(
            prompt_tokens=result.usage.prompt_tokens,
            cached_prompt_tokens=result.usage.cached_prompt_tokens,
            completion_tokens=sum(len(c.response_ids) for c in result.completions) or result.usage.completion_tokens,
            calls=1,
        )
        branch.tree.usage = branch.tree.usage + spent
        branch.usage_since_node = branch.usage_since_node + spent
        if branch.tokens is not None:
            branch.tokens -= spent.prompt_tokens + spent.completion_tokens
        branch.rollout.advance(result)
        return [branch]
    if call.role in cfg.branch_roles and _continues_action(call):
        record = branch.rollout.advance(result)
        assert record is not None
        node = branch.tree.nodes[branch.node_id]
        if node.kind == "memory" and node.call is not None and node.call.role == call.role:
            node.follow_up_calls.append(record)
        return [branch]
    if call.role in cfg.branch_roles:
        if on_action is not None:
            rid, depth = branch.rollout.rollout_id, branch.tree.nodes[branch.node_id].depth + 1
            ids = [f"{rid}.{k}:{depth}" if n > 1 else f"{rid}:{depth}" for k in range(n)]
            on_action(branch.rollout, call, result, ids)
        return _branch_out(branch, result, n)
    record = branch.rollout.advance(result)
    if record is not None:
        branch.memory_usage_since_node = branch.memory_usage_since_node + TokenUsage(
            prompt_tokens=record.prompt_tokens, completion_tokens=record.completion_tokens, calls=1
        )
    return [branch]


def _settle(branch: _Branch) -> None:
    """Charge the tokens spent since the branch's node to that node (its continuation cost)."""
    node = branch.tree.nodes[branch.node_id]
    node.reasoner_usage = node.reasoner_usage + branch.usage_since_node
    node.memory_usage = node.memory_usage + branch.memory_usage_since_node
    branch.usage_since_node, branch.memory_usage_since_node = TokenUsage(), TokenUsage()


def _add_child(tree: _TreeState, node: TreeNode) -> None:
    assert node.parent_id is not None and node.node_id not in tree.nodes
    tree.nodes[node.node_id] = node
    tree.nodes[node.parent_id].children.append(node.node_id)


def count_reentries(counts: dict[str, int], forks: list[Any]) -> None:
    """Add the forks' re-entries to ``counts``: ``snapshot`` / ``replay`` (states re-entered each way),
    ``replayed_steps`` (environment steps or model calls replayed) and ``replay_verified`` (replays whose every
    observation or request matched the log: a replay that does not is a ReplayMismatchError and never gets here)."""
    for fork in forks:
        record = getattr(fork, "last_reentry", None)
        if not record:
            continue
        counts[record["mode"]] = counts.get(record["mode"], 0) + 1
        if record["mode"] == "replay":
            counts["replayed_steps"] = counts.get("replayed_steps", 0) + record["replayed_steps"]
            counts["replay_verified"] = counts.get("replay_verified", 0) + 1


def _branch_out(branch: _Branch, result: GenerationResult, n: int) -> list[_Branch]:
    """The n samples of a trainable action: one sibling node each, each on its own fork of the rollout.

    Ids come from the rollout path (``r.1.0``: sample 0 of the second branching under sample 1 of the first), so they
    do not depend on the order in which branches reach their actions."""
    _settle(branch)
    tree = branch.tree
    parent = tree.nodes[branch.node_id]
    rollout_id = branch.rollout.rollout_id
    group_id = f"g:{rollout_id}:{parent.depth + 1}"
    children = [branch.rollout.fork(f"{rollout_id}.{k}") for k in range(n - 1)] + [branch.rollout]
    count_reentries(tree.reentry, children[:-1])
    if n > 1:
        branch.rollout.rollout_id = f"{rollout_id}.{n - 1}"
    out = []
    for k, rollout in enumerate(children):
        record = rollout.advance(result, sample=k)
        assert record is not None
        node = TreeNode(
            node_id=f"{rollout.rollout_id}:{parent.depth + 1}",
            parent_id=parent.node_id,
            depth=parent.depth + 1,
            kind="memory",
            call=record,
            group_id=group_id,
            metadata={"sample": k, "samples": n},
        )
        _add_child(tree, node)
        leaves = branch.leaves // n + (1 if k < branch.leaves % n else 0)
        tokens = None if branch.tokens is None else branch.tokens / n
        out.append(_Branch(rollout=rollout, tree=tree, node_id=node.node_id, leaves=leaves, tokens=tokens))
    tree.live += n - 1
    return out


def _close_leaf(branch: _Branch) -> None:
    _settle(branch)
    tree = branch.tree
    rollout = branch.rollout
    leaf = TreeNode(
        node_id=f"{rollout.rollout_id}:leaf",
        parent_id=branch.node_id,
        depth=tree.nodes[branch.node_id].depth + 1,
        kind="leaf",
        answer=rollout.answer,
        outcome=rollout.outcome,
        metadata={"rollout_id": rollout.rollout_id, "stats": {**rollout.memory.stats, **rollout.stats}},
    )
    _add_child(tree, leaf)
    tree.live -= 1


def _path_key(node_id: str) -> list[Any]:
    """Sort key of a node id: its rollout path with numbers compared as numbers (r.2 before r.10)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", node_id)]


def _in_path_order(nodes: dict[str, TreeNode]) -> list[TreeNode]:
    """The nodes depth-first from the root, siblings by sample index: one order whatever the scheduler's timing."""
    out: list[TreeNode] = []
    stack = ["root"]
    while stack:
        node = nodes[stack.pop()]
        node.children.sort(key=_path_key)
        out.append(node)
        stack.extend(reversed(node.children))
    return out
