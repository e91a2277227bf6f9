"""``memrl plan``: per-rank GPU memory of a GRPO recipe, estimated before launch.

For the trainer ranks: the model states (parameters, gradients, optimizer) under the recipe's ZeRO stage from
DeepSpeed's own estimators (``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs``; plain
DDP and the LoRA adapter's own states counted as PyTorch keeps them), the activations of one micro-batch at the token
budget (``trainer.max_tokens_per_micro_batch``; with gradient checkpointing one layer's worth plus every layer's input;
packed rows build no attention mask, so nothing grows with the budget squared), and the logits of the chunked response
log-probs (``trainer.logit_chunk_tokens`` positions at a time). For the policy's vLLM engine: its memory share
(``placement.policy.gpu_memory_utilization``) split into weights and KV cache. A colocated engine shares rank 0's GPU:
its share counts during rollouts and, unless it sleeps, during updates. A recipe that cannot fit is flagged with the key
to change.

The model's shape comes from ``--model-config`` (a ``config.json``), the base checkpoint's own ``config.json`` when it
is on disk, or, for the recipes' bases before their SFT runs exist, the assumed shapes in :data:`ASSUMED_SHAPES`
(one table with the benchmarks' shapes, :data:`MODEL_SHAPES`, read from ``launch/model_shapes.yaml``).

    memrl plan --config configs/oat_grpo_sam_qwen3.5-9b.yaml --nodes 4 --gpus-per-node 8
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from memrl.data.config import ConfigError
from memrl.rollout.models import ModelShape

__all__ = [
    "ASSUMED_SHAPES",
    "MODEL_SHAPES",
    "EngineEstimate",
    "ModelShape",
    "Plan",
    "TrainerEstimate",
    "engine_memory",
    "measure_trainer_peak",
    "model_shape",
    "plan_recipe",
    "trainer_memory",
]

GIB = 2**30
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


# Named shapes (``launch/model_shapes.yaml``): the recipes' bases, assumed when no config.json is on disk (every layer
# counted as full attention, which over-states the KV cache of hybrid-attention models; --model-config replaces them),
# and the published and tiny shapes the trainer benchmarks and the GPU suite build.
MODEL_SHAPES = {
    name: ModelShape.from_hf_config(config)
    for name, config in yaml.safe_load(Path(__file__).with_name("model_shapes.yaml").read_text()).items()
}
ASSUMED_SHAPES = {name: MODEL_SHAPES[name] for name in ("qwen3.5-9b", "qwen3.5-27b")}


def model_shape(base: str, model_config: str | None = None) -> tuple[ModelShape, str]:
    """(shape, where it came from) of the checkpoint ``base``."""
    if model_config:
        return ModelShape.from_hf_config(json.loads(Path(model_config).read_text())), model_config
    local = Path(base) / "config.json"
    if local.is_file():
        return ModelShape.from_hf_config(json.loads(local.read_text())), str(local)
    for name, shape in ASSUMED_SHAPES.items():
        if name in base.lower():
            return shape, f"assumed shape of {name} (no config.json at {base}; --model-config replaces it)"
    raise ConfigError(f"policy.base {base!r}: no config.json on disk and no assumed shape; pass --model-config")


@dataclass
class TrainerEstimate:
    """Bytes per trainer rank during an update."""

    parameters: int
    gradients_and_optimizer: int
    activations: int
    logits: int
    model_states_source: str
    trainable_params: int
    tokens_per_micro_batch: int

    @property
    def total(self) -> int:
        """Everything at the peak of a micro-batch's backward."""
        return self.parameters + self.gradients_and_optimizer + self.activations + self.logits

    @property
    def resident(self) -> int:
        """What stays between updates (the model states)."""
        return self.parameters + self.gradients_and_optimizer


def _deepspeed_settings(name: str | None) -> tuple[int, bool, bool]:
    """(ZeRO stage or 0 without DeepSpeed, optimizer offloaded, parameters offloaded)."""
    if name is None:
        return 0, False, False
    from memrl.data.config import resolve_deepspeed_config

    zero = json.loads(resolve_deepspeed_config(name).read_text()).get("zero_optimization", {})
    offload = lambda key: zero.get(key, {}).get("device", "none") not in ("none", None)  # noqa: E731
    return int(zero.get("stage", 0)), offload("offload_optimizer"), offload("offload_param")


