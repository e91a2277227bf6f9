"""The real vLLM CPU engine on the tiny model: log-probs against transformers, samples and seeds, stop handling,
prefix-cache accounting against the simulator, LoRA hot-swap (PEFT's adapters and the one ``memrl sft`` saves) and
in-place full-weight updates. One engine serves the module: starting vLLM is most of its cost.

protects: the real vLLM engine's token-in/token-out contract; no fast test starts vLLM."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fakes import random_lora, vllm_lora_config

from memrl.data.errors import UserError
from memrl.data.schemas import Message
from memrl.rollout.engines import (
    EngineError,
    GenerationRequest,
    GenerationResult,
    PrefixCacheSimulator,
    SamplingParams,
    build_engine,
    chat_prompt_ids,
)
from memrl.rollout.models import load_causal_lm

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

SYSTEM = "You keep the agent's memory. " + " ".join(f"t{i}: item {i} is in box {i % 7}." for i in range(12))
MSGS = [
    [Message(role="system", content=SYSTEM), Message(role="user", content="where is the key?")],
    [Message(role="user", content="t5: blue key in chest 3. t6: red gem in drawer 1. what is in chest 3?")],
]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path):
    # LoRA rank 16: the trainer's default (the sync check's adapters)
    eng = build_engine(vllm_lora_config(tiny_model_dir, max_model_len=1024, max_lora_rank=16, block_size=32))
    yield eng
    eng.close()
    with pytest.raises(EngineError, match="closed"):
        eng.generate([GenerationRequest(prompt_ids=[5, 6, 7])])
    eng.close()


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir: Path):
    return load_causal_lm(tiny_model_dir, dtype="float32").eval()


def make_lora(model_dir: Path, out: Path, seed: int) -> Path:
    """A LoRA adapter on every projection, of the trainer's default rank, with large random A and B."""
    projections = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    return random_lora(model_dir, out, projections, std=0.5, seed=seed)


@torch.no_grad()
def forward_logprobs(model, prompt_ids: list[int], response_ids: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt_ids + response_ids])
    logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
    return logp[len(prompt_ids) - 1 :].gather(-1, ids[0, len(prompt_ids) :, None]).squeeze(-1)


def mean_abs_diff(model, results: list[GenerationResult]) -> tuple[float, float]:
    diffs = []
    for res in results:
        for c in res.completions:
            assert len(c.logprobs) == len(c.response_ids) > 0
            ref = forward_logprobs(model, res.prompt_ids, c.response_ids)
            diffs.append((ref - torch.tensor(c.logprobs)).abs())
    flat = torch.cat(diffs)
    return flat.mean().item(), flat.max().item()


def sample_ids(results: list[GenerationResult]) -> list[list[list[int]]]:
    return [[c.response_ids for c in r.completions] for r in results]


def seeded(n: int = 2, seed: int = 11, max_tokens: int = 16) -> list[GenerationRequest]:
    return [GenerationRequest(messages=m, sampling=SamplingParams(n=n, seed=seed, max_tokens=max_tokens)) for m in MSGS]


def test_logprobs_match_transformers_forward(engine, hf_model, tiny_model_dir) -> None:
    requests = [
        GenerationRequest(messages=MSGS[0], sampling=SamplingParams(n=4, seed=1, max_tokens=32)),
        GenerationRequest(prompt_ids=list(range(10, 90)), sampling=SamplingParams(n=2, seed=2, max_tokens=32)),
        # Sampling settings change which tokens are drawn, never how their log-probs are defined.
        GenerationRequest(
            messages=MSGS[1], sampling=SamplingParams(n=2, seed=3, max_tokens=32, temperature=0.7, top_p=0.9, top_k=50)
        ),
    ]
    results = engine.generate(requests)
    assert results[0].prompt_ids == chat_prompt_ids(engine.tokenizer, MSGS[0])
    assert results[1].prompt_ids == list(range(10, 90))
    mad, worst = mean_abs_diff(hf_model, results)
    print(f"vLLM vs transformers log-prob mean abs diff {mad:.2e}, max {worst:.2e}")
    assert mad < 1e-4
    assert worst < 1e-3
    assert all(r.engine == engine.name and r.policy_version == 0 for r in results)
    assert results[0].usage.prompt_tokens == 4 * len(results[0].prompt_ids)
    assert results[0].usage.completion_tokens == sum(len(c.response_ids) for c in results[0].completions)


