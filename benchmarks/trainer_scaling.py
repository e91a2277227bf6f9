"""Group-trainer memory and speed as the context grows, against a TRL-style response-only reference on the same batch.

Model: a tiny random Qwen3 (hidden 64, 2 layers, one head of 64) with Qwen's real vocabulary (151,936), fp32, full
weights, AdamW. Batch: one group of ``--rows`` rows sharing a prompt of ``context - response`` tokens, each with
``--response`` random response tokens, advantages +1 / -1 alternating. One step = score pi_old over the group, one
optimizer step of clipped-surrogate training over it, one row per micro-batch (token budget = the context), with the
response-token entropy logged.

- ``memrl``: :class:`memrl.train.group_trainer.GroupTrainer` (``max_tokens_per_micro_batch = context``).
- ``reference``: TRL's GRPO log-prob path, written out from TRL: ``model(..., logits_to_keep=response + 1)``,
  ``logits[:, :-1]``, ``trl.trainer.utils.selective_log_softmax`` and ``entropy_from_logits`` (no grad), the same
  clipped token-mean loss, ``clip_grad_norm_``, AdamW.

Every case runs in a fresh subprocess (cases one after another, memrl and reference alternating, ``--repeats`` times)
that does ``--steps`` steps and reports: ``step_peak_gib``, the process's peak RSS (``ru_maxrss``) minus its RSS just
before the first step (imports, model weights and the batch excluded: what the step itself needs on top), and
``process_peak_gib`` (the whole ``ru_maxrss``); ``seconds_per_step`` is the last step's wall time. Figures are the
medians over repeats. On this shared CPU the times are noisy; the memory is not. A case that fails (out of memory or
killed) counts in ``ooms``.

    python -m benchmarks.trainer_scaling                         # 1K, 4K, 8K, 16K
    python -m benchmarks.trainer_scaling --contexts 1024 --repeats 1
    python -m benchmarks.trainer_scaling --rows 2 --summarize run.log   # summary of an interrupted run's lines

The last line is one JSON object: per case both measurements, ``max_peak_ratio`` (memrl / reference step peak, worst
context; target <= 1.2), ``max_time_ratio`` (target <= 1.1), ``ooms`` (target 0) and ``logprob_max_abs_diff`` (memrl's
pi_old against the reference's log-probs on the smallest context's batch).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import bench_parser, emit, pin_threads
from memrl.launch.plan import MODEL_SHAPES

ROOT = Path(__file__).resolve().parents[1]
SHAPE = MODEL_SHAPES["tiny-qwen-vocab"]  # Qwen's vocabulary on a tiny body: the logits weigh as in the recipes
VOCAB = SHAPE.vocab


def build_model(out: Path, max_position: int) -> Path:
    """The tiny Qwen3 with Qwen's vocabulary (the default tiny tokenizer supplies pad / eos ids only)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from memrl.rollout.models import TinyModelSpec, ensure_tiny_model, load_tokenizer

    tokenizer = load_tokenizer(ensure_tiny_model(ROOT / ".cache" / "models", TinyModelSpec()))
    torch.manual_seed(0)
    config = Qwen3Config(
        **SHAPE.to_hf_config(),
        max_position_embeddings=max_position,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    config.dtype = "float32"
    Qwen3ForCausalLM(config).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def make_batch(context: int, response: int, rows: int, seed: int = 0) -> tuple[list[int], list[list[int]], list[float]]:
    """(prompt ids, response ids per row, advantages)."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(10, VOCAB, (context - response,), generator=g).tolist()
    responses = [torch.randint(10, VOCAB, (response,), generator=g).tolist() for _ in range(rows)]
    return prompt, responses, [1.0 if i % 2 == 0 else -1.0 for i in range(rows)]


def current_rss() -> int:
    """Resident set size of this process now, in bytes."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    """High-water resident set size of this process, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# --------------------------------------------------------------------------------------------------------------------
def memrl_case(model_dir: Path, batch: Any, context: int, steps: int) -> list[float]:
    from memrl.data.schemas import Group, GroupSample
    from memrl.train.group_trainer import GroupTrainer, GroupTrainerConfig
    from memrl.train.policy import LoraSettings, PolicySpec

    prompt, responses, advantages = batch
    cfg = GroupTrainerConfig(lr=1e-5, lora=LoraSettings(enabled=False), max_tokens_per_micro_batch=context)
    trainer = GroupTrainer(PolicySpec(base=str(model_dir)), cfg)
    group = Group(
        group_id="g",
        prompt_ids=prompt,
        samples=[
            GroupSample(response_ids=r, reward=a, advantage=a) for r, a in zip(responses, advantages, strict=True)
        ],
    )
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        trainer.step([group])
        times.append(time.perf_counter() - start)
    return times


def reference_case(model_dir: Path, batch: Any, steps: int) -> list[float]:
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import entropy_from_logits, selective_log_softmax

    prompt, responses, advantages = batch
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    rows = [(torch.tensor([prompt + r]), torch.tensor([r]), a) for r, a in zip(responses, advantages, strict=True)]
    total_tokens = sum(c.numel() for _, c, _ in rows)

    def per_token_logps(ids: torch.Tensor, completion: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = completion.shape[1]
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=n + 1).logits
        logits = logits[:, :-1, :]  # exclude the last logit: it corresponds to the next token pred
        logits = logits[:, -n:]
        logps = selective_log_softmax(logits, completion)
        with torch.no_grad():
            entropies = entropy_from_logits(logits)
        return logps, entropies

    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model.eval()
        with torch.no_grad():
            old = [per_token_logps(ids, c)[0] for ids, c, _ in rows]
        model.train()
        for (ids, c, a), old_logps in zip(rows, old, strict=True):
            logps, _ = per_token_logps(ids, c)
            coef_1 = torch.exp(logps - old_logps)
            coef_2 = torch.clamp(coef_1, 1 - 0.2, 1 + 0.2)
            per_token_loss = -torch.min(coef_1 * a, coef_2 * a)
            (per_token_loss.sum() / total_tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    return times


def run_case(args: argparse.Namespace) -> None:
    """Child process: one case, then one JSON line."""
    torch.manual_seed(0)
    batch = make_batch(args.context, args.response, args.rows)
    model_dir = Path(args.model_dir)
    baseline = {"value": 0}

    import trl.trainer.utils  # noqa: F401

    import memrl.train.group_trainer  # noqa: F401  imports of both sides before the baseline

    def mark() -> None:
        baseline["value"] = current_rss()

    # The baseline is taken after the model is loaded: patch the first step to read it.
    if args.case == "memrl":
        from memrl.train.group_trainer import GroupTrainer

        original = GroupTrainer.step

        def step(self: Any, groups: Any) -> Any:
            if not baseline["value"]:
                mark()
            return original(self, groups)

        GroupTrainer.step = step  # type: ignore[method-assign]
        times = memrl_case(model_dir, batch, args.context, args.steps)
    else:
        import transformers

        loader = transformers.AutoModelForCausalLM.from_pretrained

        def load(*a: Any, **k: Any) -> Any:
            model = loader(*a, **k)
            mark()
            return model

        transformers.AutoModelForCausalLM.from_pretrained = load  # type: ignore[method-assign]
        times = reference_case(model_dir, batch, args.steps)
    peak = peak_rss()
    print(
        json.dumps(
            {
                "case": args.case,
                "context": args.context,
                "seconds_per_step": times[-1],
                "step_peak_gib": (peak - baseline["value"]) / 2**30,
                "process_peak_gib": peak / 2**30,
            }
        ),
        flush=True,
    )


def logprob_difference(model_dir: Path, context: int, response: int, rows: int) -> float:
    """Max |memrl pi_old - TRL log-probs| over the response tokens of one batch."""
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import selective_log_softmax

    from memrl.train.group_trainer import GroupTrainer, GroupTrainerConfig
    from memrl.train.policy import LoraSettings, PolicySpec
    from memrl.train.rows import Row

    prompt, responses, advantages = make_batch(context, response, rows)
    trainer = GroupTrainer(
        PolicySpec(base=str(model_dir)),
        GroupTrainerConfig(lora=LoraSettings(enabled=False), max_tokens_per_micro_batch=context),
    )
    trainer.model.eval()
    ours = trainer._score([Row(prompt, r, a, []) for r, a in zip(responses, advantages, strict=True)], reference=False)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    worst = 0.0
    with torch.no_grad():
        for r, lp in zip(responses, ours, strict=True):
            ids = torch.tensor([prompt + r])
            logits = model(input_ids=ids, logits_to_keep=len(r) + 1).logits[:, :-1][:, -len(r) :]
            theirs = selective_log_softmax(logits, torch.tensor([r]))[0]
            worst = max(worst, float((theirs - lp).abs().max()))
    return worst


def summarize(
    runs: dict[tuple[int, str], list[dict[str, Any]]],
    ooms: list[dict[str, Any]],
    diff: float | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Medians per case and the summary keys of the module docstring."""
    cases = []
    for context in args.contexts:
        row: dict[str, Any] = {"context": context, "rows": args.rows, "response": args.response}
        for case in ("memrl", "reference"):
            got = runs.get((context, case), [])
            for key in ("step_peak_gib", "process_peak_gib", "seconds_per_step"):
                row[f"{case}_{key}"] = statistics.median(r[key] for r in got) if got else None
        if row["memrl_step_peak_gib"] is not None and row["reference_step_peak_gib"] is not None:
            row["peak_ratio"] = row["memrl_step_peak_gib"] / row["reference_step_peak_gib"]
            row["process_peak_ratio"] = row["memrl_process_peak_gib"] / row["reference_process_peak_gib"]
            row["time_ratio"] = row["memrl_seconds_per_step"] / row["reference_seconds_per_step"]
        cases.append(row)
    complete = [c for c in cases if "peak_ratio" in c]
    return {
        "vocab": VOCAB,
        "cases": cases,
        "logprob_max_abs_diff": diff,
        "repeats": max((len(r) for r in runs.values()), default=0),
        "max_peak_ratio": max((c["peak_ratio"] for c in complete), default=None),
        "max_process_peak_ratio": max((c["process_peak_ratio"] for c in complete), default=None),
        "max_time_ratio": max((c["time_ratio"] for c in complete), default=None),
        "ooms": len(ooms),
    }


def summarize_log(path: str, args: argparse.Namespace) -> dict[str, Any]:
    """The summary of the per-case lines an interrupted run printed (``--summarize LOG``)."""
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    ooms, diff = [], None
    for line in Path(path).read_text().splitlines():
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        if "error" in record:
            ooms.append(record)
        elif "case" in record:
            runs.setdefault((record["context"], record["case"]), []).append(record)
        elif "logprob_max_abs_diff" in record and "cases" not in record:
            diff = record["logprob_max_abs_diff"]
    args.contexts = sorted({c for c, _ in runs} | {o["context"] for o in ooms})
    return summarize(runs, ooms, diff, args)


def main() -> None:
    parser = bench_parser(__doc__, seed=False)
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 8192, 16384])
    parser.add_argument("--response", type=int, default=256, help="response tokens per row")
    parser.add_argument("--rows", type=int, default=4, help="rows of the group")
    parser.add_argument("--steps", type=int, default=2, help="steps per case (the last one is timed)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of every case (medians reported)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds before a case counts as failed")
    parser.add_argument("--case", choices=["memrl", "reference"], help=argparse.SUPPRESS)
    parser.add_argument("--context", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument(
        "--summarize", metavar="LOG", help="only summarise the per-case lines of an earlier run's output"
    )
    args = parser.parse_args()
    pin_threads(args.threads)
    if args.summarize:
        emit(summarize_log(args.summarize, args))
        return
    if args.case:
        run_case(args)
        return
    with tempfile.TemporaryDirectory(prefix="trainer-scaling-") as tmp:
        model_dir = build_model(Path(tmp) / "model", max(args.contexts) + 1)
        diff = logprob_difference(model_dir, min(args.contexts), args.response, args.rows)
        emit({"logprob_max_abs_diff": diff})
        runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
        ooms = []
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for rep in range(args.repeats):
            for context in args.contexts:
                order = ["memrl", "reference"] if rep % 2 == 0 else ["reference", "memrl"]
                for case in order:
                    cmd = [
                        sys.executable,
                        "-m",
                        "benchmarks.trainer_scaling",
                        "--case",
                        case,
                        "--context",
                        str(context),
                        "--model-dir",
                        str(model_dir),
                        "--response",
                        str(args.response),
                        "--rows",
                        str(args.rows),
                        "--steps",
                        str(args.steps),
                    ]
                    try:
                        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
                        failed = proc.returncode != 0
                    except subprocess.TimeoutExpired:
                        proc, failed = None, True
                    if failed:
                        ooms.append(
                            {
                                "case": case,
                                "context": context,
                                "repeat": rep,
                                "error": (proc.stderr[-800:] if proc else "timeout"),
                            }
                        )
                        emit(ooms[-1])
                        continue
                    result = json.loads(proc.stdout.strip().splitlines()[-1])
                    runs.setdefault((context, case), []).append(result)
                    emit({**result, "repeat": rep})
    emit(summarize(runs, ooms, diff, args), args.json_out)


if __name__ == "__main__":
    main()
