"""``memrl export``: a trained memory model as a self-contained Hugging Face checkpoint, verified before it is shared.

Steps: (1) when ``push_to_hub`` is set, check first that a token (``HF_TOKEN``) is in the environment and that the Hub
answers, and fail with a clear message before any work otherwise; (2) load the policy: a LoRA adapter is merged into
its base (PEFT ``merge_and_unload``), full weights are taken as they are; (3) write safetensors weights, the
tokenizer with its chat template, the generation config and a model card (``README.md``) recording the base model,
the recipe (the training run's resolved config, when given) and evaluation results (a results / summary JSON, when
given); (4) verify: the export loads in transformers and generates, loads in the vLLM engine (``memrl.rollout.engines``)
and generates, and its weights differ from the base's (the adapter's base, or ``reference_base`` for full weights);
(5) upload the folder with ``huggingface_hub``. Everything is written into a temporary sibling folder that is renamed
into place only when complete, so a failed or killed export leaves no half-written model behind; the files it reads
(policy, recipe, results) are checked before any work starts (:func:`check_inputs`). ``export_model`` is the
in-process entry point and returns the verification record, also written to ``memrl_export.json`` in the export.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field

from memrl.data.config import ConfigError, ConfigModel, RunConfig
from memrl.data.io import atomic_write_text, storage_guard
from memrl.data.run_dir import prepare_run_dir
from memrl.train.policy import PolicySpec

__all__ = [
    "ExportConfig",
    "VerifyConfig",
    "check_hub_access",
    "check_inputs",
    "export_model",
    "run_export",
    "weight_difference",
]

log = logging.getLogger(__name__)

TOKEN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


class VerifyConfig(ConfigModel):
    """What the export is checked with."""

    transformers: bool = True  # check the export generates in transformers
    vllm: bool = True  # check the export generates in vLLM
    prompt: str = "where is the red key?"  # user message of the generation checks
    max_new_tokens: int = Field(8, ge=1)  # tokens generated (greedy) per check
    vllm_kv_cache_memory_bytes: int | None = Field(256 << 20, gt=0, description="None: vLLM's platform default")
    vllm_max_model_len: int | None = Field(1024, ge=16)  # vLLM context length of the check; None: the model's
    vllm_gpu_memory_utilization: float = Field(0.9, gt=0, le=1)  # GPU memory share (if no vllm_kv_cache_memory_bytes)


class ExportConfig(ConfigModel):
    """Everything ``memrl export`` needs."""

    command: Literal["export"] = "export"  # the command this config is for
    run: RunConfig = RunConfig()
    policy: PolicySpec
    output: str | None = None  # the export directory (default: <run dir>/model)
    dtype: Literal["float32", "bfloat16", "float16"] | None = None  # weights' dtype (None: policy.dtype)
    reference_base: str | None = None  # full weights only: the model training started from (for the differ check)
    recipe: str | None = None  # the training run's resolved config (YAML), recorded in the model card
    results: str | None = None  # evaluation results (summary JSON), recorded in the model card
    model_name: str | None = None  # the card's title
    license: str | None = None  # license in the model card (e.g. apache-2.0); None: none
    max_shard_size: str = "5GB"  # largest safetensors shard, e.g. 5GB
    verify: VerifyConfig = VerifyConfig()
    push_to_hub: str | None = None  # a Hub repository id (``user/name``); also ``--push-to-hub REPO``
    private: bool = True  # a pushed Hub repository is private


# ----------------------------------------------------------------------------------------------------------------
# Hub access


def _token() -> str | None:
    for name in TOKEN_ENV:
        value = os.environ.get(name)
        if value:
            return value
    return None


def check_hub_access(repo: str) -> str:
    """The token for ``repo`` once the Hub has accepted it; raises :class:`ConfigError` (no token, offline mode, no
    network, token refused) before any export work is done."""
    if "/" not in repo or repo.startswith("/") or repo.endswith("/"):
        raise ConfigError(f"--push-to-hub {repo!r}: expected a repository id like 'user/model-name'")
    token = _token()
    if token is None:
        raise ConfigError(
            f"--push-to-hub {repo}: no Hugging Face token: set HF_TOKEN in the environment (a token with write "
            "access); nothing was exported"
        )
    from huggingface_hub import HfApi

    try:
        HfApi(token=token).whoami()
    except Exception as exc:  # offline mode, DNS / connection errors and 401s all mean the same to the user here
        raise ConfigError(
            f"--push-to-hub {repo}: cannot reach the Hugging Face Hub with this token ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}); check the network, HF_HUB_OFFLINE and the "
            "token; nothing was exported"
        ) from None
    return token


# ----------------------------------------------------------------------------------------------------------------
# Export


def weight_difference(model_dir: str | Path, base: str | Path, dtype: str = "float32") -> dict[str, Any]:
    """How the exported weights differ from ``base``'s: tensors compared, tensors changed and the largest absolute
    difference (the base is loaded with transformers; the export is read tensor by tensor from its safetensors)."""
    import torch
    from safetensors import safe_open

    from memrl.rollout.models import load_causal_lm

    reference = load_causal_lm(base, dtype=dtype).state_dict()
    compared = changed = 0
    largest = 0.0
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 - safe_open is not a mapping
                if name not in reference:
                    continue
                ours = fh.get_tensor(name).to(torch.float32)
                theirs = reference[name].to(torch.float32)
                compared += 1
                if ours.shape != theirs.shape:
                    changed += 1
                    largest = float("inf")
                    continue
                diff = float((ours - theirs).abs().max()) if ours.numel() else 0.0
                changed += diff > 0
                largest = max(largest, diff)
    return {
        "base": str(base),
        "tensors_compared": compared,
        "tensors_changed": changed,
        "max_abs_diff": largest,
        "differs": changed > 0,
    }


def _generate_transformers(model_dir: Path, prompt: str, max_new_tokens: int) -> dict[str, Any]:
    import torch

    from memrl.rollout.models import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir, dtype="float32")
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(
            **inputs, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
    ids = out[0, inputs["input_ids"].shape[1] :].tolist()
    return {"ok": len(ids) > 0, "token_ids": ids, "text": tokenizer.decode(ids, skip_special_tokens=True)}


def _generate_vllm(model_dir: Path, cfg: VerifyConfig) -> dict[str, Any]:
    from memrl.data.schemas import Message
    from memrl.rollout.engines.base import GenerationRequest, SamplingParams
    from memrl.rollout.engines.config import EngineConfig
    from memrl.rollout.engines.factory import build_engine

    engine = build_engine(
        EngineConfig.vllm(
            "export-check",
            model_dir,
            kv_cache_memory_bytes=cfg.vllm_kv_cache_memory_bytes,
            max_model_len=cfg.vllm_max_model_len,
            gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
            enable_prefix_caching=False,
        )
    )
    try:
        request = GenerationRequest(
            messages=[Message(role="user", content=cfg.prompt)],
            sampling=SamplingParams(temperature=0.0, max_tokens=cfg.max_new_tokens, seed=0),
        )
        result = engine.generate([request])[0]
    finally:
        engine.close()
    completion = result.completions[0]
    return {"ok": len(completion.response_ids) > 0, "token_ids": list(completion.response_ids), "text": completion.text}


def _flatten(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(obj, dict):
        out: list[tuple[str, Any]] = []
        for key, value in obj.items():
            out += _flatten(value, f"{prefix}.{key}" if prefix else str(key))
        return out
    if isinstance(obj, (int, float)) and not isinstance(obj, bool):
        return [(prefix, obj)]
    return []


def render_model_card(cfg: ExportConfig, merged: bool, checks: dict[str, Any], name: str) -> str:
    """The model card: front matter, base model, recipe, evaluation results, verification and usage."""
    base = cfg.policy.base
    front = {
        "library_name": "transformers",
        "pipeline_tag": "text-generation",
        "base_model": base,
        "tags": ["memrl", "memory-model", "safetensors"],
    }
    if cfg.license:
        front["license"] = cfg.license
    lines = [
        "---",
        yaml.safe_dump(front, sort_keys=False).rstrip(),
        "---",
        "",
        f"# {name}",
        "",
        "A memory model trained with memrl: a small LLM that serves as the memory of a long-horizon agent whose "
        "reasoner stays frozen.",
        "",
        "## Base model",
        "",
        f"- base: `{base}`",
    ]
    if cfg.policy.adapter:
        lines.append(f"- LoRA adapter `{cfg.policy.adapter}` merged into the base (PEFT `merge_and_unload`)")
    else:
        lines.append(
            "- full fine-tuned weights" + (f" (started from `{cfg.reference_base}`)" if cfg.reference_base else "")
        )
    lines += ["", "## Recipe", ""]
    if cfg.recipe:
        text = Path(cfg.recipe).read_text(encoding="utf-8")
        lines += [
            f"The training run's resolved config (`{Path(cfg.recipe).name}`):",
            "",
            "```yaml",
            text.rstrip(),
            "```",
        ]
    else:
        lines.append("No training config was given to the export.")
    lines += ["", "## Evaluation results", ""]
    if cfg.results:
        data = json.loads(Path(cfg.results).read_text(encoding="utf-8"))
        flat = _flatten(data)
        if flat:
            lines += [f"From `{Path(cfg.results).name}`:", "", "| metric | value |", "|---|---|"]
            lines += [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in flat]
        else:
            lines.append(f"`{Path(cfg.results).name}` holds no numeric results.")
    else:
        lines.append("No evaluation results were given to the export.")
    lines += ["", "## Verification", "", "| check | result |", "|---|---|"]
    for key in ("transformers", "vllm"):
        check = checks.get(key)
        lines.append(
            f"| loads and generates in {key} | "
            + ("skipped" if check is None else ("yes" if check["ok"] else "NO"))
            + " |"
        )
    diff = checks.get("differs_from_base")
    lines.append(
        "| weights differ from the base | "
        + (
            "not checked"
            if diff is None
            else (
                f"{'yes' if diff['differs'] else 'NO'} ({diff['tensors_changed']}/{diff['tensors_compared']} tensors, "
                f"max abs diff {diff['max_abs_diff']:.3g})"
            )
        )
        + " |"
    )
    lines += [
        "",
        "## Usage",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        'tokenizer = AutoTokenizer.from_pretrained("PATH_OR_REPO")',
        'model = AutoModelForCausalLM.from_pretrained("PATH_OR_REPO")',
        "```",
        "",
        "Or serve it with vLLM: `vllm serve PATH_OR_REPO`.",
        "",
    ]
    return "\n".join(lines)


def check_inputs(cfg: ExportConfig) -> None:
    """Before any work: the recipe and results files exist and parse, the reference base is a model, and the export
    folder is writable and not already holding files (the policy paths are checked by the generic preflight)."""
    from memrl.data.checks import check_existing_file, check_model_ref, check_output_dir

    readers: list[tuple[str, str | None, str, Any, type[Exception], str]] = [
        ("recipe", cfg.recipe, "recipe (resolved config YAML)", yaml.safe_load, yaml.YAMLError, "readable YAML"),
        ("results", cfg.results, "results JSON", json.loads, json.JSONDecodeError, "valid JSON"),
    ]
    for key, file, what, parse, error, kind in readers:
        if file:
            check_existing_file(file, key, what=what)
            try:
                parse(Path(file).read_text(encoding="utf-8"))
            except (error, UnicodeDecodeError) as exc:
                raise ConfigError(f"{key}: {file} is not {kind} ({exc})") from None
    if cfg.reference_base:
        check_model_ref(cfg.reference_base, "reference_base")
    if cfg.output:
        check_output_dir(cfg.output, "output")
        _check_export_target(Path(cfg.output), "output")


def _check_export_target(path: Path, what: str) -> None:
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ConfigError(f"{what}: {path} already exists and is not empty; choose another output or remove it")


def export_model(cfg: ExportConfig, out_dir: str | Path) -> dict[str, Any]:
    """Merge (or take) the weights, write the Hugging Face folder and model card into ``out_dir``, verify it, and
    return the verification record. Hub access is checked by the caller before this runs. The folder is assembled
    under a temporary name beside ``out_dir`` and renamed into place only when complete."""
    final = Path(out_dir)
    _check_export_target(final, "export folder")
    tmp = final.parent / f".{final.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with storage_guard(final.parent, f"export {final.name}", cleanup=[tmp]):  # a full disk: one clear line
        checks = _export_into(cfg, tmp, final)
        if final.exists():
            final.rmdir()
        os.replace(tmp, final)
    return checks


def _export_into(cfg: ExportConfig, out: Path, final: Path) -> dict[str, Any]:
    import torch

    from memrl.train.policy import LoraSettings, load_policy

    start = time.perf_counter()
    spec = cfg.policy.model_copy(update={"dtype": cfg.dtype or cfg.policy.dtype})
    model, tokenizer = load_policy(spec, LoraSettings(enabled=False), trainable=False)
    merged = spec.adapter is not None
    if merged:
        model = model.merge_and_unload()
    model.eval()
    with torch.no_grad():
        model.save_pretrained(out, safe_serialization=True, max_shard_size=cfg.max_shard_size)
    tokenizer.save_pretrained(out)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"the tokenizer of {spec.base} has no chat template: the export would not be usable as a "
            "memory model (chat prompts)"
        )
    del model
    leftovers = sorted(p.name for p in out.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".pkl"))
    if leftovers:
        raise RuntimeError(f"pickled weights in the export: {leftovers}")
    checks: dict[str, Any] = {"merged_adapter": merged, "base": spec.base, "adapter": spec.adapter}
    reference = spec.base if merged else cfg.reference_base
    checks["differs_from_base"] = weight_difference(out, reference) if reference else None
    if cfg.verify.transformers:
        checks["transformers"] = _generate_transformers(out, cfg.verify.prompt, cfg.verify.max_new_tokens)
    if cfg.verify.vllm:
        checks["vllm"] = _generate_vllm(out, cfg.verify)
    failures = [k for k in ("transformers", "vllm") if checks.get(k) is not None and not checks[k]["ok"]]
    diff = checks["differs_from_base"]
    if diff is not None and not diff["differs"]:
        failures.append("differs_from_base")
    name = cfg.model_name or (cfg.push_to_hub or final.name)
    atomic_write_text(out / "README.md", render_model_card(cfg, merged, checks, name))
    checks.update(path=str(final), ok=not failures, failures=failures, export_s=round(time.perf_counter() - start, 2))
    atomic_write_text(out / "memrl_export.json", json.dumps(checks, indent=2, sort_keys=True) + "\n")
    return checks


def push_export(out_dir: str | Path, repo: str, token: str, private: bool) -> str:
    """Upload the export folder to the Hub repository ``repo`` (created if missing); returns its URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo, private=private, exist_ok=True)
    api.upload_folder(folder_path=str(out_dir), repo_id=repo, commit_message="memrl export")
    return f"https://huggingface.co/{repo}"


