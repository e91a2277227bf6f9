"""One action, one credit (issue 39 item 3): the calls of a multi-call recall are trained as that action, siblings that
agree on their first calls share them and branch where they first differ (rollout/tree.py), flat GRPO weights each
trajectory by its trained calls, and the update's diagnostics say where its advantage comes from."""

from __future__ import annotations

import pytest
from fakes import sibling_group_tree

from memrl.data.schemas import MemoryCall, MemoryCallTree, TreeNode
from memrl.rewards.credit import CreditConfig, assign_flat_credit, node_values
from memrl.rewards.groups import credit_and_groups, trees_to_groups
from memrl.rollout.tree import branch_at_first_difference
from memrl.train.group_trainer import batch_metrics
from memrl.train.rows import Row, advantage_shares, rows_from_groups


def reads(node_id: str, responses: list[list[int]]) -> tuple[MemoryCall, list[MemoryCall]]:
    """A recall reading len(responses) pages: call i's prompt is the page prompt plus the extraction so far."""
    calls, extraction = [], []
    for i, ids in enumerate(responses):
        prompt = [5, 6, 100 + i, *extraction]
        calls.append(
            MemoryCall(
                call_id=f"{node_id}/{i}",
                role="recall",
                prompt_ids=prompt,
                response_ids=ids,
                logprobs=[-0.1] * len(ids),
                text=" ".join(map(str, ids)),
            )
        )
        extraction = [*extraction, *ids]
    return calls[0], calls[1:]


def tree_of(
    siblings: list[tuple[list[list[int]], list[float]]], task: str = "t", merge: bool = False
) -> MemoryCallTree:
    """root -> one sibling group: sibling k reads pages with the responses given and has one leaf per outcome
    (``merge``: identical siblings merged, as the tree builder does)."""
    outcomes = [leaf_outcomes for _, leaf_outcomes in siblings]
    return sibling_group_tree(task, outcomes, lambda sid, k: reads(sid, siblings[k][0]), merge=merge)


# two siblings read page 1 the same way and page 2 differently (one succeeds, one fails); a third differs at once
SHARED_FIRST = [([[4, 9], [7]], [1.0]), ([[4, 9], [8]], [0.0]), ([[3], [7]], [0.0])]


def trained(tree: MemoryCallTree, **credit: object) -> list[Row]:
    groups, _ = credit_and_groups([tree], CreditConfig(terms=[], **credit), "tree", 0)
    return rows_from_groups(groups)


def test_siblings_with_the_same_first_call_never_train_it_with_opposite_advantages() -> None:
    """Acceptance 3: the shared first read is one row; every distinct row is trained once, with one sign."""
    rows = trained(tree_of(SHARED_FIRST))
    first = [r for r in rows if r.prompt_ids == [5, 6, 100] and r.response_ids == [4, 9]]
    assert len(first) == 1 and first[0].advantage > 0  # V = 0.5 against the third sibling's 0
    keys = [(tuple(r.prompt_ids), tuple(r.response_ids)) for r in rows]
    assert len(keys) == len(set(keys))
    second = {tuple(r.response_ids): r.advantage for r in rows if r.prompt_ids == [5, 6, 101, 4, 9]}
    assert second[(7,)] > 0 > second[(8,)]  # where they differ, the continuations are compared with each other
    # the old layout trains the shared read once per sibling, with opposite advantages
    old = [
        r.advantage
        for r in trained(tree_of(SHARED_FIRST), shared_prefix="separate")
        if r.prompt_ids == [5, 6, 100] and r.response_ids == [4, 9]
    ]
    assert len(old) == 2 and old[0] > 0 > old[1]


