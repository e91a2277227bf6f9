"""The seams of bringing your own agent: every command loads a config the same way (its folder and the working
directory on the import path), a family without a default memory system asks for one, SAM's protocol through
``memrl.api``, outcome semantics (won / outcome / truncated), re-entry counts in the metrics."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEMRL = [sys.executable, "-m", "memrl.launch.cli"]

GAME = """
class Game:
    task = "say hi"
    def reset(self, seed):
        return "hello"
    def step(self, action):
        return "bye", 1.0, True, {"won": True}
"""


def memrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([*MEMRL, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def vault_eval_config(out: Path, *, corridor: int, count: int, baselines: tuple[str, ...] = ()) -> Path:
    """``out/eval.yaml``: an evaluation, from examples/gym_env, of its notes memory system (and the built-in
    ``baselines``) on ``count`` vault games of ``corridor`` rooms, with its scripted expert as the memory model."""
    systems = "".join(f"\n  - memory: {{name: {name}}}" for name in baselines)
    config = out / "eval.yaml"
    config.write_text(f"""command: eval
run: {{output_dir: {out}, name: eval}}
datasets:
  - name: vault
    kind: tasks
    tasks: {{entry: "vault_game:VaultGame", params: {{corridor: {corridor}}}, max_steps: 12, count: {count}, seed: 500}}
    reasoner: {{backend: scripted, name: reasoner, scripted_policy: "components:VaultPlayer"}}
systems:
  - memory: {{entry: "components:NotesMemory", every: 1, window: 1}}{systems}
models:
  - name: expert
    engine: {{backend: scripted, name: expert, scripted_policy: "components:NoteExpert"}}
