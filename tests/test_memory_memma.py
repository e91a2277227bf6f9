"""MemMA: construction edits, self-evolution with repair consolidation (SKIP / MERGE / INSERT), the query loop's
budget H and ablations, garbage tolerance, and runs through the agent loop."""

from __future__ import annotations

from typing import Any

from fakes import QACase, RecordingEngine, TextEnv

from memrl.data.formats import ToolCall, render_tool_call
from memrl.data.schemas import MemoryCall
from memrl.rollout.loop import EngineSet, Rollout, run_rollouts
from memrl.rollout.memory.base import MemoryRequest, Turn
from memrl.rollout.memory.embedders import HashingEmbedder
from memrl.rollout.memory.memma import MemMAConfig, MemMAMemory, lexical_match
from memrl.rollout.memory.prompts_memma import parse_memma_edits
from memrl.rollout.memory.workflow import feed_episode

TRAJECTORY = [
    {"turn_idx": 0, "action": "open chest 3", "observation": "the red key is in chest 3"},
    {"turn_idx": 1, "action": "read note", "observation": "the door code is 4172"},
]


def make(**overrides: object) -> MemMAMemory:
    mem = MemMAMemory(MemMAConfig(**overrides), embedder=HashingEmbedder())
    mem.reset("find the way out", {})
    return mem


def answer(mem: MemMAMemory, role: str, text: str, phase: str | None = None) -> MemoryRequest:
    request = mem.next_memory_request()
    assert request is not None, f"expected a {role} call"
    assert (request.role, request.metadata["phase"] if phase else None) == (role, phase), request.metadata
    mem.on_memory_result(request, MemoryCall(call_id="c", role=role, text=text))
    return request


def texts(mem: MemMAMemory) -> dict[str, str]:
    return {i: e.text for i, e in mem.entries.items()}


def test_similarity_consolidation_skips_merges_and_inserts() -> None:
    mem = make(consolidation="similarity")
    key = mem.add_entry("the red key is in chest 3", [0])
    mem.add_entry("the door code is 4172", [1])
    assert mem.consolidate("the red key is in chest 3", [2], None) == "SKIP"
    assert mem.consolidate("the red key is in chest 3 under a blue cloth", [2], None) == "MERGE"
    assert texts(mem)[key] == "the red key is in chest 3; the red key is in chest 3 under a blue cloth"
    assert mem.consolidate("the lamp in the hall is broken", [2], None) == "INSERT"
    assert mem.consolidate("the lamp in the hall is broken", [3], None) == "SKIP"  # a proposal made redundant
    assert len(mem.entries) == 3 and mem.entries[key].turns == [0, 2]
    assert mem.stats == {"memma_consolidate_skip": 2, "memma_consolidate_merge": 1, "memma_consolidate_insert": 1}


