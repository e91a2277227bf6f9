"""Advantages from an outcome and shaping terms (rewards/advantage.py): the paper's GRPO formula and the options that
keep a shaping term from outvoting the outcome, on hand-computed groups; presets and renamed keys in configs."""

from __future__ import annotations

import copy
import math

import pytest
from pydantic import ValidationError

from memrl.data.config import ConfigError, load_config
from memrl.rewards.advantage import (
    ADVANTAGE_PRESETS,
    AdvantageConfig,
    group_advantages,
    shaped_batch_advantages,
    shaped_group_advantages,
)
from memrl.rewards.credit import CreditConfig
from memrl.rewards.pivot import PivotRewardConfig

TIED = ([1.0, 1.0], [0.005, -0.005])  # outcomes tie; a committee gap of 0.02 x lambda 0.5 is the only difference
SPLIT = ([1.0, 0.0, 0.0, 0.0], [0.0, 0.05, 0.0, -0.05])


def pstd(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def test_the_papers_formula_turns_any_shaping_gap_in_a_tied_group_into_unit_advantages() -> None:
    cfg = ADVANTAGE_PRESETS["grpo_std"]
    assert cfg != AdvantageConfig() and cfg.preset == "grpo_std" and AdvantageConfig().preset == "informative_only"
    assert shaped_group_advantages(*TIED, cfg) == pytest.approx([1.0, -1.0], abs=1e-3)
    rewards = [o + s for o, s in zip(*SPLIT, strict=True)]
    mean, std = sum(rewards) / 4, pstd(rewards)
    assert shaped_group_advantages(*SPLIT, cfg) == pytest.approx([(r - mean) / (std + 1e-6) for r in rewards])
    # the plain GRPO helper is the same formula with no shaping
    assert group_advantages(rewards, "std") == pytest.approx(shaped_group_advantages(rewards, [0.0] * 4, cfg))


@pytest.mark.parametrize(
    "preset, tied",
    [
        ("dr_grpo", [0.005, -0.005]),  # centred, not divided: the gap stays its own size
        ("dr_grpo_gated", [0.0, 0.0]),  # alone in its batch, a tied group has no outcome signal: no update
        ("std_floor", [0.0, 0.0]),
        ("informative_only", [0.0, 0.0]),  # shaping only inside outcome-informative groups
        ("batch_outcome_std", [0.0, 0.0]),  # S_o = 0: no scale, no update
    ],
)
def test_a_tied_group_gets_the_advantage_its_option_defines(preset: str, tied: list[float]) -> None:
    assert shaped_group_advantages(*TIED, ADVANTAGE_PRESETS[preset]) == pytest.approx(tied, abs=1e-9)


def test_batch_options_see_the_whole_batch() -> None:
    batch = [TIED, SPLIT]
    rewards = [o + s for o, s in zip(*SPLIT, strict=True)]
    centred = [r - sum(rewards) / 4 for r in rewards]
    # dr_grpo_gated: the batch has outcome signal, so the tied group keeps its small centred gap
    gated = shaped_batch_advantages(batch, ADVANTAGE_PRESETS["dr_grpo_gated"])
    assert gated[0] == pytest.approx([0.005, -0.005]) and gated[1] == pytest.approx(centred)
    # informative_only: the tied group is zero whatever the batch; the split group keeps the group std
    only = shaped_batch_advantages(batch, ADVANTAGE_PRESETS["informative_only"])
    assert only[0] == [0.0, 0.0] and only[1] == pytest.approx([c / (pstd(rewards) + 1e-6) for c in centred])
    # batch_outcome_std: one scale, the pooled within-group std of the outcomes over all 6 members
    s_o = math.sqrt((0 + sum((o - 0.25) ** 2 for o in SPLIT[0])) / 6)
    scaled = shaped_batch_advantages(batch, ADVANTAGE_PRESETS["batch_outcome_std"])
    assert scaled[0] == pytest.approx([0.005 / s_o, -0.005 / s_o], rel=1e-4)
    assert scaled[1] == pytest.approx([c / s_o for c in centred], rel=1e-4)
    assert abs(scaled[0][0]) < 0.02 < 1.0 < abs(scaled[1][0])  # the committee gap stays small beside the outcome
    # batch_std: the pooled std of r over the same members
    s_r = math.sqrt((2 * 0.005**2 + sum(c * c for c in centred)) / 6)
    batch_std = AdvantageConfig(scale="batch_std", tied_groups="shaping")
    assert shaped_batch_advantages(batch, batch_std)[0][0] == pytest.approx(0.005 / s_r, rel=1e-4)


def test_std_floor_bounds_the_divisor() -> None:
    cfg = AdvantageConfig(std_floor=0.25, tied_groups="shaping")
    assert shaped_group_advantages(*TIED, cfg) == pytest.approx([0.02, -0.02], rel=1e-3)
    # above the floor the group std is used as before
    assert shaped_group_advantages([1.0, 0.0], [0.0, 0.0], cfg) == pytest.approx([1.0, -1.0], rel=1e-5)


def test_zero_variance_and_single_member_groups_carry_nothing() -> None:
    for name, cfg in ADVANTAGE_PRESETS.items():
        assert shaped_group_advantages([1.0, 1.0], [0.1, 0.1], cfg) == [0.0, 0.0], name
        assert shaped_group_advantages([1.0], [0.3], cfg) == [0.0], name
    with pytest.raises(ValueError, match="2 outcomes but 1 shaping"):
        shaped_group_advantages([1.0, 0.0], [0.0], AdvantageConfig())


def test_presets_by_name_in_configs_and_clear_errors_for_old_keys(tmp_path) -> None:
    assert CreditConfig(advantage="dr_grpo").advantage == ADVANTAGE_PRESETS["dr_grpo"]
    assert PivotRewardConfig(advantage="informative_only").advantage.tied_groups == "zero"
    assert PivotRewardConfig().advantage.preset == CreditConfig().advantage.preset == "informative_only"
    with pytest.raises(ValidationError, match="the former 'none' is now 'dr_grpo'"):
        PivotRewardConfig(advantage="none")
    with pytest.raises(ValidationError, match=r"renamed: set 'advantage\.scale'"):
        CreditConfig(advantage_scale="none")
    from memrl.train.oat_grpo import OATGRPOConfig

    cfg = load_config(
        OATGRPOConfig,
        None,
        ["credit.advantage=std_floor", "credit.advantage.std_floor=0.5"],
        defaults={"policy": {"base": "x"}},
    )
    assert cfg.credit.advantage.std_floor == 0.5 and cfg.credit.advantage.outcome_free_batch == "skip"
    with pytest.raises(ConfigError, match=r"credit\.advantage_scale' was renamed: set 'advantage\.scale'"):
        load_config(OATGRPOConfig, None, ["credit.advantage_scale=none"], defaults={"policy": {"base": "x"}})
    named = tmp_path / "named.yaml"
    named.write_text("policy: {base: x}\ncredit:\n  advantage: dr_grpo_gated\n")
    cfg = load_config(OATGRPOConfig, named, ["credit.advantage.eps=0.01"])  # a key on top of the named setting
    assert cfg.credit.advantage == ADVANTAGE_PRESETS["dr_grpo_gated"].model_copy(update={"eps": 0.01})
    path = tmp_path / "old.yaml"
    path.write_text("policy: {base: x}\ncredit:\n  eps: 0.0\n")
    with pytest.raises(ConfigError, match=r"old.yaml:3: key 'credit.eps': this key was renamed: set 'advantage.eps'"):
        load_config(OATGRPOConfig, path)


@pytest.mark.parametrize("preset", list(ADVANTAGE_PRESETS))
def test_oat_credit_gives_a_committee_only_tied_group_the_advantage_its_option_defines(preset: str) -> None:
    """Acceptance 3: in a tree whose sibling group ties on the outcome (both leaves succeed) and whose committee
    scores differ a little (0.61 vs 0.60), each node's advantage is what the option defines for (V, lambda (c - c_bar));
    only the paper's formula makes it +-1; under the default it is 0."""
    from memrl.data.schemas import MemoryCall, MemoryCallTree, TreeNode
    from memrl.rewards.credit import assign_batch_credit

    nodes = [TreeNode(node_id="root", kind="root", children=["a", "b"])]
    for nid, score in (("a", 0.61), ("b", 0.60)):
        nodes += [
            TreeNode(
                node_id=nid,
                parent_id="root",
                depth=1,
                kind="memory",
                group_id="g",
                children=[f"{nid}l"],
                committee_score=score,
                call=MemoryCall(call_id=nid, role="recall", response_ids=[ord(nid)]),
            ),
            TreeNode(node_id=f"{nid}l", parent_id=nid, depth=2, kind="leaf", outcome=1.0),
        ]
    tree = MemoryCallTree(tree_id="t", task_id="t", root_id="root", nodes=nodes)
    cfg = CreditConfig(terms=[{"name": "committee", "weight": 0.5}], advantage=preset)
    assign_batch_credit([tree], cfg)
    got = [n.advantage for n in tree.nodes if n.kind == "memory"]
    assert got == pytest.approx(shaped_group_advantages([1.0, 1.0], [0.0025, -0.0025], cfg.advantage), abs=1e-9)
    if preset == "grpo_std":
        assert got == pytest.approx([1.0, -1.0], abs=1e-3)
    else:
        assert max(abs(a) for a in got) <= 0.01
    default = copy.deepcopy(tree)
    assign_batch_credit([default], CreditConfig(terms=[{"name": "committee", "weight": 0.5}]))
    assert [n.advantage for n in default.nodes if n.kind == "memory"] == [0.0, 0.0]
