"""Informative batches: identical sibling actions merge into one node, dynamic sampling fills the batch with
outcome-informative groups (or stops at its cap and says so), controls that carry no signal, flat GRPO weighting."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fakes import sibling_group_tree

from memrl.data.schemas import MemoryCall, MemoryCallTree, TreeNode
from memrl.rewards.credit import CreditConfig, assign_batch_credit, assign_credit, informative_groups, node_values
from memrl.rewards.groups import credit_and_groups, trees_to_groups
from memrl.rollout.fleet import FleetResult
from memrl.rollout.tree import TreeConfig
from memrl.train.oat_grpo import _Collected


def recall(node_id: str, ids: list[int]) -> MemoryCall:
    return MemoryCall(call_id=node_id, role="recall", prompt_ids=[5, 6], response_ids=ids, logprobs=[-0.1] * len(ids))


def sibling_tree(task_id: str, siblings: list[tuple[list[int], list[float]]]) -> MemoryCallTree:
    """root -> one sibling group; sibling k has recall token ids ``ids`` and one leaf per outcome below it."""
    outcomes = [leaf_outcomes for _, leaf_outcomes in siblings]
    return sibling_group_tree(task_id, outcomes, lambda sid, k: (recall(sid, siblings[k][0]), []), merge=True)


def test_identical_recall_siblings_are_one_node_whose_value_pools_their_leaves() -> None:
    """Acceptance 3: two siblings with the same recall token ids and different descendants (a success below one,
    a failure and a success below the other) become one node; V(n) is the mean over all three leaves."""
    tree = sibling_tree("t", [([4, 9], [1.0]), ([4, 9], [0.0, 1.0]), ([4, 7], [0.0])])
    memory = [n for n in tree.nodes if n.kind == "memory"]
    assert [n.node_id for n in memory] == ["r.0:1", "r.2:1"]
    merged = memory[0]
    assert merged.metadata["copies"] == 2 and merged.metadata["merged"] == ["r.1:1"]
    assert sorted(merged.children) == ["r.0.0:leaf", "r.1.0:leaf", "r.1.1:leaf"]
    assert all(tree.node(c).parent_id == "r.0:1" for c in merged.children)
    assert node_values(tree)["r.0:1"] == pytest.approx(2 / 3)
    assign_credit(tree, CreditConfig(terms=[]))
    (group,) = trees_to_groups([tree])
    assert len(group.samples) == 2 and group.samples[0].advantage > 0 > group.samples[1].advantage


def test_all_identical_siblings_leave_a_single_node_with_no_preference() -> None:
    tree = sibling_tree("t", [([3], [1.0]), ([3], [0.0])])
    assign_credit(tree, CreditConfig(terms=[]))
    assert sum(n.kind == "memory" for n in tree.nodes) == 1
    groups, metrics = credit_and_groups([tree], CreditConfig(terms=[]), "tree", 0)
    assert [s.advantage for g in groups for s in g.samples] == [0.0]
    assert metrics["identical_sibling_fraction"] == 0.5 and metrics["informative_groups"] == 0


def test_credit_metrics_count_outcome_ties_not_reward_ties() -> None:
    tied = sibling_tree("a", [([1], [1.0]), ([2], [1.0])])
    tied.nodes[1].committee_score, tied.nodes[3].committee_score = 0.9, 0.1  # r differs, the outcome does not
    informative = sibling_tree("b", [([1], [1.0]), ([2], [0.0])])
    _, metrics = credit_and_groups(
        [tied, informative], CreditConfig(terms=[{"name": "committee", "weight": 0.5}]), "tree", 0
    )
    assert metrics["outcome_tie_fraction"] == 0.5 and metrics["informative_groups"] == 1
    assert metrics["credit_zero_variance_groups"] == 0  # both groups' rewards r vary


class _Ready:
    def __init__(self, trees: list[MemoryCallTree]) -> None:
        self.trees = trees

    def result(self) -> FleetResult:
        return FleetResult(
            trees=self.trees, metrics={"memory_requests": len(self.trees)}, worker_of={}, memory_calls={}, reruns=0
        )


def collect(target: int, cap: int, informative_ids: set[str]) -> tuple[list[MemoryCallTree], dict, list[list[str]]]:
    """A _Collected over 12 tasks (3 per iteration) whose trees are informative for ``informative_ids`` only."""
    pool = [SimpleNamespace(task_id=f"t{i}") for i in range(12)]

    def trees_for(tasks: list) -> list[MemoryCallTree]:
        return [
            sibling_tree(t.task_id, [([1], [1.0]), ([2], [0.0 if t.task_id in informative_ids else 1.0])])
            for t in tasks
        ]

    rounds: list[list[str]] = []

    def more(round_: int, tasks: list) -> _Ready:
        rounds.append([t.task_id for t in tasks])
        return _Ready(trees_for(tasks))

    batch = pool[:3]
    tree = TreeConfig(informative_groups=target, max_extra_trees=cap)
    trees, metrics = _Collected(_Ready(trees_for(batch)), batch, more, pool, tree, seed=0, iteration=0).result()
    return trees, metrics, rounds


def test_dynamic_sampling_builds_trees_until_the_batch_holds_enough_informative_groups() -> None:
    """Acceptance 3: every tree is informative, the batch of 3 holds 3, so a target of 5 takes one extra round of
    at most 3 trees; the tasks of the extra round are new ones."""
    everything = {f"t{i}" for i in range(12)}
    trees, metrics, rounds = collect(target=5, cap=6, informative_ids=everything)
    assert informative_groups(trees) >= 5 and metrics["informative_groups_short"] == 0
    assert len(rounds) == 1 and metrics["extra_trees"] == 3 and metrics["dynamic_sampling_rounds"] == 1
    assert not set(rounds[0]) & {"t0", "t1", "t2"} and len({t.task_id for t in trees}) == 6
    assert metrics["memory_requests"] == 6  # the rounds' worker metrics add up


def test_dynamic_sampling_stops_at_its_cap_and_logs_the_shortfall() -> None:
    trees, metrics, rounds = collect(target=4, cap=5, informative_ids=set())  # nothing ever informative
    assert metrics["extra_trees"] == 5 and [len(r) for r in rounds] == [3, 2]
    assert metrics["informative_groups_short"] == 4 and informative_groups(trees) == 0


def test_dynamic_sampling_off_builds_only_the_iteration() -> None:
    trees, metrics, rounds = collect(target=0, cap=10, informative_ids=set())
    assert len(trees) == 3 and rounds == [] and "extra_trees" not in metrics


def test_no_signal_control_shuffles_committee_scores_with_outcomes() -> None:
    """Shuffled outcomes alone keep the committee's (oracle-anchored) preference; the control permutes both."""
    trees = [sibling_tree(f"t{i}", [([1], [1.0]), ([2], [0.0])]) for i in range(40)]
    for t in trees:
        t.nodes[1].committee_score, t.nodes[3].committee_score = 1.0, 0.0  # the committee prefers sibling 0
    assign_batch_credit(trees, CreditConfig(shuffle_outcomes=True), seed=3)
    first = [t.nodes[1].committee_score for t in trees]
    assert 0 < sum(first) < len(trees)  # no longer always the preferred one
    assert sorted(first + [t.nodes[3].committee_score for t in trees]) == [0.0] * 40 + [1.0] * 40


