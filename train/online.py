"""The online RL loop shared by OAT-GRPO and pivot-turn GRPO.

Each iteration: collect groups with the current policy in the rollout engine (the caller's ``collect``), put the
engine to sleep (vLLM sleep mode when ``placement.policy`` colocates it on GPUs; nothing otherwise), update the
policy with the group trainer, sync the new weights into the engine, which wakes it (LoRA adapter hot-swap, or an
in-place reload of full weights), evaluate every ``eval_every`` iterations, checkpoint every ``checkpoint_every``
iterations.

A recipe writes its iteration itself over :class:`OnlineLoop`, which keeps the bookkeeping (launching collections
ahead, staleness, syncing, evaluation, logging, checkpoints and resume): OAT-GRPO's ``train_oat_grpo`` reads collect
-> credit -> groups -> update -> sync -> log -> checkpoint. Engines are anything with the :class:`PolicyEngine`
methods.

Rollouts are driven by the main process: its own policy engine, or a fleet of rollout workers on every node
(:mod:`memrl.rollout.fleet`; ``collect`` then returns a collection in flight, anything with ``.result()``); the groups
are broadcast to every training process as JSON, and the trainer shards them. So N processes make the same update as
one. Every sample records the policy version that produced it.

Bounded staleness (``max_staleness: k``): the collection of iteration ``i + k`` is launched under the policy of
iteration ``i``, before its update, so with a fleet it runs while the trainer updates (k = 1: one-step-off). Every
tree is built under one policy version (a worker runs a weight sync only between jobs); truncated importance sampling
is on (the recipe configs resolve ``trainer.tis_cap`` with :func:`stale_sampling_tis`; the loop refuses a stale run
without it); the staleness of each update is logged. k = 0 is the synchronous loop. The weights reach the engines
through ``policy/vNNNNN`` (LoRA adapters; full weights on CPU), or in memory by NCCL broadcast on GPUs
(train/weight_sync.py), and after a sync every engine's log-probs on a fixed probe are checked against the
trainer's (``loop.sync_check``, :class:`memrl.train.weight_sync.SyncVerifier`: a mismatch stops the run); only the
newest ``keep_policy_versions`` version directories are kept, and those a resume
from the newest complete checkpoint would relaunch collections under (until a newer checkpoint is complete).

Resume: ``--resume`` restores the newest complete checkpoint (policy, optimizer, scheduler, RNG states, iteration) and
continues with the next iteration. Batches are a pure function of (seed, iteration), so the data order after a resume
is the order of an uninterrupted run, and metrics of iterations redone after the checkpoint are logged once (the
records after the restored iteration are dropped first; with no complete checkpoint, all of them). With k >= 1 the
checkpoint also names the collections that were in flight and their policy versions: the resume relaunches them under
those versions (their directories are kept), so the versions match an uninterrupted run too.

Sittings: ``loop.stop_after_iterations: n`` ends the run once n iterations are done, with a checkpoint of the last
and no summary; ``--resume`` goes on from it (with a later stop, or none). A run longer than one sitting (a Slurm
time limit, a machine lent for an hour) so ends where the uninterrupted run does.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import Field, model_validator

from memrl.data.config import ConfigError, ConfigModel, PolicyPlacement, RunConfig
from memrl.data.schemas import Group
from memrl.data.tracking import MetricsLogger, progress_bar
from memrl.train.checkpoint import CheckpointManager
from memrl.train.group_trainer import GroupTrainer, GroupTrainerConfig
from memrl.train.weight_sync import SyncCheckConfig, SyncVerifier

__all__ = [
    "LoopConfig",
    "LoopResult",
    "OnlineLoop",
    "PolicyEngine",
    "WeightSender",
    "broadcast_groups",
    "prune_policy_versions",
    "stale_sampling_tis",
    "sync_policy",
]


class PolicyEngine(Protocol):
    """What the loop needs of the policy's rollout engine, or of a fleet of them (memrl.rollout.fleet)."""

    def load_adapter(self, path: str, version: int) -> None:
        """Hot-swap to the LoRA adapter saved at ``path`` as policy version ``version``."""

    def update_weights(self, path: str, version: int) -> None:
        """Reload full weights from ``path`` as policy version ``version``."""

    def sleep(self) -> None:
        """Free accelerator memory until the next weight load (a no-op where nothing is held)."""

    def probe_logprobs(self, prompts: list[list[int]], max_tokens: int) -> list[Any]:
        """Greedy tokens and their log-probs for each prompt, one ``EngineProbe`` per engine (the sync check)."""


