"""`memrl plan`: per-rank trainer and engine memory of the paper recipes; the estimate against a measured CPU run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memrl.launch.cli import main
from memrl.launch.plan import ASSUMED_SHAPES, GIB, ModelShape, measure_trainer_peak, trainer_memory
from memrl.train.group_trainer import GroupTrainerConfig
from memrl.train.policy import LoraSettings

ROOT = Path(__file__).resolve().parents[1]
NINE_B = str(ROOT / "configs" / "oat_grpo_sam_qwen3.5-9b.yaml")


def test_plan_of_the_9b_recipe_on_4_nodes_of_8_a100(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--config", NINE_B, "--nodes", "4", "--gpus-per-node", "8", "--json"])
    out = capsys.readouterr().out
    plan = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and "fits: yes" in out and plan["fits"]
    trainer, engine = plan["trainer_per_rank_gib"], plan["engine_per_gpu_gib"]
    assert trainer["model_states_source"].startswith("deepspeed estimate_zero3")
    assert 0 < trainer["total"] < 80 and trainer["tokens_per_micro_batch"] == 32768
    assert engine["weights"] < engine["share"] and engine["kv_cache_tokens"] >= engine["max_model_len"]
    assert plan["rank0_update_gib"] <= 80 and plan["rank0_rollout_gib"] <= 80


def test_plan_flags_a_recipe_that_cannot_fit_and_names_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["plan", "--config", NINE_B, "--nodes", "4", "--gpus-per-node", "8", "trainer.gradient_checkpointing=false"]
    )
    out = capsys.readouterr().out
    assert code == 1 and "fits: NO" in out and "trainer.gradient_checkpointing=true" in out
    code = main(
        [
            "plan",
            "--config",
            NINE_B,
            "--nodes",
            "4",
            "--gpus-per-node",
            "8",
            "placement.policy.gpu_memory_utilization=0.15",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1 and "placement.policy.gpu_memory_utilization" in out


# protects: memrl plan's trainer memory estimate against a measured CPU step at the real vocabulary (within 25%)
@pytest.mark.slow
def test_trainer_estimate_within_25_percent_of_a_measured_cpu_run(tmp_path: Path) -> None:
    from benchmarks.trainer_scaling import build_model  # the benchmark's tiny Qwen3 at Qwen's vocabulary (151,936)

    model = build_model(tmp_path / "model", max_position=2048)
    context, response, rows = 1024, 256, 2
    cfg = GroupTrainerConfig(lora=LoraSettings(enabled=False), max_tokens_per_micro_batch=context)
    shape = ModelShape.from_hf_config(json.loads((model / "config.json").read_text()))
    estimate = trainer_memory(shape, cfg, nodes=1, gpus_per_node=1, dtype="float32", default_tokens=context, gpu=False)
    measured = measure_trainer_peak(model, cfg, context=context, response=response, rows=rows)
    print(f"estimate {estimate.total / GIB:.3f} GiB, measured {measured / GIB:.3f} GiB")
    assert abs(estimate.total - measured) <= 0.25 * measured


def test_the_kl_reference_copy_is_counted() -> None:
    shape = ModelShape(hidden=64, layers=2, vocab=1000, heads=1, kv_heads=1, head_dim=64, intermediate=192)

    def parameters(**trainer: object) -> int:
        cfg = GroupTrainerConfig(lora=LoraSettings(enabled=False), **trainer)
        return trainer_memory(shape, cfg, nodes=1, gpus_per_node=1, dtype="bfloat16", default_tokens=128).parameters

    assert parameters(kl_coef=0.1) - parameters() == shape.params * 2


def test_a_shape_round_trips_through_its_transformers_config() -> None:
    """One table of shapes: the GPU benchmark builds its 9B from the plan's assumed shape via ``to_hf_config``."""
    from benchmarks.gpu_trainer import SHAPES

    for shape in ASSUMED_SHAPES.values():
        assert ModelShape.from_hf_config(shape.to_hf_config()) == shape
    assert ModelShape.from_hf_config(SHAPES["qwen3.5-9b"]) == ASSUMED_SHAPES["qwen3.5-9b"]


def test_the_packed_attention_transient_is_linear_in_tokens_with_repeated_kv_where_varlen_needs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Packed rows build no mask: the activations grow with the budget, plus the kernel's log-sum-exp per head and,
    on GPU with a varlen_attn that has no grouped-query option, the repeated keys and values its backward keeps."""
    import memrl.train.attention as attention

    shape = ModelShape(hidden=256, layers=3, vocab=1000, heads=4, kv_heads=1, head_dim=64, intermediate=512)

    def activations(tokens: int, *, gpu: bool = True) -> int:
        cfg = GroupTrainerConfig(lora=LoraSettings(enabled=False), max_tokens_per_micro_batch=tokens, bf16=True)
        estimate = trainer_memory(
            shape, cfg, nodes=1, gpus_per_node=1, dtype="bfloat16", default_tokens=tokens, gpu=gpu
        )
        return estimate.activations

    monkeypatch.setattr(attention, "_varlen", lambda: (object(), frozenset({"window_size", "enable_gqa"})))
    native = activations(1024)
    assert activations(4096) == 4 * native
    per_token_layer = 2 * (6 * 256 + 4 * 256 + 4 * 64 + 4 * 512) + 4 * 4
    assert native == 1024 * 3 * per_token_layer
    monkeypatch.setattr(attention, "_varlen", lambda: (object(), frozenset({"is_causal"})))
    assert activations(1024) - native == 1024 * 3 * 2 * 2 * 256  # K and V repeated to 4 heads of 64, bf16
    assert activations(1024, gpu=False) == native  # the CPU path runs per-row SDPA, which repeats nothing
    monkeypatch.setattr(attention, "_varlen", lambda: None)
    assert activations(1024) == native
