"""The evaluation harness core: memory systems x memory models x datasets -> one record per item, with the answer,
the reasoner's and the memory model's tokens, and whatever the caller's scoring function adds.

Two modes.

**Question answering** (AMA-Bench episodes, synthetic or loaded; LoCoMo; MemoryArena): the memory system ingests the
recorded trajectory once per (episode, system, model), following :mod:`rollout.memory.workflow`'s protocol: a
:class:`Rollout` over a :class:`ReplayEnv` is given every trajectory turn (:meth:`Rollout.add_turn`, step =
``turn_idx``) and runs the memory-model calls that ingestion needs. Each question is then answered from a fork of that
state: the question arrives as a ``user`` turn one step after the last one (worded as the benchmark's own prompt asks
it, :func:`asked_as`: LoCoMo's date instruction and adversarial options), and the frozen reasoner answers through
the system (calling its retrieval tool if it has one) with ``answer(answer)``. Memory tokens of the ingestion are
shared by the episode's questions (``memory_tokens_ingest_share``); memory tokens of the answer phase are the fork's
own. ``evidence_in_context`` is the share of the question's evidence strings (below) present in the reasoner's last
prompt: what the memory surfaced, whatever the reasoner made of it.

**Tasks** (the SAM and proactive task families): the agent loop runs each task with the family's scripted frozen
agent; the item's outcome is the task's verifier (success / pass). With ``samples`` > 0 each task also runs that
many times with the memory model sampled (temperature from its config, or ``temperature``), beside one greedy run.

**The programmatic reader** (:class:`EvidenceReader`, the default reasoner offline): it answers with the gold answer
exactly when the question's evidence is in its context, else says the answer is not mentioned in its context. The
evidence of a question is, in this order: the QA pair's ``metadata.evidence`` strings (the synthetic generator's
needle evidence: all must be present); else the observations of its needle turns (AMA-Bench ``needle_turns``,
LoCoMo evidence ids: all must be present); else any one of its gold answers. Presence is a case- and
whitespace-insensitive substring test over every non-system message, with the question text removed. Before
answering it uses the system's retrieval tool when the system prompt offers one (``memory(intent[, page_ids])``,
``memory(query)``, ``retrieve(query)``) up to ``budget`` times while the evidence is missing; for SAM it picks the
pages whose cues share the most terms with the question. Its score therefore measures what the memory surfaced to the
reasoner, not language ability; a model reasoner (any engine) replaces it for the latter.

**The extractive memory model** (:class:`ExtractiveMemoryModel`, the default memory model of QA mode): a scripted model
without ground truth that answers every memory role of every system with extractive text: SAM cues list the page's
rarest entities (on a conversation page the facts, not the small talk) and recalls keep the page lines that match the
intent best (stemmed terms, weighted by how rare they are on the page), both within SAM's output budgets; Mage summaries
keep each step's action and the start of its observation and Maintain passes; AMA-Agent records each turn's observation
as its state and checks sufficiency by term coverage; MemMA adds one entry per turn line, critiques by term coverage,
and answers with the best-matching evidence line; the proactive agent saves window steps as knowledge and reminds with
entries that share terms with the newest step. It makes a side-by-side run possible offline; any engine replaces it.

Records are plain dicts (JSON-ready) keyed by :func:`item_key` (dataset, episode, item, system, model). The harness
never imports :mod:`rewards`: a ``scorer`` callable maps a batch of records to score dicts.
"""

from __future__ import annotations

import copy
import math
import random
import re
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from data.config import ConfigModel
from data.envs.base import turn_tokens
from data.formats import (
    NOTHING_RELEVANT,
    parse_phase_prompt,
    parse_sam_consolidate_prompt,
    parse_sam_memory_block,
    parse_sam_recall_prompt,
    parse_window,
    render_tool_call,
)
from data.schemas import Episode, QAPair, TokenUsage
from data.tasks.proactive import ProactiveTask
from data.tasks.sam import SamTask
from rollout.engines.base import Engine, GenerationResult
from rollout.loop import EngineSet, PendingCall, Rollout, run_rollouts
from rollout.memory.base import MemorySystem, RoleSampling, Turn
from rollout.memory.embedders import Embedder
from rollout.memory.proactive import ProactiveConfig, ProactiveMemory, build_proactive_rollout
from rollout.memory.registry import MemoryConfig, build_memory
from rollout.memory.sam import TokenCounter
from rollout.memory.workflow import JobQueueMemory

