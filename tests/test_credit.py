"""Golden tests for OAT-GRPO credit assignment and group advantages on hand-built trees."""

from __future__ import annotations

import math

import pytest

from memrl.data.schemas import MemoryCall, MemoryCallTree, TreeNode
from memrl.rewards.advantage import group_advantages
from memrl.rewards.credit import CreditConfig, assign_credit, node_values


def tree(committee: dict[str, float | None], errors: tuple[str, ...] = ()) -> MemoryCallTree:
    """root -> a1 a2 a3 (g0); a1 -> b1 b2 (g1); b1 -> leaf 1; b2 -> leaf 0; a2 -> leaf 1; a3 -> c1 (g3) -> leaf 0."""
    spec = {
        "root": (None, "root", None, ["a1", "a2", "a3"]),
        "a1": ("root", "memory", "g0", ["b1", "b2"]),
        "a2": ("root", "memory", "g0", ["l_a2"]),
        "a3": ("root", "memory", "g0", ["c1"]),
        "b1": ("a1", "memory", "g1", ["l_b1"]),
        "b2": ("a1", "memory", "g1", ["l_b2"]),
        "c1": ("a3", "memory", "g3", ["l_c1"]),
        "l_b1": ("b1", "leaf", None, []),
        "l_b2": ("b2", "leaf", None, []),
        "l_a2": ("a2", "leaf", None, []),
        "l_c1": ("c1", "leaf", None, []),
    }
    outcomes = {"l_b1": 1.0, "l_b2": 0.0, "l_a2": 1.0, "l_c1": 0.0}
    nodes = [
        TreeNode(
            node_id=nid,
            parent_id=p,
            kind=kind,
            group_id=g,
            children=ch,
            outcome=outcomes.get(nid),
            committee_score=committee.get(nid),
            call=MemoryCall(call_id=nid, role="recall", error="bad" if nid in errors else None)
            if kind == "memory"
            else None,
        )
        for nid, (p, kind, g, ch) in spec.items()
    ]
    return MemoryCallTree(tree_id="t", task_id="x", root_id="root", nodes=nodes)


def by_id(t: MemoryCallTree) -> dict[str, TreeNode]:
    return {n.node_id: n for n in t.nodes}


def pop_std(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def test_node_values_are_mean_leaf_outcomes_with_uneven_subtrees() -> None:
    v = node_values(tree({}))
    assert v["root"] == pytest.approx(0.5)  # leaves 1, 0, 1, 0
    assert v["a1"] == pytest.approx(0.5) and v["a2"] == 1.0 and v["a3"] == 0.0
    assert v["b1"] == 1.0 and v["b2"] == 0.0 and v["c1"] == 0.0


def test_rewards_and_advantages_with_sibling_centred_committee() -> None:
    t = tree({"a1": 0.8, "a2": 0.6, "a3": 0.1, "b1": 0.9, "b2": None})
    stats = assign_credit(
        t, CreditConfig(terms=[{"name": "committee", "weight": 0.5, "centre": "siblings"}], advantage={"eps": 0.0})
    )
    n = by_id(t)
    # g0: centre = (0.8 + 0.6 + 0.1) / 3 = 0.5
    assert n["a1"].reward == pytest.approx(0.5 + 0.5 * 0.3)
    assert n["a2"].reward == pytest.approx(1.0 + 0.5 * 0.1)
    assert n["a3"].reward == pytest.approx(0.0 - 0.5 * 0.4)
    rewards = [0.65, 1.05, -0.2]
    std = pop_std(rewards)
    for nid, r in zip(["a1", "a2", "a3"], rewards, strict=True):
        assert n[nid].advantage == pytest.approx((r - 0.5) / std)
    # g1: b2 has no committee score -> the term is dropped for the whole group; rewards are the values 1 and 0
    assert (n["b1"].reward, n["b2"].reward) == (1.0, 0.0)
    assert (n["b1"].advantage, n["b2"].advantage) == (pytest.approx(1.0), pytest.approx(-1.0))
    # g3: a single child carries no signal
    assert n["c1"].advantage == 0.0 and n["c1"].value == 0.0
    assert (stats.groups, stats.single_member_groups, stats.zero_variance_groups) == (3, 1, 1)
    assert stats.committee_dropped_groups == 2  # g1 (b2 missing) and g3 (c1 missing)


def test_constant_centre_and_unscaled_advantages() -> None:
    t = tree({"a1": 0.8, "a2": 0.6, "a3": 0.1})
    assign_credit(t, CreditConfig(terms=[{"name": "committee", "weight": 1.0, "centre": 0.2}], advantage="dr_grpo"))
    n = by_id(t)
    rewards = {"a1": 0.5 + 0.6, "a2": 1.0 + 0.4, "a3": 0.0 - 0.1}
    mean = sum(rewards.values()) / 3
    for nid, r in rewards.items():
        assert n[nid].reward == pytest.approx(r)
        assert n[nid].advantage == pytest.approx(r - mean)


def test_zero_variance_group_contributes_nothing() -> None:
    t = tree({})
    for node in t.nodes:  # make every leaf succeed: all values 1 -> every group is flat
        if node.kind == "leaf":
            node.outcome = 1.0
    stats = assign_credit(t, CreditConfig(terms=[]))
    assert all(n.advantage == 0.0 for n in t.nodes if n.kind == "memory")
    assert stats.zero_variance_groups == stats.groups == 3 and stats.committee_dropped_groups == 0


def test_format_penalty_applies_to_malformed_calls() -> None:
    t = tree({}, errors=("a2",))
    assign_credit(t, CreditConfig(terms=[], format_penalty=0.25))
    n = by_id(t)
    assert n["a2"].reward == pytest.approx(0.75) and n["a1"].reward == pytest.approx(0.5)


@pytest.mark.parametrize(
    "rewards, scale, expected",
    [
        ([1.0, 0.0], "std", [1.0, -1.0]),
        ([1.0, 0.0, 0.0, 0.0], "none", [0.75, -0.25, -0.25, -0.25]),
        ([0.3, 0.3, 0.3], "std", [0.0, 0.0, 0.0]),
        ([0.7], "std", [0.0]),
    ],
)
def test_group_advantages(rewards: list[float], scale: str, expected: list[float]) -> None:
    assert group_advantages(rewards, scale, eps=0.0) == pytest.approx(expected)
