"""AMA-Agent: causality-graph construction (state nodes, causal and association edges, turn ids), tool-augmented
retrieval (top-k, sufficiency check, depth-limited traversal, sandboxed scripts and keywords), ablations, garbage
tolerance, and runs through the agent loop."""

from __future__ import annotations

import copy

import pytest
from fakes import QACase, RecordingEngine, TextEnv, by_role

from memrl.data.formats import render_tool_call
from memrl.data.schemas import Episode, MemoryCall
from memrl.rollout.loop import EngineSet, Rollout, run_rollouts
from memrl.rollout.memory.ama_agent import AMAConfig, AMAMemory
from memrl.rollout.memory.base import MemoryRequest
from memrl.rollout.memory.embedders import HashingEmbedder, MiniLMEmbedder
from memrl.rollout.memory.sandbox import SandboxConfig
from memrl.rollout.memory.workflow import feed_episode

TRAJECTORY = [
    {"turn_idx": 0, "action": "look", "observation": "a red key lies on the table; the door is locked"},
    {"turn_idx": 1, "action": "take red key", "observation": "you hold the red key"},
    {"turn_idx": 2, "action": "go north", "observation": "a dusty corridor"},
    {"turn_idx": 3, "action": "go south", "observation": "back at the table"},
    {"turn_idx": 4, "action": "unlock door with red key", "observation": "the door opens"},
]
RECORDS = {
    0: "state: key on the table, door locked\ncauses: none\nobjects: red key, door",
    1: "state: holding the red key\ncauses: 0\nobjects: red key",
    2: "state: in the corridor\nobjects: none",  # no causes named: linked to its predecessor
    3: "state: at the table\ncauses: 2\nobjects: table",
    4: '{"state": "door open", "causes": [1, 3], "objects": ["door", "red key"]}',
}
SANDBOX = SandboxConfig(time_limit_s=3.0, memory_limit_mb=256)


def make(**overrides: object) -> AMAMemory:
    mem = AMAMemory(AMAConfig(sandbox=SANDBOX, **overrides), embedder=HashingEmbedder())
    mem.reset("get out of the room", {})
    return mem


def answer(mem: AMAMemory, role: str, text: str) -> MemoryRequest:
    request = mem.next_memory_request()
    assert request is not None and request.role == role, request
    mem.on_memory_result(request, MemoryCall(call_id="c", role=role, text=text))
    return request


def built(question: str = "why did the door open?", **overrides: object) -> AMAMemory:
    mem = make(**overrides)
    feed_episode(mem, TRAJECTORY, question)
    for turn in range(5):
        request = answer(mem, "ama_graph_build", RECORDS[turn])
        assert request.metadata["turn"] == turn
    return mem


def test_causality_graph_construction() -> None:
    mem = make()
    feed_episode(mem, TRAJECTORY, "why did the door open?")
    first = answer(mem, "ama_graph_build", RECORDS[0])
    assert "previous turn: (none)" in first.messages[-1].content
    second = answer(mem, "ama_graph_build", RECORDS[1])
    assert "previous turn: 0: look -> a red key lies" in second.messages[-1].content
    assert "[turn 0] key on the table, door locked" in second.messages[-1].content  # recent states
    for turn in (2, 3, 4):
        answer(mem, "ama_graph_build", RECORDS[turn])
    edges = {t: (n.causes, n.effects, sorted(n.associations)) for t, n in mem.nodes.items()}
    assert edges == {
        0: ([], [1], [1, 4]),
        1: ([0], [2, 4], [0, 4]),
        2: ([1], [3], []),
        3: ([2], [4], []),
        4: ([1, 3], [], [0, 1]),
    }
    assert mem.nodes[4].state == "door open" and mem.nodes[0].objects == ["red key", "door"]
    assert mem.neighbourhood([2], 1, 10) == [1, 3]
    assert mem.neighbourhood([2], 2, 10) == [1, 3, 0, 4]
    assert mem.neighbourhood([2], 2, 3) == [1, 3, 0]
    assert mem.similar("unlock the door with the red key", 1) == [4]


