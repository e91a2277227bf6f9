"""The agent loop's state machine: memory calls before reasoner calls, tool round trips, forking, wavefronts."""

from __future__ import annotations

from typing import Any

from data.formats import ToolCall, render_tool_call
from data.schemas import MemoryCall, Message
from rollout.engines.base import Completion, Engine, GenerationRequest, GenerationResult, Usage
from rollout.loop import EngineSet, Rollout, run_rollouts
from rollout.memory.base import MemoryRequest, MemorySystem, RoleSampling, ToolResult, Turn


class CountEnv:
    """Say `act(tick)` until the counter reaches 3, then answer with the number of recalls seen."""

    def __init__(self, task_id: str) -> None:
        self.task_id, self.task, self.max_steps = task_id, "tick three times, then recall, then answer", 10
        self.ticks = 0

    def reset(self) -> str:
        return "start"

    def step(self, action: str) -> tuple[str, bool]:
        self.ticks += action == "tick"
        return f"ticks={self.ticks}", False

    def finish(self, answer: str | None) -> float:
        return float(answer == "ok")


class TwoCallMemory(MemorySystem):
    """Keeps every turn; its `memory` tool needs two sequential memory-model calls."""

    name = "two-call"
    tools = ("memory",)

    def reset(self, task: str, metadata: dict[str, Any]) -> None:
        self.task, self.turns, self.queue, self.result, self.parts = task, [], [], None, []

    def on_turn(self, turn: Turn) -> None:
        self.turns.append(turn)

    def reasoner_messages(self, system_prompt: str) -> list[Message]:
        body = "\n".join(t.observation for t in self.turns)
        return [Message(role="system", content=system_prompt), Message(role="user", content=body)]

    def next_memory_request(self) -> MemoryRequest | None:
        if not self.queue:
            return None
        return MemoryRequest(
            role="recall", messages=[Message(role="user", content=self.queue[0])], sampling=RoleSampling()
        )

    def on_memory_result(self, request: MemoryRequest, call: MemoryCall) -> None:
        self.queue.pop(0)
        self.parts.append(call.text)
        if not self.queue:
            self.result = ToolResult(content="+".join(self.parts))

    def on_tool_call(self, call: ToolCall, step: int) -> None:
        self.queue, self.parts = ["part a", "part b"], []

    def tool_result(self) -> ToolResult | None:
        result, self.result = self.result, None
        return result


class FakeEngine(Engine):
    """Reasoner: tick until ticks=3, then call memory, then answer. Memory: echo the request with a sample tag."""

    def __init__(self, name: str) -> None:
        self.name, self.calls, self.batch_sizes = name, 0, []

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        self.calls += 1
        self.batch_sizes.append(len(requests))
        out = []
        for req in requests:
            text_in = req.messages[-1].content
            completions = []
            for k in range(req.sampling.n):
                if self.name == "memory":
                    text = f"{text_in}#{k}"
                elif "recalled:" in text_in:
                    text = render_tool_call("answer", {"answer": "ok"})
                elif "ticks=3" in text_in:
                    text = render_tool_call("memory", {"intent": "x"})
                else:
                    text = render_tool_call("act", {"action": "tick"})
                completions.append(
                    Completion(response_ids=[1, 2], logprobs=[-0.5, -0.25], text=text, finish_reason="stop")
                )
            out.append(
                GenerationResult(
                    prompt_ids=[7, 8, 9], completions=completions, usage=Usage(3, 2 * req.sampling.n), engine=self.name
                )
            )
        return out


class RecallAwareMemory(TwoCallMemory):
    def on_turn(self, turn: Turn) -> None:
        if turn.role == "user" and turn.step > 0:
            turn = Turn(step=turn.step, action_text=turn.action_text, observation="recalled: " + turn.observation)
        super().on_turn(turn)


def make(task_id: str = "t0") -> Rollout:
    return Rollout(CountEnv(task_id), RecallAwareMemory(), reasoner_system="sys", seed=1, rollout_id="r")


def test_single_rollout_runs_to_the_answer() -> None:
    engines = EngineSet(reasoner=FakeEngine("reasoner"), memory=FakeEngine("memory"))
    (trace,) = run_rollouts([make()], engines)
    assert trace.outcome == 1.0 and trace.answer == "ok"
    kinds = [e.kind for e in trace.events]
    assert kinds == ["act", "act", "act", "memory_tool", "answer"]
    assert [c.text for c in trace.memory_calls] == ["part a#0", "part b#0"]
    assert trace.events[3].observation == "part a#0+part b#0"
    assert trace.events[3].memory_call_ids == [c.call_id for c in trace.memory_calls]
    assert trace.reasoner_usage.calls == 5 and trace.reasoner_usage.prompt_tokens == 15
    assert trace.memory_usage.calls == 2 and trace.memory_calls[0].logprobs == [-0.5, -0.25]


def test_wavefront_batches_all_rollouts_in_one_call_per_engine() -> None:
    reasoner, memory = FakeEngine("reasoner"), FakeEngine("memory")
    traces = run_rollouts([make(f"t{i}") for i in range(6)], EngineSet(reasoner=reasoner, memory=memory))
    assert all(t.outcome == 1.0 for t in traces)
    assert reasoner.calls == 5 and set(reasoner.batch_sizes) == {6}
    assert memory.calls == 2 and set(memory.batch_sizes) == {6}


def test_fork_at_pending_memory_call_gives_independent_branches() -> None:
    reasoner, memory = FakeEngine("reasoner"), FakeEngine("memory")
    rollout = make()
    while rollout.pending().kind != "memory":
        rollout.advance(reasoner.generate([rollout.pending().request])[0])
    pending = rollout.pending()
    pending.request.sampling.n = 3
    result = memory.generate([pending.request])[0]
    branches = [rollout.fork(f"r.{k}") for k in range(3)]
    for k, branch in enumerate(branches):
        record = branch.advance(result, sample=k)
        assert record is not None and record.text == f"part a#{k}"
    traces = run_rollouts(branches, EngineSet(reasoner=reasoner, memory=memory))
    assert [t.events[3].observation for t in traces] == [f"part a#{k}+part b#0" for k in range(3)]
    assert len({c.call_id for t in traces for c in t.memory_calls}) == 6  # each branch names its own calls


def test_malformed_reply_is_a_counted_error_not_a_crash() -> None:
    class Garbage(FakeEngine):
        def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
            results = super().generate(requests)
            for r in results:
                r.completions[0].text = "<tool_call>{not json"
            return results

    (trace,) = run_rollouts([make()], EngineSet(reasoner=Garbage("reasoner"), memory=FakeEngine("memory")))
    assert trace.outcome == 0.0 and trace.events[-1].kind == "limit"
    assert trace.stats["reasoner_malformed"] == 10
    assert all(e.kind == "error" for e in trace.events[:-1])
