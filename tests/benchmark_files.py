"""Small files in the real formats of LoCoMo (``data/locomo10.json`` of snap-research/LoCoMo), AMA-Bench
(``open_end_qa_set.jsonl``) and MemoryArena (one JSONL per task family), written by the tests. They carry the
quirks of the released files: image turns (``img_url``, ``blip_caption``, ``query``), evidence ids separated by
spaces as well as ``;``, category-5 rows with both ``answer`` and ``adversarial_answer``, numeric answers, AMA-Bench
QA pairs without (or with a null) ``type``, turns without ``turn_idx``, list-valued answers, MemoryArena tasks
without backgrounds and with one background per subtask."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LOCOMO_FILLER = [
    "Hey, how has your week been going so far?",
    "Pretty busy, work kept me on my toes the whole time.",
    "I hear you. I finally got some rest over the weekend.",
    "That is good to hear, rest matters a lot.",
    "Yeah, I try to keep a balance these days.",
    "Same here, it is not always easy though.",
]

# (session, speaker index, text, extra fields) for the facts the questions ask about
LOCOMO_FACTS = {
    (1, 2): (0, "I went to the LGBTQ support group yesterday and it was so powerful.", {}),
    (1, 5): (1, "I painted a lake sunrise last year, it hangs in my kitchen.", {}),
    (2, 1): (
        0,
        "Look at this, I am researching adoption agencies now.",
        {
            "img_url": ["https://example.org/adoption.jpg"],
            "blip_caption": "a photo of a stack of brochures",
            "query": "adoption brochures",
        },
    ),
    (2, 4): (1, "We have 3 kids now and they keep me running.", {}),
    (3, 3): (0, "My mentor gave me a necklace from Sweden, my home country.", {}),
    (3, 6): (1, "I signed up for a pottery class on Saturday mornings.", {}),
    (4, 2): (0, "I ran a charity race for mental health on Sunday.", {}),
    (4, 5): (1, "Camping at the beach with the kids was the highlight of July.", {}),
}

LOCOMO_DATES = {
    1: "1:56 pm on 8 May, 2023",
    2: "1:14 pm on 25 May, 2023",
    3: "7:55 pm on 9 June, 2023",
    4: "10:37 am on 27 June, 2023",
}


def locomo_sample(sample_id: str = "conv-26", turns_per_session: int = 8) -> dict[str, Any]:
    """One LoCoMo sample: 4 sessions of ``turns_per_session`` utterances, facts at fixed places, 10 questions."""
    speakers = ["Caroline", "Melanie"]
    conversation: dict[str, Any] = {"speaker_a": speakers[0], "speaker_b": speakers[1]}
    for s in range(1, 5):
        conversation[f"session_{s}_date_time"] = LOCOMO_DATES[s]
        utterances = []
        for t in range(1, turns_per_session + 1):
            fact = LOCOMO_FACTS.get((s, t))
            if fact is not None:
                who, text, extra = fact
            else:
                who, text, extra = (t - 1) % 2, LOCOMO_FILLER[(s + t) % len(LOCOMO_FILLER)], {}
            utterances.append({"speaker": speakers[who], "dia_id": f"D{s}:{t}", "text": text, **extra})
        conversation[f"session_{s}"] = utterances
    qa = [
        {
            "question": "When did Caroline go to the LGBTQ support group?",
            "answer": "7 May 2023",
            "evidence": ["D1:2"],
            "category": 2,
        },
        {"question": "What did Melanie paint?", "answer": "a lake sunrise", "evidence": ["D1:5"], "category": 4},
        {"question": "How many kids does Melanie have?", "answer": 3, "evidence": ["D2:4"], "category": 4},
        {
            "question": "What is Caroline researching?",
            "answer": "adoption agencies",
            "evidence": ["D2:1"],
            "category": 4,
        },
        {
            "question": "Where did Caroline's necklace come from and what class did Melanie sign up for?",
            "answer": "Sweden, pottery class",
            "evidence": ["D3:3 D3:6"],
            "category": 1,
        },
        {
            "question": "What did Caroline run for?",
            "answer": "mental health; charity",
            "evidence": ["D4:2"],
            "category": 3,
        },
        {
            "question": "When did Melanie go camping at the beach?",
            "answer": "July 2023",
            "evidence": ["D4:5"],
            "category": 2,
        },
        {
            "question": "What did Melanie paint in her kitchen?",
            "adversarial_answer": "a lake sunrise",
            "evidence": ["D1:5"],
            "category": 5,
        },
        {
            "question": "What did Caroline's mentor give her brother?",
            "answer": "a necklace",
            "adversarial_answer": "a necklace",
            "evidence": ["D3:3"],
            "category": 5,
        },
        {
            "question": "What did Caroline share and Melanie paint?",
            "answer": "brochures, lake sunrise",
            "evidence": ["D2:1; D1:5"],
            "category": 1,
        },
    ]
    return {
        "sample_id": sample_id,
        "conversation": conversation,
        "qa": qa,
        "observation": {"session_1_observation": {"Caroline": [["Caroline attended a support group.", "D1:2"]]}},
        "session_summary": {"session_1_summary": "Caroline and Melanie talk about a support group and a painting."},
        "event_summary": {"events_session_1": {"Caroline": ["attends a support group"], "date": "8 May, 2023"}},
    }


def write_locomo(path: Path, samples: int = 1, turns_per_session: int = 8) -> Path:
    """A LoCoMo JSON file (an array of samples, as ``locomo10.json``)."""
    data = [locomo_sample(f"conv-{26 + i}", turns_per_session) for i in range(samples)]
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


def amabench_records() -> list[dict[str, Any]]:
    """Two AMA-Bench episodes with the quirks the official loader tolerates."""
    first = {
        "episode_id": 3,
        "task": "Find the key and open the chest.",
        "task_type": "textworld",
        "domain": "GAME",
        "trajectory": [
            {"turn_idx": 0, "action": "look", "observation": "You are in a kitchen. A key lies on the table."},
            {"turn_idx": 1, "action": "take key", "observation": "You take the brass key."},
            {"turn_idx": 2, "action": "go north", "observation": "You enter the hall. A chest stands here."},
            {"turn_idx": 3, "action": "open chest", "observation": "The chest opens; it holds a turn-left map."},
        ],
        "qa_pairs": [
            {"question": "What did the agent take?", "answer": "the brass key", "type": "A", "needle_turns": [1]},
            {"question": "Which room holds the chest?", "answer": "hall", "needle_turns": [2]},
            {"question": "What does the chest hold?", "answer": "turn-left map", "type": None},
            {"question": "Which objects did the agent see?", "answer": ["key", "chest"], "type": "D"},
        ],
    }
    second = {
        "episode_id": "ep-9",
        "task": "Book a table.",
        "trajectory": [
            {"action": "search restaurants", "observation": "Found: Luigi's (4.5 stars), Sakura (4.8 stars)."},
        ],
        "qa_pairs": [{"question": "Which restaurant had the higher rating?", "answer": "Sakura", "type": "B"}],
    }
    return [first, second]


def write_amabench(path: Path) -> Path:
    """An AMA-Bench JSONL file (one episode per line)."""
    path.write_text("\n".join(json.dumps(r) for r in amabench_records()) + "\n", encoding="utf-8")
    return path


def memoryarena_records() -> list[dict[str, Any]]:
    """A formal-reasoning task (one background per subtask, extra ``paper_name``), a travel-planner task (one
    background for all subtasks, extra ``base_person``) and a progressive-search task without backgrounds."""
    return [
        {
            "id": 0,
            "paper_name": "paper-17",
            "backgrounds": ["Let f(x) = 2x + 1 on the integers.", "Let g(x) = f(x) squared."],
            "questions": ["What is f(3)?", "What is g(3)?"],
            "answers": ["7", "49"],
        },
        {
            "id": 1,
            "base_person": {"name": "Jennifer", "query": "Plan a 3-day trip from St. Petersburg to Rockford."},
            "backgrounds": "Jennifer travels from St. Petersburg to Rockford for 3 days with a budget of 1700 dollars.",
            "questions": ["Which city does Jennifer start from?", "How many days does the trip last?"],
            "answers": ["St. Petersburg", "3"],
        },
        {
            "id": 2,
            "questions": ["Find the author of the 2019 survey on agent memory.", "Which university is that author at?"],
            "answers": ["Ana Smith", ["MIT", "Massachusetts Institute of Technology"]],
        },
    ]


def write_memoryarena(path: Path) -> Path:
    """A MemoryArena JSONL file."""
    path.write_text("\n".join(json.dumps(r) for r in memoryarena_records()) + "\n", encoding="utf-8")
    return path
