"""SAM in the agent loop: page cutting at the budget, cue/page bookkeeping, recall over several pages in order with the
running extraction, malformed memory outputs and tool calls, token accounting against the tokenizer, forking, the
oracle at small horizons, and the task/expert knobs SAM's quickstart needs."""

from __future__ import annotations

import copy
import itertools
import random
from pathlib import Path
from typing import Any

import pytest
from fakes import DOOR_CODE_TURNS, QACase, RecordingEngine

from memrl.data.envs.base import count_tokens
from memrl.data.experts.sam import SamOracle
from memrl.data.formats import (
    NOTHING_RELEVANT,
    ToolCall,
    parse_sam_memory_block,
    parse_sam_recall_failures,
    parse_sam_recall_prompt,
    parse_sam_recalled,
    parse_tool_calls,
    render_sam_consolidate_prompt,
    render_sam_recall_prompt,
    render_sam_recalled,
    render_tool_call,
)
from memrl.data.schemas import MemoryCall
from memrl.data.tasks.common import as_messages, content_of, role_of
from memrl.data.tasks.sam import SamReasoner, SamTask
from memrl.rollout.agents import sam_engines, sam_rollout
from memrl.rollout.engines.scripted import ScriptedEngine
from memrl.rollout.loop import EngineSet, run_rollouts
from memrl.rollout.memory.base import Turn
from memrl.rollout.memory.sam import MISSING_CUE, SamConfig, SamMemory, make_token_counter, parse_page_ids
from memrl.rollout.models import load_tokenizer

SMALL = {"page_tokens": 120, "live_capacity_tokens": 400, "keep_recent_tokens": 200}
ONE_TURN = {"page_turns": 1, "live_capacity_turns": 4, "keep_recent_turns": 3}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return load_tokenizer(tiny_model_dir)


def act(action: str) -> str:
    return render_tool_call("act", {"action": action})


def feed(memory: SamMemory, n: int) -> list[Turn]:
    """Reset and feed a start turn plus ``n`` act turns, as the loop does."""
    memory.reset("explore", {})
    turns = [Turn(step=0, action_text="", observation="you are in the hall.\nnext: open box 1", role="user")]
    for i in range(1, n + 1):
        turns.append(
            Turn(
                step=i,
                action_text=act(f"open box {i}"),
                observation=f"you open box {i}.\nthe red cup {i} is in box {i}\nnext: open box {i + 1}",
            )
        )
    for turn in turns:
        memory.on_turn(turn)
    return turns


def answer_all(memory: SamMemory, text: str = "cue") -> list[Any]:
    """Answer every pending memory request with ``text``; the requests, in order."""
    seen = []
    while (request := memory.next_memory_request()) is not None:
        seen.append(request)
        memory.on_memory_result(request, MemoryCall(call_id=f"c{len(seen)}", role=request.role, text=text))
    return seen


def live_tokens(memory: SamMemory) -> int:
    return sum(u.context_tokens for u in memory.live)


# ---------------------------------------------------------------------------------------------------- write path
def test_pages_are_cut_at_the_budget_from_whole_units_in_order() -> None:
    memory = SamMemory(SamConfig(page_tokens=60, live_capacity_tokens=1000, keep_recent_tokens=50))
    turns = feed(memory, 0)
    i = 0
    while not memory.pages:  # one large cut: everything but the recent tail becomes pages at once
        i += 1
        observation = f"you open box {i}.\nthe red cup {i} is in box {i}"
        turns.append(Turn(step=i, action_text=act(f"open box {i}"), observation=observation))
        memory.on_turn(turns[-1])
    pages = memory.pages
    assert len(pages) > 3 and live_tokens(memory) <= 50 and memory.live[-1].step == i
    steps = [s for p in pages for s in p.steps] + [u.step for u in memory.live]
    assert steps == list(range(i + 1))  # nothing lost, nothing reordered
    by_step = {t.step: t for t in turns}
    for page in pages:
        assert page.tokens == count_tokens(page.text) <= 60
        for step in page.steps:  # whole units: the action and the complete observation
            assert by_step[step].observation in page.text
            if step:
                assert f"t{step}> open box {step}\n" in page.text
    for page, following in itertools.pairwise(pages):  # every page but the last was full
        first = following.steps[0]
        nxt = count_tokens(f"t{first}> open box {first}\n{by_step[first].observation}")
        assert page.tokens + 1 + nxt > 60
    requests = answer_all(memory)
    assert [r.role for r in requests] == ["consolidate"] * len(pages)
    assert [r.metadata["page_id"] for r in requests] == [p.page_id for p in pages]
    assert requests[2].messages == as_messages(render_sam_consolidate_prompt(2, pages[2].text))