def test_turns_without_turn_idx_each_become_a_node() -> None:
    """AMA-Bench turns without ``turn_idx`` all read 0 (as the official loader reads them); each is still a node."""
    episode = Episode(
        episode_id="e",
        task="t",
        unnumbered_turns=[0, 1, 2],
        trajectory=[
            {"turn_idx": 0, "action": a, "observation": o}
            for a, o in (("look", "a red key"), ("take red key", "you hold it"), ("go north", "a corridor"))
        ],
    )
    mem = make()
    feed_episode(mem, episode.trajectory, "what did the agent take?")
    turns = [answer(mem, "ama_graph_build", "state: s").metadata["turn"] for _ in range(3)]
    assert turns == [0, 1, 2] and sorted(mem.nodes) == [0, 1, 2] and mem.nodes[1].action == "take red key"
    assert mem.stats.get("ama_duplicate_turn", 0) == 0


def test_graph_route_traverses_the_neighbourhood() -> None:
    mem = built(top_k=1, traversal_depth=1)
    check = answer(mem, "ama_sufficiency", "INSUFFICIENT: graph the cause of the opening")
    assert check.messages[-1].content.count("[turn ") == 1 and "[turn 4]" in check.messages[-1].content
    check = answer(mem, "ama_sufficiency", "SUFFICIENT")
    assert [line[:8] for line in check.messages[-1].content.splitlines() if line.startswith("[turn")] == [
        "[turn 0]",
        "[turn 1]",
        "[turn 3]",
        "[turn 4]",
    ]
    assert mem.next_memory_request() is None
    user = mem.reasoner_messages("")[1].content
    assert "[turn 4] unlock door with red key -> the door opens | state: door open | caused by: 1, 3" in user
    assert user.endswith("question: why did the door open?") and "recent steps:" in user
    assert mem.stats["ama_graph_traversals"] == 1


def test_keyword_route_runs_scripts_in_the_sandbox_and_goes_on_after_a_violation() -> None:
    mem = built("how many times did the agent go somewhere?", top_k=1, max_tool_rounds=3)
    answer(mem, "ama_sufficiency", "INSUFFICIENT: keyword count the go actions")
    script = (
        "```python\nimport json\nturns = json.load(open('trajectory.json'))\n"
        "print('go turns:', [t['turn_idx'] for t in turns if t['action'].startswith('go')])\n```"
    )
    request = answer(mem, "ama_keyword_script", script)
    assert "missing: count the go actions" in request.messages[-1].content
    answer(mem, "ama_sufficiency", "INSUFFICIENT: keyword need more")
    answer(mem, "ama_keyword_script", "```python\nimport socket\nsocket.socket()\n```")
    answer(mem, "ama_sufficiency", "insufficient: keyword corridor")
    answer(mem, "ama_keyword_script", "keywords: corridor, DUSTY")
    assert mem.next_memory_request() is None  # three tools used: the budget is spent
    support = mem.support
    assert "script output:\ngo turns: [2, 3]" in support
    assert "script stopped (network): socket.__new__" in support
    assert "[turn 2] go north -> a dusty corridor" in support
    assert mem.stats["ama_script_ok"] == 1 and mem.stats["ama_script_network"] == 1
    assert mem.stats["ama_keyword_searches"] == 1


def test_ablations() -> None:
    no_graph = make(graph=False, top_k=2)
    feed_episode(no_graph, TRAJECTORY, "where is the corridor?")
    answer(no_graph, "ama_sufficiency", "INSUFFICIENT: graph neighbours")  # no graph: the keyword route instead
    answer(no_graph, "ama_keyword_script", "keywords: corridor")
    answer(no_graph, "ama_sufficiency", "SUFFICIENT")
    assert no_graph.next_memory_request() is None and not any(n.causes for n in no_graph.nodes.values())

    no_tools = built(tool_retrieval=False, top_k=2)
    assert no_tools.next_memory_request() is None
    assert no_tools.support.count("[turn ") == 2