def test_the_tree_branches_at_the_first_differing_call() -> None:
    tree = tree_of(SHARED_FIRST)
    assert branch_at_first_difference(tree) == 1
    by_id = {n.node_id: n for n in tree.nodes}
    shared = by_id["r.0:1^1"]
    assert shared.parent_id == "root" and shared.group_id == "g:r:1" and shared.follow_up_calls == []
    assert shared.call.response_ids == [4, 9] and shared.children == ["r.0:1", "r.1:1"]
    assert by_id["root"].children == ["r.0:1^1", "r.2:1"]
    for sid, page2 in (("r.0:1", [7]), ("r.1:1", [8])):  # each keeps its calls from the first that differs
        node = by_id[sid]
        assert node.parent_id == shared.node_id and node.group_id == "g:r:1>r.0:1^1"
        assert node.call.response_ids == page2 and node.call.prompt_ids == [5, 6, 101, 4, 9]
    assert node_values(tree)[shared.node_id] == pytest.approx(0.5)  # V pools the leaves of both
    assert tree.metadata["shared_prefixes"] == 1 and tree.metadata["prefix_shared_siblings"] == 2
    assert branch_at_first_difference(tree) == 0  # idempotent
    MemoryCallTree.model_validate(tree.model_dump())  # still a well-formed tree


def test_nested_agreement_branches_again_and_groups_share_their_prompt() -> None:
    siblings = [([[1], [2], [3]], [1.0]), ([[1], [2], [4]], [0.0]), ([[1], [5], [6]], [1.0]), ([[1], [5], [6]], [1.0])]
    separate = tree_of(siblings)  # the last two are equal in every call: that is merging's job, not branching's
    assert branch_at_first_difference(separate) == 2 and {"r.2:1", "r.3:1"} <= {n.node_id for n in separate.nodes}
    tree = tree_of(siblings, merge=True)
    assert branch_at_first_difference(tree) == 2
    by_id = {n.node_id: n for n in tree.nodes}
    top = by_id["r.0:1^1"]  # all of them share page 1: a single-member top group, no advantage
    inner = by_id["r.0:1^2"]  # the first two also share page 2
    assert inner.parent_id == top.node_id and [c.response_ids for c in (inner.call, *inner.follow_up_calls)] == [[2]]
    assert by_id["r.2:1"].parent_id == top.node_id and len(by_id["r.2:1"].follow_up_calls) == 1  # pages 2 and 3
    assert top.metadata["copies"] == 4 and node_values(tree)["r.2:1"] == 1.0
    groups, _ = credit_and_groups([tree], CreditConfig(terms=[]), "tree", 0)
    by_id = {n.node_id: n for n in tree.nodes}
    for g in groups:  # a sibling group's members all answer its one prompt
        if len(g.samples) > 1:
            assert all(by_id[s.node_id].call.prompt_ids == g.prompt_ids for s in g.samples)
    assert sorted(len(g.samples) for g in groups if not g.group_id.rsplit("/", 1)[-1].startswith("f")) == [1, 2, 2]
    rows = rows_from_groups(groups)
    keys = [(tuple(r.prompt_ids), tuple(r.response_ids)) for r in rows]
    assert len(keys) == len(set(keys))  # every distinct row trained once
    assert {k[1] for k in keys} == {(2,), (3,), (4,), (5,), (6,)}  # page 1 is shared by all: no advantage


def test_a_sibling_ending_inside_the_shared_calls_keeps_the_siblings_apart() -> None:
    tree = tree_of([([[4], [7]], [1.0]), ([[4]], [0.0])])
    assert branch_at_first_difference(tree) == 0
    assert sorted(n.node_id for n in tree.nodes if n.kind == "memory") == ["r.0:1", "r.1:1"]


