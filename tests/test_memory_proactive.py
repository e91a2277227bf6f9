"""The proactive memory agent: bank edits in order, error tolerance, transient reminders, status privacy, triggers,
ablation variants, forking at a pending Phase 2 call, parity with the reference driver, and parser properties."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
from fakes import DOOR_CODE_TURNS, QACase, RecordingEngine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memrl.data.experts import ProactiveOracle
from memrl.data.formats import (
    MEMORY_CONTEXT_PREFIX,
    parse_intervention,
    parse_phase_prompt,
    parse_tool_calls,
    render_intervention,
    render_tool_call,
)
from memrl.data.schemas import Message
from memrl.data.tasks import ActionAgent, ProactiveTask, SamTask, simulate_proactive
from memrl.rollout.agents import build_proactive_rollout
from memrl.rollout.loop import EngineSet, Rollout, run_rollouts
from memrl.rollout.memory.base import MemoryRequest, Turn
from memrl.rollout.memory.proactive import ProactiveConfig, ProactiveMemory, render_exposed_bank


class Script:
    """A memory policy answering Phase 1 / Phase 2 by step: ``phase1[t]`` / ``phase2[t]`` (default: nothing)."""

    name = "script"

    def __init__(
        self, phase1: dict[int, str] | None = None, phase2: dict[int, str] | None = None, default2: str = ""
    ) -> None:
        self.phase1, self.phase2, self.default2 = phase1 or {}, phase2 or {}, default2

    def respond(self, messages: list[Message], rng: random.Random, metadata: dict[str, Any]) -> str:
        t = metadata["memory_step"]
        if metadata["role"] == "bank_edit":
            return self.phase1.get(t, "")
        return self.phase2.get(t, self.default2)


class DoorCodeReminder:
    """The question-answering case's script. Phase 1 banks the door code when its window shows it; Phase 2 reminds of
    the banked code when the question has come; the reasoner answers from its context (window and reminder)."""

    name = "door-code-reminder"

    def respond(self, messages: list[Message], rng: random.Random, metadata: dict[str, Any]) -> str:
        last = messages[-1].content
        if metadata.get("role") == "bank_edit":
            window, bank = last.split("bank:")
            saved = "4172" in window and "4172" not in bank
            return render_tool_call("memory_save_knowledge", {"content": "the door code is 4172"}) if saved else ""
        if metadata.get("role") == "intervene":
            banked = "4172" in last.split("bank:")[1]
            return render_intervention("the door code is 4172" if "question:" in last and banked else None)
        seen = "\n".join(m.content for m in messages[1:])
        return render_tool_call("answer", {"answer": "4172" if "4172" in seen else "?"})


QA_CASE = QACase(
    # the memory model sees 8 steps, the reasoner 3: turn 1 reaches the reasoner only as a reminder
    memory={"name": "proactive", "action_window": 3},
    script=DoorCodeReminder(),
    task="open the door",
    turns=DOOR_CODE_TURNS,
    question="what is the door code?",
    answer="4172",
    roles=["bank_edit", "intervene"] * 2,  # after ingestion (banks the code, silent) and at the question (reminds)
    prompt_has=("memory context: the door code is 4172",),
)


def task(seed: int = 1, **params: Any) -> ProactiveTask:
    return ProactiveTask({"n_subtasks": 16, **params}, seed=seed)


def oracle_engines(*tasks: ProactiveTask) -> EngineSet:
    truths = {t.task_id: t.truth() for t in tasks}
    return EngineSet(reasoner=RecordingEngine(ActionAgent()), memory=RecordingEngine(ProactiveOracle(truths=truths)))


def save(kind: str, content: str, **extra: Any) -> str:
    return render_tool_call(f"memory_save_{kind}", {"content": content, **extra})


def run_memory(memory: ProactiveMemory, request: MemoryRequest, text: str):
    from memrl.data.schemas import MemoryCall

    call = MemoryCall(call_id="c", role=request.role, text=text)
    memory.on_memory_result(request, call)
    return call


def fresh(**config: Any) -> ProactiveMemory:
    memory = ProactiveMemory(ProactiveConfig(**config))
    memory.reset("task: t", {"task_id": "x"})
    memory.on_turn(Turn(step=0, action_text="", observation="task: t\nnext: ls (subtask 1 of 3)", role="user"))
    return memory


# ---------------------------------------------------------------------------------------------------- Phase 1
def test_tool_calls_apply_in_order_and_errors_are_recorded_not_fatal() -> None:
    memory = fresh()
    request = memory.next_memory_request()
    assert request is not None and request.role == "bank_edit"
    reply = "\n".join(
        [
            save("knowledge", "requirement: use python3.11"),  # k1
            render_tool_call("memory_delete", {"id": "k9"}),  # unknown id: skipped
            save("procedural", "pip install fails without --user", style="ignored"),  # p2
            "<tool_call>{not json</tool_call>",  # malformed: skipped
            render_tool_call("memory_delete", {"id": "k1"}),  # deletes the entry saved above
            render_tool_call("memory_launch_rockets", {}),  # unknown tool: skipped
            render_tool_call("memory_update_status", {"content": "first"}, style="xml"),
            render_tool_call("memory_update_status", {"content": "second"}),  # the later status wins
            save("knowledge", "environment: db_port: 5444"),  # k3
            save("procedural", "pip install needs --user", id="p2"),  # rewrites p2
            save("knowledge", "x", id="p2"),  # wrong type for the id: skipped
            save("knowledge", ""),  # empty content: skipped
        ]
    )
    call = run_memory(memory, request, reply)
    bank = memory.bank
    assert bank.status == "second"
    assert [(e.entry_id, e.kind, e.content) for e in bank.entries] == [
        ("p2", "procedural", "pip install needs --user"),
        ("k3", "knowledge", "environment: db_port: 5444"),
    ]
    assert call.metadata["applied"] == [
        "memory_save_knowledge",
        "memory_save_procedural",
        "memory_delete",
        "memory_update_status",
        "memory_update_status",
        "memory_save_knowledge",
        "memory_save_procedural",
    ]
    assert call.error is not None
    for fragment in (
        "unknown id 'k9'",
        "not valid JSON",
        "unknown tool 'memory_launch_rockets'",
        "is a procedural",
        "empty content",
    ):
        assert fragment in call.error
    assert memory.stats["bank_edit_errors"] == 5
    assert memory.stats["bank_edit_unknown_id"] == 1 and memory.stats["bank_edit_unknown_tool"] == 1
    assert memory.stats["bank_edit_malformed"] == 1 and memory.stats["bank_edit_bad_args"] == 2
    nxt = memory.next_memory_request()
    assert nxt is not None and nxt.role == "intervene"
    phase, _, _, view = parse_phase_prompt(nxt.messages)
    assert phase == 2 and view.status == "second" and view.knowledge == {"k3": "environment: db_port: 5444"}


def test_xml_form_and_scalar_arguments() -> None:
    memory = fresh()
    request = memory.next_memory_request()
    reply = (
        "thinking...<tool_call><function=memory_save_knowledge><parameter=content>5444</parameter></function>"
        "</tool_call> and <tool_call><function=memory_delete><parameter=id> K1 </parameter></function></tool_call>"
        "<tool_call><function=memory_save_procedural><parameter=content>retry with --user"
    )
    call = run_memory(memory, request, reply)
    assert memory.bank.entries == []  # k1 was saved ("5444" read as a number) and deleted again
    assert call.metadata["applied"] == ["memory_save_knowledge", "memory_delete"]
    assert "truncated" in (call.error or "")


def test_bm25_prefilter_keeps_the_relevant_entries_per_type() -> None:
    memory = fresh(max_entries_per_type=2)
    request = memory.next_memory_request()
    things = ["weather", "printer", "coffee", "garden", "kettle", "piano", "window", "camera", "bridge", "tunnel"]
    facts = [f"note: the {w} was checked" for w in things] + ["environment: db_port: 5444"]
    run_memory(memory, request, "\n".join(save("knowledge", f) for f in facts))
    _, _, _, view = parse_phase_prompt(memory.next_memory_request().messages)
    assert list(view.knowledge) == ["k10", "k11"]  # nothing in the window is relevant: the newest entries
    run_memory(memory, memory.next_memory_request(), "")
    memory.after_reasoner_call()
    memory.on_turn(
        Turn(
            step=1,
            action_text=render_tool_call("act", {"action": "ls"}),
            observation="printer jammed; which db_port?\nnext: load (subtask 2 of 3)",
        )
    )
    _, _, _, view = parse_phase_prompt(memory.next_memory_request().messages)
    assert view.knowledge == {"k2": "note: the printer was checked", "k11": "environment: db_port: 5444"}
    assert memory.stats["prefilter_dropped"] == 18
    shown = {e.content: e.shown for e in memory.bank.entries}
    assert shown["environment: db_port: 5444"] == 2 and shown["note: the printer was checked"] == 1
    assert shown["note: the weather was checked"] == 0


# ---------------------------------------------------------------------------------------------------- Phase 2
def reasoner_texts(engines: EngineSet) -> list[str]:
    return ["\n".join(m.content for m in r.messages) for r in engines.reasoner.requests]


def test_reminder_reaches_exactly_one_action_call_and_status_never_does() -> None:
    t = task(seed=2)
    status = render_tool_call("memory_update_status", {"content": "PRIVATE-STATUS"})
    script = Script(
        phase1={s: status + save("knowledge", f"KNOW-{s}") for s in range(0, 40, 3)},
        phase2={
            0: render_intervention("REMIND-0"),
            3: render_intervention("REMIND-3"),
            6: "<context_for_action>REMIND-6",
            9: "<no_intervention/>",
        },
    )
    engines = EngineSet(reasoner=RecordingEngine(ActionAgent()), memory=RecordingEngine(script))
    rollout = build_proactive_rollout(t, ProactiveConfig(trigger_every=3))
    (trace,) = run_rollouts([rollout], engines)
    texts = reasoner_texts(engines)
    assert not any("PRIVATE-STATUS" in x for x in texts)
    assert not any("KNOW-" in x for x in texts)
    assert [i for i, x in enumerate(texts) if "REMIND-0" in x] == [0]
    assert [i for i, x in enumerate(texts) if "REMIND-3" in x] == [3]
    assert not any("REMIND-6" in x for x in texts)  # an unclosed tag is silence, and an error
    last = engines.reasoner.requests[3].messages[-1]
    assert last.role == "user" and last.content == MEMORY_CONTEXT_PREFIX + "REMIND-3"
    intervene = [c for c in trace.memory_calls if c.role == "intervene"]
    assert [c.step for c in intervene][:4] == [0, 3, 6, 9]
    assert intervene[2].error == "unclosed <context_for_action>" and intervene[2].metadata["reminder"] is None
    assert trace.stats["reminders_injected"] == 2 and trace.stats["intervene_errors"] == 1
    assert all("PRIVATE-STATUS" in c.messages[-1].content for c in trace.memory_calls[1:])  # the memory model sees it


def test_full_bank_exposes_entries_but_never_status() -> None:
    t = task(seed=3)
    engines = oracle_engines(t)
    (trace,) = run_rollouts([build_proactive_rollout(t, ProactiveConfig(variant="full_bank"))], engines)
    assert {c.role for c in trace.memory_calls} == {"bank_edit"}
    texts = reasoner_texts(engines)
    assert MEMORY_CONTEXT_PREFIX in texts[0] and "requirement:" in texts[0]
    assert not any("at subtask" in x for x in texts)  # the oracle's status line
    assert trace.stats["bank_exposures"] == sum(MEMORY_CONTEXT_PREFIX in x for x in texts) > len(texts) // 2
    memory = ProactiveMemory()
    memory.bank.status = "secret"
    assert "secret" not in render_exposed_bank(memory.bank) and "status" not in render_exposed_bank(memory.bank)


def test_always_inject_replaces_silence_with_the_most_relevant_entry() -> None:
    memory = ProactiveMemory(ProactiveConfig(variant="always_inject"))
    memory.reset("task: t", {})
    memory.on_turn(Turn(step=0, action_text="", observation="error: pip install failed\nnext: install numpy"))
    run_memory(
        memory,
        memory.next_memory_request(),
        save("procedural", "pip install needs --user") + save("knowledge", "requirement: use python3.11"),
    )
    call = run_memory(memory, memory.next_memory_request(), "<no_intervention/>")
    assert call.metadata == {"reminder": "pip install needs --user", "forced": True}
    assert memory.reasoner_messages("s")[-1].content == MEMORY_CONTEXT_PREFIX + "pip install needs --user"
    assert memory.stats["forced_injections"] == 1
    empty = fresh(variant="always_inject")
    run_memory(empty, empty.next_memory_request(), "")
    run_memory(empty, empty.next_memory_request(), "")
    assert MEMORY_CONTEXT_PREFIX not in empty.reasoner_messages("s")[-1].content and empty.stats["silences"] == 1


def test_injection_only_and_no_memory() -> None:
    t = task(seed=4)
    engines = oracle_engines(t)
    (trace,) = run_rollouts([build_proactive_rollout(t, ProactiveConfig(variant="injection_only"))], engines)
    assert {c.role for c in trace.memory_calls} == {"intervene"}
    for call in trace.memory_calls:
        bank = parse_phase_prompt(call.messages)[3]
        assert bank.status == "" and not bank.knowledge and not bank.procedural
    (none,) = run_rollouts([build_proactive_rollout(t, ProactiveConfig(variant="no_memory"))], oracle_engines(t))
    assert none.memory_calls == [] and none.outcome == 0.0


# ---------------------------------------------------------------------------------------------------- triggers
def test_trigger_schedule_and_event_triggers() -> None:
    every3 = fresh(trigger_every=3)
    assert [t for t in range(10) if every3.triggers(t)] == [0, 3, 6, 9]
    first_only = fresh(trigger_every=0)
    assert [t for t in range(10) if first_only.triggers(t)] == [0]
    events = fresh(trigger_every=0, trigger_on_error=True, trigger_on_repeat=True)
    act = lambda a: render_tool_call("act", {"action": a})  # noqa: E731
    events.on_turn(Turn(step=1, action_text=act("pip install numpy"), observation="error: externally-managed"))
    assert events.triggers(1) == ["error"]
    events.on_turn(Turn(step=2, action_text=act("ls"), observation="README.md"))
    assert events.triggers(2) == []
    events.on_turn(Turn(step=3, action_text=act("pip install numpy"), observation="bash: x: command not found"))
    assert events.triggers(3) == ["error", "repeat"]
    assert fresh(trigger_every=2).triggers(0) == ["first"]


def test_memory_steps_follow_the_trigger_in_the_loop() -> None:
    t = task(seed=5)
    engines = oracle_engines(t)
    (trace,) = run_rollouts([build_proactive_rollout(t, ProactiveConfig(trigger_every=4))], engines)
    steps = sorted({c.step for c in trace.memory_calls})
    assert steps == list(range(0, steps[-1] + 1, 4)) and len(steps) > 2
    assert [c.role for c in trace.memory_calls[:2]] == ["bank_edit", "intervene"]
    assert trace.memory_calls[0].metadata["triggers"] == ["first"]
    assert trace.memory_calls[2].metadata["triggers"] == ["schedule"]


# ---------------------------------------------------------------------------------------------------- end to end
def test_matches_the_reference_driver_message_for_message() -> None:
    t = task(seed=6)
    reference = simulate_proactive(t, ActionAgent(), ProactiveOracle(), k=t.params.window)
    (trace,) = run_rollouts([build_proactive_rollout(t)], oracle_engines(t))
    assert trace.outcome == reference.outcome == 1.0
    assert [(c.role, c.messages, c.text) for c in trace.memory_calls] == reference.memory_calls
    assert [e.observation for e in trace.events] == [turn.observation for turn in reference.turns[1:]]
    assert trace.stats["reminders_injected"] == reference.reminders > 0


def test_oracle_beats_no_memory_and_ablations_break_no_requirement() -> None:
    tasks = [task(seed=s) for s in range(6)]
    results = {}
    for variant in ("no_memory", "full", "full_bank", "always_inject", "injection_only"):
        rollouts = [build_proactive_rollout(t, ProactiveConfig(variant=variant)) for t in tasks]
        traces = run_rollouts(rollouts, oracle_engines(*tasks))
        results[variant] = (sum(tr.outcome for tr in traces) / 6, sum(bool(r.env.s.violations) for r in rollouts))
    assert results["full"] == (1.0, 0) and results["no_memory"] == (0.0, 6)
    for variant in ("full_bank", "always_inject", "injection_only"):
        assert results[variant][1] == 0  # they fail on the step budget, never on a violated requirement
    # a standing memory context costs one double-check per subtask it does not bear on, it does not stall the agent
    lenient = task(seed=0, slack=16)
    for variant in ("full_bank", "always_inject"):
        (trace,) = run_rollouts(
            [build_proactive_rollout(lenient, ProactiveConfig(variant=variant))], oracle_engines(lenient)
        )
        assert trace.outcome == 1.0


def test_fork_at_a_pending_phase2_call_gives_independent_branches() -> None:
    t = task(seed=7)
    pivot = next(p for p in t.pivots if p["fact"] in ("interpreter", "output", "protected"))  # missing it is fatal
    engines = oracle_engines(t)
    rollout = build_proactive_rollout(t)
    while True:
        pending = rollout.pending()
        if pending.role == "intervene" and rollout.step == pivot["step"]:
            break
        rollout.advance(engines.for_call(pending).generate([pending.request])[0])
    silent, reminded = rollout.fork("silent"), copy.deepcopy(rollout)
    reminder = engines.memory.generate([pending.request])[0]
    assert reminder.completions[0].text == render_intervention(pivot["reminder"])
    reminded.advance(reminder)
    silence = copy.deepcopy(reminder)
    silence.completions[0].text = render_intervention(None)
    silent.advance(silence)
    assert reminded.memory.reasoner_messages("s")[-1].content == MEMORY_CONTEXT_PREFIX + pivot["reminder"]
    assert MEMORY_CONTEXT_PREFIX not in silent.memory.reasoner_messages("s")[-1].content
    traces = run_rollouts([reminded, silent], engines)
    assert traces[0].outcome == 1.0 and traces[1].outcome == 0.0
    assert rollout.pending() is pending and rollout.memory.bank.entries  # the original is untouched


def test_build_from_episode_and_config_defaults() -> None:
    t = task(seed=8, window=3)
    rollout = build_proactive_rollout(t.episode(), ProactiveConfig(window=5), seed=3, rollout_id="a")
    assert rollout.memory.config.window == 5 and rollout.memory.config.action_window == 3
    assert rollout.metadata["pivots"] == t.pivots and rollout.env.plan == t.plan
    with pytest.raises(ValueError, match="not a proactive task"):
        build_proactive_rollout(SamTask({}, seed=0).episode())
    twin = build_proactive_rollout(t)
    assert isinstance(twin, Rollout) and twin.memory.config.window == 3


# ---------------------------------------------------------------------------------------------------- properties
def test_a_stray_opening_tag_does_not_swallow_the_next_wellformed_call_or_reminder() -> None:
    good = save("knowledge", "use python3.11")
    strays = [
        "<tool_call>oops ",
        "<tool_call>",
        '<tool_call>{"name": "memory_save_knowledge"',
        "<tool_call><function=memory_save_knowledge><parameter=content>half",
    ]
    for stray in strays:
        parsed = parse_tool_calls(stray + good)
        assert [(c.name, c.arguments) for c in parsed.calls] == [
            ("memory_save_knowledge", {"content": "use python3.11"})
        ]
        assert len(parsed.errors) == 1 and "a new <tool_call> began before </tool_call>" in parsed.errors[0]
    reminder, error = parse_intervention("<context_for_action> bad <context_for_action>real</context_for_action>")
    assert reminder == "real" and error == "unclosed <context_for_action> (a new one began before its closing tag)"
    assert parse_intervention(
        "<context_for_action></context_for_action><context_for_action>real</context_for_action>"
    ) == ("real", "empty <context_for_action>")
    assert parse_intervention("<context_for_action>half\n") == (None, "unclosed <context_for_action>")


_WORDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz :-./", min_size=1, max_size=30).map(lambda s: "a" + s)
# Noise is arbitrary text mixed with the pieces model output breaks into: whole, partial and closing tags of both
# phases, the start of a JSON call. A well-formed call or reminder after them must still be found.
_TAG_PIECES = [
    "<tool_call>",
    "</tool_call>",
    "<tool_call",
    "tool_call>",
    "</tool_",
    "<function=",
    "<function=memory_save_knowledge>",
    "</function>",
    "<parameter=content>",
    "</parameter>",
    '{"name": "memory_save_knowledge", "arguments": {',
    "{",
    "}",
    "<context_for_action>",
    "</context_for_action>",
    "<context_for_action",
    "context_for_action>",
    "</context_for",
    "<no_intervention/>",
    "<",
    ">",
    "/",
]
_NOISE = st.lists(st.one_of(st.text(max_size=20), st.sampled_from(_TAG_PIECES)), max_size=6).map("".join)


def is_subsequence(needles: list[Any], haystack: list[Any]) -> bool:
    rest = iter(haystack)
    return all(any(n == h for h in rest) for n in needles)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=300), st.lists(_NOISE, max_size=8).map("".join)))
def test_phase_parsers_never_raise_on_arbitrary_text(text: str) -> None:
    memory = fresh()
    call = run_memory(memory, memory.next_memory_request(), text)
    assert isinstance(call.metadata["applied"], list)
    call = run_memory(memory, memory.next_memory_request(), text)
    assert call.metadata["reminder"] is None or isinstance(call.metadata["reminder"], str)
    memory.reasoner_messages("s")


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["knowledge", "procedural"]), _WORDS, st.sampled_from(["json", "xml"])),
        min_size=1,
        max_size=5,
    ),
    st.lists(_NOISE, min_size=6, max_size=6),
)
def test_wellformed_calls_in_noise_are_found_in_order(calls: list[tuple[str, str, str]], noise: list[str]) -> None:
    memory = fresh()
    parts = [noise[0]]
    for i, (kind, content, style) in enumerate(calls):
        parts += [render_tool_call(f"memory_save_{kind}", {"content": content}, style=style), noise[i + 1]]
    text = "".join(parts)
    call = run_memory(memory, memory.next_memory_request(), text)
    got = [(e.kind, e.content) for e in memory.bank.entries]
    expected = [(kind, " ".join(content.split())) for kind, content, _ in calls]
    assert is_subsequence(expected, got)  # a stray tag in the noise may add an error, never hide a call
    if text.count("<tool_call>") == len(calls):  # the noise opened no tool call of its own
        assert got == expected and call.error is None
    else:
        assert call.error is not None and memory.stats["bank_edit_malformed"] >= 1


@settings(max_examples=150, deadline=None)
@given(_NOISE.filter(lambda s: "</context_for_action>" not in s), _WORDS, _NOISE)
def test_reminder_in_noise_is_found(before: str, reminder: str, after: str) -> None:
    memory = fresh(variant="injection_only")
    call = run_memory(memory, memory.next_memory_request(), before + render_intervention(reminder) + after)
    assert call.metadata["reminder"] == reminder.strip()
    assert memory.reasoner_messages("s")[-1].content == MEMORY_CONTEXT_PREFIX + reminder.strip()
    # a tag the noise opened before the reminder is reported (unclosed), the reminder still delivered
    assert (call.error is None) == ("<context_for_action>" not in before)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=40), min_size=2, max_size=6), st.text(max_size=40))
def test_prefilter_and_forced_reminder_survive_arbitrary_entries(contents: list[str], observation: str) -> None:
    memory = fresh(variant="always_inject", max_entries_per_type=1)
    run_memory(memory, memory.next_memory_request(), "".join(save("knowledge", c) for c in contents))
    run_memory(memory, memory.next_memory_request(), "<no_intervention/>")
    memory.after_reasoner_call()
    memory.on_turn(Turn(step=1, action_text="", observation=observation))
    run_memory(memory, memory.next_memory_request(), "")
    call = run_memory(memory, memory.next_memory_request(), "")
    kept = [e.content for e in memory.bank.entries]
    assert call.metadata["reminder"] in kept if kept else call.metadata["reminder"] is None
