"""OAT-GRPO credit assignment over a memory-call tree ("SAM: State-Adaptive Memory for Long-Horizon Reasoning
Agent", arXiv 2605.24468, section 2.3).

Symbols (paper -> code):
    L(n)   leaves in the subtree rooted at memory action n       -> tree.leaves_below(n)
    V(n)   = mean_{l in L(n)} outcome(l)   Monte-Carlo node value -> node.value
    c(n)   committee recoverability score in [0, 1]               -> node.committee_score (memrl.rewards.committee)
    c_bar  centre: the sibling mean of c (default) or a constant  -> the term's ``centre``
    r(n)   = V(n) + lambda * (c(n) - c_bar) [- format penalty]    -> node.reward
    A(n)   group-relative advantage within the siblings of n     -> node.advantage (memrl.rewards.advantage)

**Reward terms.** The shaping part is a weighted list of registered terms (:mod:`memrl.rewards.terms`),
``credit.terms: [{name: committee, weight: 0.5}, {entry: "mypkg.rewards:brevity", weight: 0.1}]``:
r(n) = V(n) + sum_t w_t (term_t(n) - centre_t) - format penalty. The committee (lambda = its weight, c(n) its
score) is the first entry of the default list, not a special case. Siblings are the memory nodes that share a parent
context (same ``group_id``). A group where any member lacks a term's score (a committee call that failed, a user term
returning None) drops that term for the whole group, so siblings are always compared on the same terms.

**What c_bar does and does not change.** With the sibling baseline (GRPO), A(n) depends on r(n) - mean_siblings(r)
= (V(n) - mean V) + lambda (c(n) - mean c): any c_bar that is one number per group (the sibling mean, a constant)
cancels, so ``centre`` changes the logged reward, never a sibling advantage. What the committee term changes is the
ranking inside a group (through lambda), and with the group std (``advantage.scale: group_std``) it is also rescaled
by the group's std. Variants that make c_bar (and lambda's absolute size) matter:

- ``advantage.scale: none`` (Dr. GRPO): A(n) = r(n) - mean(r), so lambda weighs the committee term against the
  outcome in absolute units instead of being normalised away by the group's std;
- ``baseline: global``: A(n) = r(n) - b with one baseline b over every memory action of the batch (divided by the
  batch std under ``advantage.scale: group_std``); a group whose actions are all more recoverable than c_bar (a
  constant ``centre``) is pushed up as a whole, and values V(n) are compared across groups.

**Outcome and shaping.** Credit hands :func:`memrl.rewards.advantage.shaped_batch_advantages` each sibling group's
outcomes V(n) and its shaping lambda (c(n) - c_bar) - format penalty, for the whole batch at once; ``advantage``
(:class:`~memrl.rewards.advantage.AdvantageConfig`) says whether shaping may set an advantage on its own inside an
outcome-tied group (the paper's ``grpo_std`` lets it, at unit size) and whether a batch without outcome signal updates.

``shuffle_outcomes`` is the no-signal control: the leaf outcomes are permuted across the batch before credit, and so
are the committee scores of its memory actions (otherwise the oracle-anchored committee term would still carry the
oracle's preference), so the advantages carry no information about the task.

Flat GRPO (``assign_flat_credit``) gives every model call of trajectory i its trajectory's advantage A_i. A failing
trajectory tends to make more calls, so copying A_i to each would push the policy down on average; with
``flat_weighting: per_trajectory`` (the default) each call gets A_i / m_i (m_i: the trajectory's trained calls), so
every trajectory counts once and the advantages over trained rows sum to zero, as GRPO's do over trajectories.

One action, one credit (``shared_prefix: branch``): siblings that agree on their first calls share them as one node
and branch where they first differ (:func:`memrl.rollout.tree.branch_at_first_difference`), so a call is never
trained twice against itself with opposite advantages.

Diagnostics (:class:`CreditStats`): a sibling group is *outcome-informative* when its members' V(n) differ; an
*outcome tie* is one whose V(n) are all equal, whatever the committee term then adds to r(n). In flat mode the group
is a task's G trajectories and V is each one's outcome.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import Field

from memrl.data.config import ConfigModel
from memrl.data.schemas import MemoryCallTree, TreeNode
from memrl.rewards.advantage import (
    AdvantageConfig,
    is_zero_variance,
    shaped_batch_advantages,
    shaped_group_advantages,
)
from memrl.rewards.terms import RewardTermConfig, build_term, score_term
from memrl.rollout.tree import branch_at_first_difference

__all__ = [
    "CreditConfig",
    "CreditStats",
    "assign_batch_credit",
    "assign_credit",
    "assign_flat_credit",
    "build_terms",
    "informative_groups",
    "node_values",
]


class CreditConfig(ConfigModel):
    """Weights of the OAT reward and the advantage scaling."""

    renamed_keys: ClassVar[dict[str, str]] = {
        "advantage_scale": "set 'advantage.scale' in the same section ('std' is now 'group_std'; the preset "
        "'advantage: grpo_std' is the paper's formula, 'advantage: dr_grpo' the former 'none')",
        "eps": "set 'advantage.eps' in the same section",
        "committee_weight": "the committee is a weighted reward term now: set 'terms' in the same section, e.g. "
        "terms: [{name: committee, weight: 0.5}] (weight 0, or no committee entry, turns it off)",
        "centre": "each reward term has its own centre: set it on the term, e.g. terms: [{name: committee, "
        "weight: 0.5, centre: 0.2}]",
    }

    # the shaping terms: r(n) = V(n) + sum_t w_t (term_t(n) - centre_t); the committee first (lambda = its weight)
    terms: list[RewardTermConfig] = Field(default_factory=lambda: [RewardTermConfig(name="committee", weight=0.5)])
    advantage: AdvantageConfig = AdvantageConfig()  # A(n) from V(n) and the shaping (a preset name or the fields)
    format_penalty: float = Field(0.0, ge=0, le=1e3)  # subtracted from r(n) when the memory call's output was malformed
    baseline: Literal["siblings", "global"] = "siblings"  # A(n): r minus the sibling mean, or minus the batch mean
    shuffle_outcomes: bool = False  # no-signal control: permute leaf outcomes and committee scores across the batch
    # per_trajectory: m_i is the trajectory's trained calls, so each trajectory counts once (module docstring)
    flat_weighting: Literal["per_trajectory", "per_call"] = "per_trajectory"  # flat GRPO: A_i / m_i per call, or A_i
    # siblings agreeing on their first calls: one node for the shared calls, branching at the first differing call
    # (rollout/tree.py); separate: each sibling trains its own copy of the shared calls
    shared_prefix: Literal["branch", "separate"] = "branch"  # one action, one credit: share agreeing calls

    def weight_of(self, name: str) -> float:
        """The summed weight of the terms named ``name`` (0 when none is listed): ``weight_of("committee")`` is
        lambda, and whether the committee must score at all."""
        return sum(t.weight for t in self.terms if t.label == name)


@dataclass
class CreditStats:
    """What credit assignment saw: groups, and how many carried no signal."""

    groups: int = 0
    zero_variance_groups: int = 0
    single_member_groups: int = 0
    committee_dropped_groups: int = 0  # groups whose committee term was dropped (a score missing)
    term_dropped_groups: dict[str, int] = field(default_factory=dict)  # the same, per reward term
    outcome_tie_groups: int = 0  # groups of two or more whose V(n) are all equal
    informative_groups: int = 0  # groups of two or more whose V(n) differ
    rewards: list[float] = field(default_factory=list)


def node_values(tree: MemoryCallTree) -> dict[str, float]:
    """V(n) for every node: the mean outcome of the leaves below it (leaves without an outcome count as 0)."""
    return {
        n.node_id: sum(leaf.outcome or 0.0 for leaf in leaves) / len(leaves)
        for n in tree.nodes
        if (leaves := tree.leaves_below(n.node_id))
    }


def _sibling_groups(tree: MemoryCallTree) -> dict[str, list[TreeNode]]:
    groups: dict[str, list[TreeNode]] = defaultdict(list)
    for node in tree.nodes:
        if node.kind == "memory":
            groups[node.group_id or f"parent:{node.parent_id}"].append(node)
    return groups


def informative_groups(trees: Sequence[MemoryCallTree]) -> int:
    """Sibling groups (two or more members) whose outcome values V(n) differ: what dynamic sampling counts."""
    count = 0
    for tree in trees:
        values = node_values(tree)
        for members in _sibling_groups(tree).values():
            count += len(members) > 1 and not is_zero_variance([values.get(m.node_id, 0.0) for m in members])
    return count


@dataclass
class _SiblingGroup:
    """One sibling group's members with the two inputs of its advantages."""

    members: list[TreeNode]
    outcomes: list[float]  # V(n)
    shaping: list[float]  # sum_t w_t (term_t(n) - centre_t) - format penalty