def test_construction_then_self_evolution_repairs_the_bank() -> None:
    mem = make(chunk_turns=2, session_chunks=1, probes_per_session=4)
    feed_episode(mem, TRAJECTORY, "what is the door code?")
    guide = answer(mem, "memma_meta_think", "keep the key location; the code matters", "construct")
    assert "[turn 1] read note -> the door code is 4172" in guide.messages[-1].content
    manage = answer(mem, "memma_manage", "ADD: the red key is in chest 3\nNONE", "manage")
    assert "guidance: keep the key location" in manage.messages[-1].content
    assert texts(mem) == {"m1": "the red key is in chest 3"} and mem.entries["m1"].turns == [0, 1]

    probes = (
        "Q: where is the red key? A: chest 3\nQ: what is the code? A: 4172\nQ: where is the key? A: chest 3\n"
        "Q: what is under the cloth? A: the red key"
    )
    answer(mem, "memma_probe", probes, "probe")
    answer(mem, "memma_answer", "chest 3", "verify_answer")
    answer(mem, "memma_verify", "yes", "verify")
    for predicted in ("unknown", "somewhere", "nothing"):
        request = answer(mem, "memma_answer", predicted, "verify_answer")
        assert "[m1] the red key is in chest 3" in request.messages[-1].content  # probes see their top-k evidence
        answer(mem, "memma_verify", "no", "verify")
    repair = answer(mem, "memma_repair", "diagnosis: missing\nfact: the door code is 4172", "repair")
    assert "gold answer: 4172" in repair.messages[-1].content and "predicted answer: unknown" in (
        repair.messages[-1].content
    )
    answer(mem, "memma_repair", "diagnosis: hard_to_retrieve\nfact: the red key is in chest 3", "repair")
    answer(mem, "memma_repair", "fact: the red key lies under a blue cloth", "repair")
    answer(mem, "memma_consolidate", "INSERT", "consolidate")
    answer(mem, "memma_consolidate", "SKIP", "consolidate")
    answer(mem, "memma_consolidate", "MERGE m1: the red key is in chest 3, under a blue cloth", "consolidate")
    assert texts(mem) == {"m1": "the red key is in chest 3, under a blue cloth", "m2": "the door code is 4172"}
    assert mem.stats["memma_probe_pass"] == 1 and mem.stats["memma_probe_fail"] == 3
    assert (
        mem.stats["memma_consolidate_insert"],
        mem.stats["memma_consolidate_skip"],
        mem.stats["memma_consolidate_merge"],
    ) == (1, 1, 1)

    # The question: critique -> answer (answerable at once), the reasoner sees the evidence and proposed answer.
    answer(mem, "memma_meta_think", "ANSWERABLE", "critique")
    assert mem.sessions_evolved == 1
    final = answer(mem, "memma_answer", "answer: 4172", "answer")
    assert "[m2] the door code is 4172" in final.messages[-1].content
    assert mem.next_memory_request() is None
    user = mem.reasoner_messages("")[1].content
    assert "memory's proposed answer: 4172" in user and user.endswith("question: what is the door code?")


def bank_with_facts(**overrides: object) -> MemMAMemory:
    mem = make(self_evolution=False, **overrides)
    for i, fact in enumerate(["the red key is in chest 3", "the door code is 4172", "the lamp is broken"]):
        mem.add_entry(fact, [i])
    return mem


def test_query_loop_respects_the_budget_h() -> None:
    mem = bank_with_facts(refine_budget=2, top_k=1)
    mem.on_turn(Turn(step=1, action_text="", observation="what opens the door?", role="user"))
    requests = []
    while (request := mem.next_memory_request()) is not None:
        requests.append(request)
        reply = {
            "memma_meta_think": "NOT ANSWERABLE: the code",
            "memma_answer": "4172",
            "memma_query": f"query: is the lamp {len(requests)} broken",
        }[request.role]
        mem.on_memory_result(request, MemoryCall(call_id="c", role=request.role, text=reply))
    roles = [r.role for r in requests]
    assert roles == ["memma_meta_think", "memma_query", "memma_meta_think", "memma_query", "memma_answer"]
    assert mem.stats["memma_refinements"] == 2
    assert "queries so far: what opens the door? | is the lamp 2 broken" in requests[2].messages[-1].content
    assert "diagnosis: the code" in requests[3].messages[-1].content
    assert "[m2] the door code is 4172\n[m3] the lamp is broken" in requests[4].messages[-1].content  # E grew

    early = bank_with_facts(refine_budget=3)
    early.on_turn(Turn(step=1, action_text="", observation="where is the key?", role="user"))
    answer(early, "memma_meta_think", "answerable: chest 3 is named", "critique")
    answer(early, "memma_answer", "chest 3", "answer")
    assert early.next_memory_request() is None

    for one_shot in (bank_with_facts(refine_budget=0), bank_with_facts(iterative_retrieval=False)):
        one_shot.on_turn(Turn(step=1, action_text="", observation="where is the key?", role="user"))
        answer(one_shot, "memma_answer", "chest 3", "answer")
        assert one_shot.next_memory_request() is None


def test_ablation_c_and_e_skip_their_calls() -> None:
    mem = make(construction_guidance=False, self_evolution=False, chunk_turns=2)
    feed_episode(mem, TRAJECTORY, "code?")
    manage = answer(mem, "memma_manage", '[{"op": "ADD", "text": "code 4172"}]', "manage")
    assert "guidance:" not in manage.messages[-1].content
    answer(mem, "memma_meta_think", "ANSWERABLE", "critique")
    answer(mem, "memma_answer", "4172", "answer")
    assert mem.next_memory_request() is None and texts(mem) == {"m1": "code 4172"}