def test_samples_and_seeds(engine) -> None:
    first = engine.generate(seeded(n=4))
    again = engine.generate(seeded(n=4))
    assert sample_ids(first) == sample_ids(again)
    assert len({tuple(ids) for ids in sample_ids(first)[0]}) == 4
    other = engine.generate(seeded(n=4, seed=12))
    assert sample_ids(other) != sample_ids(first)
    # A request's samples do not depend on what else is in the batch.
    alone = engine.generate(seeded(n=4)[:1])
    assert sample_ids(alone)[0] == sample_ids(first)[0]
    greedy_sp = SamplingParams(n=3, temperature=0, max_tokens=8)
    greedy = engine.generate([GenerationRequest(messages=MSGS[0], sampling=greedy_sp)])
    assert len({tuple(c.response_ids) for c in greedy[0].completions}) == 1
    unseeded = GenerationRequest(messages=MSGS[0], sampling=SamplingParams(n=1, max_tokens=16))
    a, b = engine.generate([unseeded, unseeded])
    assert a.completions[0].response_ids != b.completions[0].response_ids


def test_stop_strings_eos_and_length(engine) -> None:
    sp = SamplingParams(n=1, seed=11, max_tokens=24, ignore_eos=True)
    base = engine.generate([GenerationRequest(messages=MSGS[0], sampling=sp)])[0].completions[0]
    assert base.finish_reason == "length" and len(base.response_ids) == 24
    stop = base.text[6:9]
    sp_stop = SamplingParams(n=1, seed=11, max_tokens=24, ignore_eos=True, stop=[stop])
    cut = engine.generate([GenerationRequest(messages=MSGS[0], sampling=sp_stop)])[0].completions[0]
    assert cut.finish_reason == "stop"
    assert cut.text == base.text[: base.text.find(stop)]
    assert cut.response_ids == base.response_ids[: len(cut.response_ids)]
    assert stop in engine.tokenizer.decode(cut.response_ids)
    assert stop not in engine.tokenizer.decode(cut.response_ids[:-1])
    # End of sequence: kept in the ids, left out of the text.
    many = engine.generate([GenerationRequest(messages=MSGS[1], sampling=SamplingParams(n=8, seed=5, max_tokens=200))])
    ended = [c for c in many[0].completions if c.finish_reason == "stop"]
    assert ended
    for c in ended:
        assert c.response_ids[-1] in (engine.tokenizer.eos_token_id, engine.tokenizer.pad_token_id)
        # (vLLM's incremental detokenizer may hold back a trailing partial UTF-8 character)
        full = engine.tokenizer.decode(c.response_ids[:-1], skip_special_tokens=True)
        assert c.text.rstrip("\ufffd") == full.rstrip("\ufffd")


def test_prefix_cache_accounting_matches_simulator(engine) -> None:
    """Replaying vLLM's own token streams through the simulator gives vLLM's cached-token counts exactly."""
    engine.reset_prefix_cache()
    sim = PrefixCacheSimulator(block_size=engine.block_size)
    rounds = [seeded(n=3, max_tokens=40)]
    history = []
    for step in range(3):
        results = engine.generate(rounds[-1])
        for res in results:
            expected = sum(sim.lookup(res.prompt_ids) for _ in res.completions)
            assert res.usage.cached_prompt_tokens == expected, (step, res.usage)
        for res in results:
            for c in res.completions:
                sim.insert(res.prompt_ids, c.response_ids)
        history.append(results)
        # Next turn: each conversation continues from its first sample (the tree/agent-loop pattern).
        follow = engine.tokenizer.encode(f"\nuser: turn {step} " + "what next? " * 12, add_special_tokens=False)
        rounds.append(
            [
                GenerationRequest(
                    prompt_ids=res.prompt_ids + res.completions[0].response_ids + follow,
                    sampling=SamplingParams(n=2, seed=step, max_tokens=40),
                )
                for res in results
            ]
        )
    total = sum(r.usage.cached_prompt_tokens for results in history for r in results)
    assert total > 0
    # The continuation hits blocks that hold generated tokens, not only prompt blocks.
    first_prompt_blocks = len(history[0][0].prompt_ids) // engine.block_size * engine.block_size
    assert history[1][0].usage.cached_prompt_tokens // 2 > first_prompt_blocks


