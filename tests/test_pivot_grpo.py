"""Pivot-turn GRPO: rewards (verifier outcome, reminder cost, format penalty), group building, the configs, and the
online loop end to end on the tiny model with checkpoint/resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from memrl.data.config import ConfigError, load_config
from memrl.data.formats import parse_intervention
from memrl.data.schemas import MemoryCall, Message, TokenUsage
from memrl.data.tasks.proactive import ProactiveParams
from memrl.launch.cli import build_parser
from memrl.launch.jobs import JOBS
from memrl.rewards.groups import pivot_groups
from memrl.rewards.pivot import PivotRewardConfig, is_malformed, pivot_reward
from memrl.rollout.pivots import PivotGroupResult, PivotSample
from memrl.train.pivot_grpo import PivotGRPOConfig

ROOT = Path(__file__).resolve().parents[1]
SILENCE = "<no_intervention/>"


def call(text: str, role: str = "intervene", finish: str = "stop", error: str | None = None) -> MemoryCall:
    return MemoryCall(call_id="c", role=role, text=text, response_ids=[1, 2, 3], logprobs=[-0.1, -0.2, -0.3],
                      prompt_ids=[7, 8], finish_reason=finish, error=error)


def sample(index: int, text: str, outcome: float, *, reminders_after: int = 0, followup: MemoryCall | None = None,
           role: str = "intervene") -> PivotSample:
    reminder = parse_intervention(followup.text if followup is not None else text)[0]
    return PivotSample(index=index, call=call(text, role), followup=followup, reminder=reminder, outcome=outcome,
                       reminders_after=reminders_after, usage=TokenUsage(), fingerprint="f")


def result(samples: list[PivotSample], role: str = "intervene") -> PivotGroupResult:
    return PivotGroupResult(pivot_id="t/r/v0/s0/t5", task_id="t", role=role, prompt_ids=[7, 8],
                            messages=[Message(role="user", content="decision:")], state="f", samples=samples)


# ---------------------------------------------------------------------------------------------------- rewards
def test_reward_is_outcome_minus_reminder_cost_and_format_penalty() -> None:
    cfg = PivotRewardConfig(reminder_cost=0.1, format_penalty=0.5)
    remind = sample(0, "<context_for_action>requirement: use python3.10</context_for_action>", 1.0, reminders_after=3)
    assert pivot_reward(remind, cfg) == pytest.approx(0.9)
    assert pivot_reward(remind, cfg.model_copy(update={"cost_scope": "continuation"})) == pytest.approx(0.7)
    assert pivot_reward(sample(1, SILENCE, 1.0), cfg) == 1.0
    assert pivot_reward(sample(2, "garbage", 0.0), cfg) == -0.5  # untagged text: silence, but malformed
    lenient = cfg.model_copy(update={"strict_format": False})
    assert pivot_reward(sample(2, "garbage", 0.0), lenient) == 0.0
    assert pivot_reward(sample(3, "<context_for_action>x", 0.0), lenient) == -0.5  # unclosed: malformed either way


def test_malformed_outputs_never_raise() -> None:
    well = [SILENCE, " <no_intervention/>\n", "<context_for_action>keep port 5444</context_for_action>"]
    bad = ["", "oops", "<context_for_action></context_for_action>", "<context_for_action> </context_for_action>",
           "<context_for_action>a</context_for_action><context_for_action>b</context_for_action>",
           "<no_intervention/> but also this", "<context_for_action>open"]
    assert not any(is_malformed(call(t)) for t in well)
    assert all(is_malformed(call(t)) for t in bad)
    assert is_malformed(call(SILENCE, finish="length"))
    assert is_malformed(call("", role="bank_edit", error="unknown tool")) and not is_malformed(call("", "bank_edit"))


def test_groups_carry_rewards_advantages_and_rollout_logprobs() -> None:
    good = "<context_for_action>requirement: never touch data/raw</context_for_action>"
    results = [result([sample(0, good, 1.0), sample(1, SILENCE, 0.0), sample(2, good, 1.0), sample(3, "x", 0.0)])]
    (group,) = pivot_groups(results, PivotRewardConfig(reminder_cost=0.0, format_penalty=0.5))
    assert group.source == "pivot" and group.role == "intervene" and group.prompt_ids == [7, 8]
    assert [s.reward for s in group.samples] == [1.0, 0.0, 1.0, -0.5]
    advantages = [s.advantage for s in group.samples]
    assert advantages[0] == advantages[2] > 0 > advantages[1] > advantages[3]
    assert sum(advantages) == pytest.approx(0.0, abs=1e-6)
    assert all(s.rollout_logprobs == [-0.1, -0.2, -0.3] for s in group.samples)
    # a group whose samples all score the same carries no signal
    (flat,) = pivot_groups([result([sample(0, SILENCE, 1.0), sample(1, SILENCE, 1.0)])])
    assert flat.zero_variance and all(s.advantage == 0.0 for s in flat.samples)


def test_phase1_and_2_groups_add_the_followups_with_the_same_advantage() -> None:
    follow = call("<context_for_action>requirement: use python3.9</context_for_action>")
    samples = [sample(0, "edits", 1.0, followup=follow, role="bank_edit"),
               sample(1, "edits", 0.0, followup=call(SILENCE), role="bank_edit")]
    groups = pivot_groups([result(samples, role="bank_edit")], PivotRewardConfig(advantage="dr_grpo"))
    assert [g.role for g in groups] == ["bank_edit", "intervene", "intervene"]
    assert groups[0].samples[0].advantage == groups[1].samples[0].advantage == 0.5
    assert groups[2].samples[0].advantage == -0.5 and groups[2].prompt_ids == [7, 8]


# ---------------------------------------------------------------------------------------------------- configs
@pytest.mark.parametrize("name", ["pivot_grpo_tiny.yaml", "pivot_grpo_qwen3.5-27b.yaml"])
def test_configs_validate(name: str) -> None:
    cfg = load_config(PivotGRPOConfig, ROOT / "configs" / name)
    assert cfg.command == "train pivot-grpo" and cfg.memory.variant == "full"
    # the detection budget covers the recorded decision, silence, one bank entry per fact kind the tasks plant and the
    # policy samples: every entry that could be the needed one is tried
    detect = cfg.pivots.detect
    facts = ProactiveParams.model_validate(cfg.train_tasks.params).facts
    assert detect.alternatives >= 2 + len(facts) + detect.policy_samples


def test_cli_registers_the_job_and_checks_the_config(tmp_path: Path) -> None:
    job = next(j for j in JOBS if j.path == ("train", "pivot-grpo"))
    assert job.resumable and job.load("config") is PivotGRPOConfig
    args = build_parser().parse_args(["train", "pivot-grpo", "--config", "x.yaml", "--resume", "loop.iterations=3"])
    assert args.resume and args.overrides == ["loop.iterations=3"]
    base = {"policy": {"base": "m"}, "engine": {"backend": "hf", "model": "m"}}
    with pytest.raises(ConfigError, match="phase1"):
        load_config(PivotGRPOConfig, None, defaults={**base, "groups": {"phases": "phase1+2"},
                                                     "phase1": {"backend": "scripted", "scripted_policy": "a:b"}})
    with pytest.raises(ConfigError, match="variant"):
        load_config(PivotGRPOConfig, None, defaults={**base, "memory": {"variant": "always_inject"}})
    with pytest.raises(ConfigError, match="rollout engine"):
        load_config(PivotGRPOConfig, None, defaults={**base, "engine": {"backend": "scripted"}})


def test_placement_endpoints_replace_the_action_agent() -> None:
    from memrl.train.pivot_grpo import _reasoner_config

    cfg = load_config(PivotGRPOConfig, ROOT / "configs" / "pivot_grpo_qwen3.5-27b.yaml", [
        'placement.reasoner={"model": "served-122b", "endpoints": ["http://a:8000/v1", "http://b:8000/v1"]}'])
    engine = _reasoner_config(cfg)
    assert engine.backend == "openai" and engine.model == "served-122b"
    assert [e.url for e in engine.endpoints] == ["http://a:8000/v1", "http://b:8000/v1"]
    assert all(e.max_concurrency == 64 and e.model == "served-122b" for e in engine.endpoints)


# ---------------------------------------------------------------------------------------------------- end to end
def tiny_run(tmp_path: Path, model: Path, **overrides: Any) -> PivotGRPOConfig:
    params = {"n_subtasks": 6, "facts": ["interpreter"]}
    writer = {"backend": "scripted", "scripted_policy": "memrl.data.tasks.proactive:BankWriter"}
    data = {
        "run": {"output_dir": str(tmp_path), "name": "pivot", "seed": 0},
        "policy": {"base": str(model)},
        "engine": {"backend": "hf", "model": str(model), "dtype": "float32"},
        "reasoner": {"backend": "scripted", "scripted_policy": "memrl.data.tasks.proactive:ActionAgent",
                     "tokenizer": str(model)},
        "phase1": writer,
        "memory": {"window": 1, "sampling": {"bank_edit": {"max_tokens": 64}, "intervene": {"max_tokens": 12}}},
        "train_tasks": {"params": params, "count": 3},
        "eval_tasks": {"params": params, "seed_start": 50, "count": 2},
        "pivots": {"every": 2, "tasks": 2, "detect": {"policy_samples": 1, "alternatives": 3}},
        "groups": {"group_size": 2, "pivots_per_iteration": 2},
        "trainer": {"lr": 1e-3, "lora": {"r": 4, "alpha": 8}},
        "loop": {"iterations": 2, "checkpoint_every": 1},
        "eval": {"greedy": False},
    }
    for key, value in overrides.items():
        data[key] = {**data.get(key, {}), **value}
    return PivotGRPOConfig.model_validate(data)


@pytest.mark.slow
def test_online_loop_runs_evaluates_and_resumes(tmp_path: Path, tiny_model_dir: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from memrl.rollout.engines.base import Engine
    from memrl.train.pivot_grpo import run_pivot_grpo

    slept: list[str] = []
    monkeypatch.setattr(Engine, "sleep", lambda self: slept.append(self.name))
    assert run_pivot_grpo(tiny_run(tmp_path, tiny_model_dir)) == 0
    assert len(slept) == 2  # the policy's engine sleeps once per update (a no-op off GPU)
    run = tmp_path / "pivot"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["iterations_run"] == 2 and summary["after"]["iteration"] == 1
    history = summary["history"]
    assert history[0]["pivot_pool"] >= 1 and history[0]["refresh_requirement_recall"] == 1.0  # the planted pivot
    before, after = summary["before"], summary["after"]
    for key in ("pass_rate", "reminders_per_episode", "action_tokens", "no_memory_pass_rate", "sft_pass_rate"):
        assert key in before and key in after
    assert before["sft_pass_rate"] == before["pass_rate"]  # the SFT baseline is the policy before any update
    assert summary["training_action_tokens"] > 0
    pivots = run / "pivots" / "r0000"
    assert (pivots / "COMPLETE").exists() and (pivots / "pivots.jsonl").exists()
    assert not (run / "pivots" / "r0001").exists()  # every: 2, so both iterations used the first pool
    stamp = (pivots / "pivots.jsonl").stat().st_mtime_ns

    # a kill after iteration 0: resume from its checkpoint; the pool is reloaded, not relabelled
    shutil.rmtree(run / "checkpoints" / "ckpt-000001")
    assert run_pivot_grpo(tiny_run(tmp_path, tiny_model_dir, run={"resume": True})) == 0
    resumed = json.loads((run / "summary.json").read_text())
    assert resumed["iterations_run"] == 1 and (pivots / "pivots.jsonl").stat().st_mtime_ns == stamp
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [-1, 0, 1]  # iteration 1 was redone and logged once
    # going on past the first pool relabels with the current policy
    # (a longer run is a config change --resume refuses unless it is named)
    longer = tiny_run(tmp_path, tiny_model_dir, run={"resume": True, "allow_config_change": ["loop.iterations"]},
                      loop={"iterations": 3})
    assert run_pivot_grpo(longer) == 0
    assert (run / "pivots" / "r0001" / "COMPLETE").exists()


@pytest.mark.slow
def test_all_turns_groups_skip_detection_and_reuse_the_start_evaluation(tmp_path: Path, tiny_model_dir: Path) -> None:
    from memrl.train.pivot_grpo import run_pivot_grpo

    run = tmp_path / "pivot"
    run.mkdir()
    start = {"sft_pass_rate": 0.25, "sft_reminders_per_episode": 1.5, "sft_double_checks_per_episode": 0.0,
             "sft_action_tokens": 10.0, "no_memory_pass_rate": 0.0}
    (run / "baselines.json").write_text(json.dumps(start))  # as a first variant from the same SFT model wrote it
    cfg = tiny_run(tmp_path, tiny_model_dir, groups={"at": "all_turns", "pivots_per_iteration": 2,
                                                       "non_pivots_per_iteration": 1}, loop={"iterations": 1})
    assert run_pivot_grpo(cfg) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["before"]["pass_rate"] == 0.25 and summary["before"]["reminders_per_episode"] == 1.5
    (row,) = summary["history"]
    assert row["pivot_groups"] == 3 and row["refresh_turns"] >= 3 and "refresh_candidates" not in row
    assert row["action_tokens"] > 0


def test_a_resumed_pivot_run_measures_kl_to_its_initial_policy(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The KL probe travels in pivot-GRPO's checkpoint: after a resume, kl_initial_probe is the distance to the
    run's start, as in the uninterrupted run (a probe re-fixed at the resume would read one update's KL)."""
    from types import SimpleNamespace

    import torch
    from test_group_trainer import groups_for

    from memrl.train.checkpoint import CheckpointManager
    from memrl.train.group_trainer import GroupTrainer, GroupTrainerConfig
    from memrl.train.pivot_grpo import checkpoint_state, resume_state
    from memrl.train.policy import LoraSettings, PolicySpec

    def trainer() -> GroupTrainer:
        torch.manual_seed(0)  # the same LoRA initialisation each time
        return GroupTrainer(PolicySpec(base=str(tiny_model_dir)),
                            GroupTrainerConfig(lr=5e-3, lora=LoraSettings(r=8, alpha=16), probe_rows=3))

    whole = trainer()
    groups = groups_for(whole.tokenizer, "the red key is in drawer 5", "nothing relevant")
    uninterrupted = [whole.step(groups)["kl_initial_probe"] for _ in range(2)]
    assert uninterrupted[1] > uninterrupted[0] > 1e-4

    first = trainer()
    assert first.step(groups)["kl_initial_probe"] == pytest.approx(uninterrupted[0], rel=1e-5)
    ckpt = CheckpointManager(tmp_path / "checkpoints", keep=2)
    ckpt.save(0, first.accelerator, first.model, checkpoint_state(0, first, [], []))
    resumed = trainer()
    start, _, _ = resume_state(SimpleNamespace(run=SimpleNamespace(resume=True)), ckpt, resumed, None)
    assert start == 1
    assert resumed.step(groups)["kl_initial_probe"] == pytest.approx(uninterrupted[1], rel=1e-4)