def trainer_memory(
    shape: ModelShape,
    trainer: Any,
    *,
    nodes: int,
    gpus_per_node: int,
    dtype: str,
    default_tokens: int,
    has_adapter: bool = False,
    gpu: bool = True,
) -> TrainerEstimate:
    """Per-rank trainer memory of ``trainer`` (a :class:`memrl.train.group_trainer.GroupTrainerConfig`) on ``shape``.

    ``dtype`` is the policy's weight dtype; ``default_tokens`` the micro-batch tokens when the trainer has no token
    budget (one row of the engine's ``max_model_len``); ``has_adapter`` whether RL starts from an SFT adapter (what
    the KL reference costs depends on it). ``gpu=False`` sizes the CPU run (no DeepSpeed estimators, the
    fp32 eager path).
    """
    world = nodes * gpus_per_node
    weight_bytes = _DTYPE_BYTES[dtype]
    mixed = trainer.bf16 and gpu
    act_bytes = 2 if mixed or weight_bytes == 2 else 4
    stage, offload_optimizer, offload_params = _deepspeed_settings(trainer.deepspeed)
    lora = trainer.lora.enabled
    trainable = shape.lora_params(trainer.lora.r, list(trainer.lora.target_modules)) if lora else shape.params
    frozen = shape.params if lora else 0
    if stage == 3:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        _, states, gathered = estimate_zero3_model_states_mem_needs(
            trainable, shape.largest_layer_params, gpus_per_node, nodes, offload_optimizer, offload_params
        )
        parameters = gathered + math.ceil(frozen * weight_bytes / world)
        rest = states - gathered
        source = "deepspeed estimate_zero3_model_states_mem_needs"
    elif stage in (1, 2):
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        _, states = estimate_zero2_model_states_mem_needs(trainable, gpus_per_node, nodes, offload_optimizer)
        parameters = 2 * trainable + frozen * weight_bytes
        rest = states - 2 * trainable
        source = "deepspeed estimate_zero2_model_states_mem_needs"
    else:
        # PyTorch AdamW: gradient and two moments in the trainable weights' dtype (a LoRA adapter is kept in fp32)
        trainable_bytes = 4 if lora else weight_bytes
        parameters = trainable * trainable_bytes + frozen * weight_bytes
        rest = 3 * trainable * trainable_bytes
        source = "DDP: weights + gradients + AdamW moments"
    if trainer.kl_coef:  # the KL reference: a frozen full copy on every rank, or a second (frozen) adapter
        if not lora or (has_adapter and trainer.kl_reference == "initial"):
            parameters += shape.params * weight_bytes
        elif has_adapter and trainer.kl_reference == "initial-adapter":
            parameters += trainable * 4
    tokens = trainer.max_tokens_per_micro_batch or default_tokens
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    # What autograd keeps per token and layer with a fused (flash / SDPA) attention: norm inputs and outputs, q/k/v
    # before and after their norms and rotary, the attention output, the residuals, and the SwiGLU's four tensors.
    per_token_layer = act_bytes * (6 * shape.hidden + 4 * q + 4 * kv + 4 * shape.intermediate)
    # Packed rows reach attention with their boundaries and no mask (memrl.train.attention): no term in L^2, only the
    # kernel's fp32 log-sum-exp per head, and on GPU, where the installed varlen_attn has no grouped-query option, the
    # keys and values repeated to every query head that its backward keeps.
    per_token_layer += 4 * shape.heads
    from memrl.train.attention import repeats_kv_heads

    if gpu and kv < q and repeats_kv_heads():
        per_token_layer += act_bytes * 2 * q
    if trainer.gradient_checkpointing:
        activations = tokens * (shape.layers * shape.hidden * act_bytes + per_token_layer)
    else:
        activations = tokens * shape.layers * per_token_layer
    # A chunk of fp32 logits and its probabilities / gradient at once, plus (fused path, trainable head) the fp32
    # head-gradient buffer and its scaled copy.
    chunk = min(trainer.logit_chunk_tokens, tokens)
    logits = 2 * chunk * shape.vocab * 4
    if not lora and stage != 3:
        logits += 2 * shape.vocab * shape.hidden * 4
    return TrainerEstimate(parameters, rest, activations, logits, source, trainable, tokens)


