"""The group trainer at the recipes' shapes on one GPU: peak memory against ``memrl plan``, tokens/s, MFU, and the
same batches through a TRL-style reference.

Models: random-initialised, bf16, built on the machine (no download) with the shapes of
``configs/oat_grpo_sam_qwen3.5-9b.yaml``'s base as ``memrl plan`` assumes it (``qwen3.5-9b``: hidden 4096, 32 layers,
vocab 248,320, every layer full attention) and Qwen3-4B's (``qwen3-4b``, the 1.7B-4B class); ``--quick`` a tiny one.
Trainer settings: the recipe's ``trainer`` section (token budget ``max_tokens_per_micro_batch`` 32768, logit chunks,
bf16, clip ranges) with ``deepspeed`` off (one GPU), LoRA or full weights, one optimizer step per step, gradient
checkpointing only where ``memrl plan`` says the run does not fit without it (``--gradient-checkpointing auto``); the
plan is ``memrl plan``'s (``plan_recipe``) for exactly that config, one node of one GPU, ``--model-config`` the built
model's ``config.json``.

Workloads, each a list of groups (advantages from rewards 0/1/2/..., so no group is dropped):

- ``ctx<N>``: equal-length rows of N tokens (a prompt of N - 256 shared by a group's rows, 256 response tokens), as
  many as fill the token budget (at least 2): packing has nothing to save, so the ratio measures the implementation.
- ``mix``: memory calls as OAT-GRPO produces them: groups of 4 siblings answering 10-400 tokens after a prompt of
  1K-16K tokens (log-uniform), groups added until the rows hold ``--mix-tokens`` tokens.

Implementations, each in its own process per (shape, mode) (the mix, then the contexts from the longest):

- ``memrl``: ``GroupTrainer.step`` (scores pi_old, then one clipped-surrogate optimizer step over packed micro-batches,
  each row attending to itself through memrl.train.attention; each record names the path and kernel in ``attention``).
- ``reference``: TRL's GRPO log-prob path: prompts left-padded and completions right-padded to the longest in the
  micro-batch, ``model(..., attention_mask, logits_to_keep=C + 1)``, ``logits[:, :-1]``,
  ``trl.trainer.utils.selective_log_softmax`` (entropy under no grad, as TRL logs it), the same clipped token-mean
  loss, pi_old rescored under no grad first, ``clip_grad_norm_``, AdamW; the same model, LoRA, dtype, autocast and
  gradient checkpointing. Its micro-batch is a fixed row count, as TRL's ``per_device_train_batch_size``: the most
  rows of the workload's longest row that fit the token budget.

Per workload and implementation: ``seconds_per_step`` (median of ``--steps`` timed steps after ``--warmup``),
``tokens_per_s`` (real tokens: prompt + response of every row, over the step), ``mfu`` (model FLOPs of the step, see
:func:`step_flops`, over seconds times the device's bf16 matrix peak measured here on an 8192^3 product), and memory:
on CUDA ``peak_gib`` (``max_memory_allocated`` over a step), ``reserved_peak_gib``, ``weights_gib`` (allocated once
the model is loaded) and ``resident_gib`` (allocated between steps); on CPU the peak anonymous RSS above the level
before the model loaded (a test of the plumbing, not of the plan's GPU figures). An out-of-memory is recorded
(``oom``) and the process goes on with the next workload; workloads not started within ``--time-budget-s`` are
reported as skipped.

    python benchmarks/gpu_trainer.py                                  # both shapes, LoRA and full, 4K-32K, the mix
    python benchmarks/gpu_trainer.py --shapes qwen3.5-9b --modes lora # one shape
    python benchmarks/gpu_trainer.py --device cpu --quick             # tiny shapes on CPU (how it is tested)

The last line is one JSON object: ``cases`` (per shape, mode and workload: both implementations, the plan's terms,
``plan_error`` = measured peak / plan total - 1, ``plan_terms_gib`` (measured and planned weights, optimizer states, and
the step's transient memory against activations + logits), ``speed_ratio`` = memrl tokens/s over the reference's,
``memory_ratio`` = memrl peak over the reference's) and ``summary``: ``max_abs_plan_error`` (target <= 0.15),
``min_speed_ratio_equal`` (target >= 1.0), ``min_speed_ratio_mix`` (target >= 1.5), ``max_memory_ratio`` (target
<= 1.0), ``ooms``, ``oom_9b_lora_32k`` (target false) and ``mix_padding_overhead`` (the reference's padded tokens
over real ones).
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
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from memrl.launch.plan import MODEL_SHAPES

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "oat_grpo_sam_qwen3.5-9b.yaml"
GIB = 2**30
RESPONSE = 256  # response tokens of an equal-length row
MIX_PROMPT = (1024, 16384)  # prompt tokens of a memory call (log-uniform)
MIX_RESPONSE = (10, 400)  # its answer's tokens (uniform)
SIBLINGS = 4  # rows of a mix group (the recipe's branch_factor)

# Qwen3 (dense) configs from memrl plan's table of shapes: the 9B it assumes, Qwen3-4B's published shape, a tiny one.
SHAPES: dict[str, dict[str, Any]] = {
    name: MODEL_SHAPES[name].to_hf_config() for name in ("qwen3.5-9b", "qwen3-4b", "tiny")
}


# --------------------------------------------------------------------------------------------------------------------
# Workloads
def equal_length_workload(context: int, budget: int, vocab: int, seed: int) -> list[dict[str, Any]]:
    """Groups of equal-length rows filling ``budget`` tokens (2 rows at least; up to 4 per group)."""
    g = random.Random(seed)
    rows = max(2, budget // context)
    response = min(RESPONSE, context // 2)
    groups = []
    while rows > 0:
        n = min(SIBLINGS, rows) if rows - min(SIBLINGS, rows) != 1 else 2  # never leave a one-row group
        prompt = [g.randrange(10, vocab) for _ in range(context - response)]
        responses = [[g.randrange(10, vocab) for _ in range(response)] for _ in range(n)]
        groups.append({"prompt": prompt, "responses": responses})
        rows -= n
    return groups


def mix_workload(
    tokens: int,
    vocab: int,
    seed: int,
    prompt_range: tuple[int, int] = MIX_PROMPT,
    response_range: tuple[int, int] = MIX_RESPONSE,
) -> list[dict[str, Any]]:
    """Memory-call groups (see the module docstring) until the rows hold ``tokens`` tokens."""
    g = random.Random(seed)
    groups, total = [], 0
    while total < tokens:
        lo, hi = prompt_range
        prompt_len = int(math.exp(g.uniform(math.log(lo), math.log(hi))))
        prompt = [g.randrange(10, vocab) for _ in range(prompt_len)]
        responses = [[g.randrange(10, vocab) for _ in range(g.randint(*response_range))] for _ in range(SIBLINGS)]
        groups.append({"prompt": prompt, "responses": responses})
        total += sum(prompt_len + len(r) for r in responses)
    return groups


def as_groups(workload: list[dict[str, Any]]) -> list[Any]:
    """memrl :class:`Group` s with rewards 0, 1, ... and their group-normalised advantages."""
    from memrl.data.schemas import Group, GroupSample
    from memrl.rewards.advantage import group_advantages

    out = []
    for k, w in enumerate(workload):
        rewards = [float(i) for i in range(len(w["responses"]))]
        samples = [
            GroupSample(response_ids=r, reward=x, advantage=a)
            for r, x, a in zip(w["responses"], rewards, group_advantages(rewards), strict=True)
        ]
        out.append(Group(group_id=f"g{k}", prompt_ids=w["prompt"], samples=samples))
    return out


def row_lengths(workload: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(prompt, response) tokens of every row."""
    return [(len(w["prompt"]), len(r)) for w in workload for r in w["responses"]]


