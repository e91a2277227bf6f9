"""Loading the trainable policy (full weights or a PEFT LoRA adapter) and computing token log-probs.

Shared by SFT, the group trainer and export, so a policy is described the same way everywhere: a base model plus an
optional adapter directory.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from pydantic import Field

from memrl.data.config import ConfigModel
from memrl.data.io import replace_folder, storage_guard
from memrl.rollout.models import load_causal_lm, load_tokenizer

__all__ = ["LoraSettings", "PolicySpec", "load_policy", "response_logprobs", "save_policy"]


class LoraSettings(ConfigModel):
    """PEFT LoRA settings (``enabled: false`` trains full weights)."""

    enabled: bool = True  # train a LoRA adapter; false: full weights
    r: int = 16  # LoRA rank
    alpha: int = 32  # LoRA alpha (scale alpha / r)
    dropout: float = 0.0  # LoRA dropout
    target_modules: list[str] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="names of the modules LoRA adapts",
    )


class PolicySpec(ConfigModel):
    """Where a policy starts: a base checkpoint (path or hub id) and optionally a LoRA adapter trained on it."""

    base: str  # base checkpoint: local path or hub id
    adapter: str | None = None  # LoRA adapter directory to start from; None: a fresh one (or full weights)
    dtype: str = "float32"  # torch dtype the weights load in (float32, bfloat16, ...)
    trust_remote_code: bool = False  # allow the checkpoint's custom modelling code


def load_policy(
    spec: PolicySpec, lora: LoraSettings, *, trainable: bool = True, init_seed: int | None = None
) -> tuple[Any, Any]:
    """(model, tokenizer): the base, with the spec's adapter loaded (trainable) or a fresh LoRA when ``lora``
    is enabled and no adapter is given; plain full weights otherwise. ``init_seed`` draws a fresh adapter's initial
    weights from that seed (the global torch RNG is left as it was); None draws them from the global RNG."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model

    from memrl.data.checks import check_adapter_dir, check_model_ref

    check_model_ref(spec.base, "policy base")  # a missing local path is named, never taken for a hub id
    if spec.adapter:
        check_adapter_dir(spec.adapter, "policy adapter")
    tokenizer = load_tokenizer(spec.base, trust_remote_code=spec.trust_remote_code)
    model = load_causal_lm(spec.base, dtype=spec.dtype, trust_remote_code=spec.trust_remote_code)
    if spec.adapter:
        model = PeftModel.from_pretrained(model, spec.adapter, is_trainable=trainable)
    elif lora.enabled:
        config = LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules),
            task_type="CAUSAL_LM",
        )
        with torch.random.fork_rng(devices=[], enabled=init_seed is not None):
            if init_seed is not None:
                torch.manual_seed(init_seed)
            model = get_peft_model(model, config)
    return model, tokenizer


def save_policy(model: Any, out_dir: str | Path, tokenizer: Any | None = None, state_dict: Any = None) -> Path:
    """Save an adapter (PEFT) or full weights as safetensors into ``out_dir``, atomically: the files are written into
    a temporary sibling folder that replaces ``out_dir`` once complete, so a policy folder (a rollout engine's
    ``policy/vNNNNN``, SFT's ``final``) is whole or absent. A write the storage refuses is a
    :class:`~memrl.data.io.StorageError` naming the folder, with the temporary folder removed."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    extra = {}
    if len(getattr(model, "peft_config", {})) > 1:  # a frozen reference adapter rides along: save the trained one
        extra["selected_adapters"] = [model.active_adapter]
    with storage_guard(out.parent, f"policy weights {out.name}", cleanup=[tmp]):
        model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict, **extra)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        tmp.chmod(0o755)  # mkdtemp's 0700 would keep a served engine running as another user out
        replace_folder(tmp, out)
    return out


def response_logprobs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of every next token: ``out[:, t] = log p(input_ids[:, t + 1] | input_ids[:, :t + 1])``.

    Returns ([B, T-1] log-probs, [B, T-1] entropies or None). Computed in fp32 from the raw logits (temperature 1),
    the same definition the engines report for sampled tokens.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    log_norm = torch.logsumexp(logits, dim=-1)
    chosen = torch.gather(logits, -1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    logprobs = chosen - log_norm
    entropy = None
    if with_entropy:
        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)
            entropy = log_norm - (probs * logits).sum(-1)
    return logprobs, entropy