@dataclass
class EngineEstimate:
    """The policy's vLLM engine on each of its GPUs."""

    share: int
    weights: int
    kv_cache: int
    kv_cache_tokens: int
    max_model_len: int
    tensor_parallel_size: int
    mode: str
    sleep_level: int


def engine_memory(shape: ModelShape, placement: Any, max_model_len: int, gpu_bytes: int) -> EngineEstimate:
    """vLLM's share of one GPU split into bf16 weights (over TP) and KV cache (full-attention layers assumed)."""
    tp = placement.tensor_parallel_size
    share = int(placement.gpu_memory_utilization * gpu_bytes)
    weights = math.ceil(shape.params * 2 / tp)
    kv_per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * 2 / tp
    kv_cache = max(share - weights, 0)
    return EngineEstimate(
        share, weights, kv_cache, int(kv_cache / kv_per_token), max_model_len, tp, placement.mode, placement.sleep_level
    )


@dataclass
class Plan:
    """The estimate for one recipe on one cluster shape, and what does not fit."""

    shape: ModelShape
    shape_source: str
    nodes: int
    gpus_per_node: int
    gpu_bytes: int
    reserve_bytes: int
    trainer: TrainerEstimate
    engine: EngineEstimate | None
    problems: list[str]

    @property
    def rank0_update(self) -> int:
        """Rank 0's GPU during an update (a colocated engine that does not sleep keeps its share)."""
        engine = self.engine
        awake = engine is not None and engine.mode == "colocate" and engine.sleep_level == 0
        return self.trainer.total + (engine.share if awake else 0) + self.reserve_bytes

    @property
    def rank0_rollout(self) -> int:
        """Rank 0's GPU during rollouts: the resident model states plus a colocated engine's share."""
        colocated = self.engine is not None and self.engine.mode == "colocate"
        return self.trainer.resident + (self.engine.share if colocated else 0) + self.reserve_bytes

    @property
    def fits(self) -> bool:
        """Whether nothing was flagged."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """Every figure in GiB (JSON)."""
        g = lambda b: round(b / GIB, 2)  # noqa: E731
        t = self.trainer
        out: dict[str, Any] = {
            "model": {**asdict(self.shape), "params": self.shape.params, "source": self.shape_source},
            "cluster": {"nodes": self.nodes, "gpus_per_node": self.gpus_per_node, "gpu_gib": g(self.gpu_bytes)},
            "trainer_per_rank_gib": {
                "parameters": g(t.parameters),
                "gradients_and_optimizer": g(t.gradients_and_optimizer),
                "activations": g(t.activations),
                "logits": g(t.logits),
                "total": g(t.total),
                "model_states_source": t.model_states_source,
                "trainable_params": t.trainable_params,
                "tokens_per_micro_batch": t.tokens_per_micro_batch,
            },
            "rank0_update_gib": g(self.rank0_update),
            "rank0_rollout_gib": g(self.rank0_rollout),
            "reserve_gib": g(self.reserve_bytes),
            "fits": self.fits,
            "problems": self.problems,
        }
        if self.engine is not None:
            e = self.engine
            out["engine_per_gpu_gib"] = {
                "share": g(e.share),
                "weights": g(e.weights),
                "kv_cache": g(e.kv_cache),
                "kv_cache_tokens": e.kv_cache_tokens,
                "max_model_len": e.max_model_len,
                "tensor_parallel_size": e.tensor_parallel_size,
                "mode": e.mode,
                "sleep_level": e.sleep_level,
            }
        return out

    def describe(self) -> str:
        """A human-readable table."""
        g = lambda b: f"{b / GIB:7.2f} GiB"  # noqa: E731
        t, lines = self.trainer, []
        lines.append(f"model: {self.shape.params / 1e9:.2f}B parameters ({self.shape_source})")
        lines.append(f"cluster: {self.nodes} node(s) x {self.gpus_per_node} GPU(s) of {self.gpu_bytes / GIB:.0f} GiB")
        lines.append(f"trainer, per rank ({t.model_states_source}; {t.trainable_params / 1e6:.1f}M trainable):")
        lines.append(f"  parameters              {g(t.parameters)}")
        lines.append(f"  gradients + optimizer   {g(t.gradients_and_optimizer)}")
        lines.append(f"  activations             {g(t.activations)}  ({t.tokens_per_micro_batch} tokens a micro-batch)")
        lines.append(f"  logits                  {g(t.logits)}")
        lines.append(f"  total                   {g(t.total)}")
        if self.engine is not None:
            e = self.engine
            where = f"vLLM, TP {e.tensor_parallel_size}, {e.mode}, sleep {e.sleep_level}"
            lines.append(f"policy engine, per GPU ({where}):")
            lines.append(f"  memory share            {g(e.share)}")
            lines.append(f"  weights                 {g(e.weights)}")
            lines.append(
                f"  KV cache                {g(e.kv_cache)}  ({e.kv_cache_tokens} tokens; max_model_len "
                f"{e.max_model_len})"
            )
        lines.append(
            f"rank 0 (+{self.reserve_bytes / GIB:.0f} GiB reserve): update {g(self.rank0_update)}, "
            f"rollout {g(self.rank0_rollout)} of {g(self.gpu_bytes)}"
        )
        lines.append("fits: yes" if self.fits else "fits: NO")
        lines.extend(f"  - {p}" for p in self.problems)
        return "\n".join(lines)


def plan_recipe(
    cfg: Any,
    *,
    nodes: int,
    gpus_per_node: int,
    gpu_gib: float = 80.0,
    reserve_gib: float = 2.0,
    model_config: str | None = None,
) -> Plan:
    """The :class:`Plan` of an OAT-GRPO or pivot-GRPO config (anything with ``policy``, ``trainer``, ``engine`` and
    ``placement.policy``). ``reserve_gib`` covers the CUDA context, NCCL buffers and allocator fragmentation."""
    shape, source = model_shape(cfg.policy.base, model_config)
    engine_cfg = getattr(cfg, "engine", None)
    max_model_len = (engine_cfg.max_model_len if engine_cfg is not None else None) or 32768
    gpu_bytes, reserve = int(gpu_gib * GIB), int(reserve_gib * GIB)
    trainer = trainer_memory(
        shape,
        cfg.trainer,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        dtype=cfg.policy.dtype,
        default_tokens=max_model_len,
        has_adapter=cfg.policy.adapter is not None,
    )
    placement = cfg.placement.policy
    engine = None
    if engine_cfg is None or engine_cfg.backend == "vllm":
        engine = engine_memory(shape, placement, max_model_len, gpu_bytes)
    plan = Plan(shape, source, nodes, gpus_per_node, gpu_bytes, reserve, trainer, engine, [])
    problems = plan.problems
    if plan.rank0_update > gpu_bytes:
        t = trainer
        if t.activations >= max(t.logits, t.resident) and not cfg.trainer.gradient_checkpointing:
            key = "trainer.gradient_checkpointing=true"
        elif t.activations >= max(t.logits, t.resident):
            key = "trainer.max_tokens_per_micro_batch (lower)"
        elif t.logits >= t.resident:
            key = "trainer.logit_chunk_tokens (lower)"
        elif engine is not None and engine.mode == "colocate" and engine.sleep_level == 0:
            key = "placement.policy.sleep_level=1"
        else:
            key = "trainer.deepspeed (zero3, or an offload config) or trainer.lora.enabled"
        problems.append(f"an update needs {plan.rank0_update / GIB:.1f} GiB on rank 0 of {gpu_gib:g} GiB: change {key}")
    if engine is not None:
        if engine.weights >= engine.share:
            problems.append(
                f"the engine's weights ({engine.weights / GIB:.1f} GiB) exceed its share "
                f"({engine.share / GIB:.1f} GiB): raise placement.policy.gpu_memory_utilization or "
                "placement.policy.tensor_parallel_size"
            )
        elif engine.kv_cache_tokens < max_model_len:
            problems.append(
                f"the engine's KV cache holds {engine.kv_cache_tokens} tokens, less than one "
                f"max_model_len ({max_model_len}): raise placement.policy.gpu_memory_utilization"
            )
        if plan.rank0_rollout > gpu_bytes:
            problems.append(
                f"rollouts need {plan.rank0_rollout / GIB:.1f} GiB on rank 0 (model states + engine "
                f"share): lower placement.policy.gpu_memory_utilization or use placement.policy.mode="
                "separate"
            )
    return plan


# --------------------------------------------------------------------------------------------------------------------
def _anonymous_rss() -> int:
    """Resident anonymous memory of this process (tensors, allocator arenas), in bytes."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no RssAnon line")


