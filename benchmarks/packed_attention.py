"""The trainer's packed micro-batch on CPU: the packed-attention path against the dense-mask path and padded rows.

Model: a random Qwen3 of small width (``--hidden`` 128, ``--layers`` 2, 2 query heads of 64 over 1 key/value head)
with Qwen's real vocabulary (151,936), fp32. Workload per token budget (``--budgets``, default 8K, 16K, 32K): rows of
mixed lengths as OAT-GRPO's memory calls are (a prompt of 64-4096 tokens, log-uniform, and a 10-400-token response),
drawn until the budget is full, the last row cut to fill it exactly. One step = the trainer's training pass over the
micro-batch: forward, the fused chunked log-prob loss over response tokens (:func:`token_loss_and_logprobs`), backward.

- ``packed``: :func:`memrl.train.logprobs.packed_hidden_states`: rows end to end, each row attending to itself
  through :mod:`memrl.train.attention` (on CPU one causal SDPA call per row), no mask;
- ``dense_mask``: the same packed sequence read by transformers' SDPA from the position ids alone, as the trainer did
  before: a dense ``[1, 1, L, L]`` block-diagonal mask, ``is_causal=False``;
- ``padded``: the rows right-padded to the longest, with an attention mask (a TRL-style batch).

Each (path, budget) runs in a fresh process with ``--threads`` torch threads: a warm-up step on a 512-token batch
(so the weights' gradients exist), then ``--steps`` timed steps at the budget. ``seconds_per_step`` is their median
wall time, ``cpu_seconds_per_step`` their median CPU time of the computing thread (with one torch thread, the time
other processes on a shared machine do not change: the growth ratios and speed ratios below are read from it);
``step_peak_gib`` the peak RSS during the timed steps above the RSS before them (sampled every millisecond: the
step's transient memory, weights and gradients excluded; glibc's mmap threshold is fixed at 128 KiB in the cases so
freed blocks return to the system and each step's own peak shows). A case that fails (out of memory, killed) is
recorded with ``failed``.

    python benchmarks/packed_attention.py                       # 8K, 16K, 32K on one thread
    python benchmarks/packed_attention.py --budgets 4096 8192 --threads 2

The step's time also holds what grows linearly (the layers' matrix products, the LM head over the response tokens), so
each case also times one attention layer alone (``attention_seconds``, ``attention_cpu_seconds``,
``attention_peak_gib``): forward and backward on
random queries, keys and values of the micro-batch's shape (2 query heads, 1 key/value head), through the packed
path's kernel, or through the mask transformers builds for the packed sequence or the padded batch and its SDPA call.

The last line is one JSON object: ``cases`` (per budget: rows, ``sum_sq_rows`` = sum of squared row lengths, and per
path the figures above) and ``summary``: per path and for the attention layer's time and the step's, ``growth`` (at each
budget over the smallest budget's), ``over_sum_sq`` (that growth over the growth of sum_sq_rows) and ``over_budget_sq``
(over the growth of the budget squared): a cost that follows the rows reads ~1 on the first at every budget, one that
computes the whole square ~1 on the second; at the largest budget ``packed_step_peak_over_dense`` (target <= 0.25),
``packed_attention_peak_over_dense``, and the dense-mask and padded steps' CPU times (and the dense-mask attention
layer's) over the packed one's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks.trainer_scaling when run as a script
from benchmarks.trainer_scaling import VOCAB, current_rss  # noqa: E402

GIB = 2**30
PATHS = ("packed", "dense_mask", "padded")
PROMPT = (64, 4096)  # prompt tokens of a row (log-uniform)
RESPONSE = (10, 400)  # response tokens (uniform)
WARMUP_TOKENS = 512


def mixed_rows(budget: int, seed: int = 0) -> list[tuple[int, int]]:
    """(prompt, response) lengths of rows filling ``budget`` tokens exactly (see the module docstring)."""
    rng = random.Random(seed)
    rows: list[tuple[int, int]] = []
    used = 0
    while used < budget:
        prompt = round(math.exp(rng.uniform(math.log(PROMPT[0]), math.log(PROMPT[1]))))
        response = rng.randint(*RESPONSE)
        room = budget - used
        if prompt + response > room:  # the last row: cut to what is left (a response of at least one token)
            response = min(response, max(room // 2, 1))
            prompt = room - response
            if prompt < 1:
                prompt, response = 1, room - 1
        rows.append((prompt, response))
        used += prompt + response
    return rows


def sum_sq(rows: list[tuple[int, int]]) -> int:
    """Sum of squared row lengths: what attention restricted to each row costs."""
    return sum((p + r) ** 2 for p, r in rows)


def build_model(hidden: int, layers: int, max_position: int, vocab: int) -> Any:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(hidden // 64, 1),
        num_key_value_heads=max(hidden // 128, 1),
        head_dim=64,
        max_position_embeddings=max_position,
        tie_word_embeddings=False,
    )
    return Qwen3ForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)


def token_ids(rows: list[tuple[int, int]], vocab: int, seed: int) -> list[tuple[list[int], list[int]]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(10, vocab, (p,), generator=g).tolist(), torch.randint(10, vocab, (r,), generator=g).tolist())
        for p, r in rows
    ]


def hidden_states(path: str, model: Any, pairs: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, Any]:
    """([response tokens, hidden] final hidden states predicting the response tokens, targets) through ``path``."""
    from memrl.train.logprobs import pack_rows, packed_hidden_states

    batch = pack_rows(pairs, "cpu")
    if path == "packed":
        return packed_hidden_states(model, model.get_output_embeddings(), batch), batch.targets
    if path == "dense_mask":
        out = model.model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False)
        return out.last_hidden_state[0].index_select(0, batch.positions), batch.targets
    longest = max(len(p) + len(r) for p, r in pairs)
    ids = torch.zeros(len(pairs), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    rows, cols = [], []
    for i, (p, r) in enumerate(pairs):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        mask[i, : len(p) + len(r)] = 1
        rows += [i] * len(r)
        cols += range(len(p) - 1, len(p) - 1 + len(r))
    out = model.model(input_ids=ids, attention_mask=mask, use_cache=False)
    return out.last_hidden_state[torch.tensor(rows), torch.tensor(cols)], batch.targets


def training_pass(path: str, model: Any, pairs: list[tuple[list[int], list[int]]]) -> None:
    """Forward, the fused chunked loss over response tokens (advantage +-1 by row), backward."""
    from memrl.train.logprobs import token_loss_and_logprobs

    hidden, targets = hidden_states(path, model, pairs)
    signs = torch.tensor([1.0 if i % 2 else -1.0 for i, (_, r) in enumerate(pairs) for _ in r])
    loss, _, _ = token_loss_and_logprobs(
        hidden, model.get_output_embeddings(), targets, lambda lp, sl: -signs[sl] * lp / len(signs), chunk_tokens=256
    )
    loss.backward()


class PeakSampler:
    """The highest RSS seen while active, sampled every millisecond in a thread."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, current_rss())
            time.sleep(0.001)

    def __enter__(self) -> PeakSampler:
        self.peak = current_rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, current_rss())


