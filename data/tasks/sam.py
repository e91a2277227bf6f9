"""SAM task family: guided exploration of the text world, then a question whose evidence sits in early pages.

An episode is a tour of ``T`` steps through a :class:`~memrl.data.envs.textworld.TextWorldEnv`: every observation ends
with ``next: ACTION`` (the tour's next step), and the observation of step ``T`` carries ``question: ...`` instead.
Facts are short key-before-value lines (``the red key is in drawer 5``; a locked container prints ``the brass key
opens chest 7``). The question asks where an item seen in the first ``evidence_frac`` of the tour is
(``where is the red key?``) or, with two evidence facts, where the key that opens a container is (``where is the key
that opens chest 7?``: one page says which key opens it, another where that key is). With ``repeat_evidence_frac``
that share of episodes states each evidence fact twice: the tour comes back to the evidence container before leaving
its room (``close C`` then ``open C`` again; a locked container is tried again), so a reader that misses the first
statement can still find the second.

:class:`SamTask` implements the agent loop's task interface (``reset``, ``step -> (observation, done)``,
``finish(answer) -> outcome``) plus ``snapshot()`` / ``restore()``. :class:`SamReasoner` is the scripted frozen
reasoner; :func:`memrl.data.tasks.sam_reference.simulate_sam` is the reference loop that measures the task's success
rates with it.
"""

from __future__ import annotations

import copy
import functools
import random
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, model_validator

from memrl.data.config import ConfigModel
from memrl.data.envs.base import count_tokens, turn_tokens
from memrl.data.envs.textworld import TextWorldEnv, TextWorldParams
from memrl.data.envs.vocab import COLORS, CONTAINERS, NOUNS
from memrl.data.formats import (
    parse_sam_memory_block,
    parse_sam_recalled,
    parse_tool_calls,
    render_tool_call,
)
from memrl.data.registry import register_reasoner, register_task
from memrl.data.schemas import Episode, QAPair, Turn
from memrl.data.tasks.common import SpecTask, content_of, normalize_answer, role_of

__all__ = [
    "SAM_SETTINGS",
    "SAM_TASK",
    "SamFacts",
    "SamReasoner",
    "SamSetting",
    "SamTask",
    "SamTaskParams",
    "parse_facts",
    "render_page",
]

SAM_TASK = "explore the house and answer the question at the end."

_LOC = re.compile(r"^the (.+?) is in (\w+ \d+)$")
_LOC_PARA = re.compile(r"^(\w+ \d+) holds the (.+)$")
_OPENS = re.compile(r"^the (.+?) opens (\w+ \d+)$")
_OPENS_PARA = re.compile(r"^(\w+ \d+) opens with the (.+)$")
_QUESTION = re.compile(r"^question: where is the (.+)\?$", re.MULTILINE)
_NEXT = re.compile(r"^next: (.+)$", re.MULTILINE)
_OPENER_Q = "key that opens "


@dataclass
class SamFacts:
    """Facts read from text: item -> place, container -> the key that opens it."""

    location: dict[str, str] = field(default_factory=dict)
    opener: dict[str, str] = field(default_factory=dict)

    def update(self, other: SamFacts) -> None:
        """Add ``other``'s facts (later facts win)."""
        self.location.update(other.location)
        self.opener.update(other.opener)


def parse_facts(text: str) -> SamFacts:
    """Every fact line of ``text``, in its verbatim (``the red key is in drawer 5``, ``the brass key opens
    chest 7``) or paraphrased (``drawer 5 holds the red key``, ``chest 7 opens with the brass key``) form."""
    facts = SamFacts()
    for raw in text.split("\n"):
        line = raw.strip().rstrip(".")
        if m := _OPENS.match(line):
            facts.opener[m.group(2)] = m.group(1)
        elif m := _OPENS_PARA.match(line):
            facts.opener[m.group(1)] = m.group(2)
        elif m := _LOC.match(line):
            facts.location[m.group(1)] = m.group(2)
        elif m := _LOC_PARA.match(line):
            facts.location[m.group(2)] = m.group(1)
    return facts


