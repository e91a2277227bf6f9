"""The ``hf`` backend: a transformers model behind the engine interface (debugging, models vLLM cannot load).

Requests are expanded to one row per sample. By default the rows are decoded by continuous batching
(:mod:`~memrl.rollout.engines.continuous_batching`): one thread owns the model, rows join the running batch between
decode steps and leave it the step they end, so the engine takes each request the moment it is sent
(``concurrent_requests``) and a short call never waits for a long one. Models whose KV cache cannot be padded and
stacked row by row (sliding-window or recurrent layers), or ``continuous_batching=False``, run through ``generate``
instead: rows with the same sampling settings share a call, which lasts as long as its longest row.

Each row draws with its own ``torch.Generator`` seeded by :func:`~memrl.rollout.engines.base.sample_seed`, so a sample
does not depend on which other rows share its batch (up to floating-point effects of padding), and records the
log-prob of the drawn token under the raw distribution (log-softmax of unprocessed logits, temperature 1, no
top-k/top-p): the definition every backend and the trainer use. End-of-sequence tokens (the tokenizer's and the
generation config's) and stop strings end a row as in vLLM. On CPU, generation runs with one torch thread unless
``cpu_threads`` says otherwise (see :func:`~memrl.rollout.engines.base.torch_threads`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterator
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
from memrl.rollout.engines.continuous_batching import (
    Row,
    RowDecoder,
    draw,
    left_padded,
    supports_continuous_batching,
)

__all__ = ["HFEngine"]


class _SeededSampler(LogitsProcessor):
    """``generate``'s sampler for models without continuous batching: :func:`draw` per row; records the raw
    log-probs and forces ``generate`` to take the drawn tokens."""

    def __init__(self, rows: list[Row]) -> None:
        self.rows = rows
        self.chosen_logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        chosen, logprobs = draw(scores, self.rows)
        self.chosen_logprobs.append(logprobs)
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
        continuous_batching: bool = True,
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
        self.decoder = RowDecoder(self) if continuous_batching and supports_continuous_batching(model) else None
        self._lockstep = 0

    @property
    def concurrent_requests(self) -> bool:  # type: ignore[override]
        """With continuous batching every request joins the running batch the moment it is sent."""
        return self.decoder is not None

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
            continuous_batching=cfg.continuous_batching,
            **cfg.engine_settings(),
        )

    # ------------------------------------------------------------------------------------------------------------
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Generate every sample of every request (one row each) and wait for them."""
        rows, todo = self._rows(requests)
        if self.decoder is None:
            self._generate_batches(todo)
        elif todo:
            self.decoder.submit(todo)
        return self._results(rows)

    async def agenerate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """:meth:`generate` for callers in an event loop: with continuous batching the rows join the running batch
        and the loop goes on until they end."""
        if self.decoder is None:
            return await super().agenerate(requests)
        rows, todo = self._rows(requests)
        if todo:
            self.decoder.submit(todo, holds=self._lockstep > 0)
            await asyncio.gather(*(asyncio.wrap_future(row.done) for row in todo))
        return self._results(rows)

    @contextlib.contextmanager
    def lockstep(self) -> Iterator[None]:
        """While active, each completed :meth:`agenerate` call holds the next decode step until :meth:`settle`
        (:meth:`Engine.lockstep <memrl.rollout.engines.base.Engine.lockstep>`); so does the start, until the caller
        settles its first calls."""
        self._lockstep += 1
        if self.decoder is not None:
            self.decoder.hold()  # until the caller has sent its first calls
        try:
            yield
        finally:
            self._lockstep -= 1
            if self.decoder is not None and self._lockstep == 0:
                self.decoder.settle(calls=1 << 30)  # a caller that stopped early holds nothing

    def settle(self) -> None:
        """The caller sent every call that follows from one completed :meth:`agenerate` call."""
        if self.decoder is not None:
            self.decoder.settle()

    def _rows(self, requests: list[GenerationRequest]) -> tuple[list[list[Row]], list[Row]]:
        """One row per sample of each request, seeded by :func:`sample_seed`, limited by the context; and the rows
        left to decode (a prompt that fills the context has nothing to generate)."""
        if self.model is None:
            raise EngineError(f"{self.name}: the engine is closed")
        prompts = request_prompt_ids(requests, self.tokenizer, self.chat_template_kwargs, self.max_model_len, self.name)
        out = []
        for prompt, req in zip(prompts, requests, strict=True):
            sp, seed = req.sampling, self.request_seed(req.sampling)
            limit = min(sp.max_tokens, self.max_model_len - len(prompt))
            request_rows = [
                Row(prompt, sp, limit, torch.Generator(device=self.device).manual_seed(sample_seed(seed, i)))
                for i in range(sp.n)
            ]
            for row in request_rows:
                if limit < 1:  # the prompt fills the context: nothing to generate
                    row.done.set_result(([], []))
            out.append(request_rows)
        return out, [row for request_rows in out for row in request_rows if not row.done.done()]

    def _results(self, rows: list[list[Row]]) -> list[GenerationResult]:
        results = []
        for request_rows in rows:
            prompt, sp = request_rows[0].prompt, request_rows[0].sampling
            done = [self._finish(*row.done.result(), row.limit, sp) for row in request_rows]
            usage = Usage(prompt_tokens=len(prompt) * sp.n, completion_tokens=sum(len(c.response_ids) for c in done))
            results.append(self._result(prompt, done, usage))
        return results

    def _generate_batches(self, rows: list[Row]) -> None:
        """Without continuous batching: rows with equal sampling settings share ``generate`` calls."""
        groups: dict[tuple[Any, ...], list[Row]] = {}
        for row in rows:
            sp = row.sampling
            groups.setdefault((sp.temperature, sp.top_p, sp.top_k, tuple(sp.stop), sp.ignore_eos), []).append(row)
        for group in groups.values():
            for start in range(0, len(group), self.batch_size):
                with torch_threads(self.cpu_threads):
                    self._generate_rows(group[start : start + self.batch_size])

    @torch.inference_mode()
    def _generate_rows(self, rows: list[Row]) -> None:
        input_ids, attention = left_padded(rows, self.pad_id)
        width = input_ids.shape[1]
        sp = rows[0].sampling
        sampler = _SeededSampler(rows)
        gen_cfg = GenerationConfig(
            do_sample=False,
            num_beams=1,
            max_new_tokens=max(r.limit for r in rows),
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
        logprobs = torch.stack(sampler.chosen_logprobs, 1).tolist()
        for i, row in enumerate(rows):
            row.done.set_result((generated[i], logprobs[i]))

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
        """Stop the decoding thread and drop the model so its memory can be freed."""
        if self.decoder is not None:
            self.decoder.close()
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
