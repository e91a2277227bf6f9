"""The baselines behind the memory-system interface (long-context truncation, BM25 and embedding retrieval of needle
turns, the scripted reasoner using them in the loop) and the memory-system registry."""

from __future__ import annotations

import copy
import itertools
import random
from pathlib import Path
from typing import Any

import pytest
from fakes import DOOR_CODE_TURNS, QACase
from pydantic import ValidationError

from memrl.data.envs.base import count_tokens
from memrl.data.formats import (
    LONG_CONTEXT_REASONER_SYSTEM,
    RETRIEVAL_REASONER_SYSTEM,
    SAM_REASONER_SYSTEM,
    ToolCall,
    parse_sam_recalled,
    parse_tool_calls,
    render_tool_call,
)
from memrl.data.registry import ComponentError
from memrl.data.tasks.common import content_of
from memrl.data.tasks.sam import SamTask
from memrl.rollout.agents import sam_engines, sam_rollout
from memrl.rollout.loop import run_rollouts
from memrl.rollout.memory.ama_agent import AMAMemory
from memrl.rollout.memory.base import Turn
from memrl.rollout.memory.baselines import (
    BM25Config,
    BM25Memory,
    EmbeddingConfig,
    EmbeddingMemory,
    LongContextConfig,
    LongContextMemory,
    bm25_rank,
)
from memrl.rollout.memory.embedders import HashingEmbedder
from memrl.rollout.memory.external import ExternalMemory
from memrl.rollout.memory.mage import MageMemory
from memrl.rollout.memory.memma import MemMAMemory
from memrl.rollout.memory.proactive import ProactiveMemory
from memrl.rollout.memory.registry import build_memory, memory_names, parse_memory_config
from memrl.rollout.memory.sam import SamConfig, SamMemory, make_token_counter
from memrl.rollout.models import load_tokenizer

PAGING = {"page_tokens": 200, "live_capacity_tokens": 600, "keep_recent_tokens": 300}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return load_tokenizer(tiny_model_dir)


def fed(memory: Any, task: SamTask) -> Any:
    """``memory`` after the whole episode arrived turn by turn (as in the loop), the question last."""
    episode = task.episode()
    memory.reset(task.task, {})
    for turn in episode.trajectory:
        first = turn.turn_idx == 0
        action = "" if first else render_tool_call("act", {"action": turn.action})
        memory.on_turn(
            Turn(step=turn.turn_idx, action_text=action, observation=turn.observation, role="user" if first else "tool")
        )
    return memory


def retrieved_steps(memory: Any, intent: str) -> tuple[list[int], str]:
    memory.on_tool_call(ToolCall("memory", {"intent": intent}), 999)
    result = memory.tool_result()
    assert result is not None and result.error is None
    _, ids, content = parse_sam_recalled(result.content)
    return [s for i in ids for s in memory.pages[i].steps], content


def intents(task: SamTask) -> list[tuple[str, int]]:
    """(intent, needle turn) pairs the reasoner would ask: the item, or the container's key and then the key."""
    if task.params.n_evidence == 1:
        return [(f"where is the {task.gold_entities[0]}", task.evidence_turns[0])]
    key, container = task.gold_entities
    observations = {t: task.episode().trajectory[t].observation for t in task.evidence_turns}
    hint = next(t for t, o in observations.items() if f"the {key} opens {container}" in o)
    location = next(t for t, o in observations.items() if f"the {key} is in " in o)
    return [(f"which key opens {container}", hint), (f"where is the {key}", location)]


# ---------------------------------------------------------------------------------------------------- retrieval
@pytest.mark.parametrize("hops", [1, 2])
def test_bm25_retrieves_the_needle_turns(hops: int) -> None:
    for seed in range(8):
        task = SamTask({"horizon_steps": 80, "n_evidence": hops}, seed=seed)
        memory = fed(BM25Memory(BM25Config(**PAGING)), task)
        assert len(memory.pages) > 8
        for intent, needle in intents(task):
            steps, content = retrieved_steps(memory, intent)
            assert needle in steps, (seed, intent)
            assert task.episode().trajectory[needle].observation in content  # the raw page text comes back


def test_minilm_embedding_retrieves_the_needle_turns() -> None:
    config = EmbeddingConfig(page_turns=1, live_capacity_turns=4, keep_recent_turns=3, top_k=3)
    for hops, seed in itertools.product((1, 2), range(3)):
        task = SamTask({"horizon_steps": 30, "n_evidence": hops, "facts_per_obs": 1}, seed=seed)
        memory = fed(EmbeddingMemory(config), task)
        for intent, needle in intents(task):
            assert needle in retrieved_steps(memory, intent)[0], (seed, intent)
    assert memory.embedder.name == "minilm" and len(memory.vectors) == len(memory.pages)
    assert copy.deepcopy(memory).embedder is memory.embedder  # shared, never copied


