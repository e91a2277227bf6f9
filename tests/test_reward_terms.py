"""Reward terms as a weighted list (credit.terms): the committee is the first entry, not a special case; a user's
term is registered or named by import path; the old committee_weight key is an error naming the new one."""

from __future__ import annotations

from typing import Any

import pytest

from memrl.data.config import ConfigError, load_config
from memrl.data.schemas import MemoryCall, MemoryCallTree, TreeNode
from memrl.rewards.credit import CreditConfig, assign_credit
from memrl.rewards.terms import REWARD_TERMS, RewardTermConfig, register_reward
from memrl.train.oat_grpo import OATGRPOConfig


@register_reward("test_chars")
def chars(node: TreeNode, tree: MemoryCallTree) -> float | None:
    """The output's length in characters / 10 (None for 'skip')."""
    return None if node.call.text == "skip" else len(node.call.text) / 10


class Scaled:
    """A term class: its params are constructor arguments."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, node: TreeNode, tree: MemoryCallTree) -> float | None:
        return self.factor * (node.committee_score or 0.0)


def group(texts: list[str], outcomes: list[float], committee: list[float | None]) -> MemoryCallTree:
    nodes = [TreeNode(node_id="root", kind="root", children=[f"m{i}" for i in range(len(texts))])]
    for i, (text, outcome, c) in enumerate(zip(texts, outcomes, committee, strict=True)):
        call = MemoryCall(
            call_id=f"c{i}", role="note", text=text, response_ids=[1] * len(text), logprobs=[0.0] * len(text)
        )
        nodes.append(
            TreeNode(
                node_id=f"m{i}",
                parent_id="root",
                depth=1,
                kind="memory",
                call=call,
                group_id="g",
                committee_score=c,
                children=[f"l{i}"],
            )
        )
        nodes.append(TreeNode(node_id=f"l{i}", parent_id=f"m{i}", depth=2, kind="leaf", outcome=outcome))
    return MemoryCallTree(tree_id="t", task_id="t", root_id="root", nodes=nodes)


def rewards(tree: MemoryCallTree) -> list[float]:
    return [n.reward for n in tree.nodes if n.kind == "memory"]


def test_the_committee_is_the_first_term_of_the_default_list() -> None:
    cfg = CreditConfig()
    assert [(t.name, t.weight) for t in cfg.terms] == [("committee", 0.5)] and cfg.weight_of("committee") == 0.5
    tree = group(["a", "bb"], [1.0, 0.0], [0.9, 0.3])
    assign_credit(tree, cfg)
    assert rewards(tree) == pytest.approx([1.0 + 0.5 * 0.3, 0.0 - 0.5 * 0.3])


def test_weighted_terms_add_up_each_centred_on_its_own() -> None:
    cfg = CreditConfig(
        terms=[
            {"name": "committee", "weight": 0.5, "centre": 0.5},
            {"name": "test_chars", "weight": 0.1},
            {"entry": "test_reward_terms:Scaled", "weight": 1.0, "params": {"factor": 2.0}},
        ],
        advantage="grpo_std",
    )
    tree = group(["aaaa", "bb"], [0.0, 0.0], [0.9, 0.3])
    assign_credit(tree, cfg)
    first = 0.5 * (0.9 - 0.5) + 0.1 * (0.4 - 0.3) + 1.0 * (1.8 - 1.2)
    second = 0.5 * (0.3 - 0.5) + 0.1 * (0.2 - 0.3) + 1.0 * (0.6 - 1.2)
    assert rewards(tree) == pytest.approx([first, second])
    advantages = [n.advantage for n in tree.nodes if n.kind == "memory"]
    assert advantages[0] > 0 > advantages[1]  # an outcome-tied group ranked by its shaping (grpo_std)
    assign_credit(tree, cfg.model_copy(update={"advantage": CreditConfig().advantage}))
    assert [n.advantage for n in tree.nodes if n.kind == "memory"] == [0.0, 0.0]  # the default: shaping alone, none


def test_a_term_missing_a_score_is_dropped_for_the_whole_group() -> None:
    cfg = CreditConfig(terms=[{"name": "test_chars", "weight": 1.0}, {"name": "committee", "weight": 0.5}])
    tree = group(["skip", "bbbbbb"], [1.0, 0.0], [None, 0.2])
    stats = assign_credit(tree, cfg)
    assert rewards(tree) == [1.0, 0.0]  # neither term: one had no score for 'skip', the other none for the first
    assert stats.term_dropped_groups == {"test_chars": 1, "committee": 1} and stats.committee_dropped_groups == 1


def test_builtin_terms() -> None:
    assert {"committee", "length", "prompt_overlap"} <= set(REWARD_TERMS.names())
    cfg = CreditConfig(terms=[{"name": "length", "weight": 1.0, "params": {"per_tokens": 10}}])
    tree = group(["aaaa", "bb"], [0.0, 0.0], [None, None])
    assign_credit(tree, cfg)
    assert rewards(tree) == pytest.approx([-0.4 + 0.3, -0.2 + 0.3])


def test_names_are_checked_when_the_config_loads() -> None:
    with pytest.raises(ValueError, match="unknown reward term 'comittee'; registered: committee"):
        RewardTermConfig(name="comittee")
    with pytest.raises(ValueError, match="exactly one of 'name'"):
        RewardTermConfig(name="committee", entry="test_reward_terms:Scaled")
    assert RewardTermConfig(name="test_reward_terms:Scaled", params={"factor": 2}).entry == "test_reward_terms:Scaled"


def test_the_old_committee_weight_key_names_the_new_one(tmp_path: Any) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("policy: {base: m}\ncredit: {committee_weight: 0.3}\n")
    with pytest.raises(ConfigError, match=r"credit.committee_weight.*terms: \[\{name: committee, weight: 0.5\}\]"):
        load_config(OATGRPOConfig, path, [])
    with pytest.raises(ConfigError, match=r"renamed.*terms"):
        load_config(OATGRPOConfig, None, ["policy.base=m", "credit.committee_weight=0.3"])
    with pytest.raises(ConfigError, match=r"centre.*set it on the term"):
        load_config(OATGRPOConfig, None, ["policy.base=m", "credit.centre=0.2"])