__all__ = [
    "QA_REASONER_SYSTEM",
    "Evidence",
    "EvidenceReader",
    "ExtractiveMemoryModel",
    "ReaderConfig",
    "ReaderQuestion",
    "ReplayEnv",
    "Scorer",
    "aggregate",
    "asked_as",
    "bootstrap_ci",
    "conversation_tokens",
    "drive_memory",
    "evaluate_sam_memory",
    "horizon_label",
    "item_key",
    "question_evidence",
    "run_qa",
    "run_tasks",
    "usage_dict",
]

Scorer = Callable[[list[dict[str, Any]]], list[dict[str, float]]]
"""Maps a batch of records to one score dict per record (the runner passes :mod:`rewards.scorers` through this)."""

QA_REASONER_SYSTEM = (
    "You answer a question about an agent's recorded trajectory from your context. Tools: answer(answer) gives the "
    "answer. Reply with one tool call."
)
"""The reasoner's system prompt in QA mode for systems whose own prompt has no way to answer (the proactive agent)."""

NOT_IN_CONTEXT = "not mentioned in my context"

_STOPWORDS = frozenset(re.findall(r"\w+", """
    a an the of in on at to from for by with and or is was were are be been did does do what which who whom whose
    where when why how that this these those it its after before into than then there their they he she his her
    you your i me my we our as if not no yes any all
"""))
_WORD = re.compile(r"[a-z0-9]+")
_STEP_MARK = re.compile(r"t\d+")  # the ``tN>`` turn markers of SAM pages


def item_key(dataset: str, episode_id: str, item_id: str, system: str, model: str) -> str:
    """The resume key of one item: a rerun skips every record whose key is already written."""
    return "|".join((dataset, episode_id, item_id, system, model))


def terms(text: str) -> list[str]:
    """Content terms of ``text``: lower-case words and numbers without stopwords, in order, deduplicated."""
    out: list[str] = []
    for word in _WORD.findall(text.lower()):
        if word not in _STOPWORDS and word not in out:
            out.append(word)
    return out


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def usage_dict(usage: TokenUsage) -> dict[str, int]:
    """Token usage as a JSON-ready dict, with ``spent`` (prefill not served from cache plus generated tokens)."""
    return {"prompt": usage.prompt_tokens, "cached": usage.cached_prompt_tokens,
            "completion": usage.completion_tokens, "calls": usage.calls, "spent": usage.spent}


def _usage_minus(after: TokenUsage, before: TokenUsage) -> TokenUsage:
    return TokenUsage(
        prompt_tokens=after.prompt_tokens - before.prompt_tokens,
        cached_prompt_tokens=after.cached_prompt_tokens - before.cached_prompt_tokens,
        completion_tokens=after.completion_tokens - before.completion_tokens,
        calls=after.calls - before.calls,
    )


def horizon_label(tokens: int) -> str:
    """A horizon bucket: the smallest power of two of K tokens that holds ``tokens`` (``<=4K tok``)."""
    k = 1
    while k * 1024 < tokens:
        k *= 2
    return f"<={k}K tok"


def conversation_tokens(episode: Episode, count_tokens: TokenCounter | None = None) -> int:
    """The length of an episode's recorded trajectory in tokens (every action and observation), counted with
    ``count_tokens`` or, without one, with the task generators' own count (:func:`data.envs.base.turn_tokens`), so
    recorded lengths and generated ``horizon_tokens`` fall in the same bins."""
    if count_tokens is None:
        return max(1, sum(turn_tokens(t.action, t.observation) for t in episode.trajectory))
    return count_tokens("\n".join(f"{t.action}\n{t.observation}" for t in episode.trajectory))


def _episode_horizon(episode: Episode, length: int) -> str:
    """The horizon bin: the generator's target length when it has one, else the bucket of the recorded length
    (``episode.horizon_tokens`` when the file gives it, else ``length``)."""
    target = episode.metadata.get("target_tokens")
    if isinstance(target, int):
        return f"{target} tok"
    return horizon_label(episode.horizon_tokens or length)


