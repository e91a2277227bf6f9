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
    return MemoryCall(
        call_id="c",
        role=role,
        text=text,
        response_ids=[1, 2, 3],
        logprobs=[-0.1, -0.2, -0.3],
        prompt_ids=[7, 8],
        finish_reason=finish,
        error=error,
    )


def sample(
    index: int,
    text: str,
    outcome: float,
    *,
    reminders_after: int = 0,
    followup: MemoryCall | None = None,
    role: str = "intervene",
) -> PivotSample:
    reminder = parse_intervention(followup.text if followup is not None else text)[0]
    return PivotSample(
        index=index,
        call=call(text, role),
        followup=followup,
        reminder=reminder,
        outcome=outcome,
        reminders_after=reminders_after,
        usage=TokenUsage(),
        fingerprint="f",
    )


def result(samples: list[PivotSample], role: str = "intervene") -> PivotGroupResult:
    return PivotGroupResult(
        pivot_id="t/r/v0/s0/t5",
        task_id="t",
        role=role,
        prompt_ids=[7, 8],
        messages=[Message(role="user", content="decision:")],
        state="f",
        samples=samples,
    )


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
    bad = [
        "",
        "oops",
        "<context_for_action></context_for_action>",
        "<context_for_action> </context_for_action>",
        "<context_for_action>a</context_for_action><context_for_action>b</context_for_action>",
        "<no_intervention/> but also this",
        "<context_for_action>open",
    ]
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
    samples = [
        sample(0, "edits", 1.0, followup=follow, role="bank_edit"),
        sample(1, "edits", 0.0, followup=call(SILENCE), role="bank_edit"),
    ]
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
        load_config(
            PivotGRPOConfig,
            None,
            defaults={
                **base,
                "groups": {"phases": "phase1+2"},
                "phase1": {"backend": "scripted", "scripted_policy": "a:b"},
            },
        )
    with pytest.raises(ConfigError, match="variant"):
        load_config(PivotGRPOConfig, None, defaults={**base, "memory": {"variant": "always_inject"}})
    with pytest.raises(ConfigError, match="rollout engine"):
        load_config(PivotGRPOConfig, None, defaults={**base, "engine": {"backend": "scripted"}})


def test_placement_endpoints_replace_the_action_agent() -> None:
    from memrl.train.pivot_grpo import _reasoner_config

    cfg = load_config(
        PivotGRPOConfig,
        ROOT / "configs" / "pivot_grpo_qwen3.5-27b.yaml",
        ['placement.reasoner={"model": "served-122b", "endpoints": ["http://a:8000/v1", "http://b:8000/v1"]}'],
    )
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
        "reasoner": {
            "backend": "scripted",
            "scripted_policy": "memrl.data.tasks.proactive:ActionAgent",
            "tokenizer": str(model),
        },
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


# protects: pivot-turn GRPO end to end on the tiny model: refresh, groups, updates, evaluation, resume reloading the
# pool, a longer resumed run relabelling
@pytest.mark.slow
def test_online_loop_runs_evaluates_and_resumes(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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
    longer = tiny_run(
        tmp_path,
        tiny_model_dir,
        run={"resume": True, "allow_config_change": ["loop.iterations"]},
        loop={"iterations": 3},
    )
    assert run_pivot_grpo(longer) == 0
    assert (run / "pivots" / "r0001" / "COMPLETE").exists()


# protects: the all-turns variant: no pivot detection, the start evaluation read back from baselines.json
@pytest.mark.slow
def test_all_turns_groups_skip_detection_and_reuse_the_start_evaluation(tmp_path: Path, tiny_model_dir: Path) -> None:
    from memrl.train.pivot_grpo import run_pivot_grpo

    run = tmp_path / "pivot"
    run.mkdir()
    start = {
        "sft_pass_rate": 0.25,
        "sft_reminders_per_episode": 1.5,
        "sft_double_checks_per_episode": 0.0,
        "sft_action_tokens": 10.0,
        "no_memory_pass_rate": 0.0,
    }
    (run / "baselines.json").write_text(json.dumps(start))  # as a first variant from the same SFT model wrote it
    cfg = tiny_run(
        tmp_path,
        tiny_model_dir,
        groups={"at": "all_turns", "pivots_per_iteration": 2, "non_pivots_per_iteration": 1},
        loop={"iterations": 1},
    )
    assert run_pivot_grpo(cfg) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["before"]["pass_rate"] == 0.25 and summary["before"]["reminders_per_episode"] == 1.5
    (row,) = summary["history"]
    assert row["pivot_groups"] == 3 and row["refresh_turns"] >= 3 and "refresh_candidates" not in row
    assert row["action_tokens"] > 0


def cli_config(tmp_path: Path, model: Path, name: str, **overrides: Any) -> Path:
    """The tiny run's config as the YAML file ``memrl train pivot-grpo --config`` reads, made to update: the random
    model never writes the strict format, so untagged text counts as silence, and a stop string that its samples
    sometimes produce makes some finish (well-formed silence, reward 0) and others hit max_tokens (malformed, -0.5);
    the paper's ``grpo_std`` advantage lets that penalty rank outcome-tied samples (the default trains none), and the
    KL probe runs after every update. Full weights: a fresh LoRA adapter's initialisation is not drawn from
    ``run.seed``, so two fresh LoRA runs differ (a resumed one reads the adapter back, so resumes are exact either
    way)."""
    import yaml

    sampling = {"bank_edit": {"max_tokens": 64}, "intervene": {"max_tokens": 12, "stop": ["q"]}}
    cfg = tiny_run(
        tmp_path,
        model,
        run={"name": name},
        trainer={"probe_rows": 4, "probe_every": 1, "lora": {"enabled": False}},
        reward={"strict_format": False, "advantage": "grpo_std"},
        memory={"window": 1, "sampling": sampling},
        groups={"group_size": 4},
        **overrides,
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_defaults=True)))
    return path


