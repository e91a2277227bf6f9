"""The group trainer on the tiny model: updates raise the better response, accumulation is exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from fakes import ONE_STEP

from memrl.data.schemas import Group, GroupSample
from memrl.rewards.advantage import group_advantages
from memrl.train.group_trainer import GroupTrainer, GroupTrainerConfig
from memrl.train.policy import LoraSettings, PolicySpec, response_logprobs


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


def checkpointed_updates(
    trainer: GroupTrainer, groups: list[Group], run_dir: Path, stop_after: int | None, resume: bool
) -> list[dict[str, Any]]:
    """Two iterations of an online loop updating ``trainer`` on ``groups`` in ``run_dir`` (resumed with ``resume``),
    a checkpoint after each, stopped after iteration ``stop_after`` (None: not stopped); the updates' records."""
    from memrl.data.tracking import MetricsLogger
    from memrl.train.online import LoopConfig, OnlineLoop

    run_dir.mkdir(exist_ok=True)
    logger = MetricsLogger(run_dir, None, {}, name=run_dir.name, console=False)
    loop = OnlineLoop(
        trainer=trainer,
        engine=None,
        cfg=LoopConfig(iterations=2, checkpoint_every=1),
        run_dir=run_dir,
        resume=resume,
        logger=logger,
    )
    updates = []
    for iteration in loop.start(lambda i: None, None):
        updates.append(loop.update(groups))
        loop.checkpoint(iteration)
        if iteration == stop_after:
            break
    logger.close()
    return updates


def sequence_logprob(trainer: GroupTrainer, group: Group, sample: int) -> float:
    ids = torch.tensor([group.prompt_ids + group.samples[sample].response_ids])
    with torch.no_grad():
        lp, _ = response_logprobs(trainer.model, ids, torch.ones_like(ids))
    return float(lp[0, len(group.prompt_ids) - 1 :].sum())


def test_the_default_update_takes_several_steps_so_its_diagnostics_move(tiny_model_dir: Path) -> None:
    """Issue 39 item 8: the default is 2 epochs x 2 optimizer steps per batch. With one step per batch the ratio
    against pi_old is 1 at every step, so approx_kl read ~1e-14 and clip_fraction 0 whatever happened; the old default
    stays selectable (``ONE_STEP``) and there nothing moves."""
    cfg = GroupTrainerConfig(lr=5e-3, lora=LoraSettings(r=8, alpha=16))
    assert (cfg.update_epochs, cfg.optimizer_steps_per_epoch) == (2, 2)
    trainer = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), cfg)
    groups = groups_for(trainer.tokenizer, "the red key is in drawer 5", "nothing relevant", n_groups=4)
    steps = trainer.step(groups)["optimizer_steps"]
    assert len(steps) == 4
    assert abs(steps[0]["approx_kl"]) < 1e-9  # the first step is taken at pi_old
    assert max(abs(s["approx_kl"]) for s in steps[1:]) > 1e-6  # the later ones see the policy move

    old = GroupTrainer(
        PolicySpec(base=str(tiny_model_dir)), GroupTrainerConfig(**ONE_STEP, lr=5e-3, lora=LoraSettings(r=8, alpha=16))
    )
    one = old.step(groups)["optimizer_steps"]
    assert len(one) == 1 and abs(one[0]["approx_kl"]) < 1e-9 and one[0]["clip_fraction"] == 0.0


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
    trainer = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), GroupTrainerConfig(**ONE_STEP, lora=LoraSettings(r=4)))
    groups = groups_for(trainer.tokenizer, "a", "b")
    for g in groups:
        for s in g.samples:
            s.reward, s.advantage = 1.0, 0.0
    metrics = trainer.step(groups)
    assert metrics["skipped"] == 1.0 and metrics["zero_variance_group_fraction"] == 1.0 and trainer.version == 0