class SamTaskParams(ConfigModel):
    """Knobs of a SAM task."""

    horizon_steps: int | None = Field(24, ge=2, description="tour length T (steps before the question)")
    target_tokens: int | None = Field(None, ge=64, description="grow the tour to this many tokens instead")
    facts_per_obs: int = Field(3, ge=1, le=8, description="items listed when a container is opened")
    containers_per_room: int = Field(3, ge=1, le=8)  # containers in each room
    n_evidence: Literal[1, 2] = 1  # 1: where is an item; 2: where is the key that opens a container
    evidence_frac: float = Field(0.3, gt=0, le=1, description="the evidence lies in this first part of the tour")
    locked_frac: float = Field(0.15, ge=0, le=1, description="share of containers that are locked")
    n_colors: int = Field(len(COLORS), ge=2, le=len(COLORS))  # colours item names are drawn from
    n_nouns: int = Field(len(NOUNS), ge=2, le=len(NOUNS))  # nouns item names are drawn from
    n_container_kinds: int = Field(len(CONTAINERS), ge=1, le=len(CONTAINERS))  # container kinds (chest, ...) used
    step_slack: int = Field(6, ge=0, description="reasoner calls allowed beyond the tour (recall, answer)")
    repeat_evidence_frac: float = Field(
        0.0, ge=0, le=1, description="share of episodes whose evidence facts are stated in two different turns"
    )

    @model_validator(mode="after")
    def _one_horizon(self) -> SamTaskParams:
        if (self.horizon_steps is None) == (self.target_tokens is None):
            raise ValueError("set exactly one of horizon_steps and target_tokens")
        return self


class SamSetting(ConfigModel):
    """A named learning setting: the tasks the expert is distilled on (the SFT data), the RL training tasks, the dev
    and test tasks (same parameters, disjoint seeds: tune on dev, report on test), and the expert's noise knobs
    (:class:`~memrl.data.experts.sam.SamOracleConfig` fields)."""

    description: str
    sft: SamTaskParams  # tasks of the SFT data (the expert inside SAM, rejection-sampled)
    distill_tasks: int = Field(600, ge=1)  # tasks the expert is run on
    expert: dict[str, Any] = {}  # SamOracleConfig knobs of the distilled expert
    train: SamTaskParams  # RL training tasks
    test: SamTaskParams  # dev and test tasks
    train_seed: int = 100_000
    dev_seed: int = 300_000
    test_seed: int = 400_000


_MULTIHOP = SamTaskParams(horizon_steps=16, n_evidence=2, facts_per_obs=2, containers_per_room=2, evidence_frac=0.5)

SAM_SETTINGS: dict[str, SamSetting] = {
    # Credit assignment matters: two-hop questions (which key opens chest 7; where is that key) whose evidence lies
    # on different pages, two items per opened container (distractor facts on every page), one-turn pages, so an
    # episode makes two or more recalls of two pages each after ~16 cue writes, and what a cue keeps decides which
    # pages a later recall can find. The gap to the expert is the student's own: a small, noisy expert data set
    # (150 tasks, 10% cue/recall errors, rejection-sampled) at horizon 12, trained and tested at horizon 16 (chosen on
    # the dev split: at 20 the SFT student's sampled success was 0/24, no signal for any variant).
    "multihop": SamSetting(
        description="two-hop questions, distractor facts, several recalls per episode; limited noisy expert data at "
        "horizon 12, RL and test at horizon 16",
        sft=_MULTIHOP.model_copy(update={"horizon_steps": 12}),
        distill_tasks=150,
        expert={"error_rate": 0.1},
        train=_MULTIHOP,
        test=_MULTIHOP,
    ),
    # The quickstart's setting: one-hop questions, a privileged expert that defers facts the tour restates later
    # (defer_to_later 0.9), so the student learns to drop facts it cannot know are restated (a planted mode).
    "deferring_expert": SamSetting(
        description="one-hop questions; the privileged expert defers restated facts (the quickstart's planted gap)",
        sft=SamTaskParams(horizon_steps=12, facts_per_obs=1, containers_per_room=2, repeat_evidence_frac=0.5),
        distill_tasks=600,
        expert={"defer_to_later": 0.9},
        train=SamTaskParams(horizon_steps=12, facts_per_obs=1, containers_per_room=2, repeat_evidence_frac=0.5),
        test=SamTaskParams(horizon_steps=24, facts_per_obs=1, containers_per_room=2, repeat_evidence_frac=0.5),
    ),
}


