"""The online RL loop shared by OAT-GRPO and pivot-turn GRPO.

Each iteration: collect groups with the current policy in the rollout engine (the caller's ``collect``), put the
engine to sleep (vLLM sleep mode when ``placement.policy`` colocates it on GPUs; nothing otherwise), update the
policy with the group trainer, sync the new weights into the engine, which wakes it (LoRA adapter hot-swap, or an
in-place reload of full weights), evaluate every ``eval_every`` iterations, checkpoint every ``checkpoint_every``
iterations.

Rollouts are driven by the main process: its own policy engine, or a fleet of rollout workers on every node
(:mod:`memrl.rollout.fleet`; ``collect`` then returns a collection in flight, anything with ``.result()``); the groups
are broadcast to every training process as JSON, and the trainer shards them. So N processes make the same update as
one. Every sample records the policy version that produced it.

Bounded staleness (``max_staleness: k``): the collection of iteration ``i + k`` is launched under the policy of
iteration ``i``, before its update, so with a fleet it runs while the trainer updates (k = 1: one-step-off). Every
tree is built under one policy version (a worker runs a weight sync only between jobs); truncated importance sampling
is switched on; the staleness of each update is logged. k = 0 is the synchronous loop. The weights reach the engines
through ``policy/vNNNNN`` (LoRA adapters; full weights on CPU), or in memory by NCCL broadcast on GPUs
(train/weight_sync.py); only the newest ``keep_policy_versions`` version directories are kept.

Resume: ``--resume`` restores the newest complete checkpoint (policy, optimizer, scheduler, RNG states, iteration) and
continues with the next iteration. Batches are a pure function of (seed, iteration), so the data order after a resume
is the order of an uninterrupted run, and metrics of iterations redone after the checkpoint are logged once (the
records after the restored iteration are dropped first; with no complete checkpoint, all of them). With k >= 1 the
checkpoint also names the collections that were in flight and their policy versions: the resume relaunches them under
those versions (their directories are kept), so the versions match an uninterrupted run too.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from tqdm.auto import tqdm

from memrl.data.config import ConfigError, ConfigModel, RunConfig
from memrl.data.run_dir import prepare_run_dir
from memrl.data.schemas import Group
from memrl.data.tracking import MetricsLogger
from memrl.train.checkpoint import CheckpointManager
from memrl.train.group_trainer import GroupTrainer

__all__ = ["LoopConfig", "LoopResult", "broadcast_groups", "prune_policy_versions", "run_online_loop", "shared_run_dir",
           "sync_policy"]


class LoopConfig(ConfigModel):
    """Iteration schedule of an online loop."""

    iterations: int = Field(20, ge=1, le=10**6)  # rollout + update iterations
    eval_every: int = Field(0, ge=0)  # 0: only before the first and after the last iteration
    checkpoint_every: int = Field(5, ge=0)  # checkpoint every this many iterations (and after the last; 0: last only)
    keep_checkpoints: int = Field(2, ge=1)  # most recent checkpoints kept on disk
    max_staleness: int = Field(0, ge=0)  # k: collect iteration i + k under the policy of iteration i; 0: synchronous
    keep_policy_versions: int = Field(2, ge=1)  # newest policy/vNNNNN directories kept (checkpoints are separate)
    weight_sync: Literal["auto", "disk", "nccl"] = "auto"  # full weights: auto = nccl on GPUs with a fleet, else disk

    @model_validator(mode="after")
    def _versions_for_staleness(self) -> LoopConfig:
        if self.keep_policy_versions < self.max_staleness + 1:
            raise ValueError(f"keep_policy_versions ({self.keep_policy_versions}) must be at least max_staleness + 1 "
                             f"({self.max_staleness + 1}): a resume relaunches collections under older versions")
        return self


STALE_TIS_CAP = 2.0  # truncated importance sampling cap forced on with max_staleness > 0 (verl's default cap)


@dataclass
class LoopResult:
    """What a finished loop reports."""

    iterations_run: int
    updates: int
    policy_version: int
    policy_dir: str
    history: list[dict[str, Any]]
    evals: list[dict[str, Any]]


def shared_run_dir(cfg: ConfigModel, run: RunConfig, command: str, state: Any) -> Path:
    """The run directory, prepared (and its resolved config written) by the main process only and agreed on by every
    process of a distributed run: otherwise the other ranks would find the main rank's fresh config and refuse to
    start ("already holds a run"). ``state`` is an accelerate ``Accelerator`` or ``PartialState``."""
    payload: list[str | None] = [None, None]  # [run directory, config error]
    if state.is_main_process:
        try:
            payload[0] = str(prepare_run_dir(cfg, run, command))
        except ConfigError as exc:
            payload[1] = str(exc)
    if state.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(payload, from_process=0)
    if payload[1] is not None:
        raise ConfigError(payload[1])
    return Path(str(payload[0]))


def sync_policy(trainer: GroupTrainer, engine: Any, root: str | Path, in_memory: Any = None, *,
                save: bool = True) -> str:
    """Give the rollout engine (or fleet) the trainer's policy as version ``trainer.version``: full weights in
    memory when ``in_memory`` (a :class:`memrl.train.weight_sync.InMemoryWeightSync`) is given, else through the
    version's directory under ``root`` (adapter or full weights). ``save`` also writes the directory on the in-memory
    path."""
    out = str(Path(root) / f"v{trainer.version:05d}")
    if in_memory is not None:
        if save:
            trainer.save_policy(out)
        in_memory.send(out if save else None)
        return out
    trainer.save_policy(out)
    if engine is not None and trainer.accelerator.is_main_process:
        load_policy_version(engine, out, trainer.version, trainer.is_peft)
    return out


def load_policy_version(engine: Any, directory: str, version: int, adapter: bool) -> None:
    """Load a saved policy version into the rollout engine (or every worker of a fleet)."""
    if adapter:
        engine.load_adapter(directory, version)
    else:
        engine.update_weights(directory, version)


def prune_policy_versions(root: Path, keep: int, protect: set[int]) -> None:
    """Delete all but the newest ``keep`` version directories under ``root``, never one in ``protect``."""
    versions = sorted(int(p.name[1:]) for p in root.glob("v[0-9]*") if p.is_dir() and p.name[1:].isdigit())
    for version in versions[:-keep]:
        if version not in protect:
            shutil.rmtree(root / f"v{version:05d}", ignore_errors=True)


def _result(collection: Any) -> tuple[list[Group], dict[str, Any]]:
    """A collection's groups and metrics: ``collect`` returns them, or a collection in flight to wait for."""
    return collection.result() if callable(getattr(collection, "result", None)) else collection


