"""Microsoft TextWorld end to end, in the regime a memory exists for: games that outgrow the frozen reasoner's
window. What does each memory system, and SAM's memory model after SFT and RL, do for that reasoner, and at what
cost in the reasoner's own tokens?

Games: TextWorld's own challenges generated locally (``treasure_hunter``, ``coin_collector``, ``cooking``), the
``ms_textworld`` family's disjoint seed ranges (SFT data 0.., RL 100000.., dev 300000.., test 400000..), the test
games cycling through the cells. The reasoner is the family's frozen programmatic reasoner behind an engine with a
real tokenizer (``--reasoner-tokenizer``): every variant's window and every reasoner token reported are counted in
that tokenizer's tokens (reasoner tokens per game: every token of every reasoner call, prompt and reply).
Success is TextWorld's own ``won``.

Variants, every one on the same test games (the RL variants on the first ``--rl-test-games`` of them where a run's
budget asks for it; differences are paired by game, over the games both sides played):

- ``no_memory``: the most recent turns that fit ``live_window`` reasoner tokens (the few turns SAM keeps raw);
- ``long_context``: the history truncated to the reasoner's window (``window`` reasoner tokens);
- ``bm25``: SAM's paging with BM25 retrieval over the raw pages (``memory(intent)``);
- ``sam_expert``: SAM with the privileged expert as its memory model (the upper bound distilled from);
- ``sam_untrained``, ``sam_sft``, ``sam_oat``, ``sam_flat``: SAM with the memory model untrained, after SFT on the
  expert's traces (one checkpoint per SFT seed), after SFT + OAT-GRPO and after SFT + flat GRPO (RL seeds under each
  SFT seed, the recipe's dynamic sampling).

Settings: the default (``premise``) plays the large cells, where games outgrow the window; ``--smoke`` plays
treasure_hunter small and medium (at most 40 commands), where long context sees everything (a smoke setting only).

**Stages and records.** The run is a list of stages, each built on the recipes' own code paths (the family's game
cache, ``memrl data distill``'s :func:`~memrl.rollout.expert_traces.distill`, ``memrl train sft``'s
:func:`~memrl.train.sft.run_sft`, ``memrl train oat-grpo``'s :func:`~memrl.train.oat_grpo.train_oat_grpo`, the
harness's :func:`~memrl.rollout.evaluation.tasks.evaluate_memory`): the games of each split, the distilled traces,
SFT per seed in sittings of ``--sft-block-steps`` steps, every evaluation chunk (``--chunk`` games of one variant and
seed), every RL run in sittings of ``--rl-block-iterations`` iterations (``loop.stop_after_iterations``; its trees
built by ``--rl-workers`` Ray rollout workers, or in this process), the replay check. Each
finished stage writes a small JSON record (its inputs, their digests, its result, its seconds) under ``--records``
(commit that folder as it fills). The same command on any machine reads the records and runs only the stages missing;
a checkpoint a later stage needs and this machine lacks is rebuilt from its recorded seed and inputs, and its weights
digest is checked against the record. ``--max-minutes`` stops cleanly before a stage that would start past the limit
(``--max-stages`` after that many stages; SIGTERM or Ctrl-C after the running stage): the last line then says what
is left and the estimated hours, also in ``<records>/status.json``. A record whose inputs differ from the command's
(another scale in the same folder) exits 2 naming the stage and the fields. ``--jobs N`` runs N processes that share
the run (so does the same command started again on the same machine): each takes the evaluation chunks no other has
started (the memory model generates on one thread, so two processes use both cores of a 2-core machine) and waits
for any other stage another is computing or rebuilding (claims under ``--work``); they stop by the same deadline.

    python -m benchmarks.textworld --model none --run premise-scripted        # scripted variants, large cells
    python -m benchmarks.textworld --model smollm2 --run premise-smollm2 --skip sam_untrained,sam_oat,sam_flat \\
        --jobs 2 --max-minutes 85                                             # SFT-level comparison, one sitting
    python -m benchmarks.textworld --smoke --model tiny --run smoke-tiny      # small cells, every variant

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    ROOT,
    Claims,
    bench_parser,
    die_with_parent,
    emit,
    pin_threads,
    start_workers,
    stop_workers,
    wait_for,
)

SCRIPTED = ("no_memory", "long_context", "bm25", "sam_expert")
TRAINED = ("sam_untrained", "sam_sft", "sam_oat", "sam_flat")
RL_VARIANTS = {"sam_oat": "tree", "sam_flat": "flat"}  # variant: its RL mode
PAIRS = (
    ("sam_sft", "long_context"),
    ("sam_sft", "bm25"),
    ("sam_sft", "no_memory"),
    ("sam_sft", "sam_untrained"),
    ("sam_oat", "sam_sft"),
    ("sam_flat", "sam_sft"),
    ("sam_oat", "sam_flat"),
    ("sam_oat", "long_context"),
    ("bm25", "no_memory"),
    ("long_context", "no_memory"),
    ("sam_expert", "sam_sft"),
)
DEFAULT_LR = 3e-4
LORA_SYNC = "merged"  # the LoRA policy reaches vLLM as merged full weights: its CPU LoRA ops took 78% of a rollout


@dataclass
class Scale:
    """How big a run is (every field is an input of the stages it shapes)."""

    cells: list[str]
    test_games: int  # over all cells (game i is of cell i % len(cells))
    sft_games: int  # expert episodes distilled (over all cells)
    sft_steps: int
    sft_batch: int
    sft_seeds: int
    rl_seeds: int  # RL runs under each SFT seed
    train_games: int  # RL training games (over all cells)
    iterations: int
    tasks_per_iteration: int
    max_steps: int  # game commands per episode
    window: int  # the reasoner's window in its own tokens (long context truncates to it)
    live_window: int  # no memory: the recent turns that fit this many reasoner tokens
    branch_factor: int = 4
    max_leaves: int = 8
    flat_group_size: int = 4
    informative_groups: int = 1
    max_extra_trees: int = 3
    lr_sft: float = 2e-3
    max_length: int = 768
    rl_test_games: int = 0  # the RL variants play the first this many test games (0: all), paired on those


PREMISE = Scale(
    cells=["treasure_hunter/large", "coin_collector/large", "cooking/large"],
    test_games=200,
    sft_games=270,
    sft_steps=400,
    sft_batch=16,
    sft_seeds=3,
    rl_seeds=1,
    train_games=540,
    iterations=30,
    tasks_per_iteration=6,
    max_steps=100,
    window=2048,
    live_window=512,
)
SMOKE = Scale(
    cells=["treasure_hunter/small", "treasure_hunter/medium"],
    test_games=16,
    sft_games=24,
    sft_steps=30,
    sft_batch=8,
    sft_seeds=2,
    rl_seeds=1,
    train_games=16,
    iterations=2,
    tasks_per_iteration=2,
    max_steps=40,
    window=2048,
    live_window=512,
    branch_factor=2,
    max_leaves=4,
    flat_group_size=2,
)


def smollm2_sft() -> dict[str, Any]:
    """SmolLM2's SFT settings, read from its recipe (configs/textworld_smollm2.yaml: full weights, bf16)."""
    from memrl.data.config import load_config
    from memrl.launch.quickstart import QuickstartConfig

    sft = load_config(QuickstartConfig, ROOT / "configs" / "textworld_smollm2.yaml").sft
    return {"lr_sft": sft.lr, "max_length": sft.max_length}


WORKER_TAG = ""  # " w<i>" in a --worker process


def say(message: str) -> None:
    print(f"[textworld{WORKER_TAG}] {message}", file=sys.stderr, flush=True)