def test_lora_hot_swap(engine, hf_model, tiny_model_dir, tmp_path) -> None:
    from peft import PeftModel

    requests = seeded(n=2)
    base = engine.generate(requests)
    one = make_lora(tiny_model_dir, tmp_path / "v1", seed=1)
    two = make_lora(tiny_model_dir, tmp_path / "v2", seed=2)
    engine.load_adapter(str(one), version=1)
    with_one = engine.generate(requests)
    assert sample_ids(with_one) != sample_ids(base)
    assert all(r.policy_version == 1 for r in with_one)
    peft_one = PeftModel.from_pretrained(load_causal_lm(tiny_model_dir, dtype="float32"), str(one)).eval()
    mad, _ = mean_abs_diff(peft_one, with_one)
    print(f"vLLM LoRA vs PEFT log-prob mean abs diff {mad:.2e}")
    assert mad < 1e-4
    with pytest.raises(UserError, match="adapter"):  # a missing folder is the user's to fix: named, exit 2
        engine.load_adapter(str(tmp_path / "missing"), version=9)
    assert sample_ids(engine.generate(requests)) == sample_ids(with_one) and engine.policy_version == 1
    engine.load_adapter(str(two), version=2)
    assert engine.llm.llm_engine.list_loras() == {engine._lora.lora_int_id}
    with_two = engine.generate(requests)
    assert sample_ids(with_two) != sample_ids(with_one)
    engine.use_base()
    assert engine.llm.llm_engine.list_loras() == set()
    restored = engine.generate(requests)
    assert sample_ids(restored) == sample_ids(base)
    assert all(r.policy_version == 0 for r in restored)


def test_an_sft_lora_adapter_serves_its_weights(engine, tiny_model_dir, tmp_path) -> None:
    """The adapter ``memrl sft`` saves (LoRA on the recall role) hot-loads into the engine: its greedy log-probs are
    transformers' with the adapter, far from the base model's."""
    from peft import PeftModel
    from test_sft import make_cfg, sam_traces

    from memrl.data.distill import distill_traces
    from memrl.data.formats import render_sam_recall_prompt
    from memrl.train.sft import run_sft

    distill_traces(sam_traces(40), tmp_path / "data", progress=False)
    cfg = make_cfg(
        tiny_model_dir,
        tmp_path,
        "lora",
        data={"dir": str(tmp_path / "data"), "roles": ["recall"]},
        lora={"enabled": True, "r": 8, "alpha": 16},
        train={"max_steps": 8, "lr": 5e-3},
    )
    run_sft(cfg)
    adapter = tmp_path / "lora" / "final"
    prompt = [
        Message(**m)
        for m in render_sam_recall_prompt(
            "where is the red key?", 3, "t3> open drawer 5\nthe red key is in drawer 5", ""
        )
    ]
    request = GenerationRequest(messages=prompt, sampling=SamplingParams(temperature=0.0, max_tokens=8, logprobs=True))
    engine.load_adapter(adapter, version=1)
    try:
        assert engine.policy_version == 1
        out = engine.generate([request])[0]
    finally:
        engine.use_base()
    tuned = out.completions[0]
    peft_model = PeftModel.from_pretrained(load_causal_lm(tiny_model_dir), str(adapter)).eval()
    ids = torch.tensor([out.prompt_ids + tuned.response_ids])
    start = len(out.prompt_ids) - 1

    def hf_logprobs() -> torch.Tensor:
        with torch.no_grad():
            logp = torch.log_softmax(peft_model(input_ids=ids).logits[0, :-1].float(), -1)
        return logp[start:].gather(-1, ids[0, start + 1 :, None]).squeeze(-1)

    with_adapter = hf_logprobs()
    with peft_model.disable_adapter():
        base = hf_logprobs()
    served = torch.tensor(tuned.logprobs)
    assert torch.allclose(served, with_adapter, atol=2e-3), (served, with_adapter)
    assert (served - base).abs().max() > 0.1, (served, base)


