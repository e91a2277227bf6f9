"""Rollout throughput, vLLM vs transformers: the same batch of chat prompts (64 prompts x 4 samples x 64 new tokens by
default) on the same model with the ``vllm`` and ``hf`` backends. Every sample generates exactly ``--max-tokens``
tokens (end-of-sequence ignored) so both backends do the same work; the timed call follows a warm-up call, and the
vLLM prefix cache is reset in between so neither backend reuses the other call's work. Prints one JSON object last:
``{"vllm_tokens_per_s": ..., "hf_tokens_per_s": ..., "ratio": ...}`` (ratio = vLLM / HF).

    .venv/bin/python -m benchmarks.rollout_throughput [--prompts 64 --samples 4 --max-tokens 64 --model DIR]

Without ``--model`` the tiny test model is built (or reused) under .cache/models.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import bench_parser, emit, pin_threads

ROOT = Path(__file__).resolve().parents[1]


def make_requests(n_prompts: int, samples: int, max_tokens: int, prompt_words: int) -> list[Any]:
    """Deterministic chat prompts of about ``prompt_words`` words from the synthetic corpus."""
    import random

    from memrl.data.corpus import synthetic_corpus
    from memrl.data.schemas import Message
    from memrl.rollout.engines import GenerationRequest, SamplingParams

    lines = [line for line in synthetic_corpus(0) if line.strip()]
    rng = random.Random(0)
    requests = []
    for i in range(n_prompts):
        words: list[str] = []
        while len(words) < prompt_words:
            words.extend(rng.choice(lines).split())
        messages = [
            Message(role="system", content="You keep the agent's memory."),
            Message(role="user", content=" ".join(words[:prompt_words])),
        ]
        sampling = SamplingParams(n=samples, max_tokens=max_tokens, seed=i, ignore_eos=True, temperature=1.0)
        requests.append(GenerationRequest(messages=messages, sampling=sampling))
    return requests


def timed(engine: Any, requests: list[Any]) -> tuple[int, float]:
    """Generated tokens and seconds of one batched call."""
    start = time.perf_counter()
    results = engine.generate(requests)
    seconds = time.perf_counter() - start
    return sum(len(c.response_ids) for r in results for c in r.completions), seconds


def main() -> None:
    parser = bench_parser(__doc__, seed=False)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-words", type=int, default=48)
    parser.add_argument("--model", default=None, help="model directory or hub id (default: the tiny test model)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="vLLM context length (default: the model's; SmolLM2's 8192 needs more KV cache than 2048)",
    )
    parser.add_argument("--cpu-threads", type=int, default=None, help="torch threads on CPU (default: the engines')")
    args = parser.parse_args()
    pin_threads(args.threads)

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from memrl.rollout.engines import EngineConfig, build_engine
    from memrl.rollout.models import TinyModelSpec, ensure_tiny_model

    model = args.model or str(ensure_tiny_model(ROOT / ".cache" / "models", TinyModelSpec()))
    requests = make_requests(args.prompts, args.samples, args.max_tokens, args.prompt_words)
    warmup = make_requests(2, 1, 4, args.prompt_words)
    common = {"model": model, "dtype": args.dtype, "seed": 0, "cpu_threads": args.cpu_threads}
    figures: dict[str, Any] = {}

    start = time.perf_counter()
    vllm = build_engine(
        EngineConfig(
            backend="vllm", max_num_seqs=args.prompts * args.samples, max_model_len=args.max_model_len, **common
        )
    )
    figures["vllm_startup_s"] = round(time.perf_counter() - start, 2)
    with vllm:
        vllm.generate(warmup)
        vllm.reset_prefix_cache()
        tokens, seconds = timed(vllm, requests)
    figures.update(vllm_tokens=tokens, vllm_seconds=round(seconds, 3), vllm_tokens_per_s=round(tokens / seconds, 1))

    hf = build_engine(EngineConfig(backend="hf", batch_size=args.prompts * args.samples, **common))
    hf.generate(warmup)
    tokens, seconds = timed(hf, requests)
    hf.close()
    figures.update(hf_tokens=tokens, hf_seconds=round(seconds, 3), hf_tokens_per_s=round(tokens / seconds, 1))

    summary = {
        "vllm_tokens_per_s": figures["vllm_tokens_per_s"],
        "hf_tokens_per_s": figures["hf_tokens_per_s"],
        "ratio": round(figures["vllm_tokens_per_s"] / figures["hf_tokens_per_s"], 2),
        "prompts": args.prompts,
        "samples": args.samples,
        "max_tokens": args.max_tokens,
        "model": Path(model).name,
        **{k: v for k, v in figures.items() if k not in ("vllm_tokens_per_s", "hf_tokens_per_s")},
    }
    emit(summary, args.json_out)


if __name__ == "__main__":
    main()
