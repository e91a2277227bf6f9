"""Active-context scaling: SAM against truncated long-context as the horizon grows
(docs/architecture.md#benchmarks-and-what-they-measure).

For each horizon H (trajectory tokens of the SAM task: a tour of the text world, then a question whose evidence lies
in the first 30% of the tour), ``--tasks`` tasks (1-hop and 2-hop questions alternating) run in the agent loop with
the scripted frozen reasoner and

- ``sam``: SAM with the oracle expert as memory model (cues of at most ``--cue-entities`` entities, the question's
  entities first: oracle knowledge; pages of ``--page-tokens``),
- ``long_context``: the whole history truncated to the reasoner's window (``--window-tokens``), no memory tool, on
  the first ``--lc-tasks`` of those tasks (its steps re-read the whole window: about 30 ms a step at 32K here, so a
  128K task of ~3,200 steps takes minutes).

Per horizon and method it reports the peak active-context tokens (the largest reasoner prompt of any task, as the
reasoner engine counted it), the mean per-task peak, the success rate, reasoner calls, memory-model calls and seconds;
for SAM also the cue bank's tokens and the number of pages at the end of a task (the bank is the part that grows).
The last line is one JSON object with every figure and ``"sam_context_growth": peak(largest H) / peak(smallest H)``
for SAM (peak(128K)/peak(8K) with the default horizons).

Token accounting: ``--tokenizer approx`` (default) renders the ChatML chat as the tiny tokenizer's template does (5
tokens around each message, 3 for the generation prompt) and counts text with
:func:`memrl.data.envs.base.count_tokens` (which tracks the tiny tokenizer within about 10%); the tiny tokenizer itself
(``--tokenizer tiny``) encodes about 90K tokens/s here, too slow for a 32K window re-read at each of thousands of
steps. The memory systems count with the same counter, so the long-context prompt never exceeds the window.

    python -m benchmarks.context_scaling                  # 8K..128K, default task count
    python -m benchmarks.context_scaling --quick          # 2K, 4K, 8K with 2 tasks: seconds
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import bench_parser, emit, pin_threads
from memrl.data.envs.base import count_tokens
from memrl.data.experts.sam import SamOracle
from memrl.data.tasks.sam import SamReasoner, SamTask
from memrl.rollout.agents import sam_rollout
from memrl.rollout.engines.scripted import ScriptedEngine
from memrl.rollout.loop import EngineSet, run_rollouts
from memrl.rollout.memory.sam import SamMemory, make_token_counter

DEFAULT_HORIZONS = [8192, 16384, 32768, 65536, 131072]
_PIECES = re.compile(r"[A-Za-z]+|[0-9]+|[^\sA-Za-z0-9]|\n")  # the pieces count_tokens counts, one id each


class ApproxChatTokenizer:
    """A tokenizer for the scripted engines: ChatML rendering with the tiny tokenizer's template costs and
    ``count_tokens`` pieces as tokens; each message's ids are cached (prompts repeat from step to step)."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {"<|im_end|>": 0}
        self.pieces = ["<|im_end|>"]
        self.eos_token_id = 0
        self._messages: dict[tuple[str, str], list[int]] = {}

    def _id(self, piece: str) -> int:
        if piece not in self.vocab:
            self.vocab[piece] = len(self.pieces)
            self.pieces.append(piece)
        return self.vocab[piece]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """One id per counted piece."""
        return [self._id(p) for p in _PIECES.findall(text)]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Pieces joined by spaces (only used when a reply is cut at max_tokens)."""
        return " ".join(self.pieces[i] for i in ids if not (skip_special_tokens and i == self.eos_token_id))

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True, **_: Any
    ) -> list[int]:
        """ChatML ids: ``<|im_start|> role \\n content <|im_end|> \\n`` per message, then the generation prompt."""
        ids: list[int] = []
        for m in messages:
            key = (m["role"], m["content"])
            if key not in self._messages:
                self._messages[key] = [
                    self._id("<|im_start|>"),
                    self._id(m["role"]),
                    self._id("\n"),
                    *self.encode(m["content"]),
                    self.eos_token_id,
                    self._id("\n"),
                ]
            ids += self._messages[key]
        if add_generation_prompt:
            ids += [self._id("<|im_start|>"), self._id("assistant"), self._id("\n")]
        return ids

    def clear(self) -> None:
        """Forget cached messages (between runs)."""
        self._messages.clear()


def load_tokenizer(kind: str) -> Any:
    """The reasoner engine's tokenizer (see the module docstring)."""
    if kind == "approx":
        return ApproxChatTokenizer()
    from memrl.rollout.models import TinyModelSpec, ensure_tiny_model
    from memrl.rollout.models import load_tokenizer as load

    root = Path(__file__).resolve().parents[1]
    return load(ensure_tiny_model(root / ".cache" / "models", TinyModelSpec()))