def digest_weights(path: Path) -> str:
    """A digest of a model folder's weights (an error for a folder without any: not the digest of nothing)."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors weights to digest")
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def require_fast_bf16(model: str, what: str) -> None:
    """SmolLM2 trains under bf16 autocast (its recipe, and how its records were made): refuse, before any step, on a
    CPU whose bf16 matmuls take torch's fallback path, where a stage would take many hours (:class:`UnfitMachine`)."""
    from memrl.train.precision import cpu_bf16_is_slow, cpu_bf16_slowdown, cpu_description

    if model == "smollm2" and cpu_bf16_is_slow():
        raise UnfitMachine(
            f"{what}: SmolLM2 trains under bf16 autocast, but bf16 matmuls on this CPU ({cpu_description()}) are "
            f"{cpu_bf16_slowdown():.0f}x slower than fp32: an SFT step of about a minute elsewhere took over 14 "
            "minutes on such a CPU. Run this command on a CPU with native bf16 (lscpu lists avx512_bf16 or "
            "amx_bf16); the stages that need no training run here with --skip sam_sft,sam_oat,sam_flat"
        )


def digest_json(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


class Stopped(Exception):
    """The sitting's budget (``--max-minutes`` / ``--max-stages``) is spent: stop before the next stage."""


class UnfitMachine(Exception):
    """This machine cannot run a stage the command needs in reasonable time (the message says why and where to)."""


class RecordMismatch(Exception):
    """A record's inputs differ from the command's."""


@dataclass
class Records:
    """The committed per-stage records of one run (``<root>/<stage>.json``) and the sitting's budget.

    With ``claims`` (a folder of this machine's), a process computing a stage holds its claim, so several processes
    of one run share its stages: a stage another live process holds is waited for and read from its record, or
    (``elsewhere_ok``: evaluation chunks, and the RL runs of a first pass over them) left to it. A claim whose
    process is gone is taken over."""

    root: Path
    deadline: float | None  # perf_counter() past which no stage starts
    max_stages: int | None
    ran: list[str]
    commit: str | None
    stop_requested: bool = False  # SIGTERM / SIGINT: finish the running stage, start no other
    claims: Claims | None = None
    poll_s: float = 10.0  # how often a stage held by another process is looked for

    def path(self, stage: str) -> Path:
        return self.root / f"{stage}.json"

    def get(self, stage: str, inputs: dict[str, Any]) -> dict[str, Any] | None:
        """The recorded result of ``stage`` when its inputs are ``inputs``; None when not recorded."""
        path = self.path(stage)
        if not path.exists():
            return None
        record = json.loads(path.read_text())
        wanted = json.loads(json.dumps(inputs))
        if record["inputs"] != wanted:
            changed = sorted(
                k for k in wanted.keys() | record["inputs"].keys() if wanted.get(k) != record["inputs"].get(k)
            )
            raise RecordMismatch(
                f"{path}: recorded with other inputs ({', '.join(changed)}): give this run its own --run"
            )
        return record["result"]

    def run(
        self, stage: str, inputs: dict[str, Any], compute: Callable[[], dict[str, Any]], elsewhere_ok: bool = False
    ) -> dict[str, Any] | None:
        """The stage's recorded result, or (budget allowing) compute it now and record it. A stage another process
        holds is waited for, or with ``elsewhere_ok`` left to it (None)."""
        from memrl.data.io import atomic_write_text
        from memrl.train.precision import cpu_description

        said = False
        while (found := self.get(stage, inputs)) is None:
            self.check_budget(stage)
            if self.claims is None or self.claims.take(stage):
                break
            if elsewhere_ok:
                return None
            if not said:
                say(f"stage {stage}: waiting for process {self.claims.holder(stage)}, which is computing it")
                said = True
            time.sleep(self.poll_s)
        else:
            return found
        try:
            if (found := self.get(stage, inputs)) is not None:  # recorded between the look and the claim
                return found
            say(f"stage {stage}")
            t0 = time.perf_counter()
            result = compute()
            record = {
                "stage": stage,
                "inputs": inputs,
                "inputs_digest": digest_json(inputs),
                "result": result,
                "seconds": round(time.perf_counter() - t0, 1),
                "finished": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "commit": self.commit,
                "load_average": round(os.getloadavg()[0], 1),
                "cpu": cpu_description(),
            }
            self.path(stage).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path(stage), json.dumps(record, indent=1) + "\n")
            self.ran.append(stage)
            return result
        finally:
            if self.claims is not None:
                self.claims.release(stage)

    def rebuild(
        self, stage: str, present: Callable[[], bool], compute: Callable[[], dict[str, Any]]
    ) -> dict[str, Any] | None:
        """Compute again, here, what a recorded stage left on the machine that ran it (a checkpoint, distilled rows)
        and this one lacks: ``compute``'s result, or None when ``present()`` says it is here (another process of
        the run rebuilt it; a process rebuilding holds the stage's claim, and the others wait for it)."""
        said = False
        while self.claims is not None and not self.claims.take(stage):
            self.check_budget(stage)
            if not said:
                say(f"stage {stage}: waiting for process {self.claims.holder(stage)}, which is rebuilding it")
                said = True
            time.sleep(self.poll_s)
        try:
            if present():
                return None
            self.check_budget(stage)
            return compute()
        finally:
            if self.claims is not None:
                self.claims.release(stage)

    def check_budget(self, stage: str) -> None:
        """Raise :class:`Stopped` when the sitting may start no more work (its minutes, its stages, a signal)."""
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            raise Stopped(stage)
        if self.max_stages is not None and len(self.ran) >= self.max_stages:
            raise Stopped(stage)
        if self.stop_requested:
            raise Stopped(stage)

    def seconds_by_kind(self) -> dict[str, list[float]]:
        """Seconds of every recorded stage, by :func:`stage_kind` (each record read once)."""
        out: dict[str, list[float]] = {}
        for path in sorted(self.root.glob("**/*.json")):
            record = json.loads(path.read_text())
            if "stage" in record:
                out.setdefault(stage_kind(record["stage"]), []).append(record["seconds"])
        return out


def stage_kind(stage: str) -> str:
    """The stages whose seconds estimate ``stage``'s: an evaluation chunk's, any draw's chunks of its variant; an SFT
    sitting's, any seed's sittings; an RL run's, any run of its mode; another stage's, its own."""
    parts = stage.split("/")
    if parts[0] == "eval" and len(parts) >= 3:
        return f"eval/*/{parts[2]}"
    if parts[0] == "sft":
        return "sft"
    if parts[0] == "rl" and len(parts) >= 2:
        return "rl/" + parts[1].rsplit("-sft", 1)[0].rsplit("-", 1)[-1]
    return stage


def sitting_ends(block: int, total: int) -> range:
    """Where the sittings of a run of ``total`` steps in blocks of ``block`` stop before its last (none for 0)."""
    return range(block, total, block) if block else range(0)


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    except OSError:
        return None
    return out.stdout.strip() or None


def memory_engine_config(
    backend: str, name: str, model: Path, kv_cache_gib: float, continuous_batching: bool = True
) -> Any:
    """The engine of a memory model in these benchmarks: float32, batches of 64 and, on vLLM, a 4,096-token window
    with a KV cache of ``kv_cache_gib``."""
    from memrl.rollout.engines.config import EngineConfig

    vllm = backend == "vllm"
    return EngineConfig(
        backend="vllm" if vllm else "hf",
        name=name,
        model=str(model),
        dtype="float32",
        batch_size=64,
        max_model_len=4096 if vllm else None,
        kv_cache_memory_bytes=int(kv_cache_gib * 2**30) if vllm else None,
        continuous_batching=continuous_batching,
    )


