"""The agent loop's state machine: memory calls before reasoner calls, tool round trips, forking, wavefronts."""

from __future__ import annotations

from fakes import CountEnv, FakeEngine, RecallAwareMemory

from memrl.rollout.engines.base import GenerationRequest, GenerationResult
from memrl.rollout.loop import EngineSet, Rollout, run_rollouts


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