def run_method(method: str, tasks: list[SamTask], args: argparse.Namespace, tokenizer: Any) -> dict[str, Any]:
    """Run every task with one method; the figures of that (horizon, method) cell."""
    counter = count_tokens if args.tokenizer == "approx" else make_token_counter(tokenizer)
    if method == "sam":
        memory: dict[str, Any] = {
            "name": "sam",
            "page_tokens": args.page_tokens,
            "live_capacity_tokens": args.live_capacity_tokens,
            "keep_recent_tokens": args.keep_recent_tokens,
            "max_cue_tokens": args.max_cue_tokens,
            "sampling": {
                "consolidate": {"temperature": 0.0, "max_tokens": 128},
                "recall": {"temperature": 0.0, "max_tokens": 256},
            },
        }
    else:
        memory = {"name": "long_context", "window_tokens": args.window_tokens}
    engines = EngineSet(
        reasoner=ScriptedEngine(SamReasoner(), tokenizer=tokenizer, name="reasoner", block_size=256),
        memory=ScriptedEngine(
            SamOracle({"cue_max_entities": args.cue_entities}), tokenizer=tokenizer, name="sam-oracle", block_size=256
        ),
    )
    start = time.perf_counter()
    rollouts = [sam_rollout(task, memory, seed=args.seed + i, count_tokens=counter) for i, task in enumerate(tasks)]
    traces = run_rollouts(rollouts, engines)
    seconds = time.perf_counter() - start
    if isinstance(tokenizer, ApproxChatTokenizer):
        tokenizer.clear()
    peaks = [t.peak_context_tokens for t in traces]
    extra: dict[str, Any] = {}
    sams = [r.memory for r in rollouts if isinstance(r.memory, SamMemory)]
    if sams:  # the cue bank's share of the active context, at the end of each task
        extra["max_cue_bank_tokens"] = max(counter(m.memory_block()) for m in sams)
        extra["mean_pages"] = round(sum(len(m.pages) for m in sams) / len(sams), 1)
    return {
        "peak_context_tokens": max(peaks),
        "mean_peak_context_tokens": round(sum(peaks) / len(peaks), 1),
        "success": round(sum(t.outcome or 0.0 for t in traces) / len(traces), 4),
        "reasoner_calls": sum(t.reasoner_usage.calls for t in traces),
        "memory_calls": sum(t.memory_usage.calls for t in traces),
        "memory_errors": sum(v for t in traces for k, v in t.stats.items() if k.endswith("_errors")),
        "seconds": round(seconds, 2),
        **extra,
    }


def main() -> None:
    """Run the benchmark and print the JSON summary last."""
    parser = bench_parser(__doc__)
    parser.add_argument("--horizons", default=",".join(map(str, DEFAULT_HORIZONS)), help="trajectory tokens")
    parser.add_argument("--tasks", type=int, default=6, help="tasks per horizon (1-hop and 2-hop alternate)")
    parser.add_argument("--lc-tasks", type=int, default=2, help="of which long-context runs the first N")
    parser.add_argument("--quick", action="store_true", help="horizons 2K, 4K, 8K and 2 tasks")
    parser.add_argument("--methods", default="sam,long_context")
    parser.add_argument("--window-tokens", type=int, default=32768, help="the long-context reasoner's window")
    parser.add_argument("--page-tokens", type=int, default=1024)
    parser.add_argument("--live-capacity-tokens", type=int, default=2048)
    parser.add_argument("--keep-recent-tokens", type=int, default=1024)
    parser.add_argument("--max-cue-tokens", type=int, default=48)
    parser.add_argument("--cue-entities", type=int, default=4, help="oracle cue size (0: every entity of the page)")
    parser.add_argument("--tokenizer", choices=["approx", "tiny"], default="approx")
    args = parser.parse_args()
    pin_threads(args.threads)
    horizons = [2048, 4096, 8192] if args.quick else [int(h) for h in args.horizons.split(",")]
    n_tasks = 2 if args.quick else args.tasks
    lc_tasks = min(n_tasks, args.lc_tasks)
    methods = [m for m in args.methods.split(",") if m]
    tokenizer = load_tokenizer(args.tokenizer)
    begin = time.perf_counter()
    cells: dict[str, dict[str, Any]] = {}
    for horizon in horizons:
        tasks = [
            SamTask(
                {"horizon_steps": None, "target_tokens": horizon, "n_evidence": 1 + i % 2},
                seed=args.seed + i,
                task_id=f"h{horizon}-{i}",
            )
            for i in range(n_tasks)
        ]
        cells[str(horizon)] = {}
        for method in methods:
            cell = run_method(method, tasks[:lc_tasks] if method == "long_context" else tasks, args, tokenizer)
            cells[str(horizon)][method] = cell
            print(
                f"horizon {horizon:>7} {method:>12}: peak {cell['peak_context_tokens']:>6} tokens, "
                f"success {cell['success']:.2f}, {cell['seconds']:.1f} s",
                flush=True,
            )
    summary: dict[str, Any] = {
        "benchmark": "context_scaling",
        "tokenizer": args.tokenizer,
        "tasks_per_horizon": {m: lc_tasks if m == "long_context" else n_tasks for m in methods},
        "window_tokens": args.window_tokens,
        "page_tokens": args.page_tokens,
        "cue_entities": args.cue_entities,
        "horizons": cells,
    }
    first, last = str(horizons[0]), str(horizons[-1])
    for method in methods:
        growth = cells[last][method]["peak_context_tokens"] / max(1, cells[first][method]["peak_context_tokens"])
        summary[f"{method}_context_growth"] = round(growth, 3)
    summary["seconds"] = round(time.perf_counter() - begin, 1)
    emit(summary, args.json_out)


if __name__ == "__main__":
    main()