def _shaping(
    members: Sequence[TreeNode],
    tree: MemoryCallTree,
    cfg: CreditConfig,
    stats: CreditStats,
    terms: Sequence[tuple[RewardTermConfig, Any]],
) -> list[float]:
    """Each member's shaping: sum_t w_t (term_t(n) - centre_t) over the reward terms (a term dropped for the whole
    group when any member has no score for it) minus the format penalty of a malformed memory call."""
    out = [0.0] * len(members)
    for term, score in terms:
        if term.weight == 0:
            continue
        scores = [score_term(term, score, m, tree) for m in members]
        if any(s is None for s in scores):
            stats.term_dropped_groups[term.label] = stats.term_dropped_groups.get(term.label, 0) + 1
            stats.committee_dropped_groups += term.label == "committee"
            continue
        values = [float(s) for s in scores]  # type: ignore[arg-type]
        centre = sum(values) / len(values) if term.centre == "siblings" else float(term.centre)
        out = [o + term.weight * (v - centre) for o, v in zip(out, values, strict=True)]
    for i, m in enumerate(members):
        if m.call is not None and m.call.error and cfg.format_penalty:
            out[i] -= cfg.format_penalty
    return out


def _tree_groups(
    tree: MemoryCallTree,
    cfg: CreditConfig,
    terms: Sequence[tuple[RewardTermConfig, Any]] | None = None,
) -> tuple[CreditStats, list[_SiblingGroup]]:
    """Fill ``value`` of every node and ``reward`` of every memory node; the tree's sibling groups and counts. Under
    ``shared_prefix: branch`` the tree first branches at its siblings' first differing call."""
    if cfg.shared_prefix == "branch":
        branch_at_first_difference(tree)
    terms = build_terms(cfg) if terms is None else terms
    values = node_values(tree)
    for node in tree.nodes:
        node.value = values.get(node.node_id)
    stats = CreditStats()
    groups = []
    for members in _sibling_groups(tree).values():
        stats.groups += 1
        outcomes = [m.value or 0.0 for m in members]
        shaping = _shaping(members, tree, cfg, stats, terms)
        rewards = [o + s for o, s in zip(outcomes, shaping, strict=True)]
        stats.single_member_groups += len(members) == 1
        if len(members) > 1:
            outcome_tie = is_zero_variance(outcomes)
            stats.outcome_tie_groups += outcome_tie
            stats.informative_groups += not outcome_tie
            for m in members:  # the trainer's rows carry it: the share of the update that ties on the outcome
                m.metadata = {**m.metadata, "outcome_tied": outcome_tie}
        stats.zero_variance_groups += is_zero_variance(rewards)
        for m, r in zip(members, rewards, strict=True):
            m.reward = r
        stats.rewards.extend(rewards)
        groups.append(_SiblingGroup(members, outcomes, shaping))
    return stats, groups