def test_garbage_never_crashes() -> None:
    mem = make(chunk_turns=2, session_chunks=1)
    feed_episode(mem, TRAJECTORY, "code?")
    calls = 0
    while (request := mem.next_memory_request()) is not None:
        calls += 1
        mem.on_memory_result(request, MemoryCall(call_id="c", role=request.role, text="}{ \x00 ???"))
    assert calls == 5  # guidance, manage, probe (unreadable: evolution ends), critique (unreadable: stop), answer
    assert mem.stats["memma_manage_unparsed"] == 1 and mem.stats["memma_probe_unparsed"] == 1
    assert mem.stats["memma_critique_unparsed"] == 1
    assert "the door code is 4172" in texts(mem)["m1"]  # the raw chunk is kept when the edits are unreadable


def test_edit_parser_and_lexical_judge() -> None:
    edits, errors = parse_memma_edits("1. ADD: a fact\nUPDATE m2: new\nDELETE [m3]\nUPDATE: no id\nhello\nNONE")
    assert [(e.op, e.entry_id, e.text) for e in edits] == [
        ("ADD", None, "a fact"),
        ("UPDATE", "m2", "new"),
        ("DELETE", "m3", ""),
        ("NONE", None, ""),
    ]
    assert len(errors) == 2
    assert lexical_match("It is in chest 3.", "chest 3") and not lexical_match("chest 4", "the red key")


MEMMA_REPLIES = {
    "memma_manage": "ADD: the door code is 4172",
    "memma_probe": "Q: what is the code? A: 4172",
    "memma_answer": "4172",
    "memma_verify": "yes",
}


def tick_script(last: str, metadata: dict[str, Any]) -> str:
    """Reasoner: ask memory once, then answer with the memory's proposed answer. Memory model: answers by role."""
    role = metadata["role"]
    if role == "memma_meta_think":
        return "ANSWERABLE" if metadata.get("phase") == "critique" else "keep codes"
    if role in MEMMA_REPLIES:
        return MEMMA_REPLIES[role]
    if "proposed answer: " in last:
        return render_tool_call("answer", {"answer": last.split("proposed answer: ")[1].splitlines()[0]})
    if "ticks=2" in last:
        return render_tool_call("memory", {"query": "what is the door code?"})
    return render_tool_call("act", {"action": "tick"})


def tick_env() -> TextEnv:
    """A note with the door code, then a tick count; won by answering the code."""
    return TextEnv(
        "tick", "find the door code", "the note says 4172 is the door code", lambda n, _: f"ticks={n}", "4172"
    )


def test_agent_mode_memory_tool_in_the_loop() -> None:
    reasoner, memory = RecordingEngine(tick_script, "reasoner"), RecordingEngine(tick_script, "memory")
    mem = MemMAMemory(MemMAConfig(chunk_turns=3, session_chunks=4), embedder=HashingEmbedder())
    rollout = Rollout(tick_env(), mem, reasoner_system="", rollout_id="a")
    (trace,) = run_rollouts([rollout], EngineSet(reasoner=reasoner, memory=memory))
    assert trace.outcome == 1.0 and [e.kind for e in trace.events] == ["act", "act", "memory_tool", "answer"]
    roles = [c.role for c in trace.memory_calls]
    assert roles == ["memma_meta_think", "memma_manage", "memma_meta_think", "memma_answer"]
    assert "memory's proposed answer: 4172" in trace.events[2].observation
    assert len(trace.events[2].memory_call_ids) == 4  # the partial chunk flushed by the tool call counts toward it


QA_CASE = QACase(
    memory={"name": "memma", "chunk_turns": 1, "session_chunks": 2, "probes_per_session": 1},
    script=tick_script,
    task="find the door code",
    turns=TRAJECTORY,
    question="what is the door code?",
    answer="4172",
    roles=["memma_meta_think", "memma_manage"] * 2
    + ["memma_probe", "memma_answer", "memma_verify", "memma_meta_think", "memma_answer"],
)


def test_memory_tool_needs_a_query() -> None:
    mem = make()
    mem.after_reasoner_call()
    mem.on_tool_call(ToolCall(name="memory", arguments={}), 1)
    result = mem.tool_result()
    assert result is not None and result.error == "memory needs a non-empty query"