def reference_micro_batches(
    workload: list[dict[str, Any]], budget: int
) -> list[list[tuple[list[int], list[int], float]]]:
    """The reference's micro-batches of (prompt, response, advantage) rows: in group order, a fixed row count each
    (TRL's ``per_device_train_batch_size``), the most rows of the workload's longest row that fit ``budget``."""
    from memrl.rewards.advantage import group_advantages

    rows = []
    for w in workload:
        advantages = group_advantages([float(i) for i in range(len(w["responses"]))])
        rows.extend((w["prompt"], r, a) for r, a in zip(w["responses"], advantages, strict=True))
    longest = max(len(p) + len(r) for p, r, _ in rows)
    per = max(1, budget // longest)
    return [rows[i : i + per] for i in range(0, len(rows), per)]


def padded_tokens(micro_batches: list[list[tuple[list[int], list[int], float]]]) -> int:
    """Tokens the reference computes: every row padded to its micro-batch's longest prompt plus longest response."""
    return sum(len(mb) * (max(len(p) for p, _, _ in mb) + max(len(r) for _, r, _ in mb)) for mb in micro_batches)


def step_flops(shape: Any, rows: list[tuple[int, int]], lora: bool) -> float:
    """Model FLOPs of one trainer step (what MFU counts; recomputation for gradient checkpointing is not counted).

    Per row of L = prompt + response tokens, forward: 2 * (decoder-layer parameters) * L for the matrix products,
    2 * layers * (q heads x head_dim) * L^2 for causal attention (QK^T and AV, half the square each), and the LM head
    2 * hidden * vocab on the response tokens only. The step is a no-grad scoring forward (pi_old), a training
    forward and its backward: twice the forward with full weights; with LoRA the frozen weights need only the
    activations' gradients (once the forward's matrix products and head) while attention's backward stays twice its
    forward.
    """
    q = shape.heads * shape.head_dim
    matmul = attention = head = 0.0
    for prompt, response in rows:
        length = prompt + response
        matmul += 2.0 * shape.layers * shape.layer_params * length
        attention += 2.0 * shape.layers * q * length * length
        head += 2.0 * shape.hidden * shape.vocab * response
    forward = matmul + attention + head
    backward = 2 * attention + (matmul + head if lora else 2 * (matmul + head))
    return 2 * forward + backward


# --------------------------------------------------------------------------------------------------------------------
# Recipe, plan and model
def recipe_config(mode: str, budget: int | None, quick: bool, checkpointing: bool | None = None) -> Any:
    """The recipe's OAT-GRPO config with the trainer on one GPU: no DeepSpeed, LoRA or full, one optimizer step, the
    token budget ``budget`` (None: the recipe's), gradient checkpointing as ``checkpointing`` says (None: the
    recipe's)."""
    from memrl.data.config import load_config
    from memrl.launch.cli import JOBS

    job = next(j for j in JOBS if j.path == ("train", "oat-grpo"))
    overrides = [
        "trainer.deepspeed=null",
        f"trainer.lora.enabled={str(mode == 'lora').lower()}",
        "trainer.micro_batches=1",
        "trainer.optimizer_steps_per_epoch=1",
        "trainer.update_epochs=1",
    ]
    if budget is not None:
        overrides.append(f"trainer.max_tokens_per_micro_batch={budget}")
    if quick:
        overrides.append("trainer.logit_chunk_tokens=64")
    if checkpointing is not None:
        overrides.append(f"trainer.gradient_checkpointing={str(checkpointing).lower()}")
    return load_config(job.load("config"), RECIPE, overrides)


def needs_checkpointing(mode: str, budget: int, quick: bool, model_dir: Path, gpu_gib: float, choice: str) -> bool:
    """Gradient checkpointing only where memory needs it: ``auto`` turns it on when ``memrl plan`` of the run without
    it exceeds 90% of the GPU (the rest for the CUDA context and the allocator); ``on`` / ``off`` as said."""
    if choice != "auto":
        return choice == "on"
    return plan_terms(recipe_config(mode, budget, quick, False), model_dir, gpu_gib)["total"] > 0.9 * gpu_gib


def plan_terms(cfg: Any, model_dir: Path, gpu_gib: float) -> dict[str, float]:
    """``memrl plan --model-config MODEL/config.json --nodes 1 --gpus-per-node 1`` for ``cfg``: its trainer terms in
    GiB (unrounded: the tiny shape's are fractions of a MiB)."""
    from memrl.launch.plan import plan_recipe

    plan = plan_recipe(cfg, nodes=1, gpus_per_node=1, gpu_gib=gpu_gib, model_config=str(model_dir / "config.json"))
    t = plan.trainer
    terms = {
        "parameters": t.parameters,
        "gradients_and_optimizer": t.gradients_and_optimizer,
        "activations": t.activations,
        "logits": t.logits,
        "total": t.total,
    }
    return {k: v / GIB for k, v in terms.items()}


def build_model(shape_name: str, out: str | Path, device: str) -> Path:
    """A random bf16 Qwen3 of ``SHAPES[shape_name]`` (initialised on ``device``), saved with the tiny tokenizer (the
    trainer loads one; its ids are never used here)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from memrl.rollout.models import TinyModelSpec, ensure_tiny_model, load_tokenizer

    out = Path(out)
    if (out / "config.json").is_file():
        return out
    tokenizer = load_tokenizer(ensure_tiny_model(ROOT / ".cache" / "models", TinyModelSpec()))
    config = Qwen3Config(
        **SHAPES[shape_name],
        max_position_embeddings=65_536,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        dtype="bfloat16",
    )
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # initialised in bf16: a 9B model in fp32 would need 33 GB first
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    partial = out.with_name(out.name + ".partial")
    model.save_pretrained(partial, safe_serialization=True, max_shard_size="5GB")
    tokenizer.save_pretrained(partial)
    partial.rename(out)
    return out


def measure_peak_tflops(device: str, quick: bool) -> float:
    """The device's bf16 matrix-product rate: median of 10 timed products on random data after 3 warm-ups. On a CPU
    (the dry run) the products are 256-square: on a CPU without native bf16 a 1024-square one took about 2 s."""
    n = 256 if device == "cpu" else 1024 if quick else 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    times = []
    for i in range(13):
        sync(device)
        start = time.perf_counter()
        a @ b
        sync(device)
        if i >= 3:
            times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times) / 1e12


def probe_device(device: str, quick: str) -> None:
    """Child process: print the device's name, memory (GiB) and measured bf16 matrix rate as one JSON line."""
    cuda = device == "cuda"
    print(
        json.dumps(
            {
                "name": torch.cuda.get_device_name() if cuda else f"cpu ({os.cpu_count()} cores)",
                "gib": torch.cuda.get_device_properties(0).total_memory / GIB if cuda else 80.0,
                "peak_bf16_tflops": measure_peak_tflops(device, quick == "True"),
            }
        )
    )


def child_env(device: str, parent: Mapping[str, str]) -> dict[str, str]:
    """The environment of a measuring child: this checkout first on its path, then the caller's ``PYTHONPATH`` (where
    tests/gpu/run.sh put the carried wheels: the first H200 run lost them and failed on ``import pydantic``)."""
    path = os.pathsep.join(filter(None, [str(ROOT), parent.get("PYTHONPATH")]))
    env = {**parent, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the trainer's accelerator takes CUDA whenever it sees one
    return env


def in_child(function: str, arguments: list[str], env: dict[str, str]) -> str:
    """Run ``function(*arguments)`` of this module in a fresh process; its stdout (a failure raises with stderr)."""
    code = f"import sys; from benchmarks.gpu_trainer import {function}; {function}(*sys.argv[1:])"
    proc = subprocess.run(
        [sys.executable, "-c", code, *arguments], env=env, cwd=ROOT, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{function}{tuple(arguments)} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# --------------------------------------------------------------------------------------------------------------------
# Memory
class Memory:
    """Per-step peak memory: CUDA's allocator statistics, or on CPU the sampled anonymous RSS (memrl plan's
    ``_PeakSampler``) above the level before the model loaded."""

    def __init__(self, device: str) -> None:
        self.device, self.base = device, 0
        if device == "cpu":
            self.base = self._now()

    def _now(self) -> int:
        from memrl.launch.plan import _anonymous_rss

        return torch.cuda.memory_allocated() if self.device == "cuda" else _anonymous_rss() - self.base

    def allocated_gib(self) -> float:
        """What is held now (weights, optimizer states, anything kept between steps)."""
        return self._now() / GIB

    def measure(self, fn: Any) -> tuple[Any, dict[str, float]]:
        """Run ``fn`` and return (its result, peak_gib and on CUDA reserved_peak_gib)."""
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            out = fn()
            return out, {
                "peak_gib": torch.cuda.max_memory_allocated() / GIB,
                "reserved_peak_gib": torch.cuda.max_memory_reserved() / GIB,
            }
        from memrl.launch.plan import _PeakSampler

        with _PeakSampler() as sampler:
            out = fn()
        return out, {"peak_gib": (sampler.peak - self.base) / GIB}


# --------------------------------------------------------------------------------------------------------------------
# The two implementations (child processes)
class MemrlTrainer:
    """``GroupTrainer`` with the recipe's trainer settings."""

    def __init__(self, model_dir: Path, cfg: Any) -> None:
        from memrl.train.group_trainer import GroupTrainer
        from memrl.train.policy import PolicySpec

        self.trainer = GroupTrainer(PolicySpec(base=str(model_dir), dtype=cfg.policy.dtype), cfg.trainer)

    def step(self, workload: list[dict[str, Any]]) -> None:
        self.trainer.step(as_groups(workload))

    def padded_tokens(self, workload: list[dict[str, Any]]) -> int:
        return sum(p + r for p, r in row_lengths(workload))


class ReferenceTrainer:
    """TRL's GRPO log-prob path and loss (see the module docstring) on the same model and settings."""

    def __init__(self, model_dir: Path, cfg: Any, device: str) -> None:
        from trl.trainer.utils import entropy_from_logits, selective_log_softmax

        from memrl.train.policy import PolicySpec, load_policy

        self.selective_log_softmax, self.entropy_from_logits = selective_log_softmax, entropy_from_logits
        t = cfg.trainer
        self.cfg, self.device = t, device
        model, tokenizer = load_policy(PolicySpec(base=str(model_dir), dtype=cfg.policy.dtype), t.lora)
        if t.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model = model.to(device)
        self.pad = tokenizer.pad_token_id
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.params = params
        self.optimizer = torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay, betas=t.adam_betas)

    def micro_batches(self, workload: list[dict[str, Any]]) -> list[list[tuple[list[int], list[int], float]]]:
        return reference_micro_batches(workload, self.cfg.max_tokens_per_micro_batch)

    def padded_tokens(self, workload: list[dict[str, Any]]) -> int:
        return padded_tokens(self.micro_batches(workload))

    def _batch(self, rows: list[tuple[list[int], list[int], float]]) -> tuple[torch.Tensor, ...]:
        """TRL's layout: prompts left-padded, completions right-padded, concatenated."""
        p_len = max(len(p) for p, _, _ in rows)
        c_len = max(len(r) for _, r, _ in rows)
        ids = torch.full((len(rows), p_len + c_len), self.pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        completion_mask = torch.zeros(len(rows), c_len)
        completion = torch.full((len(rows), c_len), self.pad, dtype=torch.long)
        for i, (p, r, _) in enumerate(rows):
            ids[i, p_len - len(p) : p_len] = torch.tensor(p)
            ids[i, p_len : p_len + len(r)] = torch.tensor(r)
            mask[i, p_len - len(p) : p_len + len(r)] = 1
            completion[i, : len(r)] = torch.tensor(r)
            completion_mask[i, : len(r)] = 1
        advantages = torch.tensor([a for _, _, a in rows])
        return tuple(x.to(self.device) for x in (ids, mask, completion, completion_mask, advantages))

    def _per_token_logps(self, ids: torch.Tensor, mask: torch.Tensor, completion: torch.Tensor) -> torch.Tensor:
        n = completion.shape[1]
        with torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.cfg.bf16):
            logits = self.model(input_ids=ids, attention_mask=mask, logits_to_keep=n + 1, use_cache=False).logits
        logits = logits[:, :-1, :][:, -n:]  # the last logit predicts the token after the completion
        logps = self.selective_log_softmax(logits, completion)
        if self.cfg.log_entropy:
            with torch.no_grad():
                self.entropy_from_logits(logits)
        return logps

    def step(self, workload: list[dict[str, Any]]) -> None:
        t = self.cfg
        batches = [self._batch(mb) for mb in self.micro_batches(workload)]
        total_tokens = sum(float(b[3].sum()) for b in batches)
        self.model.eval()
        with torch.no_grad():
            old = [self._per_token_logps(ids, mask, c) for ids, mask, c, _, _ in batches]
        self.model.train()
        for (ids, mask, completion, completion_mask, advantages), old_logps in zip(batches, old, strict=True):
            logps = self._per_token_logps(ids, mask, completion)
            ratio = torch.exp(logps - old_logps)
            a = advantages.unsqueeze(1)
            per_token = -torch.min(ratio * a, torch.clamp(ratio, 1 - t.clip_low, 1 + t.clip_high) * a)
            ((per_token * completion_mask).sum() / total_tokens).backward()
        torch.nn.utils.clip_grad_norm_(self.params, t.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad()


def run_child(args: argparse.Namespace) -> None:
    """One (shape, mode, implementation): every workload in turn, one JSON line each."""
    from memrl.launch.plan import model_shape

    device, model_dir = args.device, Path(args.model_dir)
    cfg = recipe_config(args.mode, args.budget, args.quick, args.gradient_checkpointing == "on")
    shape, _ = model_shape("", str(model_dir / "config.json"))
    import accelerate  # noqa: F401  library imports before the CPU baseline
    import peft  # noqa: F401
    import transformers  # noqa: F401

    if args.impl == "reference":
        import trl.trainer.utils  # noqa: F401
    memory = Memory(device)
    start = time.perf_counter()
    impl = MemrlTrainer(model_dir, cfg) if args.impl == "memrl" else ReferenceTrainer(model_dir, cfg, device)
    load_s = time.perf_counter() - start
    weights_gib = memory.allocated_gib()
    attention = "padded, the model's sdpa with a padding mask"
    if args.impl == "memrl":
        from memrl.train.attention import packed_kernel_for

        dtype = torch.bfloat16 if cfg.trainer.bf16 else torch.float32
        attention = impl.trainer.accelerator.unwrap_model(impl.trainer.model).config._attn_implementation
        attention += f" ({packed_kernel_for(torch.device(device), dtype)} kernel)"
    workloads = json.loads(Path(args.workloads).read_text())
    for name, workload in workloads.items():
        record: dict[str, Any] = {
            "impl": args.impl,
            "shape": args.shape,
            "mode": args.mode,
            "workload": name,
            "weights_gib": weights_gib,
            "load_s": load_s,
            "gradient_checkpointing": cfg.trainer.gradient_checkpointing,
            "attention": attention,
        }
        if time.time() > args.deadline:
            record["skipped"] = "--time-budget-s spent"
            print(json.dumps(record), flush=True)
            continue
        times, peaks = [], []
        try:
            for i in range(args.warmup + args.steps):
                sync(device)
                t0 = time.perf_counter()
                _, peak = memory.measure(lambda w=workload: (impl.step(w), sync(device)))
                if i >= args.warmup:
                    times.append(time.perf_counter() - t0)
                    peaks.append(peak)
        except torch.OutOfMemoryError as exc:
            record.update(oom=True, error=str(exc).splitlines()[0][:300])
            impl_step_cleanup(impl)
        else:
            rows = row_lengths(workload)
            seconds = statistics.median(times)
            tokens = sum(p + r for p, r in rows)
            record.update(
                oom=False,
                seconds_per_step=seconds,
                tokens=tokens,
                padded_tokens=impl.padded_tokens(workload),
                tokens_per_s=tokens / seconds,
                model_tflops_per_step=step_flops(shape, rows, args.mode == "lora") / 1e12,
                resident_gib=memory.allocated_gib(),
                **{k: max(p[k] for p in peaks) for k in peaks[0]},
            )
        print(json.dumps(record), flush=True)


def impl_step_cleanup(impl: Any) -> None:
    """After an out-of-memory: drop gradients and cached blocks so the process can report and go on."""
    import gc

    model = getattr(impl, "model", None) or impl.trainer.model
    for p in model.parameters():
        p.grad = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------------------------------
# The parent: build, plan, run the children, summarise
def summarize(
    records: list[dict[str, Any]],
    plans: dict[tuple[str, str], dict[str, float]],
    peak_tflops: float,
    device_name: str,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Pair the implementations per case and compute the summary keys of the module docstring."""
    cases: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in records:
        key = (r["shape"], r["mode"], r["workload"])
        case = cases.setdefault(key, {"shape": r["shape"], "mode": r["mode"], "workload": r["workload"]})
        measured = {k: v for k, v in r.items() if k not in ("impl", "shape", "mode", "workload")}
        if "seconds_per_step" in measured:
            measured["mfu"] = measured["model_tflops_per_step"] / measured["seconds_per_step"] / peak_tflops
        case[r["impl"]] = measured
    out = []
    for (shape, mode, _), case in cases.items():
        case["plan_gib"] = plans.get((shape, mode))
        ours, ref = case.get("memrl", {}), case.get("reference", {})
        plan = case["plan_gib"]
        if "peak_gib" in ours and plan:
            case["plan_error"] = ours["peak_gib"] / plan["total"] - 1
            # (measured, plan) per term. Between steps the gradients are freed (zero_grad sets them to None), so
            # they show in the step's transient memory, not in the states the plan lists them with.
            case["plan_terms_gib"] = {
                "parameters": (ours["weights_gib"], plan["parameters"]),
                "optimizer_states_between_steps": (
                    ours["resident_gib"] - ours["weights_gib"],
                    plan["gradients_and_optimizer"],
                ),
                "step_transient": (ours["peak_gib"] - ours["resident_gib"], plan["activations"] + plan["logits"]),
            }
        if "tokens_per_s" in ours and "tokens_per_s" in ref:
            case["speed_ratio"] = ours["tokens_per_s"] / ref["tokens_per_s"]
        if "peak_gib" in ours and "peak_gib" in ref:
            case["memory_ratio"] = ours["peak_gib"] / ref["peak_gib"]
        out.append(case)

    def values(key: str, mix: bool | None = None) -> list[float]:
        return [c[key] for c in out if key in c and (mix is None or (c["workload"] == "mix") == mix)]

    ooms = [c for c in out for impl in ("memrl", "reference") if c.get(impl, {}).get("oom")]
    big = [c for c in out if c["shape"] == "qwen3.5-9b" and c["mode"] == "lora" and c["workload"] == "ctx32768"]
    mix_ref = [c["reference"] for c in out if c["workload"] == "mix" and "padded_tokens" in c.get("reference", {})]
    return {
        "device": device_name,
        "peak_bf16_tflops": peak_tflops,
        "budget": args.budget,
        "cases": out,
        "summary": {
            "max_abs_plan_error": max((abs(v) for v in values("plan_error")), default=None),
            "min_speed_ratio_equal": min(values("speed_ratio", mix=False), default=None),
            "min_speed_ratio_mix": min(values("speed_ratio", mix=True), default=None),
            "max_memory_ratio": max(values("memory_ratio"), default=None),
            "max_mfu": max((c["memrl"]["mfu"] for c in out if "mfu" in c.get("memrl", {})), default=None),
            "ooms": len(ooms),
            "oom_9b_lora_32k": bool(big[0].get("memrl", {}).get("oom")) if big and "memrl" in big[0] else None,
            "mix_padding_overhead": (max(r["padded_tokens"] / r["tokens"] for r in mix_ref) - 1) if mix_ref else None,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="the tiny shape, short contexts, one timed step")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), help="default: qwen3.5-9b qwen3-4b (tiny)")
    parser.add_argument("--modes", nargs="+", choices=["lora", "full"], default=["lora", "full"])
    parser.add_argument("--contexts", type=int, nargs="+", help="default: 4096 8192 16384 32768 (quick: 256)")
    parser.add_argument("--budget", type=int, help="tokens per micro-batch (default: the recipe's; quick: 1024)")
    parser.add_argument("--mix-tokens", type=int, help="tokens of the mix workload (default: the budget)")
    parser.add_argument("--no-mix", action="store_true", help="skip the realistic length mix")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per workload")
    parser.add_argument("--steps", type=int, help="timed steps per workload (median; default 2, quick 1)")
    parser.add_argument("--gpu-gib", type=float, help="the plan's GPU size (default: the device's)")
    parser.add_argument(
        "--gradient-checkpointing",
        choices=["auto", "on", "off"],
        default="auto",
        help="auto (default): on only where memrl plan says the run without it does not fit the GPU",
    )
    parser.add_argument(
        "--fit-only",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="skip (shape, mode) pairs whose plan total exceeds the GPU (default: on)",
    )
    parser.add_argument(
        "--time-budget-s",
        type=float,
        default=float("inf"),
        help="start no new workload after this many seconds (the rest are reported as skipped)",
    )
    parser.add_argument("--out", type=Path, help="folder for the built models and per-case lines (default: a temp)")
    parser.add_argument("--impl", choices=["memrl", "reference"], help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--workloads", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, default=float("inf"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.budget is None:
        args.budget = 1024 if args.quick else recipe_config("lora", None, False).trainer.max_tokens_per_micro_batch
    if args.steps is None:
        args.steps = 1 if args.quick else 2
    if args.impl:
        run_child(args)
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (use --device cpu --quick)")
    shapes = args.shapes or (["tiny"] if args.quick else ["qwen3.5-9b", "qwen3-4b"])
    contexts = args.contexts or ([256] if args.quick else [4096, 8192, 16384, 32768])
    mix_tokens = args.mix_tokens or args.budget
    started = time.perf_counter()
    deadline = time.time() + args.time_budget_s
    env = child_env(args.device, os.environ)
    # Every CUDA context lives in a child: one held here would take GPU memory from the measured processes.
    device = json.loads(in_child("probe_device", [args.device, str(args.quick)], env).splitlines()[-1])
    device_name, peak_tflops = device["name"], device["peak_bf16_tflops"]
    gpu_gib = args.gpu_gib or device["gib"]
    print(json.dumps(device), flush=True)
    tmp = None
    if args.out is None:
        tmp = tempfile.TemporaryDirectory(prefix="gpu-trainer-")
        args.out = Path(tmp.name)
    args.out.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    plans: dict[tuple[str, str], dict[str, float]] = {}
    lines = (args.out / "gpu_trainer.jsonl").open("a")
    try:
        for shape_name in shapes:
            vocab = SHAPES[shape_name]["vocab_size"]
            # The mix and the longest context first: what the targets need most, should the time budget run out.
            workloads = {}
            if not args.no_mix:
                prompts = (MIX_PROMPT[0] // 16, MIX_PROMPT[1] // 16) if args.quick else MIX_PROMPT
                responses = (MIX_RESPONSE[0], MIX_RESPONSE[1] // 4) if args.quick else MIX_RESPONSE
                workloads["mix"] = mix_workload(
                    mix_tokens, vocab, seed=1, prompt_range=prompts, response_range=responses
                )
            for c in sorted(contexts, reverse=True):
                workloads[f"ctx{c}"] = equal_length_workload(c, args.budget, vocab, seed=c)
            workload_file = args.out / f"workloads-{shape_name}.json"
            workload_file.write_text(json.dumps(workloads))
            model_dir = args.out / f"model-{shape_name}"
            in_child("build_model", [shape_name, str(model_dir), args.device], env)
            for mode in args.modes:
                checkpointing = needs_checkpointing(
                    mode, args.budget, args.quick, model_dir, gpu_gib, args.gradient_checkpointing
                )
                plan = plan_terms(recipe_config(mode, args.budget, args.quick, checkpointing), model_dir, gpu_gib)
                plans[(shape_name, mode)] = plan
                line = {"shape": shape_name, "mode": mode, "gradient_checkpointing": checkpointing, "plan_gib": plan}
                print(json.dumps(line), flush=True)
                if args.fit_only and args.device == "cuda" and plan["total"] > gpu_gib:
                    record = {
                        "shape": shape_name,
                        "mode": mode,
                        "skipped": f"the plan needs {plan['total']:.1f} GiB "
                        f"of {gpu_gib:.0f} (--no-fit-only runs it anyway)",
                    }
                    print(json.dumps(record), flush=True)
                    continue
                for impl in ("memrl", "reference"):
                    if time.time() > deadline:
                        print(
                            json.dumps(
                                {"shape": shape_name, "mode": mode, "impl": impl, "skipped": "--time-budget-s spent"}
                            ),
                            flush=True,
                        )
                        continue
                    cmd = [
                        sys.executable,
                        __file__,
                        "--impl",
                        impl,
                        "--shape",
                        shape_name,
                        "--mode",
                        mode,
                        "--model-dir",
                        str(model_dir),
                        "--workloads",
                        str(workload_file),
                        "--device",
                        args.device,
                        "--budget",
                        str(args.budget),
                        "--warmup",
                        str(args.warmup),
                        "--steps",
                        str(args.steps),
                        "--deadline",
                        str(deadline),
                        "--gradient-checkpointing",
                        "on" if checkpointing else "off",
                    ]
                    if args.quick:
                        cmd.append("--quick")
                    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
                    got = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
                    for record in got:
                        print(json.dumps(record), flush=True)
                        lines.write(json.dumps(record) + "\n")
                    lines.flush()
                    records.extend(got)
                    if proc.returncode != 0:
                        failure = {
                            "shape": shape_name,
                            "mode": mode,
                            "impl": impl,
                            "returncode": proc.returncode,
                            "stderr": proc.stderr[-2000:],
                        }
                        failures.append(failure)
                        print(json.dumps(failure), flush=True)
    finally:
        lines.close()
        if tmp is not None:
            tmp.cleanup()
    summary = summarize(records, plans, peak_tflops, device_name, args)
    summary["summary"]["failed_processes"] = len(failures)
    summary["seconds"] = time.perf_counter() - started
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