def build_terms(cfg: CreditConfig) -> list[tuple[RewardTermConfig, Any]]:
    """Each reward term of ``cfg`` with its callable (a term class constructed once per batch)."""
    return [(t, build_term(t)) for t in cfg.terms]


def _set_advantages(groups: Sequence[_SiblingGroup], cfg: CreditConfig) -> None:
    """One batch's advantages (:func:`memrl.rewards.advantage.shaped_batch_advantages`), written to the nodes."""
    advantages = shaped_batch_advantages([(g.outcomes, g.shaping) for g in groups], cfg.advantage)
    for g, advs in zip(groups, advantages, strict=True):
        for m, a in zip(g.members, advs, strict=True):
            m.advantage = a


def assign_credit(tree: MemoryCallTree, cfg: CreditConfig) -> CreditStats:
    """Fill ``value``, ``reward`` and ``advantage`` of every memory node of ``tree`` in place (the tree is the batch
    of the advantage's batch-level options)."""
    stats, groups = _tree_groups(tree, cfg)
    _set_advantages(groups, cfg)
    return stats


def _flat_group(tree: MemoryCallTree) -> tuple[list[TreeNode], list[float], list[list[TreeNode]]]:
    """Flat mode: the trajectories' leaves, their outcomes, and each one's chain of memory nodes."""
    by_id = {n.node_id: n for n in tree.nodes}
    leaves = [n for n in tree.nodes if n.kind == "leaf"]
    chains = []
    for leaf in leaves:
        chain = []
        node = by_id.get(leaf.parent_id or "")
        while node is not None and node.kind == "memory":
            chain.append(node)
            node = by_id.get(node.parent_id or "")
        chains.append(chain)
    return leaves, [leaf.outcome or 0.0 for leaf in leaves], chains


