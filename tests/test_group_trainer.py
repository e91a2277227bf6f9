"""The group trainer on the tiny model: updates raise the better response, accumulation is exact."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from data.schemas import Group, GroupSample
from rewards.advantage import group_advantages
from train.group_trainer import GroupTrainer, GroupTrainerConfig
from train.policy import LoraSettings, PolicySpec, response_logprobs


def groups_for(tok, good: str, bad: str, n_groups: int = 2) -> list[Group]:
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "where is the red key"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
    )["input_ids"]
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    responses = [[*tok.encode(text, add_special_tokens=False), eos] for text in (good, bad)]
    rewards = [1.0, 0.0]
    advantages = group_advantages(rewards)
    return [
        Group(
            group_id=f"g{k}",
            prompt_ids=list(prompt),
            samples=[
                GroupSample(response_ids=r, reward=w, advantage=a)
                for r, w, a in zip(responses, rewards, advantages, strict=True)
            ],
        )
        for k in range(n_groups)
    ]


def sequence_logprob(trainer: GroupTrainer, group: Group, sample: int) -> float:
    ids = torch.tensor([group.prompt_ids + group.samples[sample].response_ids])
    with torch.no_grad():
        lp, _ = response_logprobs(trainer.model, ids, torch.ones_like(ids))
    return float(lp[0, len(group.prompt_ids) - 1 :].sum())


def test_updates_raise_the_better_response(tiny_model_dir: Path) -> None:
    cfg = GroupTrainerConfig(lr=5e-3, update_epochs=2, lora=LoraSettings(r=8, alpha=16))
    trainer = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), cfg)
    groups = groups_for(trainer.tokenizer, "the red key is in drawer 5", "nothing relevant")
    before_good, before_bad = sequence_logprob(trainer, groups[0], 0), sequence_logprob(trainer, groups[0], 1)
    for _ in range(3):
        metrics = trainer.step(groups)
    after_good, after_bad = sequence_logprob(trainer, groups[0], 0), sequence_logprob(trainer, groups[0], 1)
    assert after_good > before_good + 1.0 and after_bad < before_bad
    assert metrics["rows"] == 4 and metrics["zero_variance_group_fraction"] == 0.0
    assert 0.0 <= metrics["clip_fraction"] <= 1.0 and metrics["grad_norm"] > 0 and trainer.version == 3


def test_zero_variance_groups_are_skipped(tiny_model_dir: Path) -> None:
    trainer = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), GroupTrainerConfig(lora=LoraSettings(r=4)))
    groups = groups_for(trainer.tokenizer, "a", "b")
    for g in groups:
        for s in g.samples:
            s.reward, s.advantage = 1.0, 0.0
    metrics = trainer.step(groups)
    assert metrics["skipped"] == 1.0 and metrics["zero_variance_group_fraction"] == 1.0 and trainer.version == 0


def test_micro_batch_accumulation_equals_one_batch(tiny_model_dir: Path) -> None:
    """Accumulated micro-batches give the same loss and the same accumulated gradient (norm) as one batch."""

    def one_step(micro: int, aggregation: str) -> dict[str, float]:
        cfg = GroupTrainerConfig(lr=1e-3, micro_batches=micro, lora=LoraSettings(enabled=False), max_grad_norm=1e9,
                                 aggregation=aggregation)
        trainer = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), cfg)
        groups = groups_for(trainer.tokenizer, "the red key is in drawer 5", "no", n_groups=3)
        return trainer.step(groups)

    for aggregation in ("token-mean", "sequence-mean"):
        one, three = one_step(1, aggregation), one_step(3, aggregation)
        assert three["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-7)
        assert three["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