def test_micro_batch_accumulation_equals_one_batch(tiny_model_dir: Path) -> None:
    """Accumulated micro-batches give the same loss and the same accumulated gradient (norm) as one batch."""

    def one_step(micro: int, aggregation: str) -> dict[str, float]:
        cfg = GroupTrainerConfig(
            **ONE_STEP,
            lr=1e-3,
            micro_batches=micro,
            lora=LoraSettings(enabled=False),
            max_grad_norm=1e9,
            aggregation=aggregation,
        )
        trainer = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), cfg)
        groups = groups_for(trainer.tokenizer, "the red key is in drawer 5", "no", n_groups=3)
        return trainer.step(groups)

    for aggregation in ("token-mean", "sequence-mean"):
        one, three = one_step(1, aggregation), one_step(3, aggregation)
        assert three["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-7)
        assert three["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)


def test_single_sample_groups_do_not_count_as_zero_variance(tiny_model_dir: Path) -> None:
    trainer = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), GroupTrainerConfig(**ONE_STEP, lora=LoraSettings(r=4)))
    siblings = groups_for(trainer.tokenizer, "the red key is in drawer 5", "nothing relevant", n_groups=1)
    flat = [  # flat mode: one sample per group, its advantage computed from the trajectory
        Group(group_id=f"flat{k}", prompt_ids=siblings[0].prompt_ids, samples=[s])
        for k, s in enumerate(groups_for(trainer.tokenizer, "drawer 5", "drawer 2", n_groups=1)[0].samples)
    ]
    metrics = trainer.step(siblings + flat)
    assert metrics["zero_variance_group_fraction"] == 0.0 and metrics["single_sample_groups"] == 2.0
    assert metrics["zero_advantage_sample_fraction"] == 0.0
    only_flat = trainer.step(flat)
    assert "zero_variance_group_fraction" not in only_flat and only_flat["rows"] == 2


def test_kl_to_a_frozen_copy_of_full_weights(tiny_model_dir: Path) -> None:
    cfg = GroupTrainerConfig(**ONE_STEP, lr=1e-3, kl_coef=0.1, lora=LoraSettings(enabled=False))
    trainer = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), cfg)
    reference = trainer._frozen_reference
    assert reference is not None and not reference.training
    assert next(reference.parameters()).device == trainer.device
    groups = groups_for(trainer.tokenizer, "the red key is in drawer 5", "nothing relevant")
    first = trainer.step(groups)
    assert abs(first["kl_ref"]) < 1e-6  # the policy starts at the reference
    second = trainer.step(groups)
    assert second["kl_ref"] > 0 and not any(p.requires_grad for p in reference.parameters())


def test_old_logprobs_are_scored_without_dropout(tiny_model_dir: Path) -> None:
    cfg = GroupTrainerConfig(**ONE_STEP, kl_coef=0.1, lora=LoraSettings(r=4, dropout=0.5))
    trainer = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), cfg)
    modes: list[bool] = []
    score = trainer._score

    def recording(rows, *, reference):
        modes.append(trainer.model.training)
        return score(rows, reference=reference)

    trainer._score = recording  # type: ignore[method-assign]
    trainer.step(groups_for(trainer.tokenizer, "the red key is in drawer 5", "nothing relevant"), probe=True)
    assert modes == [False, False, False]  # pi_old, pi_ref and the KL-to-initial probe in eval mode (dropout off)
    assert trainer.model.training  # the update passes ran in train mode