def comparable(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl without the wall-clock fields and the action agent's token spend (the scripted agent's
    simulated prefix cache starts cold in a new process, as a real server's would, so a resumed run spends more
    uncached prompt tokens): what a resumed run must log exactly as the uninterrupted one."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not (k.endswith(("_s", "action_tokens")) or k == "time")} for r in rows]


# protects: `memrl train pivot-grpo` killed in its last checkpoint write with a one-step-off collection in flight
# resumes to the uninterrupted run's weights and metrics, the pool not relabelled
@pytest.mark.slow
@pytest.mark.parametrize("staleness", [1])  # k = 0's first-write kill: test_online_loop_runs_evaluates_and_resumes's
#                                            resume from the first checkpoint, and the OAT-GRPO kills (one loop)
def test_sigkill_in_a_checkpoint_write_then_resume_equals_the_uninterrupted_run(
    tmp_path: Path, tiny_model_dir: Path, staleness: int
) -> None:
    """Pivot-turn GRPO resumes through the shared online loop: a SIGKILL while a checkpoint is being written (the
    first with k = 0; the last with k = 1, whose checkpoint before it names the one-step-off collection in flight
    and the policy version it ran under), then ``--resume``, ends with the uninterrupted run's weights, every step
    logged once with the same figures (kl_initial_probe: the probe travels in the checkpoint; the refresh's metrics
    and tokens: logged with the refresh's first iteration, even when a resume reloads the pool), and the pool not
    relabelled."""
    import sys

    from benchmarks import resume_faults as bench

    def command(name: str, *extra: str) -> list[str]:
        config = cli_config(tmp_path, tiny_model_dir, name, loop={"max_staleness": staleness})
        return [sys.executable, "-m", "memrl.launch.cli", "train", "pivot-grpo", "--config", str(config), *extra]

    bench.run(command("reference"))
    reference = tmp_path / "reference"
    expected = comparable(reference)
    assert [r["step"] for r in expected] == [-1, 0, 1]
    assert expected[1]["rows"] > 0 and expected[2]["rows"] > 0  # both iterations update the weights
    assert expected[1]["kl_initial_probe"] > 0.0 and expected[2]["kl_initial_probe"] > 0.0
    assert expected[1]["refresh_candidates"] >= 1 and "refresh_candidates" not in expected[2]
    logged = [json.loads(line) for line in (reference / "metrics.jsonl").read_text().splitlines()]
    # the refresh's labelling and detection tokens count once, with the refresh's first iteration
    assert logged[1]["action_tokens"] == logged[1]["group_action_tokens"] + logged[1]["refresh_action_tokens"]
    assert logged[2]["action_tokens"] == logged[2]["group_action_tokens"]
    assert expected[1]["policy_version_collected"] == 0 and expected[2]["policy_version_collected"] == 1 - staleness
    in_write_of = 0 if staleness == 0 else 1
    hit = bench.kill_at(command("killed"), tmp_path / "killed", None, in_write_of=in_write_of)
    if hit["finished"]:
        pytest.skip("the run finished before the kill landed (a very slow machine)")
    assert hit["checkpoint_being_written"] == [f".tmp-ckpt-{in_write_of:06d}"], hit
    killed = tmp_path / "killed"
    stamp = (killed / "pivots" / "r0000" / "pivots.jsonl").stat().st_mtime_ns
    bench.run(command("killed", "--resume"))
    assert comparable(killed) == expected, hit
    assert bench.same_weights(bench.weights(killed), bench.weights(reference)), hit
    assert (killed / "pivots" / "r0000" / "pivots.jsonl").stat().st_mtime_ns == stamp  # reloaded, not relabelled
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["iterations_run"] == (2 if staleness == 0 else 1) and summary["training_action_tokens"] > 0
    assert not list((killed / "checkpoints").glob(".tmp-ckpt-*"))


def test_stale_pivot_runs_get_truncated_importance_sampling(tmp_path: Path, tiny_model_dir: Path) -> None:
    """``loop.max_staleness`` is the online loop's: k >= 1 turns truncated importance sampling on (config.yaml shows
    the cap), k = 0 leaves the trainer as configured."""
    from memrl.train.online import STALE_TIS_CAP

    assert tiny_run(tmp_path, tiny_model_dir, loop={"max_staleness": 1}).trainer.tis_cap == STALE_TIS_CAP
    assert tiny_run(tmp_path, tiny_model_dir).trainer.tis_cap is None
    with pytest.raises(ValueError, match="keep_policy_versions"):
        tiny_run(tmp_path, tiny_model_dir, loop={"max_staleness": 2, "keep_policy_versions": 2})
