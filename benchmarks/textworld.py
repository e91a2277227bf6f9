"""Microsoft TextWorld end to end: what does each memory system, and each stage of training SAM's memory model, do
for a frozen agent in games nobody here wrote? (issue 38)

Games: TextWorld's own challenges generated locally (``treasure_hunter``, ``coin_collector``, ``cooking``) at three
sizes each (``memrl.data.tasks.ms_textworld.MS_TEXTWORLD_SIZES``), the ``ms_textworld`` task family's disjoint seed
ranges (SFT data 0.., RL 100000.., dev 300000.., test 400000..). The agent is the family's frozen programmatic
reasoner (it sees the current observation, the admissible commands and what its memory gives it); success is
TextWorld's own ``won``; steps to win count game commands.

Variants, every one on the same test games (so differences are paired by game):

- ``no_memory``: the reasoner's own short context only (the most recent turns that fit 512 tokens, the few turns SAM
  keeps raw too);
- ``long_context``: the history truncated to the reasoner's window (2048 tokens);
- ``bm25``: SAM's paging with BM25 retrieval over the raw pages (``memory(intent)``);
- ``sam_expert``: SAM with the privileged expert as its memory model (the upper bound the memory model is distilled
  from);
- ``sam_untrained``, ``sam_sft``, ``sam_oat``, ``sam_flat``: SAM with the memory model untrained, after SFT on the
  expert's traces (rejection-sampled), after SFT + OAT-GRPO (trees branching at recalls), and after SFT + flat GRPO
  (vanilla GRPO over whole trajectories) at the same number of iterations, both with the recipe's dynamic sampling
  (up to ``max_extra_trees`` more games per iteration until one group's outcomes differ).

One memory model is trained across every cell of the run (``mix``): one SFT checkpoint, then OAT-GRPO and flat GRPO
from it under each training seed. Greedy evaluation (every memory call at temperature 0). Paired differences (OAT vs
SFT, vs flat, vs BM25, vs long context, ...) get the two-level interval of
:func:`memrl.rollout.evaluation.stats.two_level_interval` (training seeds and test games resampled; the wider of that
bootstrap and a seed-level t), overall and per cell; a variant that does not train has the same row under every seed.
The per-seed, per-game records are in the JSON (``records``: ``{games: [...], success: {variant: {seed: [...]}}}``).

Settings are chosen on dev only: ``--select`` runs OAT-GRPO under each learning rate of :data:`SELECT_GRID` on the
dev games (seed 0) and writes the winner to ``<work>/<quick|full>/selected_on_dev.json``, which a later run reads (and
reports); without it the run uses :data:`DEFAULT_LR` and says so.

Replay exactness (acceptance 4): every test game the expert played is replayed from ``reset`` through the adapter on
a new instance, with the logged commands, and every observation compared: the count of exact games is printed.

    python benchmarks/textworld.py --quick             # 2 cells x 8 test games, tiny model, 2 seeds (< 15 min)
    python benchmarks/textworld.py --quick --select    # choose the learning rate on dev first
    python benchmarks/textworld.py --model smollm2     # the powered setting: 9 cells x 30 test games, 3 seeds
    python benchmarks/textworld.py --quick --sft-steps 1500 --sft-games 96 --dev-games 12 --iterations 8 \
        --test-games 225 --seeds 3 --work runs/bench-textworld-powered   # the tiny model's powered run (--select first)
    python benchmarks/textworld.py --quick --model smollm2 --skip sam_untrained,sam_flat --sft-games 60 --sft-steps 16 \
        --iterations 2 --test-games 60 --seeds 3 --work runs/bench-textworld-smollm2   # SmolLM2, what one session held

``--seeds``, ``--test-games``, ``--cells``, ``--dev-games``, ``--sft-games``, ``--sft-steps`` and ``--iterations``
change one field of the chosen scale each (the JSON's ``scale`` records the result); a run at another scale needs its
own ``--work`` (the SFT checkpoint, RL runs and evaluations are cached by folder: reusing one exits 2, naming the
fields).

With ``--model smollm2`` the SFT stage takes the recipe's settings (:func:`smollm2_sft` reads them) at either
scale. ``--skip sam_untrained,sam_flat`` leaves those trained variants out where a budget cannot hold them (the
untrained SmolLM2 writes every cue and recall to its token limit; flat GRPO doubles the RL runs): the JSON's
``skipped`` names them and their comparisons are absent.

Everything is cached under ``--work`` (games under the shared game cache): a rerun skips finished stages, and a run
stopped part way loses little: evaluations are cached per chunk of :data:`EVAL_CHUNK` games (the batch one call plays
at once, so the same computation); distillation resumes at its next game, SFT and RL from their newest checkpoint
(every :data:`SFT_CHECKPOINT_EVERY` steps and :data:`RL_CHECKPOINT_EVERY` iterations); more ``--test-games``
evaluate only the chunks they change. So a run longer than one sitting is the same command run again. The last
line is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this file's folder heads sys.path and this file would shadow the textworld package it benchmarks.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
SCRIPTED = ("no_memory", "long_context", "bm25", "sam_expert")
MODELS = ("sam_untrained", "sam_sft", "sam_oat", "sam_flat")
PAIRS = (
    ("sam_oat", "sam_sft"),
    ("sam_flat", "sam_sft"),
    ("sam_oat", "sam_flat"),
    ("sam_sft", "sam_untrained"),
    ("sam_oat", "bm25"),
    ("sam_oat", "long_context"),
    ("sam_oat", "no_memory"),
    ("bm25", "no_memory"),
    ("long_context", "no_memory"),
    ("sam_expert", "sam_oat"),
)
SELECT_GRID = (1e-4, 3e-4, 1e-3)
DEFAULT_LR = 3e-4
# games played at once in one evaluation batch (evaluate_memory's tasks_per_batch), and the unit of its cache: a chunk
# is the batch a single call over all the games would run, so chunked results are the same computation
EVAL_CHUNK = 256
RL_CHECKPOINT_EVERY = 5  # RL iterations between checkpoints: a stopped RL run resumes from the newest
SFT_CHECKPOINT_EVERY = 250  # SFT steps between checkpoints, likewise
ALL_CELLS = [f"{c}/{s}" for c in ("treasure_hunter", "coin_collector", "cooking") for s in ("small", "medium", "large")]


@dataclass
class Scale:
    """How big a run is."""

    cells: list[str]
    test_games: int  # per cell
    dev_games: int  # per cell
    sft_games: int  # expert episodes distilled (over all cells)
    sft_steps: int
    sft_batch: int
    train_games: int  # RL training games (over all cells)
    iterations: int
    tasks_per_iteration: int
    seeds: int
    branch_factor: int = 2
    max_leaves: int = 4
    flat_group_size: int = 2
    # dynamic sampling, as the recipe (whose first run made no update without it): more trees until a batch holds
    # this many outcome-informative groups, or max_extra_trees more games were played
    informative_groups: int = 1
    max_extra_trees: int = 3
    max_steps: int = 60  # game commands per episode
    lr_sft: float = 2e-3
    max_length: int = 768


SKIPPABLE = ("sam_untrained", "sam_flat")


QUICK = Scale(
    cells=["treasure_hunter/small", "treasure_hunter/medium"],
    test_games=8,
    dev_games=4,
    sft_games=24,
    sft_steps=30,
    sft_batch=8,
    train_games=16,
    iterations=2,
    tasks_per_iteration=2,
    seeds=2,
    max_steps=40,
)
FULL = Scale(
    cells=ALL_CELLS,
    test_games=30,
    dev_games=12,
    sft_games=270,
    sft_steps=400,
    sft_batch=16,
    train_games=540,
    iterations=30,
    tasks_per_iteration=6,
    seeds=3,
    branch_factor=4,
    max_leaves=8,
    flat_group_size=4,
    max_steps=100,
)


def smollm2_sft() -> dict[str, Any]:
    """SmolLM2's SFT settings, read from its recipe (configs/textworld_smollm2.yaml: full weights, bf16): the tiny
    model's learning rate would wreck a pretrained model's weights in a few steps, and its chat template needs the
    longer rows."""
    from memrl.data.config import load_config
    from memrl.launch.quickstart import QuickstartConfig

    sft = load_config(QuickstartConfig, ROOT / "configs" / "textworld_smollm2.yaml").sft
    return {"lr_sft": sft.lr, "max_length": sft.max_length}


def say(message: str) -> None:
    print(f"[textworld] {message}", file=sys.stderr, flush=True)


def digest(path: Path) -> str:
    """A digest of a model folder's weights (evaluations are cached by it)."""
    h = hashlib.sha256()
    for f in sorted(path.glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


@dataclass
class Bench:
    """One run: its scale, where it works, the model it trains."""

    args: argparse.Namespace
    scale: Scale
    work: Path
    base: Path | None = None
    phases: dict[str, float] = field(default_factory=dict)

    # ------------------------------------------------------------------------------------------------ tasks
    def params(self) -> dict[str, Any]:
        return {"mix": list(self.scale.cells), "max_steps": self.scale.max_steps, "cache_dir": self.args.game_cache}

    def task_set(self, split: str, per_cell: int, total: int | None = None) -> Any:
        from memrl.data.tasks import TaskSetConfig
        from memrl.data.tasks.ms_textworld import MS_TEXTWORLD_SPLITS

        count = total if total is not None else per_cell * len(self.scale.cells)
        return TaskSetConfig(family="ms_textworld", params=self.params(), count=count, seed=MS_TEXTWORLD_SPLITS[split])

    def games(self, split: str, per_cell: int) -> list[Any]:
        from memrl.data.tasks import load_tasks

        return load_tasks(self.task_set(split, per_cell), split)

    def generate(self) -> dict[str, Any]:
        """Every game of the run, generated into the cache now (a bar per split), and how long it took."""
        from memrl.data.tracking import progress_bar

        t0 = time.perf_counter()
        counts = {}
        s = self.scale
        for split, n in (("test", s.test_games), ("dev", s.dev_games if self.args.select else 0)):
            tasks = self.games(split, n) if n else []
            for task in progress_bar(tasks, desc=f"games {split}", leave=False):
                task.record()
            counts[split] = len(tasks)
        if self.args.model != "none":
            from memrl.data.tasks import load_tasks

            for split, total in (("sft", s.sft_games), ("train", s.train_games)):
                tasks = load_tasks(self.task_set(split, 0, total), split)
                for task in progress_bar(tasks, desc=f"games {split}", leave=False):
                    task.record()
                counts[split] = len(tasks)
        return {"games": counts, "seconds": round(time.perf_counter() - t0, 1)}

    # ------------------------------------------------------------------------------------------------ engines
    def memory_config(self, name: str) -> dict[str, Any]:
        paging = {"page_turns": 1, "live_capacity_turns": 4, "keep_recent_turns": 3}
        if name == "no_memory":
            return {"name": "long_context", "window_tokens": 512}
        if name == "long_context":
            return {"name": "long_context", "window_tokens": 2048}
        if name == "bm25":
            return {"name": "bm25", **paging, "top_k": 2}
        return {
            "name": "sam",
            **paging,
            "max_cue_tokens": 64,
            "sampling": {
                "consolidate": {"temperature": 0.0, "max_tokens": 64},
                "recall": {"temperature": 1.0, "max_tokens": 96},
            },
        }

    def engine_config(self, name: str, model: Path) -> Any:
        """The engine serving ``model`` (the memory model in evaluation, the policy in RL): float32, and a
        4096-token context on vLLM."""
        from memrl.rollout.engines.config import EngineConfig

        backend = "vllm" if self.args.engine == "vllm" else "hf"
        return EngineConfig(
            backend=backend,
            name=name,
            model=str(model),
            dtype="float32",
            batch_size=64,
            max_model_len=4096 if backend == "vllm" else None,
        )

    def evaluate(self, variant: str, model: Path | None, tasks: list[Any], tag: str) -> dict[str, Any]:
        """Greedy success and steps per game of one variant, computed in chunks of :data:`EVAL_CHUNK` games, each
        cached by variant, weights and games: a stopped run resumes at its next unfinished chunk, and more test games
        (the list only grows at its end) evaluate only the chunks that changed."""
        from memrl.data.io import atomic_write_text

        weights = digest(model) if model is not None else "scripted"
        whole = self.cached(variant, weights, tasks, tag)
        if whole is not None:
            return whole
        parts = [tasks[start : start + EVAL_CHUNK] for start in range(0, len(tasks), EVAL_CHUNK)]
        results = [self.cached(variant, weights, part, tag) for part in parts]
        missing = [i for i, result in enumerate(results) if result is None]
        if missing:
            from memrl.data.experts.ms_textworld import TwOracle
            from memrl.rollout.engines.factory import build_engine
            from memrl.rollout.engines.scripted import ScriptedEngine

            if model is not None:
                memory = build_engine(self.engine_config("memory", model))
            else:
                memory = ScriptedEngine(TwOracle(), name="expert")
            try:
                for i in missing:
                    desc = f"eval {variant}" + (f" {i + 1}/{len(parts)}" if len(parts) > 1 else "")
                    results[i] = self.evaluate_chunk(variant, memory, parts[i], desc)
                    atomic_write_text(self.cache_path(variant, weights, parts[i], tag), json.dumps(results[i]))
                    self.phases[f"eval_{variant}"] = self.phases.get(f"eval_{variant}", 0.0) + results[i]["seconds"]
            finally:
                if model is not None:
                    memory.close()
        if len(parts) == 1:
            return results[0]
        games = {name: game for result in results for name, game in result["games"].items()}
        out: dict[str, Any] = {
            "success": statistics.fmean(game["won"] for game in games.values()),
            "games": games,
            "seconds": round(sum(result["seconds"] for result in results), 1),
        }
        twins = {result.get("same_weights_as") for result in results}
        if None not in twins:
            out["same_weights_as"] = ", ".join(sorted(twins))
        atomic_write_text(self.cache_path(variant, weights, tasks, tag), json.dumps(out))
        return out

    def cache_path(self, variant: str, weights: str, tasks: list[Any], tag: str) -> Path:
        return self.work / "evals" / f"{tag}-{variant}-{weights}-{len(tasks)}-{tasks[0].task_id}.json"

    def cached(self, variant: str, weights: str, tasks: list[Any], tag: str) -> dict[str, Any] | None:
        """The cached evaluation of these games, or None. The same weights on the same games under SAM (an RL run
        that made no update) are the same greedy computation: that result is reused and says where it came from."""
        from memrl.data.io import atomic_write_text

        path = self.cache_path(variant, weights, tasks, tag)
        if path.exists():
            return json.loads(path.read_text())
        if weights == "scripted":
            return None
        for twin in sorted((self.work / "evals").glob(f"*-{weights}-{len(tasks)}-{tasks[0].task_id}.json")):
            if any(f"-{name}-{weights}-" in twin.name for name in MODELS):
                out = {**json.loads(twin.read_text()), "same_weights_as": twin.stem}
                atomic_write_text(path, json.dumps(out))
                return out
        return None

    def evaluate_chunk(self, variant: str, memory: Any, tasks: list[Any], desc: str) -> dict[str, Any]:
        """One batch of games played greedily with ``memory`` as the memory model: per game won, cell and steps."""
        from memrl.data.tasks.ms_textworld import TwReasoner
        from memrl.rollout.engines.scripted import ScriptedEngine
        from memrl.rollout.evaluation.tasks import evaluate_memory
        from memrl.rollout.loop import EngineSet

        t0 = time.perf_counter()
        result = evaluate_memory(
            tasks,
            EngineSet(reasoner=ScriptedEngine(TwReasoner(), name="reasoner"), memory=memory),
            self.memory_config(variant),
            samples=0,
            tasks_per_batch=EVAL_CHUNK,
            progress=desc,
        )
        games = {}
        for r in result["records"]:
            games[r["episode_id"]] = {
                "won": float(r["outcome"] or 0.0),
                "cell": r["horizon"],
                "steps": r["stats"].get("env_steps"),
                "reasoner_tokens": r["reasoner_tokens"]["spent"],
                "peak_context": r["peak_context_tokens"],
            }
        return {"success": result["success_greedy"], "games": games, "seconds": round(time.perf_counter() - t0, 1)}

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

    def sft(self) -> Path:
        """Distil the expert on the SFT games (rejection sampling: won episodes only), then SFT: one checkpoint."""
        from memrl.data.config import RunConfig
        from memrl.rollout.expert_traces import DistillRunConfig, distill
        from memrl.train.policy import LoraSettings, PolicySpec
        from memrl.train.sft import SFTRunConfig, SFTTrainConfig, run_sft
        from memrl.train.sft_data import SFTDataConfig

        out = self.work / "sft" / "final"
        if (out / "config.json").exists():
            return out
        s, base = self.scale, self.base_model()
        t0 = time.perf_counter()
        distill(
            DistillRunConfig(
                run=RunConfig(
                    output_dir=str(self.work), name="distill", seed=0, resume=(self.work / "distill").exists()
                ),
                tasks=self.task_set("sft", 0, s.sft_games),
                memory=self.memory_config("sam"),
                tokenizer=str(base),
            ),
            self.work / "distill",
        )
        self.phases["distill"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        run_sft(
            SFTRunConfig(
                run=RunConfig(output_dir=str(self.work), name="sft", seed=0, resume=(self.work / "sft").exists()),
                model=PolicySpec(base=str(base)),
                lora=LoraSettings(enabled=False),
                data=SFTDataConfig(
                    dir=str(self.work / "distill"),
                    roles={"consolidate": 0.5, "recall": 0.5},
                    mixture_rows=s.sft_steps * s.sft_batch,
                ),
                train=SFTTrainConfig(
                    max_steps=s.sft_steps,
                    batch_size=s.sft_batch,
                    lr=s.lr_sft,
                    warmup=0.05,
                    max_length=s.max_length,
                    save_steps=SFT_CHECKPOINT_EVERY,
                    save_total_limit=1,
                    logging_steps=10,
                    bf16=self.args.model == "smollm2",
                ),
            )
        )
        self.phases["sft"] = round(time.perf_counter() - t0, 1)
        return out

    def rl(self, mode: str, seed: int, lr: float, name: str) -> Path:
        """OAT-GRPO (``tree``) or flat GRPO (``flat``) from the SFT checkpoint under ``seed``; the final policy."""
        from memrl.data.config import RunConfig
        from memrl.data.run_dir import prepare_run_dir
        from memrl.data.tasks import TaskSetConfig
        from memrl.rollout.tree import TreeConfig
        from memrl.train.group_trainer import GroupTrainerConfig
        from memrl.train.oat_grpo import OATGRPOConfig, train_oat_grpo
        from memrl.train.online import LoopConfig
        from memrl.train.policy import LoraSettings, PolicySpec

        done = self.work / "rl" / f"{name}.json"
        if done.exists():
            return Path(json.loads(done.read_text())["policy_dir"])
        s, sft = self.scale, self.sft()
        cfg = OATGRPOConfig(
            # a run stopped part way continues from its newest checkpoint (every RL_CHECKPOINT_EVERY iterations)
            run=RunConfig(
                output_dir=str(self.work / "rl"), name=name, seed=seed, resume=(self.work / "rl" / name).exists()
            ),
            policy=PolicySpec(base=str(sft)),
            engine=self.engine_config("policy", sft),
            memory=self.memory_config("sam"),
            train_tasks=self.task_set("train", 0, s.train_games),
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
            trainer=GroupTrainerConfig(
                lr=lr,
                lora=LoraSettings(enabled=self.args.model == "smollm2"),
                bf16=self.args.model == "smollm2",
                seed=seed,  # each training seed draws its own fresh LoRA adapter
            ),
            loop=LoopConfig(
                iterations=s.iterations,
                eval_every=0,
                checkpoint_every=min(s.iterations, RL_CHECKPOINT_EVERY),
                keep_checkpoints=1,
            ),
            eval_samples=0,
        )
        t0 = time.perf_counter()
        result = train_oat_grpo(cfg, prepare_run_dir(cfg, cfg.run, "train-oat-grpo"))
        self.phases[f"rl_{mode}"] = self.phases.get(f"rl_{mode}", 0.0) + round(time.perf_counter() - t0, 1)
        history = result["history"]
        summary = {
            "policy_dir": result["policy_dir"],
            "updates": result["updates"],
            "iterations": result["iterations_run"],
            "lora": result["lora"],
            "informative_groups": sum(h.get("informative_groups", 0) for h in history),
            "extra_trees": sum(h.get("extra_trees", 0) for h in history),
            "trained_tokens": sum(h.get("trained_tokens", 0) for h in history),
            "reasoner_tokens": sum(h.get("reasoner_tokens", 0) for h in history),
            "success_train": [h.get("success") for h in history],
        }
        if result["lora"]:  # a LoRA policy: evaluate it merged on its base
            from memrl.train.export import ExportConfig, export_model

            merged = self.work / "rl" / f"{name}-merged"
            from memrl.train.export import VerifyConfig

            export_model(
                ExportConfig(
                    run=RunConfig(output_dir=str(self.work / "rl"), name=f"{name}-export"),
                    policy=PolicySpec(base=str(sft), adapter=result["policy_dir"]),
                    verify=VerifyConfig(vllm=False),
                ),
                merged,
            )
            summary["policy_dir"] = str(merged)
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text(json.dumps(summary))
        return Path(summary["policy_dir"])

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


def per_game(evals: dict[str, dict[int, dict[str, Any]]], games: list[str], seeds: list[int]) -> dict[str, Any]:
    """``{variant: {seed: [won per game]}}`` in one game order."""
    return {v: {str(s): [by_seed[s]["games"][g]["won"] for g in games] for s in seeds} for v, by_seed in evals.items()}


def figures(
    evals: dict[str, dict[int, dict[str, Any]]], games: list[str], cells: dict[str, str], seeds: list[int]
) -> dict[str, Any]:
    """Success and steps to win per variant and cell; paired differences with two-level intervals."""
    from memrl.rollout.evaluation.stats import two_level_interval

    table: dict[str, Any] = {}
    for variant, by_seed in evals.items():
        row: dict[str, Any] = {}
        for cell in [*sorted(set(cells.values())), "all"]:
            chosen = [g for g in games if cell in ("all", cells[g])]
            wins = [by_seed[s]["games"][g]["won"] for s in seeds for g in chosen]
            steps = [
                by_seed[s]["games"][g]["steps"]
                for s in seeds
                for g in chosen
                if by_seed[s]["games"][g]["won"] and by_seed[s]["games"][g]["steps"] is not None
            ]
            row[cell] = {
                "success": statistics.fmean(wins),
                "games": len(chosen),
                "steps_to_win": statistics.fmean(steps) if steps else None,
            }
        table[variant] = row
    paired: dict[str, Any] = {}
    for a, b in PAIRS:
        if a not in evals or b not in evals:
            continue
        entry = {}
        for cell in [*sorted(set(cells.values())), "all"]:
            chosen = [g for g in games if cell in ("all", cells[g])]
            rows = [[evals[a][s]["games"][g]["won"] - evals[b][s]["games"][g]["won"] for g in chosen] for s in seeds]
            entry[cell] = two_level_interval(rows) if len(chosen) > 1 else None
        paired[f"{a}-{b}"] = entry
    return {"table": table, "paired": paired}


# Scale fields that only add test or dev games or training seeds: every cached stage stays valid when they change.
ADDITIVE_FIELDS = ("test_games", "dev_games", "seeds")


def check_scale(work: Path, scale: Scale) -> None:
    """Exit 2 if ``work`` caches stages of another scale (its SFT checkpoint, RL runs and evaluations would be reused
    under the wrong settings); record the scale on a folder's first run."""
    path = work / "scale.json"
    wanted = {k: v for k, v in asdict(scale).items() if k not in ADDITIVE_FIELDS}
    if not path.exists():
        if any((work / stage).exists() for stage in ("sft", "rl", "evals")):
            say(f"{work} holds cached stages of an unrecorded scale: give this run its own --work")
            raise SystemExit(2)
        path.write_text(json.dumps(wanted, indent=1) + "\n")
        return
    cached = json.loads(path.read_text())
    changed = sorted(k for k in wanted.keys() | cached.keys() if wanted.get(k) != cached.get(k))
    if changed:
        detail = ", ".join(f"{k} {cached.get(k)!r} -> {wanted.get(k)!r}" for k in changed)
        say(f"{work} holds a run at another scale ({detail}): give this one its own --work")
        raise SystemExit(2)


def skipped_variants(text: str) -> tuple[str, ...]:
    """``--skip``'s value: trained variants a run leaves out (an unknown name is a usage error, exit 2)."""
    names = tuple(n for n in text.split(",") if n)
    unknown = [n for n in names if n not in SKIPPABLE]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown variant {unknown[0]!r} (skippable: {', '.join(SKIPPABLE)})")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 cells x 8 test games, tiny model, 2 seeds")
    parser.add_argument("--select", action="store_true", help="choose the RL learning rate on dev, then stop")
    parser.add_argument(
        "--model",
        choices=("tiny", "smollm2", "none"),
        default="tiny",
        help="the memory model trained (none: only the scripted variants)",
    )
    parser.add_argument("--engine", choices=("hf", "vllm"), default=None, help="default: hf (tiny), vllm (smollm2)")
    parser.add_argument("--seeds", type=int, default=None, help="training seeds (default: the scale's)")
    parser.add_argument("--test-games", type=int, default=None, help="test games per cell (default: the scale's)")
    parser.add_argument("--cells", default=None, help="comma-separated challenge/size cells (default: the scale's)")
    parser.add_argument("--dev-games", type=int, default=None, help="dev games per cell (default: the scale's)")
    parser.add_argument("--sft-games", type=int, default=None, help="expert episodes distilled (default: the scale's)")
    parser.add_argument("--sft-steps", type=int, default=None, help="SFT optimizer steps (default: the scale's)")
    parser.add_argument("--iterations", type=int, default=None, help="RL iterations per run (default: the scale's)")
    parser.add_argument(
        "--skip",
        type=skipped_variants,
        default=(),
        help=f"comma-separated trained variants left out to fit a budget (of {', '.join(SKIPPABLE)}); the JSON says so",
    )
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench-textworld"))
    parser.add_argument("--game-cache", default=str(ROOT / ".cache" / "textworld"))
    parser.add_argument("--model-cache", default=str(ROOT / ".cache" / "models"))
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args()
    args.engine = args.engine or ("vllm" if args.model == "smollm2" else "hf")

    import torch

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    from memrl.data.envs.ms_textworld import require_textworld

    require_textworld()
    scale = QUICK if args.quick else FULL
    if args.model == "smollm2":
        scale = replace(scale, **smollm2_sft())
    if args.seeds is not None:
        scale.seeds = args.seeds
    if args.test_games is not None:
        scale.test_games = args.test_games
    if args.cells:
        scale.cells = args.cells.split(",")
    for name in ("dev_games", "sft_games", "sft_steps", "iterations"):
        if getattr(args, name) is not None:
            setattr(scale, name, getattr(args, name))
    work = Path(args.work) / ("quick" if args.quick else "full") / args.model
    work.mkdir(parents=True, exist_ok=True)
    check_scale(work, scale)
    bench = Bench(args, scale, work)
    t_start = time.perf_counter()
    load = os.getloadavg()[0]
    say(f"generating games into {args.game_cache} (cached across runs)")
    generated = bench.generate()
    say(f"games ready in {generated['seconds']:.0f} s: {generated['games']}")
    selection_path = work / "selected_on_dev.json"

    if args.select:
        dev = bench.games("dev", scale.dev_games)
        sft = bench.sft()
        scores = {"sft": bench.evaluate("sam_sft", sft, dev, "dev")["success"]}
        for lr in SELECT_GRID:
            policy = bench.rl("tree", 0, lr, f"select-oat-lr{lr:g}")
            scores[f"{lr:g}"] = bench.evaluate("sam_oat", policy, dev, "dev")["success"]
            say(f"dev: OAT-GRPO at lr {lr:g}: {scores[f'{lr:g}']:.1%} (SFT {scores['sft']:.1%})")
        best = max(SELECT_GRID, key=lambda lr: (scores[f"{lr:g}"], -lr))
        selection = {
            "lr": best,
            "dev_success": scores,
            "dev_games": len(dev),
            "grid": list(SELECT_GRID),
            "rule": "highest dev success of OAT-GRPO (seed 0); ties to the smaller lr",
        }
        selection_path.write_text(json.dumps(selection, indent=2) + "\n")
        print(json.dumps({"benchmark": "textworld", "select": selection}))
        return

    selection = json.loads(selection_path.read_text()) if selection_path.exists() else None
    lr = selection["lr"] if selection else DEFAULT_LR
    if selection is None and args.model != "none":
        say(f"no dev selection in {selection_path}: OAT/flat at lr {DEFAULT_LR:g} (not chosen on dev)")
    test = bench.games("test", scale.test_games)
    names = [t.task_id for t in test]
    cells = {t.task_id: t.horizon_label for t in test}
    seeds = list(range(scale.seeds))
    evals: dict[str, dict[int, dict[str, Any]]] = {}
    for variant in SCRIPTED:
        result = bench.evaluate(variant, None, test, "test")
        evals[variant] = dict.fromkeys(seeds, result)
        say(f"{variant}: {result['success']:.1%} ({result['seconds']:.0f} s)")
    rl_runs: dict[str, Any] = {}
    if args.model != "none":
        if "sam_untrained" not in args.skip:
            untrained = bench.evaluate("sam_untrained", bench.base_model(), test, "test")
            evals["sam_untrained"] = dict.fromkeys(seeds, untrained)
            say(f"untrained: {untrained['success']:.1%}")
        sft = bench.sft()
        sft_eval = bench.evaluate("sam_sft", sft, test, "test")
        evals["sam_sft"] = dict.fromkeys(seeds, sft_eval)
        say(f"SFT: {sft_eval['success']:.1%}")
        sft_weights = digest(sft)
        for variant, mode in (("sam_oat", "tree"), ("sam_flat", "flat")):
            if variant in args.skip:
                continue
            evals[variant] = {}
            for seed in seeds:
                policy = bench.rl(mode, seed, lr, f"{mode}-s{seed}")
                evals[variant][seed] = bench.evaluate(variant, policy, test, f"test-s{seed}")
                run = json.loads((work / "rl" / f"{mode}-s{seed}.json").read_text())
                run["same_weights_as_sft"] = digest(policy) == sft_weights
                rl_runs[f"{variant}/{seed}"] = run
                say(f"{variant} seed {seed}: {evals[variant][seed]['success']:.1%} ({run['updates']} updates)")
                if run["same_weights_as_sft"]:
                    say(f"{variant} seed {seed} kept the SFT weights: its differences from SFT measure nothing")
    replay = bench.replay_check(test)
    say(
        f"replay re-entry exact on {replay['exact']} of {replay['games']} test games "
        f"({replay['commands_replayed']} commands replayed)"
    )
    out = {
        "benchmark": "textworld",
        "quick": args.quick,
        "model": args.model,
        "engine": args.engine,
        "scale": asdict(scale),
        "lr": lr,
        "skipped": sorted(args.skip),
        "settings_chosen_on_dev": selection,
        **figures(evals, names, cells, seeds),
        "replay": replay,
        "rl_runs": rl_runs,
        "records": {
            "games": names,
            "cells": cells,
            "success": per_game(evals, names, seeds),
            "steps": {
                v: {str(s): [by[s]["games"][g]["steps"] for g in names] for s in seeds} for v, by in evals.items()
            },
        },
        "generated": generated,
        "phases_s": bench.phases,
        "wall_s": round(time.perf_counter() - t_start, 1),
        "load_average_start": round(load, 1),
        "load_average_end": round(os.getloadavg()[0], 1),
    }
    text = json.dumps(out)
    (work / "result.json").write_text(text + "\n")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
