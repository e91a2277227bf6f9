"""Atomic checkpoints: adapter-only for LoRA, exact restore of weights and optimizer, incomplete ones ignored."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from fakes import ONE_STEP
from test_group_trainer import groups_for

from memrl.data.errors import UserError
from memrl.train.checkpoint import CheckpointManager, record_saved, saved_before, verify_checkpoint
from memrl.train.group_trainer import GroupTrainer, GroupTrainerConfig
from memrl.train.policy import LoraSettings, PolicySpec


def trainable(trainer: GroupTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def test_save_load_round_trip_and_pruning(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = GroupTrainerConfig(**ONE_STEP, lr=1e-2, lora=LoraSettings(r=4, alpha=8))
    trainer = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), cfg)
    groups = groups_for(trainer.tokenizer, "the red key is in drawer 5", "nothing relevant")
    manager = CheckpointManager(tmp_path / "ckpt", keep=2)
    for it in range(3):
        trainer.step(groups)
        manager.save(it, trainer.accelerator, trainer.model, {"iteration": it, "data_position": 10 * it})
    saved = trainable(trainer)
    latest = manager.latest()
    assert latest is not None and latest.name == "ckpt-000002"
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("ckpt")) == [
        "ckpt-000001",
        "ckpt-000002",
    ]
    weights = list(latest.glob("*.safetensors"))
    assert weights and sum(w.stat().st_size for w in weights) < 200_000  # adapter only, not the base

    fresh = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), cfg)
    assert any(not torch.equal(v, trainable(fresh)[k]) for k, v in saved.items())
    state = manager.load(latest, fresh.accelerator)
    assert state == {"iteration": 2, "data_position": 20}
    restored = trainable(fresh)
    assert all(torch.equal(v, restored[k]) for k, v in saved.items())
    # the optimizer moments came back too: the next update is identical
    trainer.step(groups)
    fresh.step(groups)
    after_a, after_b = trainable(trainer), trainable(fresh)
    assert max(float((after_a[k] - after_b[k]).abs().max()) for k in after_a) < 1e-6


def test_incomplete_checkpoint_is_ignored(tmp_path: Path) -> None:
    from memrl.train.checkpoint import _write_manifest

    root = tmp_path / "ckpt"
    (root / "ckpt-000005").mkdir(parents=True)  # killed before its COMPLETE marker
    (root / ".tmp-ckpt-000006").mkdir()
    assert CheckpointManager(root).latest() is None
    (root / "ckpt-000003").mkdir()
    (root / "ckpt-000003" / "loop_state.json").write_text('{"iteration": 3}')
    _write_manifest(root / "ckpt-000003")
    (root / "ckpt-000003" / "COMPLETE").write_text("ok\n")
    assert CheckpointManager(root).latest().name == "ckpt-000003"


def _saved_three(tiny_model_dir: Path, root: Path) -> tuple[CheckpointManager, GroupTrainer]:
    trainer = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), GroupTrainerConfig(**ONE_STEP, lora=LoraSettings(r=4)))
    manager = CheckpointManager(root, keep=3)
    for it in range(3):
        manager.save(it, trainer.accelerator, trainer.model, {"iteration": it})
    return manager, trainer


def test_damaged_newest_checkpoint_falls_back_to_the_newest_intact_one(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Truncated weights, a missing optimizer file, a garbage loop state, a changed byte: each newest checkpoint is
    reported (naming the file) and skipped; the newest intact one is loaded."""
    manager, trainer = _saved_three(tiny_model_dir, tmp_path / "ckpt")
    newest, middle = tmp_path / "ckpt" / "ckpt-000002", tmp_path / "ckpt" / "ckpt-000001"
    assert json.loads((newest / "manifest.json").read_text())["files"]  # sizes and checksums of every file
    weights = next(newest.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-100])
    with caplog.at_level(logging.WARNING):
        assert manager.latest() == middle
    assert weights.name in caplog.text and "ckpt-000002" in caplog.text
    assert manager.load(manager.latest(), trainer.accelerator) == {"iteration": 1}
    optimizer = next(middle.glob("optimizer*"))
    optimizer.unlink()
    assert manager.latest().name == "ckpt-000000"
    (tmp_path / "ckpt" / "ckpt-000000" / "loop_state.json").write_text("{{garbage")
    with pytest.raises(UserError, match=r"every checkpoint of run .* is gone or damaged"):
        manager.latest()