def test_live_context_stays_under_capacity_and_the_question_is_never_cut() -> None:
    cfg = SamConfig(**SMALL)
    memory = SamMemory(cfg)
    memory.reset("explore", {})
    for turn in [Turn(step=0, action_text="", observation="start", role="user")] + [
        Turn(
            step=i,
            action_text=act(f"open box {i}"),
            observation=f"you open box {i}.\nthe red cup {i} is in box {i}\nnext: open box {i + 1}",
        )
        for i in range(1, 31)
    ]:
        memory.on_turn(turn)
        assert live_tokens(memory) < cfg.live_capacity_tokens
    question = Turn(step=31, action_text=act("open box 31"), observation="you open box 31.\nquestion: where is x?")
    memory.on_turn(question)
    for k in range(32, 60):  # memory-tool turns after the question pile up but never push it out
        memory.on_turn(
            Turn(
                step=k,
                action_text=render_tool_call("memory", {"intent": "x", "page_ids": [0]}),
                observation=render_sam_recalled("x", [0], NOTHING_RELEVANT),
                role="user",
            )
        )
    assert memory.live[0].step <= 31 and any("question:" in u.observation for u in memory.live)
    assert all("question:" not in p.text for p in memory.pages)


def test_one_turn_pages() -> None:
    memory = SamMemory(SamConfig(**ONE_TURN))
    feed(memory, 12)
    assert [p.steps for p in memory.pages] == [[i] for i in range(10)]
    assert [u.step for u in memory.live] == [10, 11, 12]
    assert memory.pages[3].text == "t3> open box 3\nyou open box 3.\nthe red cup 3 is in box 3\nnext: open box 4"


def test_config_rejects_inconsistent_budgets() -> None:
    with pytest.raises(ValueError, match="keep_recent_tokens"):
        SamConfig(live_capacity_tokens=100, keep_recent_tokens=100)
    with pytest.raises(ValueError, match="keep_recent_turns"):
        SamConfig(live_capacity_turns=3, keep_recent_turns=3)
    with pytest.raises(ValueError, match="regular expression"):
        SamConfig(pin_pattern="(")
    with pytest.raises(ValueError, match="extra"):
        SamConfig(page_size=3)


def test_cues_are_one_line_and_capped() -> None:
    memory = SamMemory(SamConfig(max_cue_tokens=6, **ONE_TURN))
    feed(memory, 6)
    outputs = iter(["red cup 1,\n  blue box", "a b c d e f g h i j", "  fine cue <|im_end|> trailing junk"])
    while (request := memory.next_memory_request()) is not None:
        memory.on_memory_result(request, MemoryCall(call_id="c", role="consolidate", text=next(outputs, "x")))
    assert memory.cues[0] == "red cup 1, blue box"
    assert memory.cues[1] == "a b c d e f" and memory.stats["sam_cue_truncated"] == 1
    assert memory.cues[2] == "fine cue"
    block = memory.reasoner_messages("")[1].content
    assert parse_sam_memory_block(block) == ("explore", memory.cues)


# ---------------------------------------------------------------------------------------------------- read path
def test_recall_reads_the_selected_pages_in_order_carrying_the_extraction() -> None:
    memory = SamMemory(SamConfig(**ONE_TURN))
    feed(memory, 12)
    answer_all(memory)
    memory.on_tool_call(ToolCall("memory", {"intent": "where is the red cup 3", "page_ids": [5, "p2", 3, 5]}), 13)
    assert memory.tool_result() is None
    outputs = {2: "the red cup 2 is in box 2", 3: NOTHING_RELEVANT, 5: "the red cup 5 is in box 5\nbox 3 holds it"}
    read = []
    while (request := memory.next_memory_request()) is not None:
        intent, page_id, page_text, so_far = parse_sam_recall_prompt(request.messages)
        read.append((page_id, so_far))
        assert intent == "where is the red cup 3" and page_text == memory.pages[page_id].text
        assert request.role == "recall" and request.metadata["page_ids"] == [2, 3, 5]
        memory.on_memory_result(request, MemoryCall(call_id="c", role="recall", text=f"  {outputs[page_id]}\n"))
    # page order; the extraction carried to the next page; "nothing relevant" empties it
    assert read == [(2, ""), (3, "the red cup 2 is in box 2"), (5, "")]
    result = memory.tool_result()
    assert result is not None and result.error is None
    assert parse_sam_recalled(result.content) == ("where is the red cup 3", [2, 3, 5], outputs[5])
    assert memory.tool_result() is None  # taken once
    assert memory.stats["sam_recall_calls"] == 3


@pytest.mark.parametrize(
    ("arguments", "kind", "message"),
    [
        ({"page_ids": [1]}, "missing_intent", "memory needs an intent"),
        ({"intent": "  ", "page_ids": [1]}, "missing_intent", "memory needs an intent"),
        ({"intent": "x", "page_ids": "one, two"}, "bad_page_ids", "page_ids must be a list"),
        ({"intent": "x", "page_ids": [{"id": 1}]}, "bad_page_ids", "page_ids must be a list"),
        ({"intent": "x"}, "no_page_ids", "memory needs page_ids: up to 4 page numbers from the memory cues (p0-p9)"),
        ({"intent": "x", "page_ids": [3, 99, -1]}, "unknown_pages", "no page p99, p-1 in memory (pages are p0-p9)"),
        ({"intent": "x", "page_ids": [0, 1, 2, 3, 4]}, "too_many_pages", "at most 4 pages per memory call, got 5"),
    ],
)
def test_invalid_tool_calls_are_clear_tool_errors(arguments: dict, kind: str, message: str) -> None:
    memory = SamMemory(SamConfig(**ONE_TURN))
    feed(memory, 12)
    answer_all(memory)
    memory.on_tool_call(ToolCall("memory", arguments), 13)
    result = memory.tool_result()
    assert result is not None and result.error is not None and result.error.startswith(message)
    assert memory.next_memory_request() is None
    assert memory.stats[f"sam_error_{kind}"] == 1 and memory.stats["sam_tool_errors"] == 1


