"""OAT-GRPO end to end on known numbers (issue 18): a hand-built tree through the committee, the judge's parser and
credit assignment; cue writing under RL; trained roles sampled as the trainer scores them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from fakes import RecordingEngine, branching_sam

from memrl.data.formats import render_sam_recall_prompt
from memrl.data.schemas import MemoryCall, MemoryCallTree, TreeNode
from memrl.data.tasks.common import as_messages
from memrl.rewards.committee import Committee, CommitteeConfig
from memrl.rewards.credit import CreditConfig, assign_batch_credit, assign_credit

# node -> (the judge's 0-10 relevance, coverage, consistency) and the c(n) they rescale to
RUBRIC = {
    "n1": ((10, 8, 6), 0.8),
    "n2": ((4, 2, 0), 0.2),
    "n3": ((10, 10, 10), 1.0),
    "n4": ((0, 5, 10), 0.5),
    "n5": ((5, 5, 5), 0.5),
    "n6": ((7, 7, 7), 0.7),
}
OUTCOMES = {"la": 1.0, "lb": 0.0, "lc": 0.0, "ld": 0.0}


def recall_call(node: str, page: int, text: str, so_far: str = "") -> MemoryCall:
    prompt = render_sam_recall_prompt(
        "where is the red key", page, f"t{page}> open box {page}\npage text {page}", so_far
    )
    return MemoryCall(
        call_id=f"{node}/p{page}",
        role="recall",
        messages=as_messages(prompt),
        prompt_ids=[1, 2, page],
        response_ids=[3],
        logprobs=[-0.5],
        text=text,
    )


def hand_built_tree() -> MemoryCallTree:
    """root -> {n1, n2} (g1); n1 -> {n3, n4} (g2) -> leaves la (1), lb (0); n2 -> {n5, n6} (g3) -> lc (0), ld (0).
    Every recall reads pages 0 and 1: the node's output is its second page's extraction (``out-nX``)."""

    def memory(node: str, parent: str, group: str, depth: int, children: list[str]) -> TreeNode:
        return TreeNode(
            node_id=node,
            parent_id=parent,
            depth=depth,
            kind="memory",
            group_id=group,
            call=recall_call(node, 0, f"partial-{node}"),
            follow_up_calls=[recall_call(node, 1, f"out-{node}", so_far=f"partial-{node}")],
            children=children,
        )

    def leaf(node: str, parent: str) -> TreeNode:
        return TreeNode(node_id=node, parent_id=parent, depth=3, kind="leaf", outcome=OUTCOMES[node])

    nodes = [
        TreeNode(node_id="root", kind="root", children=["n1", "n2"]),
        memory("n1", "root", "g1", 1, ["n3", "n4"]),
        memory("n2", "root", "g1", 1, ["n5", "n6"]),
        memory("n3", "n1", "g2", 2, ["la"]),
        memory("n4", "n1", "g2", 2, ["lb"]),
        memory("n5", "n2", "g3", 2, ["lc"]),
        memory("n6", "n2", "g3", 2, ["ld"]),
        leaf("la", "n3"),
        leaf("lb", "n4"),
        leaf("lc", "n5"),
        leaf("ld", "n6"),
    ]
    return MemoryCallTree(tree_id="hand/tree", task_id="hand", root_id="root", nodes=nodes)


def judge_reply(last: str, metadata: dict[str, Any]) -> str:
    candidates = re.findall(r"^\(\d+\) out-(n\d)$", last, re.MULTILINE)
    return "scores:\n" + json.dumps(
        [
            {"candidate": i + 1, **dict(zip(("relevance", "coverage", "consistency"), RUBRIC[n][0], strict=True))}
            for i, n in enumerate(candidates)
        ]
    )


@pytest.mark.parametrize("scale", ["std", "none"])
def test_hand_built_tree_values_rewards_and_advantages(tmp_path: Path, scale: str) -> None:
    tree = hand_built_tree()
    reference = RecordingEngine("the red key is in box 0", "ref")
    judge = RecordingEngine(judge_reply, "judge")
    stats = Committee(CommitteeConfig(cache_dir=str(tmp_path / f"cache-{scale}")), [reference], judge).score([tree])
    # one reference request and one judge call per parent context, all in one batch
    assert stats.groups == 3 and len(reference.requests) == 3 and len(judge.requests) == 3 and judge.calls == 1
    # the committee answers the whole recall (both pages in one request), the judge sees each node's final output
    assert all(
        "page text 0" in r.messages[-1].content and "page text 1" in r.messages[-1].content for r in reference.requests
    )
    nodes = {n.node_id: n for n in tree.nodes}
    for name, (_, c) in RUBRIC.items():
        assert nodes[name].committee_score == pytest.approx(c)

    lam = 0.5
    advantage = "dr_grpo" if scale == "none" else "grpo_std"
    assign_credit(tree, CreditConfig(terms=[{"name": "committee", "weight": lam}], advantage=advantage))
    values = {"n1": 0.5, "n2": 0.0, "n3": 1.0, "n4": 0.0, "n5": 0.0, "n6": 0.0}
    groups = [("n1", "n2"), ("n3", "n4"), ("n5", "n6")]
    for group in groups:
        centre = sum(RUBRIC[n][1] for n in group) / 2
        rewards = {n: values[n] + lam * (RUBRIC[n][1] - centre) for n in group}
        mean = sum(rewards.values()) / 2
        half_gap = abs(rewards[group[0]] - mean)
        for n in group:
            assert nodes[n].value == pytest.approx(values[n])
            assert nodes[n].reward == pytest.approx(rewards[n])
            expected = rewards[n] - mean if scale == "none" else (rewards[n] - mean) / (half_gap + 1e-6)
            assert nodes[n].advantage == pytest.approx(expected, abs=1e-5)
    # worked numbers: r(n1) = 0.5 + 0.5 (0.8 - 0.5) = 0.65; in g3 both leaves fail and the committee alone ranks
    assert nodes["n1"].reward == pytest.approx(0.65) and nodes["n2"].reward == pytest.approx(-0.15)
    assert nodes["n6"].advantage > 0 > nodes["n5"].advantage


def test_sibling_centring_cancels_but_a_global_baseline_does_not(tmp_path: Path) -> None:
    def scored() -> MemoryCallTree:
        tree = hand_built_tree()
        reference = RecordingEngine("x", "ref")
        Committee(
            CommitteeConfig(cache_dir=str(tmp_path / "cache")), [reference], RecordingEngine(judge_reply, "judge")
        ).score([tree])
        return tree

    def advantages(cfg: CreditConfig) -> dict[str, float]:
        tree = scored()
        assign_batch_credit([tree], cfg)
        return {n.node_id: n.advantage for n in tree.nodes if n.kind == "memory"}

    siblings = advantages(CreditConfig(advantage="dr_grpo"))
    constant = advantages(
        CreditConfig(advantage="dr_grpo", terms=[{"name": "committee", "weight": 0.5, "centre": 0.3}])
    )
    assert siblings == pytest.approx(constant)  # c_bar cancels inside a sibling group
    global_sib = advantages(CreditConfig(advantage="dr_grpo", baseline="global"))
    global_const = advantages(
        CreditConfig(
            advantage="dr_grpo", baseline="global", terms=[{"name": "committee", "weight": 0.5, "centre": 0.3}]
        )
    )
    assert global_sib != pytest.approx(siblings)
    assert global_sib != pytest.approx(global_const)  # with one batch baseline c_bar moves whole groups
    rewards = [0.65, -0.15, 1.125, -0.125, -0.05, 0.05]
    assert sorted(global_sib.values()) == pytest.approx(sorted(r - sum(rewards) / 6 for r in rewards))


def test_shuffled_outcomes_keep_the_true_outcome() -> None:
    trees = [hand_built_tree() for _ in range(4)]
    assign_batch_credit(trees, CreditConfig(terms=[], shuffle_outcomes=True), seed=3)
    leaves = [n for t in trees for n in t.nodes if n.kind == "leaf"]
    assert sorted(n.outcome for n in leaves) == sorted(n.metadata["true_outcome"] for n in leaves)
    assert [n.outcome for n in leaves] != [n.metadata["true_outcome"] for n in leaves]


# ------------------------------------------------------------------------------------------------ cue writing
def test_cue_siblings_differ_and_get_advantages_from_downstream_outcomes() -> None:
    """Consolidation as a branch role: the K cues of one page are siblings; where what a cue keeps decides whether a
    later recall finds the page, their values differ and so do their advantages."""
    from memrl.data.tasks.sam import SamTask
    from memrl.rollout.agents import sam_engines, sam_rollout
    from memrl.rollout.tree import TreeConfig, build_trees

    tasks = [
        SamTask({"horizon_steps": 6, "facts_per_obs": 2, "containers_per_room": 2, "evidence_frac": 0.5}, seed=s)
        for s in range(6)
    ]
    config = branching_sam(live=3, keep=2, consolidate_tokens=48, recall_tokens=64)
    engines = sam_engines(oracle={"cue_omission": 0.5}, max_pages=1, recall_budget=1)  # each cue drops half
    trees, _ = build_trees(
        tasks,
        lambda task, rid: sam_rollout(task, config, rollout_id=rid),
        engines,
        TreeConfig(branch_roles=["consolidate", "recall"], branch_factor=2, max_leaves=64),
    )
    informative = 0
    for tree in trees:
        assign_credit(tree, CreditConfig(terms=[]))
        groups: dict[str, list[TreeNode]] = {}
        for n in tree.nodes:
            if n.kind == "memory" and n.call.role == "consolidate" and n.group_id:
                groups.setdefault(n.group_id, []).append(n)
        for members in groups.values():
            if len(members) < 2 or len({m.value for m in members}) < 2:
                continue  # (identical cues may still differ in value: later samples below them differ)
            informative += len({m.call.text for m in members}) > 1  # the cues differ and so do their outcomes
            best = max(members, key=lambda m: m.value)
            worst = min(members, key=lambda m: m.value)
            assert best.advantage > 0 > worst.advantage
    assert informative >= 1


def test_a_trained_role_at_temperature_0_7_is_refused() -> None:
    from memrl.data.config import ConfigError, load_config
    from memrl.data.tasks.sam import SamTask
    from memrl.rollout.agents import sam_engines, sam_rollout
    from memrl.rollout.memory.base import RoleSampling
    from memrl.rollout.memory.sam import SamConfig
    from memrl.rollout.tree import TreeConfig, build_trees
    from memrl.train.oat_grpo import OATGRPOConfig

    with pytest.raises(ConfigError, match=r"memory\.sampling\.recall.*temperature 0\.7"):
        load_config(OATGRPOConfig, "configs/oat_grpo_tiny.yaml", ["memory.sampling.recall.temperature=0.7"])
    with pytest.raises(ConfigError, match=r"memory\.sampling\.consolidate.*top_p 0\.9"):
        load_config(
            OATGRPOConfig,
            "configs/oat_grpo_tiny.yaml",
            [
                "tree.branch_roles=[consolidate,recall]",
                "memory.sampling.consolidate.temperature=1.0",
                "memory.sampling.consolidate.top_p=0.9",
            ],
        )
    # an untrained role may be greedy (the tiny recipe writes cues at temperature 0)
    assert load_config(OATGRPOConfig, "configs/oat_grpo_tiny.yaml").memory.sampling["consolidate"].temperature == 0
    # the tree builder refuses it too, whatever built the config
    config = SamConfig(
        page_turns=1,
        live_capacity_turns=4,
        keep_recent_turns=3,
        sampling={"consolidate": RoleSampling(temperature=0.0), "recall": RoleSampling(temperature=0.7)},
    )
    with pytest.raises(ValueError, match=r"temperature 0\.7"):
        build_trees(
            [SamTask({"horizon_steps": 12}, seed=0)],
            lambda t, rid: sam_rollout(t, config, rollout_id=rid),
            sam_engines(),
            TreeConfig(),
        )