def _set_flat_advantages(tree: MemoryCallTree, advantages: Sequence[float], cfg: CreditConfig) -> None:
    _, outcomes, chains = _flat_group(tree)
    for chain, outcome, advantage in zip(chains, outcomes, advantages, strict=True):
        calls = sum((n.call is not None) + len(n.follow_up_calls) for n in chain)
        share = advantage / max(calls, 1) if cfg.flat_weighting == "per_trajectory" else advantage
        for node in chain:
            node.value, node.reward, node.advantage = outcome, outcome, share


def assign_flat_credit(tree: MemoryCallTree, cfg: CreditConfig) -> CreditStats:
    """Vanilla GRPO over trajectories (the flat baseline): the G trajectories of a task form one group on their
    outcomes, and every memory call of trajectory i takes r = outcome_i and its advantage A_i, divided by the
    trajectory's trained calls m_i under ``flat_weighting: per_trajectory`` (module docstring)."""
    _, outcomes, _ = _flat_group(tree)
    _set_flat_advantages(tree, shaped_group_advantages(outcomes, [0.0] * len(outcomes), cfg.advantage), cfg)
    return _flat_stats(outcomes)


def _flat_stats(outcomes: list[float]) -> CreditStats:
    """A flat group's diagnostics: its G trajectories are the group, outcome-informative when their outcomes differ."""
    tie = is_zero_variance(outcomes)
    several = len(outcomes) > 1
    return CreditStats(
        groups=1,
        zero_variance_groups=int(tie),
        outcome_tie_groups=int(several and tie),
        informative_groups=int(several and not tie),
        rewards=outcomes,
    )


def _shuffle_outcomes(trees: Sequence[MemoryCallTree], seed: int) -> None:
    """The no-signal control: leaf outcomes and committee scores permuted across the batch."""
    rng = random.Random(seed)
    leaves = [n for t in trees for n in t.nodes if n.kind == "leaf"]
    outcomes = [leaf.outcome for leaf in leaves]
    rng.shuffle(outcomes)
    for leaf, outcome in zip(leaves, outcomes, strict=True):
        leaf.metadata = {**leaf.metadata, "true_outcome": leaf.outcome}
        leaf.outcome = outcome
    scored = [n for t in trees for n in t.nodes if n.kind == "memory" and n.committee_score is not None]
    scores = [n.committee_score for n in scored]
    rng.shuffle(scores)
    for node, score in zip(scored, scores, strict=True):
        node.committee_score = score


def assign_batch_credit(
    trees: Sequence[MemoryCallTree], cfg: CreditConfig, *, mode: Literal["tree", "flat"] = "tree", seed: int = 0
) -> list[CreditStats]:
    """Credit for one iteration's trees, the whole batch at once: after the ``shuffle_outcomes`` control (outcomes and
    committee scores permuted), every tree's sibling groups (or, in flat mode, every task's trajectories) go to the
    advantage computation together, so its batch-level options see the batch; ``baseline: global`` compares every
    memory action of the batch with one baseline (module docstring). A shuffled leaf keeps its true outcome in
    ``metadata["true_outcome"]``."""
    if cfg.shuffle_outcomes:
        _shuffle_outcomes(trees, seed)
    if mode == "flat":
        flat = [_flat_group(t)[1] for t in trees]
        advantages = shaped_batch_advantages([(o, [0.0] * len(o)) for o in flat], cfg.advantage)
        stats = []
        for tree, outcomes, advs in zip(trees, flat, advantages, strict=True):
            _set_flat_advantages(tree, advs, cfg)
            stats.append(_flat_stats(outcomes))
    else:
        terms = build_terms(cfg)
        per_tree = [_tree_groups(t, cfg, terms) for t in trees]
        stats = [s for s, _ in per_tree]
        _set_advantages([g for _, groups in per_tree for g in groups], cfg)
    if cfg.baseline == "global":
        nodes = [n for t in trees for n in t.nodes if n.kind == "memory" and n.reward is not None]
        if nodes:
            outcomes = [n.value or 0.0 for n in nodes]
            shaping = [(n.reward or 0.0) - o for n, o in zip(nodes, outcomes, strict=True)]
            for n, a in zip(nodes, shaped_group_advantages(outcomes, shaping, cfg.advantage), strict=True):
                n.advantage = a
    return stats
