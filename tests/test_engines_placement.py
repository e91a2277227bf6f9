"""Rollout placement of the policy's vLLM engine: ``placement.policy`` -> engine config (TP, memory share, sleep level,
GPUs of a separate engine), and the engine's sleep/wake around the trainer's update. GPU behaviour is checked against
a recording stand-in for ``vllm.LLM`` (no GPU here); the real CPU engine is in tests/test_engines_vllm.py."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from memrl.data.config import ConfigError, PolicyPlacement
from memrl.rollout.engines.base import EngineError
from memrl.rollout.engines.config import EngineConfig, place_policy_engine
from memrl.rollout.engines.vllm_engine import VLLMEngine, _visible_gpus
from memrl.train.oat_grpo import OATGRPOConfig, policy_engine_config

ROOT = Path(__file__).resolve().parents[1]


def vllm_config(**fields: Any) -> EngineConfig:
    return EngineConfig(backend="vllm", model="/models/tiny", **fields)


def test_colocate_on_gpu_takes_tp_memory_share_and_sleep_level() -> None:
    placement = PolicyPlacement(tensor_parallel_size=2, gpu_memory_utilization=0.35, sleep_level=2)
    placed = place_policy_engine(vllm_config(), placement, gpu=True, local_world_size=8)
    assert (placed.tensor_parallel_size, placed.gpu_memory_utilization, placed.sleep_level) == (2, 0.35, 2)
    assert placed.cuda_devices is None  # GPUs 0..TP-1, shared with the training ranks there


def test_separate_on_gpu_takes_the_gpus_after_the_training_processes_and_never_sleeps() -> None:
    placement = PolicyPlacement(mode="separate", tensor_parallel_size=2, gpus_per_node=2)
    placed = place_policy_engine(vllm_config(), placement, gpu=True, local_world_size=6)
    assert placed.cuda_devices == [6, 7] and placed.sleep_level == 0 and placed.tensor_parallel_size == 2


def test_on_cpu_there_is_no_sleep_and_no_device_choice() -> None:
    placement = PolicyPlacement(sleep_level=1)
    placed = place_policy_engine(vllm_config(), placement, gpu=False, local_world_size=1)
    assert placed.sleep_level == 0 and placed.cuda_devices is None


def test_a_value_set_in_one_place_wins_and_a_contradiction_names_the_key() -> None:
    # set on the engine only: kept over the placement default
    placed = place_policy_engine(
        vllm_config(gpu_memory_utilization=0.5), PolicyPlacement(), gpu=True, local_world_size=1
    )
    assert placed.gpu_memory_utilization == 0.5
    # set in both places, equal: fine; different: an error naming the engine key
    same = place_policy_engine(
        vllm_config(tensor_parallel_size=2), PolicyPlacement(tensor_parallel_size=2), gpu=True, local_world_size=1
    )
    assert same.tensor_parallel_size == 2
    with pytest.raises(ConfigError, match=r"engine\.tensor_parallel_size=4 contradicts placement\.policy"):
        place_policy_engine(
            vllm_config(tensor_parallel_size=4), PolicyPlacement(tensor_parallel_size=2), gpu=True, local_world_size=1
        )


def test_non_vllm_engines_are_not_placed() -> None:
    hf = EngineConfig(backend="hf", model="/models/tiny")
    assert place_policy_engine(hf, PolicyPlacement(tensor_parallel_size=4), gpu=True, local_world_size=1) is hf


def test_engine_config_rejects_inconsistent_placement_fields() -> None:
    with pytest.raises(ValueError, match="cuda_devices lists 1 GPU"):
        vllm_config(cuda_devices=[3], tensor_parallel_size=2)
    with pytest.raises(ValueError, match="sleep_level 2 drops the base weights"):
        vllm_config(sleep_level=2, enable_lora=True)
    with pytest.raises(ValueError, match="in_process"):
        vllm_config(cuda_devices=[3], in_process=True)


def test_oat_grpo_policy_engine_follows_the_recipe_placement() -> None:
    from memrl.data.config import load_config

    cfg = load_config(
        OATGRPOConfig, ROOT / "configs" / "oat_grpo_sam_qwen3.5-9b.yaml", ["placement.policy.tensor_parallel_size=2"]
    )
    placed = policy_engine_config(cfg)
    assert placed.backend == "vllm" and placed.tensor_parallel_size == 2 and placed.gpu_memory_utilization == 0.3


def test_visible_gpus_maps_through_the_process_devices_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    with _visible_gpus([2, 3]):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "6,7"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with _visible_gpus([1]):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(EngineError, match="not all among the visible GPUs"), _visible_gpus([1]):
        pass
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"


# ----------------------------------------------------------------------------------------------------------------
# sleep / wake on a recording stand-in for vllm.LLM


class RecordingLLM:
    """Records the calls the engine makes; the shape of ``llm_engine.vllm_config`` is what VLLMEngine reads."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        model_config = SimpleNamespace(max_model_len=512, hf_config=SimpleNamespace(tie_word_embeddings=False))
        self.llm_engine = SimpleNamespace(
            vllm_config=SimpleNamespace(
                model_config=model_config, cache_config=SimpleNamespace(block_size=16), lora_config=None
            ),
        )

    def sleep(self, level: int = 1) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(("wake_up", tags))

    def collective_rpc(self, method: str, kwargs: dict[str, Any] | None = None) -> None:
        self.calls.append((method, None))

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache", None))


def engine_with(level: int) -> tuple[VLLMEngine, RecordingLLM]:
    llm = RecordingLLM()
    return VLLMEngine(llm, tokenizer=None, name="policy", sleep_level=level), llm


def test_level_1_sleeps_once_and_the_next_use_wakes_it() -> None:
    engine, llm = engine_with(1)
    engine.sleep()
    engine.sleep()  # already asleep: no second call
    assert llm.calls == [("sleep", 1)]
    engine.reset_prefix_cache()
    assert llm.calls[1:] == [("wake_up", None), ("reset_prefix_cache", None)]
    engine.reset_prefix_cache()  # awake: no wake call
    assert llm.calls[3:] == [("reset_prefix_cache", None)]


def test_weight_sync_while_asleep_wakes_weights_then_reloads_then_wakes_the_rest() -> None:
    import torch

    engine, llm = engine_with(2)
    engine.sleep()
    with pytest.raises(EngineError, match="asleep at level 2"):
        engine.reset_prefix_cache()  # dropped weights: using them before a reload is refused
    engine.update_weights({"model.norm.weight": torch.ones(4)}, version=3)
    assert llm.calls == [
        ("sleep", 2),
        ("wake_up", ["weights"]),
        ("reload_weights", None),
        ("wake_up", None),
        ("reset_prefix_cache", None),
    ]
    assert engine.policy_version == 3
    engine.reset_prefix_cache()
    assert llm.calls[-1] == ("reset_prefix_cache", None) and llm.calls.count(("wake_up", None)) == 1


def test_level_0_never_sleeps() -> None:
    engine, llm = engine_with(0)
    engine.sleep()
    engine.reset_prefix_cache()
    assert llm.calls == [("reset_prefix_cache", None)]
