"""Mage: Algorithm 1 replayed on a hand-written trace (tree and S after every operation), ablations, garbage
tolerance, and runs through the agent loop (agent mode and question-answering mode)."""

from __future__ import annotations

import copy

from fakes import QACase, RecordingEngine, TextEnv, by_role

from memrl.data.formats import ToolCall, render_tool_call
from memrl.data.schemas import MemoryCall
from memrl.rollout.loop import EngineSet, Rollout, run_rollouts
from memrl.rollout.memory.base import MemoryRequest, Turn
from memrl.rollout.memory.mage import Hints, MageConfig, MageMemory
from memrl.rollout.memory.workflow import feed_episode

TASK = "buy a gold ring, then a necklace that matches it"


def act(mem: MageMemory, step: int, action: str, observation: str) -> None:
    mem.after_reasoner_call()
    mem.on_turn(Turn(step=step, action_text=render_tool_call("act", {"action": action}), observation=observation))


def answer(mem: MageMemory, text: str, role: str) -> MemoryRequest:
    request = mem.next_memory_request()
    assert request is not None and request.role == role
    mem.on_memory_result(request, MemoryCall(call_id=f"c{request.metadata['job']}", role=role, text=text))
    return request


def tool(mem: MageMemory, at: int, name: str, **arguments: object) -> None:
    mem.after_reasoner_call()
    mem.on_tool_call(ToolCall(name=name, arguments=dict(arguments)), at)


def finish_tool(mem: MageMemory, step: int) -> str:
    result = mem.tool_result()
    assert result is not None
    mem.on_turn(Turn(step=step, action_text="<tool call>", observation=result.content, role="user"))
    return result.error or result.content


def path_to_pt(mem: MageMemory) -> list[int]:
    out, node = [], mem.p_t
    while node != 0:
        out.append(node)
        node = mem.top[node].parent
    return out[::-1]


def started(config: MageConfig | None = None) -> MageMemory:
    mem = MageMemory(config)
    mem.reset(TASK, {})
    mem.on_turn(Turn(step=0, action_text="", observation="the shop is open", role="user"))
    assert mem.next_memory_request() is None
    return mem