def test_flat_grpo_weights_each_trajectory_by_its_trained_calls_not_its_nodes() -> None:
    """Acceptance 3: trajectory a is one recall node of three calls (fails), trajectory b two one-call nodes
    (succeeds). per_trajectory gives every call A_i / m_i with m_i the trained calls (a: 3, b: 2), so each
    trajectory's rows sum to its A_i and the rows' advantages sum to 0; counting nodes (a: 1) would not."""
    call, follow = reads("a1", [[1], [2], [3]])
    b1, _ = reads("b1", [[11]])
    b2, _ = reads("b2", [[12]])
    nodes = [
        TreeNode(node_id="root", kind="root", children=["a1", "b1"]),
        TreeNode(node_id="a1", parent_id="root", kind="memory", call=call, follow_up_calls=follow, children=["la"]),
        TreeNode(node_id="la", parent_id="a1", kind="leaf", outcome=0.0),
        TreeNode(node_id="b1", parent_id="root", kind="memory", call=b1, children=["b2"]),
        TreeNode(node_id="b2", parent_id="b1", kind="memory", call=b2, children=["lb"]),
        TreeNode(node_id="lb", parent_id="b2", kind="leaf", outcome=1.0),
    ]
    tree = MemoryCallTree(tree_id="f", task_id="f", root_id="root", nodes=nodes)
    assign_flat_credit(tree, CreditConfig())
    rows = rows_from_groups(trees_to_groups([tree], source="flat"))
    a_rows = [r.advantage for r in rows if r.response_ids in ([1], [2], [3])]
    b_rows = [r.advantage for r in rows if r.response_ids in ([11], [12])]
    assert a_rows == pytest.approx([-1 / 3] * 3, rel=1e-5) and b_rows == pytest.approx([0.5] * 2, rel=1e-5)
    assert sum(r.advantage for r in rows) == pytest.approx(0.0, abs=1e-5)


def test_update_diagnostics_share_of_tied_groups_and_of_cancelling_identical_rows() -> None:
    def row(prompt: list[int], response: list[int], a: float, tied: bool = False) -> Row:
        return Row(prompt, response, a, [], outcome_tied=tied)

    rows = [
        row([1], [2], 1.0),
        row([1], [2], -0.6),
        row([1], [3], -0.4),
        row([4], [5], 0.5, True),
        row([4], [6], -0.5, True),
    ]
    shares = advantage_shares(rows)
    assert shares["outcome_tied_row_fraction"] == pytest.approx(2 / 5)
    assert shares["outcome_tied_advantage_fraction"] == pytest.approx(1.0 / 3.0)
    assert shares["identical_row_fraction"] == pytest.approx(2 / 5)
    # |A| sums to 3.0; per distinct row |1.0 - 0.6| + 0.4 + 0.5 + 0.5 = 1.8 survives: 40% cancels
    assert shares["identical_row_cancelled_advantage_fraction"] == pytest.approx(0.4)
    assert advantage_shares([]) == {}


def test_tied_groups_are_marked_for_the_trainer_in_oat_and_in_the_old_layout_cancel() -> None:
    tied = tree_of([([[1], [2]], [1.0]), ([[1], [3]], [1.0])], "a")
    tied.nodes[1].committee_score, tied.nodes[3].committee_score = 0.9, 0.1
    informative = tree_of([([[1]], [1.0]), ([[2]], [0.0])], "b")
    cfg = CreditConfig(terms=[{"name": "committee", "weight": 0.5}], shared_prefix="separate", advantage="grpo_std")
    groups, _ = credit_and_groups([tied, informative], cfg, "tree", 0)
    rows = rows_from_groups(groups)
    metrics = batch_metrics(groups, rows)
    assert metrics["outcome_tied_row_fraction"] == pytest.approx(4 / 6)  # 2 siblings x 2 calls of 6 rows
    assert metrics["identical_row_cancelled_advantage_fraction"] > 0.3  # the shared first call: +1 and -1
    default, _ = credit_and_groups(
        [tree_of([([[1], [2]], [1.0]), ([[1], [3]], [1.0])], "a"), tree_of([([[1]], [1.0]), ([[2]], [0.0])], "b")],
        CreditConfig(),
        "tree",
        0,
    )
    assert advantage_shares(rows_from_groups(default))["outcome_tied_row_fraction"] == 0.0  # tied groups train nothing
    branched, _ = credit_and_groups(
        [tree_of([([[1], [2]], [1.0]), ([[1], [3]], [0.0])])], CreditConfig(terms=[]), "tree", 0
    )
    assert advantage_shares(rows_from_groups(branched))["identical_row_cancelled_advantage_fraction"] == 0.0