""")
    return config


def test_config_show_imports_components_beside_the_config(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "hello_game.py").write_text(GAME)
    (folder / "config.yaml").write_text(
        "command: train oat-grpo\npolicy: {base: x}\nmemory: {name: long_context}\n"
        "train_tasks: {entry: 'hello_game:Game'}\ncredit: {terms: [{name: length, weight: 0.1}]}\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shown = memrl("config", "show", "--config", str(folder / "config.yaml"), cwd=elsewhere)
    assert shown.returncode == 0, shown.stderr
    assert "entry: hello_game:Game" in shown.stdout


def test_a_gym_family_without_memory_must_name_one(tmp_path: Path) -> None:
    (tmp_path / "hello_game.py").write_text(GAME)
    config = tmp_path / "config.yaml"
    config.write_text(
        "command: train oat-grpo\npolicy: {base: x}\ntrain_tasks: {entry: 'hello_game:Game'}\n"
        "credit: {terms: [{name: length, weight: 0.1}]}\n"
    )
    shown = memrl("config", "show", "--config", str(config), cwd=tmp_path)
    assert shown.returncode == 2
    assert "key 'memory': task family 'hello_game:Game' has no default memory system" in shown.stderr
    assert "sam, " in shown.stderr and "long_context" in shown.stderr  # the choices
    (tmp_path / "distill.yaml").write_text(
        "command: data distill\ntasks: {entry: 'hello_game:Game'}\n"
        "reasoner: {backend: scripted, name: r, scripted_policy: sam}\n"
        "expert: {backend: scripted, name: e, scripted_policy: sam}\n"
    )
    distill = memrl(
        "data", "distill", "--config", str(tmp_path / "distill.yaml"), f"run.output_dir={tmp_path}", cwd=tmp_path
    )
    assert distill.returncode == 2 and "memory: task family 'hello_game:Game' has no default" in distill.stderr
    assert not (tmp_path / "distill").exists()


def courier_folder(root: Path) -> Path:
    """The courier game of docs/own_agent.md (its ``write`` blocks) saved under ``root``; ``root`` on sys.path."""
    from tests.tutorial_blocks import parse_page

    for block in parse_page(ROOT / "docs" / "own_agent.md"):
        if block.get("write") and block.get("write")[-1].startswith("courier/"):
            path = root / block.get("write")[-1]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.script())
    sys.path.insert(0, str(root / "courier"))
    return root / "courier"


class _SilentExpert:
    """An expert memory model that writes cues but never recalls anything (empty output)."""

    def __init__(self, expert: object) -> None:
        self.expert = expert

    def respond(self, messages: list, rng: object, metadata: dict) -> str:
        return "" if metadata["role"] == "recall" else self.expert.respond(messages, rng, metadata)


def test_a_reasoner_and_expert_on_memrl_api_play_sam(tmp_path: Path) -> None:
    courier_folder(tmp_path)
    try:
        from agents import CourierExpert, CourierPlayer

        from memrl.api import SamRecalled, SamRecallFailed, read_sam_context
        from memrl.data.tasks import TaskSetConfig, load_tasks
        from memrl.rollout.agents import task_rollout
        from memrl.rollout.engines.scripted import ScriptedEngine
        from memrl.rollout.loop import EngineSet, run_rollouts

        memory = {"name": "sam", "page_turns": 1, "live_capacity_turns": 3, "keep_recent_turns": 2}
        tasks = load_tasks(TaskSetConfig(entry="courier:CourierGame", params={"corridor": 4}, max_steps=12, count=4))
        seen: list = []

        class Watching(CourierPlayer):
            def respond(self, messages, rng, metadata):
                seen.append(read_sam_context(messages))
                return super().respond(messages, rng, metadata)

        for expert, won in ((CourierExpert(), 1.0), (_SilentExpert(CourierExpert()), 0.0)):
            seen.clear()
            engines = EngineSet(reasoner=ScriptedEngine(Watching()), memory=ScriptedEngine(expert))
            traces = run_rollouts([task_rollout(t, memory, rollout_id="r") for t in tasks], engines)
            assert [t.outcome for t in traces] == [won] * 4
            results = [c.last_result for c in seen if c.last_result is not None]
            assert results and all(isinstance(r, SamRecalled if won else SamRecallFailed) for r in results)
            assert any("the parcel's room" in c.cues.values() for c in seen)  # the expert's cue in the bank
            if not won:  # a failed recall is a result: two of them and the player gives up (no endless asking)
                assert max(len(c.memory_calls) for c in seen) == 2
                assert "the memory model gave no usable recall" in results[0].error
    finally:
        sys.path.remove(str(tmp_path / "courier"))
        for name in ("agents", "courier"):
            sys.modules.pop(name, None)


class Trickle:
    """A quarter point per step; never done (the step limit ends it) unless ``done_at`` steps."""

    task = "walk"

    def __init__(self, done_at: int = 0, won: bool | None = None) -> None:
        self.done_at, self.won = done_at, won

    def reset(self, seed: int) -> str:
        self.n = 0
        return "start"

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        self.n += 1
        done = self.n == self.done_at
        info = {"won": self.won} if done and self.won is not None else {}
        return f"step {self.n}", 0.25, done, info


def play(task: object, steps: int) -> float:
    task.reset()
    for _ in range(steps):
        _, over = task.step("go")
        if over:
            break
    return task.finish(None)


def test_won_outcome_and_truncated_are_kept_apart() -> None:
    from types import SimpleNamespace

    from memrl.data.envs.gym import GymFactory, GymTask
    from memrl.data.tasks import TaskSetConfig, load_tasks
    from memrl.train.oat_grpo import leaf_outcome_metrics

    cut = GymTask(GymFactory(Trickle), seed=0, task_id="t", max_steps=3)
    assert play(cut, 3) == 0.0  # cut by the step limit: no partial credit unless asked for
    assert cut.truncated and cut.partial_outcome == 0.75
    assert cut.stats["env_truncated"] == 1 and cut.stats["env_won"] == 0
    credited = GymTask(GymFactory(Trickle), seed=0, task_id="t", max_steps=3, partial_credit=True)
    assert play(credited, 3) == 0.75 and credited.truncated and credited.stats["env_won"] == 0
    ended = GymTask(GymFactory(Trickle, {"done_at": 4}), seed=0, task_id="t")
    assert play(ended, 4) == 1.0 and not ended.truncated and ended.stats["env_won"] == 1  # ended with outcome 1
    lost = GymTask(GymFactory(Trickle, {"done_at": 4, "won": False}), seed=0, task_id="t")
    assert play(lost, 4) == 1.0 and lost.stats["env_won"] == 0  # the environment's word on winning wins
    (task,) = load_tasks(TaskSetConfig(entry=f"{__name__}:Trickle", partial_credit=True, max_steps=2, count=1))
    assert play(task, 2) == 0.5
    leaves = [
        SimpleNamespace(outcome=0.75, metadata={"stats": {"env_won": 0, "env_truncated": 1}}),
        SimpleNamespace(outcome=1.0, metadata={"stats": {"env_won": 1, "env_truncated": 0}}),
    ]
    assert leaf_outcome_metrics(leaves) == {"success": 0.5, "mean_outcome": 0.875, "episodes_truncated": 1}


def test_reentries_are_counted_per_iteration_and_shown() -> None:
    sys.path.insert(0, str(ROOT / "examples" / "gym_env"))
    try:
        from memrl.data.tasks import TaskSetConfig, load_tasks
        from memrl.data.tracking import format_metrics
        from memrl.rollout.agents import task_rollout
        from memrl.rollout.fleet import FleetResult
        from memrl.rollout.tree import TreeConfig, build_trees
        from memrl.train.oat_grpo import collection_metrics
        from tests.test_gym_env import engines

        memory = {"entry": "components:NotesMemory", "every": 1, "window": 1}
        cfg = TreeConfig(branch_roles=["note"], branch_factor=2, max_leaves=4, max_branch_depth=2)
        for entry, mode in (("vault_game:VaultGame", "replay"), ("tests.test_gym_env:SnapshotVault", "snapshot")):
            tasks = load_tasks(TaskSetConfig(entry=entry, params={"corridor": 3}, count=2), "t")
            trees, _ = build_trees(
                tasks, lambda task, rid: task_rollout(task, memory, seed=1, rollout_id=rid), engines(), cfg
            )
            forks = sum(sum(n.kind == "leaf" for n in t.nodes) - 1 for t in trees)  # every leaf but one: a fork
            metrics = collection_metrics(tasks, [FleetResult(trees, {}, {}, {}, 0)])
            assert metrics[f"reentry_{mode}"] == forks > 0
            if mode == "replay":
                assert metrics["replay_verified"] == forks and metrics["replayed_steps"] > 0
                assert f"reentry_replay={forks}" in format_metrics(0, metrics)
            else:
                assert "replayed_steps" not in metrics and "reentry_replay" not in metrics
    finally:
        sys.path.remove(str(ROOT / "examples" / "gym_env"))


def test_the_report_of_a_task_dataset_counts_only_episodes_that_failed_for_a_reason(tmp_path: Path) -> None:
    config = vault_eval_config(tmp_path, corridor=2, count=3)
    done = memrl("eval", "--config", str(config), cwd=ROOT / "examples" / "gym_env")
    assert done.returncode == 0, done.stderr[-3000:]
    report = (tmp_path / "eval" / "report.md").read_text()
    assert "rests on failures" not in report and "no answer" not in report  # every episode won: nothing to flag
    assert "| notes | expert | 3 | 1.000 [1.00, 1.00] | - | 1.000 [1.00, 1.00] | 1.000 [1.00, 1.00] | 0.000 |" in report
    assert "steps/episode" in report and "failed for a reason" in report

    from memrl.launch.evaluation.summary import task_health

    rows = [
        {"system": "s", "model": "m", "won": False, "stats": {"env_errors": 1}},  # the environment raised
        {"system": "s", "model": "m", "won": False, "stats": {"sam_recall_errors": 2}},  # unusable memory output
        {"system": "s", "model": "m", "won": False, "stats": {"sam_tool_errors": 1}},  # the reasoner's bad call
        {"system": "s", "model": "m", "won": True, "stats": {"sam_consolidate_errors": 1}},  # won all the same
    ]
    (health,) = task_health(rows)
    assert (health["env_failures"], health["memory_errors"], health["failed"]) == (1, 2, 2)
    assert health["rests_on_failures"]
