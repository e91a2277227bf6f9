"""The extractive memory model (:class:`ExtractiveMemoryModel`, the default memory model of QA mode): a scripted model
without ground truth that answers every memory role of every system with extractive text.

SAM cues list the page's rarest entities (on a conversation page the facts, not the small talk) and recalls keep the
page lines that match the intent best (stemmed terms, weighted by how rare they are on the page), both within SAM's
output budgets; Mage summaries keep each step's action and the start of its observation and Maintain passes;
AMA-Agent records each turn's observation as its state and checks sufficiency by term coverage; MemMA adds one entry
per turn line, critiques by term coverage, and answers with the best-matching evidence line; the proactive agent
saves window steps as knowledge and reminds with entries that share terms with the newest step. It makes a
side-by-side run possible offline; any engine replaces it.
"""

from __future__ import annotations

import random
import re
from typing import Any

from memrl.data.formats import (
    NOTHING_RELEVANT,
    parse_phase_prompt,
    parse_sam_consolidate_prompt,
    parse_sam_recall_prompt,
    parse_window,
    render_tool_call,
)
from memrl.data.tasks.common import content_of
from memrl.rollout.evaluation.text import STOPWORDS, WORD_PATTERN, stems, terms

__all__ = ["ExtractiveMemoryModel"]


_STEP_MARK = re.compile(r"t\d+")  # the ``tN>`` turn markers of SAM pages


def _between(text: str, start: str, end: str) -> str:
    m = re.search(re.escape(start) + r"(.*?)" + re.escape(end), text, re.DOTALL)
    return m.group(1).strip() if m else ""


def _entities(text: str, limit: int = 12) -> list[str]:
    """Noun-like phrases: a word followed by a number (``chest 4``) or a content word, in order, deduplicated."""
    words = WORD_PATTERN.findall(text.lower())
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if i + 1 < len(words) and words[i + 1].isdigit() and not word.isdigit():
            phrase = f"{word} {words[i + 1]}"
            i += 2
        else:
            phrase = word
            i += 1
        if phrase not in STOPWORDS and not phrase.isdigit() and len(phrase) > 2 and phrase not in out:
            out.append(phrase)
        if len(out) >= limit:
            break
    return out


def _fit(parts: list[str], sep: str, chars: int) -> str:
    """``parts`` joined by ``sep``, as many leading ones as fit in ``chars`` characters."""
    out = ""
    for part in parts:
        joined = f"{out}{sep}{part}" if out else part
        if len(joined) > chars:
            break
        out = joined
    return out


def _fit_indices(order: list[int], lines: list[str], chars: int) -> list[int]:
    """Indices of ``lines`` taken in ``order`` while their joined length fits in ``chars``."""
    taken, used = [], 0
    for i in order:
        if used + len(lines[i]) + 1 > chars:
            continue
        taken.append(i)
        used += len(lines[i]) + 1
    return taken


def _salient_entities(text: str, limit: int = 16) -> list[str]:
    """The page's entities (:func:`_entities`), the rarest on the page first: on a conversation page the names
    and small talk recur while the facts occur once, and a cue cut to its token budget should keep the facts."""
    found = [e for e in _entities(text, limit=10_000) if not _STEP_MARK.fullmatch(e)]
    counts: dict[str, int] = {}
    for word in WORD_PATTERN.findall(text.lower()):
        counts[word] = counts.get(word, 0) + 1
    rank = {e: (max(counts.get(w, 0) for w in e.split()), i) for i, e in enumerate(found)}
    return sorted(found, key=lambda e: rank[e])[:limit]


def _best_lines(text: str, query: str, limit: int) -> list[str]:
    """The lines of ``text`` that match ``query`` best, at most ``limit``, in page order. A shared (stemmed) term
    weighs the inverse of the number of lines holding it, so a speaker's name on every other line counts little
    beside the one line that holds the asked-about word."""
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    line_stems = [stems(line) for line in lines]
    wanted = stems(query)
    df: dict[str, int] = {}
    for found in line_stems:
        for t in found & wanted:
            df[t] = df.get(t, 0) + 1
    scores = [sum(1 / df[t] for t in found & wanted) for found in line_stems]
    best = max(scores, default=0.0)
    if best <= 0:
        return []
    ranked = sorted((i for i, v in enumerate(scores) if v >= best / 2), key=lambda i: (-scores[i], i))[:limit]
    return [lines[i] for i in sorted(ranked)]


