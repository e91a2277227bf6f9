"""The online RL loop shared by OAT-GRPO and pivot-turn GRPO.

Each iteration: collect groups with the current policy in the rollout engine (the caller's ``collect``), put the
engine to sleep (vLLM sleep mode when ``placement.policy`` colocates it on GPUs; nothing otherwise), update the
policy with the group trainer, sync the new weights into the engine, which wakes it (LoRA adapter hot-swap, or an
in-place reload of full weights), evaluate every ``eval_every`` iterations, checkpoint every ``checkpoint_every``
iterations.

Rollouts run on the main process (it owns the policy's rollout engine; the frozen reasoner and committee are engines
or endpoints of their own); the groups are broadcast to every training process as JSON, and the trainer shards them.
So N processes make the same update as one. Every sample records the policy version that produced it.

Resume: ``--resume`` restores the newest complete checkpoint (policy, optimizer, scheduler, RNG states, iteration) and
continues with the next iteration. Batches are a pure function of (seed, iteration), so the data order after a resume
is the order of an uninterrupted run, and metrics of iterations redone after the checkpoint are logged once (the
records after the restored iteration are dropped first; with no complete checkpoint, all of them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field
from tqdm.auto import tqdm

from data.config import ConfigError, ConfigModel, RunConfig, prepare_run_dir
from data.schemas import Group
from data.tracking import MetricsLogger
from train.checkpoint import CheckpointManager
from train.group_trainer import GroupTrainer

__all__ = ["LoopConfig", "LoopResult", "broadcast_groups", "run_online_loop", "shared_run_dir", "sync_policy"]


class LoopConfig(ConfigModel):
    """Iteration schedule of an online loop."""

    iterations: int = Field(20, ge=1)  # rollout + update iterations
    eval_every: int = Field(0, ge=0)  # 0: only before the first and after the last iteration
    checkpoint_every: int = Field(5, ge=0)  # checkpoint every this many iterations (and after the last; 0: last only)
    keep_checkpoints: int = Field(2, ge=1)  # most recent checkpoints kept on disk


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


def sync_policy(trainer: GroupTrainer, engine: Any, root: str | Path) -> str:
    """Save the trainer's policy as version ``trainer.version`` under ``root`` and load it into the rollout engine."""
    out = str(Path(root) / f"v{trainer.version:05d}")
    trainer.save_policy(out)
    if engine is not None and trainer.accelerator.is_main_process:
        if trainer.is_peft:
            engine.load_adapter(out, trainer.version)
        else:
            engine.update_weights(out, trainer.version)
    return out


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
    collect: Callable[[int], tuple[list[Group], dict[str, Any]]],
    evaluate: Callable[[int], dict[str, Any]] | None,
    logger: MetricsLogger,
    desc: str = "rl",
    attach: dict[str, Path] | None = None,
) -> LoopResult:
    """Run the loop (see the module docstring). ``collect(iteration)`` is called on the main process only;
    ``attach`` names directories (the reward cache) that every checkpoint snapshots and a resume restores."""
    acc = trainer.accelerator
    ckpt = CheckpointManager(run_dir / "checkpoints", keep=cfg.keep_checkpoints)
    policy_root = run_dir / "policy"
    start = 0
    history: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    if resume and (latest := ckpt.latest()) is not None:
        state = ckpt.load(latest, acc, attach)
        start = state["iteration"] + 1
        trainer.version, trainer.updates = state["policy_version"], state["updates"]
        history, evals = state.get("history", []), state.get("evals", [])
        trainer.set_rng_state(state["trainer_rng"])
        if acc.is_main_process:
            logger.truncate_after(state["iteration"])
            print(f"[{desc}] resumed from {latest.name}: continuing at iteration {start}", flush=True)
    elif acc.is_main_process:
        # A start from scratch (also a --resume that finds no complete checkpoint, e.g. after a kill during the first
        # checkpoint write) logs every step again, the eval before training (step -1) included: drop what is there.
        logger.truncate_after(-2)
    policy_dir = sync_policy(trainer, engine, policy_root)
    if start == 0 and evaluate is not None and acc.is_main_process:
        evals.append({"iteration": -1, **evaluate(-1)})
        logger.log(-1, {f"eval/{k}": v for k, v in evals[-1].items() if k != "iteration"})
    bar = tqdm(range(start, cfg.iterations), desc=desc, disable=not acc.is_main_process, initial=start,
               total=cfg.iterations)
    for iteration in bar:
        t0 = time.perf_counter()
        groups, metrics = collect(iteration) if acc.is_main_process else (None, {})
        rollout_s = time.perf_counter() - t0
        groups = broadcast_groups(groups, acc)
        if engine is not None:  # colocated on GPU: free the engine's memory for the update; the sync wakes it
            engine.sleep()
        update = trainer.step(groups)
        policy_dir = sync_policy(trainer, engine, policy_root)
        record = {**metrics, **update, "rollout_s": rollout_s, "iteration_s": time.perf_counter() - t0,
                  "updates": trainer.updates}
        last = iteration == cfg.iterations - 1
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
            }, attach)
    return LoopResult(cfg.iterations - start, trainer.updates, trainer.version, policy_dir, history, evals)