@dataclass
class TextWorldRun:
    """One run: its scale, its records, where its big artefacts live (``work``: rebuilt when missing)."""

    args: argparse.Namespace
    scale: Scale
    records: Records
    work: Path
    base: Path | None = None
    tokenizer: Any = None
    rebuilt_differs: list[str] = field(default_factory=list)  # rebuilt checkpoints whose digest is not the record's
    workers: list[Any] = field(default_factory=list)  # the --jobs worker processes this one started

    # ------------------------------------------------------------------------------------------------ tasks
    def params(self) -> dict[str, Any]:
        return {"mix": list(self.scale.cells), "max_steps": self.scale.max_steps, "cache_dir": self.args.game_cache}

    def task_set(self, split: str, count: int) -> Any:
        from memrl.data.tasks import TaskSetConfig
        from memrl.data.tasks.ms_textworld import MS_TEXTWORLD_SPLITS

        return TaskSetConfig(family="ms_textworld", params=self.params(), count=count, seed=MS_TEXTWORLD_SPLITS[split])

    def games(self, split: str, count: int) -> list[Any]:
        """The split's games, generated into the game cache (the stage ``games/<split>``: ids and digests)."""
        from memrl.data.tasks import load_tasks
        from memrl.data.tracking import progress_bar

        tasks = load_tasks(self.task_set(split, count), split)

        def generate() -> dict[str, Any]:
            digests = {}
            for task in progress_bar(tasks, desc=f"games {split}", leave=False):
                digests[task.task_id] = task.record().z8_sha256[:16]
            return {"games": len(tasks), "z8_sha256": digests}

        inputs = {"cells": self.scale.cells, "max_steps": self.scale.max_steps, "count": count}
        self.records.run(f"games/{split}", inputs, generate)
        return tasks

    # ------------------------------------------------------------------------------------------------ engines
    def reasoner_tokenizer(self) -> Any:
        """The frozen reasoner's tokenizer: every window and reasoner token of the run is counted in it."""
        from memrl.rollout.models import TinyModelSpec, ensure_smollm2, ensure_tiny_model, load_tokenizer

        if self.tokenizer is None:
            name = self.args.reasoner_tokenizer
            path = (
                ensure_smollm2(self.args.model_cache)
                if name == "smollm2"
                else ensure_tiny_model(self.args.model_cache, TinyModelSpec())
                if name == "tiny"
                else Path(name)
            )
            self.tokenizer = load_tokenizer(str(path))
        return self.tokenizer

    def memory_config(self, name: str) -> dict[str, Any]:
        paging = {"page_turns": 1, "live_capacity_turns": 4, "keep_recent_turns": 3}
        if name == "no_memory":
            return {"name": "long_context", "window_tokens": self.scale.live_window}
        if name == "long_context":
            return {"name": "long_context", "window_tokens": self.scale.window}
        if name == "bm25":
            return {"name": "bm25", **paging, "top_k": 2}
        # the family's cue length: a large game's opening text tells a route of 20 and more moves, which a shorter
        # cue or recall cuts off (SAM with the expert then loses the games it otherwise wins)
        return {
            "name": "sam",
            **paging,
            "max_cue_tokens": 192,
            "sampling": {
                "consolidate": {"temperature": 0.0, "max_tokens": 192},
                "recall": {"temperature": 1.0, "max_tokens": 256},
            },
        }

    def engine_config(self, name: str, model: Path) -> Any:
        return memory_engine_config(self.args.engine, name, model, self.args.kv_cache_gib)

    # ------------------------------------------------------------------------------------------------ evaluation
    def evaluate(
        self, variant: str, tag: str, tasks: list[Any], model: Callable[[], Path] | None, weights: str
    ) -> dict:
        """Greedy per-game results of one variant (one SFT/RL draw: ``tag``), one stage per chunk of games."""
        chunk = self.args.chunk
        games: dict[str, Any] = {}
        engine: Any = None
        elsewhere: list[tuple[str, dict[str, Any], Callable[[], dict[str, Any]]]] = []  # chunks another process holds
        try:
            for start in range(0, len(tasks), chunk):
                part = tasks[start : start + chunk]
                inputs = {
                    "variant": variant,
                    "memory": self.memory_config(variant),
                    "weights": weights,
                    "games": [t.task_id for t in part],
                    "reasoner_tokenizer": self.args.reasoner_tokenizer,
                }

                def play(part: list[Any] = part) -> dict[str, Any]:
                    nonlocal engine
                    if engine is None:
                        engine = self.memory_engine(model)
                    return self.play(variant, engine, part)

                stage = f"eval/{tag}/{variant}/{start:04d}-{start + len(part) - 1:04d}"
                result = self.records.run(stage, inputs, play, elsewhere_ok=True)
                if result is None:
                    elsewhere.append((stage, inputs, play))
                else:
                    games.update(result["games"])
            for stage, inputs, play in elsewhere:  # their records (or the chunk, when its process stopped without)
                result = self.records.run(stage, inputs, play)
                assert result is not None
                games.update(result["games"])
        finally:
            if engine is not None and model is not None:
                engine.close()
        return games

    def dev_success(self, tag: str, dev: list[Any], model: Callable[[], Path], weights: str) -> float:
        """SAM with ``model`` on the dev games (stages ``eval/dev-<tag>/sam/...``): the share won."""
        games = self.evaluate("sam_sft", f"dev-{tag}", dev, model, weights)
        return statistics.fmean(g["won"] for g in games.values())

    def memory_engine(self, model: Callable[[], Path] | None) -> Any:
        from memrl.data.experts.ms_textworld import TwOracle
        from memrl.rollout.engines.factory import build_engine
        from memrl.rollout.engines.scripted import ScriptedEngine

        if model is None:
            return ScriptedEngine(TwOracle(), name="expert")
        return build_engine(self.engine_config("memory", model()))

    def play(self, variant: str, memory: Any, tasks: list[Any]) -> dict[str, Any]:
        """One chunk of games played greedily: per game won, cell, steps, reasoner tokens, peak context."""
        from memrl.data.tasks.ms_textworld import TwReasoner
        from memrl.rollout.engines.scripted import ScriptedEngine
        from memrl.rollout.evaluation.tasks import evaluate_memory
        from memrl.rollout.loop import EngineSet
        from memrl.rollout.memory.sam import TokenizerCounter

        tokenizer = self.reasoner_tokenizer()
        reasoner = ScriptedEngine(TwReasoner(), tokenizer=tokenizer, name="reasoner")
        result = evaluate_memory(
            tasks,
            EngineSet(reasoner=reasoner, memory=memory),
            self.memory_config(variant),
            samples=0,
            count_tokens=TokenizerCounter(tokenizer),
            tasks_per_batch=len(tasks),
            progress=f"eval {variant}",
        )
        return {
            "games": {
                r["episode_id"]: {
                    "won": float(r["outcome"] or 0.0),
                    "cell": r["horizon"],
                    "steps": r["stats"].get("env_steps"),
                    # every token the reasoner read or wrote, and what of it a prefix cache would not have served
                    "reasoner_tokens": r["reasoner_tokens"]["prompt"] + r["reasoner_tokens"]["completion"],
                    "reasoner_tokens_spent": r["reasoner_tokens"]["spent"],
                    "peak_context": r["peak_context_tokens"],
                }
                for r in result["records"]
            }
        }

    # ------------------------------------------------------------------------------------------------ training
    def base_model(self) -> Path:
        from memrl.rollout.models import TinyModelSpec, ensure_smollm2, ensure_tiny_model

        if self.base is None:
            self.base = (
                ensure_smollm2(self.args.model_cache)
                if self.args.model == "smollm2"
                else ensure_tiny_model(self.args.model_cache, TinyModelSpec())
            )
        return self.base

    def distill_inputs(self) -> dict[str, Any]:
        return {"games": self.scale.sft_games, "cells": self.scale.cells, "max_steps": self.scale.max_steps}

    def distilled(self) -> Path:
        """The expert's traces on the SFT games (``memrl data distill``; rejection sampling keeps won episodes):
        the stage ``distill`` records their counts and digest; the rows are rebuilt when this machine lacks them."""
        from memrl.data.config import RunConfig
        from memrl.rollout.expert_traces import DistillRunConfig, distill

        out = self.work / "distill"

        def run() -> dict[str, Any]:
            self.games("sft", self.scale.sft_games)  # generating them is a stage of its own
            stats = distill(
                DistillRunConfig(
                    run=RunConfig(output_dir=str(self.work), name="distill", seed=0, resume=out.exists()),
                    tasks=self.task_set("sft", self.scale.sft_games),
                    memory=self.memory_config("sam"),
                    tokenizer=str(self.base_model()),
                ),
                out,
            )
            return {"stats": stats, "rows_digest": self.rows_digest(out)}

        inputs = {**self.distill_inputs(), "tokenizer": self.args.model}
        recorded = self.records.get("distill", inputs)
        if recorded is None:
            self.records.run("distill", inputs, run)
            return out
        result = self.records.rebuild("distill", (out / "stats.json").exists, run)
        if result is not None and result["rows_digest"] != recorded["rows_digest"]:
            say(f"distill rebuilt with rows {result['rows_digest']}, recorded {recorded['rows_digest']}")
        return out

    @staticmethod
    def rows_digest(folder: Path) -> str:
        h = hashlib.sha256()
        for f in sorted(folder.glob("*.jsonl")):
            if f.name.startswith("progress"):
                continue
            h.update(f.read_bytes())
        return h.hexdigest()[:16]

    def sft_inputs(self, seed: int) -> dict[str, Any]:
        s = self.scale
        return {
            "seed": seed,
            "model": self.args.model,
            "distill": self.distill_inputs(),
            "steps": s.sft_steps,
            "batch": s.sft_batch,
            "lr": s.lr_sft,
            "max_length": s.max_length,
        }

    def sft(self, seed: int) -> Path:
        """SFT seed ``seed`` (``memrl train sft``; full weights) in sittings of ``--sft-block-steps`` steps: the stage
        ``sft/seed<k>/to-step<n>`` records the digest of the checkpoint at step n, the stage ``sft/seed<k>`` the
        final weights' digest. The checkpoints stay on this machine; on another, the missing steps are trained
        again (the same seed gives the same weights, and the digests are compared with the records)."""
        out = self.work / f"sft-s{seed}" / "final"
        inputs = self.sft_inputs(seed)
        recorded = self.records.get(f"sft/seed{seed}", inputs)
        if recorded is not None and (out / "config.json").exists():
            return out
        block = self.args.sft_block_steps
        for step in sitting_ends(block, self.scale.sft_steps):
            self.sft_sitting(seed, step, inputs)
        if recorded is None:
            self.records.run(f"sft/seed{seed}", inputs, lambda: self.train_sft(seed, out))
        elif (
            rebuilt := self.records.rebuild(
                f"sft/seed{seed}", (out / "config.json").exists, lambda: self.train_sft(seed, out)
            )
        ) is not None:
            same = rebuilt["weights"] == recorded["weights"]
            say(f"SFT seed {seed} rebuilt: weights {'match' if same else 'DIFFER from'} the record")
            if not same:
                self.rebuilt_differs.append(f"sft/seed{seed}")
        return out

    def sft_sitting(self, seed: int, step: int, inputs: dict[str, Any]) -> None:
        """SFT seed ``seed`` trained to ``step`` (its stage's record), here: when the record exists but this machine
        has no checkpoint at or past ``step``, the sitting is trained again and its digest compared."""
        from memrl.train.sft import checkpoint_step, latest_checkpoint

        stage, block_inputs = f"sft/seed{seed}/to-step{step}", {**inputs, "to_step": step}
        out = self.work / f"sft-s{seed}" / "final"
        recorded = self.records.get(stage, block_inputs)
        if recorded is None:
            self.records.run(stage, block_inputs, lambda: self.train_sft(seed, out, stop_at_step=step))
            return

        def present() -> bool:
            newest = latest_checkpoint(self.work / f"sft-s{seed}" / "checkpoints")
            return newest is not None and checkpoint_step(newest) >= step

        rebuilt = self.records.rebuild(stage, present, lambda: self.train_sft(seed, out, stop_at_step=step))
        if rebuilt is None:
            return
        same = rebuilt["checkpoint"] == recorded["checkpoint"]
        say(f"SFT seed {seed} to step {step} rebuilt: checkpoint {'matches' if same else 'DIFFERS from'} the record")
        if not same:
            self.rebuilt_differs.append(stage)

    def sft_weights(self, seed: int) -> str:
        """SFT seed ``seed``'s recorded weights digest (the SFT stage runs first when it is not recorded)."""
        recorded = self.records.get(f"sft/seed{seed}", self.sft_inputs(seed))
        if recorded is None:
            self.sft(seed)
            recorded = self.records.get(f"sft/seed{seed}", self.sft_inputs(seed))
        assert recorded is not None
        return str(recorded["weights"])

    def train_sft(self, seed: int, out: Path, stop_at_step: int | None = None) -> dict[str, Any]:
        """Train SFT seed ``seed`` to the end (the final weights' digest) or to ``stop_at_step`` (that checkpoint's),
        going on from the newest checkpoint of an earlier sitting."""
        from memrl.data.config import RunConfig
        from memrl.rollout.engines.base import torch_threads
        from memrl.train.policy import LoraSettings, PolicySpec
        from memrl.train.sft import SFTRunConfig, SFTTrainConfig, run_sft
        from memrl.train.sft_data import SFTDataConfig

        require_fast_bf16(self.args.model, f"SFT seed {seed}")
        s, base, data = self.scale, self.base_model(), self.distilled()
        name = f"sft-s{seed}"
        with torch_threads(self.args.sft_threads):  # the weights do not depend on it: only the seconds
            run_sft(
                SFTRunConfig(
                    run=RunConfig(output_dir=str(self.work), name=name, seed=seed, resume=(self.work / name).exists()),
                    model=PolicySpec(base=str(base)),
                    lora=LoraSettings(enabled=False),
                    data=SFTDataConfig(
                        dir=str(data), roles={"consolidate": 0.5, "recall": 0.5}, mixture_rows=s.sft_steps * s.sft_batch
                    ),
                    train=SFTTrainConfig(
                        max_steps=s.sft_steps,
                        batch_size=s.sft_batch,
                        lr=s.lr_sft,
                        warmup=0.05,
                        max_length=s.max_length,
                        save_steps=max(s.sft_steps, 1),
                        save_total_limit=1,
                        logging_steps=10,
                        bf16=self.args.model == "smollm2",
                        stop_at_step=stop_at_step,
                    ),
                )
            )
        if stop_at_step is not None:
            return {"checkpoint": digest_weights(self.work / name / "checkpoints" / f"checkpoint-{stop_at_step}")}
        return {"weights": digest_weights(out)}

    def rl(
        self,
        mode: str,
        sft_seed: int,
        rl_seed: int,
        lr: float,
        tag: str = "",
        elsewhere_ok: bool = False,
        weights: bool = False,
    ) -> tuple[Path, dict[str, Any]] | None:
        """OAT-GRPO (``tree``) or flat GRPO (``flat``) from SFT seed ``sft_seed`` under RL seed ``rl_seed``, in
        sittings of ``--rl-block-iterations`` iterations: the stage ``rl/<mode>-sft<k>-rl<j>/to-iter<n>`` records
        the digest of the checkpoint after n iterations, the stage ``rl/<mode>-sft<k>-rl<j>`` the run's summary and
        final weights digest (each rebuilt, and compared, when this machine lacks it). With ``elsewhere_ok``, a run
        whose next stage another process holds is left to it (None), so two processes train two runs at once. A
        recorded run's summary is returned as it is; its final weights are rebuilt on this machine only when asked for
        (``weights``: an evaluation chunk still to play), not for runs whose evaluations are all recorded."""
        name = f"{tag}{mode}-sft{sft_seed}-rl{rl_seed}"
        s = self.scale
        inputs = {
            "mode": mode,
            "sft": self.sft_inputs(sft_seed),
            "rl_seed": rl_seed,
            "lr": lr,
            "iterations": s.iterations,
            "tasks_per_iteration": s.tasks_per_iteration,
            "train_games": s.train_games,
            "tree": [s.branch_factor, s.max_leaves, s.flat_group_size, s.informative_groups, s.max_extra_trees],
            "workers": self.args.rl_workers,
            "lora_sync": LORA_SYNC,
        }
        out = self.work / "rl" / f"{name}-final"
        recorded = self.records.get(f"rl/{name}", inputs)
        if recorded is not None and (not weights or (out / "config.json").exists()):
            return out, recorded
        block = self.args.rl_block_iterations
        for stop in sitting_ends(block, s.iterations):
            if not self.rl_sitting(mode, sft_seed, rl_seed, lr, name, stop, inputs, elsewhere_ok):
                return None
        if recorded is None:
            result = self.records.run(
                f"rl/{name}", inputs, lambda: self.train_rl(mode, sft_seed, rl_seed, lr, out, name), elsewhere_ok
            )
            return None if result is None else (out, result)
        rebuilt = self.records.rebuild(
            f"rl/{name}", (out / "config.json").exists, lambda: self.train_rl(mode, sft_seed, rl_seed, lr, out, name)
        )
        if rebuilt is not None and rebuilt["weights"] != recorded["weights"]:
            self.rebuilt_differs.append(f"rl/{name}")
        return out, recorded

    def rl_sitting(
        self,
        mode: str,
        sft_seed: int,
        rl_seed: int,
        lr: float,
        name: str,
        stop: int,
        inputs: dict[str, Any],
        elsewhere_ok: bool = False,
    ) -> bool:
        """RL run ``name`` trained to ``stop`` iterations (its stage's record), here: when the record exists but this
        machine has no checkpoint at or past it, the sitting is trained again and its digest compared. False when
        the sitting was left to another process (``elsewhere_ok``)."""
        stage, block_inputs = f"rl/{name}/to-iter{stop}", {**inputs, "to_iteration": stop}
        out = self.work / "rl" / f"{name}-final"
        recorded = self.records.get(stage, block_inputs)
        if recorded is None:
            train = lambda: self.train_rl(mode, sft_seed, rl_seed, lr, out, name, stop)  # noqa: E731
            return self.records.run(stage, block_inputs, train, elsewhere_ok) is not None

        def present() -> bool:
            done = (
                int(c.parent.name.split("-")[1]) + 1 for c in (self.work / "rl" / name).glob("checkpoints/*/COMPLETE")
            )
            return max(done, default=0) >= stop

        rebuilt = self.records.rebuild(
            stage, present, lambda: self.train_rl(mode, sft_seed, rl_seed, lr, out, name, stop)
        )
        if rebuilt is not None:
            same = rebuilt["checkpoint"] == recorded["checkpoint"]
            say(f"RL {name} to iteration {stop} rebuilt: checkpoint {'matches' if same else 'DIFFERS from'} the record")
            if not same:
                self.rebuilt_differs.append(stage)
        return True

    def train_rl(
        self, mode: str, sft_seed: int, rl_seed: int, lr: float, out: Path, name: str, stop: int | None = None
    ) -> dict[str, Any]:
        """Train RL run ``name`` to the end (its summary and final weights' digest) or for a sitting that ends after
        ``stop`` iterations (that checkpoint's digest), going on from the newest checkpoint of an earlier sitting."""
        import shutil

        from memrl.data.config import RunConfig
        from memrl.data.run_dir import prepare_run_dir
        from memrl.data.tasks import TaskSetConfig
        from memrl.rollout.fleet import FleetConfig
        from memrl.rollout.tree import TreeConfig
        from memrl.train.group_trainer import GroupTrainerConfig
        from memrl.train.oat_grpo import OATGRPOConfig, train_oat_grpo
        from memrl.train.online import LoopConfig
        from memrl.train.policy import LoraSettings, PolicySpec

        require_fast_bf16(self.args.model, f"RL run {name}")
        s, sft = self.scale, self.sft(sft_seed)
        seed = 1000 * sft_seed + rl_seed
        smollm2 = self.args.model == "smollm2"
        cfg = OATGRPOConfig(
            run=RunConfig(
                output_dir=str(self.work / "rl"), name=name, seed=seed, resume=(self.work / "rl" / name).exists()
            ),
            policy=PolicySpec(base=str(sft)),
            engine=self.engine_config("policy", sft),
            memory=self.memory_config("sam"),
            train_tasks=self.task_set("train", s.train_games),
            eval_tasks=TaskSetConfig(family="ms_textworld", params=self.params(), count=0),
            tasks_per_iteration=s.tasks_per_iteration,
            tree=TreeConfig(
                mode=mode,
                branch_roles=["recall"],
                branch_factor=s.branch_factor,
                max_leaves=s.max_leaves,
                flat_group_size=s.flat_group_size,
                informative_groups=s.informative_groups,
                max_extra_trees=s.max_extra_trees,
            ),
            trainer=GroupTrainerConfig(lr=lr, lora=LoraSettings(enabled=smollm2), bf16=smollm2, seed=seed),
            loop=LoopConfig(
                iterations=s.iterations,
                eval_every=0,
                checkpoint_every=min(s.iterations, 5),
                keep_checkpoints=1,
                stop_after_iterations=stop,
                lora_sync=LORA_SYNC,
            ),
            fleet=FleetConfig(workers=self.args.rl_workers),
            eval_samples=0,
        )
        result = train_oat_grpo(cfg, prepare_run_dir(cfg, cfg.run, "train-oat-grpo"))
        history = result["history"]
        if stop is not None:
            checkpoint = self.work / "rl" / name / "checkpoints" / f"ckpt-{stop - 1:06d}"
            return {
                "checkpoint": digest_weights(checkpoint),
                "updates": result["updates"],
                "success_train": [h.get("success") for h in history],
                "rollout_s": [round(h["rollout_s"], 1) for h in history],
                "iteration_s": [round(h["iteration_s"], 1) for h in history],
            }
        policy = Path(result["policy_dir"])
        if result["lora"]:  # a LoRA policy: evaluated merged on its base
            from memrl.train.export import ExportConfig, VerifyConfig, export_model

            export_model(
                ExportConfig(
                    run=RunConfig(output_dir=str(self.work / "rl"), name=f"{name}-export"),
                    policy=PolicySpec(base=str(sft), adapter=str(policy)),
                    verify=VerifyConfig(vllm=False),
                ),
                out,
            )
        else:
            shutil.copytree(policy, out, dirs_exist_ok=True)
        return {
            "weights": digest_weights(out),
            "same_weights_as_sft": digest_weights(out) == digest_weights(sft),
            "updates": result["updates"],
            "iterations": result["iterations_run"],
            "informative_groups": sum(h.get("informative_groups", 0) for h in history),
            "extra_trees": sum(h.get("extra_trees", 0) for h in history),
            "trained_tokens": sum(h.get("trained_tokens", 0) for h in history),
            "reasoner_tokens": sum(h.get("reasoner_tokens", 0) for h in history),
            "success_train": [h.get("success") for h in history],
            "rollout_s": [round(h["rollout_s"], 1) for h in history],
            "iteration_s": [round(h["iteration_s"], 1) for h in history],
        }

    # ------------------------------------------------------------------------------------------------ replay
    def replay_check(self, tasks: list[Any]) -> dict[str, Any]:
        """Play every game with the expert through SAM, then replay its commands on a new instance from reset and
        compare every observation: games replayed exactly / games, and the commands replayed."""
        from memrl.data.experts.ms_textworld import TwOracle
        from memrl.data.tasks.ms_textworld import MsTextWorldTask, TwReasoner
        from memrl.rollout.agents import task_rollout
        from memrl.rollout.engines.scripted import ScriptedEngine
        from memrl.rollout.loop import EngineSet, run_rollouts

        engines = EngineSet(reasoner=ScriptedEngine(TwReasoner()), memory=ScriptedEngine(TwOracle()))
        exact, commands, mismatches = 0, 0, []
        for start in range(0, len(tasks), 32):
            rollouts = [task_rollout(t, self.memory_config("sam")) for t in tasks[start : start + 32]]
            run_rollouts(rollouts, engines)
            for rollout in rollouts:
                played = rollout.env
                twin = MsTextWorldTask(played.settings, seed=played.seed, task_id=played.task_id)
                same = twin.reset() == played.first
                for action, observation in played.log:
                    same = same and twin.step(action)[0] == observation
                    commands += 1
                exact += int(same)
                if not same:
                    mismatches.append(played.task_id)
                twin.env.close() if twin.env is not None else None
        return {"games": len(tasks), "exact": exact, "commands_replayed": commands, "mismatched": mismatches}


