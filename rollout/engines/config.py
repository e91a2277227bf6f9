"""Engine configuration (``engine: {backend: vllm, model: ..., ...}``) and :func:`build_engine`.

One recipe runs on CPU with a tiny model and on GPUs with a real one: device-dependent settings (executor, eager mode,
chunked prefill, KV-cache size, CPU threads) default to ``None`` and are resolved by the backend for the platform it
finds. API keys never appear in a config: an endpoint names the environment variable that holds its key.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Literal

from pydantic import Field, model_validator

from data.config import ConfigError, ConfigModel, PolicyPlacement
from data.schemas import ScriptedPolicy
from rollout.engines.base import Engine

__all__ = ["EndpointConfig", "EngineConfig", "build_engine", "load_scripted_policy", "place_policy_engine"]


class EndpointConfig(ConfigModel):
    """One OpenAI-compatible endpoint (a ``vllm serve`` process, a gateway in front of frontier models).

    ``url`` is the API base (``http://host:8000/v1``). Rate limits are per endpoint; prices are in US dollars per
    million tokens (cached prompt tokens at ``cached_input_usd_per_mtok`` when set, else at the input price).
    """

    url: str = Field(min_length=1)
    model: str | None = None
    api_key_env: str | None = None
    max_concurrency: int = Field(8, ge=1)
    requests_per_minute: float | None = Field(None, gt=0)
    tokens_per_minute: float | None = Field(None, gt=0)
    input_usd_per_mtok: float = Field(0.0, ge=0)
    cached_input_usd_per_mtok: float | None = Field(None, ge=0)
    output_usd_per_mtok: float = Field(0.0, ge=0)


class EngineConfig(ConfigModel):
    """How to build one engine (the policy, the frozen reasoner, a committee member, a judge, an expert).

    ``model`` is a checkpoint path or hub id for ``vllm``/``hf`` and the served model name for ``openai`` (used when
    an endpoint names none). ``tokenizer`` defaults to ``model`` for ``vllm``/``hf``; for ``openai`` it switches on
    token-in/token-out completions, for ``scripted`` token accounting. Settings left at ``None`` take the platform's
    default in the backend (on CPU: in-process vLLM, eager mode, 256 MiB of KV cache, no chunked prefill, one torch
    thread while generating). ``prefix_cache_*`` size the scripted backend's simulated vLLM prefix cache.
    """

    backend: Literal["vllm", "hf", "openai", "scripted"]
    name: str | None = None
    model: str | None = None
    tokenizer: str | None = None
    revision: str | None = None
    trust_remote_code: bool = False
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    max_model_len: int | None = Field(None, ge=16)
    seed: int = 0
    chat_template_kwargs: dict[str, Any] = {}

    # vllm
    tensor_parallel_size: int = Field(1, ge=1)
    kv_cache_memory_bytes: int | None = Field(None, gt=0)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    enable_prefix_caching: bool = True
    block_size: int | None = Field(None, ge=1)
    enable_lora: bool = False
    max_lora_rank: int = Field(16, ge=1)
    max_loras: int = Field(1, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    enforce_eager: bool | None = None
    enable_chunked_prefill: bool | None = None
    in_process: bool | None = None
    cpu_threads: int | None = Field(None, ge=1)
    sleep_level: Literal[0, 1, 2] = 0  # GPU: sleep mode on; the online loop puts the engine to sleep during updates
    cuda_devices: list[int] | None = None  # GPU ids of the engine's workers (placement 'separate'); default 0..TP-1

    # hf
    device: str | None = None
    batch_size: int = Field(64, ge=1)

    # openai
    endpoints: list[EndpointConfig] = []
    api: Literal["auto", "completions", "chat"] = "auto"
    request_timeout_s: float = Field(120.0, gt=0)
    deadline_s: float = Field(1800.0, gt=0)
    max_retries: int = Field(6, ge=0)
    backoff_base_s: float = Field(0.5, ge=0)
    backoff_max_s: float = Field(30.0, ge=0)

    # scripted
    scripted_policy: str | None = None
    scripted_kwargs: dict[str, Any] = {}
    prefix_cache_block_size: int = Field(16, ge=1)
    prefix_cache_tokens: int = Field(1 << 22, ge=1)

    @model_validator(mode="after")
    def _backend_needs(self) -> EngineConfig:
        if self.backend in ("vllm", "hf") and not self.model:
            raise ValueError(f"backend {self.backend!r} needs 'model' (a local path or hub id)")
        if self.backend == "openai" and not self.endpoints:
            raise ValueError("backend 'openai' needs at least one entry in 'endpoints'")
        if self.backend == "openai" and self.api == "completions" and not self.tokenizer:
            raise ValueError("api 'completions' sends token ids: set 'tokenizer'")
        if self.prefix_cache_tokens < self.prefix_cache_block_size:
            raise ValueError("prefix_cache_tokens must hold at least one block of prefix_cache_block_size tokens")
        if self.cuda_devices is not None and len(self.cuda_devices) != self.tensor_parallel_size:
            raise ValueError(
                f"cuda_devices lists {len(self.cuda_devices)} GPU(s), "
                f"tensor_parallel_size is {self.tensor_parallel_size}"
            )
        if self.cuda_devices is not None and self.in_process:
            raise ValueError("cuda_devices needs the engine in its own process: set in_process to false")
        if self.sleep_level == 2 and self.enable_lora:
            raise ValueError("sleep_level 2 drops the base weights a LoRA policy serves from: use sleep_level 1")
        return self

    @property
    def engine_name(self) -> str:
        """The label results carry in ``GenerationResult.engine``."""
        return self.name or self.backend


def place_policy_engine(engine: EngineConfig, placement: PolicyPlacement, *, gpu: bool | None = None,
                        local_world_size: int | None = None) -> EngineConfig:
    """The policy's rollout engine under ``placement.policy`` (see docs/cluster.md).

    The main process owns the engine. ``colocate``: its workers share GPUs 0..TP-1 with the training ranks there and
    sleep at ``sleep_level`` during updates (GPU only). ``separate``: its workers take the first TP GPUs after the
    node's ``local_world_size`` training processes. A value set both here and on the engine must agree; a value set
    on the engine only is kept. Non-vLLM engines are returned unchanged. ``gpu`` defaults to whether CUDA is
    available, ``local_world_size`` to torchrun's ``LOCAL_WORLD_SIZE``.
    """
    if engine.backend != "vllm":
        return engine
    if gpu is None:
        import torch

        gpu = torch.cuda.is_available()
    if local_world_size is None:
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    wanted: dict[str, Any] = {
        "tensor_parallel_size": placement.tensor_parallel_size,
        "gpu_memory_utilization": placement.gpu_memory_utilization,
    }
    if gpu:  # on CPU vLLM has no sleep mode and no devices to pick
        separate = placement.mode == "separate"
        wanted["sleep_level"] = 0 if separate else placement.sleep_level
        wanted["cuda_devices"] = (
            list(range(local_world_size, local_world_size + placement.tensor_parallel_size)) if separate else None
        )
    chosen = {"sleep_level": "sleep_level", "cuda_devices": "mode"}
    update: dict[str, Any] = {}
    for key, value in wanted.items():
        in_placement = chosen.get(key, key) in placement.model_fields_set
        if key in engine.model_fields_set and not in_placement:
            continue
        if key in engine.model_fields_set and getattr(engine, key) != value:
            raise ConfigError(
                f"engine.{key}={getattr(engine, key)!r} contradicts placement.policy, which gives {value!r}: "
                "set it in one place"
            )
        update[key] = value
    return EngineConfig.model_validate({**engine.model_dump(exclude_unset=True), **update})


def load_scripted_policy(path: str, kwargs: dict[str, Any] | None = None) -> ScriptedPolicy:
    """Instantiate a scripted policy from an import path ``"package.module:Class"`` with keyword arguments."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"scripted_policy must look like 'package.module:Class', got {path!r}")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    policy = target(**(kwargs or {}))
    if not callable(getattr(policy, "respond", None)):
        raise TypeError(f"{path} does not implement ScriptedPolicy (no respond method)")
    return policy


def build_engine(cfg: EngineConfig, policy: ScriptedPolicy | None = None) -> Engine:
    """Build the engine ``cfg`` describes; ``policy`` supplies the scripted backend's agent programmatically."""
    if cfg.backend == "scripted":
        from rollout.engines.scripted import ScriptedEngine

        if policy is None:
            if not cfg.scripted_policy:
                raise ValueError("backend 'scripted' needs 'scripted_policy' in the config or a policy argument")
            policy = load_scripted_policy(cfg.scripted_policy, cfg.scripted_kwargs)
        return ScriptedEngine.from_config(cfg, policy)
    if policy is not None:
        raise ValueError(f"a policy object only applies to the scripted backend, not {cfg.backend!r}")
    if cfg.backend == "vllm":
        from rollout.engines.vllm_engine import VLLMEngine

        return VLLMEngine.from_config(cfg)
    if cfg.backend == "hf":
        from rollout.engines.hf_engine import HFEngine

        return HFEngine.from_config(cfg)
    from rollout.engines.openai_engine import OpenAIEngine

    return OpenAIEngine.from_config(cfg)