def test_full_weight_update(engine, tiny_model_dir) -> None:
    requests = seeded(n=2)
    base = engine.generate(requests)
    model = load_causal_lm(tiny_model_dir, dtype="float32").eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.5)
    engine.update_weights(model.state_dict(), version=3)
    updated = engine.generate(requests)
    assert sample_ids(updated) != sample_ids(base)
    assert all(r.policy_version == 3 for r in updated)
    mad, _ = mean_abs_diff(model, updated)
    assert mad < 1e-4
    engine.update_weights(str(tiny_model_dir), version=4)
    restored = engine.generate(requests)
    assert sample_ids(restored) == sample_ids(base)
    assert restored[0].policy_version == 4
    with pytest.raises(EngineError, match="safetensors"):
        engine.update_weights(str(tiny_model_dir / "no-such-dir"), version=5)


def test_a_sync_check_passes_taken_syncs_and_stops_on_an_ignored_one(engine, tiny_model_dir, tmp_path, monkeypatch):
    """The weight-sync check on this engine, LoRA hot-swap, a LoRA policy sent merged (``lora_sync: merged``) and the
    in-place full-weight reload: taken syncs pass (the fp32 gap is at rounding level), an ignored one stops the run
    (tests/test_sync_check.py checks the HF engine). Last in the module: it leaves the trainer's weights in the engine
    until it reloads the tiny model's."""
    from test_sync_check import trainer_groups

    from memrl.rollout.engines.vllm_engine import VLLMEngine
    from memrl.train.group_trainer import GroupTrainer, GroupTrainerConfig
    from memrl.train.online import sync_policy
    from memrl.train.policy import LoraSettings, PolicySpec
    from memrl.train.weight_sync import SyncCheckConfig, SyncCheckError, SyncVerifier

    try:
        for lora, merged in ((True, False), (True, True), (False, False)):  # adapter, merged adapter, full weights
            torch.manual_seed(0)
            trainer = GroupTrainer(
                PolicySpec(base=str(tiny_model_dir)), GroupTrainerConfig(lr=1e-3, lora=LoraSettings(enabled=lora))
            )
            verifier = SyncVerifier(trainer, SyncCheckConfig())
            root = tmp_path / ("full" if not lora else "merged" if merged else "lora")
            sync_policy(trainer, engine, root, merged=merged)
            assert verifier.check(engine)["sync_check_gap"] < 1e-5
            trainer.step(trainer_groups(verifier.prompts))
            sync_policy(trainer, engine, root, merged=merged)
            assert verifier.check(engine)["sync_check_gap"] < 1e-5
            assert (root / "v00001" / "merged" / "model.safetensors").exists() == merged
            trainer.step(trainer_groups(verifier.prompts))
            with monkeypatch.context() as patch:
                patch.setattr(
                    VLLMEngine,
                    "load_adapter" if lora and not merged else "update_weights",
                    lambda self, path, version: setattr(self, "policy_version", version),
                )
                sync_policy(trainer, engine, root, merged=merged)
                with pytest.raises(SyncCheckError, match=f"engine {engine.name} at policy version 2 answers the probe"):
                    verifier.check(engine)
            engine.use_base(0)
    finally:
        engine.use_base(0)
        engine.update_weights(str(tiny_model_dir), version=0)
