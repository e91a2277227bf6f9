"""The transformers backend on the tiny model: raw log-probs, per-sample seeds, batching, stops, adapters, updates."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from fakes import random_lora

from memrl.data.schemas import Message
from memrl.rollout.engines import (
    EngineConfig,
    EngineError,
    GenerationRequest,
    SamplingParams,
    build_engine,
    chat_prompt_ids,
)
from memrl.rollout.engines.hf_engine import HFEngine
from memrl.rollout.models import load_causal_lm

MSGS = [
    [Message(role="system", content="You keep notes."), Message(role="user", content="where is the blue key?")],
    [Message(role="user", content="t5: blue key in chest 3. what is in chest 3?")],
]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> HFEngine:
    engine = build_engine(EngineConfig(backend="hf", model=str(tiny_model_dir), dtype="float32", max_model_len=256))
    assert isinstance(engine, HFEngine)
    return engine


def req(m: int = 0, **kw) -> GenerationRequest:
    return GenerationRequest(messages=MSGS[m], sampling=SamplingParams(**{"max_tokens": 16, "seed": 3, **kw}))


def ids(result) -> list[list[int]]:
    return [c.response_ids for c in result.completions]


@torch.no_grad()
def forward_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    x = torch.tensor([prompt + response])
    logp = torch.log_softmax(model(input_ids=x).logits[0, :-1].float(), -1)
    return logp[len(prompt) - 1 :].gather(-1, x[0, len(prompt) :, None]).squeeze(-1)


def test_raw_logprobs_match_the_forward_pass(engine) -> None:
    results = engine.generate([req(0, n=3), req(1, n=2, temperature=0.6, top_p=0.8, top_k=40)])
    assert results[0].prompt_ids == chat_prompt_ids(engine.tokenizer, MSGS[0])
    diffs = [
        (forward_logprobs(engine.model, r.prompt_ids, c.response_ids) - torch.tensor(c.logprobs)).abs().max().item()
        for r in results
        for c in r.completions
    ]
    assert max(diffs) < 1e-4
    assert results[0].usage.prompt_tokens == 3 * len(results[0].prompt_ids)
    assert results[1].usage.completion_tokens == sum(len(c.response_ids) for c in results[1].completions)
    assert all(r.engine == "hf" and r.policy_version == 0 for r in results)
    assert engine.generate([req(0, logprobs=False)])[0].completions[0].logprobs == []


def test_samples_depend_on_seed_not_on_the_batch(engine, tiny_model_dir) -> None:
    alone = engine.generate([req(0, n=4)])[0]
    assert len({tuple(x) for x in ids(alone)}) == 4
    mixed = engine.generate([req(1, n=3, seed=9), req(0, n=4), GenerationRequest(prompt_ids=list(range(10, 70)))])
    assert ids(mixed[1]) == ids(alone)
    one_row = HFEngine(engine.model, engine.tokenizer, batch_size=1)
    assert ids(one_row.generate([req(0, n=4)])[0]) == ids(alone)
    assert ids(engine.generate([req(0, n=4, seed=4)])[0]) != ids(alone)
    greedy = engine.generate([req(0, n=3, temperature=0.0)])[0]
    assert len({tuple(x) for x in ids(greedy)}) == 1
    first, second = engine.generate([req(0, seed=None), req(0, seed=None)])
    assert ids(first) != ids(second)


def test_stop_strings_eos_and_lengths(engine) -> None:
    base = engine.generate([req(0, max_tokens=24, ignore_eos=True)])[0].completions[0]
    assert base.finish_reason == "length" and len(base.response_ids) == 24
    stop = base.text[5:8]
    cut = engine.generate([req(0, max_tokens=24, ignore_eos=True, stop=[stop])])[0].completions[0]
    assert cut.finish_reason == "stop" and cut.text == base.text[: base.text.find(stop)]
    assert cut.response_ids == base.response_ids[: len(cut.response_ids)]
    assert stop in engine.tokenizer.decode(cut.response_ids)
    assert stop not in engine.tokenizer.decode(cut.response_ids[:-1])
    assert len(cut.logprobs) == len(cut.response_ids)
    many = engine.generate([req(1, n=8, seed=5, max_tokens=200)])[0]
    ended = [c for c in many.completions if c.finish_reason == "stop"]
    assert ended
    for c in ended:
        assert c.response_ids[-1] in engine.stop_ids and c.response_ids.count(c.response_ids[-1]) >= 1
        assert not any(t in engine.stop_ids for t in c.response_ids[:-1])
    # the context limit caps generation
    long_prompt = GenerationRequest(prompt_ids=list(range(10, 250)), sampling=SamplingParams(max_tokens=50, seed=1))
    capped = engine.generate([long_prompt])[0].completions[0]
    assert len(capped.response_ids) <= 256 - 240
    with pytest.raises(EngineError, match="max_model_len"):
        engine.generate([GenerationRequest(prompt_ids=list(range(300)))])


def test_adapter_and_weight_updates(engine, tiny_model_dir, tmp_path) -> None:
    before = ids(engine.generate([req(0, n=2)])[0])
    adapter = random_lora(tiny_model_dir, tmp_path / "adapter", ["q_proj", "v_proj"], std=0.5, rank=4)
    engine.load_adapter(str(adapter), version=1)
    with_adapter = engine.generate([req(0, n=2)])[0]
    assert ids(with_adapter) != before and with_adapter.policy_version == 1
    engine.use_base()
    assert ids(engine.generate([req(0, n=2)])[0]) == before
    noisy = load_causal_lm(tiny_model_dir)
    with torch.no_grad():
        for param in noisy.parameters():
            param.add_(torch.randn_like(param) * 0.5)
    engine.update_weights(noisy.state_dict(), version=2)
    updated = engine.generate([req(0, n=2)])[0]
    assert ids(updated) != before and updated.policy_version == 2
    engine.update_weights(str(tiny_model_dir), version=3)
    assert ids(engine.generate([req(0, n=2)])[0]) == before
    with pytest.raises(EngineError, match="safetensors"):
        engine.update_weights(str(tmp_path / "missing"), version=4)


def test_rows_join_and_leave_a_running_batch_with_the_answers_they_get_alone(engine) -> None:
    """Continuous batching: rows that arrive while others decode join the batch (their longer prompts pad the running
    rows on the left), leave it the step they end (their padding columns are then cut), and every row gets the tokens
    and log-probs it gets alone."""
    running = GenerationRequest(prompt_ids=list(range(10, 30)), sampling=SamplingParams(n=2, max_tokens=40, seed=1))
    joining = [
        GenerationRequest(prompt_ids=list(range(40, 100)), sampling=SamplingParams(n=2, max_tokens=5, seed=2)),
        GenerationRequest(prompt_ids=list(range(50, 90)), sampling=SamplingParams(temperature=0.0, max_tokens=3)),
    ]
    for r in (running, *joining):
        r.sampling.ignore_eos = True
    alone = [engine.generate([r])[0] for r in (running, *joining)]
    assert engine.decoder is not None and engine.concurrent_requests
    rows = engine._rows([running])[1]
    engine.decoder.submit(rows)
    while len(rows[0].ids) < 8:  # the running rows are decoding
        time.sleep(0.001)
    later = engine.generate(joining)
    assert not rows[0].done.done()  # the joining rows ended while the running ones went on
    together = [engine._results([rows])[0], *later]
    for a, b in zip(alone, together, strict=True):
        assert ids(a) == ids(b)
        for x, y in zip(a.completions, b.completions, strict=True):
            assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)) < 1e-5


def test_closing_the_engine_fails_the_rows_in_flight(tiny_model_dir) -> None:
    engine = build_engine(EngineConfig(backend="hf", model=str(tiny_model_dir), dtype="float32"))
    rows, _ = engine._rows(
        [GenerationRequest(prompt_ids=list(range(10, 30)), sampling=SamplingParams(max_tokens=4000))]
    )
    engine.decoder.submit(rows[0])
    while not rows[0][0].ids:
        time.sleep(0.001)
    engine.close()
    with pytest.raises(EngineError, match="closed during generation"):
        rows[0][0].done.result()
    with pytest.raises(EngineError, match="closed"):
        engine.generate([req(0)])