def test_bm25_rank_keeps_digits_and_drops_unmatched_pages() -> None:
    docs = ["the iron pen 4 is in jar 1", "the iron pen 2 is in jar 3", "the red cup is in box 2"]
    assert bm25_rank(docs, "where is the iron pen 2", 3)[0] == 1
    assert bm25_rank(docs, "where is the zebra", 3) == [] and bm25_rank([], "x", 3) == []


def test_retrieval_tool_errors() -> None:
    memory = BM25Memory(BM25Config(**PAGING))
    memory.reset("t", {})
    memory.on_tool_call(ToolCall("memory", {"intent": "where is x"}), 1)
    assert memory.tool_result().error == "memory is empty: no pages have been written yet"
    fed(memory, SamTask({"horizon_steps": 40}, seed=0))
    memory.on_tool_call(ToolCall("memory", {"page_ids": [1]}), 1)
    assert memory.tool_result().error.startswith("memory needs an intent")
    memory.on_tool_call(ToolCall("memory", {"intent": "where is the zebra"}), 2)
    assert parse_sam_recalled(memory.tool_result().content) == ("where is the zebra", [], "nothing relevant")
    assert memory.stats["bm25_tool_errors"] == 1 and memory.stats["bm25_empty_recalls"] == 1


@pytest.mark.parametrize("name", ["bm25", "embedding"])
def test_the_scripted_reasoner_uses_retrieval_in_the_loop(name: str) -> None:
    tasks = [SamTask({"horizon_steps": 60, "n_evidence": 1 + s % 2}, seed=s) for s in range(6)]
    config = {"name": name, **PAGING, **({"embedder": "hashing"} if name == "embedding" else {})}
    rollouts = [sam_rollout(t, config, seed=i) for i, t in enumerate(tasks)]
    assert rollouts[0].reasoner_system == RETRIEVAL_REASONER_SYSTEM
    traces = run_rollouts(rollouts, sam_engines())
    for trace in traces:
        calls = [parse_tool_calls(e.reply).calls[0] for e in trace.events if e.kind == "memory_tool"]
        assert calls and all(set(c.arguments) == {"intent"} for c in calls)  # no page ids without cues
        assert trace.memory_calls == [] and trace.memory_system == name
    assert sum(t.outcome for t in traces) >= 5


# ---------------------------------------------------------------------------------------------------- long context
def test_long_context_keeps_the_task_and_drops_the_oldest_turns_first() -> None:
    memory = LongContextMemory(LongContextConfig(window_tokens=300))
    memory.reset("the task", {})
    for i in range(40):
        memory.on_turn(
            Turn(
                step=i,
                action_text=f"act {i}" if i else "",
                observation=f"observation number {i}",
                role="tool" if i else "user",
            )
        )
    messages = memory.reasoner_messages("")
    assert [m.role for m in messages[:2]] == ["system", "user"] and messages[0].content == LONG_CONTEXT_REASONER_SYSTEM
    assert messages[1].content.startswith("task: the task")
    kept = [int(m.content.split()[-1]) for m in messages[2:] if m.role == "tool"]
    assert kept == list(range(40 - len(kept), 40)) and 0 < len(kept) < 40  # a recent suffix of whole turns
    cost = sum(count_tokens(m.content) + 5 for m in messages) + 3
    older = count_tokens(f"act {kept[0] - 1}") + count_tokens(f"observation number {kept[0] - 1}") + 10
    assert cost <= 300 < cost + older  # the next older turn would not have fitted
    assert memory.stats["long_context_dropped_turns"] == 40 - len(kept)


def test_long_context_prompt_never_exceeds_the_window_with_the_tokenizer(tokenizer: Any) -> None:
    window = 1500
    task = SamTask({"horizon_steps": 80}, seed=1)
    rollout = sam_rollout(
        task, {"name": "long_context", "window_tokens": window}, count_tokens=make_token_counter(tokenizer)
    )
    (trace,) = run_rollouts([rollout], sam_engines(tokenizer=tokenizer))
    prompts = [e.reasoner_prompt_tokens for e in trace.events if e.kind != "limit"]
    assert max(prompts) == trace.peak_context_tokens <= window
    assert trace.peak_context_tokens > window - 80  # truncation fills the window (a turn is well under 80 tokens)
    assert trace.answer == "unknown" and trace.outcome == 0.0  # the evidence fell out of the window


def test_long_context_succeeds_when_the_history_fits_and_fails_when_it_does_not() -> None:
    tasks = [SamTask({"horizon_steps": 60, "n_evidence": 1 + s % 2}, seed=s) for s in range(4)]
    wide = run_rollouts([sam_rollout(t, LongContextConfig(window_tokens=100_000)) for t in tasks], sam_engines())
    narrow = run_rollouts([sam_rollout(t, LongContextConfig(window_tokens=800)) for t in tasks], sam_engines())
    assert [t.outcome for t in wide] == [1.0] * 4 and [t.outcome for t in narrow] == [0.0] * 4
    assert all(not any(e.kind == "memory_tool" for e in t.events) for t in wide + narrow)  # no memory tool offered