def test_a_tool_call_before_any_page_is_an_error() -> None:
    memory = SamMemory()
    feed(memory, 2)
    memory.on_tool_call(ToolCall("memory", {"intent": "x", "page_ids": [0]}), 3)
    assert memory.tool_result().error == "memory is empty: no pages have been written yet"


def test_parse_page_ids_is_lenient_but_never_guesses() -> None:
    assert parse_page_ids([3, "p1", "2", 3]) == [3, 1, 2]
    assert parse_page_ids("p4, 5") == [4, 5] and parse_page_ids(7) == [7] and parse_page_ids(None) == []
    assert parse_page_ids(["three"]) is None and parse_page_ids([True]) is None and parse_page_ids(1.5) is None


# malformed memory outputs: (text, finish reason, error kind counted, what the reasoner is told of the page)
MALFORMED = [
    ("", "stop", "empty", "empty output"),
    ("  \n <|endoftext|> the rest", "stop", "empty", "empty output"),
    ("?!... --", "stop", "no_text", "no letters or digits"),
    ('<tool_call>{"name": "memory", "arguments": {"intent": "x"', "stop", "tool_call", "a tool call, not memory text"),
    (
        "<tool_call><function=memory><parameter=intent>x</parameter>",
        "stop",
        "tool_call",
        "a tool call, not memory text",
    ),
    ("the red cup 3 is in bo", "length", "truncated", "output cut at max_tokens"),
]


@pytest.mark.parametrize(("text", "finish", "kind"), [case[:3] for case in MALFORMED])
def test_malformed_memory_outputs_are_recorded_counted_and_skipped(text: str, finish: str, kind: str) -> None:
    memory = SamMemory(SamConfig(**ONE_TURN))
    feed(memory, 8)
    request = memory.next_memory_request()
    bad = MemoryCall(call_id="c0", role="consolidate", text=text, finish_reason=finish)
    memory.on_memory_result(request, bad)
    assert bad.error and memory.cues[0] == MISSING_CUE
    assert memory.stats["sam_consolidate_errors"] == 1 and memory.stats[f"sam_error_{kind}"] == 1
    answer_all(memory)
    memory.on_tool_call(ToolCall("memory", {"intent": "where is the red cup 2", "page_ids": [1, 2]}), 9)
    first = memory.next_memory_request()
    garbage = MemoryCall(call_id="c1", role="recall", text=text, finish_reason=finish)
    memory.on_memory_result(first, garbage)
    second = memory.next_memory_request()
    assert parse_sam_recall_prompt(second.messages)[3] == ""  # the failed page added nothing
    memory.on_memory_result(second, MemoryCall(call_id="c2", role="recall", text=text, finish_reason=finish))
    result = memory.tool_result()
    assert garbage.error and result.error.startswith("the memory model gave no usable recall (page 1: ")
    assert memory.stats["sam_recall_errors"] == 2 and memory.stats["sam_error_recall_failed"] == 1


@pytest.mark.parametrize(("text", "finish", "brief"), [(text, finish, brief) for text, finish, _, brief in MALFORMED])
def test_a_recall_with_a_failed_page_returns_what_was_read_and_names_the_failure(
    text: str, finish: str, brief: str
) -> None:
    memory = SamMemory(SamConfig(**ONE_TURN))
    feed(memory, 12)
    answer_all(memory)
    intent = "where is the red cup 2"
    memory.on_tool_call(ToolCall("memory", {"intent": intent, "page_ids": [5, 3, 2]}), 13)
    good = {2: "the red cup 2 is in box 2", 5: "the red cup 2 is in box 2\nthe red cup 5 is in box 5"}
    calls = {}
    while (request := memory.next_memory_request()) is not None:
        page = request.metadata["page_id"]
        calls[page] = MemoryCall(
            call_id=f"c{page}",
            role="recall",
            text=good.get(page, text),
            finish_reason="stop" if page in good else finish,
        )
        memory.on_memory_result(request, calls[page])
    result = memory.tool_result()
    # the recovered extraction is returned, and the reasoner is told which page failed and why
    assert result is not None and result.error is None
    assert result.content == f"recalled for: {intent}\npages: 2,3,5\nfailed pages: p3 ({brief})\n{good[5]}"
    assert parse_sam_recalled(result.content) == (intent, [2, 3, 5], good[5])
    assert parse_sam_recall_failures(result.content) == [f"p3 ({brief})"]
    assert calls[3].error and calls[2].error is None and calls[5].error is None
    assert memory.stats["sam_partial_recalls"] == 1 and memory.stats["sam_recall_errors"] == 1
    assert "sam_tool_errors" not in memory.stats