class WeightSender(Protocol):
    """The in-memory weight sync of full weights (memrl.train.weight_sync.InMemoryWeightSync)."""

    def send(self, saved_dir: str | None) -> None:
        """Broadcast the trainer's weights to the engines (``saved_dir``: where they were also written)."""


class Recipe(Protocol):
    """What the loop reads of an online recipe's config (OAT-GRPO, pivot GRPO)."""

    @property
    def loop(self) -> LoopConfig:
        """The recipe's ``loop`` section."""

    @property
    def run(self) -> RunConfig:
        """The recipe's ``run`` section (``run.resume``)."""


log = logging.getLogger(__name__)


class LoopConfig(ConfigModel):
    """Iteration schedule of an online loop."""

    iterations: int = Field(20, ge=1, le=10**6)  # rollout + update iterations
    eval_every: int = Field(0, ge=0)  # 0: only before the first and after the last iteration
    checkpoint_every: int = Field(5, ge=0)  # checkpoint every this many iterations (and after the last; 0: last only)
    keep_checkpoints: int = Field(2, ge=1)  # most recent checkpoints kept on disk
    stop_after_iterations: int | None = Field(
        None, ge=1, description="end this sitting once this many iterations are done, with a checkpoint (--resume)"
    )
    max_staleness: int = Field(0, ge=0)  # k: collect iteration i + k under the policy of iteration i; 0: synchronous
    keep_policy_versions: int = Field(2, ge=1)  # newest policy/vNNNNN directories kept (checkpoints are separate)
    weight_sync: Literal["auto", "disk", "nccl"] = "auto"  # full weights: auto = nccl on GPUs with a fleet, else disk
    lora_sync: Literal["adapter", "merged"] = Field(
        "adapter",
        description="how a LoRA policy reaches the rollout engines: 'adapter' hot-loads it (vLLM's LoRA kernels); "
        "'merged' sends the weights with the adapter folded in, as full weights. On vLLM's CPU build, whose LoRA ops "
        "are plain torch, serving the adapter took 78% of a rollout's time",
    )
    sync_check: SyncCheckConfig = SyncCheckConfig()  # after a sync: engines' log-probs on a probe vs the trainer's

    @model_validator(mode="after")
    def _versions_for_staleness(self) -> LoopConfig:
        if self.keep_policy_versions < self.max_staleness + 1:
            raise ValueError(
                f"keep_policy_versions ({self.keep_policy_versions}) must be at least max_staleness + 1 "
                f"({self.max_staleness + 1}): a resume relaunches collections under older versions"
            )
        return self

    @model_validator(mode="after")
    def _stop_before_the_end(self) -> LoopConfig:
        if self.stop_after_iterations is not None and self.stop_after_iterations >= self.iterations:
            raise ValueError(
                f"stop_after_iterations ({self.stop_after_iterations}) must be below iterations ({self.iterations}): "
                "the last sitting sets none"
            )
        return self

    @property
    def end(self) -> int:
        """The iteration this sitting stops before: the stop, else the run's last plus one."""
        return self.iterations if self.stop_after_iterations is None else self.stop_after_iterations


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
    stopped: bool = False  # the sitting ended at loop.stop_after_iterations, before the run's last iteration


MERGED_DIR = "merged"  # the subfolder of a LoRA policy version that holds its weights with the adapter folded in