def test_changed_byte_fails_the_checksum(tiny_model_dir: Path, tmp_path: Path) -> None:
    manager, _ = _saved_three(tiny_model_dir, tmp_path / "ckpt")
    state = tmp_path / "ckpt" / "ckpt-000002" / "loop_state.json"
    state.write_text(state.read_text().replace("2", "7"))
    assert (
        verify_checkpoint(state.parent) == f"{state} does not match its checksum in the manifest (changed or damaged)"
    )
    assert manager.latest().name == "ckpt-000001"


def test_all_checkpoints_gone_is_an_error_not_a_fresh_start(tiny_model_dir: Path, tmp_path: Path) -> None:
    manager, _ = _saved_three(tiny_model_dir, tmp_path / "run" / "checkpoints")
    assert saved_before(manager.root) == ["ckpt-000000", "ckpt-000001", "ckpt-000002"]
    shutil.rmtree(tmp_path / "run" / "checkpoints")
    with pytest.raises(UserError, match="gone or damaged"):
        manager.latest()
    assert CheckpointManager(tmp_path / "never" / "checkpoints").latest() is None  # never saved one: a fresh start


def test_reward_cache_is_snapshotted_and_restored(tiny_model_dir: Path, tmp_path: Path) -> None:
    from memrl.rewards.cache import JsonCache, content_key

    trainer = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), GroupTrainerConfig(**ONE_STEP, lora=LoraSettings(r=4)))
    cache_dir = tmp_path / "run" / "committee_cache"
    cache = JsonCache(cache_dir)
    cache.put(content_key("reference", "a"), "drawer 5")
    manager = CheckpointManager(tmp_path / "run" / "checkpoints")
    ckpt = manager.save(0, trainer.accelerator, trainer.model, {"iteration": 0}, {"reward_cache": cache_dir})
    cache.put(content_key("reference", "b"), "drawer 2")  # after the checkpoint: not in its snapshot
    assert len(list((ckpt / "reward_cache").rglob("*.json"))) == 1

    # the checkpoint copied to another machine, without the run's cache: loading brings the answers back
    moved = tmp_path / "elsewhere" / ckpt.name
    moved.parent.mkdir()
    ckpt.rename(moved)
    target = tmp_path / "elsewhere" / "committee_cache"
    assert manager.load(moved, trainer.accelerator, {"reward_cache": target}) == {"iteration": 0}
    assert JsonCache(target).get(content_key("reference", "a")) == "drawer 5"
    assert JsonCache(target).get(content_key("reference", "b")) is None


def test_sft_resume_skips_a_damaged_newest_trainer_checkpoint(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """SFT (Hugging Face Trainer) checkpoints have no manifest: a newest one with truncated weights, a garbage
    trainer_state.json or no optimizer state is reported and the newest intact one is resumed."""
    from safetensors.torch import save_file

    from memrl.train.sft import latest_checkpoint

    root = tmp_path / "checkpoints"
    root.mkdir()
    for step in (2, 4, 6, 8):
        folder = root / f"checkpoint-{step}"
        folder.mkdir()
        save_file({"w": torch.zeros(8, 8)}, str(folder / "model.safetensors"))
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        for name in ("optimizer.pt", "scheduler.pt"):
            (folder / name).write_bytes(b"state")
    weights = root / "checkpoint-8" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    (root / "checkpoint-6" / "trainer_state.json").write_text("{{garbage")
    (root / "checkpoint-4" / "optimizer.pt").unlink()
    with caplog.at_level(logging.WARNING):
        assert latest_checkpoint(root) == root / "checkpoint-2"
    assert all(f"checkpoint-{s} skipped" in caplog.text for s in (8, 4)), caplog.text
    assert "model.safetensors" in caplog.text and "optimizer.pt" in caplog.text
    # every one damaged: a run that never recorded a save starts over; one that did is an error, as for OAT-GRPO
    (root / "checkpoint-2" / "scheduler.pt").write_bytes(b"")
    assert latest_checkpoint(root) is None
    for step in (2, 4, 6, 8):
        record_saved(root, f"checkpoint-{step}")
    with pytest.raises(UserError, match=r"every checkpoint of run .* is gone or damaged \(checkpoint-8: .*scheduler"):
        latest_checkpoint(root)
