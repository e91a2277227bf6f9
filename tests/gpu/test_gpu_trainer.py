"""``GroupTrainer.step`` in bf16 with LoRA and full weights, gradient checkpointing on and off: every metric finite,
the same numbers twice from one seed, and the policy-gradient objective on a fixed batch falling over a few steps.

The trainer's own accelerator picks the device, so the ``cuda`` cases (marked ``gpu``) need a GPU machine and the
``cpu`` ones (marked ``slow``: the same checks at the same tiny shape, so the logic is verified without a GPU) a
machine without one. Only the public API is
used (constructor, ``step(groups)``, ``model``, config fields), so a refactor of the step's internals keeps it.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

from memrl.data.schemas import Group, GroupSample
from memrl.rewards.advantage import group_advantages
from memrl.train.group_trainer import GroupTrainer, GroupTrainerConfig
from memrl.train.policy import LoraSettings, PolicySpec, response_logprobs

HAS_CUDA = torch.cuda.is_available()
STEPS = 3
# (LoRA, gradient checkpointing): the whole grid on CUDA; on CPU (a minute of the slow suite) the two diagonal cases,
# which between them cover LoRA and full weights, checkpointing on and off.
GRID = [(True, False), (True, True), (False, False), (False, True)]
# protects: (the cpu cases) the bf16 trainer step's finiteness, determinism and learning without a GPU machine
CASES = [
    pytest.param(device, lora, ckpt, marks=mark, id=f"{device}-{'lora' if lora else 'full'}-{'ckpt' if ckpt else 'no'}")
    for device, mark, grid in [("cuda", pytest.mark.gpu, GRID), ("cpu", pytest.mark.slow, [GRID[0], GRID[3]])]
    for lora, ckpt in grid
]
# Timing is the one metric that may differ between two identical runs.
NOT_DETERMINISTIC = {"train_tokens_per_s"}


@pytest.fixture
def fresh_accelerate_state() -> object:
    """Each trainer builds its own accelerator; accelerate keeps one process-wide state whose mixed precision cannot
    change once set (other tests' trainers run in fp32)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    previous = torch.are_deterministic_algorithms_enabled()
    # CUDA kernels with atomics (index_add, scatter_add) are swapped for deterministic ones where PyTorch has them;
    # where it has none it warns and the equality below decides.
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(previous)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def fixed_groups(vocab: int, n_groups: int = 2, samples: int = 4) -> list[Group]:
    """Random prompts and responses of different lengths; rewards 0..samples-1 so every group has variance."""
    g = torch.Generator().manual_seed(0)
    groups = []
    for k in range(n_groups):
        prompt = torch.randint(3, vocab, (20 + 30 * k,), generator=g).tolist()
        rewards = [float(i) for i in range(samples)]
        responses = [torch.randint(3, vocab, (4 + 7 * i,), generator=g).tolist() for i in range(samples)]
        groups.append(
            Group(
                group_id=f"g{k}",
                prompt_ids=prompt,
                samples=[
                    GroupSample(response_ids=r, reward=w, advantage=a)
                    for r, w, a in zip(responses, rewards, group_advantages(rewards), strict=True)
                ],
            )
        )
    return groups


def objective(trainer: GroupTrainer, groups: list[Group]) -> float:
    """-(1/T) sum_i A_i sum_t log pi_theta(y_it): the unclipped policy-gradient loss against fixed advantages, fp32, no
    dropout. The step's own ``loss`` metric is measured at ratio 1 (pi_old is rescored every step), so it cannot show
    progress; this can."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    with torch.no_grad(), torch.autocast(trainer.device.type, enabled=False):
        for group in groups:
            for s in group.samples:
                ids = torch.tensor([group.prompt_ids + s.response_ids], device=trainer.device)
                lp, _ = response_logprobs(model, ids, torch.ones_like(ids))
                total -= s.advantage * float(lp[0, len(group.prompt_ids) - 1 :].float().sum())
                tokens += len(s.response_ids)
    model.train(was_training)
    return total / tokens


def run(model_dir: Path, lora: bool, checkpointing: bool) -> tuple[list[dict[str, float]], list[float], dict]:
    """(metrics per step, objective before and after each step, trainable weights at the end) from seed 0."""
    cfg = GroupTrainerConfig(
        lr=2e-3 if lora else 2e-4,
        bf16=True,
        gradient_checkpointing=checkpointing,
        lora=LoraSettings(enabled=lora, r=8, alpha=16),
        max_tokens_per_micro_batch=128,  # several packed micro-batches per optimizer step
        logit_chunk_tokens=16,
        seed=0,
    )
    torch.manual_seed(0)  # the LoRA adapter's initialisation
    trainer = GroupTrainer(PolicySpec(base=str(model_dir), dtype="bfloat16"), cfg)
    groups = fixed_groups(trainer.accelerator.unwrap_model(trainer.model).config.vocab_size)
    objectives, metrics = [objective(trainer, groups)], []
    for _ in range(STEPS):
        metrics.append(trainer.step(groups))
        objectives.append(objective(trainer, groups))
    weights = {n: p.detach().float().cpu().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    return metrics, objectives, weights


@pytest.mark.parametrize(("device", "lora", "checkpointing"), CASES)
def test_bf16_steps_are_finite_deterministic_and_learn(
    tiny_model_dir: Path, fresh_accelerate_state: object, device: str, lora: bool, checkpointing: bool
) -> None:
    if (device == "cuda") != HAS_CUDA:
        pytest.skip("the trainer's accelerator uses CUDA whenever there is one")
    metrics, objectives, weights = run(tiny_model_dir, lora, checkpointing)
    for step in metrics:
        # scalars, and per optimizer step the diagnostics of each (``optimizer_steps``: a list of dicts)
        scalars = {k: v for k, v in step.items() if not isinstance(v, list)}
        per_step = [
            (f"optimizer_steps[{i}].{k}", v)
            for i, s in enumerate(step.get("optimizer_steps", []))
            for k, v in s.items()
            if isinstance(v, (int, float))
        ]
        bad = {k: v for k, v in [*scalars.items(), *per_step] if not math.isfinite(v)}
        assert not bad, f"non-finite metrics: {bad}"
        assert step["rows"] == 8 and step["grad_norm"] > 0 and "skipped" not in step
    assert all(math.isfinite(j) for j in objectives)
    # Learning: the objective falls step after step and by a clear margin overall.
    assert all(b < a for a, b in itertools.pairwise(objectives)), objectives
    assert objectives[-1] < objectives[0] - 0.05 * abs(objectives[0]), objectives

    again_metrics, again_objectives, again_weights = run(tiny_model_dir, lora, checkpointing)
    assert again_objectives == objectives
    for step, again in zip(metrics, again_metrics, strict=True):
        assert {k: v for k, v in step.items() if k not in NOT_DETERMINISTIC} == {
            k: v for k, v in again.items() if k not in NOT_DETERMINISTIC
        }
    assert weights.keys() == again_weights.keys()
    assert all(torch.equal(weights[n], again_weights[n]) for n in weights)


def test_hybrid_model_rows_are_scored_one_per_forward(
    tiny_model_dir: Path, fresh_accelerate_state: object, tmp_path: Path
) -> None:
    """Qwen3.5's linear-attention layers would carry one packed row's state into the next (the strict xfail in
    test_gpu_packing.py): the trainer gives each row of such a model a forward of its own, so its log-probs equal
    the padded per-row forward, while a dense model's rows still share packed micro-batches."""
    import importlib
    import shutil

    from tests.gpu.models import padded_logprobs, random_rows, tiny_causal_lm

    if not hasattr(importlib.import_module("transformers"), "Qwen3_5TextConfig"):
        pytest.skip("this transformers has no Qwen3.5")
    hybrid = tmp_path / "qwen3_5"
    tiny_causal_lm("qwen3_5", "sdpa", torch.device("cpu"), torch.float32).save_pretrained(hybrid)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_model_dir / name).is_file():
            shutil.copy(tiny_model_dir / name, hybrid / name)
    cfg = GroupTrainerConfig(max_tokens_per_micro_batch=4096, seed=0)
    trainer = GroupTrainer(PolicySpec(base=str(hybrid)), cfg)
    rows = random_rows(lengths=[(40, 8), (3, 1), (25, 12), (60, 5)])
    from memrl.train.rows import Row

    trained = [Row(prompt_ids=p, response_ids=r, advantage=1.0, rollout_logprobs=[]) for p, r in rows]
    assert not trainer.packs_rows
    (micros,) = trainer._micro_batches(list(range(len(trained))), trained)
    assert sorted(micros) == [[0], [1], [2], [3]]
    scored = trainer._score(trained, reference=False)
    reference = padded_logprobs(trainer.accelerator.unwrap_model(trainer.model), rows)
    worst = max(float((a.float().cpu() - b.float().cpu()).abs().max()) for a, b in zip(scored, reference, strict=True))
    assert worst < 1e-4, f"hybrid rows scored by the trainer differ from the padded forward by {worst:.3g}"