def sync_policy(
    trainer: GroupTrainer,
    engine: PolicyEngine | None,
    root: str | Path,
    in_memory: WeightSender | None = None,
    *,
    save: bool = True,
    merged: bool = False,
) -> str:
    """Give the rollout engine (or fleet) the trainer's policy as version ``trainer.version``: full weights in
    memory when ``in_memory`` (a :class:`memrl.train.weight_sync.InMemoryWeightSync`) is given, else through the
    version's directory under ``root`` (adapter or full weights; with ``merged``, a LoRA policy also writes its
    merged weights in the version's ``merged`` subfolder, and the engine reloads those). ``save`` also writes the
    directory on the in-memory path."""
    out = str(Path(root) / f"v{trainer.version:05d}")
    if in_memory is not None:
        if save:
            trainer.save_policy(out)
        in_memory.send(out if save else None)
        return out
    trainer.save_policy(out)
    fold_adapter = merged and trainer.is_peft
    if fold_adapter:
        trainer.save_merged_policy(str(Path(out) / MERGED_DIR))
    if engine is not None and trainer.accelerator.is_main_process:
        load_policy_version(engine, out, trainer.version, trainer.is_peft, fold_adapter)
    return out


def load_policy_version(
    engine: PolicyEngine | None, directory: str, version: int, adapter: bool, merged: bool = False
) -> None:
    """Load a saved policy version into the rollout engine (or every worker of a fleet): the adapter, the adapter's
    merged weights (``merged``), or the full weights."""
    if adapter and merged:
        engine.update_weights(str(Path(directory) / MERGED_DIR), version)
    elif adapter:
        engine.load_adapter(directory, version)
    else:
        engine.update_weights(directory, version)


def prune_policy_versions(root: Path, keep: int, protect: set[int]) -> None:
    """Delete all but the newest ``keep`` version directories under ``root``, never one in ``protect``."""
    versions = sorted(int(p.name[1:]) for p in root.glob("v[0-9]*") if p.is_dir() and p.name[1:].isdigit())
    for version in versions[:-keep]:
        if version not in protect:
            shutil.rmtree(root / f"v{version:05d}", ignore_errors=True)


def _result(collection: Any) -> tuple[Any, dict[str, Any]]:
    """A collection's payload and metrics: ``launch`` returns them, or a collection in flight to wait for."""
    return collection.result() if callable(getattr(collection, "result", None)) else collection


def broadcast_groups(groups: list[Group] | None, accelerator: Any) -> list[Group]:
    """Send the main process's groups to every process (as JSON: nothing is unpickled)."""
    if accelerator.num_processes == 1:
        return list(groups or [])
    from accelerate.utils import broadcast_object_list

    payload = [json.dumps([g.model_dump(mode="json") for g in groups]) if accelerator.is_main_process else ""]
    broadcast_object_list(payload, from_process=0)
    return [Group.model_validate(g) for g in json.loads(payload[0])]


def check_staleness_placement(loop: LoopConfig, policy: PolicyPlacement, gpu: bool) -> None:
    """Refuse ``loop.max_staleness`` > 0 with the policy's engine colocated on GPUs: collection goes on while the
    trainer updates, and a colocated engine sleeps through the update."""
    if loop.max_staleness and gpu and policy.mode == "colocate":
        raise ConfigError(
            f"loop.max_staleness={loop.max_staleness} generates while the trainer updates: placement.policy.mode "
            "must be 'separate' on GPUs"
        )


def stale_sampling_tis(trainer: GroupTrainerConfig, loop: LoopConfig) -> GroupTrainerConfig:
    """The trainer config a loop with ``max_staleness`` > 0 needs: samples up to k versions old are weighted by
    pi_old / pi_rollout, so truncated importance sampling is switched on (cap :data:`STALE_TIS_CAP`) unless set.
    Recipes resolve it in their config validator, so the run's config.yaml shows it."""
    if loop.max_staleness and trainer.tis_cap is None:
        return trainer.model_copy(update={"tis_cap": STALE_TIS_CAP})
    return trainer