def run_export(cfg: ExportConfig) -> int:
    """``memrl export``: check Hub access first (when pushing), export, verify, upload; non-zero when a check
    fails."""
    token = check_hub_access(cfg.push_to_hub) if cfg.push_to_hub else None
    run_dir = prepare_run_dir(cfg, cfg.run, "export")
    out = Path(cfg.output) if cfg.output else run_dir / "model"
    checks = export_model(cfg, out)
    for key in ("transformers", "vllm"):
        if checks.get(key) is not None:
            log.info(f"[export] {key}: {'ok' if checks[key]['ok'] else 'FAILED'} -> {checks[key]['text']!r}")
    if checks["differs_from_base"] is not None:
        d = checks["differs_from_base"]
        log.info(
            f"[export] weights differ from {d['base']}: {d['differs']} ({d['tensors_changed']}/"
            f"{d['tensors_compared']} tensors, max abs diff {d['max_abs_diff']:.3g})"
        )
    if not checks["ok"]:
        log.info(f"[export] verification FAILED: {', '.join(checks['failures'])}; not uploading")
        return 1
    if cfg.push_to_hub and token is not None:
        log.info(f"[export] uploaded to {push_export(out, cfg.push_to_hub, token, cfg.private)}")
    log.info(f"[export] written to {out}")
    return 0