def attention_pass(path: str, model: Any, pairs: list[tuple[list[int], list[int]]]) -> None:
    """One attention layer alone, forward and backward, on random queries, keys and values of the micro-batch: the
    packed path's kernel; or the mask transformers builds (``create_causal_mask``) and its SDPA call."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import create_causal_mask

    from memrl.train.attention import attention_over_rows
    from memrl.train.logprobs import pack_rows

    config, layer = model.config, model.model.layers[0].self_attn
    heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    batch = pack_rows(pairs, "cpu")
    if path == "padded":
        lengths = [len(p) + len(r) for p, r in pairs]
        shape, attention_mask = (len(pairs), max(lengths)), torch.zeros(len(pairs), max(lengths), dtype=torch.long)
        for i, n in enumerate(lengths):
            attention_mask[i, :n] = 1
        position_ids = None
    else:
        shape, attention_mask, position_ids = (1, batch.n_tokens), None, batch.position_ids
    g = torch.Generator().manual_seed(0)
    q = torch.randn(shape[0], heads, shape[1], dim, generator=g).requires_grad_(True)
    k = torch.randn(shape[0], kv_heads, shape[1], dim, generator=g).requires_grad_(True)
    v = torch.randn(shape[0], kv_heads, shape[1], dim, generator=g).requires_grad_(True)
    if path == "packed":
        out = attention_over_rows(q, k, v, batch.cu_seqlens, batch.max_length, scaling=dim**-0.5)
    else:
        embeds = torch.empty(*shape, 1)  # the mask reads its batch size, length, dtype and device
        mask = create_causal_mask(config, embeds, attention_mask, None, position_ids)
        out, _ = sdpa_attention_forward(layer, q, k, v, mask, scaling=dim**-0.5)
    out.sum().backward()


def timed(fn: Any, repeats: int) -> dict[str, float]:
    """Medians over ``repeats`` calls of ``fn``: wall seconds, the calling thread's CPU seconds (where one torch
    thread computes: what other processes on a shared machine do not change), and the peak RSS above the level
    before the calls, in GiB."""
    walls, cpus = [], []
    before = current_rss()
    with PeakSampler() as sampler:
        for _ in range(repeats):
            wall, cpu = time.perf_counter(), time.thread_time()
            fn()
            walls.append(time.perf_counter() - wall)
            cpus.append(time.thread_time() - cpu)
    return {
        "seconds": statistics.median(walls),
        "cpu_seconds": statistics.median(cpus),
        "peak_gib": (sampler.peak - before) / GIB,
    }


def run_case(args: argparse.Namespace) -> dict[str, Any]:
    """One (path, budget) in this process: warm up, then the timed steps; the record printed as the last line."""
    torch.set_num_threads(args.threads)
    rows = mixed_rows(args.budget, args.seed)
    model = build_model(args.hidden, args.layers, max(args.budget, PROMPT[1] + RESPONSE[1]), args.vocab)
    training_pass(args.path, model, token_ids(mixed_rows(WARMUP_TOKENS, args.seed + 1), args.vocab, 1))
    pairs = token_ids(rows, args.vocab, args.seed)
    step = timed(lambda: training_pass(args.path, model, pairs), args.steps)
    attention_pass(args.path, model, token_ids(mixed_rows(WARMUP_TOKENS, args.seed + 1), args.vocab, 1))
    attention = timed(lambda: attention_pass(args.path, model, pairs), args.steps)
    return {
        "path": args.path,
        "budget": args.budget,
        "seconds_per_step": step["seconds"],
        "cpu_seconds_per_step": step["cpu_seconds"],
        "step_peak_gib": step["peak_gib"],
        "attention_seconds": attention["seconds"],
        "attention_cpu_seconds": attention["cpu_seconds"],
        "attention_peak_gib": attention["peak_gib"],
    }


def growth(cases: list[dict[str, Any]], path: str, key: str) -> dict[str, dict[str, float]]:
    """``path``'s ``key`` at each budget over the smallest budget's, alone and over the growth of the sum of squared
    row lengths and of the budget squared."""
    first = min(cases, key=lambda c: c["budget"])
    base = first[path].get(key)
    out: dict[str, dict[str, float]] = {"growth": {}, "over_sum_sq": {}, "over_budget_sq": {}}
    for c in sorted(cases, key=lambda c: c["budget"]):
        value = c[path].get(key)
        if base is None or value is None:
            continue
        g = value / base
        out["growth"][str(c["budget"])] = g
        out["over_sum_sq"][str(c["budget"])] = g / (c["sum_sq_rows"] / first["sum_sq_rows"])
        out["over_budget_sq"][str(c["budget"])] = g / (c["budget"] / first["budget"]) ** 2
    return out


def summarize(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Per path, the growth of the attention layer's time and of the whole step's; at the largest budget the packed
    path's peaks and time against the dense-mask path's."""
    last = max(cases, key=lambda c: c["budget"])
    out: dict[str, Any] = {
        path: {
            "attention_time": growth(cases, path, "attention_cpu_seconds"),
            "step_time": growth(cases, path, "cpu_seconds_per_step"),
        }
        for path in PATHS
    }

    def ratio(key: str, num: str, den: str) -> float | None:
        a, b = last[num].get(key), last[den].get(key)
        return a / b if a is not None and b else None

    out["largest_budget"] = last["budget"]
    out["packed_step_peak_over_dense"] = ratio("step_peak_gib", "packed", "dense_mask")
    out["packed_attention_peak_over_dense"] = ratio("attention_peak_gib", "packed", "dense_mask")
    out["dense_step_time_over_packed"] = ratio("cpu_seconds_per_step", "dense_mask", "packed")
    out["padded_step_time_over_packed"] = ratio("cpu_seconds_per_step", "padded", "packed")
    out["dense_attention_time_over_packed"] = ratio("attention_cpu_seconds", "dense_mask", "packed")
    out["failed"] = sum(1 for c in cases for p in PATHS if c[p].get("failed"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=[8192, 16384, 32768], help="tokens per micro-batch")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--hidden", type=int, default=128, help="hidden size (heads of 64)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=VOCAB, help="vocabulary (default: Qwen's 151,936)")
    parser.add_argument("--steps", type=int, default=1, help="timed steps per case (median)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each case")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--path", choices=PATHS, help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.path:  # a child: one case
        print(json.dumps(run_case(args)), flush=True)
        return

    cases = []
    for budget in sorted(args.budgets):
        rows = mixed_rows(budget, args.seed)
        case: dict[str, Any] = {
            "budget": budget,
            "rows": len(rows),
            "longest_row": max(p + r for p, r in rows),
            "response_tokens": sum(r for _, r in rows),
            "sum_sq_rows": sum_sq(rows),
        }
        for path in PATHS:
            if path not in args.paths:
                case[path] = {"skipped": "not run"}
                continue
            child = [sys.executable, __file__, "--path", path, "--budget", str(budget)]
            child += ["--hidden", str(args.hidden), "--layers", str(args.layers), "--vocab", str(args.vocab)]
            child += ["--steps", str(args.steps), "--threads", str(args.threads), "--seed", str(args.seed)]
            # a fixed mmap threshold: freed blocks over 128 KiB go back to the system, so RSS shows each step's own peak
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT)}
            env["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
            proc = subprocess.run(child, capture_output=True, text=True, env=env)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
            if proc.returncode == 0 and lines:
                record = json.loads(lines[-1])
                case[path] = {k: v for k, v in record.items() if k not in ("path", "budget")}
            else:
                case[path] = {"failed": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"}
            print(json.dumps({"budget": budget, "path": path, **case[path]}), flush=True)
        cases.append(case)
    config = {
        "hidden": args.hidden,
        "layers": args.layers,
        "vocab": args.vocab,
        "steps": args.steps,
        "threads": args.threads,
        "torch": torch.__version__,
        "paths": args.paths,
    }
    print(json.dumps({"config": config, "cases": cases, "summary": summarize(cases)}))


if __name__ == "__main__":
    main()