class _PeakSampler:
    """Samples :func:`_anonymous_rss` every ``interval_s`` in a thread and keeps the maximum. File-backed pages (the
    libraries' code) are left out on purpose: the kernel's reclaim moves them in and out of RSS at any time."""

    def __init__(self, interval_s: float = 0.002) -> None:
        import threading

        self.interval_s, self.peak = interval_s, _anonymous_rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, _anonymous_rss())

    def __enter__(self) -> _PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _anonymous_rss())


def _measure_child(model_dir: str, trainer_json: str, context: int, response: int, rows: int) -> None:
    """Child process of :func:`measure_trainer_peak`: prints the peak anonymous memory above the pre-load level, in
    bytes."""
    import torch

    from memrl.data.schemas import Group, GroupSample
    from memrl.train.group_trainer import GroupTrainer, GroupTrainerConfig
    from memrl.train.policy import PolicySpec

    cfg = GroupTrainerConfig.model_validate(json.loads(trainer_json))
    # Libraries the trainer imports lazily (a third of a GiB) are not trainer memory: import them before the baseline.
    import accelerate  # noqa: F401
    import peft  # noqa: F401
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(model_dir))]
    before = _anonymous_rss()
    with _PeakSampler() as sampler:
        trainer = GroupTrainer(PolicySpec(base=model_dir), cfg)
        vocab = trainer.accelerator.unwrap_model(trainer.model).config.vocab_size
        g = torch.Generator().manual_seed(0)
        prompt = torch.randint(10, vocab, (context - response,), generator=g).tolist()
        samples = [
            GroupSample(
                response_ids=torch.randint(10, vocab, (response,), generator=g).tolist(),
                reward=float(i % 2),
                advantage=1.0 if i % 2 else -1.0,
            )
            for i in range(rows)
        ]
        for _ in range(2):
            trainer.step([Group(group_id="g", prompt_ids=prompt, samples=samples)])
    print(json.dumps({"peak_bytes": sampler.peak - before}))