def test_several_failed_pages_are_all_named_and_the_last_good_extraction_kept() -> None:
    memory = SamMemory(SamConfig(**ONE_TURN))
    feed(memory, 12)
    answer_all(memory)
    memory.on_tool_call(ToolCall("memory", {"intent": "where is the red cup 1", "page_ids": [1, 4, 6]}), 13)
    outputs = {1: ("the red cup 1 is in box 1", "stop"), 4: ("", "stop"), 6: ("the red", "length")}
    while (request := memory.next_memory_request()) is not None:
        text, finish = outputs[request.metadata["page_id"]]
        memory.on_memory_result(request, MemoryCall(call_id="c", role="recall", text=text, finish_reason=finish))
    result = memory.tool_result()
    assert result.error is None
    assert parse_sam_recall_failures(result.content) == ["p4 (empty output)", "p6 (output cut at max_tokens)"]
    assert parse_sam_recalled(result.content)[2] == "the red cup 1 is in box 1"
    # every recall succeeding leaves no note at all
    memory.on_tool_call(ToolCall("memory", {"intent": "where is the red cup 1", "page_ids": [1]}), 14)
    answer_all(memory, "the red cup 1 is in box 1")
    assert parse_sam_recall_failures(memory.tool_result().content) == []
    assert memory.stats["sam_partial_recalls"] == 1


def test_an_unexpected_result_is_an_orphan_not_a_crash() -> None:
    memory = SamMemory(SamConfig(**ONE_TURN))
    feed(memory, 3)
    stray = MemoryCall(call_id="x", role="recall", text="hello")
    memory.on_memory_result(answer_all(memory)[0], stray)
    assert memory.stats["sam_orphan_results"] == 1 and stray.error


# ---------------------------------------------------------------------------------------------------- in the loop
class RecallGarbage:
    """The oracle's cues, but garbage for every recall."""

    name = "recall-garbage"

    def __init__(self) -> None:
        self.oracle = SamOracle()
        self.outputs = ["", '<tool_call>{"name": "memory"', "%%%%", "   "]

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        if parse_sam_recall_prompt(messages) is None:
            return self.oracle.respond(messages, rng, metadata)
        return self.outputs[rng.randrange(len(self.outputs))]


class Mischief:
    """The scripted reasoner, but its first memory calls are the given (bad) replies."""

    name = "mischief"

    def __init__(self, bad: list[str]) -> None:
        self.inner, self.bad = SamReasoner(), bad

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        reply = self.inner.respond(messages, rng, metadata)
        if '"memory"' not in reply:
            return reply
        done = sum(role_of(m) == "assistant" and '"memory"' in content_of(m) for m in messages)
        return self.bad[done] if done < len(self.bad) else reply


def test_oracle_run_keeps_cues_pages_and_calls_in_step() -> None:
    task = SamTask({"horizon_steps": 40, "n_evidence": 2}, seed=3)
    rollout = sam_rollout(task, SamConfig(**SMALL), seed=0)
    (trace,) = run_rollouts([rollout], sam_engines())
    memory = rollout.memory
    assert isinstance(memory, SamMemory) and trace.outcome == 1.0 and trace.memory_system == "sam"
    consolidate = [c for c in trace.memory_calls if c.role == "consolidate"]
    assert len(consolidate) == len(memory.pages) == len(memory.cues) == memory.stats["sam_pages"] > 3
    for call, page in zip(consolidate, memory.pages, strict=True):
        assert call.metadata["page_id"] == page.page_id and call.metadata["gold_entities"] == task.gold_entities
        assert call.messages == as_messages(render_sam_consolidate_prompt(page.page_id, page.text))
        assert memory.cues[page.page_id] == call.text
    tool_events = [e for e in trace.events if e.kind == "memory_tool"]
    assert len(tool_events) == 2  # two hops: which key opens the container, then where that key is
    calls = {c.call_id: c for c in trace.memory_calls}
    for event in tool_events:
        (request,) = parse_tool_calls(event.reply).calls
        reads = [calls[i] for i in event.memory_call_ids]
        assert [c.metadata["page_id"] for c in reads] == sorted(request.arguments["page_ids"])
        assert all(c.role == "recall" and c.metadata["intent"] == request.arguments["intent"] for c in reads)
        assert parse_sam_recalled(event.observation)[2] == reads[-1].text
    assert trace.answer == task.answer
    assert set(trace.stats) >= {"sam_pages", "sam_consolidate_calls", "sam_recalls", "sam_recall_calls"}


