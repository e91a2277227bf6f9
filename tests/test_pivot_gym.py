"""Pivot detection and pivot-turn GRPO on a user's Gym-style environment (the vault game of examples/gym_env) with the
proactive memory agent and a frozen action agent: states re-entered by replay (checked step by step) or by the
environment's own snapshot/restore, the same labels either way, a non-deterministic environment refused by name."""

from __future__ import annotations

import json
import random
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "gym_env"))

from components import VaultPlayer  # noqa: E402

from memrl.data.envs.gym import ReplayMismatchError  # noqa: E402
from memrl.data.formats import parse_phase_prompt, render_tool_call  # noqa: E402
from memrl.data.tasks import TaskSetConfig, load_tasks  # noqa: E402
from memrl.rollout.engines.scripted import ScriptedEngine  # noqa: E402
from memrl.rollout.loop import EngineSet  # noqa: E402
from memrl.rollout.memory.proactive import ProactiveConfig  # noqa: E402
from memrl.rollout.pivots import (  # noqa: E402
    DetectConfig,
    LabelledRollout,
    PrefilterConfig,
    detect_pivots,
    label_rollouts,
    restore,
    state_digest,
)
from memrl.rollout.pivots.sampling import sibling_fork  # noqa: E402

CORRIDOR = 3  # rooms between the hall and the vault: the vault is reached at step CORRIDOR + 1
# the action agent keeps one step of history, so the hall's note is out of its context at the vault; a memory step
# every step (Phase 1 then Phase 2)
MEMORY = ProactiveConfig(window=1, action_window=1, trigger_every=1)
EVERY_STEP = PrefilterConfig(every_step=True, state_change=False, tool_error=False, repeat=False)
# tests/test_gym_env.py's SnapshotVault (the vault game with snapshot/restore) and NoisyVault (posters that change
# from one reset to the next) are named below by import path, as a user's config names an environment


class VaultNotes:
    """A scripted Phase 1 for the vault game: every code sentence the task or the window shows is saved once as a
    knowledge entry (the vault's and the posters' alike: it cannot tell which one the vault will ask for)."""

    name = "vault-notes"

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        parsed = parse_phase_prompt(messages)
        if parsed is None or parsed[0] != 1:
            return ""
        _, task, window, bank = parsed
        saved = {content for _, content in bank.knowledge.items()}
        calls = []
        for sentence in re.findall(r"the (?:vault|locker) code is \d{3}", f"{task}\n{window}"):
            if sentence not in saved:
                calls.append(render_tool_call("memory_save_knowledge", {"content": sentence}))
                saved.add(sentence)
        return "\n".join(calls)


class Silent:
    """A Phase 2 that never reminds: the action agent reaches the vault without its code."""

    name = "silent"

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        return "<no_intervention/>"


def vault_tasks(entry: str, count: int = 3, **extra: Any) -> list[Any]:
    cfg = TaskSetConfig(entry=entry, params={"corridor": CORRIDOR}, max_steps=8, count=count, **extra)
    return load_tasks(cfg, "train")


def vault_engines() -> EngineSet:
    return EngineSet(
        reasoner=ScriptedEngine(VaultPlayer()),
        memory=ScriptedEngine(Silent()),
        by_role={"bank_edit": ScriptedEngine(VaultNotes())},
    )


def labels(entry: str, reentry: str = "auto") -> tuple[list[LabelledRollout], list[Any], dict[str, Any]]:
    tasks = vault_tasks(entry, reentry=reentry)
    records = label_rollouts(tasks, vault_engines(), MEMORY, prefilter=EVERY_STEP, seed=0)
    pivots, stats = detect_pivots(
        records,
        vault_engines(),
        DetectConfig(prefilter=EVERY_STEP, policy_samples=0),
        tasks={t.task_id: t for t in tasks},
    )
    return records, pivots, {"stats": stats, "tasks": tasks}


