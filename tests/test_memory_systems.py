"""Behaviour every memory system shares, parametrised over the systems (their cases live in their own test files)."""

from __future__ import annotations

import pytest
import test_memory_ama
import test_memory_mage
import test_memory_memma
from fakes import QACase, RecordingEngine

from memrl.rollout.loop import EngineSet, Rollout, run_rollouts
from memrl.rollout.memory.workflow import feed_episode

QA_CASES = {"ama_agent": test_memory_ama.QA_CASE, "mage": test_memory_mage.QA_CASE, "memma": test_memory_memma.QA_CASE}


@pytest.mark.parametrize("system", sorted(QA_CASES))
def test_question_answering_mode_through_the_loop(system: str) -> None:
    """Fed a trajectory and a question, the system makes exactly the memory-model calls of its algorithm, the
    reasoner's last prompt ends with the question, and the answer comes out of what the system surfaced."""
    case: QACase = QA_CASES[system]
    reasoner, memory = RecordingEngine(case.script, "reasoner"), RecordingEngine(case.script, "memory")
    rollout = Rollout(case.env(), case.memory(), reasoner_system="", rollout_id="q")
    feed_episode(rollout.memory, case.turns, case.question)
    (trace,) = run_rollouts([rollout], EngineSet(reasoner=reasoner, memory=memory))
    assert trace.answer == case.answer
    assert [c.role for c in trace.memory_calls] == case.roles
    assert [r.metadata["role"] for r in memory.requests] == case.roles  # every call the engine answered is recorded
    assert reasoner.prompts[-1].endswith(f"question: {case.question}")
    for fragment in case.prompt_has:
        assert fragment in reasoner.prompts[-1], fragment


GARBAGE = ["", "%%%%", '<tool_call>{"name": "memory"', "   ", "ADD:", "INSUFFICIENT: nowhere"]


@pytest.mark.parametrize("system", sorted(QA_CASES))
def test_garbage_from_the_memory_model_never_crashes_the_loop(system: str) -> None:
    """Whatever the memory model replies, the rollout finishes and every reply is kept as a memory call."""
    case: QACase = QA_CASES[system]
    replies = iter(GARBAGE * 50)
    reasoner = RecordingEngine(case.script, "reasoner")
    memory = RecordingEngine(lambda last, metadata: next(replies), "memory")
    rollout = Rollout(case.env(), case.memory(), reasoner_system="", rollout_id="g")
    feed_episode(rollout.memory, case.turns, case.question)
    (trace,) = run_rollouts([rollout], EngineSet(reasoner=reasoner, memory=memory))
    assert trace.events and trace.events[-1].kind in ("answer", "limit")
    assert [c.text for c in trace.memory_calls] == [r.completions[0].text for r in memory.results]
    assert memory.requests  # the system did ask its memory model