def test_algorithm_1_on_a_hand_written_trace() -> None:
    mem = started()
    assert mem.bottom[0].observation == "the shop is open" and (mem.p_b, mem.p_t, mem.step) == (0, 0, 1)

    # Grow twice: new bottom nodes 1 and 2.
    act(mem, 1, "search ring", "gold ring found")
    act(mem, 2, "buy gold ring", "bought gold ring")
    assert mem.next_memory_request() is None
    assert mem.bottom[0].children == [1] and mem.bottom[1].children == [2] and mem.p_b == 2
    s = mem.state()
    assert s.C == [] and s.R == [("search ring", "gold ring found"), ("buy gold ring", "bought gold ring")]

    # Compress (the agent's summary), Maintain passes: top node 3 covers [1, 2] from boundary @0.
    tool(mem, 3, "compress", summary="owns a gold ring")
    answer(mem, "PASS", "mage_maintain")
    assert finish_tool(mem, 3) == "compressed into @0; check passed"
    node = mem.top[3]
    assert (node.boundary, node.cover_nodes, node.parent, node.content) == (0, [1, 2], 0, "owns a gold ring")
    assert (mem.p_t, mem.p_b, mem.step) == (3, 2, 4)
    s = mem.state()
    assert s.C == [(0, "owns a gold ring")] and s.R == [] and Hints([], [], []) == s.H

    # Grow two more nodes, compress them: Maintain fails, Revise goes back to @2 and skips the failed summary 6.
    act(mem, 4, "search necklace", "silver necklace found")
    act(mem, 5, "buy silver necklace", "bought silver necklace")
    tool(mem, 6, "compress", summary="owns a silver necklace")
    request = answer(mem, "FAIL: the necklace must match the gold ring", "mage_maintain")
    assert "owns a silver necklace" in request.messages[-1].content and "[5] buy silver necklace" in (
        request.messages[-1].content
    )
    assert "returned to @2" in finish_tool(mem, 6)
    assert mem.top[6].cover_nodes == [4, 5] and mem.top[6].note == "the necklace must match the gold ring"
    assert (mem.p_t, mem.p_b) == (3, 2)
    s = mem.state()
    assert s.C == [(0, "owns a gold ring")] and s.R == []
    assert Hints(bottom=[4], top=[6], notes=["the necklace must match the gold ring"]) == s.H
    text = mem.reasoner_messages("sys")[1].content
    assert "tried before from here: search necklace -> silver necklace found" in text
    assert "earlier attempt from @2: owns a silver necklace (failed check: the necklace must match" in text

    # Grow the same action and observation again: merge into node 4 (no new node), H shows the old continuation.
    act(mem, 7, "search necklace", "silver necklace found")
    assert mem.next_memory_request() is None
    assert mem.p_b == 4 and mem.step == 7 and mem.bottom[2].children == [4]
    assert mem.state().H.bottom == [5] and mem.state().R == [("search necklace", "silver necklace found")]
    # Merge again into 5, compress the same nodes: the failed summary node 6 is reused with the new content.
    act(mem, 8, "buy silver necklace", "bought silver necklace")
    assert mem.next_memory_request() is None
    assert mem.p_b == 5 and mem.step == 7
    tool(mem, 9, "compress", summary="owns a silver necklace again")
    answer(mem, "FAIL: still silver", "mage_maintain")
    finish_tool(mem, 9)
    assert mem.top[3].children == [6] and mem.top[6].content == "owns a silver necklace again"
    assert mem.top[6].note == "still silver" and (mem.p_t, mem.p_b) == (3, 2)

    # A new branch: merge into 4, then a new node 7; compress into a new summary 8 that passes.
    act(mem, 10, "search necklace", "silver necklace found")
    act(mem, 11, "buy gold necklace", "bought gold necklace")
    assert mem.next_memory_request() is None
    assert mem.p_b == 7 and mem.bottom[4].children == [5, 7]
    tool(mem, 12, "compress", summary="owns a matching gold necklace")
    answer(mem, "PASS", "mage_maintain")
    finish_tool(mem, 12)
    assert mem.top[8].cover_nodes == [4, 7] and mem.top[8].boundary == 2 and mem.top[3].children == [6, 8]
    s = mem.state()
    assert s.C == [(0, "owns a gold ring"), (2, "owns a matching gold necklace")] and s.R == []
    assert mem.C == path_to_pt(mem) == [3, 8]

    # The agent revises to @0 itself: both summaries leave C, the pointers return to the roots.
    tool(mem, 13, "revise", step="@0", reason="wrong shop")
    assert finish_tool(mem, 13) == "returned to @0; continue on a new branch"
    assert (mem.p_t, mem.p_b, mem.C, mem.R) == (0, 0, [], [])
    assert mem.H.top == [3] and mem.H.bottom == [1] and mem.H.notes[-1] == "wrong shop"
    assert mem.stats == {
        "mage_compress": 4,
        "mage_maintain_pass": 2,
        "mage_maintain_fail": 2,
        "mage_revise_auto": 2,
        "mage_revise_agent": 1,
    }


def test_fallback_compress_and_replayed_maintain_failure_keep_the_summary() -> None:
    mem = started(MageConfig(max_raw_turns=2))
    feed_episode(mem, [{"turn_idx": i, "action": f"a{i}", "observation": f"o{i}"} for i in range(5)], "what is o3?")
    request = answer(mem, "summary: did a0 and a1", "mage_compress")
    assert request.metadata["origin"] == "fallback" and "[2] a1 -> o1" in request.messages[-1].content
    answer(mem, "FAIL: lost o1", "mage_maintain")  # replayed: noted, no Revise
    answer(mem, "did a2 and a3", "mage_compress")
    answer(mem, '{"pass": true}', "mage_maintain")
    assert mem.next_memory_request() is None
    s = mem.state()
    assert s.C == [(0, "did a0 and a1"), (2, "did a2 and a3")] and s.R == [("a4", "o4")]
    assert s.H.notes == ["lost o1"]
    text = mem.reasoner_messages("")[1].content
    assert "[@0] did a0 and a1 (failed check: lost o1)" in text and text.endswith("question: what is o3?")