def test_garbage_recalls_never_crash_the_loop() -> None:
    task = SamTask({"horizon_steps": 30}, seed=1)
    engines = EngineSet(reasoner=sam_engines().reasoner, memory=ScriptedEngine(RecallGarbage()))
    (trace,) = run_rollouts([sam_rollout(task, SamConfig(**SMALL))], engines)
    recalls = [c for c in trace.memory_calls if c.role == "recall"]
    assert recalls and all(c.error for c in recalls)
    assert trace.stats["sam_recall_errors"] == len(recalls) == trace.stats["sam_recall_calls"]
    failed = [e for e in trace.events if e.kind == "memory_tool"]
    assert failed and all(e.observation.startswith("error: the memory model gave no usable recall") for e in failed)
    assert trace.stats["memory_tool_errors"] == len(failed) and trace.answer == "unknown"


class FirstPageFails:
    """The oracle, except that the first page of every multi-page recall comes back empty."""

    name = "first-page-fails"

    def __init__(self) -> None:
        self.oracle = SamOracle()

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        if (
            parse_sam_recall_prompt(messages) is not None
            and metadata["read_index"] == 0
            and len(metadata["page_ids"]) > 1
        ):
            return ""
        return self.oracle.respond(messages, rng, metadata)


def test_in_the_loop_the_reasoner_sees_which_pages_of_a_recall_failed() -> None:
    tasks = [SamTask({"horizon_steps": 40, "n_evidence": 2}, seed=s) for s in range(4)]
    reasoner = RecordingEngine(SamReasoner())
    engines = EngineSet(reasoner=reasoner, memory=ScriptedEngine(FirstPageFails()))
    traces = run_rollouts([sam_rollout(t, SamConfig(**SMALL)) for t in tasks], engines)
    partial = 0
    for trace in traces:
        calls = {c.call_id: c for c in trace.memory_calls}
        for event in (e for e in trace.events if e.kind == "memory_tool"):
            reads = [calls[i] for i in event.memory_call_ids]
            failed = [f"p{c.metadata['page_id']} (empty output)" for c in reads if c.error]
            if not failed or len(failed) == len(reads):
                continue
            partial += 1
            assert event.error is None and parse_sam_recall_failures(event.observation) == failed
            assert parse_sam_recalled(event.observation)[2] == reads[-1].text
            # the note reaches the reasoner's next call, as part of the recalled message
            assert any(m.content == event.observation for r in reasoner.requests for m in r.messages)
        assert trace.stats.get("sam_partial_recalls", 0) == sum(
            1 for e in trace.events if e.kind == "memory_tool" and parse_sam_recall_failures(e.observation)
        )
    assert partial > 0


def test_bad_reasoner_tool_calls_are_tool_errors_and_the_run_goes_on() -> None:
    task = SamTask({"horizon_steps": 40}, seed=2)
    bad = [
        render_tool_call("memory", {"page_ids": [0]}),
        render_tool_call("memory", {"intent": "x", "page_ids": "abc"}),
        render_tool_call("memory", {"intent": "x", "page_ids": [999]}),
        render_tool_call("memory", {"intent": "x", "page_ids": [0, 1, 2, 3, 4]}),
        '<tool_call>{"name": "memory", "arguments": {"intent": "x", "page_ids": [1',
    ]
    task.max_steps += len(bad)
    engines = EngineSet(reasoner=ScriptedEngine(Mischief(bad)), memory=ScriptedEngine(SamOracle()))
    (trace,) = run_rollouts([sam_rollout(task, SamConfig(**SMALL))], engines)
    assert trace.outcome == 1.0  # the real recall after the bad ones still works
    errors = [e.observation for e in trace.events if e.error]
    assert errors[:4] == [
        "error: memory needs an intent: say what to recall",
        "error: page_ids must be a list of page numbers such as [0, 3]",
        f"error: no page p999 in memory (pages are p0-p{trace.stats['sam_pages'] - 1})",
        "error: at most 4 pages per memory call, got 5",
    ]
    assert errors[4].startswith("error: truncated tool call")
    for kind in ("missing_intent", "bad_page_ids", "unknown_pages", "too_many_pages"):
        assert trace.stats[f"sam_error_{kind}"] == 1
    assert trace.stats["sam_tool_errors"] == trace.stats["memory_tool_errors"] == 4
    assert trace.stats["reasoner_malformed"] == 1