def test_detection_finds_the_vault_pivot_of_a_gym_environment_re_entered_by_replay() -> None:
    records, pivots, extra = labels("vault_game:VaultGame")
    tasks = {t.task_id: t for t in extra["tasks"]}
    assert len(records) == 3
    for record in records:
        # a silent memory agent: the action agent reaches the vault without the code and guesses wrong
        assert record.env is None and record.outcome == 0.0
        assert len(record.observations) == CORRIDOR + 2 and "keypad" in record.observations[-2]
        assert [s.step for s in record.steps] == list(range(CORRIDOR + 2))
        assert LabelledRollout.model_validate_json(record.model_dump_json()) == record
    # exactly one pivot per episode: the memory step at the vault, where restating the vault code's bank entry (and
    # nothing else: silence, the posters' codes) opens it
    found = [p for p in pivots if p.is_pivot]
    assert sorted((p.record_id, p.step) for p in found) == sorted((r.record_id, CORRIDOR + 1) for r in records)
    for pivot in found:
        assert tasks[pivot.task_id].family == "gym" and pivot.planted is None  # a user's env plants nothing
        assert pivot.best_reminder is not None and pivot.best_reminder.startswith("the vault code is ")
        by_source = {(a.source, a.reminder): a.outcome for a in pivot.alternatives}
        assert by_source[("recorded", None)] == 0.0 and by_source[("bank", pivot.best_reminder)] == 1.0
        assert sum(by_source.values()) == 1.0  # the locker codes of the posters lose like silence
    assert extra["stats"]["candidates"] == 3 * (CORRIDOR + 2) and extra["stats"]["pivots"] == 3

    # the re-entry underneath: restore() replays the record (checked step by step) on a fresh copy of the run's task,
    # and every counterfactual branch is a fork that re-enters the environment by replaying its logged actions
    record = records[0]
    step = next(s for s in record.steps if s.step == CORRIDOR + 1)
    base = restore(record, step.phase2_index, tasks[record.task_id])
    assert base.env.log[-1][1] == record.observations[-2]
    twin = sibling_fork(base)
    assert twin.env.reentries == {"snapshot": 0, "replay": 1} and twin.env.env is not base.env.env
    assert state_digest(twin) == state_digest(base) and twin.pending().request == base.pending().request
    with pytest.raises(ValueError, match=r"no spec .*\(tasks="):
        restore(record, step.phase2_index)  # a Gym task is rebuilt from the run's tasks, never guessed


def test_snapshot_re_entry_gives_the_labels_of_replay() -> None:
    replayed = labels("vault_game:VaultGame")[1]
    snapshot = labels("test_gym_env:SnapshotVault")
    forced = labels("test_gym_env:SnapshotVault", reentry="replay")[1]

    def plain(pivots: list[Any]) -> list[Any]:
        return [
            (p.pivot_id, p.is_pivot, p.spread, [(a.source, a.reminder, a.outcome) for a in p.alternatives])
            for p in pivots
        ]

    assert plain(snapshot[1]) == plain(replayed) == plain(forced)
    record = snapshot[0][0]
    task = next(t for t in snapshot[2]["tasks"] if t.task_id == record.task_id)
    twin = sibling_fork(restore(record, record.steps[2].phase2_index, task))
    assert twin.env.reentries == {"snapshot": 1, "replay": 0}


def test_a_non_deterministic_environment_is_named_with_both_observations() -> None:
    tasks = vault_tasks("test_gym_env:NoisyVault", count=1)
    (record,) = label_rollouts(tasks, vault_engines(), MEMORY, prefilter=EVERY_STEP, seed=0)
    with pytest.raises(ReplayMismatchError) as caught:
        restore(record, record.steps[2].phase2_index, tasks[0])
    message = str(caught.value)
    assert f"episode {record.record_id!r}" in message and "diverged at step 1" in message
    assert record.observations[0][:40] in message and "the replay gave" in message
    # detection refuses the episode the same way rather than labelling a state the record never had
    with pytest.raises(ReplayMismatchError, match="diverged at step 1"):
        detect_pivots(
            [record],
            vault_engines(),
            DetectConfig(prefilter=EVERY_STEP, policy_samples=0),
            tasks={tasks[0].task_id: tasks[0]},
        )