Launch = Callable[[int], Any]  # iteration -> (payload, metrics), or a collection in flight with .result()
Evaluate = Callable[[int], dict[str, Any]]


class OnlineLoop:
    """The bookkeeping of an online RL loop, for a recipe that writes its iteration itself (module docstring)::

        for iteration in loop.start(launch, evaluate):
            payload, metrics = loop.collected(iteration, launch)   # collect (launching k ahead)
            groups = ...                                            # the recipe's credit -> groups
            update = loop.update(groups)                            # broadcast, engine asleep, trainer.step
            sync = loop.sync(iteration)                             # new weights into the engines
            loop.log(iteration, {**metrics, **update, **sync}, evaluate)
            loop.checkpoint(iteration)
        result = loop.result()

    ``launch(iteration)`` runs on the main process only; ``payload`` is None on the others.
    """

    @classmethod
    def for_recipe(
        cls,
        recipe: Recipe,
        trainer: GroupTrainer,
        engine: PolicyEngine | None,
        run_dir: Path,
        logger: MetricsLogger,
        **options: Any,
    ) -> OnlineLoop:
        """The loop of ``recipe`` (its ``loop`` section, resuming when ``run.resume``); ``options``: ``desc``,
        ``attach``, ``in_memory``."""
        return cls(
            trainer=trainer,
            engine=engine,
            cfg=recipe.loop,
            run_dir=run_dir,
            resume=recipe.run.resume,
            logger=logger,
            **options,
        )

    def __init__(
        self,
        *,
        trainer: GroupTrainer,
        engine: PolicyEngine | None,
        cfg: LoopConfig,
        run_dir: Path,
        resume: bool,
        logger: MetricsLogger,
        desc: str = "rl",
        attach: dict[str, Path] | None = None,
        in_memory: WeightSender | None = None,
    ) -> None:
        if cfg.max_staleness and trainer.cfg.tis_cap is None:
            raise ConfigError(
                f"loop.max_staleness={cfg.max_staleness} trains on samples from older policies: set "
                f"trainer.tis_cap (memrl.train.online.stale_sampling_tis gives {STALE_TIS_CAP})"
            )
        self.trainer, self.engine, self.cfg, self.resume = trainer, engine, cfg, resume
        self.logger, self.desc, self.attach, self.in_memory = logger, desc, attach, in_memory
        self.main = trainer.accelerator.is_main_process
        self.merged = cfg.lora_sync == "merged"  # a LoRA policy reaches the engines as merged full weights
        self.ckpt = CheckpointManager(run_dir / "checkpoints", keep=cfg.keep_checkpoints)
        self.policy_root = run_dir / "policy"
        self.first = 0
        self.history: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []
        self.in_flight: dict[int, Any] = {}  # iteration -> its collection, launched before its turn when k >= 1
        self.launched: dict[int, int] = {}  # iteration -> the policy version its collection was launched under
        # the versions a resume from the newest complete checkpoint relaunches collections under: their directories
        # stay until a newer checkpoint is complete (a kill in between resumes from this one)
        self.checkpoint_needs: set[int] = set()
        self.policy_dir = ""
        self.verifier = SyncVerifier(trainer, cfg.sync_check)  # stops the run when an engine missed a sync
        self._t0 = 0.0
        self._bar: Any = None
        self._iteration: int | None = None  # the iteration being collected and updated

    def start(self, launch: Launch, evaluate: Evaluate | None) -> Any:
        """Resume (or start afresh), give the engines the starting policy, evaluate it; the iterations to run."""
        trainer, acc = self.trainer, self.trainer.accelerator
        if self.resume and (latest := self.ckpt.latest()) is not None:
            state = self.ckpt.load(latest, acc, self.attach)
            self.first = state["iteration"] + 1
            trainer.version, trainer.updates = state["policy_version"], state["updates"]
            self.history, self.evals = state.get("history", []), state.get("evals", [])
            trainer.set_rng_state(state["trainer_rng"])
            trainer.set_probe_state(state.get("trainer_probe"))  # KL to the run's initial policy, not the resumed one
            if self.main:
                self.logger.truncate_after(state["iteration"])
                log.info(f"[{self.desc}] resumed from {latest.name}: continuing at iteration {self.first}")
            # relaunch the collections that were in flight, each under the version it had in the uninterrupted run
            for iteration, version in sorted((int(i), v) for i, v in state.get("launched", {}).items()):
                if self.main:
                    load_policy_version(
                        self.engine,
                        str(self.policy_root / f"v{version:05d}"),
                        version,
                        trainer.is_peft,
                        self.merged,
                    )
                    self.in_flight[iteration] = launch(iteration)
                self.launched[iteration] = version
            self.checkpoint_needs = set(self.launched.values())
            if self.first >= self.cfg.end:
                raise ConfigError(
                    f"loop.stop_after_iterations={self.cfg.stop_after_iterations}: the run resumed after iteration "
                    f"{self.first - 1}, past the stop; set a later one (or none to finish the run)"
                )
        elif self.main:
            # A start from scratch (also a --resume that finds no complete checkpoint, e.g. after a kill during the
            # first checkpoint write) logs every step again, the eval before training (step -1) included.
            self.logger.truncate_after(-2)
            if self.resume:
                log.warning(
                    f"[{self.desc}] --resume: no complete checkpoint was saved yet in {self.ckpt.root}; starting "
                    f"from iteration 0"
                )
        self.policy_dir = sync_policy(
            trainer,
            self.engine,
            self.policy_root,
            self.in_memory,
            save=self.cfg.max_staleness > 0,
            merged=self.merged,
        )
        self.verifier.check(self.engine)
        if self.first == 0 and evaluate is not None and self.main:
            self.evals.append({"iteration": -1, **evaluate(-1)})
            self.logger.log(-1, {f"eval/{k}": v for k, v in self.evals[-1].items() if k != "iteration"})
        self._bar = progress_bar(
            range(self.first, self.cfg.end),
            desc=self.desc,
            disable=not self.main,
            initial=self.first,
            total=self.cfg.iterations,
            work=f"{self.cfg.end - self.first:,} iterations to run",
        )
        return self._bar

    def collected(self, iteration: int, launch: Launch) -> tuple[Any, dict[str, Any]]:
        """Launch this iteration's collection and, with k >= 1, the next k under the current policy (a fleet builds
        them while the trainer updates); wait for this iteration's. Metrics gain ``rollout_s``."""
        self._t0 = time.perf_counter()
        for ahead in range(iteration, min(iteration + self.cfg.max_staleness, self.cfg.iterations - 1) + 1):
            if ahead not in self.launched:
                if self.main:
                    self.in_flight[ahead] = launch(ahead)
                self.launched[ahead] = self.trainer.version
        self._iteration = iteration  # the update after it probes the KL to the start at the last iteration
        payload, metrics = _result(self.in_flight.pop(iteration)) if self.main else (None, {})
        collected_under = self.launched.pop(iteration)
        return payload, {
            **metrics,
            "policy_version_collected": collected_under,
            "rollout_s": time.perf_counter() - self._t0,
        }

    def update(self, groups: list[Group] | None, iteration: int | None = None) -> dict[str, Any]:
        """Every process gets the main process's groups; the engine sleeps (colocated on GPU, synchronous loop);
        the trainer takes one update, with the KL probe at the last iteration (``iteration``, else the one
        :meth:`collected` last returned). Returns its metrics with the staleness of the samples."""
        trainer = self.trainer
        groups = broadcast_groups(groups, trainer.accelerator)
        versions = [s.policy_version for g in groups for s in g.samples]
        staleness = {
            "staleness_max": trainer.version - min(versions, default=trainer.version),
            "staleness_mean": trainer.version - sum(versions) / len(versions) if versions else 0.0,
            "mixed_version_groups": sum(len({s.policy_version for s in g.samples}) > 1 for g in groups),
        }
        if self.engine is not None and not self.cfg.max_staleness:  # free the engine's GPU memory for the update
            self.engine.sleep()  # (the sync wakes it); with k >= 1 the engines keep generating during the update
        last = (self._iteration if iteration is None else iteration) == self.cfg.iterations - 1
        return {**trainer.step(groups, probe=True if last else None), **staleness}

    def sync(self, iteration: int) -> dict[str, Any]:
        """The updated policy into the engines (written to disk with k >= 1 and at the last iteration); old
        version directories pruned, except those a resume (from now, or from the newest complete checkpoint) would
        relaunch collections under."""
        t_sync = time.perf_counter()
        last = iteration == self.cfg.iterations - 1
        self.policy_dir = sync_policy(
            self.trainer,
            self.engine,
            self.policy_root,
            self.in_memory,
            save=self.cfg.max_staleness > 0 or last,
            merged=self.merged,
        )
        sync_s = time.perf_counter() - t_sync
        self._prune()
        return {"sync_s": sync_s, **self.verifier.check(self.engine)}

    def _prune(self) -> None:
        if self.main:
            prune_policy_versions(
                self.policy_root,
                self.cfg.keep_policy_versions,
                set(self.launched.values()) | {self.trainer.version} | self.checkpoint_needs,
            )

    def log(self, iteration: int, record: dict[str, Any], evaluate: Evaluate | None) -> dict[str, Any]:
        """Evaluate every ``eval_every`` iterations (and after the last); log the record; keep its numbers."""
        record = {**record, "iteration_s": time.perf_counter() - self._t0, "updates": self.trainer.updates}
        last = iteration == self.cfg.iterations - 1
        due = last or (self.cfg.eval_every and (iteration + 1) % self.cfg.eval_every == 0)
        if evaluate is not None and self.main and due:
            self.evals.append({"iteration": iteration, **evaluate(iteration)})
            record.update({f"eval/{k}": v for k, v in self.evals[-1].items() if k != "iteration"})
        self.history.append(
            {"iteration": iteration, **{k: v for k, v in record.items() if isinstance(v, (int, float))}}
        )
        if self.main:
            self.logger.log(iteration, record)
            if "reward_mean" in record:
                self._bar.set_postfix(reward=f"{record['reward_mean']:.3f}")
            elif record.get("budget_exhausted"):  # the remaining iterations only close the run: say why
                self._bar.set_postfix_str("reasoner-token budget spent")
        return record

    def checkpoint(self, iteration: int) -> None:
        """Every ``checkpoint_every`` iterations and after the last (of the run or of the sitting): policy, optimizer,
        RNG and loop state."""
        last = iteration == self.cfg.end - 1
        if last or (self.cfg.checkpoint_every and (iteration + 1) % self.cfg.checkpoint_every == 0):
            trainer = self.trainer
            self.ckpt.save(
                iteration,
                trainer.accelerator,
                trainer.model,
                {
                    "iteration": iteration,
                    "policy_version": trainer.version,
                    "updates": trainer.updates,
                    "trainer_rng": trainer.rng_state(),
                    "trainer_probe": trainer.probe_state(),
                    "history": self.history,
                    "evals": self.evals,
                    "launched": {str(i): v for i, v in self.launched.items()},
                },
                self.attach,
            )
            self.checkpoint_needs = set(self.launched.values())
            self._prune()

    def result(self) -> LoopResult:
        """What the finished loop (or sitting) reports; a stopped sitting says so in the log."""
        stopped = self.cfg.end < self.cfg.iterations
        if stopped and self.main:
            log.info(
                f"[{self.desc}] stopped after {self.cfg.end} of {self.cfg.iterations} iterations "
                "(loop.stop_after_iterations): the checkpoint is saved; --resume goes on from it"
            )
        return LoopResult(
            self.cfg.end - self.first,
            self.trainer.updates,
            self.trainer.version,
            self.policy_dir,
            self.history,
            self.evals,
            stopped,
        )
