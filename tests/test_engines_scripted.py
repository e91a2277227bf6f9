"""Scripted engine (determinism, token accounting, simulated prefix cache), the cache simulator, engine configs, and
handing freed memory back after a large stage."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memrl.data.config import ConfigError, load_config
from memrl.data.schemas import Message
from memrl.rollout.engines import (
    EngineConfig,
    EngineError,
    GenerationRequest,
    PrefixCacheSimulator,
    SamplingParams,
    build_engine,
    chat_prompt_ids,
    sample_seed,
    to_memory_call,
)
from memrl.rollout.engines.scripted import ScriptedEngine
from memrl.rollout.models import load_tokenizer


class Dice:
    """Answers with random draws (so seeds matter) and echoes the metadata it was given."""

    name = "dice"

    def __init__(self, sides: int = 1000, words: int = 3) -> None:
        self.sides, self.words = sides, words

    def respond(self, messages: list[Message], rng: random.Random, metadata: dict[str, Any]) -> str:
        rolls = " ".join(str(rng.randrange(self.sides)) for _ in range(self.words))
        return f"{metadata.get('task_id', '-')}: {rolls} after {len(messages)} messages"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return load_tokenizer(tiny_model_dir)


def ask(content: str, n: int = 1, seed: int | None = 7, **kw: Any) -> GenerationRequest:
    return GenerationRequest(
        messages=[Message(role="user", content=content)],
        sampling=SamplingParams(n=n, seed=seed, **kw),
        metadata={"task_id": "t1"},
    )


def texts(results) -> list[list[str]]:
    return [[c.text for c in r.completions] for r in results]


def test_seeded_samples_are_deterministic_and_distinct() -> None:
    engine = ScriptedEngine(Dice())
    first = engine.generate([ask("a", n=4), ask("b", n=2, seed=8)])
    assert texts(first) == texts(ScriptedEngine(Dice()).generate([ask("a", n=4), ask("b", n=2, seed=8)]))
    assert len(set(texts(first)[0])) == 4
    assert first[0].completions[0].text.startswith("t1: ")
    # sample i of seed s uses random.Random(sample_seed(s, i)), whatever else is in the batch
    rng = random.Random(sample_seed(7, 2))
    assert first[0].completions[2].text == Dice().respond([Message(role="user", content="a")], rng, {"task_id": "t1"})
    assert texts(engine.generate([ask("a", n=4)]))[0] == texts(first)[0]
    assert texts(engine.generate([ask("a", n=4, seed=9)]))[0] != texts(first)[0]


def test_unseeded_requests_are_reproducible_per_run() -> None:
    a, b = ScriptedEngine(Dice(), seed=3), ScriptedEngine(Dice(), seed=3)
    run_a = [texts(a.generate([ask("x", seed=None)])) for _ in range(3)]
    run_b = [texts(b.generate([ask("x", seed=None)])) for _ in range(3)]
    assert run_a == run_b
    assert len({r[0][0] for r in run_a}) == 3
    assert run_a != [texts(ScriptedEngine(Dice(), seed=4).generate([ask("x", seed=None)])) for _ in range(3)]


def test_sample_seed_mixes_request_seed_and_index() -> None:
    seeds = {sample_seed(s, i) for s in range(50) for i in range(8)}
    assert len(seeds) == 400
    assert all(0 <= s < 2**63 for s in seeds)


def test_token_accounting_with_tokenizer(tokenizer) -> None:
    engine = ScriptedEngine(Dice(), tokenizer=tokenizer)
    req = ask("where is the key?", n=2)
    (res,) = engine.generate([req])
    assert res.prompt_ids == chat_prompt_ids(tokenizer, req.messages)
    for c in res.completions:
        assert c.response_ids == [*tokenizer.encode(c.text, add_special_tokens=False), tokenizer.eos_token_id]
        assert c.logprobs == [] and c.finish_reason == "stop"
    assert res.usage.prompt_tokens == 2 * len(res.prompt_ids)
    assert res.usage.completion_tokens == sum(len(c.response_ids) for c in res.completions)
    call = to_memory_call("c0", "recall", req, res, sample=1)
    assert call.response_ids == res.completions[1].response_ids and call.engine == engine.name


def test_memory_call_counts_tokens_from_usage_without_ids() -> None:
    # A chat-API endpoint answers text only: the call's token counts come from the server's usage, not 0.
    from memrl.rollout.engines.base import Completion, GenerationResult, Usage

    req = ask("q", n=2)
    res = GenerationResult(
        prompt_ids=[],
        completions=[Completion(response_ids=[], logprobs=[], text="a", finish_reason="stop")] * 2,
        usage=Usage(prompt_tokens=40, completion_tokens=14),
        engine="chat",
    )
    call = to_memory_call("c0", "recall", req, res, sample=0)
    assert (call.prompt_tokens, call.completion_tokens) == (20, 7)


def test_stop_strings_and_max_tokens(tokenizer) -> None:
    engine = ScriptedEngine(Dice(words=12), tokenizer=tokenizer)
    full = engine.generate([ask("q")])[0].completions[0]
    stop = " after"
    cut = engine.generate([ask("q", stop=[stop])])[0].completions[0]
    assert cut.text == full.text[: full.text.index(stop)] and cut.finish_reason == "stop"
    assert stop in tokenizer.decode(cut.response_ids) and tokenizer.eos_token_id not in cut.response_ids
    short = engine.generate([ask("q", max_tokens=5)])[0].completions[0]
    assert len(short.response_ids) == 5 and short.finish_reason == "length"
    assert short.response_ids == full.response_ids[:5]
    plain = ScriptedEngine(Dice(words=12)).generate([ask("q", stop=[stop])])[0]
    assert plain.completions[0].text == cut.text and plain.prompt_ids == [] and plain.usage.prompt_tokens == 0


def test_scripted_engine_rejects_prompt_ids_and_bad_replies() -> None:
    with pytest.raises(EngineError, match="chat messages"):
        ScriptedEngine(Dice()).generate([GenerationRequest(prompt_ids=[1, 2, 3])])

    class Silent:
        name = "silent"

        def respond(self, messages, rng, metadata):
            return None

    with pytest.raises(EngineError, match="expected str"):
        ScriptedEngine(Silent()).generate([ask("q")])


# ----------------------------------------------------------------------------------------------------------------
# Simulated prefix cache


def test_simulator_counts_full_blocks_of_the_longest_cached_prefix() -> None:
    sim = PrefixCacheSimulator(block_size=4)
    prompt = list(range(100, 110))  # 10 tokens: two full blocks
    assert sim.lookup(prompt) == 0
    assert sim.lookup(prompt) == 8
    assert sim.lookup(prompt[:9]) == 8  # (9 - 1) // 4 = 2 blocks may hit
    assert sim.lookup(prompt[:8]) == 4  # the last prompt token is always computed
    assert sim.lookup([*prompt[:4], 999, *prompt[5:]]) == 4  # a change invalidates every later block
    assert sim.lookup([7, *prompt]) == 0  # blocks are keyed by their whole prefix
    assert sim.lookup(prompt, namespace="adapter-1") == 0  # separate namespaces never share blocks


def test_simulator_caches_generated_tokens_but_not_the_last() -> None:
    sim = PrefixCacheSimulator(block_size=4)
    prompt, response = list(range(6)), [50, 51, 52, 53, 54, 55]
    sim.lookup(prompt)
    sim.insert(prompt, response)  # computed: 6 + 5 tokens -> 2 full blocks
    follow = prompt + response + [9, 9, 9, 9, 9]
    assert sim.lookup(follow) == 8
    longer = PrefixCacheSimulator(block_size=4)
    longer.lookup(prompt)
    longer.insert(prompt, [*response, 56, 57])  # computed: 13 tokens -> 3 full blocks
    assert longer.lookup([*prompt, *response, 56, 57, 1]) == 12


def test_simulator_evicts_least_recently_used_tails_first() -> None:
    sim = PrefixCacheSimulator(block_size=2, capacity_tokens=8)  # 4 blocks
    shared = [1, 2, 3, 4]
    sim.lookup([*shared, 10, 11, 12])  # blocks: s0 s1 a2
    sim.lookup([*shared, 20, 21, 22])  # blocks: s0 s1 b2 -> 4 blocks cached
    assert len(sim) == 4
    sim.lookup([30, 31, 32, 33, 34])  # 2 new blocks evict the two oldest: tails a2, then ... never the shared prefix
    assert sim.evictions == 2
    assert sim.lookup([*shared, 40]) == 4


def test_scripted_engine_reports_cached_prefill_on_shared_prefixes(tokenizer) -> None:
    engine = ScriptedEngine(Dice(), tokenizer=tokenizer, block_size=16)
    history = [Message(role="system", content="memory notes: " + " ".join(f"t{i} box {i}" for i in range(40)))]
    first = engine.generate(
        [
            GenerationRequest(
                messages=[*history, Message(role="user", content="q1")], sampling=SamplingParams(n=3, seed=1)
            )
        ]
    )[0]
    length = len(first.prompt_ids)
    full_blocks = (length - 1) // 16 * 16
    # sample 0 computes everything; samples 1 and 2 reuse its prompt blocks
    assert first.usage.cached_prompt_tokens == 2 * full_blocks
    # the next turn shares the whole previous conversation: prompt + reply blocks come from cache
    reply = first.completions[0]
    turn = [
        *history,
        Message(role="user", content="q1"),
        Message(role="assistant", content=reply.text),
        Message(role="user", content="q2"),
    ]
    second = engine.generate([GenerationRequest(messages=turn, sampling=SamplingParams(seed=2))])[0]
    assert second.prompt_ids[:length] == first.prompt_ids
    assert second.usage.cached_prompt_tokens >= full_blocks
    # the same batch replayed through a fresh simulator gives the same counts
    sim = PrefixCacheSimulator(block_size=16)
    assert sum(sim.lookup(first.prompt_ids) for _ in range(3)) == first.usage.cached_prompt_tokens
    for c in first.completions:
        sim.insert(first.prompt_ids, c.response_ids)
    assert sim.lookup(second.prompt_ids) == second.usage.cached_prompt_tokens


# ----------------------------------------------------------------------------------------------------------------
# Configs


def test_build_scripted_engine_from_config_import_path(tiny_model_dir: Path) -> None:
    cfg = EngineConfig(
        backend="scripted",
        scripted_policy="tests.test_engines_scripted:Dice",
        scripted_kwargs={"words": 5},
        tokenizer=str(tiny_model_dir),
        name="reasoner",
    )
    engine = build_engine(cfg)
    (res,) = engine.generate([ask("q")])
    assert res.engine == "reasoner" and len(res.completions[0].text.split(": ")[1].split()) == 8
    assert res.prompt_ids and res.usage.prompt_tokens == len(res.prompt_ids)
    assert isinstance(build_engine(EngineConfig(backend="scripted"), policy=Dice()), ScriptedEngine)
    with pytest.raises(ValueError, match="scripted_policy"):
        build_engine(EngineConfig(backend="scripted"))
    with pytest.raises(ValueError, match=r"package\.module:Class"):
        build_engine(EngineConfig(backend="scripted", scripted_policy="no_colon_here"))


def test_engine_config_validation(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs 'model'"):
        EngineConfig(backend="vllm")
    with pytest.raises(ValueError, match="endpoints"):
        EngineConfig(backend="openai")
    with pytest.raises(ValueError, match="tokenizer"):
        EngineConfig(backend="openai", api="completions", endpoints=[{"url": "http://x/v1", "model": "m"}])
    path = tmp_path / "engine.yaml"
    path.write_text(
        "backend: openai\nendpoints:\n  - url: http://127.0.0.1:8000/v1\n    model: m\n    api_key_env: MY_KEY\n"
        "    tokens_per_minute: 100000\n"
    )
    cfg = load_config(EngineConfig, path, ["request_timeout_s=5"])
    assert cfg.endpoints[0].api_key_env == "MY_KEY" and cfg.request_timeout_s == 5
    path.write_text("backend: openai\nendpoints:\n  - url: http://127.0.0.1:8000/v1\n    api_key: sk-secret\n")
    with pytest.raises(ConfigError, match="api_key_env"):
        load_config(EngineConfig, path)
    path.write_text("backend: vllm\nmodel: m\nkv_cache_bytes: 1\n")
    with pytest.raises(ConfigError, match="kv_cache_memory_bytes"):
        load_config(EngineConfig, path)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm; malloc_trim is glibc's")
def test_release_freed_memory_hands_the_heaps_freed_pages_back() -> None:
    """64 KiB blocks sit on the C heap (below glibc's mmap threshold), and one block allocated after them keeps the
    heap's top, so freeing them leaves the process's resident memory where it was until the pages are handed back."""
    script = (
        "import gc, torch\n"
        "from memrl.rollout.engines.base import release_freed_memory\n"
        "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * 4096 // 2**20\n"
        "blocks = [torch.ones(16 * 1024) for _ in range(2000)]\n"
        "top = torch.ones(16 * 1024)\n"
        "del blocks\n"
        "gc.collect()\n"
        "freed = rss()\n"
        "release_freed_memory()\n"
        "print(freed - rss())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    assert int(out.stdout.split()[-1]) >= 100  # MiB of the 125 freed
