"""Behaviour every memory system shares, parametrised over the registered systems (their cases live in their own test
files), with the one shared fake engine (:class:`fakes.RecordingEngine`)."""

from __future__ import annotations

import pytest
import test_memory_ama
import test_memory_baselines
import test_memory_mage
import test_memory_memma
import test_memory_proactive
import test_memory_sam
from fakes import QACase, RecordingEngine

from memrl.data.tasks.common import content_of
from memrl.rollout.evaluation.qa import ReplayEnv, run_qa
from memrl.rollout.loop import EngineSet, Rollout, run_rollouts
from memrl.rollout.memory.embedders import HashingEmbedder
from memrl.rollout.memory.registry import build_memory, memory_names
from memrl.rollout.memory.workflow import feed_episode

QA_CASES: dict[str, QACase] = {
    "ama_agent": test_memory_ama.QA_CASE,
    "mage": test_memory_mage.QA_CASE,
    "memma": test_memory_memma.QA_CASE,
    "sam": test_memory_sam.QA_CASE,
    "proactive": test_memory_proactive.QA_CASE,
    **test_memory_baselines.QA_CASES,
}
CALLS_A_MEMORY_MODEL = sorted(name for name, case in QA_CASES.items() if case.roles)


def test_every_registered_system_has_a_case() -> None:
    # every system of memrl's agent loop (external is an episode function's or an HTTP agent's own memory)
    assert sorted(QA_CASES) == [n for n in memory_names(builtin_only=True) if n != "external"]
    assert all(case.memory["name"] == name for name, case in QA_CASES.items())


@pytest.mark.parametrize("system", sorted(QA_CASES))
def test_question_answering_mode_through_the_harness(system: str) -> None:
    """Fed a trajectory and a question by the harness, the system makes exactly the memory-model calls of its
    algorithm, the question reaches the reasoner's last prompt, and the answer comes out of what the system
    surfaced."""
    case = QA_CASES[system]
    reasoner, memory = RecordingEngine(case.script, "reasoner"), RecordingEngine(case.script, "memory")
    (record,) = run_qa(
        [case.episode()],
        case.memory,
        EngineSet(reasoner=reasoner, memory=memory),
        dataset="case",
        system=system,
        model="scripted",
        embedder=HashingEmbedder(),
    )
    assert record["answer"] == case.answer
    assert [r.metadata["role"] for r in memory.requests] == case.roles  # every call the engine answered
    prompt = "\n".join(content_of(m) for m in reasoner.requests[-1].messages)
    assert f"question: {case.question}" in prompt
    for fragment in case.prompt_has:
        assert fragment in prompt, fragment


GARBAGE = ["", "%%%%", '<tool_call>{"name": "memory"', "   ", "ADD:", "INSUFFICIENT: nowhere"]


@pytest.mark.parametrize("system", CALLS_A_MEMORY_MODEL)
def test_garbage_from_the_memory_model_never_crashes_the_loop(system: str) -> None:
    """Whatever the memory model replies, the rollout finishes and every reply is kept as a memory call."""
    case = QA_CASES[system]
    replies = iter(GARBAGE * 50)
    reasoner = RecordingEngine(case.script, "reasoner")
    memory = RecordingEngine(lambda last, metadata: next(replies), "memory")
    rollout = Rollout(
        ReplayEnv(case.episode()),
        build_memory(case.memory, embedder=HashingEmbedder()),
        reasoner_system="",
        rollout_id="g",
    )
    feed_episode(rollout.memory, case.turns, case.question)
    (trace,) = run_rollouts([rollout], EngineSet(reasoner=reasoner, memory=memory))
    assert trace.events and trace.events[-1].kind in ("answer", "limit")
    assert [c.text for c in trace.memory_calls] == [r.completions[0].text for r in memory.results]
    assert memory.requests  # the system did ask its memory model
