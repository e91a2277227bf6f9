"""Engine configuration (``engine: {backend: vllm, model: ..., ...}``) and :func:`build_engine`.

One recipe runs on CPU with a tiny model and on GPUs with a real one: device-dependent settings (executor, eager mode,
chunked prefill, KV-cache size, CPU threads) default to ``None`` and are resolved by the backend for the platform it
finds. API keys never appear in a config: an endpoint names the environment variable that holds its key.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from memrl.data.config import ConfigError, ConfigModel, EndpointURL, PolicyPlacement, ServedModel
from memrl.data.schemas import ScriptedPolicy
from memrl.rollout.engines.base import unknown_backend

__all__ = [
    "RETRY_SETTINGS",
    "EndpointConfig",
    "EngineConfig",
    "load_scripted_policy",
    "place_policy_engine",
    "scripted_policy_class",
    "served_engine",
]

# How an HTTP engine retries (EngineConfig keys, OpenAIEngine keywords): one attempt's timeout, the whole call's
# deadline, the retries per sample and the jittered exponential backoff's first and longest wait.
RETRY_SETTINGS = ("request_timeout_s", "deadline_s", "max_retries", "backoff_base_s", "backoff_max_s")


class EndpointConfig(ConfigModel):
    """One OpenAI-compatible endpoint (a ``vllm serve`` process, a gateway in front of frontier models).

    ``url`` is the API base (``http://host:8000/v1``). Rate limits are per endpoint; prices are in US dollars per
    million tokens (cached prompt tokens at ``cached_input_usd_per_mtok`` when set, else at the input price).
    """

    url: EndpointURL  # API base, e.g. http://host:8000/v1
    model: str | None = None  # served model name; None: the engine's model
    api_key_env: str | None = None  # environment variable holding the API key; None: no key
    max_concurrency: int = Field(8, ge=1)  # requests in flight at once
    requests_per_minute: float | None = Field(None, gt=0)  # request rate limit; None: unlimited
    tokens_per_minute: float | None = Field(None, gt=0)  # token rate limit (prompt + output); None: unlimited
    input_usd_per_mtok: float = Field(0.0, ge=0)  # USD per million prompt tokens
    cached_input_usd_per_mtok: float | None = Field(None, ge=0)  # cached prompt; None: input price
    output_usd_per_mtok: float = Field(0.0, ge=0)  # USD per million completion tokens


class EngineConfig(ConfigModel):
    """How to build one engine (the policy, the frozen reasoner, a committee member, a judge, an expert).

    ``model`` is a checkpoint path or hub id for ``vllm``/``hf`` and the served model name for ``openai`` (used when
    an endpoint names none). ``tokenizer`` defaults to ``model`` for ``vllm``/``hf``; for ``openai`` it switches on
    token-in/token-out completions, for ``scripted`` token accounting. Settings left at ``None`` take the platform's
    default in the backend (on CPU: in-process vLLM, eager mode, 256 MiB of KV cache, no chunked prefill, one torch
    thread while generating). ``prefix_cache_*`` size the scripted backend's simulated vLLM prefix cache.
    """

    backend: str  # vllm, hf (transformers), openai (HTTP), scripted, or a registered engine (name or import path)
    name: str | None = None  # label in results and logs; None: the backend name
    model: str | None = None  # checkpoint path or hub id; openai: the served model name
    tokenizer: str | None = None  # tokenizer path or hub id; None: model's (vllm, hf)
    revision: str | None = None  # hub revision (branch, tag, commit) of model and tokenizer
    trust_remote_code: bool = False  # allow the checkpoint's custom code
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # weight dtype (vllm, hf); auto: the checkpoint's
    max_model_len: int | None = Field(None, ge=16)  # context length in tokens (prompt + output); None: the model's
    seed: int = Field(0, ge=0, lt=2**32)  # seed of the per-sample seeds of unseeded requests
    chat_template_kwargs: dict[str, Any] = {}  # extra chat-template arguments (e.g. enable_thinking)

    # vllm
    tensor_parallel_size: int = Field(1, ge=1)  # vLLM tensor-parallel size (GPUs per engine)
    kv_cache_memory_bytes: int | None = Field(None, gt=0)  # vLLM KV-cache bytes; None: 256 MiB on CPU
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)  # GPU memory share (if no kv_cache_memory_bytes)
    enable_prefix_caching: bool = True  # vLLM automatic prefix caching
    block_size: int | None = Field(None, ge=1)  # vLLM KV-cache block size in tokens; None: vLLM's
    enable_lora: bool = False  # serve LoRA adapters (a LoRA policy's rollouts)
    max_lora_rank: int = Field(16, ge=1)  # largest LoRA rank vLLM can serve
    max_loras: int = Field(1, ge=1)  # LoRA adapters vLLM holds at once
    max_num_seqs: int | None = Field(None, ge=1)  # vLLM sequences per batch at most; None: vLLM's
    enforce_eager: bool | None = None  # no CUDA graphs; None: on CPU only
    enable_chunked_prefill: bool | None = None  # vLLM chunked prefill; None: off on CPU, vLLM's default on GPU
    in_process: bool | None = None  # vLLM engine core in this process; None: on CPU only
    cpu_threads: int | None = Field(None, ge=1)  # torch threads while generating; None: 1 in-process on CPU
    sleep_level: Literal[0, 1, 2] = 0  # GPU: sleep mode on; the online loop puts the engine to sleep during updates
    cuda_devices: list[int] | None = None  # GPU ids of the engine's workers (placement 'separate'); default 0..TP-1
    weight_transfer: Literal["nccl"] | None = None  # GPU: receive full weights by NCCL broadcast; None: reload

    # hf
    device: str | None = None  # hf device; None: cuda if available, else cpu
    batch_size: int = Field(64, ge=1, le=2**16)  # hf: rows decoded together at most
    continuous_batching: bool = True  # hf: rows join and leave the running batch between steps (else generate())

    # openai (the retry settings: RETRY_SETTINGS)
    endpoints: list[EndpointConfig] = []
    api: Literal["auto", "completions", "chat"] = "auto"  # chat, or completions (token ids); auto: by tokenizer
    request_timeout_s: float = Field(120.0, gt=0)  # timeout of one HTTP attempt, seconds
    deadline_s: float = Field(1800.0, gt=0)  # deadline of a whole generate call, seconds
    max_retries: int = Field(6, ge=0)  # retries per sample after a retryable failure
    backoff_base_s: float = Field(0.5, ge=0)  # first retry backoff, doubled per attempt (jittered), seconds
    backoff_max_s: float = Field(30.0, ge=0)  # longest retry backoff, seconds

    # scripted
    scripted_policy: str | None = None  # import path "package.module:Class" of the scripted policy
    scripted_kwargs: dict[str, Any] = {}  # keyword arguments of the scripted policy
    prefix_cache_block_size: int = Field(16, ge=1)  # block size (tokens) of the simulated prefix cache
    prefix_cache_tokens: int = Field(1 << 22, ge=1)  # capacity (tokens) of the simulated prefix cache

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, backend: str) -> str:
        if error := unknown_backend(backend):
            raise ValueError(error)
        return backend

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

    def load_tokenizer(self) -> Any:
        """The tokenizer ``tokenizer`` names, else ``model``'s (None when neither is set), with the config's
        ``trust_remote_code`` and ``revision``."""
        name = self.tokenizer or self.model
        if not name:
            return None
        from memrl.rollout.models import load_tokenizer

        return load_tokenizer(name, trust_remote_code=self.trust_remote_code, revision=self.revision)

    @classmethod
    def vllm(cls, name: str, model: str | os.PathLike[str], **settings: Any) -> EngineConfig:
        """A vLLM engine named ``name`` on the checkpoint ``model``, in float32 (the dtype the CPU backend runs and
        memrl's default for the policy's engine); ``settings``: any other keys."""
        return cls(backend="vllm", name=name, model=str(model), dtype="float32", **settings)

    def engine_settings(self) -> dict[str, Any]:
        """What every backend's engine takes from its config: the label its results carry, the seed of its samples
        and the chat template's keywords."""
        return {"name": self.engine_name, "seed": self.seed, "chat_template_kwargs": self.chat_template_kwargs}

    def retry_settings(self) -> dict[str, Any]:
        """The HTTP retry settings (:data:`RETRY_SETTINGS`) as the OpenAI engine's keyword arguments."""
        return self.model_dump(include=set(RETRY_SETTINGS))

    @property
    def engine_name(self) -> str:
        """The label results carry in ``GenerationResult.engine``."""
        return self.name or self.backend


def place_policy_engine(
    engine: EngineConfig, placement: PolicyPlacement, *, gpu: bool | None = None, local_world_size: int | None = None
) -> EngineConfig:
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
    placement_key = {"cuda_devices": "mode"}  # the placement field each engine value comes from, when named apart
    update: dict[str, Any] = {}
    for key, value in wanted.items():
        in_placement = placement_key.get(key, key) in placement.model_fields_set
        if key in engine.model_fields_set and not in_placement:
            continue
        if key in engine.model_fields_set and getattr(engine, key) != value:
            raise ConfigError(
                f"engine.{key}={getattr(engine, key)!r} contradicts placement.policy, which gives {value!r}: "
                "set it in one place"
            )
        update[key] = value
    return EngineConfig.model_validate({**engine.model_dump(exclude_unset=True), **update})


def scripted_policy_class(path: str) -> Any:
    """The class a ``scripted_policy`` names (a registered reasoner or an import path), checked against the protocol
    (``respond``) without constructing it: a :class:`~memrl.data.registry.ComponentError` names what is wrong."""
    import memrl.data.tasks  # noqa: F401 - registers the built-in reasoners
    from memrl.data.registry import REASONERS, check_protocol, is_entry

    if not (is_entry(path) or path in REASONERS):
        raise ConfigError(
            f"scripted_policy {path!r}: not a registered reasoner ({', '.join(REASONERS.names())}) "
            f"nor an import path 'package.module:Class'"
        )
    target = REASONERS.get(path).obj
    check_protocol(target, "reasoner", methods=("respond",))
    return target


def load_scripted_policy(path: str, kwargs: dict[str, Any] | None = None) -> ScriptedPolicy:
    """Instantiate a scripted policy (a reasoner registered with ``@register_reasoner``, by name: ``sam``,
    ``action_agent``, ...; or any class by import path ``"package.module:Class"``) with keyword arguments."""
    return scripted_policy_class(path)(**(kwargs or {}))


def served_engine(served: ServedModel, client: EngineConfig | None, name: str) -> EngineConfig:
    """An ``openai`` engine on the endpoints of a placement entry; ``client``, when it is an ``openai`` engine config,
    lends its client settings (api, timeouts, retries, per-endpoint concurrency, chat template kwargs)."""
    if not served.endpoints:
        raise ConfigError(f"placement: {name} ({served.model}) lists no endpoints")
    client = client if client is not None and client.backend == "openai" else None
    template = client.endpoints[0] if client is not None else EndpointConfig(url=served.endpoints[0])
    endpoints = [
        template.model_copy(update={"url": url, "model": served.model, "api_key_env": served.api_key_env})
        for url in served.endpoints
    ]
    if client is not None:
        return client.model_copy(update={"name": name, "model": served.model, "endpoints": endpoints})
    return EngineConfig(backend="openai", name=name, model=served.model, endpoints=endpoints)
