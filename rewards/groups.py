"""From credited rollouts to the trainer's groups, for both algorithms: OAT-GRPO's memory-call trees
(:func:`credit_and_groups`, :func:`trees_to_groups`) and pivot-turn GRPO's pivot samples (:func:`pivot_groups`).

A :class:`~memrl.data.schemas.Group` is what :class:`memrl.train.group_trainer.GroupTrainer` consumes: one prompt (its
engine token ids) and the sampled responses to it, each with its reward and group-relative advantage.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from memrl.data.schemas import Group, GroupSample, MemoryCall, MemoryCallTree, TreeNode
from memrl.rewards.advantage import is_zero_variance, shaped_batch_advantages
from memrl.rewards.credit import CreditConfig, assign_batch_credit
from memrl.rewards.pivot import PivotRewardConfig, pivot_terms
from memrl.rollout.pivots import PivotGroupResult, PivotSample

__all__ = ["credit_and_groups", "pivot_groups", "trees_to_groups"]


def credit_and_groups(
    trees: list[MemoryCallTree], credit: CreditConfig, mode: Literal["tree", "flat"], seed: int
) -> tuple[list[Group], dict[str, Any]]:
    """OAT credit over one iteration's trees, all workers' together (the batch-level options, ``baseline: global``
    and ``shuffle_outcomes``, see the whole batch), then the trainer groups in task order, and the credit metrics:
    outcome-informative sibling groups, the outcome-tie fraction among sibling groups, and the identical-sibling
    fraction (sampled sibling actions merged into an earlier identical one, of all sampled siblings) beside the
    prefix-shared fraction (sampled siblings that share their first calls with another and branch later, of all
    sampled siblings: ``credit.shared_prefix: branch`` trains those calls once)."""
    stats = assign_batch_credit(trees, credit, mode=mode, seed=seed)
    groups = trees_to_groups(trees, source="oat" if mode == "tree" else "flat")
    ties, informative = sum(c.outcome_tie_groups for c in stats), sum(c.informative_groups for c in stats)
    branched = sum(int(t.metadata.get("branched_nodes", 0)) for t in trees)
    metrics: dict[str, Any] = {
        "credit_groups": sum(c.groups for c in stats),
        "credit_zero_variance_groups": sum(c.zero_variance_groups for c in stats),
        "informative_groups": informative,
        "memory_calls_trained": sum(len(g.samples) for g in groups),
    }
    if ties + informative:  # a fraction over no sibling groups is absent, not 0
        metrics["outcome_tie_fraction"] = ties / (ties + informative)
    if branched:
        metrics["identical_sibling_fraction"] = sum(int(t.metadata.get("merged_siblings", 0)) for t in trees) / branched
        metrics["prefix_shared_sibling_fraction"] = (
            sum(int(t.metadata.get("prefix_shared_siblings", 0)) for t in trees) / branched
        )
    return groups, metrics


def trees_to_groups(trees: Sequence[MemoryCallTree], *, source: Literal["oat", "flat"] = "oat") -> list[Group]:
    """Turn scored trees into trainer groups: the memory nodes that share a parent context, with their advantages.

    Tree mode: one group per sibling set (the first model call of each sibling's action). Flat mode: every trainable
    action is a one-sample group carrying its trajectory's advantage. Either way the later calls of an action
    (``follow_up_calls``) are one-sample groups carrying their node's advantage: they are part of the same action and
    share its credit, but their prompts differ between siblings (the running extraction), so they cannot join its
    group (the trainer needs no shared prompt for a one-sample group). Each group's ``metadata["outcome_tied"]`` says
    whether its sibling group's values V(n) tie (what the trainer's tied-share diagnostics count).
    """
    groups: list[Group] = []
    for tree in trees:
        members: dict[tuple[str, tuple[int, ...]], list[TreeNode]] = {}
        for node in tree.nodes:
            if node.kind == "memory" and node.call is not None and node.advantage is not None:
                key = (node.group_id if source == "oat" else node.node_id) or node.node_id
                # a trainer group shares one prompt: siblings always do, by construction; keyed by it all the same
                members.setdefault((key, tuple(node.call.prompt_ids)), []).append(node)
        seen: dict[str, int] = {}
        for (key, _), nodes in members.items():
            first = nodes[0].call
            assert first is not None
            gid = f"{tree.tree_id}/{key}"
            seen[gid] = seen.get(gid, 0) + 1
            meta = {"outcome_tied": bool(nodes[0].metadata.get("outcome_tied", False))}
            groups.append(
                Group(
                    group_id=gid if seen[gid] == 1 else f"{gid}#{seen[gid]}",
                    task_id=tree.task_id,
                    role=first.role,
                    prompt_ids=list(first.prompt_ids),
                    messages=list(first.messages),
                    source=source,
                    samples=[_tree_sample(n.call, n) for n in nodes if n.call is not None],
                    metadata=meta,
                )
            )
            for n in nodes:
                for i, follow in enumerate(n.follow_up_calls):
                    groups.append(
                        Group(
                            group_id=f"{tree.tree_id}/{key}/{n.node_id}/f{i + 1}",
                            task_id=tree.task_id,
                            role=follow.role,
                            prompt_ids=list(follow.prompt_ids),
                            messages=list(follow.messages),
                            source=source,
                            samples=[_tree_sample(follow, n)],
                            metadata=meta,
                        )
                    )
    return groups


def _group_sample(call: MemoryCall, reward: float, advantage: float, node_id: str, **extra: Any) -> GroupSample:
    """A trainer sample: the call's tokens and log-probs (as the engine returned them) with a reward and advantage."""
    return GroupSample(
        response_ids=list(call.response_ids),
        rollout_logprobs=list(call.logprobs),
        text=call.text,
        finish_reason=call.finish_reason,
        policy_version=call.policy_version,
        reward=reward,
        advantage=advantage,
        node_id=node_id,
        **extra,
    )


