"""Loaders of public benchmark formats into :class:`~data.schemas.Episode`: AMA-Bench, LoCoMo, MemoryArena, and
generic JSONL / parquet episodes. Each validates every record and fails on the first problem with the file, the
line (or row) and the field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from data.loaders.common import read_records
from data.schemas import Episode

__all__ = ["LOADERS", "load_amabench", "load_generic", "load_locomo", "load_memoryarena"]

_AMA_QA_FIELDS = {"question", "answer", "type", "needle_turns", "qa_id"}
_AMA_FIELDS = {"episode_id", "task", "task_type", "domain", "trajectory", "qa_pairs"}


def load_amabench(path: str | Path) -> list[Episode]:
    """AMA-Bench episodes: ``episode_id, task, task_type, domain, trajectory[{turn_idx, action, observation}],
    qa_pairs[{question, answer, type, ...}]``; other fields go to ``metadata``."""
    out = []
    for where, obj in read_records(path):
        turns = []
        for i, turn in enumerate(where.get(obj, "trajectory", list)):
            prefix = f"trajectory[{i}]."
            if not isinstance(turn, dict):
                raise where.error(f"trajectory[{i}]", "expected an object")
            turns.append(
                {
                    "turn_idx": where.get(turn, "turn_idx", int, prefix),
                    "action": where.text(turn, "action", prefix),
                    "observation": where.text(turn, "observation", prefix),
                }
            )
        if not turns:
            raise where.error("trajectory", "empty trajectory")
        qas = []
        for i, qa in enumerate(where.get(obj, "qa_pairs", list)):
            prefix = f"qa_pairs[{i}]."
            if not isinstance(qa, dict):
                raise where.error(f"qa_pairs[{i}]", "expected an object")
            qas.append(
                {
                    "question": where.text(qa, "question", prefix),
                    "answer": where.text(qa, "answer", prefix),
                    "type": where.text(qa, "type", prefix),
                    "needle_turns": where.int_list(qa, "needle_turns", prefix),
                    "qa_id": where.optional_text(qa, "qa_id", None, prefix),
                    "metadata": {k: v for k, v in qa.items() if k not in _AMA_QA_FIELDS},
                }
            )
        data = {
            "episode_id": where.text(obj, "episode_id"),
            "task": where.text(obj, "task"),
            "task_type": where.optional_text(obj, "task_type", ""),
            "domain": where.optional_text(obj, "domain", ""),
            "trajectory": turns,
            "qa_pairs": qas,
            "metadata": {"source": "amabench", **{k: v for k, v in obj.items() if k not in _AMA_FIELDS}},
        }
        out.append(where.episode(data))
    return out


LOCOMO_CATEGORIES = {1: "multi_hop", 2: "temporal", 3: "open_domain", 4: "single_hop", 5: "adversarial"}
LOCOMO_NOT_MENTIONED = "Not mentioned in the conversation"
_SESSION = re.compile(r"session_(\d+)\Z")


def load_locomo(path: str | Path) -> list[Episode]:
    """LoCoMo samples (``sample_id, conversation{speaker_a, speaker_b, session_N_date_time, session_N[{speaker,
    dia_id, text}]}, qa[{question, answer | adversarial_answer, evidence[dia_id], category 1-5}]``).

    Each utterance is a turn (action: the speaker, observation: the text); a session's first turn carries its date.
    Category 5 (adversarial) questions have the gold answer "Not mentioned in the conversation" and keep the trap
    answer in ``metadata.adversarial_answer``. Evidence ids become needle turns.
    """
    out = []
    for where, obj in read_records(path):
        sample_id = where.text(obj, "sample_id")
        conv = where.get(obj, "conversation", dict)
        where.get(conv, "speaker_a", str, "conversation.")
        where.get(conv, "speaker_b", str, "conversation.")
        sessions = sorted((int(m.group(1)), k) for k in conv if (m := _SESSION.match(k)))
        turns: list[dict[str, Any]] = []
        by_dia: dict[str, int] = {}
        dates: dict[str, str] = {}
        for number, key in sessions:
            date_key = f"{key}_date_time"
            date = where.text(conv, date_key, "conversation.") if date_key in conv else ""
            dates[str(number)] = date
            for i, utt in enumerate(where.get(conv, key, list, "conversation.")):
                prefix = f"conversation.{key}[{i}]."
                if not isinstance(utt, dict):
                    raise where.error(f"conversation.{key}[{i}]", "expected an object")
                speaker = where.text(utt, "speaker", prefix)
                dia_id = where.text(utt, "dia_id", prefix)
                text = where.text(utt, "text", prefix)
                if i == 0 and date:
                    text = f"[{date}] {text}"
                by_dia[dia_id] = len(turns)
                turns.append({"turn_idx": len(turns), "action": speaker, "observation": text})
        if not turns:
            raise where.error("conversation", "empty trajectory (no session_N utterances)")
        qas = []
        for i, qa in enumerate(where.get(obj, "qa", list)):
            prefix = f"qa[{i}]."
            if not isinstance(qa, dict):
                raise where.error(f"qa[{i}]", "expected an object")
            category = where.get(qa, "category", int, prefix)
            if category not in LOCOMO_CATEGORIES:
                raise where.error(f"{prefix}category", f"expected 1-5, got {category}")
            meta: dict[str, Any] = {"category": category}
            if "answer" in qa:
                answer = where.text(qa, "answer", prefix)
            elif "adversarial_answer" in qa:
                meta["adversarial_answer"] = where.text(qa, "adversarial_answer", prefix)
                answer = LOCOMO_NOT_MENTIONED
            else:
                raise where.error(f"{prefix}answer", "missing (and no adversarial_answer)")
            # LoCoMo joins several ids in one entry ("D2:1; D1:2"); a non-string entry is a broken file, not noise.
            evidence = where.str_list(qa, "evidence", prefix)
            ids = [p.strip() for e in evidence for p in e.split(";") if p.strip()]
            unresolved = [d for d in ids if d not in by_dia]
            if unresolved:
                meta["unresolved_evidence"] = unresolved
            qas.append(
                {
                    "question": where.text(qa, "question", prefix),
                    "answer": answer,
                    "type": LOCOMO_CATEGORIES[category],
                    "needle_turns": sorted({by_dia[d] for d in ids if d in by_dia}),
                    "qa_id": f"{sample_id}/q{i}",
                    "metadata": meta,
                }
            )
        data = {
            "episode_id": sample_id,
            "task": f"conversation between {conv['speaker_a']} and {conv['speaker_b']}",
            "task_type": "conversation",
            "domain": "locomo",
            "trajectory": turns,
            "qa_pairs": qas,
            "metadata": {"source": "locomo", "session_dates": dates, "dia_ids": list(by_dia)},
        }
        out.append(where.episode(data))
    return out


def load_memoryarena(path: str | Path) -> list[Episode]:
    """MemoryArena records (``id, questions[], answers[], backgrounds``): each background (a string or a list of
    strings) is a turn; questions and answers pair up by position (an answer list keeps its alternatives)."""
    out = []
    for where, obj in read_records(path):
        rid = where.text(obj, "id")
        questions = where.get(obj, "questions", list)
        answers = where.get(obj, "answers", list)
        if len(questions) != len(answers):
            raise where.error("answers", f"{len(answers)} answers for {len(questions)} questions")
        backgrounds = where.get(obj, "backgrounds", (str, list))
        if isinstance(backgrounds, str):
            backgrounds = [backgrounds]
        turns = []
        for i, bg in enumerate(backgrounds):
            if not isinstance(bg, str):
                raise where.error(f"backgrounds[{i}]", "expected a string")
            turns.append({"turn_idx": i, "action": "read background", "observation": bg})
        if not turns:
            raise where.error("backgrounds", "empty trajectory")
        qas = []
        for i, (q, a) in enumerate(zip(questions, answers, strict=True)):
            if not isinstance(q, str):
                raise where.error(f"questions[{i}]", "expected a string")
            meta: dict[str, Any] = {}
            if isinstance(a, list):
                if not a or not all(isinstance(x, (str, int, float)) and not isinstance(x, bool) for x in a):
                    raise where.error(f"answers[{i}]", "expected a string, a number or a non-empty list of them")
                meta["alternatives"] = [str(x) for x in a]
                a = a[0]
            if isinstance(a, bool) or not isinstance(a, (str, int, float)):
                raise where.error(f"answers[{i}]", "expected a string or a number")
            qas.append({"question": q, "answer": str(a), "type": "memoryarena", "qa_id": f"{rid}/q{i}",
                        "metadata": meta})
        data = {
            "episode_id": rid,
            "task": where.optional_text(obj, "task", "answer the questions from the background"),
            "task_type": "memoryarena",
            "domain": "memoryarena",
            "trajectory": turns,
            "qa_pairs": qas,
            "metadata": {"source": "memoryarena"},
        }
        out.append(where.episode(data))
    return out


def load_generic(path: str | Path, fields: dict[str, str] | None = None) -> list[Episode]:
    """Episodes already in our schema, from JSONL, JSON or parquet; ``fields`` renames source columns to
    :class:`Episode` fields (``{"id": "episode_id", "turns": "trajectory"}``)."""
    out = []
    for where, obj in read_records(path):
        data = {(fields or {}).get(k, k): v for k, v in obj.items()}
        out.append(where.episode(data))
    return out


LOADERS = {
    "amabench": load_amabench,
    "locomo": load_locomo,
    "memoryarena": load_memoryarena,
    "generic": load_generic,
}
"""Format name -> loader."""
