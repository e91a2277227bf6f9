"""Oracle-anchored recoverability reward c(n) (SAM: "SAM: State-Adaptive Memory for Long-Horizon Reasoning Agent" (arXiv
2605.24468), section 2.3).

For every sibling group (memory actions that share one parent context) a committee of M reference engines answers the
same memory request (same intent, same pages: the messages the policy saw; for a recall that read several pages, one
request over all of them, since the node is the whole recall). The union of their answers stands in for the
unobserved target space. A judge scores each candidate (the action's output: a recall's final extraction, a cue) 0-10
on relevance, coverage and consistency against that union; c(n) is the mean of the three, rescaled to [0, 1]
(:func:`rubric_score`). One judge call per parent context scores all its siblings.

Committee and judge calls are made once per parent context and shared by all its siblings, batched per engine, the
M members in parallel threads (the OpenAI-compatible backend also runs each batch concurrently), and cached on disk by
a hash of their inputs and token limits; empty or failed answers are counted and not cached. Requests fail one at a
time (:meth:`~memrl.rollout.engines.base.Engine.generate_each`): a request that runs out of retries costs its own
answer,
never the batch's. A failed or unparseable call never stops training: a group with no reference answer, or whose
judge reply failed, is scored by the offline judge or its committee term is skipped (``fallback``; credit
assignment then drops it for the whole group). :class:`CommitteeStats` counts failed requests, fallbacks and scored
groups separately.

The offline judge keeps the rubric's shape with lexical sub-scores, each 0-10 (:func:`offline_rubric`): relevance = 10 x
precision of the candidate's tokens against the union, coverage = 10 x recall of the union's tokens, consistency =
10 x the share of the candidate's numbers and ids that the union contains; the same :func:`rubric_score` rescales
them. With the oracle
expert of a synthetic task as the committee (it answers from the environment's ground truth) and the offline judge,
no endpoint is needed: that is the embedded default.

**Recoverability** (``criterion: recoverability``, an option beside the rubric). The paper's target is a recall the
reasoner can use: "concise yet faithful to the evidence the downstream reasoner will need". Lexical overlap with the
references rewards copying their wording, not that. Under this criterion the judge is asked one question per candidate:
can the reasoner recover from it alone what its request needs, as the references give it (0-10, rescaled to [0, 1]).
The offline judge answers it by reading: a *reader* registered for the request's intent
(:func:`register_recoverability_reader`; SAM's recall intents, ``where is the X`` and ``which key opens Y``, read
the facts the way SAM's scripted reasoner reads them) takes what the references say the intent needs (their
majority answer) and what the candidate says: c(n) = 1 when the reasoner would read the same answer from the
candidate, 0 when it would read another one or none (and, when the references hold no answer, 1 for a candidate
that claims none). A request no reader knows (a consolidation cue, another task family) is scored by the lexical
rubric and counted (``recoverability_fallbacks``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from memrl.data.config import ConfigModel
from memrl.data.formats import parse_sam_recall_prompt, render_sam_recall_prompt
from memrl.data.schemas import MemoryCallTree, Message, TreeNode
from memrl.data.tasks.common import as_messages
from memrl.rewards.cache import JsonCache, content_key
from memrl.rollout.engines.base import Engine, GenerationRequest, SamplingParams

__all__ = [
    "Committee",
    "CommitteeConfig",
    "CommitteeStats",
    "node_output",
    "offline_judge",
    "offline_recoverability",
    "offline_rubric",
    "parse_judge_scores",
    "reference_messages",
    "register_recoverability_reader",
    "rubric_score",
]

RUBRIC = ("relevance", "coverage", "consistency")
RUBRIC_MAX = 10.0
JUDGE_SYSTEM = (
    "You grade memory recalls. Score every candidate from 0 to 10 on relevance (no off-target content), coverage "
    "(holds what the references hold) and consistency (does not contradict them), judged against the union of the "
    'references. Reply with JSON only: [{"candidate": 1, "relevance": 7, "coverage": 5, "consistency": 9}, ...].'
)


JUDGE_RECOVERABILITY_SYSTEM = (
    "You grade memory recalls by recoverability. A reasoner asked its memory for what the request below needs and "
    "will see only one candidate. For every candidate, score from 0 to 10 whether the reasoner can recover from it "
    "alone what the request needs, as the references give it (10: it can, unambiguously; 0: it cannot, or it would "
    'be misled). Extra or reworded text does not matter. Reply with JSON only: [{"candidate": 1, "recoverable": 8}, '
    "...]."
)


class CommitteeConfig(ConfigModel):
    """How c(n) is computed."""

    enabled: bool = True  # compute c(n); false: no committee term
    criterion: Literal["rubric", "recoverability"] = "rubric"  # the judge's question (module docstring)
    reference_max_tokens: int = Field(256, ge=1)  # max tokens of each committee member's answer
    judge_max_tokens: int = Field(512, ge=1)  # max tokens of the judge's reply
    fallback: Literal["offline", "skip"] = "offline"  # failed call: offline judge scores the group, or skip its c(n)
    min_group_size: int = Field(2, ge=1)  # single-sample groups carry no advantage: do not pay for them
    cache_dir: str | None = None  # on-disk cache of answers; None: <run dir>/committee_cache


@dataclass
class CommitteeStats:
    """Engine traffic and failures of one scoring pass."""

    groups: int = 0  # sibling groups eligible for c(n)
    committee_requests: int = 0  # reference requests sent (cache misses)
    judge_requests: int = 0  # judge requests sent (cache misses)
    cache_hits: int = 0
    reference_failures: int = 0  # reference requests that failed or came back empty
    judge_failures: int = 0  # judge requests that failed or could not be parsed
    fallbacks: int = 0  # groups scored by the fallback (offline judge) or left without c(n)
    recoverability_fallbacks: int = 0  # groups no recoverability reader knew, scored by the lexical rubric
    scored_groups: int = 0  # groups whose members got c(n) (committee judge, offline judge or fallback)
    scores: list[float] = field(default_factory=list)
    # HTTP attempts of endpoint engines (answered / failed: errors, timeouts), references and judge; retries included
    http: dict[str, int] = field(default_factory=dict)

    @property
    def failures(self) -> int:
        """Failed requests, reference and judge."""
        return self.reference_failures + self.judge_failures

    def metrics(self) -> dict[str, float | int]:
        """Flat counters (they add up over workers; the mean score is the driver's, from ``scores``)."""
        out: dict[str, float | int] = {
            "committee_groups": self.groups,
            "committee_requests": self.committee_requests,
            "judge_requests": self.judge_requests,
            "committee_cache_hits": self.cache_hits,
            "committee_failures": self.reference_failures,
            "judge_failures": self.judge_failures,
            "committee_fallbacks": self.fallbacks,
            "committee_scored_groups": self.scored_groups,
            "committee_recoverability_fallbacks": self.recoverability_fallbacks,
        }
        out.update(self.http)
        return out


_TOKEN = re.compile(r"[a-z0-9]+")
_NUMBERISH = re.compile(r"[a-z]*\d+[a-z0-9]*")


def rubric_score(relevance: float, coverage: float, consistency: float) -> float:
    """c(n) from the judge's three 0-10 scores: each clipped to [0, 10] and rescaled to [0, 1], then averaged."""
    return sum(min(max(p / RUBRIC_MAX, 0.0), 1.0) for p in (relevance, coverage, consistency)) / len(RUBRIC)


def offline_rubric(candidate: str, references: Sequence[str]) -> dict[str, float]:
    """The offline judge's 0-10 relevance, coverage and consistency of ``candidate`` (see the module docstring)."""
    cand = _TOKEN.findall(candidate.lower())
    union = set(_TOKEN.findall(" ".join(references).lower()))
    if not union:
        same = RUBRIC_MAX if not cand else 0.0
        return dict.fromkeys(RUBRIC, same)
    if not cand:
        return {"relevance": 0.0, "coverage": 0.0, "consistency": 0.0}
    numbers = _NUMBERISH.findall(candidate.lower())
    return {
        "relevance": RUBRIC_MAX * sum(t in union for t in cand) / len(cand),
        "coverage": RUBRIC_MAX * len(union & set(cand)) / len(union),
        "consistency": RUBRIC_MAX * (sum(n in union for n in numbers) / len(numbers) if numbers else 1.0),
    }


def offline_judge(candidate: str, references: Sequence[str]) -> float:
    """c(n) from the offline judge: :func:`offline_rubric` through :func:`rubric_score`."""
    return rubric_score(**offline_rubric(candidate, references))


Reader = Callable[[str], "str | None"]  # recalled text -> what the reasoner reads for one intent (None: nothing)
_READERS: list[Callable[[str], Reader | None]] = []


def register_recoverability_reader(factory: Callable[[str], Reader | None]) -> Callable[[str], Reader | None]:
    """Register ``factory(intent) -> reader or None`` for the offline recoverability judge (the first factory that
    knows an intent reads it). Usable as a decorator."""
    _READERS.append(factory)
    return factory


@register_recoverability_reader
def _sam_reader(intent: str) -> Reader | None:
    """SAM's recall intents, read as its scripted reasoner reads recalled facts (memrl.data.tasks.sam)."""
    from memrl.data.tasks.sam import parse_facts

    if m := re.fullmatch(r"which key opens (.+)", intent.strip()):
        container = m.group(1)
        return lambda text: parse_facts(text).opener.get(container)
    if m := re.fullmatch(r"where is the (.+)", intent.strip()):
        item = m.group(1)
        return lambda text: parse_facts(text).location.get(item)
    return None


def offline_recoverability(candidate: str, references: Sequence[str], intent: str) -> float | None:
    """c(n) of the offline judge under ``criterion: recoverability`` (module docstring), or None when no registered
    reader knows ``intent``."""
    read = next((r for factory in _READERS if (r := factory(intent)) is not None), None)
    if read is None:
        return None
    answers = [a for a in (read(r) for r in references) if a is not None]
    target = max(answers, key=answers.count) if answers else None  # the majority (the first of equals)
    return 1.0 if read(candidate) == target else 0.0


def parse_judge_scores(text: str, n: int, criterion: str = "rubric") -> list[float] | None:
    """Per-candidate c(n) in [0, 1] from the judge's reply (a JSON list of 0-10 scores, one object per candidate, in
    candidate order: the rubric's three, or ``recoverable`` under ``criterion: recoverability``), or None when it
    cannot be read for all ``n``."""
    match = re.search(r"\[.*\]", text, re.DOTALL)
    if not match:
        return None
    try:
        items = json.loads(match.group(0))
    except json.JSONDecodeError:
        return None
    if not isinstance(items, list) or len(items) != n:
        return None
    scores = []
    for item in items:
        if not isinstance(item, dict):
            return None
        keys = RUBRIC if criterion == "rubric" else ("recoverable",)
        try:
            parts = {k: float(item[k]) for k in keys}
        except (KeyError, TypeError, ValueError):
            return None
        if not all(math.isfinite(p) for p in parts.values()):
            return None
        if criterion == "rubric":
            scores.append(rubric_score(**parts))
        else:
            scores.append(min(max(parts["recoverable"] / RUBRIC_MAX, 0.0), 1.0))
    return scores


def node_output(node: TreeNode) -> str:
    """What a memory action produced: a recall's final extraction (its last usable page read), a cue."""
    calls = [c for c in (node.call, *node.follow_up_calls) if c is not None]
    usable = [c for c in calls if not c.error] or calls
    return usable[-1].text if usable else ""


def reference_messages(node: TreeNode) -> list[Message]:
    """The request the committee answers for ``node``'s sibling group: the messages of the action's first call, or
    for a recall that read several pages, one recall request over all its pages (the node is the whole recall)."""
    assert node.call is not None
    if not node.follow_up_calls:
        return list(node.call.messages)
    parsed = [parse_sam_recall_prompt(c.messages) for c in (node.call, *node.follow_up_calls)]
    if any(p is None for p in parsed):
        return list(node.call.messages)
    intent, first_page = parsed[0][0], parsed[0][1]  # type: ignore[index]
    pages = "\n".join(p[2] for p in parsed)  # type: ignore[index]
    return as_messages(render_sam_recall_prompt(intent, first_page, pages, ""))


def _judge_messages(references: list[str], candidates: list[str], request: str | None = None) -> list[Message]:
    """The judge's request: the rubric's, or with ``request`` (the memory request's text) the recoverability one."""
    refs = "\n".join(f"[{i + 1}] {r}" for i, r in enumerate(references))
    cands = "\n".join(f"({i + 1}) {c}" for i, c in enumerate(candidates))
    if request is None:
        return [
            Message(role="system", content=JUDGE_SYSTEM),
            Message(role="user", content=f"references:\n{refs}\ncandidates:\n{cands}"),
        ]
    return [
        Message(role="system", content=JUDGE_RECOVERABILITY_SYSTEM),
        Message(role="user", content=f"request:\n{request}\nreferences:\n{refs}\ncandidates:\n{cands}"),
    ]


def _intent(node: TreeNode) -> str | None:
    """The recall intent of ``node``'s request (None for a request that is not a SAM recall)."""
    parsed = parse_sam_recall_prompt(reference_messages(node))
    return parsed[0] if parsed is not None else None


def _request_text(node: TreeNode) -> str:
    """The memory request as the judge sees it: the last user message of the committee's request."""
    messages = reference_messages(node)
    return next((m.content for m in reversed(messages) if m.role == "user"), "")


class Committee:
    """Scores sibling groups of memory-call trees with c(n) (see the module docstring)."""

    def __init__(self, cfg: CommitteeConfig, references: Sequence[Engine], judge: Engine | None = None) -> None:
        if not references:
            raise ValueError("the committee needs at least one reference engine (the oracle expert offline)")
        self.cfg = cfg
        self.references = list(references)
        self.judge = judge
        self.cache = JsonCache(cfg.cache_dir)

    def _groups(self, trees: Sequence[MemoryCallTree]) -> list[tuple[MemoryCallTree, list[TreeNode]]]:
        out = []
        for tree in trees:
            groups: dict[str, list[TreeNode]] = {}
            for node in tree.nodes:
                if node.kind == "memory" and node.call is not None:
                    groups.setdefault(node.group_id or node.node_id, []).append(node)
            out.extend((tree, members) for members in groups.values() if len(members) >= self.cfg.min_group_size)
        return out

    def _references(self, items: list[tuple[MemoryCallTree, list[TreeNode]]], stats: CommitteeStats) -> list[list]:
        """refs[i][m]: reference engine m's answer for group i (None when it failed or came back empty)."""
        refs: list[list[str | None]] = [[None] * len(self.references) for _ in items]
        todo: dict[int, list[tuple[int, str, GenerationRequest]]] = {}
        for m, engine in enumerate(self.references):
            for i, (tree, members) in enumerate(items):
                call = members[0].call
                assert call is not None
                messages = reference_messages(members[0])
                key = content_key(
                    "reference", engine.name, self.cfg.reference_max_tokens, [x.model_dump() for x in messages]
                )
                cached = self.cache.get(key)
                if cached:
                    stats.cache_hits += 1
                    refs[i][m] = cached
                    continue
                request = GenerationRequest(
                    messages=messages,
                    sampling=SamplingParams(temperature=0.0, max_tokens=self.cfg.reference_max_tokens, logprobs=False),
                    metadata={**call.metadata, "task_id": tree.task_id, "role": call.role},
                )
                todo.setdefault(m, []).append((i, key, request))
        for m, results in self._generate_per_engine(todo).items():
            stats.committee_requests += len(todo[m])
            for (i, key, _), result in zip(todo[m], results, strict=True):
                text = _text(result).strip()
                if not text:  # a failed request or an empty answer: not cached, so a rerun asks again
                    stats.reference_failures += 1
                    continue
                refs[i][m] = text
                self.cache.put(key, text)
        return refs

    def _generate_per_engine(self, todo: dict[int, list[tuple[int, str, GenerationRequest]]]) -> dict[int, list[Any]]:
        """One batched call per committee member, the members concurrently (a distinct engine object per thread, so
        no engine serves two threads); each request's result, or its exception when it failed."""
        by_engine: dict[int, list[int]] = {}
        for m in todo:
            by_engine.setdefault(id(self.references[m]), []).append(m)

        def run(members: list[int]) -> dict[int, list[Any]]:
            return {m: _each(self.references[m], [r for _, _, r in todo[m]]) for m in members}

        chunks = list(by_engine.values())
        if len(chunks) <= 1:
            return run(chunks[0]) if chunks else {}
        with ThreadPoolExecutor(max_workers=len(chunks), thread_name_prefix="committee") as pool:
            return {m: r for part in pool.map(run, chunks) for m, r in part.items()}

    def score(self, trees: Sequence[MemoryCallTree]) -> CommitteeStats:
        """Set ``committee_score`` on the memory nodes of every sibling group of ``trees`` (in place)."""
        stats = CommitteeStats()
        if not self.cfg.enabled:
            return stats
        http_before = self._http_counts()
        try:
            return self._score(trees, stats)
        finally:
            after = self._http_counts()
            stats.http = {k: after[k] - http_before.get(k, 0) for k in after}

    def _http_counts(self) -> dict[str, int]:
        """Cumulative answered / failed HTTP attempts of the endpoint engines (those that report ``stats()``)."""
        out: dict[str, int] = {}
        for prefix, engines in (("committee", self.references), ("judge", [self.judge] if self.judge else [])):
            seen: set[int] = set()
            for engine in engines:
                if id(engine) in seen or not callable(getattr(engine, "stats", None)):
                    continue
                seen.add(id(engine))
                for ep in engine.stats().values():
                    out[f"{prefix}_http_answered"] = out.get(f"{prefix}_http_answered", 0) + ep.requests
                    out[f"{prefix}_http_failed"] = out.get(f"{prefix}_http_failed", 0) + ep.failed_attempts
        return out

    def _score(self, trees: Sequence[MemoryCallTree], stats: CommitteeStats) -> CommitteeStats:
        items = self._groups(trees)
        stats.groups = len(items)
        refs = self._references(items, stats)
        judge_todo: list[tuple[int, list[str], str, GenerationRequest]] = []
        for i, (_, members) in enumerate(items):
            references = [r for r in refs[i] if r]
            candidates = [node_output(m) for m in members]
            if not references:
                self._fallback(members, None, stats)
                continue
            if self.judge is None:
                self._assign(members, self._offline(members, references, stats), stats)
                continue
            recoverability = self.cfg.criterion == "recoverability"
            request_text = _request_text(members[0]) if recoverability else None
            key = content_key(
                "judge",
                self.judge.name,
                self.cfg.judge_max_tokens,
                references,
                candidates,
                *(["recoverability", request_text] if recoverability else []),
            )
            cached = self.cache.get(key)
            if cached is not None:
                stats.cache_hits += 1
                self._assign(members, cached, stats)
                continue
            messages = _judge_messages(references, candidates, request_text)
            request = GenerationRequest(
                messages=messages,
                sampling=SamplingParams(temperature=0.0, max_tokens=self.cfg.judge_max_tokens, logprobs=False),
                metadata={"role": "judge", "task_id": items[i][0].task_id},  # sticky endpoint per tree
            )
            judge_todo.append((i, references, key, request))
        if judge_todo and self.judge is not None:
            stats.judge_requests += len(judge_todo)
            results = _each(self.judge, [r for *_, r in judge_todo])
            for (i, references, key, _), result in zip(judge_todo, results, strict=True):
                members = items[i][1]
                scores = parse_judge_scores(_text(result), len(members), self.cfg.criterion)
                if scores is None:  # a failed request or an unreadable reply: this group alone falls back
                    stats.judge_failures += 1
                    self._fallback(members, references, stats)
                    continue
                self.cache.put(key, scores)
                self._assign(members, scores, stats)
        return stats

    def _offline(self, members: list[TreeNode], references: list[str], stats: CommitteeStats) -> list[float]:
        """The offline judge's c(n) of a group under the configured criterion (the lexical rubric for a request no
        recoverability reader knows, counted)."""
        candidates = [node_output(m) for m in members]
        if self.cfg.criterion == "recoverability":
            intent = _intent(members[0])
            scores = [offline_recoverability(c, references, intent) for c in candidates] if intent is not None else []
            if scores and all(x is not None for x in scores):
                return [float(x) for x in scores]  # type: ignore[arg-type]
            stats.recoverability_fallbacks += 1
        return [offline_judge(c, references) for c in candidates]

    def _assign(self, members: list[TreeNode], scores: list[float], stats: CommitteeStats) -> None:
        stats.scored_groups += 1
        for node, score in zip(members, scores, strict=True):
            node.committee_score = float(score)
            stats.scores.append(node.committee_score)

    def _fallback(self, members: list[TreeNode], references: list[str] | None, stats: CommitteeStats) -> None:
        stats.fallbacks += 1
        if self.cfg.fallback == "offline" and references:
            self._assign(members, self._offline(members, references, stats), stats)
        else:
            for node in members:
                node.committee_score = None


def _each(engine: Engine, requests: list[GenerationRequest]) -> list[Any]:
    """Per-request results of one batched call (an exception in place of each failed request; a whole call that
    raises, e.g. a dead engine, fails every request of it)."""
    try:
        return engine.generate_each(requests)
    except Exception as exc:
        return [exc] * len(requests)


def _text(result: Any) -> str:
    """The first completion's text, or "" for a failed request."""
    if isinstance(result, Exception) or result is None or not result.completions:
        return ""
    return result.completions[0].text