def test_tool_budget_and_garbage() -> None:
    mem = make(max_tool_rounds=2, top_k=1)
    feed_episode(mem, TRAJECTORY, "why?")
    calls = []
    while (request := mem.next_memory_request()) is not None:
        calls.append(request.role)
        text = "INSUFFICIENT: graph more" if request.role == "ama_sufficiency" else "\x00 }{ garbage"
        mem.on_memory_result(request, MemoryCall(call_id="c", role=request.role, text=text))
    assert calls == ["ama_graph_build"] * 5 + ["ama_sufficiency"] * 2
    assert mem.stats["ama_build_unparsed"] == 5 and [n.causes for n in mem.nodes.values()] == [[], [0], [1], [2], [3]]

    garbage = make()
    feed_episode(garbage, TRAJECTORY[:1], "?")
    answer(garbage, "ama_graph_build", "state: fine")
    answer(garbage, "ama_sufficiency", "lorem ipsum")
    assert garbage.next_memory_request() is None and garbage.stats["ama_sufficiency_unparsed"] == 1


def walk_reasoner(last: str) -> str:
    """Act until a corridor is seen, retrieve, answer with the turn the evidence names."""
    if "evidence:" in last:
        return render_tool_call("answer", {"answer": "key" if "key" in last.split("evidence:")[1] else "?"})
    if "corridor" in last:
        return render_tool_call("retrieve", {"query": "where is the key?"})
    return render_tool_call("act", {"action": "walk"})


walk_script = by_role(
    {"ama_graph_build": "state: somewhere\ncauses: none\nobjects: key", "ama_sufficiency": "SUFFICIENT"}, walk_reasoner
)


def walk_env() -> TextEnv:
    """A room, then a key on the floor, then corridors; won by answering "key"."""
    return TextEnv(
        "walk", "find the key", "a room", lambda n, _: "a key on the floor" if n == 1 else "a corridor", "key"
    )


def test_agent_mode_retrieve_tool_in_the_loop() -> None:
    reasoner, memory = RecordingEngine(walk_script, "reasoner"), RecordingEngine(walk_script, "memory")
    mem = AMAMemory(AMAConfig(top_k=2), embedder=HashingEmbedder())
    (trace,) = run_rollouts(
        [Rollout(walk_env(), mem, reasoner_system="", rollout_id="a")], EngineSet(reasoner=reasoner, memory=memory)
    )
    assert trace.outcome == 1.0 and [e.kind for e in trace.events] == ["act", "act", "memory_tool", "answer"]
    assert [c.role for c in trace.memory_calls] == ["ama_graph_build", "ama_graph_build", "ama_sufficiency"]
    assert "[turn 1] walk -> a key on the floor" in trace.events[2].observation
    assert mem.nodes[2].associations == [1]


QA_CASE = QACase(
    memory={"name": "ama_agent", "top_k": 2},
    script=walk_script,
    task="find the key",
    turns=TRAJECTORY,
    question="where was the red key?",
    answer="key",
    roles=["ama_graph_build"] * 5 + ["ama_sufficiency"],
)


def test_fork_at_a_pending_call_shares_the_embedder_and_nothing_else() -> None:
    mem = built(top_k=1, traversal_depth=1)
    twin = copy.deepcopy(mem)
    assert twin.embedder is mem.embedder and twin.nodes is not mem.nodes
    answer(mem, "ama_sufficiency", "SUFFICIENT")
    answer(twin, "ama_sufficiency", "INSUFFICIENT: graph causes")
    answer(twin, "ama_sufficiency", "SUFFICIENT")
    assert mem.next_memory_request() is None and twin.next_memory_request() is None
    assert mem.support.count("[turn ") == 1 and twin.support.count("[turn ") == 4


# protects: the packaged MiniLM embedder loads offline and ranks by meaning (the fast tests use cheaper embedders)
@pytest.mark.slow
def test_packaged_minilm_loads_offline_and_ranks_by_meaning() -> None:
    embedder = MiniLMEmbedder()
    vectors = embedder.embed(["the red key is in chest 3", "where is the key?", "the weather is sunny today"])
    assert vectors.shape == (3, 384)
    assert float(vectors[0] @ vectors[1]) > float(vectors[2] @ vectors[1])