def asked_as(qa: QAPair) -> str:
    """The question as the benchmark's own prompt asks it (LoCoMo adds its date instruction to temporal questions
    and the two options to adversarial ones, in ``metadata.asked_as``), else the question."""
    asked = qa.metadata.get("asked_as")
    return asked if isinstance(asked, str) and asked else qa.question


# ----------------------------------------------------------------------------------------------------------------
# Evidence and the programmatic reader


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
        text = _norm(context)
        if not all(_norm(s) in text for s in self.all_of):
            return False
        return not self.any_of or any(_norm(s) in text for s in self.any_of)

    def share(self, context: str) -> float:
        """The share of evidence strings present in ``context`` (1.0 when an any-of string is)."""
        text = _norm(context)
        if self.all_of:
            return sum(_norm(s) in text for s in self.all_of) / len(self.all_of)
        return float(any(_norm(s) in text for s in self.any_of)) if self.any_of else 0.0


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
    """The programmatic reasoner of QA mode (a :class:`~data.schemas.ScriptedPolicy`; see the module docstring).
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
        system = next((_content(m) for m in messages if _role(m) == "system"), "")
        context = "\n".join(_content(m) for m in messages if _role(m) != "system").replace(entry.question, " ")
        if entry.evidence.found(context):
            return render_tool_call("answer", {"answer": entry.answer})
        attempt = int(metadata.get("step", 0)) - entry.asked_at
        tool = _TOOL_SIGNATURE.search(system)
        if tool is not None and attempt < self.config.budget:
            call = self._tool_call(tool.group(1), [p.strip() for p in tool.group(2).split(",") if p.strip()],
                                   entry.question, messages, attempt)
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
                if _role(m) == "user" and _content(m).startswith("task: "):
                    cues = parse_sam_memory_block(_content(m))[1]
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


def _role(message: Any) -> str:
    return message["role"] if isinstance(message, dict) else message.role


def _content(message: Any) -> str:
    return message["content"] if isinstance(message, dict) else message.content


# ----------------------------------------------------------------------------------------------------------------
# The extractive memory model


def _between(text: str, start: str, end: str) -> str:
    m = re.search(re.escape(start) + r"(.*?)" + re.escape(end), text, re.DOTALL)
    return m.group(1).strip() if m else ""


def _entities(text: str, limit: int = 12) -> list[str]:
    """Noun-like phrases: a word followed by a number (``chest 4``) or a content word, in order, deduplicated."""
    words = _WORD.findall(text.lower())
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
        if phrase not in _STOPWORDS and not phrase.isdigit() and len(phrase) > 2 and phrase not in out:
            out.append(phrase)
        if len(out) >= limit:
            break
    return out


def stems(text: str) -> set[str]:
    """Crudely stemmed content terms (``painted`` and ``paints`` -> ``paint``), so a question matches the words of a
    conversation that inflects them differently."""
    return {_stem(t) for t in terms(text)}


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


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
    for word in _WORD.findall(text.lower()):
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

    def __init__(self, sufficient: float = 0.6, max_lines: int = 8, cue_chars: int = 96,
                 recall_chars: int = 200) -> None:
        self.sufficient = sufficient
        self.max_lines = max_lines
        # SAM's default budgets are 64 (cue) and 128 (recall) tokens and an output cut there is an error: the
        # scripted model stays under them even with the tiny model's 1k-token vocabulary (under 2 characters a token)
        self.cue_chars = cue_chars
        self.recall_chars = recall_chars

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        """The extractive answer to the role's prompt (empty text for a prompt it does not know)."""
        role = str(metadata.get("role", ""))
        user = _content(messages[-1]) if messages else ""
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
        return "<context_for_action>" + "\n".join(entries[-self.max_lines:]) + "</context_for_action>"


# ----------------------------------------------------------------------------------------------------------------
# Question answering