def test_the_loss_that_runs_is_surrogate_loss(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flip the advantage's sign inside memrl.train.surrogate.surrogate_loss: the same update now lowers the better
    response instead of raising it, so the trainer runs exactly that function."""
    from memrl.train import surrogate

    def moved(flip: bool) -> float:
        cfg = GroupTrainerConfig(**ONE_STEP, lr=5e-3, lora=LoraSettings(r=8, alpha=16))
        trainer = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), cfg)
        groups = groups_for(trainer.tokenizer, "the red key is in drawer 5", "nothing relevant")
        before = sequence_logprob(trainer, groups[0], 0)
        if flip:
            original = surrogate.surrogate_loss
            monkeypatch.setattr(
                surrogate, "surrogate_loss", lambda lp, old, adv, *a, **kw: original(lp, old, -adv, *a, **kw)
            )
        trainer.step(groups)
        monkeypatch.undo()
        return sequence_logprob(trainer, groups[0], 0) - before

    assert moved(flip=False) > 0.1
    assert moved(flip=True) < -0.1


def test_diagnostics_per_optimizer_step_move_after_the_first(tiny_model_dir: Path) -> None:
    """With several optimizer steps per update, each step's approx_kl / clip fraction / ratio range are measured
    against the batch's pi_old: the first step sees ratio 1, the later ones the policy the earlier steps moved."""
    cfg = GroupTrainerConfig(lr=2e-2, update_epochs=2, optimizer_steps_per_epoch=2, lora=LoraSettings(r=8, alpha=16))
    trainer = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), cfg)
    metrics = trainer.step(groups_for(trainer.tokenizer, "the red key is in drawer 5", "nothing relevant", 4))
    steps = metrics["optimizer_steps"]
    assert len(steps) == 4 and metrics["optimizer_step_count"] == 4 and trainer.updates == 4
    assert steps[0]["approx_kl"] == pytest.approx(0.0, abs=1e-10) and steps[0]["clip_fraction"] == 0.0
    assert steps[0]["ratio_min"] == pytest.approx(1.0, abs=1e-5) and steps[0]["ratio_max"] == pytest.approx(
        1.0, abs=1e-5
    )
    assert all(s["approx_kl"] > 1e-6 for s in steps[1:])
    assert metrics["approx_kl"] > 0 and metrics["approx_kl_max"] == max(s["approx_kl"] for s in steps)
    assert metrics["ratio_max"] > 1.0 + 1e-4 or metrics["ratio_min"] < 1.0 - 1e-4
    assert all(0.0 <= s["clip_fraction"] <= 1.0 for s in steps)
    assert metrics["trained_tokens"] == sum(s["tokens"] for s in steps) / cfg.update_epochs


def test_kl_to_the_initial_policy_on_the_probe_grows_from_zero(tiny_model_dir: Path) -> None:
    """The probe is the first update's rows: before any update its KL is 0; after updates at a high learning rate
    it is positive; with lr = 0 (the control) it stays 0 and the weights do not move."""

    def probe_kls(lr: float) -> list[float]:
        cfg = GroupTrainerConfig(**ONE_STEP, lr=lr, lora=LoraSettings(r=8, alpha=16), probe_rows=3, probe_every=1)
        trainer = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), cfg)
        groups = groups_for(trainer.tokenizer, "the red key is in drawer 5", "nothing relevant")
        return [trainer.step(groups)["kl_initial_probe"] for _ in range(2)]

    assert probe_kls(0.0) == pytest.approx([0.0, 0.0], abs=1e-9)
    moved = probe_kls(5e-3)
    assert moved[0] > 1e-4 and moved[1] > moved[0]


def test_the_kl_probe_runs_every_n_updates_and_logs_its_cost(tiny_model_dir: Path) -> None:
    """Re-scoring the probe costs a forward over its rows, so by default it runs after every probe_every-th update
    only (or when the caller asks, as an online loop does at its last iteration), and says what it cost."""
    cfg = GroupTrainerConfig(lr=1e-3, lora=LoraSettings(r=8, alpha=16), probe_rows=3, probe_every=2)
    assert GroupTrainerConfig().probe_every == 10
    trainer = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), cfg)
    groups = groups_for(trainer.tokenizer, "the red key is in drawer 5", "nothing relevant")
    runs = [trainer.step(groups) for _ in range(3)] + [trainer.step(groups, probe=True)]
    assert ["kl_initial_probe" in m for m in runs] == [False, True, False, True]
    assert all(m["kl_probe_s"] > 0 for m in runs if "kl_initial_probe" in m)
    assert not any("kl_probe_s" in m for m in runs if "kl_initial_probe" not in m)
    assert "kl_initial_probe" not in trainer.step(groups, probe=False) and trainer.probe_state() is not None


def test_lr_schedule_warms_up_then_decays_to_its_floor() -> None:
    from memrl.train.group_trainer import lr_factor

    cfg = GroupTrainerConfig(warmup_steps=2, lr_schedule="cosine", lr_decay_steps=4, min_lr_ratio=0.1)
    factors = [lr_factor(step, cfg) for step in range(8)]
    assert factors[:3] == pytest.approx([0.5, 1.0, 1.0])
    assert factors[3] < 1.0 and factors[6:] == pytest.approx([0.1, 0.1])
    with pytest.raises(ValueError, match="lr_decay_steps"):
        GroupTrainerConfig(lr_schedule="linear")


