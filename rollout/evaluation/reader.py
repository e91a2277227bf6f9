"""The programmatic reader (:class:`EvidenceReader`, the default reasoner offline) and the evidence of a question.

It answers with the gold answer exactly when the question's evidence is in its context, else says the answer is not
mentioned in its context. The evidence of a question is, in this order: the QA pair's ``metadata.evidence`` strings
(the synthetic generator's needle evidence: all must be present); else the observations of its needle turns
(AMA-Bench ``needle_turns``, LoCoMo evidence ids: all must be present); else any one of its gold answers. Presence is
a case- and whitespace-insensitive substring test over every non-system message, with the question text removed.
Before answering it uses the system's retrieval tool when the system prompt offers one (``memory(intent[,
page_ids])``, ``memory(query)``, ``retrieve(query)``) up to ``budget`` times while the evidence is missing; for SAM it
picks the pages whose cues share the most terms with the question. Its score therefore measures what the memory
surfaced to the reasoner, not language ability; a model reasoner (any engine) replaces it for the latter.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from memrl.data.config import ConfigModel
from memrl.data.formats import (
    parse_sam_memory_block,
    render_tool_call,
)
from memrl.data.schemas import Episode, QAPair
from memrl.data.tasks.common import content_of, role_of
from memrl.rollout.evaluation.text import normalised, stems

__all__ = [
    "NOT_IN_CONTEXT",
    "Evidence",
    "EvidenceReader",
    "ReaderConfig",
    "ReaderQuestion",
    "golds_of",
    "question_evidence",
]


NOT_IN_CONTEXT = "not mentioned in my context"


@dataclass
class Evidence:
    """What must be in the reasoner's context for the reader to know the answer: all of ``all_of`` and, when
    ``any_of`` is not empty, at least one of it."""

    all_of: list[str] = field(default_factory=list)
    any_of: list[str] = field(default_factory=list)

    def strings(self) -> list[str]:
        """Every evidence string (for the ``evidence_in_context`` share)."""
        return self.all_of or self.any_of

    def found(self, context: str) -> bool:
        """Whether the evidence is in ``context`` (normalised substring tests)."""
        text = normalised(context)
        if not all(normalised(s) in text for s in self.all_of):
            return False
        return not self.any_of or any(normalised(s) in text for s in self.any_of)

    def share(self, context: str) -> float:
        """The share of evidence strings present in ``context`` (1.0 when an any-of string is)."""
        text = normalised(context)
        if self.all_of:
            return sum(normalised(s) in text for s in self.all_of) / len(self.all_of)
        return float(any(normalised(s) in text for s in self.any_of)) if self.any_of else 0.0


def golds_of(qa: QAPair) -> list[str]:
    """The gold answer and its alternatives (MemoryArena lists them in ``metadata.alternatives``)."""
    alternatives = qa.metadata.get("alternatives")
    out = [qa.answer]
    if isinstance(alternatives, list):
        out += [str(a) for a in alternatives if str(a) not in out]
    return out


def question_evidence(episode: Episode, qa: QAPair) -> Evidence:
    """The question's evidence (see the module docstring for the order of sources)."""
    meta = qa.metadata.get("evidence")
    if isinstance(meta, dict) and meta:
        strings = [str(s) for values in meta.values() for s in (values if isinstance(values, list) else [values])]
        if strings:
            return Evidence(all_of=strings)
    if qa.needle_turns:
        by_index = {t.turn_idx: t.observation for t in episode.trajectory}
        needles = [by_index[n] for n in qa.needle_turns if n in by_index]
        if needles:
            return Evidence(all_of=needles)
    return Evidence(any_of=golds_of(qa))


class ReaderConfig(ConfigModel):
    """The programmatic reader's knobs."""

    budget: int = Field(2, ge=0, description="retrieval-tool calls per question at most")
    max_pages: int = Field(2, ge=1, description="SAM page ids per memory call")


@dataclass
class ReaderQuestion:
    """What the reader knows about one question: the gold answer, its evidence and the step it was asked at."""

    question: str
    answer: str
    evidence: Evidence
    asked_at: int


_TOOL_SIGNATURE = re.compile(r"\b(memory|retrieve)\(([\w, ]*)\)")


class EvidenceReader:
    """The programmatic reasoner of QA mode (a :class:`~memrl.data.schemas.ScriptedPolicy`; see the module docstring).
    Questions are registered by (task id, rollout id), the keys the agent loop puts in every reasoner request."""

    name = "evidence-reader"

    def __init__(self, config: ReaderConfig | None = None) -> None:
        self.config = config or ReaderConfig()
        self.questions: dict[tuple[str, str], ReaderQuestion] = {}

    def register(self, task_id: str, rollout_id: str, question: ReaderQuestion) -> None:
        """Tell the reader the gold answer and evidence of the question a rollout asks."""
        self.questions[(task_id, rollout_id)] = question

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        """A retrieval-tool call while the evidence is missing and the budget lasts, else the answer."""
        entry = self.questions.get((str(metadata.get("task_id")), str(metadata.get("rollout_id"))))
        if entry is None:
            return render_tool_call("answer", {"answer": NOT_IN_CONTEXT})
        system = next((content_of(m) for m in messages if role_of(m) == "system"), "")
        context = "\n".join(content_of(m) for m in messages if role_of(m) != "system").replace(entry.question, " ")
        if entry.evidence.found(context):
            return render_tool_call("answer", {"answer": entry.answer})
        attempt = int(metadata.get("step", 0)) - entry.asked_at
        tool = _TOOL_SIGNATURE.search(system)
        if tool is not None and attempt < self.config.budget:
            call = self._tool_call(
                tool.group(1),
                [p.strip() for p in tool.group(2).split(",") if p.strip()],
                entry.question,
                messages,
                attempt,
            )
            if call is not None:
                return call
        return render_tool_call("answer", {"answer": NOT_IN_CONTEXT})

    def _tool_call(self, name: str, params: list[str], question: str, messages: list[Any], attempt: int) -> str | None:
        if not params:
            return None
        arguments: dict[str, Any] = {params[0]: question}
        if "page_ids" in params:
            cues: dict[int, str] = {}
            for m in messages:
                if role_of(m) == "user" and content_of(m).startswith("task: "):
                    cues = parse_sam_memory_block(content_of(m))[1]
                    break
            if not cues:
                return None
            wanted = stems(question)
            ranked = sorted(cues, key=lambda p: (-len(wanted & stems(cues[p])), -p))
            k = self.config.max_pages
            chosen = ranked[attempt * k : (attempt + 1) * k]
            if not chosen:
                return None
            arguments["page_ids"] = sorted(chosen)
        return render_tool_call(name, arguments)
