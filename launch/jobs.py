"""The table of config-driven ``memrl`` commands: each command's path, config model, runner and how it launches.

The CLI (launch/cli.py) builds its parser from it; ``memrl plan``, the launch layouts and the config reference read it
too, so it lives apart from the CLI and none of them imports the CLI.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["JOBS", "Job", "load_command_config"]


@dataclass(frozen=True)
class Job:
    """A config-driven command: ``memrl <path...> --config FILE [overrides]``."""

    path: tuple[str, ...]
    help: str
    config: str  # "module:Class" of its top-level config model
    runner: str  # "module:function" taking the validated config and returning an exit code (or None)
    resumable: bool = False
    # Whether it runs across processes (accelerate / torch.distributed); launchers start any other command once.
    distributed: bool = False
    # Whether it builds the trained policy's own vLLM engine (placement.policy) in its main process.
    policy_engine: bool = False
    flags: tuple[tuple[str, str, str], ...] = ()  # (--flag, dotted config key it overrides, help)
    dry_run: str | None = None  # "module:function" printing what the run needs (its --dry-run), or None
    checks: str | None = None  # "module:function" checking the validated config before anything is created

    def load(self, attr: str) -> Any:
        """Import ``module:name``."""
        module, name = getattr(self, attr).split(":")
        return getattr(importlib.import_module(module), name)

    def load_config(self, path: str | Path | None, overrides: Sequence[str] = ()) -> Any:
        """The command's validated config from ``path`` (a YAML file or a shipped recipe's name, None: the defaults)
        plus dotted overrides. Every command that reads a config loads it here: the config file's folder and the
        working directory go on the import path first, so components named by import path (``entry:
        "components:MyGame"``) resolve the same for ``config show``, ``plan`` and every job."""
        return load_command_config(self.load("config"), path, overrides)


def load_command_config(cls: type, path: str | Path | None, overrides: Sequence[str] = ()) -> Any:
    """``cls`` loaded from ``path`` and ``overrides`` (:func:`memrl.data.config.load_config`) with the config file's
    folder and the working directory on the import path (:func:`memrl.data.registry.add_search_path`)."""
    from memrl.data.config import config_file, load_config
    from memrl.data.registry import add_search_path

    add_search_path(*([config_file(path).parent] if path is not None else []), Path.cwd())
    return load_config(cls, path, overrides)


JOBS: list[Job] = [
    Job(
        ("quickstart",),
        "whole pipeline on the embedded default (tiny model, CPU)",
        "memrl.launch.quickstart:QuickstartConfig",
        "memrl.launch.quickstart:run_quickstart",
        policy_engine=True,
    ),
    Job(
        ("data", "synth"),
        "synthetic long-horizon episodes -> train/eval JSONL + Arrow",
        "memrl.data.synth:SynthConfig",
        "memrl.data.synth:run_synth",
    ),
    Job(
        ("data", "distill"),
        "run an expert memory model inside a memory system (SAM, the proactive agent, yours) -> SFT datasets per role",
        "memrl.rollout.expert_traces:DistillRunConfig",
        "memrl.rollout.expert_traces:run_distill",
        resumable=True,
        checks="memrl.rollout.expert_traces:check_inputs",
    ),
    Job(
        ("train", "oat-grpo"),
        "OAT-GRPO: memory-call trees, committee rewards, group policy updates, weight sync",
        "memrl.train.oat_grpo:OATGRPOConfig",
        "memrl.train.oat_grpo:run_oat_grpo",
        resumable=True,
        distributed=True,
        policy_engine=True,
        checks="memrl.train.oat_grpo:check_inputs",
    ),
    Job(
        ("sft",),
        "supervised fine-tuning on distilled memory-role datasets (TRL SFTTrainer, LoRA or full)",
        "memrl.train.sft:SFTRunConfig",
        "memrl.train.sft:run_sft",
        resumable=True,
        distributed=True,
        checks="memrl.train.sft:check_inputs",
    ),
    Job(
        ("train", "pivot-grpo"),
        "pivot-turn GRPO for the proactive intervention agent (online loop)",
        "memrl.train.pivot_grpo:PivotGRPOConfig",
        "memrl.train.pivot_grpo:run_pivot_grpo",
        resumable=True,
        distributed=True,
        policy_engine=True,
    ),
    Job(
        ("eval",),
        "harness: memory systems x memory models x datasets -> per-item results, breakdowns, report",
        "memrl.launch.evaluation.config:EvalConfig",
        "memrl.launch.evaluation.run:run_eval",
        resumable=True,
        dry_run="memrl.launch.evaluation.dry_run:dry_run_eval",
        checks="memrl.launch.evaluation.datasets:check_inputs",
    ),
    Job(
        ("export",),
        "merged Hugging Face checkpoint + model card, verified in transformers and vLLM",
        "memrl.train.export:ExportConfig",
        "memrl.train.export:run_export",
        checks="memrl.train.export:check_inputs",
        flags=(("--push-to-hub", "push_to_hub", "upload the export to this Hub repository (needs HF_TOKEN)"),),
    ),
]