def test_kl_to_the_initial_policy_after_a_resume_is_to_the_run_s_start(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The probe and its log-probs under the initial policy travel in the checkpoint: a run stopped after its first
    iteration and resumed logs the same kl_initial_probe as the uninterrupted run (a probe re-fixed at the resume
    would measure the distance to the resumed policy instead, and read about the last update's KL)."""
    from memrl.data.tracking import MetricsLogger
    from memrl.train.online import LoopConfig, OnlineLoop

    def run(name: str, stop_after: int | None, resume: bool = False) -> list[float]:
        torch.manual_seed(0)  # the same LoRA initialisation in every run
        trainer = GroupTrainer(
            PolicySpec(base=str(tiny_model_dir)),
            GroupTrainerConfig(**ONE_STEP, lr=5e-3, lora=LoraSettings(r=8, alpha=16), probe_rows=3, probe_every=1),
        )
        groups = groups_for(trainer.tokenizer, "the red key is in drawer 5", "nothing relevant")
        updates = checkpointed_updates(trainer, groups, tmp_path / name, stop_after, resume)
        return [update["kl_initial_probe"] for update in updates]

    uninterrupted = run("whole", None)
    assert uninterrupted[1] > uninterrupted[0] > 1e-4
    assert run("stopped", 0) == pytest.approx(uninterrupted[:1], rel=1e-5)
    # by default the probe runs every probe_every updates, and always at the loop's last iteration
    trainer = GroupTrainer(
        PolicySpec(base=str(tiny_model_dir)),
        GroupTrainerConfig(lr=5e-3, lora=LoraSettings(r=8, alpha=16), probe_rows=3),
    )
    groups = groups_for(trainer.tokenizer, "the red key is in drawer 5", "nothing relevant")
    logger = MetricsLogger(tmp_path / "cadence", None, {}, name="cadence", console=False)
    loop = OnlineLoop(
        trainer=trainer,
        engine=None,
        cfg=LoopConfig(iterations=3, checkpoint_every=0),
        run_dir=tmp_path / "cadence",
        resume=False,
        logger=logger,
    )
    probed = ["kl_initial_probe" in loop.update(groups, iteration) for iteration in loop.start(lambda i: None, None)]
    logger.close()
    assert probed == [False, False, True]
    assert run("stopped", None, resume=True) == pytest.approx(uninterrupted[1:], rel=1e-4)


def test_a_fresh_lora_adapter_is_drawn_from_the_trainer_seed(tiny_model_dir: Path) -> None:
    """Two trainers with one seed start from the same adapter, another seed from another; the caller's torch RNG is
    not consumed."""

    def lora_a(seed: int) -> dict[str, torch.Tensor]:
        trainer = GroupTrainer(
            PolicySpec(base=str(tiny_model_dir)), GroupTrainerConfig(lora=LoraSettings(r=4), seed=seed)
        )
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_A" in n}

    torch.manual_seed(123)
    expected_draw = torch.rand(3)
    torch.manual_seed(123)
    first, again, other = lora_a(7), lora_a(7), lora_a(8)
    assert torch.equal(torch.rand(3), expected_draw)
    assert first and all(torch.equal(first[n], again[n]) for n in first)
    assert not any(torch.equal(first[n], other[n]) for n in first)


def test_a_loop_collecting_during_the_update_needs_the_policy_engine_apart_on_gpus() -> None:
    """``loop.max_staleness`` > 0 generates while the trainer updates: refused with a colocated engine on GPUs only."""
    from memrl.data.config import ConfigError, PolicyPlacement
    from memrl.train.online import LoopConfig, check_staleness_placement

    stale, colocated = LoopConfig(max_staleness=1), PolicyPlacement(mode="colocate")
    check_staleness_placement(stale, PolicyPlacement(mode="separate", gpus_per_node=1), gpu=True)
    check_staleness_placement(stale, colocated, gpu=False)
    check_staleness_placement(LoopConfig(max_staleness=0), colocated, gpu=True)
    with pytest.raises(ConfigError, match=r"loop.max_staleness=1 .* placement.policy.mode must be 'separate'"):
        check_staleness_placement(stale, colocated, gpu=True)