# ----------------------------------------------------------------------------------------------------------------
# figures


def of_draw(by_draw: dict[str, dict[str, Any]], draw: str) -> dict[str, Any]:
    """A variant's results under ``draw``: its own, its SFT start's (``sft1/rl0`` -> ``sft1``), or those of a variant
    with one draw (scripted, untrained: nothing trained, the same games every draw)."""
    found = by_draw.get(draw) or by_draw.get(draw.split("/")[0])
    if found is None:
        if len(by_draw) != 1:
            raise KeyError(f"no results of draw {draw!r} among {sorted(by_draw)}")
        found = next(iter(by_draw.values()))
    return found


def figures(evals: dict[str, dict[str, dict[str, Any]]], games: list[str], cells: dict[str, str]) -> dict[str, Any]:
    """Per variant and cell: success, steps to win, reasoner tokens per game (every prompt and generated token; and
    ``spent``: what a prefix cache would not have served), and success at equal reasoner-token cost (won on no more
    reasoner tokens than long context used on the same game); paired differences with two-level
    intervals over the draws (``evals[variant][draw]``: SFT seed, or SFT seed / RL seed) and games, and each draw's
    interval over games."""
    from memrl.rollout.evaluation.stats import task_level_interval, two_level_interval

    groups = [*sorted(set(cells.values())), "all"]
    chosen = {c: [g for g in games if c in ("all", cells[g])] for c in groups}
    budget = next(iter(evals["long_context"].values())) if "long_context" in evals else None
    table: dict[str, Any] = {}
    for variant, draws in evals.items():
        row = {}
        for c in groups:
            own = [g for g in chosen[c] if all(g in d for d in draws.values())]  # the games every draw played
            if not own:
                continue
            per = [d[g] for d in draws.values() for g in own]
            wins = [p for p in per if p["won"]]
            row[c] = {
                "success": statistics.fmean(p["won"] for p in per),
                "games": len(own),
                "draws": len(draws),
                "steps_to_win": statistics.fmean(p["steps"] for p in wins) if wins else None,
                "reasoner_tokens_per_game": statistics.fmean(p["reasoner_tokens"] for p in per),
                "reasoner_tokens_spent_per_game": statistics.fmean(p["reasoner_tokens_spent"] for p in per),
                "peak_context": max(p["peak_context"] for p in per),
            }
            if budget is not None:  # won on no more reasoner tokens than long context spent on that game
                row[c]["success_at_long_context_cost"] = statistics.fmean(
                    float(bool(d[g]["won"]) and d[g]["reasoner_tokens"] <= budget[g]["reasoner_tokens"])
                    for d in draws.values()
                    for g in own
                )
        table[variant] = row
    paired: dict[str, Any] = {}
    for a, b in PAIRS:
        if a not in evals or b not in evals:
            continue
        entry = {}
        keys = list(evals[a]) if len(evals[a]) >= len(evals[b]) else list(evals[b])  # the trained side's draws
        sides = [(of_draw(evals[a], draw), of_draw(evals[b], draw)) for draw in keys]
        for c in groups:
            both = [g for g in chosen[c] if all(g in mine and g in other for mine, other in sides)]
            if len(both) < 2:
                entry[c] = None
                continue
            rows = [[mine[g]["won"] - other[g]["won"] for g in both] for mine, other in sides]
            entry[c] = {
                **two_level_interval(rows),
                "games": len(both),
                "per_draw_interval": [task_level_interval([r]) for r in rows],
            }
        paired[f"{a}-{b}"] = entry
    return {"table": table, "paired": paired}


