"""SFT of the tiny CPU model on the SAM roles over one-turn pages: steps/s with and without bf16 autocast, and what
full fine-tuning vs a high-rank LoRA learn per minute (held-out eval loss and greedy exact match of recall).

    python -m benchmarks.sft_tiny --steps 20 --variants full-bf16 full-fp32      # speed only
    python -m benchmarks.sft_tiny --steps 300 --variants full-bf16 lora128-bf16 --exact 64

Variants are ``{full,loraR}-{bf16,fp32}``. Prints one JSON object per variant and, last, one JSON object with all.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import bench_parser, emit, pin_threads
from memrl.data.distill import distill_traces
from memrl.data.formats import render_sam_consolidate_prompt, render_sam_recall_prompt
from memrl.data.schemas import EpisodeTrace, MemoryCall, Message
from memrl.rollout.models import TinyModelSpec, ensure_tiny_model

COLORS = ["red", "blue", "green", "brass", "silver", "golden", "black", "white", "grey", "purple"]
ITEMS = ["key", "gem", "coin", "book", "lamp", "map", "ring", "note"]
PLACES = ["drawer", "chest", "box", "shelf", "cabinet", "crate"]


def traces(
    n: int,
    seed: int,
    *,
    colors: list[str] = COLORS,
    items: list[str] = ITEMS,
    places: list[str] = PLACES,
    last_turn: int = 99,
) -> list[EpisodeTrace]:
    """Correct SAM expert traces over one-turn pages ("t12> open drawer 5\nthe red key is in drawer 5", a turn up to
    ``last_turn``, the fact drawn from the vocabularies given): a consolidation call (cue = the entities) and a recall
    call (target = the fact line) each."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        color, item, place = rng.choice(colors), rng.choice(items), f"{rng.choice(places)} {rng.randint(1, 9)}"
        t = rng.randint(1, last_turn)
        fact = f"the {color} {item} is in {place}"
        page = f"t{t}> open {place}\n{fact}"
        calls = [
            MemoryCall(
                call_id="c",
                role="consolidate",
                text=f"{color} {item}, {place}",
                messages=[Message(**m) for m in render_sam_consolidate_prompt(t, page)],
            ),
            MemoryCall(
                call_id="r",
                role="recall",
                text=fact,
                messages=[Message(**m) for m in render_sam_recall_prompt(f"where is the {color} {item}?", t, page, "")],
            ),
        ]
        out.append(
            EpisodeTrace(trace_id=f"{seed}-{i}", task_id=str(i), memory_system="sam", outcome=1.0, memory_calls=calls)
        )
    return out


def exact_match(final: Path, base: Path, kind: str, rows: list[Any]) -> float:
    """Greedy exact match of the targets of ``rows`` (batched HF generate, left padding)."""
    import torch

    from memrl.rollout.models import load_causal_lm, load_tokenizer

    tok = load_tokenizer(final)
    tok.padding_side = "left"
    if kind == "lora":
        from peft import PeftModel

        model = PeftModel.from_pretrained(load_causal_lm(base), str(final)).merge_and_unload()
    else:
        model = load_causal_lm(final)
    model.eval()
    hits = 0
    for i in range(0, len(rows), 32):
        chunk = rows[i : i + 32]
        prompts = [
            tok.apply_chat_template(
                [m.model_dump() for m in r.messages[:-1]], tokenize=False, add_generation_prompt=True
            )
            for r in chunk
        ]
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id)
        for r, seq in zip(chunk, out[:, enc["input_ids"].shape[1] :], strict=True):
            hits += tok.decode(seq, skip_special_tokens=True).strip() == r.messages[-1].content
    return hits / len(rows)


def main() -> None:
    parser = bench_parser(__doc__, seed=False)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--lora-lr", type=float, default=None, help="lr of LoRA variants (default: --lr)")
    parser.add_argument("--rows", type=int, default=4000, help="expert traces (2 rows each)")
    parser.add_argument("--exact", type=int, default=0, help="held-out recall rows scored by greedy exact match")
    parser.add_argument("--variants", nargs="+", default=["full-bf16", "full-fp32"])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    args = parser.parse_args()
    pin_threads(args.threads)

    from memrl.data.distill import load_sft_examples
    from memrl.train.sft import SFTRunConfig, run_sft

    work = Path(tempfile.mkdtemp(prefix="memrl-sft-bench-"))
    model_dir = ensure_tiny_model(Path(".cache/models"), TinyModelSpec(layers=args.layers, hidden=args.hidden))
    distill_traces(traces(args.rows, 0), work / "train", progress=False)
    distill_traces(traces(max(args.exact, 1), 1), work / "heldout", progress=False)
    heldout = load_sft_examples(work / "heldout" / "recall.jsonl")[: args.exact]
    results = []
    for index, variant in enumerate(args.variants):
        kind, precision = variant.split("-")
        name = f"{index}-{variant}"
        rank = 0 if kind == "full" else int(kind.removeprefix("lora"))
        lora = {"enabled": rank > 0, "r": rank or 8, "alpha": 2 * (rank or 8)}
        lr = args.lr if kind == "full" else (args.lora_lr or args.lr)
        cfg = SFTRunConfig.model_validate(
            {
                "run": {"output_dir": str(work / "runs"), "name": name},
                "model": {"base": str(model_dir)},
                "lora": lora,
                "data": {
                    "dir": str(work / "train"),
                    "roles": ["consolidate", "recall"],
                    "eval_fraction": 0.02,
                    "max_eval_rows": 32,
                },
                "train": {
                    "max_steps": args.steps,
                    "batch_size": args.batch,
                    "lr": lr,
                    "warmup": 0.05,
                    "bf16": precision == "bf16",
                    "save_steps": 0,
                    "logging_steps": max(1, args.steps // 10),
                    "max_length": 256,
                    "progress": False,
                },
            }
        )
        start = time.perf_counter()
        run_sft(cfg)
        wall = time.perf_counter() - start
        summary = json.loads((work / "runs" / name / "summary.json").read_text())
        result = {
            "variant": variant,
            "lr": lr,
            "steps": args.steps,
            "batch": args.batch,
            "steps_per_s": summary["steps_per_s"],
            "wall_s": round(wall, 1),
            "eval_loss_before": summary["eval_loss_before"],
            "eval_loss_after": summary["eval_loss_after"],
        }
        if heldout:
            result["recall_exact"] = exact_match(
                work / "runs" / name / "final", model_dir, "full" if kind == "full" else "lora", heldout
            )
        emit(result)
        results.append(result)
    emit({"benchmark": "sft_tiny", "model": f"{args.layers}x{args.hidden}", "results": results}, args.json_out)


if __name__ == "__main__":
    main()
