"""The real-text task family for SmolLM2 (``dialogue``): SAM episodes told as English conversations (fast, no model)."""

from __future__ import annotations

import itertools
import re

from memrl.data.experts.sam import SamOracle
from memrl.data.tasks import TASK_FAMILIES, DialogueParams, DialogueTask, TaskSetConfig, load_tasks, make_task
from memrl.data.tasks.dialogue import DIALOGUE_SPLITS
from memrl.data.tasks.sam import SamReasoner, SamTask, SamTaskParams, parse_facts
from memrl.data.tasks.sam_reference import simulate_sam

PARAMS = dict(horizon_steps=8, facts_per_obs=1, containers_per_room=2, repeat_evidence_frac=0.5)
SPEECH = re.compile(r"^[A-Z][a-z]+: ")


def _texts(task: DialogueTask) -> list[str]:
    out = [task.reset()]
    for action in task.tour:
        out.append(task.step(action)[0])
    return out


def test_registered_and_rebuilt_from_its_spec() -> None:
    reg = TASK_FAMILIES.get("dialogue")
    assert reg.obj is DialogueTask and reg.extra["reasoner"] == "sam" and reg.extra["memory"] == "sam"
    task = DialogueTask(DialogueParams(**PARAMS), seed=7, task_id="d7")
    again = make_task(task.spec, "d7")
    assert isinstance(again, DialogueTask) and again.family == "dialogue"
    assert _texts(again) == _texts(DialogueTask(DialogueParams(**PARAMS), seed=7))
    tasks = load_tasks(TaskSetConfig(family="dialogue", count=3, seed=DIALOGUE_SPLITS["test"], dialogue=PARAMS), "t")
    assert [t.task_id for t in tasks] == [f"t-{DIALOGUE_SPLITS['test'] + i}" for i in range(3)]
    assert all(isinstance(t, DialogueTask) for t in tasks)


def test_same_world_and_question_as_the_sam_task_but_english_text() -> None:
    for seed in range(10):
        dialogue = DialogueTask(DialogueParams(**PARAMS), seed=seed)
        sam = SamTask(SamTaskParams(**PARAMS), seed=seed)
        assert (dialogue.question, dialogue.answer, dialogue.tour) == (sam.question, sam.answer, sam.tour)
        texts = _texts(dialogue)
        lines = [line for text in texts for line in text.split("\n") if not line.startswith(("next:", "question:"))]
        speech = [line for line in lines if SPEECH.match(line)]
        assert len(speech) >= 0.6 * len(lines)  # mostly conversation
        assert not any(line.startswith(("you ", "exits:")) for line in lines)  # no raw text-world lines left
        # Every fact of the text-world tour is still stated, once per sentence, in a form the reasoner reads.
        sam_facts = parse_facts("\n".join(_texts(sam)))
        dialogue_facts = parse_facts("\n".join(texts))
        assert dialogue_facts.location == sam_facts.location and dialogue_facts.opener == sam_facts.opener
        assert texts[-1].endswith(f"question: {dialogue.question}")


def test_snapshot_restore_reads_the_same() -> None:
    task = DialogueTask(DialogueParams(**PARAMS), seed=3)
    task.reset()
    task.step(task.tour[0])
    snap = task.snapshot()
    first = task.step(task.tour[1])[0]
    task.restore(snap)
    assert task.step(task.tour[1])[0] == first


def test_needs_memory_and_the_oracle_solves_it() -> None:
    solved = unaided = 0
    seeds = range(DIALOGUE_SPLITS["dev"], DIALOGUE_SPLITS["dev"] + 30)
    for seed in seeds:
        solved += simulate_sam(
            DialogueTask(DialogueParams(**PARAMS), seed=seed),
            SamReasoner(),
            SamOracle(),
            live_turns=4,
            page_turns=1,
            seed=seed,
        ).outcome
        unaided += simulate_sam(
            DialogueTask(DialogueParams(**PARAMS), seed=seed),
            SamReasoner(),
            None,
            live_turns=4,
            page_turns=1,
            seed=seed,
        ).outcome
    assert solved >= 27, solved
    assert unaided <= 3, unaided


def test_splits_are_disjoint() -> None:
    starts = sorted(DIALOGUE_SPLITS.values())
    assert all(b - a >= 100_000 for a, b in itertools.pairwise(starts))