class ReplayEnv:
    """A recorded trajectory as the agent loop's task environment: nothing can be executed (``act`` is answered
    with a notice), the reasoner ends the episode with ``answer``; the outcome is left to the scorer (0.0 here)."""

    def __init__(self, episode: Episode, slack_steps: int = 4) -> None:
        self.episode = episode
        self.task_id = episode.episode_id
        self.task = episode.task
        last = episode.trajectory[-1].turn_idx if episode.trajectory else 0
        self.max_steps = last + 2 + slack_steps

    def reset(self) -> str:
        """The start observation: a notice that a recorded trajectory follows."""
        return f"recorded trajectory of {len(self.episode.trajectory)} turns follows."

    def step(self, action: str) -> tuple[str, bool]:
        """Refuse to act: the trajectory is a record."""
        return "error: this is a recorded trajectory; no action can be taken. Answer with answer(answer).", False

    def finish(self, answer: str | None) -> float:
        """The scorer decides the outcome."""
        return 0.0


def drive_memory(rollouts: Sequence[Rollout], engines: EngineSet) -> None:
    """Run every pending memory-model call of ``rollouts`` (batched per engine, wavefront by wavefront) until each
    rollout waits for the reasoner or is done."""
    while True:
        pending: list[tuple[Rollout, PendingCall]] = []
        for rollout in rollouts:
            call = None if rollout.done else rollout.pending()
            if call is not None and call.kind == "memory":
                pending.append((rollout, call))
        if not pending:
            return
        batches: dict[int, tuple[Engine, list[tuple[Rollout, PendingCall]]]] = {}
        for rollout, call in pending:
            engine = engines.for_call(call)
            batches.setdefault(id(engine), (engine, []))[1].append((rollout, call))
        for engine, items in batches.values():
            results = engine.generate([call.request for _, call in items])
            for (rollout, _), result in zip(items, results, strict=True):
                rollout.advance(result)


def _reasoner_system(memory: MemorySystem) -> str:
    if isinstance(memory, ProactiveMemory):
        return QA_REASONER_SYSTEM
    return str(getattr(memory, "reasoner_system", ""))


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), max(size, 1)):
        yield items[start : start + max(size, 1)]