def played_games(records: Records) -> dict[str, dict[str, dict[str, Any]]]:
    """Every recorded test game's result, by variant and draw (the evaluation chunks read once; dev draws left out)."""
    played: dict[str, dict[str, dict[str, Any]]] = {}
    eval_root = records.root / "eval"
    for path in sorted(eval_root.glob("**/*.json")):  # eval/<draw>/<variant>/<chunk>, an RL draw sft<k>/rl<j>
        draw, variant = path.parent.parent.relative_to(eval_root).as_posix(), path.parent.name
        if not draw.startswith("dev-"):
            played.setdefault(variant, {}).setdefault(draw, {}).update(json.loads(path.read_text())["result"]["games"])
    return played


def finished_so_far(played: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Per variant and draw, over the test games its finished evaluation chunks cover (:func:`played_games`): games,
    success, reasoner tokens per game (a stopped run's partial figures; unpaired, the variants may cover different
    games)."""
    return {
        variant: {
            draw: {
                "games": len(games),
                "success": sum(g["won"] for g in games.values()) / len(games),
                "reasoner_tokens_per_game": sum(g["reasoner_tokens"] for g in games.values()) / len(games),
            }
            for draw, games in draws.items()
        }
        for variant, draws in played.items()
    }


def figures_of_finished_draws(
    records: Records, played: dict[str, dict[str, dict[str, Any]]], rl_test_games: int = 0
) -> dict[str, Any] | None:
    """:func:`figures` over the draws whose evaluation chunks cover every game their variant plays (every test game;
    an RL variant's, the first ``rl_test_games`` when set): a stopped run's paired figures, from its records alone
    (``played`` is :func:`played_games`); None before the test games are recorded."""
    if not records.path("games/test").exists():
        return None
    names = list(json.loads(records.path("games/test").read_text())["result"]["z8_sha256"])  # in play order
    rl_names = set(names[: rl_test_games or None])
    evals = {
        variant: finished
        for variant, draws in played.items()
        if (
            finished := {
                d: games
                for d, games in draws.items()
                if (rl_names if variant in RL_VARIANTS else set(names)) <= games.keys()
            }
        )
    }
    cells = {g: game["cell"] for draws in evals.values() for games in draws.values() for g, game in games.items()}
    return figures(evals, names, cells) if evals else None


SELECT_GRID = (1e-4, 3e-4, 1e-3)


def select_lr(bench: TextWorldRun) -> dict[str, Any]:
    """OAT-GRPO from SFT seed 0 under each learning rate of :data:`SELECT_GRID`, evaluated on the dev games: the
    highest dev success wins (ties to the smaller rate). Every run and evaluation is a stage of its own."""
    dev = bench.games("dev", bench.args.dev_games)
    for lr in SELECT_GRID:  # first the runs no other process holds: two processes train two at once
        bench.rl("tree", 0, 0, lr, tag=f"select-lr{lr:g}-", elsewhere_ok=True)
    scores = {"sft": bench.dev_success("sam_sft", dev, lambda: bench.sft(0), bench.sft_weights(0))}
    for lr in SELECT_GRID:
        _, summary = bench.rl("tree", 0, 0, lr, tag=f"select-lr{lr:g}-")
        policy = lambda lr=lr: bench.rl("tree", 0, 0, lr, tag=f"select-lr{lr:g}-", weights=True)[0]  # noqa: E731
        scores[f"{lr:g}"] = bench.dev_success(f"select-lr{lr:g}", dev, policy, summary["weights"])
    best = max(SELECT_GRID, key=lambda lr: (scores[f"{lr:g}"], -lr))
    return {"lr": best, "dev_success": scores, "dev_games": len(dev), "grid": list(SELECT_GRID)}


def estimate_hours(records: Records, missing: dict[str, int], jobs: int = 1) -> dict[str, Any]:
    """Hours the missing stages will take, from the mean recorded seconds of stages of the same kind
    (:func:`stage_kind`): ``hours`` summed over the stages (each one process), ``wall_hours`` that sum spread over
    ``jobs`` processes (a lower bound: a stage waiting on another's result idles its process).
    ``untimed_stages`` counts those of a kind with no recorded stage yet (in neither)."""
    out: dict[str, Any] = {}
    total, untimed = 0.0, 0
    recorded = records.seconds_by_kind()
    for stages, count in missing.items():
        if not count:
            continue
        seen = recorded.get(stage_kind(stages), [])
        each = statistics.fmean(seen) if seen else None
        out[stages] = {"stages": count, "seconds_each": round(each, 1) if each is not None else None}
        total += (each or 0.0) * count
        untimed += count if each is None else 0
    out["hours"] = round(total / 3600, 2)
    out["wall_hours"] = round(total / 3600 / jobs, 2)
    out["jobs"] = jobs
    out["untimed_stages"] = untimed
    return out


def resume_arguments(argv: list[str]) -> list[str]:
    """The command's arguments without the sitting's own budget (``--max-minutes``, ``--max-stages``): the command
    that goes on with the run, whatever budget the next sitting gives it."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--max-minutes", "--max-stages"):
            skip = True
        elif not arg.startswith(("--max-minutes=", "--max-stages=")):
            out.append(arg)
    return out


def build_scale(args: argparse.Namespace) -> Scale:
    scale = replace(SMOKE if args.smoke else PREMISE)
    scale.cells = list(scale.cells)
    if args.model == "smollm2":
        scale = replace(scale, **smollm2_sft())
    for name in (
        "test_games",
        "sft_games",
        "sft_steps",
        "sft_seeds",
        "rl_seeds",
        "iterations",
        "tasks_per_iteration",
        "window",
        "max_steps",
        "rl_test_games",
    ):
        if getattr(args, name) is not None:
            setattr(scale, name, getattr(args, name))
    if args.cells:
        scale.cells = args.cells.split(",")
    return scale


def skipped_variants(text: str) -> tuple[str, ...]:
    """``--skip``'s value: trained variants a run leaves out (an unknown name is a usage error, exit 2)."""
    names = tuple(n for n in text.split(",") if n)
    unknown = [n for n in names if n not in TRAINED]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown variant {unknown[0]!r} (trained variants: {', '.join(TRAINED)})")
    return names


def at_least_one(flag: str, what: str) -> Callable[[str], int]:
    """The parser of ``flag``'s value: a whole number of ``what``, at least 1 (else a usage error naming the flag)."""

    def parse(text: str) -> int:
        if not text.isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be a whole number of {what}, at least 1, got {text!r}")
        return int(text)

    return parse


def run_name(text: str) -> str:
    if not text or "/" in text or text in (".", ".."):
        raise argparse.ArgumentTypeError(f"--run must be one path component, got {text!r}")
    return text


def parser() -> argparse.ArgumentParser:
    p = bench_parser(__doc__, seed=False)
    p.set_defaults(threads=max(1, min(2, os.cpu_count() or 1)))
    p.add_argument(
        "--sft-threads",
        type=at_least_one("--sft-threads", "threads"),
        default=None,
        help="torch CPU threads of the SFT stages (default: --threads). More than --threads pays when the other "
        "process waits for the same SFT seed, as when a new machine rebuilds it; the weights did not depend on it "
        "where measured, and a rebuild compares them with the record anyway",
    )
    p.add_argument("--smoke", action="store_true", help="small cells where long context sees everything")
    p.add_argument("--model", choices=("tiny", "smollm2", "none"), default="tiny", help="the memory model trained")
    p.add_argument("--engine", choices=("hf", "vllm"), default=None, help="default: hf (tiny), vllm (smollm2)")
    p.add_argument("--run", type=run_name, default=None, help="the records' folder name (default: from the settings)")
    p.add_argument("--records", default=str(ROOT / "docs" / "figures" / "textworld"), help="where runs' records go")
    p.add_argument("--work", default=str(ROOT / "runs" / "bench-textworld"), help="big artefacts (not committed)")
    p.add_argument("--game-cache", default=str(ROOT / ".cache" / "textworld"))
    p.add_argument("--model-cache", default=str(ROOT / ".cache" / "models"))
    p.add_argument("--reasoner-tokenizer", default="smollm2", help="smollm2, tiny or a tokenizer folder")
    p.add_argument("--chunk", type=int, default=25, help="games per evaluation stage")
    p.add_argument(
        "--sft-block-steps", type=int, default=16, help="SFT steps per stage (a sitting's checkpoint; 0: one stage)"
    )
    p.add_argument(
        "--rl-block-iterations", type=int, default=5, help="RL iterations per stage (a sitting; 0: one stage)"
    )
    p.add_argument(
        "--kv-cache-gib",
        type=float,
        default=2.0,
        help="vLLM's KV cache in GiB (the engine's CPU default, 0.25, holds 5,760 of SmolLM2's tokens)",
    )
    p.add_argument(
        "--rl-workers",
        type=int,
        default=0,
        help="rollout workers of the RL runs (Ray actors, each an engine on one thread; 2 uses both cores of a "
        "2-core machine); 0: the trees are built in this process",
    )
    p.add_argument(
        "--jobs",
        type=at_least_one("--jobs", "processes"),
        default=1,
        help="processes sharing the run's stages (2 on a 2-core machine: evaluation chunks two at a time, each "
        "engine generating on one thread; any other stage is computed by one while the others wait)",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--until", type=float, default=None, help=argparse.SUPPRESS)  # a worker's deadline (epoch s)
    p.add_argument("--max-minutes", type=float, default=90.0, help="start no stage past this many minutes")
    p.add_argument("--max-stages", type=int, default=None, help="stop after running this many stages")
    p.add_argument("--lr", type=float, default=None, help="RL learning rate (default: chosen on dev, see --select)")
    p.add_argument("--select", action="store_true", help="choose the RL learning rate on dev games first")
    p.add_argument("--dev-games", type=int, default=24, help="dev games for --select (over all cells)")
    p.add_argument(
        "--skip", type=skipped_variants, default=(), help=f"trained variants left out (of {', '.join(TRAINED)})"
    )
    p.add_argument("--cells", default=None, help="comma-separated challenge/size cells")
    for name, help_text in (
        ("test-games", "test games over all cells"),
        ("sft-games", "expert episodes distilled"),
        ("sft-steps", "SFT optimizer steps"),
        ("sft-seeds", "SFT seeds"),
        ("rl-seeds", "RL seeds under each SFT seed"),
        ("iterations", "RL iterations per run"),
        ("tasks-per-iteration", "games (one tree each) per RL iteration"),
        ("window", "the reasoner's window in its tokens"),
        ("max-steps", "game commands per episode"),
        ("rl-test-games", "test games the RL variants play, the first ones (0: all)"),
    ):
        p.add_argument(f"--{name}", type=int, default=None, help=f"{help_text} (default: the setting's)")
    return p


def main() -> None:
    global WORKER_TAG
    args = parser().parse_args()
    if args.worker:
        WORKER_TAG = f" w{args.worker_index}"
        die_with_parent()
    args.engine = args.engine or ("vllm" if args.model == "smollm2" else "hf")
    pin_threads(args.threads)
    from memrl.data.envs.ms_textworld import require_textworld

    require_textworld()
    scale = build_scale(args)
    try:
        require_fast_bf16(args.model, "the SFT and RL stages this command must train or rebuild")
    except UnfitMachine as exc:  # the stages already recorded, and those that train nothing, still run
        say(f"warning: {exc}")
    name = args.run or f"{'smoke' if args.smoke else 'premise'}-{args.model}"
    until = args.until if args.until is not None else time.time() + args.max_minutes * 60  # the workers' too
    records = Records(
        root=Path(args.records) / name,
        deadline=time.perf_counter() + (until - time.time()),
        max_stages=args.max_stages,
        ran=[],
        commit=git_commit(),
        claims=Claims(Path(args.work) / name / "claims"),
    )
    bench = TextWorldRun(args, scale, records, Path(args.work) / name)

    def stop_after_this_stage(signum: int, _frame: Any) -> None:
        if records.stop_requested:  # a second signal: stop now (the running stage is lost, no record is half-written)
            raise KeyboardInterrupt
        records.stop_requested = True
        for w in bench.workers:  # they stop after their running stage too
            if w.poll() is None:
                w.send_signal(signum)
        say(f"signal {signum}: stopping after the running stage (send it again to stop now)")

    signal.signal(signal.SIGTERM, stop_after_this_stage)
    signal.signal(signal.SIGINT, stop_after_this_stage)
    t_start = time.perf_counter()
    try:
        if args.jobs > 1 and not args.worker:
            bench.workers = start_workers(args.jobs, [f"--until={until}"])
        result = run(bench)
        wait_for(bench.workers, "textworld")
    except (RecordMismatch, UnfitMachine) as exc:
        say(str(exc))
        raise SystemExit(2) from None
    finally:
        stop_workers(bench.workers)  # left running only when this process failed
    if args.worker:
        return  # the stages it ran are recorded; the first process reports
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    result["stages_run"] = records.ran
    # a stopped sitting's status goes to status.json only: --json-out keeps the last complete result (a page's plot)
    # until the run, with the stages added since, completes again
    emit(result, args.json_out if result["complete"] else None)


def first_missing(stop: str, done: set[str], missing: dict[str, int]) -> str:
    """The stage this process stopped before, or, when another process has since recorded it, the first kind of
    stage still missing (``missing`` is in the order the stages run; the replay check comes last)."""
    if stop not in done:
        return stop
    return next((kind for kind, count in missing.items() if count), "replay")


def run(bench: TextWorldRun) -> dict[str, Any]:
    """Every stage in order (each read from its record when there is one); the figures when all are done, else
    what stopped, what is left and the hours it should take."""
    from memrl.data.io import atomic_write_text

    args, scale, records = bench.args, bench.scale, bench.records
    skip = set(args.skip) | (set(TRAINED) if args.model == "none" else set())
    variants = [*SCRIPTED, *(v for v in TRAINED if v not in skip)]
    chunks = -(-scale.test_games // args.chunk)
    rl_chunks = -(-min(scale.rl_test_games or scale.test_games, scale.test_games) // args.chunk)
    trains = "sam_sft" in variants or bool({"sam_oat", "sam_flat"} & set(variants))
    block, rl_block = args.sft_block_steps, args.rl_block_iterations
    todo: dict[str, int] = {"games/test": 1} if trains else {}  # every kind of stage and its count, in run order
    todo.update({f"eval/scripted/{v}": chunks for v in SCRIPTED})
    if "sam_untrained" in variants:
        todo["eval/base/sam_untrained"] = chunks
    if trains:
        todo.update({"games/sft": 1, "distill": 1})
    for k in range(scale.sft_seeds) if trains else []:
        todo[f"sft/seed{k}"] = 1 + len(sitting_ends(block, scale.sft_steps))  # its sittings
        if "sam_sft" in variants:
            todo[f"eval/sft{k}/sam_sft"] = chunks
    rl_variants = [(v, mode) for v, mode in RL_VARIANTS.items() if v in variants]
    rl_draws = {  # SFT seed k: its RL runs (variant, mode, RL seed j), trained, then evaluated, before seed k + 1's
        k: [(v, mode, j) for v, mode in rl_variants for j in range(scale.rl_seeds)] for k in range(scale.sft_seeds)
    }
    rl_stages = 1 + len(sitting_ends(rl_block, scale.iterations))  # a run's sittings and its summary
    if args.select:  # the learning rate's dev selection: its runs, then each model on the dev games
        todo["games/dev"] = 1
        todo.update({f"rl/select-lr{lr:g}-tree-sft0-rl0": rl_stages for lr in SELECT_GRID})
        dev_chunks = -(-args.dev_games // args.chunk)
        todo.update(
            {f"eval/dev-{tag}/sam_sft": dev_chunks for tag in ("sft", *(f"select-lr{lr:g}" for lr in SELECT_GRID))}
        )
    for k, runs in rl_draws.items():
        todo.update({f"rl/{mode}-sft{k}-rl{j}": rl_stages for _, mode, j in runs})
        todo.update({f"eval/sft{k}/rl{j}/{v}": rl_chunks for v, _, j in runs})
    config = {
        "scale": asdict(scale),
        "model": args.model,
        "engine": args.engine,
        "reasoner_tokenizer": args.reasoner_tokenizer,
        "variants": variants,
        "lr": args.lr if args.lr is not None else "chosen on dev (or the default)",
    }
    records.root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(records.root / "run.json", json.dumps(config, indent=1) + "\n")
    evals: dict[str, dict[str, dict[str, Any]]] = {}
    rl_runs: dict[str, Any] = {}
    selection: dict[str, Any] | None = None
    try:
        if args.select:
            selection = select_lr(bench)
        lr = args.lr if args.lr is not None else selection["lr"] if selection else DEFAULT_LR
        test = bench.games("test", scale.test_games)
        rl_test = test[: scale.rl_test_games or None]
        for v in SCRIPTED:
            evals[v] = {"scripted": bench.evaluate(v, "scripted", test, None, "scripted")}
        if "sam_untrained" in variants:
            evals["sam_untrained"] = {"base": bench.evaluate("sam_untrained", "base", test, bench.base_model, "base")}
        if "sam_sft" in variants:
            evals["sam_sft"] = {}
            for k in range(scale.sft_seeds):
                evals["sam_sft"][f"sft{k}"] = bench.evaluate(
                    "sam_sft", f"sft{k}", test, lambda k=k: bench.sft(k), bench.sft_weights(k)
                )
        for k, runs in rl_draws.items():  # a sitting that stops leaves whole seeds, not models a new machine retrains
            for _, mode, j in runs:  # first the runs no other process holds: two processes train two at once
                bench.rl(mode, k, j, lr, elsewhere_ok=True)
            for v, mode, j in runs:
                _, summary = bench.rl(mode, k, j, lr)
                policy = lambda mode=mode, k=k, j=j: bench.rl(mode, k, j, lr, weights=True)[0]  # noqa: E731
                rl_runs[f"{v}/sft{k}/rl{j}"] = summary
                evals.setdefault(v, {})[f"sft{k}/rl{j}"] = bench.evaluate(
                    v, f"sft{k}/rl{j}", rl_test, policy, summary["weights"]
                )
        replay = records.run("replay", {"games": [t.task_id for t in test]}, lambda: bench.replay_check(test))
    except Stopped as stop:
        if args.worker:
            return {"stopped_before": str(stop)}
        for w in bench.workers:  # their running stages are recorded before the status counts them
            w.wait()  # (a worker that failed is reported once the status is written)
        done = {p.relative_to(records.root).with_suffix("").as_posix() for p in records.root.glob("**/*.json")}
        played = played_games(records)
        missing: dict[str, int] = {}
        for kind, count in todo.items():
            have = sum(1 for d in done if d == kind or d.startswith(f"{kind}/"))
            missing[kind] = max(count - have, 0)
        status = {
            "benchmark": "textworld",
            "run": records.root.name,
            "complete": False,
            "stopped_before": first_missing(str(stop), done, missing),
            "stages_recorded": len(done),
            "remaining": estimate_hours(records, {k: v for k, v in missing.items() if v}, args.jobs),
            "finished_so_far": finished_so_far(played),
            "figures_of_finished_draws": figures_of_finished_draws(records, played, scale.rl_test_games),
            "command": "python -m benchmarks.textworld " + " ".join(resume_arguments(sys.argv[1:])),
        }
        atomic_write_text(records.root / "status.json", json.dumps(status, indent=1) + "\n")
        remaining = status["remaining"]
        untimed = f", and {remaining['untimed_stages']} of kinds not timed yet" if remaining["untimed_stages"] else ""
        say(
            f"stopped before {stop}: about {remaining['hours']} h of stages left{untimed}, at least "
            f"{remaining['wall_hours']} h of wall time with {args.jobs} process(es) (status.json)"
        )
        return status
    if args.worker:
        return {"complete": True}
    names = [t.task_id for t in test]
    cells = {t.task_id: t.horizon_label for t in test}
    out = {
        "benchmark": "textworld",
        "run": records.root.name,
        "complete": True,
        **config,
        "rl_lr": lr,
        "settings_chosen_on_dev": selection,
        **figures(evals, names, cells),
        "replay": replay,
        "rl_runs": rl_runs,
        "rebuilt_weights_differ": bench.rebuilt_differs,
        "records": {
            "games": names,
            "cells": cells,
            "won": {
                v: {d: [r[g]["won"] if g in r else None for g in names] for d, r in by.items()}
                for v, by in evals.items()
            },
            "reasoner_tokens": {
                v: {d: [r[g]["reasoner_tokens"] if g in r else None for g in names] for d, r in by.items()}
                for v, by in evals.items()
            },
        },
    }
    atomic_write_text(records.root / "result.json", json.dumps(out, indent=1) + "\n")
    atomic_write_text(
        records.root / "status.json",
        json.dumps({"benchmark": "textworld", "run": records.root.name, "complete": True}, indent=1) + "\n",
    )
    return out


if __name__ == "__main__":
    main()