def _tree_sample(call: MemoryCall, node: TreeNode) -> GroupSample:
    """A trainer sample: the call's tokens and log-probs with its node's reward and advantage."""
    return _group_sample(call, node.reward or 0.0, node.advantage or 0.0, node.node_id)


def _pivot_sample(call: MemoryCall, reward: float, advantage: float, node_id: str, sample: PivotSample) -> GroupSample:
    """A trainer sample of a pivot group: the call's tokens and log-probs with its sample's reward and advantage."""
    metadata = {
        "outcome": sample.outcome,
        "reminder": sample.reminder is not None,
        "reminders_after": sample.reminders_after,
    }
    return _group_sample(call, reward, advantage, node_id, metadata=metadata)


def pivot_groups(results: list[PivotGroupResult], cfg: PivotRewardConfig | None = None) -> list[Group]:
    """Score every sample (outcome and shaping), compute the advantages of all the iteration's groups together (the
    batch of ``cfg.advantage``'s batch-level options), and build the trainer's :class:`Group` s."""
    cfg = cfg or PivotRewardConfig()
    groups: list[Group] = []
    terms = [[pivot_terms(s, cfg) for s in result.samples] for result in results]
    batch = shaped_batch_advantages([([o for o, _ in t], [s for _, s in t]) for t in terms], cfg.advantage)
    for result, group_terms, advantages in zip(results, terms, batch, strict=True):
        rewards = [o + s for o, s in group_terms]
        meta = {
            **result.metadata,
            "pivot_id": result.pivot_id,
            "state": result.state,
            "outcome_tied": is_zero_variance([o for o, _ in group_terms]),
        }
        groups.append(
            Group(
                group_id=result.pivot_id,
                task_id=result.task_id,
                role=result.role,
                prompt_ids=list(result.prompt_ids),
                messages=list(result.messages),
                samples=[
                    _pivot_sample(s.call, r, a, f"{result.pivot_id}/s{s.index}", s)
                    for s, r, a in zip(result.samples, rewards, advantages, strict=True)
                ],
                source="pivot",
                metadata=meta,
            )
        )
        for s, r, a in zip(result.samples, rewards, advantages, strict=True):
            if s.followup is None:
                continue
            groups.append(
                Group(
                    group_id=f"{result.pivot_id}/s{s.index}/phase2",
                    task_id=result.task_id,
                    role=s.followup.role,
                    prompt_ids=list(s.followup.prompt_ids),
                    messages=list(s.followup.messages),
                    samples=[_pivot_sample(s.followup, r, a, f"{result.pivot_id}/s{s.index}/phase2", s)],
                    source="pivot",
                    metadata={**meta, "follows": f"{result.pivot_id}/s{s.index}"},
                )
            )
    return groups