def run_qa(
    episodes: Sequence[Episode],
    memory: MemoryConfig | dict[str, Any],
    engines: EngineSet,
    *,
    dataset: str,
    system: str,
    model: str,
    reader: EvidenceReader | None = None,
    skip: Iterable[str] = (),
    scorer: Scorer | None = None,
    count_tokens: TokenCounter | None = None,
    embedder: Embedder | None = None,
    reasoner_sampling: RoleSampling | None = None,
    episodes_per_batch: int = 4,
    slack_steps: int = 4,
    seed: int = 0,
    max_questions: int | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Answer every question of ``episodes`` through the memory system ``memory`` (see the module docstring) and
    yield one record per question not in ``skip``, scored by ``scorer`` one batch of episodes at a time.

    ``reader`` must be the policy behind ``engines.reasoner`` when that is the programmatic reader (the harness
    registers each question with it); leave it None for a model reasoner. ``on_progress(n)`` is told how many
    questions each batch finished."""
    done = set(skip)
    for chunk in _chunks(list(episodes), episodes_per_batch):
        work: list[tuple[Episode, list[tuple[int, QAPair]]]] = []
        for episode in chunk:
            qas = list(enumerate(episode.qa_pairs))[: max_questions if max_questions is not None else None]
            todo = [(i, qa) for i, qa in qas if item_key(dataset, episode.episode_id, _qa_id(qa, i), system, model)
                    not in done]
            if todo:
                work.append((episode, todo))
        if not work:
            continue
        bases = []
        for episode, _ in work:
            mem = build_memory(memory, count_tokens=count_tokens, embedder=embedder)
            base = Rollout(ReplayEnv(episode, slack_steps), mem, reasoner_system=_reasoner_system(mem),
                           reasoner_sampling=reasoner_sampling, seed=seed, rollout_id="ingest",
                           metadata={"family": "qa", "dataset": dataset})
            for turn in episode.trajectory:
                base.add_turn(Turn(step=turn.turn_idx, action_text=turn.action, observation=turn.observation,
                                   role="tool"))
            bases.append(base)
        drive_memory(bases, engines)
        forks: list[tuple[Rollout, Rollout, Episode, int, QAPair, Evidence]] = []
        for base, (episode, todo) in zip(bases, work, strict=True):
            asked_at = (episode.trajectory[-1].turn_idx if episode.trajectory else 0) + 1
            for index, qa in todo:
                fork = base.fork(f"{dataset}|{system}|{model}|{_qa_id(qa, index)}")
                asked = asked_as(qa)
                text = asked if isinstance(fork.memory, JobQueueMemory) else f"question: {asked}"
                evidence = question_evidence(episode, qa)
                if reader is not None:
                    reader.register(fork.env.task_id, fork.rollout_id,
                                    ReaderQuestion(asked, qa.answer, evidence, asked_at))
                fork.add_turn(Turn(step=asked_at, action_text="", observation=text, role="user"))
                forks.append((fork, base, episode, index, qa, evidence))
        lengths = {id(e): conversation_tokens(e, count_tokens) for e, _ in work}
        horizons = {id(e): _episode_horizon(e, lengths[id(e)]) for e, _ in work}
        last_prompt: dict[int, str] = {}
        traces = run_rollouts([f[0] for f in forks], engines, on_result=_prompt_recorder(last_prompt))
        shares = {id(base): max(1, sum(1 for f in forks if f[1] is base)) for base in bases}
        records = []
        for (fork, base, episode, index, qa, evidence), trace in zip(forks, traces, strict=True):
            memory_answer = _usage_minus(fork.memory_usage, base.memory_usage)
            ingest = usage_dict(base.memory_usage)
            share = {k: v / shares[id(base)] for k, v in ingest.items()}
            context = last_prompt.get(id(fork), "").replace(asked_as(qa), " ")
            records.append({
                "key": item_key(dataset, episode.episode_id, _qa_id(qa, index), system, model),
                "dataset": dataset, "mode": "qa", "episode_id": episode.episode_id, "item_id": _qa_id(qa, index),
                "system": system, "model": model, "question": qa.question, "gold": qa.answer,
                "golds": golds_of(qa), "answer": trace.answer, "qa_type": qa.type,
                "category": qa.metadata.get("category"), "options": qa.metadata.get("options"),
                "horizon": horizons[id(episode)], "horizon_tokens": episode.horizon_tokens or lengths[id(episode)],
                "task": episode.task, "task_type": episode.task_type,
                "loader_defaults": [*episode.metadata.get("loader_defaults", []),
                                    *qa.metadata.get("loader_defaults", [])],
                "evidence_in_context": evidence.share(context),
                "reasoner_tokens": usage_dict(fork.reasoner_usage),
                "memory_tokens_answer": usage_dict(memory_answer),
                "memory_tokens_ingest": ingest,
                "memory_tokens_ingest_share": share,
                "memory_calls_answer": len(fork.memory_calls) - len(base.memory_calls),
                "reasoner_calls": fork.reasoner_usage.calls,
                "stats": dict(trace.stats),
            })
        if scorer is not None:
            for record, scores in zip(records, scorer(records), strict=True):
                record["scores"] = scores
        if on_progress is not None:
            on_progress(len(records))
        yield from records


def _prompt_recorder(store: dict[int, str]) -> Callable[[Rollout, PendingCall, GenerationResult], None]:
    """An ``on_result`` hook keeping each rollout's last reasoner prompt (non-system messages) in ``store``."""

    def record(rollout: Rollout, call: PendingCall, result: GenerationResult) -> None:
        if call.kind == "reasoner" and call.request.messages is not None:
            store[id(rollout)] = "\n".join(m.content for m in call.request.messages if m.role != "system")

    return record


def _qa_id(qa: QAPair, index: int) -> str:
    return qa.qa_id or f"q{index}"


# ----------------------------------------------------------------------------------------------------------------
# Tasks


def _with_temperature(memory: MemoryConfig, temperature: float | None) -> MemoryConfig:
    sampling = getattr(memory, "sampling", None)
    if temperature is None or not isinstance(sampling, dict):
        return memory
    roles = {k: v.model_copy(update={"temperature": temperature}) for k, v in sampling.items()}
    return memory.model_copy(update={"sampling": roles})


def _task_horizon(task: SamTask | ProactiveTask) -> str:
    if isinstance(task, SamTask):
        p = task.params
        return f"{p.horizon_steps} steps" if p.horizon_steps is not None else f"{p.target_tokens} tok"
    return f"{task.params.n_subtasks} subtasks"


def run_tasks(
    tasks: Sequence[SamTask | ProactiveTask],
    memory: MemoryConfig,
    engines: EngineSet,
    *,
    dataset: str,
    system: str,
    model: str,
    samples: int = 0,
    temperature: float | None = None,
    greedy: bool = True,
    skip: Iterable[str] = (),
    scorer: Scorer | None = None,
    count_tokens: TokenCounter | None = None,
    embedder: Embedder | None = None,
    seed: int = 0,
    tasks_per_batch: int = 16,
    on_progress: Callable[[int], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Run each task once greedily (memory roles at temperature 0; ``greedy=False`` skips it) and ``samples`` times
    sampled (at ``temperature``, default the config's) with the family's scripted agent; yield one record per run
    not in ``skip``. The outcome is the task's verifier; SAM tasks take SAM or a baseline, proactive tasks the
    proactive agent."""
    runs = (["greedy"] if greedy else []) + [f"sample{k}" for k in range(samples)]
    configs = {"greedy": _with_temperature(memory, 0.0)}
    configs.update({r: _with_temperature(memory, temperature) for r in runs if r != "greedy"})
    done = set(skip)
    jobs = [(task, run) for task in tasks for run in runs
            if item_key(dataset, task.task_id, run, system, model) not in done]
    for chunk in _chunks(jobs, tasks_per_batch):
        rollouts = [_task_rollout(task, configs[run], run, seed, count_tokens, embedder) for task, run in chunk]
        traces = run_rollouts(rollouts, engines)
        records = []
        for (task, run), trace in zip(chunk, traces, strict=True):
            records.append({
                "key": item_key(dataset, task.task_id, run, system, model),
                "dataset": dataset, "mode": task.family, "episode_id": task.task_id, "item_id": run,
                "system": system, "model": model, "sampled": run != "greedy", "answer": trace.answer,
                "outcome": trace.outcome, "horizon": _task_horizon(task),
                "reasoner_tokens": usage_dict(trace.reasoner_usage), "memory_tokens_answer": usage_dict(
                    trace.memory_usage), "memory_calls_answer": len(trace.memory_calls),
                "reasoner_calls": trace.reasoner_usage.calls, "peak_context_tokens": trace.peak_context_tokens,
                "stats": dict(trace.stats),
            })
        if scorer is not None:
            for record, scores in zip(records, scorer(records), strict=True):
                record["scores"] = scores
        if on_progress is not None:
            on_progress(len(records))
        yield from records


def _task_rollout(task: SamTask | ProactiveTask, memory: MemoryConfig, run: str, seed: int,
                  count_tokens: TokenCounter | None, embedder: Embedder | None) -> Rollout:
    if isinstance(task, ProactiveTask):
        if not isinstance(memory, ProactiveConfig):
            raise ValueError(f"proactive tasks run the proactive agent, not {memory.name!r}")
        return build_proactive_rollout(copy.deepcopy(task), memory, seed=seed, rollout_id=run)
    from rollout.agents import sam_rollout

    return sam_rollout(task, memory, seed=seed, rollout_id=run, count_tokens=count_tokens, embedder=embedder)


# ----------------------------------------------------------------------------------------------------------------
# Aggregation and the in-process entry point


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def bootstrap_ci(values: Sequence[float], level: float = 0.95, resamples: int = 1000, seed: int = 0) -> list[float]:
    """The percentile bootstrap confidence interval of the mean of ``values`` ([low, high]; a fixed seed, so a
    report is reproducible)."""
    import numpy as np

    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return [float("nan"), float("nan")]
    means = data[np.random.default_rng(seed).integers(0, data.size, (resamples, data.size))].mean(axis=1)
    tail = (1 - level) / 2
    return [float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))]


def t_interval(values: Sequence[float], level: float = 0.95) -> list[float] | None:
    """The Student-t confidence interval of the mean of ``values`` (one per seed: [low, high]); None for fewer than
    two values."""
    if len(values) < 2:
        return None
    from scipy import stats

    mean = statistics.fmean(values)
    half = float(stats.t.ppf((1 + level) / 2, len(values) - 1)) * statistics.stdev(values) / math.sqrt(len(values))
    return [mean - half, mean + half]


def aggregate(records: Iterable[dict[str, Any]], by: Sequence[str] = ("system", "model")) -> list[dict[str, Any]]:
    """Group records by the fields ``by`` and average every score (with its 95% bootstrap interval under
    ``<score>_ci``) plus the tokens per item: reasoner tokens spent, memory tokens (answer phase plus the share of
    ingestion), and ``evidence_in_context`` when present."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault(tuple(record.get(k) for k in by), []).append(record)
    out = []
    for key, items in groups.items():
        row: dict[str, Any] = dict(zip(by, key, strict=True))
        row["n"] = len(items)
        metrics: dict[str, list[float]] = {}
        for record in items:
            for name, value in (record.get("scores") or {}).items():
                if isinstance(value, (int, float)):
                    metrics.setdefault(name, []).append(float(value))
        for name, values in sorted(metrics.items()):
            row[name] = _mean(values)
            row[f"{name}_ci"] = bootstrap_ci(values)
        row["reasoner_tokens"] = _mean([r["reasoner_tokens"]["spent"] for r in items])
        row["memory_tokens"] = _mean([
            r["memory_tokens_answer"]["prompt"] + r["memory_tokens_answer"]["completion"]
            + r.get("memory_tokens_ingest_share", {}).get("prompt", 0)
            + r.get("memory_tokens_ingest_share", {}).get("completion", 0) for r in items
        ])
        evidence = [r["evidence_in_context"] for r in items if "evidence_in_context" in r]
        if evidence:
            row["evidence_in_context"] = _mean(evidence)
            row["evidence_in_context_ci"] = bootstrap_ci(evidence)
        out.append(row)
    return out


def evaluate_sam_memory(
    tasks: Sequence[SamTask],
    memory_engine: Engine | None,
    memory: MemoryConfig | dict[str, Any] | None = None,
    *,
    samples: int = 1,
    temperature: float | None = None,
    tokenizer: Any = None,
    reasoner: Engine | None = None,
    seed: int = 0,
    count_tokens: TokenCounter | None = None,
    tasks_per_batch: int = 256,
    progress: str | None = "eval",
) -> dict[str, Any]:
    """Evaluate a memory model inside SAM on SAM tasks, in process: one greedy run and ``samples`` sampled runs per
    task, ``tasks_per_batch`` runs in flight at once (one batched engine call per wavefront). ``memory_engine`` None
    uses the SAM oracle expert. Returns ``success_greedy``, ``success_sampled`` (None without samples), reasoner and
    memory tokens per task (``spent`` and prompt + completion), per-horizon success and the records."""
    from tqdm.auto import tqdm

    from rollout.agents import sam_engines
    from rollout.memory.registry import parse_memory_config

    cfg = parse_memory_config(memory or {"name": "sam"}) if not isinstance(memory, ConfigModel) else memory
    engines = sam_engines(memory_engine, tokenizer=tokenizer, seed=seed)
    if reasoner is not None:
        engines = EngineSet(reasoner=reasoner, memory=engines.memory)
    with tqdm(total=len(tasks) * (1 + samples), desc=progress, disable=progress is None, leave=False) as bar:
        records = list(run_tasks(tasks, cfg, engines, dataset="sam", system=cfg.name, model="model", samples=samples,
                                 temperature=temperature, seed=seed, count_tokens=count_tokens,
                                 tasks_per_batch=tasks_per_batch, on_progress=bar.update))
    greedy = [r for r in records if not r["sampled"]]
    sampled = [r for r in records if r["sampled"]]

    def success(rows: list[dict[str, Any]]) -> float | None:
        return _mean([float(r["outcome"] or 0.0) for r in rows])

    horizons = sorted({r["horizon"] for r in records})
    return {
        "success_greedy": success(greedy),
        "success_sampled": success(sampled),
        "reasoner_tokens_per_task": _mean([r["reasoner_tokens"]["spent"] for r in greedy]),
        "memory_tokens_per_task": _mean([r["memory_tokens_answer"]["prompt"] + r["memory_tokens_answer"]["completion"]
                                         for r in greedy]),
        "by_horizon": {h: {"success_greedy": success([r for r in greedy if r["horizon"] == h]),
                           "success_sampled": success([r for r in sampled if r["horizon"] == h])} for h in horizons},
        "records": records,
    }

