"""The pieces of benchmarks/gpu_trainer.py that decide its figures, checked without a model: the workloads, the
reference's padded micro-batches, the FLOP count behind MFU, and the summary's pairing and targets."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.gpu_trainer import (
    equal_length_workload,
    mix_workload,
    padded_tokens,
    reference_micro_batches,
    row_lengths,
    step_flops,
    summarize,
)
from memrl.launch.plan import ModelShape

SHAPE = ModelShape(hidden=64, layers=2, vocab=1000, heads=2, kv_heads=1, head_dim=32, intermediate=128)


@pytest.mark.parametrize(("context", "rows"), [(256, 4), (512, 2), (1024, 2), (128, 8)])
def test_equal_length_rows_fill_the_budget_in_groups_with_variance(context: int, rows: int) -> None:
    workload = equal_length_workload(context, 1024, vocab=500, seed=0)
    assert [p + r for p, r in row_lengths(workload)] == [context] * rows
    assert all(2 <= len(g["responses"]) <= 4 for g in workload)
    # equal lengths: padding has nothing to add
    assert padded_tokens(reference_micro_batches(workload, 1024)) == context * rows


def test_mix_rows_are_memory_calls_after_long_prompts() -> None:
    workload = mix_workload(200_000, vocab=500, seed=1)
    lengths = row_lengths(workload)
    assert sum(p + r for p, r in lengths) >= 200_000
    assert all(1024 <= p <= 16384 and 10 <= r <= 400 for p, r in lengths)
    assert all(len(g["responses"]) == 4 for g in workload)
    assert len({p for p, _ in lengths}) > 5  # prompts of many lengths: what padding pays for
    batches = reference_micro_batches(workload, 32768)
    longest = max(p + r for p, r in lengths)
    assert all(len(mb) == max(1, 32768 // longest) for mb in batches[:-1])
    assert sum(len(mb) for mb in batches) == len(lengths)
    assert padded_tokens(batches) > sum(p + r for p, r in lengths)


def test_step_flops_count_scoring_forward_and_backward() -> None:
    rows = [(100, 20)]
    length = 120
    forward = (
        2 * SHAPE.layers * SHAPE.layer_params * length
        + 2 * SHAPE.layers * 64 * length**2
        + 2 * SHAPE.hidden * SHAPE.vocab * 20
    )
    assert step_flops(SHAPE, rows, lora=False) == pytest.approx(4 * forward)  # score, forward, backward = 2 forwards
    lora = step_flops(SHAPE, rows, lora=True)
    assert 3 * forward < lora < 4 * forward  # frozen weights: no weight gradients, attention's backward stays
    assert step_flops(SHAPE, rows * 3, lora=True) == pytest.approx(3 * lora)


def test_summary_pairs_implementations_and_reports_targets() -> None:
    common = {
        "shape": "qwen3.5-9b",
        "mode": "lora",
        "oom": False,
        "model_tflops_per_step": 100.0,
        "weights_gib": 15.0,
        "resident_gib": 16.0,
    }
    records = [
        {
            **common,
            "impl": "memrl",
            "workload": "ctx32768",
            "seconds_per_step": 1.0,
            "tokens_per_s": 200.0,
            "peak_gib": 46.0,
            "tokens": 200,
            "padded_tokens": 200,
        },
        {
            **common,
            "impl": "reference",
            "workload": "ctx32768",
            "seconds_per_step": 2.0,
            "tokens_per_s": 100.0,
            "peak_gib": 50.0,
            "tokens": 200,
            "padded_tokens": 200,
        },
        {
            **common,
            "impl": "memrl",
            "workload": "mix",
            "seconds_per_step": 1.0,
            "tokens_per_s": 300.0,
            "peak_gib": 30.0,
            "tokens": 300,
            "padded_tokens": 300,
        },
        {**common, "impl": "reference", "workload": "mix", "oom": True},
    ]
    plans = {
        ("qwen3.5-9b", "lora"): {
            "parameters": 15.5,
            "gradients_and_optimizer": 0.5,
            "activations": 20.0,
            "logits": 0.5,
            "total": 40.0,
        }
    }
    out = summarize(records, plans, 1000.0, "test", argparse.Namespace(budget=32768))
    ctx = next(c for c in out["cases"] if c["workload"] == "ctx32768")
    assert ctx["plan_error"] == pytest.approx(0.15) and ctx["speed_ratio"] == 2.0
    assert ctx["memory_ratio"] == pytest.approx(0.92) and ctx["memrl"]["mfu"] == pytest.approx(0.1)
    assert ctx["plan_terms_gib"] == {
        "parameters": (15.0, 15.5),
        "optimizer_states_between_steps": (1.0, 0.5),
        "step_transient": (30.0, 20.5),
    }
    s = out["summary"]
    assert s["max_abs_plan_error"] == pytest.approx(0.25) and s["min_speed_ratio_equal"] == 2.0
    assert s["min_speed_ratio_mix"] is None and s["ooms"] == 1 and s["oom_9b_lora_32k"] is False
