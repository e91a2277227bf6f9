"""bf16 on a CPU whose bf16 matmuls take torch's fallback path: the user who asked for bf16 is told, naming the key."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch


def fake_slowdown(monkeypatch: pytest.MonkeyPatch, ratio: float) -> None:
    from memrl.train import precision

    seconds = {torch.bfloat16: ratio, torch.float32: 1.0}
    monkeypatch.setattr(precision, "_matmul_seconds", lambda dtype: seconds[dtype])
    precision.cpu_bf16_slowdown.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture(autouse=True)
def measured_again() -> Iterator[None]:
    from memrl.train.precision import cpu_bf16_slowdown

    yield
    cpu_bf16_slowdown.cache_clear()


def test_bf16_over_4x_slower_than_fp32_is_warned_naming_the_key(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from memrl.train.precision import warn_if_cpu_bf16_slow

    fake_slowdown(monkeypatch, 4.0)  # at the bound: a CPU whose bf16 is merely slower is left alone
    with caplog.at_level(logging.WARNING, logger="memrl.train.precision"):
        assert warn_if_cpu_bf16_slow("train.bf16") is False
    assert caplog.text == ""
    fake_slowdown(monkeypatch, 4.01)
    with caplog.at_level(logging.WARNING, logger="memrl.train.precision"):
        assert warn_if_cpu_bf16_slow("trainer.bf16") is True
    assert "trainer.bf16 is true, but bf16 matmuls on this CPU are 4x slower than fp32" in caplog.text
    assert "set it to false to train in fp32" in caplog.text


def test_sft_and_the_group_trainer_warn_on_such_a_cpu(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from memrl.train.group_trainer import GroupTrainerConfig, make_accelerator
    from memrl.train.sft import sft_args
    from tests.test_sft import make_cfg

    fake_slowdown(monkeypatch, 30.0)
    with caplog.at_level(logging.WARNING, logger="memrl.train.precision"):
        sft_args(make_cfg(tiny_model_dir, tmp_path, "x", data={"dir": "d"}, train={"bf16": False}), tmp_path, False)
        assert caplog.text == ""  # fp32 asked for: nothing to say
        sft_args(make_cfg(tiny_model_dir, tmp_path, "x", data={"dir": "d"}, train={"bf16": True}), tmp_path, False)
        assert "train.bf16 (sft.bf16 in a quickstart config) is true" in caplog.text
        monkeypatch.setattr("accelerate.Accelerator", lambda **kw: kw)  # accelerate's state is process-wide
        assert make_accelerator(GroupTrainerConfig(bf16=True))["mixed_precision"] == "bf16"
        assert "trainer.bf16 is true" in caplog.text


def test_the_textworld_benchmark_refuses_to_train_smollm2_on_such_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """SmolLM2's SFT and RL stages train under bf16 (their records were made so): on such a CPU each would take
    hours, so the stage is refused before its first step, with the reason; the tiny model trains in fp32."""
    from benchmarks.textworld import UnfitMachine, require_fast_bf16

    fake_slowdown(monkeypatch, 30.0)
    with pytest.raises(UnfitMachine, match=r"SFT seed 3: SmolLM2 trains under bf16 .* 30x slower than fp32"):
        require_fast_bf16("smollm2", "SFT seed 3")
    require_fast_bf16("tiny", "SFT seed 3")
    fake_slowdown(monkeypatch, 4.0)
    require_fast_bf16("smollm2", "SFT seed 3")


def test_a_machine_with_a_cuda_gpu_trains_there_so_its_cpu_is_not_judged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from benchmarks.textworld import require_fast_bf16
    from memrl.train.precision import warn_if_cpu_bf16_slow

    fake_slowdown(monkeypatch, 30.0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with caplog.at_level(logging.WARNING, logger="memrl.train.precision"):
        assert warn_if_cpu_bf16_slow("trainer.bf16") is False
    assert caplog.text == ""
    require_fast_bf16("smollm2", "SFT seed 3")