def test_reasoner_prompt_tokens_equal_the_tokenizer_count_of_the_rendered_chat(tokenizer: Any) -> None:
    reasoner = RecordingEngine(SamReasoner(), tokenizer=tokenizer)
    memory_engine = ScriptedEngine(SamOracle(), tokenizer=tokenizer)
    counter = make_token_counter(tokenizer)
    rollout = sam_rollout(SamTask({"horizon_steps": 30}, seed=5), SamConfig(**SMALL), count_tokens=counter)
    (trace,) = run_rollouts([rollout], EngineSet(reasoner=reasoner, memory=memory_engine))

    def rendered(messages: list[Any]) -> int:
        chat = [m.model_dump() for m in messages]
        return len(tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False))

    expected = [rendered(r.messages) for r in reasoner.requests]
    assert trace.outcome == 1.0 and trace.reasoner_usage.calls == len(expected)
    assert trace.reasoner_usage.prompt_tokens == sum(expected) and trace.peak_context_tokens == max(expected)
    assert [e.reasoner_prompt_tokens for e in trace.events if e.kind != "limit"] == expected
    for call in trace.memory_calls:
        assert call.prompt_tokens == len(call.prompt_ids) == rendered(call.messages)
    assert trace.memory_usage.prompt_tokens == sum(c.prompt_tokens for c in trace.memory_calls)
    # the memory system counts with the same tokenizer: its paging decisions are in real tokens
    memory = rollout.memory
    for unit in memory.live:
        encoded = len(tokenizer.encode(unit.action_text, add_special_tokens=False))
        assert unit.context_tokens == encoded + len(tokenizer.encode(unit.observation, add_special_tokens=False))
    assert all(p.tokens == len(tokenizer.encode(p.text, add_special_tokens=False)) for p in memory.pages)
    assert copy.deepcopy(memory).count_tokens is memory.count_tokens  # the tokenizer is shared, not copied


class Wordy:
    """A memory policy whose answers vary in length with the sample's rng (samples of one request differ)."""

    name = "wordy"

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        return " ".join(f"the red cup {rng.randint(1, 999)} is in box {i}" for i in range(rng.randint(1, 4)))


def test_generated_tokens_equal_the_tokenizer_count_of_what_was_generated(tokenizer: Any) -> None:
    eos = tokenizer.eos_token_id

    def generated(text: str) -> int:  # the engine's reply ends with end-of-sequence
        return len(tokenizer.encode(text, add_special_tokens=False)) + 1

    sampling = {"consolidate": {"temperature": 1.0, "max_tokens": 64}, "recall": {"temperature": 1.0, "max_tokens": 9}}
    config = SamConfig(**SMALL, sampling=sampling)
    reasoner = RecordingEngine(SamReasoner(), tokenizer=tokenizer)
    memory_engine = ScriptedEngine(SamOracle(), tokenizer=tokenizer)
    rollouts = [
        sam_rollout(
            SamTask({"horizon_steps": 30, "n_evidence": 2}, seed=s), config, count_tokens=make_token_counter(tokenizer)
        )
        for s in range(3)
    ]
    traces = run_rollouts(rollouts, EngineSet(reasoner=reasoner, memory=memory_engine))

    # reasoner: one event per call, its completion tokens are the tokenised reply plus end-of-sequence
    replies = [r.completions[0] for r in reasoner.results]
    assert all(c.finish_reason == "stop" and c.response_ids[-1] == eos for c in replies)
    assert all(tokenizer.decode(c.response_ids, skip_special_tokens=True) == c.text for c in replies)
    events = [e for t in traces for e in t.events if e.kind != "limit"]
    assert sorted(e.reply for e in events) == sorted(c.text for c in replies)
    for event in events:
        assert event.reasoner_completion_tokens == generated(event.reply)
    for trace in traces:
        steps = [e for e in trace.events if e.kind != "limit"]
        assert trace.reasoner_usage.completion_tokens == sum(generated(e.reply) for e in steps)

    # memory calls: a finished output counts its tokens plus end-of-sequence, a cut one exactly max_tokens
    calls = [c for t in traces for c in t.memory_calls]
    finishes = {(c.role, c.finish_reason) for c in calls}
    assert {("consolidate", "stop"), ("recall", "stop"), ("recall", "length")} <= finishes
    for call in calls:
        assert call.completion_tokens == len(call.response_ids)
        assert tokenizer.decode(call.response_ids, skip_special_tokens=True) == call.text
        if call.finish_reason == "stop":
            assert call.completion_tokens == generated(call.text)
        else:
            assert call.completion_tokens == sampling[call.role]["max_tokens"] and call.response_ids[-1] != eos
    for trace in traces:
        assert trace.memory_usage.completion_tokens == sum(c.completion_tokens for c in trace.memory_calls)
        assert trace.memory_usage.calls == len(trace.memory_calls)

    # a branch that takes sample k of an n-sample call counts sample k's tokens, not the whole result's
    rollout = sam_rollout(
        SamTask({"horizon_steps": 30}, seed=7), SamConfig(**SMALL), count_tokens=make_token_counter(tokenizer)
    )
    engines = EngineSet(
        reasoner=ScriptedEngine(SamReasoner(), tokenizer=tokenizer), memory=ScriptedEngine(Wordy(), tokenizer=tokenizer)
    )
    while (call := rollout.pending()).kind != "memory":
        rollout.advance(engines.reasoner.generate([call.request])[0])
    call.request.sampling.n = 4
    result = engines.memory.generate([call.request])[0]
    texts = [c.text for c in result.completions]
    assert len({generated(t) for t in texts}) > 1  # the samples differ in length
    before = rollout.memory_usage.completion_tokens
    for k, text in enumerate(texts):
        branch = rollout.fork(f"r.{k}")
        record = branch.advance(result, sample=k)
        assert record.completion_tokens == generated(text)
        assert branch.memory_usage.completion_tokens - before == generated(text)


