"""The ``hf`` backend: transformers ``generate`` behind the engine interface (debugging, models vLLM cannot load).

Requests are expanded to one row per sample and batched with left padding (rows with the same sampling settings share
a ``generate`` call). Sampling is done by a logits processor that draws each row with its own ``torch.Generator``
seeded by :func:`~memrl.rollout.engines.base.sample_seed`, so a sample does not depend on which other rows share its
batch (up to floating-point effects of padding). The same processor sees the raw logits first, so it records the
log-prob
of the sampled token under the raw distribution (log-softmax of unprocessed logits, temperature 1, no top-k/top-p):
the definition every backend and the trainer use. End-of-sequence tokens (the tokenizer's and the generation
config's) and stop strings end a row as in vLLM. On CPU, generation runs with one torch thread unless ``cpu_threads``
says otherwise (see :func:`~memrl.rollout.engines.base.torch_threads`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from memrl.rollout.engines.base import (
    Completion,
    Engine,
    EngineError,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    Usage,
    find_stop,
    register_engine,
    request_prompt_ids,
    sample_seed,
    torch_threads,
)
from memrl.rollout.engines.config import EngineConfig

__all__ = ["HFEngine"]


class _SeededSampler(LogitsProcessor):
    """Draw one token per row with the row's own generator; record its raw log-prob; force ``generate`` to take it."""

    def __init__(self, seeds: list[int], sp: SamplingParams, device: torch.device) -> None:
        self.generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]
        self.temperature, self.top_p, self.top_k = sp.temperature, sp.top_p, sp.top_k
        self.chosen_logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        logits = scores.float()
        if self.temperature == 0:
            chosen = logits.argmax(-1)
        else:
            x = logits / self.temperature
            if 0 < self.top_k < x.shape[-1]:
                kth = torch.topk(x, self.top_k, dim=-1).values[:, -1:]
                x = x.masked_fill(x < kth, -math.inf)
            if self.top_p < 1.0:
                sorted_x, order = torch.sort(x, dim=-1, descending=True)
                cum = torch.softmax(sorted_x, -1).cumsum(-1)
                drop = cum - torch.softmax(sorted_x, -1) >= self.top_p  # keep the smallest set reaching top_p
                x = x.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), -math.inf)
            probs = torch.softmax(x, -1)
            chosen = torch.cat([torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(self.generators)])
        self.chosen_logprobs.append(torch.log_softmax(logits, -1).gather(-1, chosen[:, None]).squeeze(-1))
        forced = torch.full_like(scores, -math.inf)
        return forced.scatter_(-1, chosen[:, None], 0.0)