def _relevant_lines(text: str, query: str) -> list[str]:
    wanted = set(terms(query))
    return [line.strip() for line in text.split("\n") if line.strip() and wanted & set(terms(line))]


def _coverage(query: str, evidence: str) -> tuple[float, list[str]]:
    wanted = terms(query)
    have = set(terms(evidence))
    missing = [t for t in wanted if t not in have]
    return (1.0 - len(missing) / len(wanted)) if wanted else 1.0, missing


class ExtractiveMemoryModel:
    """A scripted memory model for every role of every memory system (see the module docstring); it never sees
    ground truth. ``sufficient`` is the share of question terms the evidence must cover to be judged sufficient."""

    name = "extractive"

    def __init__(
        self, sufficient: float = 0.6, max_lines: int = 8, cue_chars: int = 96, recall_chars: int = 200
    ) -> None:
        self.sufficient = sufficient
        self.max_lines = max_lines
        # SAM's default budgets are 64 (cue) and 128 (recall) tokens and an output cut there is an error: the
        # scripted model stays under them even with the tiny model's 1k-token vocabulary (under 2 characters a token)
        self.cue_chars = cue_chars
        self.recall_chars = recall_chars

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        """The extractive answer to the role's prompt (empty text for a prompt it does not know)."""
        role = str(metadata.get("role", ""))
        user = content_of(messages[-1]) if messages else ""
        handler = getattr(self, f"_{role}", None)
        if handler is not None:
            return str(handler(messages, user))
        return ""

    # SAM
    def _consolidate(self, messages: list[Any], user: str) -> str:
        parsed = parse_sam_consolidate_prompt(messages)
        return _fit(_salient_entities(parsed[1] if parsed else user), ", ", self.cue_chars) or "nothing notable"

    def _recall(self, messages: list[Any], user: str) -> str:
        parsed = parse_sam_recall_prompt(messages)
        if parsed is None:
            return NOTHING_RELEVANT
        intent, _, page_text, so_far = parsed
        lines = [line for line in so_far.split("\n") if line.strip()]
        lines += [line for line in _best_lines(page_text, intent, self.max_lines) if line not in lines]
        # the best-matching lines that fit the role's output budget, kept in reading order
        wanted = stems(intent)
        ranked = sorted(range(len(lines)), key=lambda i: (-len(wanted & stems(lines[i])), i))
        chosen = set(_fit_indices(ranked, lines, self.recall_chars))
        kept = [line for i, line in enumerate(lines) if i in chosen]
        return "\n".join(kept) if kept else NOTHING_RELEVANT

    # Mage
    def _mage_compress(self, messages: list[Any], user: str) -> str:
        steps = _between(user, "steps:\n", "\nsummary:")
        parts = []
        for line in steps.split("\n"):
            head, _, observation = line.partition(" -> ")
            first = observation.split(".")[0].strip()
            parts.append(f"{head.strip()}: {first}" if first else head.strip())
        return "; ".join(p for p in parts if p) or "no steps"

    def _mage_maintain(self, messages: list[Any], user: str) -> str:
        return "PASS"

    # AMA-Agent
    def _ama_graph_build(self, messages: list[Any], user: str) -> str:
        current = _between(user, "current turn: ", "\nrecent states:")
        state = " ".join(current.split())[:300]
        return f"state: {state or 'unchanged'}\ncauses: none\nobjects: {', '.join(_entities(current)) or 'none'}"

    def _ama_sufficiency(self, messages: list[Any], user: str) -> str:
        question = _between(user, "question: ", "\nevidence:")
        share, missing = _coverage(question, _between(user, "evidence:\n", "\nverdict:"))
        return "SUFFICIENT" if share >= self.sufficient else f"INSUFFICIENT: keyword {', '.join(missing)}"

    def _ama_keyword_script(self, messages: list[Any], user: str) -> str:
        question = _between(user, "question: ", "\nmissing:")
        return "keywords: " + ", ".join(terms(question)[:6])

    # MemMA
    def _memma_meta_think(self, messages: list[Any], user: str) -> str:
        if user.rstrip().endswith("guidance:"):
            return "retain every new fact with its turn; drop nothing."
        question = _between(user, "question: ", "\nqueries so far:")
        share, missing = _coverage(question, _between(user, "evidence:\n", "\nverdict:"))
        return "ANSWERABLE" if share >= self.sufficient else f"NOT ANSWERABLE: missing {', '.join(missing)}"

    def _memma_manage(self, messages: list[Any], user: str) -> str:
        chunk = _between(user, "new chunk:\n", "\nedits:")
        lines = [line.strip() for line in chunk.split("\n") if line.strip()]
        return "\n".join(f"ADD: {line}" for line in lines) or "NONE"

    def _memma_query(self, messages: list[Any], user: str) -> str:
        question = _between(user, "question: ", "\nqueries so far:")
        diagnosis = _between(user + "\n", "diagnosis: ", "\n")
        return " ".join(dict.fromkeys(terms(question) + terms(diagnosis)))

    def _memma_answer(self, messages: list[Any], user: str) -> str:
        question = _between(user, "question: ", "\nevidence:")
        lines = _relevant_lines(_between(user, "evidence:\n", "\nanswer:"), question)
        wanted = set(terms(question))
        return max(lines, key=lambda line: len(wanted & set(terms(line))), default="unknown")

    def _memma_probe(self, messages: list[Any], user: str) -> str:
        session = _between(user, "session:\n", "\nwrite ")
        count = int(m.group(1)) if (m := re.search(r"write (\d+) pairs:", user)) else 1
        pairs = []
        for line in [s for s in session.split("\n") if " -> " in s][-count:]:
            action, _, observation = line.partition(" -> ")
            pairs.append(f"Q: what followed {action.strip()}? A: {observation.strip()}")
        return "\n".join(pairs)

    def _memma_verify(self, messages: list[Any], user: str) -> str:
        gold = _between(user, "gold answer: ", "\npredicted answer:")
        predicted = _between(user, "predicted answer: ", "\ncorrect:")
        share, _ = _coverage(gold, predicted)
        return "yes" if share >= self.sufficient else "no"

    def _memma_repair(self, messages: list[Any], user: str) -> str:
        question = _between(user, "question: ", "\ngold answer:")
        gold = _between(user, "gold answer: ", "\npredicted answer:")
        return f"diagnosis: missing\nfact: {question} {gold}"

    def _memma_consolidate(self, messages: list[Any], user: str) -> str:
        candidate = _between(user, "candidate: ", "\nclosest entries:")
        closest = _between(user, "closest entries:\n", "\ndecision:")
        share, _ = _coverage(candidate, closest)
        return "SKIP" if share >= 0.99 else "INSERT"

    # the proactive agent
    def _bank_edit(self, messages: list[Any], user: str) -> str:
        parsed = parse_phase_prompt(messages)
        if parsed is None:
            return ""
        _, _, window, bank = parsed
        known = " ".join(bank.knowledge.values())
        calls = []
        for step, action, observation in parse_window(window):
            fact = f"step {step}: {action} -> {' '.join(observation.split())}"[:300]
            if fact not in known:
                calls.append(render_tool_call("memory_save_knowledge", {"content": fact}))
        return "\n".join(calls)

    def _intervene(self, messages: list[Any], user: str) -> str:
        parsed = parse_phase_prompt(messages)
        if parsed is None:
            return "<no_intervention/>"
        _, _, window, bank = parsed
        steps = parse_window(window)
        if not steps:
            return "<no_intervention/>"
        newest = f"{steps[-1][1]} {steps[-1][2]}"
        wanted = set(terms(newest))
        entries = [text for text in bank.knowledge.values() if wanted & set(terms(text))]
        if not entries:
            return "<no_intervention/>"
        return "<context_for_action>" + "\n".join(entries[-self.max_lines :]) + "</context_for_action>"