def broadcast_groups(groups: list[Group] | None, accelerator: Any) -> list[Group]:
    """Send the main process's groups to every process (as JSON: nothing is unpickled)."""
    if accelerator.num_processes == 1:
        return list(groups or [])
    from accelerate.utils import broadcast_object_list

    payload = [json.dumps([g.model_dump(mode="json") for g in groups]) if accelerator.is_main_process else ""]
    broadcast_object_list(payload, from_process=0)
    return [Group.model_validate(g) for g in json.loads(payload[0])]


def run_online_loop(
    *,
    trainer: GroupTrainer,
    engine: Any,
    cfg: LoopConfig,
    run_dir: Path,
    resume: bool,
    collect: Callable[[int], Any],
    evaluate: Callable[[int], dict[str, Any]] | None,
    logger: MetricsLogger,
    desc: str = "rl",
    attach: dict[str, Path] | None = None,
    in_memory: Any = None,
) -> LoopResult:
    """Run the loop (see the module docstring). ``collect(iteration)`` is called on the main process only and
    returns (groups, metrics) or a collection in flight with ``.result()``; ``engine`` is the policy's rollout
    engine or fleet; ``in_memory`` the GPU weight sync of full weights; ``attach`` names directories (the reward
    cache) that every checkpoint snapshots and a resume restores."""
    acc = trainer.accelerator
    ckpt = CheckpointManager(run_dir / "checkpoints", keep=cfg.keep_checkpoints)
    policy_root = run_dir / "policy"
    if cfg.max_staleness and trainer.cfg.tis_cap is None:  # samples up to k versions old: weight by pi_old / pi_rollout
        trainer.cfg = trainer.cfg.model_copy(update={"tis_cap": STALE_TIS_CAP})
        if acc.is_main_process:
            print(f"[{desc}] max_staleness={cfg.max_staleness}: truncated importance sampling on "
                  f"(trainer.tis_cap={STALE_TIS_CAP})", flush=True)
    start = 0
    history: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    in_flight: dict[int, Any] = {}  # iteration -> its collection, launched before its turn when k >= 1
    launched: dict[int, int] = {}  # iteration -> the policy version its collection was launched under
    if resume and (latest := ckpt.latest()) is not None:
        state = ckpt.load(latest, acc, attach)
        start = state["iteration"] + 1
        trainer.version, trainer.updates = state["policy_version"], state["updates"]
        history, evals = state.get("history", []), state.get("evals", [])
        trainer.set_rng_state(state["trainer_rng"])
        if acc.is_main_process:
            logger.truncate_after(state["iteration"])
            print(f"[{desc}] resumed from {latest.name}: continuing at iteration {start}", flush=True)
        # relaunch the collections that were in flight, each under the version it had in the uninterrupted run
        for iteration, version in sorted((int(i), v) for i, v in state.get("launched", {}).items()):
            if acc.is_main_process:
                load_policy_version(engine, str(policy_root / f"v{version:05d}"), version, trainer.is_peft)
                in_flight[iteration] = collect(iteration)
            launched[iteration] = version
    elif acc.is_main_process:
        # A start from scratch (also a --resume that finds no complete checkpoint, e.g. after a kill during the first
        # checkpoint write) logs every step again, the eval before training (step -1) included: drop what is there.
        logger.truncate_after(-2)
    policy_dir = sync_policy(trainer, engine, policy_root, in_memory, save=cfg.max_staleness > 0)
    if start == 0 and evaluate is not None and acc.is_main_process:
        evals.append({"iteration": -1, **evaluate(-1)})
        logger.log(-1, {f"eval/{k}": v for k, v in evals[-1].items() if k != "iteration"})
    bar = tqdm(range(start, cfg.iterations), desc=desc, disable=not acc.is_main_process, initial=start,
               total=cfg.iterations)
    for iteration in bar:
        t0 = time.perf_counter()
        # launch this iteration's collection and, with k >= 1, the next k under the current policy (the fleet builds
        # them while the trainer updates)
        for ahead in range(iteration, min(iteration + cfg.max_staleness, cfg.iterations - 1) + 1):
            if ahead not in launched:
                if acc.is_main_process:
                    in_flight[ahead] = collect(ahead)
                launched[ahead] = trainer.version
        groups, metrics = _result(in_flight.pop(iteration)) if acc.is_main_process else (None, {})
        rollout_s = time.perf_counter() - t0
        groups = broadcast_groups(groups, acc)
        versions = [s.policy_version for g in groups for s in g.samples]
        staleness = {"policy_version_collected": launched.pop(iteration),
                     "staleness_max": trainer.version - min(versions, default=trainer.version),
                     "staleness_mean": trainer.version - sum(versions) / len(versions) if versions else 0.0,
                     "mixed_version_groups": sum(len({s.policy_version for s in g.samples}) > 1 for g in groups)}
        if engine is not None and not cfg.max_staleness:  # colocated on GPU: free the engine's memory for the update
            engine.sleep()  # (the sync wakes it); with k >= 1 the engines keep generating during the update
        update = trainer.step(groups)
        last = iteration == cfg.iterations - 1
        t_sync = time.perf_counter()
        policy_dir = sync_policy(trainer, engine, policy_root, in_memory, save=cfg.max_staleness > 0 or last)
        sync_s = time.perf_counter() - t_sync
        if acc.is_main_process:  # the versions still in flight are relaunched by a resume: keep their directories
            prune_policy_versions(policy_root, cfg.keep_policy_versions, set(launched.values()) | {trainer.version})
        record = {**metrics, **update, **staleness, "rollout_s": rollout_s, "sync_s": sync_s,
                  "iteration_s": time.perf_counter() - t0, "updates": trainer.updates}
        if evaluate is not None and acc.is_main_process and (last or (cfg.eval_every and
                                                                     (iteration + 1) % cfg.eval_every == 0)):
            evals.append({"iteration": iteration, **evaluate(iteration)})
            record.update({f"eval/{k}": v for k, v in evals[-1].items() if k != "iteration"})
        history.append({"iteration": iteration, **{k: v for k, v in record.items() if isinstance(v, (int, float))}})
        if acc.is_main_process:
            logger.log(iteration, record)
            bar.set_postfix(reward=f"{record.get('reward_mean', float('nan')):.3f}")
        if last or (cfg.checkpoint_every and (iteration + 1) % cfg.checkpoint_every == 0):
            ckpt.save(iteration, acc, trainer.model, {
                "iteration": iteration, "policy_version": trainer.version, "updates": trainer.updates,
                "trainer_rng": trainer.rng_state(), "history": history, "evals": evals,
                "launched": {str(i): v for i, v in launched.items()},
            }, attach)
    return LoopResult(cfg.iterations - start, trainer.updates, trainer.version, policy_dir, history, evals)