# ------------------------------------------------------------------------------------------------ question answering
class DoorCodeReader:
    """A reasoner answering with the door code when its context shows it; with ``retrieve``, it first asks the
    retrieval tool for it."""

    name = "door-code-reader"

    def __init__(self, retrieve: bool) -> None:
        self.retrieve = retrieve

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        if self.retrieve and parse_sam_recalled(content_of(messages[-1])) is None:
            return render_tool_call("memory", {"intent": "door code"})
        seen = "\n".join(content_of(m) for m in messages[1:])
        return render_tool_call("answer", {"answer": "4172" if "4172" in seen else "?"})


ONE_TURN_PAGES = {"page_turns": 1, "live_capacity_turns": 4, "keep_recent_turns": 3, "top_k": 1}
QA_CASES = {
    name: QACase(
        memory=memory,
        script=DoorCodeReader(retrieve=name != "long_context"),
        task="open the door",
        turns=DOOR_CODE_TURNS,
        question="what is the door code?",
        answer="4172",
        roles=[],
        prompt_has=("the note says the door code is 4172", *(("pages: 2",) if name != "long_context" else ())),
    )
    for name, memory in {
        "long_context": {"name": "long_context"},  # the whole trajectory fits the default window
        "bm25": {"name": "bm25", **ONE_TURN_PAGES},  # turn 1 is page 2 (after the start notice and turn 0)
        "embedding": {"name": "embedding", "embedder": "hashing", **ONE_TURN_PAGES},
    }.items()
}


# ---------------------------------------------------------------------------------------------------- registry
def test_registry_builds_every_system_by_name() -> None:
    built = {name: build_memory({"name": name}, embedder=HashingEmbedder()) for name in memory_names(builtin_only=True)}
    expected = {
        "sam": SamMemory,
        "long_context": LongContextMemory,
        "bm25": BM25Memory,
        "embedding": EmbeddingMemory,
        "mage": MageMemory,
        "memma": MemMAMemory,
        "ama_agent": AMAMemory,
        "proactive": ProactiveMemory,
        "external": ExternalMemory,
    }
    assert {n: type(m) for n, m in built.items()} == expected
    assert built["sam"].reasoner_system == SAM_REASONER_SYSTEM
    cfg = parse_memory_config({"name": "sam", "page_turns": 1, "live_capacity_turns": 4, "keep_recent_turns": 3})
    assert isinstance(cfg, SamConfig) and cfg.page_turns == 1
    assert build_memory(cfg).config is cfg
    assert parse_memory_config({"name": "mage", "max_raw_turns": 3}).max_raw_turns == 3
    with pytest.raises(ValidationError, match="page_size"):
        parse_memory_config({"name": "sam", "page_size": 3})
    with pytest.raises(ComponentError, match=r"unknown memory system 'memgpt'; registered: ama_agent, .*sam"):
        parse_memory_config({"name": "memgpt"})


def test_every_registered_system_survives_deepcopy_in_a_rollout() -> None:
    task = SamTask({"horizon_steps": 12}, seed=0)
    for name in ("sam", "long_context", "bm25", "embedding"):
        config = {"name": name, **({"embedder": "hashing"} if name == "embedding" else {})}
        rollout = sam_rollout(task, config)
        twin = rollout.fork("r.1")
        assert run_rollouts([twin], sam_engines())[0].outcome == 1.0
        assert rollout.step == 0 and not rollout.done  # the original did not move


def test_repeated_retrievals_do_not_nest_pages_into_pages() -> None:
    """A retrieval result leaves the live context as a page that names its intent and pages, not their text: a
    reasoner that asks again and again (a TextWorld agent does) must not see the store grow with each answer."""
    from memrl.data.formats import ToolCall

    memory = BM25Memory(BM25Config(page_turns=1, live_capacity_turns=2, keep_recent_turns=1, top_k=3))
    memory.reset("find the key", {})
    memory.on_turn(Turn(step=0, action_text="", observation="the brass key is in the attic " * 20, role="user"))
    memory.on_turn(Turn(step=1, action_text="look", observation="a bare hall", role="tool"))
    sizes = []
    for step in range(2, 10):
        memory.on_tool_call(ToolCall(name="memory", arguments={"intent": "where is the brass key"}), step)
        result = memory.tool_result()
        assert result is not None and "attic" in result.content
        memory.on_turn(Turn(step=step, action_text='{"name": "memory"}', observation=result.content, role="user"))
        sizes.append(sum(len(p.text) for p in memory.pages))
    growth = [b - a for a, b in itertools.pairwise(sizes)]
    assert max(growth) < 200 and len(set(growth)) == 1  # each retrieval adds one short reference page
    assert all("the brass key is in the attic" not in p.text for p in memory.pages[1:])
