"""``memrl train oat-grpo`` end to end on the tiny config: outputs and placement endpoints.

The runs are subprocesses of the real CLI on the tiny model (transformers rollout engine, scripted reasoner, the
oracle committee with the offline judge): 2 SAM tasks per iteration, a 6-step tour, K = 2, 3 iterations. SIGKILL
and ``--resume`` are in tests/test_resume_faults.py and tests/test_bench_resume_faults.py, the 2-process DeepSpeed
run in tests/test_distributed.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.resume_faults import env as cli_env
from benchmarks.resume_faults import overrides as recipe_overrides
from benchmarks.resume_faults import same_weights, steps, weights
from memrl.data.config import ConfigError, load_config
from memrl.data.io import read_jsonl
from memrl.data.schemas import MemoryCallTree
from memrl.train.oat_grpo import OATGRPOConfig, resolve_engines

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "oat_grpo_tiny.yaml"
PAPER = ROOT / "configs" / "oat_grpo_sam_qwen3.5-9b.yaml"
ITERATIONS = 3


def tiny_overrides(model: Path, out: Path, name: str) -> list[str]:
    """The tiny config shrunk to seconds per iteration (benchmarks/resume_faults.py's recipe), without evaluations."""
    return recipe_overrides(model, out, name, iterations=ITERATIONS, eval_every=0)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "memrl.launch.cli", "train", "oat-grpo", "--config", str(TINY), *args]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cli(*args), cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def iterations_of(run_dir: Path) -> dict[int, dict]:
    """The metrics record of every training iteration (evaluation before training is step -1)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if r["step"] >= 0]
    assert len(steps) == len(set(steps)), f"an iteration was logged twice: {steps}"
    return {r["step"]: r for r in records if r["step"] >= 0}


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("oat")
    run_cli(*tiny_overrides(tiny_model_dir, out, "full"))
    return out / "full"


# ----------------------------------------------------------------------------------------------------------------
# configs


@pytest.mark.parametrize("path", [TINY, PAPER], ids=["tiny", "qwen3.5-9b"])
def test_shipped_configs_load(path: Path) -> None:
    cfg = load_config(OATGRPOConfig, path)
    assert cfg.command == "train oat-grpo" and cfg.credit.weight_of("committee") > 0
    assert cfg.tree.mode == "tree" and cfg.tree.branch_roles == ["recall"]


def test_paper_config_puts_reasoner_committee_and_judge_behind_endpoints() -> None:
    cfg = load_config(OATGRPOConfig, PAPER)
    reasoner, references, judge = resolve_engines(cfg)
    assert reasoner.backend == "openai" and reasoner.model == "Qwen/Qwen3.5-35B-A3B"
    assert reasoner.request_timeout_s == 300  # the recipe's client settings apply to the placement endpoints
    assert [r.model for r in references] == ["gpt-5.4", "glm-4.7", "deepseek-v4-flash"]
    assert all(r.backend == "openai" and r.endpoints[0].api_key_env for r in references)
    assert len({r.name for r in references}) == 3  # distinct cache keys per committee member
    assert judge is not None and judge.model == "gpt-5.4"
    assert cfg.trainer.deepspeed == "zero3" and not cfg.trainer.lora.enabled


def test_a_sitting_stops_before_the_run_s_last_iteration() -> None:
    sittings = ["loop.iterations=3", "loop.stop_after_iterations=2"]
    assert load_config(OATGRPOConfig, TINY, sittings).loop.end == 2
    with pytest.raises(ConfigError, match=r"loop.*stop_after_iterations \(3\) must be below iterations \(3\)"):
        load_config(OATGRPOConfig, TINY, ["loop.iterations=3", "loop.stop_after_iterations=3"])


def test_slurm_placement_overrides_replace_the_engines() -> None:
    served = '{"model": "Qwen/Qwen3.5-35B-A3B", "endpoints": ["http://gpu01:8000/v1", "http://gpu01:8001/v1"]}'
    committee = '[{"model": "Qwen/Qwen3.5-122B-A10B", "endpoints": ["http://gpu02:8000/v1"]}]'
    cfg = load_config(OATGRPOConfig, PAPER, [f"placement.reasoner={served}", f"placement.committee={committee}"])
    reasoner, references, _ = resolve_engines(cfg)
    assert [e.url for e in reasoner.endpoints] == ["http://gpu01:8000/v1", "http://gpu01:8001/v1"]
    assert all(e.max_concurrency == 64 for e in reasoner.endpoints)
    assert [(r.model, [e.url for e in r.endpoints]) for r in references] == [
        ("Qwen/Qwen3.5-122B-A10B", ["http://gpu02:8000/v1"])
    ]
    # Without placement the tiny recipe runs offline: scripted reasoner, the oracle expert as the committee.
    reasoner, references, judge = resolve_engines(load_config(OATGRPOConfig, TINY))
    assert reasoner.backend == "scripted" and [r.name for r in references] == ["sam-oracle"] and judge is None


# ----------------------------------------------------------------------------------------------------------------
# (a) end to end


# protects: `memrl train oat-grpo` as a process on the tiny model: config, metrics, the two newest checkpoints, policy
# versions, summary and committee cache
@pytest.mark.slow
def test_cli_run_writes_config_metrics_checkpoints_policies_and_summary(uninterrupted: Path) -> None:
    run_dir = uninterrupted
    resolved = load_config(OATGRPOConfig, run_dir / "config.yaml")
    assert resolved.loop.iterations == ITERATIONS and resolved.tasks_per_iteration == 4
    its = iterations_of(run_dir)
    assert sorted(its) == list(range(ITERATIONS))
    versions_after = [its[i].get("policy_version") for i in range(ITERATIONS)]
    for record in its.values():
        assert len(record["tasks"]) == 4 and record["leaves"] >= 4 and record["reasoner_tokens"] > 0
        assert record["memory_calls_trained"] > 0 and record["committee_requests"] >= 1
        # An iteration whose groups all have zero variance is skipped: no update, no new policy version.
        assert ("loss" in record and record["rows"] > 0) or record.get("skipped") == 1.0
    trained = [i for i in range(ITERATIONS) if "loss" in its[i]]
    assert trained, "no iteration updated the policy"
    assert [v for v in versions_after if v is not None] == list(range(1, len(trained) + 1))
    assert "eval/success" in its[ITERATIONS - 1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations_run"] == ITERATIONS and summary["policy_version"] == len(trained)
    assert summary["updates"] == its[ITERATIONS - 1]["updates"] >= len(trained)
    assert summary["before"]["iteration"] == -1 and summary["after"]["iteration"] == ITERATIONS - 1
    assert summary["training_reasoner_tokens"] == sum(r["reasoner_tokens"] for r in its.values())
    # The newest loop.keep_policy_versions (2) policy directories; the last iteration's samples came from the
    # policy before its update.
    versions = sorted(p.name for p in (run_dir / "policy").iterdir())
    assert versions == [f"v{v:05d}" for v in range(len(trained) + 1)][-2:]
    assert all(r["sync_s"] > 0 and r["staleness_max"] == 0 for r in its.values())
    assert (run_dir / "policy" / versions[-1] / "model.safetensors").is_file()
    assert summary["policy_dir"].endswith(versions[-1])
    trees = read_jsonl(run_dir / "trees_last.jsonl", MemoryCallTree)
    calls = [n.call for t in trees for n in t.nodes if n.kind == "memory" and n.call is not None]
    assert calls and {c.policy_version for c in calls} == {len([i for i in trained if i < ITERATIONS - 1])}
    # Checkpoints: the newest two, complete.
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("ckpt-"))
    assert ckpts == [f"ckpt-{ITERATIONS - 2:06d}", f"ckpt-{ITERATIONS - 1:06d}"]
    assert all((run_dir / "checkpoints" / c / "COMPLETE").exists() for c in ckpts)
    assert any((run_dir / "committee_cache").rglob("*"))


# protects: a run in sittings (loop.stop_after_iterations): a checkpoint at the stop off the checkpoint_every grid, no
# summary, a resume past its stop refused, and the last sitting ending with the uninterrupted run's weights and steps
@pytest.mark.slow
def test_a_run_in_sittings_stops_after_its_iterations_and_resumes_to_the_same_weights(
    uninterrupted: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    sittings = [*tiny_overrides(tiny_model_dir, tmp_path, "sittings"), "loop.checkpoint_every=0"]  # the last only
    run_dir = tmp_path / "sittings"
    first = run_cli(*sittings, "loop.stop_after_iterations=1")
    assert f"stopped after 1 of {ITERATIONS} iterations" in first.stdout + first.stderr
    assert [p.name for p in (run_dir / "checkpoints").glob("ckpt-*")] == ["ckpt-000000"]
    assert not (run_dir / "summary.json").exists()
    again = subprocess.run(
        cli(*sittings, "loop.stop_after_iterations=1", "--resume"), cwd=ROOT, env=cli_env(), capture_output=True,
        text=True, timeout=900,
    )  # fmt: skip
    assert again.returncode == 2 and "resumed after iteration 0, past the stop" in again.stderr, again.stderr[-2000:]
    last = run_cli(*sittings, "--resume")
    assert "resumed from ckpt-000000" in last.stdout + last.stderr
    assert json.loads((run_dir / "summary.json").read_text())["iterations_run"] == ITERATIONS - 1
    assert steps(run_dir) == steps(uninterrupted)
    assert same_weights(weights(run_dir), weights(uninterrupted))
