"""``memrl eval --dry-run``: the files and endpoints an evaluation needs, and whether they are there."""

from __future__ import annotations

import os
from pathlib import Path

from memrl.launch.evaluation.config import EvalConfig
from memrl.launch.evaluation.datasets import dataset_path
from memrl.rollout.engines.config import EngineConfig

__all__ = ["dry_run_eval"]


def _engine_lines(role: str, engine: EngineConfig | None, default: str) -> list[str]:
    if engine is None:
        return [f"  {role}: {default} (offline, no endpoint)"]
    if engine.backend == "openai":
        lines = []
        for ep in engine.endpoints:
            key = ep.api_key_env
            state = "no key" if key is None else f"key from ${key} ({'set' if os.environ.get(key) else 'NOT SET'})"
            lines.append(f"  {role}: OpenAI-compatible endpoint {ep.url} model {ep.model or engine.model!r}, {state}")
        if engine.tokenizer is not None:
            found = Path(engine.tokenizer).expanduser().exists()
            lines.append(f"    tokenizer {engine.tokenizer} ({'found' if found else 'NOT FOUND locally (a hub id?)'})")
        return lines or [f"  {role}: openai backend WITHOUT endpoints"]
    if engine.backend in ("vllm", "hf"):
        model = engine.model or "?"
        where = "local directory" if Path(model).expanduser().exists() else "NOT FOUND locally (a hub id?)"
        return [f"  {role}: in-process {engine.backend} engine on {model} ({where})"]
    return [f"  {role}: scripted policy {engine.scripted_policy or '(default)'}"]


def dry_run_eval(cfg: EvalConfig) -> int:
    """``memrl eval --dry-run``: print the files and endpoints the evaluation needs (and whether they are there)
    without loading data or calling a model."""
    lines = [f"memrl eval (dry run): run directory {Path(cfg.run.output_dir) / (cfg.run.name or 'eval')}", "files:"]
    missing = 0
    for spec in cfg.datasets:
        path = dataset_path(spec, cfg.data_dir)
        if path is None:
            lines.append(f"  {spec.name} ({spec.kind}): generated, no file")
            continue
        found = path.is_file()
        missing += not found
        lines.append(f"  {spec.name} ({spec.kind}): {path} ({'found' if found else 'NOT FOUND'})")
    lines.append("models and endpoints:")
    for model in cfg.models:
        lines += _engine_lines(f"memory model {model.name!r}", model.engine, "scripted extractive model")
        if model.adapter:
            found = Path(model.adapter).expanduser().is_dir()
            missing += not found
            lines.append(f"    LoRA adapter {model.adapter} ({'found' if found else 'NOT FOUND'})")
    lines += _engine_lines("reasoner", cfg.reasoner, "programmatic reader")
    lines += _engine_lines("judge", cfg.judge, "lexical judge")
    lines.append("systems: " + ", ".join(s.name for s in cfg.systems))
    if missing:
        lines.append(f"{missing} file(s) missing")
    print("\n".join(lines))
    return 0