def test_fork_at_a_pending_recall_gives_independent_branches() -> None:
    task = SamTask({"horizon_steps": 30}, seed=4)
    engines = sam_engines(max_pages=1)
    rollout = sam_rollout(task, SamConfig(**SMALL), seed=1)
    while (call := rollout.pending()).role != "recall":
        rollout.advance(engines.for_call(call).generate([call.request])[0])
    result = engines.memory.generate([call.request])[0]
    good, bad = rollout.fork("r.0"), rollout.fork("r.1")
    good.advance(result)
    result.completions[0].text = NOTHING_RELEVANT
    bad.advance(result)
    assert rollout.memory._recall.index == 0  # the parent is untouched and could be advanced again
    traces = run_rollouts([good, bad], engines)
    recalled = [next(e for e in t.events if e.kind == "memory_tool").observation for t in traces]
    assert task.answer in recalled[0] and parse_sam_recalled(recalled[1])[2] == NOTHING_RELEVANT
    assert traces[0].outcome == 1.0


@pytest.mark.parametrize("hops", [1, 2])
def test_oracle_solves_tasks_across_horizons(hops: int) -> None:
    tasks = [SamTask({"horizon_steps": steps, "n_evidence": hops}, seed=s) for s in range(3) for steps in (30, 90)]
    traces = run_rollouts([sam_rollout(t, SamConfig(**SMALL), seed=i) for i, t in enumerate(tasks)], sam_engines())
    assert [t.outcome for t in traces] == [1.0] * len(tasks)
    assert max(t.peak_context_tokens for t in traces) == 0  # no tokenizer: no token accounting, text only


def test_one_turn_pages_quickstart_shape_with_repeated_evidence() -> None:
    params = {"horizon_steps": 16, "facts_per_obs": 1, "repeat_evidence_frac": 1.0}
    tasks = [SamTask(params, seed=s) for s in range(8)]
    rollouts = [sam_rollout(t, SamConfig(**ONE_TURN), seed=i) for i, t in enumerate(tasks)]
    traces = run_rollouts(rollouts, sam_engines(max_pages=1))
    assert [t.outcome for t in traces] == [1.0] * len(tasks)
    for rollout in rollouts:
        assert all(len(p.steps) == 1 for p in rollout.memory.pages)


class DoorCodeRecall:
    """The question-answering case's script. Memory model: a page's cue says whether it holds the door code; a recall
    extracts it. Reasoner: recall the pages whose cue names the code, then answer with what came back."""

    name = "door-code-recall"

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        last = content_of(messages[-1])
        if metadata.get("role") == "consolidate":
            return "the door code" if "4172" in last else "a corridor walk"
        if metadata.get("role") == "recall":
            return "the door code is 4172" if "4172" in last else NOTHING_RELEVANT
        if (recalled := parse_sam_recalled(last)) is not None:
            return render_tool_call("answer", {"answer": "4172" if "4172" in recalled[2] else "?"})
        cues = parse_sam_memory_block(content_of(messages[1]))[1]
        return render_tool_call(
            "memory", {"intent": "the door code", "page_ids": [p for p, c in cues.items() if "code" in c]}
        )


QA_CASE = QACase(
    memory={"name": "sam", "page_turns": 1, "live_capacity_turns": 4, "keep_recent_turns": 3},
    script=DoorCodeRecall(),
    task="open the door",
    turns=DOOR_CODE_TURNS,
    question="what is the door code?",
    answer="4172",
    # one cue per page cut from the live context (the start notice and turns 0-5), the recall of page 2 (turn 1),
    # then the cue of the page the recall pushed out
    roles=["consolidate"] * 7 + ["recall", "consolidate"],
    prompt_has=("p2: the door code", "pages: 2"),
)


# ---------------------------------------------------------------------------------------------------- task knobs
def test_repeated_evidence_states_the_fact_twice_and_keeps_the_question() -> None:
    for hops in (1, 2):
        for seed in range(6):
            base = SamTask({"horizon_steps": 40, "n_evidence": hops}, seed=seed)
            twice = SamTask({"horizon_steps": 40, "n_evidence": hops, "repeat_evidence_frac": 1.0}, seed=seed)
            assert (twice.question, twice.answer) == (base.question, base.answer)
            assert len(twice.tour) == len(base.tour) and len(twice.evidence_turns) == 2 * hops
            ep = twice.episode()
            assert ep.metadata["repeated_evidence"] and ep.qa_pairs[0].needle_turns == twice.evidence_turns
            if hops == 1:
                fact = f"the {twice.gold_entities[0]} is in {twice.answer}"
                assert [t.turn_idx for t in ep.trajectory if fact in t.observation] == twice.evidence_turns
    share = sum(
        SamTask({"horizon_steps": 20, "repeat_evidence_frac": 0.5}, seed=s).repeated_evidence for s in range(40)
    )
    assert 10 < share < 30


