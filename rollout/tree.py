"""Memory-call trees (OAT-GRPO rollouts, seed 001 section 2.3) and the flat baseline.

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
budgets allow: ``max_leaves`` (live leaves of the tree), ``reasoner_token_budget`` (reasoner tokens of the tree) and,
when set, ``max_branch_depth`` (memory actions on a path); past a budget the action is sampled once and becomes a
single-member node (it carries no advantage).

Flat mode (vanilla GRPO over trajectories): G independent rollouts per task; every trainable action of a trajectory
is a node of that trajectory's chain and shares its outcome.

Token accounting: ``MemoryCallTree.reasoner_usage`` counts every reasoner call once. A node's ``reasoner_usage`` /
``memory_usage`` is its continuation cost: what its branch spent after it, up to the next node or the end.

All pending calls of all rollouts of all trees go to their engine as one request list per wavefront, so vLLM batches
them and its prefix cache serves the siblings' shared context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tqdm.auto import tqdm

from data.config import ConfigModel
from data.schemas import Group, GroupSample, MemoryCallTree, TokenUsage, TreeNode
from rollout.engines.base import Engine
from rollout.loop import EngineSet, PendingCall, Rollout

__all__ = ["TreeConfig", "TreeRolloutStats", "build_trees", "check_trained_sampling", "trees_to_groups"]


class TreeConfig(ConfigModel):
    """Budgets of tree (or flat) rollouts."""

    mode: Literal["tree", "flat"] = "tree"  # tree: K-way branching at memory calls; flat: G rollouts per task
    branch_roles: list[str] = ["recall"]  # trained roles (recall, consolidate): their actions are nodes and branch
    branch_factor: int = 4  # K siblings per trainable call
    max_branch_depth: int | None = None  # only the first this many memory actions on a path branch (None: no limit)
    max_leaves: int = 16  # no branching that would take the tree past this many live leaves
    reasoner_token_budget: int | None = None  # per tree: stop branching once this many reasoner tokens are spent
    flat_group_size: int = 4  # G trajectories per task in flat mode


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
    """Engine traffic of one :func:`build_trees` call."""

    engine_calls: dict[str, int] = field(default_factory=dict)
    wavefronts: int = 0
    requests: int = 0


@dataclass
class _Branch:
    rollout: Rollout
    tree: _TreeState
    node_id: str  # the tree node this rollout continues from
    usage_since_node: TokenUsage = field(default_factory=TokenUsage)
    memory_usage_since_node: TokenUsage = field(default_factory=TokenUsage)


@dataclass
class _TreeState:
    task_id: str
    nodes: dict[str, TreeNode]
    usage: TokenUsage = field(default_factory=TokenUsage)
    live: int = 1
    counter: int = 0

    def new_id(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"


def _add_child(tree: _TreeState, parent_id: str, node: TreeNode) -> None:
    tree.nodes[node.node_id] = node
    tree.nodes[parent_id].children.append(node.node_id)


def build_trees(
    tasks: Sequence[Any],
    make_rollout: Callable[[Any, str], Rollout],
    engines: EngineSet,
    cfg: TreeConfig,
    *,
    config_hash: str = "",
    progress: str | None = None,
) -> tuple[list[MemoryCallTree], TreeRolloutStats]:
    """Roll every task out as a memory-call tree (or G flat trajectories) and return the trees."""
    stats = TreeRolloutStats()
    trees: list[_TreeState] = []
    branches: list[_Branch] = []
    for task in tasks:
        starts = [make_rollout(task, "r")] if cfg.mode == "tree" else [
            make_rollout(task, f"r{g}") for g in range(cfg.flat_group_size)
        ]
        task_id = starts[0].env.task_id
        state = _TreeState(task_id=task_id, nodes={"root": TreeNode(node_id="root", kind="root")}, live=len(starts))
        trees.append(state)
        branches.extend(_Branch(rollout=r, tree=state, node_id="root") for r in starts)

    bar = tqdm(total=len(tasks), desc=progress, disable=progress is None, leave=False)
    active = [b for b in branches if not b.rollout.done]
    while active:
        stats.wavefronts += 1
        batches: dict[int, tuple[Engine, list[tuple[_Branch, PendingCall, int]]]] = {}
        for branch in active:
            call = branch.rollout.pending()
            assert call is not None
            n = _samples_for(call, branch, cfg)
            call.request.sampling.n = n
            engine = engines.for_call(call)
            batches.setdefault(id(engine), (engine, []))[1].append((branch, call, n))
        next_active: list[_Branch] = []
        for engine, items in batches.values():
            results = engine.generate([call.request for _, call, _ in items])
            stats.engine_calls[engine.name] = stats.engine_calls.get(engine.name, 0) + 1
            stats.requests += len(items)
            for (branch, call, n), result in zip(items, results, strict=True):
                if call.kind == "reasoner":
                    spent = TokenUsage(
                        prompt_tokens=result.usage.prompt_tokens,
                        cached_prompt_tokens=result.usage.cached_prompt_tokens,
                        completion_tokens=sum(len(c.response_ids) for c in result.completions)
                        or result.usage.completion_tokens,
                        calls=1,
                    )
                    branch.tree.usage = branch.tree.usage + spent
                    branch.usage_since_node = branch.usage_since_node + spent
                    branch.rollout.advance(result)
                    next_active.append(branch)
                elif call.role in cfg.branch_roles and _continues_action(call):
                    record = branch.rollout.advance(result)
                    assert record is not None
                    node = branch.tree.nodes[branch.node_id]
                    if node.kind == "memory" and node.call is not None and node.call.role == call.role:
                        node.follow_up_calls.append(record)
                    next_active.append(branch)
                elif call.role in cfg.branch_roles:
                    next_active.extend(_branch_out(branch, call, result, n, cfg))
                else:
                    record = branch.rollout.advance(result)
                    if record is not None:
                        branch.memory_usage_since_node = branch.memory_usage_since_node + TokenUsage(
                            prompt_tokens=record.prompt_tokens, completion_tokens=record.completion_tokens, calls=1
                        )
                    next_active.append(branch)
        active = []
        for branch in next_active:
            if branch.rollout.done:
                _close_leaf(branch)
                if branch.tree.live == 0:
                    bar.update(1)
            else:
                active.append(branch)
    bar.close()
    out = [
        MemoryCallTree(
            tree_id=f"{t.task_id}/{cfg.mode}", task_id=t.task_id, root_id="root", nodes=list(t.nodes.values()),
            reasoner_usage=t.usage, config_hash=config_hash, metadata={"mode": cfg.mode},
        )
        for t in trees
    ]
    return out, stats


def _continues_action(call: PendingCall) -> bool:
    """A later model call of the memory action already under way (a recall's second page): part of that node."""
    return bool(call.request.metadata.get("continues_action"))


def _samples_for(call: PendingCall, branch: _Branch, cfg: TreeConfig) -> int:
    if call.kind == "memory" and call.role in cfg.branch_roles:
        check_trained_sampling(call.role, call.request.sampling.temperature, call.request.sampling.top_p)
    if cfg.mode != "tree" or call.kind != "memory" or call.role not in cfg.branch_roles or _continues_action(call):
        return 1
    depth = branch.tree.nodes[branch.node_id].depth
    if cfg.max_branch_depth is not None and depth >= cfg.max_branch_depth:
        return 1
    if branch.tree.live + cfg.branch_factor - 1 > cfg.max_leaves:
        return 1
    budget = cfg.reasoner_token_budget
    if budget is not None and branch.tree.usage.prompt_tokens + branch.tree.usage.completion_tokens >= budget:
        return 1
    branch.tree.live += cfg.branch_factor - 1  # reserve the leaves now: other branches decide in this wavefront too
    return cfg.branch_factor


def _settle(branch: _Branch) -> None:
    """Charge the tokens spent since the branch's node to that node (its continuation cost)."""
    node = branch.tree.nodes[branch.node_id]
    node.reasoner_usage = node.reasoner_usage + branch.usage_since_node
    node.memory_usage = node.memory_usage + branch.memory_usage_since_node
    branch.usage_since_node, branch.memory_usage_since_node = TokenUsage(), TokenUsage()


def _branch_out(branch: _Branch, call: PendingCall, result: Any, n: int, cfg: TreeConfig) -> list[_Branch]:
    _settle(branch)
    tree = branch.tree
    parent = tree.nodes[branch.node_id]
    group_id = tree.new_id("g")
    children = [branch.rollout.fork(f"{branch.rollout.rollout_id}.{k}") for k in range(n - 1)] + [branch.rollout]
    if n > 1:
        branch.rollout.rollout_id = f"{branch.rollout.rollout_id}.{n - 1}"
    out = []
    for k, rollout in enumerate(children):
        record = rollout.advance(result, sample=k)
        assert record is not None
        node = TreeNode(
            node_id=tree.new_id("n"), parent_id=parent.node_id, depth=parent.depth + 1, kind="memory", call=record,
            group_id=group_id, metadata={"sample": k, "samples": n},
        )
        _add_child(tree, parent.node_id, node)
        out.append(_Branch(rollout=rollout, tree=tree, node_id=node.node_id))
    return out


def _close_leaf(branch: _Branch) -> None:
    _settle(branch)
    tree = branch.tree
    rollout = branch.rollout
    leaf = TreeNode(
        node_id=tree.new_id("leaf"), parent_id=branch.node_id, depth=tree.nodes[branch.node_id].depth + 1,
        kind="leaf", answer=rollout.answer, outcome=rollout.outcome,
        metadata={"rollout_id": rollout.rollout_id, "stats": {**rollout.memory.stats, **rollout.stats}},
    )
    _add_child(tree, branch.node_id, leaf)
    tree.live -= 1


def trees_to_groups(trees: Sequence[MemoryCallTree], *, source: Literal["oat", "flat"] = "oat") -> list[Group]:
    """Turn scored trees into trainer groups: the memory nodes that share a parent context, with their advantages.

    Tree mode: one group per sibling set (the first model call of each sibling's action). Flat mode: every trainable
    action is a one-sample group carrying its trajectory's advantage. Either way the later calls of an action
    (``follow_up_calls``) are one-sample groups carrying their node's advantage: they are part of the same action and
    share its credit, but their prompts differ between siblings (the running extraction), so they cannot join its
    group (the trainer needs no shared prompt for a one-sample group).
    """
    groups: list[Group] = []
    for tree in trees:
        members: dict[str, list[TreeNode]] = {}
        for node in tree.nodes:
            if node.kind == "memory" and node.call is not None and node.advantage is not None:
                key = node.group_id if source == "oat" else node.node_id
                members.setdefault(key or node.node_id, []).append(node)
        for key, nodes in members.items():
            first = nodes[0].call
            assert first is not None
            samples = [
                GroupSample(
                    response_ids=list(n.call.response_ids), rollout_logprobs=list(n.call.logprobs), text=n.call.text,
                    finish_reason=n.call.finish_reason, policy_version=n.call.policy_version, reward=n.reward or 0.0,
                    advantage=n.advantage or 0.0, node_id=n.node_id,
                )
                for n in nodes
                if n.call is not None
            ]
            groups.append(Group(
                group_id=f"{tree.tree_id}/{key}", task_id=tree.task_id, role=first.role,
                prompt_ids=list(first.prompt_ids), messages=list(first.messages), samples=samples, source=source,
            ))
            for n in nodes:
                for i, follow in enumerate(n.follow_up_calls):
                    groups.append(Group(
                        group_id=f"{tree.tree_id}/{key}/{n.node_id}/f{i + 1}", task_id=tree.task_id, role=follow.role,
                        prompt_ids=list(follow.prompt_ids), messages=list(follow.messages), source=source,
                        samples=[GroupSample(
                            response_ids=list(follow.response_ids), rollout_logprobs=list(follow.logprobs),
                            text=follow.text, finish_reason=follow.finish_reason, policy_version=follow.policy_version,
                            reward=n.reward or 0.0, advantage=n.advantage or 0.0, node_id=n.node_id,
                        )],
                    ))
    return groups