def test_ablations_and_garbage() -> None:
    no_compress = started(MageConfig(compress=False, max_raw_turns=1))
    assert no_compress.tools == ()
    for i in range(4):
        act(no_compress, i + 1, f"a{i}", f"o{i}")
    assert no_compress.next_memory_request() is None and len(no_compress.state().R) == 4

    no_maintain = started(MageConfig(maintain=False))
    act(no_maintain, 1, "a", "o")
    tool(no_maintain, 2, "compress", summary="did a")
    assert no_maintain.next_memory_request() is None and finish_tool(no_maintain, 2) == "compressed into @0"

    no_revise = started(MageConfig(revise=False))
    assert no_revise.tools == ("compress",)
    act(no_revise, 1, "a", "o")
    tool(no_revise, 2, "compress")  # no summary given: the memory model writes it
    answer(no_revise, "", "mage_compress")  # empty summary: a digest of the steps instead
    answer(no_revise, "FAIL: wrong", "mage_maintain")
    finish_tool(no_revise, 2)
    assert no_revise.state().C == [(0, "steps 1-1; last: a -> o")] and no_revise.H.notes == ["wrong"]

    garbage = started()
    act(garbage, 1, "a", "o")
    tool(garbage, 2, "compress", summary="did a")
    answer(garbage, "\x00}{ lorem", "mage_maintain")
    finish_tool(garbage, 2)
    tool(garbage, 3, "revise", step="nine")
    assert "step id" in finish_tool(garbage, 3)
    tool(garbage, 4, "revise", step=7)
    assert finish_tool(garbage, 4) == "no compressed boundary @7 (valid: @0)"
    tool(garbage, 5, "compress", summary="nothing new")
    assert finish_tool(garbage, 5).startswith("nothing to compress")
    assert garbage.stats["mage_maintain_unparsed"] == 1 and garbage.stats["mage_tool_errors"] == 2
    assert garbage.state().C == [(0, "did a")]


def test_deepcopy_at_a_pending_call_gives_independent_branches() -> None:
    mem = started()
    act(mem, 1, "a", "o")
    tool(mem, 2, "compress", summary="did a")
    twin = copy.deepcopy(mem)
    answer(mem, "PASS", "mage_maintain")
    answer(twin, "FAIL: no", "mage_maintain")
    assert mem.state().C == [(0, "did a")] and twin.state().C == [] and twin.p_b == 0


def shop_reasoner(last: str) -> str:
    """Two acts, compress, one act, answer."""
    if "question:" in last:
        return render_tool_call("answer", {"answer": "gold" if "[@0]" in last else "?"})
    if "compressed into" in last:
        return render_tool_call("act", {"action": "pay"})
    if last.count("done:") >= 2:
        return render_tool_call("compress", {"summary": "picked ring and necklace"})
    if "done: pay" in last:
        return render_tool_call("answer", {"answer": "gold"})
    return render_tool_call("act", {"action": f"pick {last.count('done:')}"})


shop_script = by_role({"mage_maintain": "PASS", "mage_compress": "summary of the steps"}, shop_reasoner)


def test_runs_in_the_agent_loop() -> None:
    reasoner, memory = RecordingEngine(shop_script, "reasoner"), RecordingEngine(shop_script, "memory")
    shop = TextEnv("shop", TASK, "the shop is open", lambda _, action: f"done: {action}", "gold", max_steps=12)
    rollout = Rollout(shop, MageMemory(), reasoner_system="", seed=0, rollout_id="r")
    (trace,) = run_rollouts([rollout], EngineSet(reasoner=reasoner, memory=memory))
    assert trace.outcome == 1.0 and [e.kind for e in trace.events] == ["act", "act", "memory_tool", "act", "answer"]
    assert [c.role for c in trace.memory_calls] == ["mage_maintain"]
    assert trace.events[2].memory_call_ids == [trace.memory_calls[0].call_id]
    assert "[@0] picked ring and necklace" in reasoner.prompts[-1] and "[4] pay -> done: pay" in reasoner.prompts[-1]


QA_CASE = QACase(
    memory={"name": "mage", "max_raw_turns": 3},
    script=shop_script,
    task=TASK,
    turns=[{"turn_idx": i, "action": f"a{i}", "observation": f"o{i}"} for i in range(4)],
    question="which metal?",
    answer="gold",
    roles=["mage_compress", "mage_maintain"],
    prompt_has=("[5] a3 -> o3",),
)