class FirstRecallEmpty:
    """The oracle, except that each task's first recall call answers 'nothing relevant'."""

    name = "first-empty"

    def __init__(self) -> None:
        self.oracle, self.seen = SamOracle(), set()

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        if parse_sam_recall_prompt(messages) is not None and metadata["task_id"] not in self.seen:
            self.seen.add(metadata["task_id"])
            return NOTHING_RELEVANT
        return self.oracle.respond(messages, rng, metadata)


def test_the_reasoner_tries_the_next_best_page_after_an_empty_recall() -> None:
    params = {"horizon_steps": 16, "facts_per_obs": 1, "repeat_evidence_frac": 1.0}
    tasks = [SamTask(params, seed=s, task_id=f"t{s}") for s in range(6)]
    engines = EngineSet(reasoner=sam_engines(max_pages=1).reasoner, memory=ScriptedEngine(FirstRecallEmpty()))
    traces = run_rollouts([sam_rollout(t, SamConfig(**ONE_TURN)) for t in tasks], engines)
    assert [t.outcome for t in traces] == [1.0] * len(tasks)
    for trace in traces:
        tried = [
            parse_tool_calls(e.reply).calls[0].arguments["page_ids"] for e in trace.events if e.kind == "memory_tool"
        ]
        assert len(tried) == 2 and tried[0] != tried[1]


def test_oracle_omission_is_drawn_once_per_call() -> None:
    page = "> open drawer 2\nthe brass key is in drawer 2\n> open chest 7\nthe brass key opens chest 7"
    oracle = SamOracle({"verbatim": 1, "omission": 1})
    outputs = {oracle.recall("where is the brass key", page, "", random.Random(s)) for s in range(60)}
    assert outputs == {NOTHING_RELEVANT, "the brass key is in drawer 2\nthe brass key opens chest 7"}


def test_oracle_cue_budget_keeps_the_relevant_entities() -> None:
    page = "\n".join(f"the {c} cup is in box {i}" for i, c in enumerate(["red", "blue", "green", "black", "white"]))
    oracle = SamOracle({"cue_max_entities": 2})
    rng = random.Random(0)
    assert oracle.cue(page, rng, ["white cup"]) == "red cup, white cup"
    assert oracle.cue(page, rng) == "red cup, blue cup"
    assert SamOracle().cue(page, rng).count(",") == 4


def test_recall_prompt_round_trip_for_the_memory_model() -> None:
    messages = as_messages(render_sam_recall_prompt("where is x", 3, "page text", "so far"))
    assert parse_sam_recall_prompt(messages) == ("where is x", 3, "page text", "so far")


# ---------------------------------------------------------------------------------------------------- model engines
def _run_with_model_memory(engine: Any, tokenizer: Any) -> Any:
    sampling = {"consolidate": {"temperature": 1.0, "max_tokens": 12}, "recall": {"temperature": 1.0, "max_tokens": 12}}
    config = SamConfig(**SMALL, sampling=sampling)
    rollout = sam_rollout(SamTask({"horizon_steps": 24}, seed=0), config, count_tokens=make_token_counter(tokenizer))
    engines = EngineSet(reasoner=sam_engines(tokenizer=tokenizer).reasoner, memory=engine)
    (trace,) = run_rollouts([rollout], engines)
    assert trace.outcome is not None and trace.stats["sam_consolidate_calls"] == len(rollout.memory.pages) > 0
    for call in trace.memory_calls:  # token-in/token-out records of a real model
        assert call.prompt_ids and call.response_ids and len(call.logprobs) == len(call.response_ids)
        assert call.finish_reason in ("stop", "length") and (call.finish_reason == "stop" or call.error)
    return trace


def test_a_transformers_memory_model_runs_in_the_loop(tiny_model_dir: Path, tokenizer: Any) -> None:
    from memrl.rollout.engines import EngineConfig, build_engine

    engine = build_engine(EngineConfig(backend="hf", model=str(tiny_model_dir), dtype="float32", max_model_len=1024))
    _run_with_model_memory(engine, tokenizer)


def test_the_tree_builder_branches_sam_recalls_built_by_sam_rollout() -> None:
    from memrl.rollout.tree import TreeConfig, build_trees

    tasks = [SamTask({"horizon_steps": 30, "n_evidence": 2}, seed=s) for s in range(2)]
    config = SamConfig(**SMALL)
    engines = sam_engines(oracle={"verbatim": 1, "omission": 1})  # every read omits with prob. 1/2
    trees, _ = build_trees(
        tasks,
        lambda task, rid: sam_rollout(task, config, rollout_id=rid),
        engines,
        TreeConfig(branch_factor=2, max_branch_depth=2, max_leaves=8),
    )
    for tree in trees:
        recalls = [n for n in tree.nodes if n.kind == "memory"]
        leaves = [n for n in tree.nodes if n.kind == "leaf"]
        assert recalls and all(n.call.role == "recall" for n in recalls) and len(leaves) > 1
        assert {n.call.metadata["page_id"] for n in recalls} <= set(range(40))
    assert sam_rollout(tasks[0].episode(), config).env.question == tasks[0].question  # episodes work too