@register_task(
    "sam", params=SamTaskParams, section="sam", reasoner="sam", memory="sam", oracle="memrl.data.experts.sam:SamOracle"
)
class SamTask(SpecTask):
    """One SAM episode (see the module docstring). Deterministic for (params, seed); survives ``copy.deepcopy``."""

    family = "sam"

    def __init__(self, params: SamTaskParams | dict[str, Any] | None = None, seed: int = 0, task_id: str = "") -> None:
        self.params = params if isinstance(params, SamTaskParams) else SamTaskParams.model_validate(params or {})
        self.seed = seed
        self.task_id = task_id or f"sam-{seed}"
        self.task = SAM_TASK
        self._build()
        self.max_steps = len(self.tour) + self.params.step_slack
        self.pos = 0
        self.env = copy.deepcopy(self._fresh)

    # ------------------------------------------------------------------------------------------------ building
    def _world_params(self, n_rooms: int, variants: int) -> TextWorldParams:
        p = self.params
        n_containers = n_rooms * p.containers_per_room
        return TextWorldParams(
            n_rooms=n_rooms,
            containers_per_room=p.containers_per_room,
            items_per_container=p.facts_per_obs,
            floor_items=0,
            n_locked=min(len(COLORS), max(3 if p.n_evidence == 2 else 0, round(p.locked_frac * n_containers))),
            n_colors=p.n_colors,
            n_nouns=p.n_nouns,
            n_container_kinds=p.n_container_kinds,
            item_variants=variants,
            verbosity=1,
            lock_hints=True,
        )

    @staticmethod
    def _tour(env: TextWorldEnv) -> list[str]:
        """Depth-first tour: open every container of a room, then visit the unvisited neighbours and come back."""
        actions: list[str] = []
        visited: set[str] = set()
        stack: list[tuple[str, list[tuple[str, str]]]] = []

        def enter(room: str) -> None:
            visited.add(room)
            actions.extend(f"open {c}" for c in env.containers_in(room))
            stack.append((room, sorted(env.s.exits[room].items())))

        enter(env.s.room)
        while stack:
            room, todo = stack[-1]
            while todo and todo[0][1] in visited:
                todo.pop(0)
            if not todo:
                stack.pop()
                if stack:
                    parent = stack[-1][0]
                    back = next(d for d, r in sorted(env.s.exits[room].items()) if r == parent)
                    actions.append(f"go {back}")
                continue
            d, nxt = todo.pop(0)
            actions.append(f"go {d}")
            enter(nxt)
        return actions

    def _build(self) -> None:
        p = self.params
        rng = random.Random(self.seed)
        steps = p.horizon_steps or max(8, p.target_tokens // (6 + 9 * p.facts_per_obs))  # type: ignore[operator]
        n_rooms = max(2, steps // (p.containers_per_room + 2) + 2)
        for _ in range(40):
            n_containers = n_rooms * p.containers_per_room
            pool = p.n_colors * p.n_nouns
            variants = max(1, -(-(n_containers * p.facts_per_obs + 16) // pool))
            world = self._world_params(n_rooms, variants)
            env = TextWorldEnv(world, rng.getrandbits(31))
            first = self._strip(env.reset())
            tour = self._tour(env)
            fresh = copy.deepcopy(env)
            turns, events = [Turn(turn_idx=0, action="look", observation=first)], [list(env.events)]
            # count each observation with its `next:` line, as the episode shows it
            tokens = turn_tokens("look", first) + count_tokens(f"\nnext: {tour[0]}")
            limit = p.horizon_steps or len(tour)
            for i, action in enumerate(tour[:limit]):
                obs = self._strip(env.step(action))
                turns.append(Turn(turn_idx=i + 1, action=action, observation=obs))
                events.append(list(env.events))
                tokens += turn_tokens(action, obs) + count_tokens(f"\nnext: {tour[i + 1] if i + 1 < len(tour) else ''}")
                if p.target_tokens is not None and tokens >= p.target_tokens:
                    break
            complete = len(turns) - 1 >= (p.horizon_steps or 0) and (
                p.target_tokens is None or tokens >= p.target_tokens
            )
            if not complete:
                n_rooms = int(n_rooms * 1.5) + 1
                continue
            chosen = self._choose_question(turns, events, rng)
            if chosen is None:
                continue
            # A separate stream, so switching the knob on never changes which question an episode asks.
            self.repeated_evidence = p.repeat_evidence_frac > 0 and (
                random.Random(f"sam-repeat/{self.seed}").random() < p.repeat_evidence_frac
            )
            if self.repeated_evidence:
                turns, chosen = self._repeat_evidence(fresh, tour, turns, events, chosen)
            self.tour = [t.action for t in turns[1:]]
            self._fresh = fresh
            self.question, self.answer, self.evidence_turns, self.gold_entities = chosen
            self._observations = [t.observation for t in turns]
            return
        raise ValueError(f"could not build a SAM task for {p.model_dump()} (seed {self.seed})")

    def _repeat_evidence(
        self,
        fresh: TextWorldEnv,
        tour: list[str],
        turns: list[Turn],
        events: list[list[Any]],
        chosen: tuple[str, str, list[int], list[str]],
    ) -> tuple[list[Turn], tuple[str, str, list[int], list[str]]]:
        """Insert a revisit of every evidence container right after its room's run of ``open`` steps, replay the
        episode with the same number of steps, and return the turns and the question with both evidence turns."""
        question, answer, evidence, gold = chosen
        actions = list(tour)
        for t in sorted(evidence, reverse=True):
            container = actions[t - 1][len("open ") :]
            locked = any(e.kind == "hint" for e in events[t])
            at = t
            while at < len(actions) and actions[at].startswith("open "):
                at += 1
            actions[at:at] = [f"open {container}"] if locked else [f"close {container}", f"open {container}"]
        env = copy.deepcopy(fresh)
        replay = [turns[0]]
        needles: set[int] = set()
        for i, action in enumerate(actions[: len(turns) - 1]):
            replay.append(Turn(turn_idx=i + 1, action=action, observation=self._strip(env.step(action))))
            for e in env.events:
                if (e.kind == "see" and e.args[0] in gold) or (e.kind == "hint" and e.args[1] in gold):
                    needles.add(i + 1)
        return replay, (question, answer, sorted(needles), gold)

    @staticmethod
    def _strip(observation: str) -> str:
        return "\n".join(line for line in observation.split("\n") if not line.startswith("goal"))

    def _choose_question(
        self, turns: list[Turn], events: list[list[Any]], rng: random.Random
    ) -> tuple[str, str, list[int], list[str]] | None:
        last = max(1, int((len(turns) - 1) * self.params.evidence_frac))
        if self.params.n_evidence == 2:
            last = max(last, min(len(turns) - 1, 6))
        seen: dict[str, tuple[int, str]] = {}
        hints: dict[str, tuple[int, str]] = {}
        for t in range(1, last + 1):
            for e in events[t]:
                if e.kind == "see":
                    seen.setdefault(e.args[0], (t, e.args[1]))
                elif e.kind == "hint":
                    hints.setdefault(e.args[1], (t, e.args[0]))
        if self.params.n_evidence == 1:
            if not seen:
                return None
            item = rng.choice(sorted(seen))
            t, place = seen[item]
            return f"where is the {item}?", place, [t], [item]
        pairs = [(c, k) for c, (_, k) in hints.items() if k in seen and seen[k][0] != hints[c][0]]
        if not pairs:
            return None
        container, key = rng.choice(sorted(pairs))
        return (
            f"where is the {_OPENER_Q}{container}?",
            seen[key][1],
            sorted([hints[container][0], seen[key][0]]),
            [key, container],
        )

    # ------------------------------------------------------------------------------------------------ running
    def _suffix(self) -> str:
        if self.pos >= len(self.tour):
            return f"question: {self.question}"
        return f"next: {self.tour[self.pos]}"

    def reset(self) -> str:
        """Start the episode; return the first observation."""
        self.env = copy.deepcopy(self._fresh)
        self.pos = 0
        return f"{self._observations[0]}\n{self._suffix()}"

    def step(self, action: str) -> tuple[str, bool]:
        """Execute ``action`` in the world; the observation ends with the next tour step or the question."""
        action = action.strip()
        obs = self._strip(self.env.step(action))
        if self.pos < len(self.tour) and action == self.tour[self.pos]:
            self.pos += 1
        return f"{obs}\n{self._suffix()}", False

    def finish(self, answer: str | None) -> float:
        """Normalised exact match of ``answer`` against the gold answer."""
        return float(normalize_answer(answer) == normalize_answer(self.answer))

    @property
    def horizon_label(self) -> str:
        """The horizon in per-horizon breakdowns (``12 steps``, ``4096 tok``)."""
        p = self.params
        return f"{p.horizon_steps} steps" if p.horizon_steps is not None else f"{p.target_tokens} tok"

    def rollout_metadata(self, system: Any, config: Any) -> dict[str, Any]:
        """The episode metadata of a rollout (the oracle expert's view of the true state; never shown to a model)."""
        return {
            "family": "sam",
            "memory": system.name,
            "gold_entities": list(self.gold_entities),
            "evidence_steps": list(self.evidence_turns),
        }

    def snapshot(self) -> Any:
        """The episode's state (world + tour position)."""
        return copy.deepcopy((self.env.snapshot(), self.pos))

    def restore(self, snap: Any) -> None:
        """Return to a state taken by :meth:`snapshot`."""
        world, pos = copy.deepcopy(snap)
        self.env.restore(world)
        self.pos = pos

    def episode(self) -> Episode:
        """The episode in AMA-Bench's shape: the tour as the trajectory, the question as its QA pair."""
        turns = [Turn(turn_idx=0, action="look", observation=f"{self._observations[0]}\nnext: {self.tour[0]}")]
        for i, action in enumerate(self.tour):
            suffix = f"next: {self.tour[i + 1]}" if i + 1 < len(self.tour) else f"question: {self.question}"
            turns.append(Turn(turn_idx=i + 1, action=action, observation=f"{self._observations[i + 1]}\n{suffix}"))
        qa = QAPair(
            question=self.question,
            answer=self.answer,
            type="A" if self.params.n_evidence == 1 else "B",
            needle_turns=self.evidence_turns,
            qa_id=f"{self.task_id}/q0",
            metadata={"gold_entities": self.gold_entities, "hops": self.params.n_evidence},
        )
        return self._episode(
            turns,
            [qa],
            task_type="sam",
            domain="textworld",
            metadata={
                "family": "sam",
                "tour_steps": len(self.tour),
                "gold_entities": self.gold_entities,
                "repeated_evidence": self.repeated_evidence,
            },
        )


# ---------------------------------------------------------------------------------------------------- reasoner
# The reasoner re-reads its whole context at every step; messages repeat from step to step, so what it reads from one
# message is cached by the message text (a long-context run re-reads thousands of messages per step).


@dataclass(frozen=True)
class _Read:
    location: tuple[tuple[str, str], ...] = ()
    opener: tuple[tuple[str, str], ...] = ()
    question: str | None = None
    next_action: str | None = None


@functools.lru_cache(maxsize=1 << 16)
def _read_message(text: str, may_be_recalled: bool) -> _Read:
    """Facts, question and next step of an observation; only facts of recalled content (a user message)."""
    recalled = parse_sam_recalled(text) if may_be_recalled else None
    facts = parse_facts(recalled[2] if recalled is not None else text)
    location, opener = tuple(facts.location.items()), tuple(facts.opener.items())
    if recalled is not None:
        return _Read(location, opener)
    q, n = _QUESTION.search(text), _NEXT.search(text)
    return _Read(location, opener, q.group(1) if q else None, n.group(1) if n else None)


@functools.lru_cache(maxsize=1 << 14)
def _memory_calls(text: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(intent, page ids) of every memory call in an assistant message."""
    out = []
    for call in parse_tool_calls(text).calls:
        if call.name == "memory":
            ids = call.arguments.get("page_ids", [])
            ids = ids if isinstance(ids, list) else [ids]
            pages = tuple(int(i) for i in ids if str(i).lstrip("-").isdigit())
            out.append((str(call.arguments.get("intent", "")), pages))
    return tuple(out)


@functools.lru_cache(maxsize=1 << 10)
def _cues(text: str) -> tuple[tuple[int, str], ...]:
    return tuple(parse_sam_memory_block(text)[1].items())


def _memory_mode(system: str | None) -> Literal["cues", "intent", "none"]:
    """The memory tool the system prompt offers: SAM's (page ids from the cues), intent-only retrieval, or none."""
    if system is None or "memory(intent, page_ids)" in system:
        return "cues"
    return "intent" if "memory(intent)" in system else "none"


def _term_set(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+|\d+", text.lower())) - {"the", "a", "an", "is", "in", "where", "which", "that"}


@register_reasoner("sam")
class SamReasoner:
    """The scripted frozen reasoner of SAM tasks (a :class:`~memrl.data.schemas.ScriptedPolicy`).

    It reads: the system prompt (which tools it has: ``memory(intent, page_ids)`` as under SAM, ``memory(intent)``
    as under the retrieval baselines, or no memory tool as under long-context; no system message means SAM's), the
    memory block (``task: ...`` / ``memory cues:`` / ``pN: cue``), observations (``user`` or ``tool`` messages; the
    latest ``next:`` line says what to do), recalled content (user messages from
    :func:`~memrl.data.formats.render_sam_recalled`) and its own earlier tool calls (assistant messages). It replies
    with one tool call: ``act`` while exploring; once the question is visible, ``answer`` if the facts it can see answer
    it, else a recall: under SAM, ``memory(intent, page_ids)`` on the best-matching untried pages while the intent's
    budget lasts (``recall_budget`` calls per intent; a recall that came back empty is followed by the next-best
    pages); under retrieval, which has no cues to pick from, ``memory(intent)`` once per intent; else
    ``answer("unknown")``.
    """

    name = "sam-reasoner"

    def __init__(self, max_pages: int = 2, recall_budget: int = 2) -> None:
        self.max_pages = max_pages
        self.recall_budget = recall_budget

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        """Reply to the SAM memory system's messages with one tool call."""
        cues: dict[int, str] = {}
        facts = SamFacts()
        question: str | None = None
        next_action: str | None = None
        tried: dict[str, set[int]] = {}
        recalls: dict[str, int] = {}
        system: str | None = None
        for m in messages:
            role, text = role_of(m), content_of(m)
            if role == "system":
                system = text
                continue
            if role == "assistant":
                for intent, ids in _memory_calls(text):
                    recalls[intent] = recalls.get(intent, 0) + 1
                    tried.setdefault(intent, set()).update(ids)
                continue
            if role == "user" and text.startswith("task: "):
                cues.update(_cues(text))
                continue
            read = _read_message(text, role == "user")
            facts.location.update(read.location)
            facts.opener.update(read.opener)
            question = read.question or question
            next_action = read.next_action or next_action
        if question is None:
            return render_tool_call("act", {"action": next_action or "look"})
        answer, target_terms, intent = self._resolve(question, facts)
        if answer is not None:
            return render_tool_call("answer", {"answer": answer})
        mode = _memory_mode(system)
        asked = recalls.get(intent, 0)
        if mode == "cues" and asked < self.recall_budget:
            pages = self._select(cues, target_terms, tried.get(intent, set()))
            if pages:
                return render_tool_call("memory", {"intent": intent, "page_ids": pages})
        elif mode == "intent" and asked == 0:
            return render_tool_call("memory", {"intent": intent})
        return render_tool_call("answer", {"answer": "unknown"})

    @staticmethod
    def _resolve(question: str, facts: SamFacts) -> tuple[str | None, str, str]:
        """(answer or None, the entity still sought, the recall intent)."""
        if question.startswith(_OPENER_Q):
            container = question[len(_OPENER_Q) :]
            key = facts.opener.get(container)
            if key is None:
                return None, container, f"which key opens {container}"
            if key in facts.location:
                return facts.location[key], key, ""
            return None, key, f"where is the {key}"
        if question in facts.location:
            return facts.location[question], question, ""
        return None, question, f"where is the {question}"

    def _select(self, cues: dict[int, str], target: str, tried: set[int]) -> list[int]:
        """Untried pages whose cue best matches ``target`` (token overlap, the exact entity first, then recency)."""
        terms = _term_set(target)
        scored = []
        for page_id, cue in cues.items():
            if page_id in tried:
                continue
            entities = {e.strip() for e in cue.lower().split(",")}
            score = len(terms & _term_set(cue)) + (10 if target in entities else 0)
            if score > 0:
                scored.append((-score, -page_id, page_id))
        return [p for _, _, p in sorted(scored)[: self.max_pages]]


# ---------------------------------------------------------------------------------------------------- pages
def render_page(turns: list[tuple[str, str]], steps: list[int] | None = None) -> str:
    """A page's raw text: each turn as ``tN> action`` (``> action`` without ``steps``; the line is omitted for the
    first observation, which has no action) and its observation."""
    parts = []
    for i, (action, observation) in enumerate(turns):
        head = f"t{steps[i]}> " if steps is not None else "> "
        parts.append(f"{head}{action}\n{observation}" if action else observation)
    return "\n".join(parts)