def test_flat_grpo_counts_each_trajectory_once() -> None:
    """A failing trajectory with three calls and a succeeding one with one call: per_trajectory weighting gives
    trained rows a zero mean advantage; per_call copies A_i to every call and is biased downwards."""
    from memrl.rewards.credit import assign_flat_credit

    def flat_tree() -> MemoryCallTree:
        nodes = [TreeNode(node_id="root", kind="root", children=["a1", "b1"])]
        nodes += [
            TreeNode(node_id="a1", parent_id="root", kind="memory", call=recall("a1", [1]), children=["a2"]),
            TreeNode(node_id="a2", parent_id="a1", kind="memory", call=recall("a2", [1]), children=["a3"]),
            TreeNode(node_id="a3", parent_id="a2", kind="memory", call=recall("a3", [1]), children=["la"]),
            TreeNode(node_id="la", parent_id="a3", kind="leaf", outcome=0.0),
            TreeNode(node_id="b1", parent_id="root", kind="memory", call=recall("b1", [1]), children=["lb"]),
            TreeNode(node_id="lb", parent_id="b1", kind="leaf", outcome=1.0),
        ]
        return MemoryCallTree(tree_id="f", task_id="f", root_id="root", nodes=nodes)

    def mean_row_advantage(weighting: str) -> float:
        tree = flat_tree()
        assign_flat_credit(tree, CreditConfig(flat_weighting=weighting))
        advs = [n.advantage for n in tree.nodes if n.kind == "memory"]
        return sum(advs) / len(advs)

    assert mean_row_advantage("per_trajectory") == pytest.approx(0.0, abs=1e-6)
    assert mean_row_advantage("per_call") < -0.4


def test_flat_mode_counts_a_task_whose_trajectories_differ_as_informative() -> None:
    """In flat mode a task's G trajectories are the group: the credit metrics count it informative when their outcomes
    differ and an outcome tie when they do not (they read 0 whatever happened before)."""

    def flat_tree(task: str, outcomes: list[float]) -> MemoryCallTree:
        nodes = [TreeNode(node_id="root", kind="root", children=[f"m{i}" for i in range(len(outcomes))])]
        for i, outcome in enumerate(outcomes):
            nodes.append(
                TreeNode(
                    node_id=f"m{i}", parent_id="root", kind="memory", call=recall(f"m{i}", [i]), children=[f"l{i}"]
                )
            )
            nodes.append(TreeNode(node_id=f"l{i}", parent_id=f"m{i}", kind="leaf", outcome=outcome))
        return MemoryCallTree(tree_id=task, task_id=task, root_id="root", nodes=nodes)

    trees = [flat_tree("won-lost", [1.0, 0.0]), flat_tree("both-won", [1.0, 1.0]), flat_tree("both-lost", [0.0, 0.0])]
    _, metrics = credit_and_groups(trees, CreditConfig(), mode="flat", seed=0)
    assert metrics["informative_groups"] == 1
    assert metrics["outcome_tie_fraction"] == pytest.approx(2 / 3)
    assert informative_groups(trees) == 1  # what dynamic sampling counts agrees