# protects: `memrl train pivot-grpo` on the Gym vault example: pivots found, the tiny model updated, a resume reloading
# the pool
@pytest.mark.slow
def test_pivot_grpo_trains_on_the_gym_example_and_resumes(tmp_path: Path, tiny_model_dir: Path) -> None:
    """``memrl train pivot-grpo`` on the vault game: the tiny model is the proactive agent's Phase 2 (its untagged
    text is silence), the scripted player the frozen action agent; the refresh finds the vault pivots, groups are
    sampled there, the trainer updates, and a resume reloads the pool."""
    from memrl.train.pivot_grpo import PivotGRPOConfig, run_pivot_grpo

    sampling = {"intervene": {"max_tokens": 12, "stop": ["q"]}}
    data = {
        "run": {"output_dir": str(tmp_path), "name": "vault", "seed": 0},
        "policy": {"base": str(tiny_model_dir)},
        "engine": {"backend": "hf", "model": str(tiny_model_dir), "dtype": "float32"},
        "reasoner": {"backend": "scripted", "scripted_policy": "components:VaultPlayer"},
        "phase1": {"backend": "scripted", "scripted_policy": "test_pivot_gym:VaultNotes"},
        "memory": {"window": 1, "action_window": 1, "trigger_every": 1, "sampling": sampling},
        "train_tasks": {"entry": "vault_game:VaultGame", "params": {"corridor": CORRIDOR}, "max_steps": 8, "count": 4},
        "eval_tasks": {"count": 2},
        "pivots": {
            "every": 2,
            "tasks": 2,
            "detect": {"prefilter": EVERY_STEP.model_dump(), "policy_samples": 1, "alternatives": 4},
        },
        "groups": {"group_size": 4, "pivots_per_iteration": 2},
        # the tiny model never wins, so outcomes tie: the paper's formula lets the format penalty rank the samples
        "reward": {"strict_format": False, "advantage": "grpo_std"},
        "trainer": {"lr": 1e-3, "lora": {"enabled": False}},
        "loop": {"iterations": 2, "checkpoint_every": 1},
        "eval": {"greedy": False},
    }
    cfg = PivotGRPOConfig.model_validate(data)
    assert cfg.eval_tasks.entry == "vault_game:VaultGame" and cfg.eval_tasks.seed == 100_000  # train_tasks' family
    assert run_pivot_grpo(cfg) == 0
    run = tmp_path / "vault"
    summary = json.loads((run / "summary.json").read_text())
    first = summary["history"][0]
    assert first["refresh_pivots"] == 2 and first["pivot_pool"] == 2  # the vault step of each labelled episode
    assert first["pivot_groups"] == 2 and first["planted_group_fraction"] == 0.0  # a Gym env plants nothing
    assert any(h["rows"] > 0 for h in summary["history"])  # the trainer updated the policy
    assert "pass_rate" in summary["before"] and "no_memory_pass_rate" in summary["before"]
    pivots = [json.loads(line) for line in (run / "pivots" / "r0000" / "pivots.jsonl").read_text().splitlines()]
    assert {p["step"] for p in pivots if p["is_pivot"]} == {CORRIDOR + 1}

    shutil.rmtree(run / "checkpoints" / "ckpt-000001")  # as after a kill during iteration 1
    resumed = cfg.model_copy(update={"run": cfg.run.model_copy(update={"resume": True})})
    assert run_pivot_grpo(resumed) == 0
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [-1, 0, 1] and json.loads((run / "summary.json").read_text())["iterations_run"] == 1


def test_an_episode_function_family_is_refused_by_key(tiny_model_dir: Path) -> None:
    """Pivot-turn GRPO drives the proactive memory agent in memrl's own agent loop: an episode function (its own loop
    and memory) is refused naming the key, before any run folder exists."""
    from memrl.data.config import ConfigError, load_config
    from memrl.train.pivot_grpo import PivotGRPOConfig

    sys.path.insert(0, str(ROOT / "examples" / "episode_fn"))
    base = {"policy": {"base": str(tiny_model_dir)}, "engine": {"backend": "hf", "model": str(tiny_model_dir)}}
    with pytest.raises(ConfigError, match=r"train_tasks.*'episode:run' is an episode family"):
        load_config(PivotGRPOConfig, None, defaults={**base, "train_tasks": {"entry": "episode:run"}})