@register_engine("hf")
class HFEngine(Engine):
    """A transformers causal LM and its tokenizer behind the engine interface."""

    greedy_is_deterministic = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        seed: int = 0,
        name: str = "hf",
        batch_size: int = 64,
        max_model_len: int | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        cpu_threads: int | None = None,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.seed = seed
        self.name = name
        self.batch_size = batch_size
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.max_model_len = max_model_len or int(getattr(model.config, "max_position_embeddings", 1 << 20))
        self.device = next(model.parameters()).device
        self.cpu_threads = cpu_threads if cpu_threads is not None or self.device.type != "cpu" else 1
        eos = model.generation_config.eos_token_id if model.generation_config is not None else None
        eos_ids = eos if isinstance(eos, list) else [eos]
        self.stop_ids = sorted({i for i in [*eos_ids, tokenizer.eos_token_id] if i is not None})
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        self._base = model

    @classmethod
    def from_config(cls, cfg: EngineConfig) -> HFEngine:
        """Load ``cfg.model`` (safetensors) and its tokenizer; device defaults to CUDA when available."""
        from memrl.rollout.models import load_causal_lm

        assert cfg.model is not None
        device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = load_causal_lm(
            cfg.model, dtype=cfg.dtype, device=device, trust_remote_code=cfg.trust_remote_code, revision=cfg.revision
        )
        return cls(
            model,
            cfg.load_tokenizer(),
            batch_size=cfg.batch_size,
            max_model_len=cfg.max_model_len,
            cpu_threads=cfg.cpu_threads,
            **cfg.engine_settings(),
        )

    # ------------------------------------------------------------------------------------------------------------
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Generate every sample of every request; rows with equal sampling settings are batched together."""
        if self.model is None:
            raise EngineError(f"{self.name}: the engine is closed")
        prompts = request_prompt_ids(requests, self.tokenizer, self.chat_template_kwargs, self.max_model_len, self.name)
        rows: dict[tuple[Any, ...], list[tuple[int, int, int]]] = {}
        for r, req in enumerate(requests):
            sp = req.sampling
            key = (sp.temperature, sp.top_p, sp.top_k, tuple(sp.stop), sp.ignore_eos, sp.logprobs)
            seed = self.request_seed(sp)
            rows.setdefault(key, []).extend((r, i, sample_seed(seed, i)) for i in range(sp.n))
        completions: list[list[Completion | None]] = [[None] * req.sampling.n for req in requests]
        for group in rows.values():
            sp = requests[group[0][0]].sampling
            for start in range(0, len(group), self.batch_size):
                chunk = group[start : start + self.batch_size]
                limits = [
                    min(requests[r].sampling.max_tokens, self.max_model_len - len(prompts[r])) for r, _, _ in chunk
                ]
                with torch_threads(self.cpu_threads):
                    outs = self._generate_rows([prompts[r] for r, _, _ in chunk], [s for _, _, s in chunk], limits, sp)
                for (r, i, _), completion in zip(chunk, outs, strict=True):
                    completions[r][i] = completion
        results = []
        for r, req in enumerate(requests):
            done = [c for c in completions[r] if c is not None]
            usage = Usage(
                prompt_tokens=len(prompts[r]) * req.sampling.n,
                completion_tokens=sum(len(c.response_ids) for c in done),
            )
            results.append(self._result(prompts[r], done, usage))
        return results

    @torch.inference_mode()
    def _generate_rows(
        self, prompts: list[list[int]], seeds: list[int], limits: list[int], sp: SamplingParams
    ) -> list[Completion]:
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention[row, width - len(ids) :] = 1
        sampler = _SeededSampler(seeds, sp, self.device)
        gen_cfg = GenerationConfig(
            do_sample=False,
            num_beams=1,
            max_new_tokens=max(limits),
            # [] (not None, which generate fills in from the model's generation config): no end-of-sequence stop
            eos_token_id=[] if sp.ignore_eos else self.stop_ids,
            pad_token_id=self.pad_id,
            stop_strings=list(sp.stop) or None,
        )
        out = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention.to(self.device),
            generation_config=gen_cfg,
            logits_processor=LogitsProcessorList([sampler]),
            tokenizer=self.tokenizer if sp.stop else None,
        )
        generated = out[:, width:].tolist()
        logprobs = torch.stack(sampler.chosen_logprobs, 1).tolist() if sampler.chosen_logprobs else []
        return [
            self._finish(generated[row], logprobs[row] if logprobs else [], limits[row], sp)
            for row in range(len(prompts))
        ]

    def _finish(self, ids: list[int], logprobs: list[float], limit: int, sp: SamplingParams) -> Completion:
        finish = "length"
        end = len(ids)
        if not sp.ignore_eos:
            for j, token in enumerate(ids):
                if token in self.stop_ids:
                    end, finish = j + 1, "stop"
                    break
        if end > limit:
            end, finish = limit, "length"
        ids = ids[:end]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = find_stop(text, sp.stop)
        if cut is not None:
            end = self._stop_prefix(ids, sp.stop)
            ids, text, finish = ids[:end], text[:cut], "stop"
        return Completion(
            response_ids=ids,
            logprobs=[float(x) for x in logprobs[: len(ids)]] if sp.logprobs else [],
            text=text,
            finish_reason=finish,
        )

    def _stop_prefix(self, ids: list[int], stops: list[str]) -> int:
        """Fewest leading tokens whose text contains a stop string (binary search: the decoded text only grows)."""
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if find_stop(self.tokenizer.decode(ids[:mid], skip_special_tokens=True), stops) is None:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def close(self) -> None:
        """Drop the model so its memory can be freed."""
        self.model = self._base = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------------------------------------------------
    def load_adapter(self, path: str, version: int) -> None:
        """Wrap the base model with the PEFT LoRA adapter in ``path`` (replacing any previous adapter)."""
        from peft import PeftModel

        from memrl.data.checks import check_adapter_dir

        check_adapter_dir(str(path), f"engine {self.name}: adapter")
        self.use_base(self.policy_version)
        self.model = PeftModel.from_pretrained(self._base, str(path)).eval()
        self.policy_version = version

    def use_base(self, version: int = 0) -> None:
        """Remove the adapter (if any) and serve the base weights."""
        if self.model is not self._base:
            self._base = self.model.unload()
            self.model = self._base
        self.policy_version = version

    def update_weights(self, weights: dict[str, torch.Tensor] | str | Path, version: int) -> None:
        """Load a full state dict, or every ``*.safetensors`` file of a directory, into the base model in place."""
        from safetensors.torch import load_file

        self.use_base(self.policy_version)
        if isinstance(weights, dict):
            state = weights
        else:
            files = sorted(Path(weights).glob("*.safetensors"))
            if not files:
                raise EngineError(f"{self.name}: no *.safetensors files in {weights}")
            state = {k: v for f in files for k, v in load_file(str(f)).items()}
        missing, unexpected = self._base.load_state_dict(state, strict=False)
        tied = {"lm_head.weight"} if getattr(self._base.config, "tie_word_embeddings", False) else set()
        if unexpected or set(missing) - tied:
            raise EngineError(
                f"{self.name}: weights do not match the model (missing {sorted(missing)[:5]}, "
                f"unexpected {sorted(unexpected)[:5]})"
            )
        self.policy_version = version