def measure_trainer_peak(model_dir: str | Path, trainer: Any, *, context: int, response: int, rows: int) -> int:
    """Peak anonymous resident memory (bytes) of two group-trainer steps on CPU above the level before the model is
    loaded (libraries imported), measured in a fresh process (one group of ``rows`` rows of ``context`` tokens)."""
    code = (
        "import sys; from memrl.launch.plan import _measure_child; "
        "_measure_child(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:]))"
    )
    cmd = [
        sys.executable,
        "-c",
        code,
        str(model_dir),
        trainer.model_dump_json(),
        str(context),
        str(response),
        str(rows),
    ]
    # A clean environment: what this process set for itself (vLLM's LD_PRELOAD and thread settings after an engine
    # start, ACCELERATE_USE_DEEPSPEED from a DeepSpeed trainer on CPU) would change what is measured.
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "TMPDIR", "LANG") or k.endswith("_OFFLINE")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"the measured run failed:\n{proc.stderr[-3000:]}")
    return int(json.loads(proc.stdout.strip().splitlines()[-1])["peak_bytes"])


def run_plan(args: Any) -> int:
    """The ``memrl plan`` command: print the plan (and JSON with ``--json``); exit 1 when the recipe does not fit."""
    from memrl.data.config import read_config_yaml
    from memrl.launch.jobs import JOBS

    loaded = read_config_yaml(Path(args.config))[0]
    command = loaded.get("command") if isinstance(loaded, dict) else None
    jobs = {" ".join(j.path): j for j in JOBS if j.path in (("train", "oat-grpo"), ("train", "pivot-grpo"))}
    if command not in jobs:
        raise ConfigError(
            f"{args.config}: memrl plan sizes GRPO recipes (command one of {sorted(jobs)}), got command {command!r}"
        )
    cfg = jobs[command].load_config(args.config, args.overrides)
    plan = plan_recipe(
        cfg,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        gpu_gib=args.gpu_gib,
        reserve_gib=args.reserve_gib,
        model_config=args.model_config,
    )
    print(plan.describe())
    if args.json:
        print(json.dumps(plan.to_dict()))
    return 0 if plan.fits else 1
