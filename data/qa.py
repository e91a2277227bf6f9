"""Rule-based QA over the true state of a synthetic episode (AMA-Bench capability types A-D) with needle turns.

QA pairs are generated from the events the environment emitted while the trajectory was produced; each pair records
its template and arguments (``metadata.template`` / ``metadata.args``), its needle turns (the minimal turns holding
the evidence) and the evidence strings each needle turn contains (``metadata.evidence``). :func:`check_qa` verifies
a pair independently of how it was generated: it replays the episode's actions in a fresh environment built from
the episode's :class:`~memrl.data.schemas.EnvSpec` and answers the question from the replayed latent state.

Templates (each works on both environments):

- A recall: ``action_at`` (what the agent did at turn N), ``first_seen`` (where an object was when first seen),
  ``contents`` (what a container / room held when the agent opened / entered it).
- B causal inference: ``unlock_key`` (which key unlocked a target), ``fail_reason`` (why an action failed),
  ``goal_action`` (which action completed a goal).
- C state updating: ``location_after`` (where an object was after turn N), ``carrying_after`` (what the agent
  carried after turn N), ``locked_after`` (whether a target was still locked after turn N).
- D state abstraction: ``unlock_count``, ``goals_count``, ``rooms_count`` (counts up to turn N).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memrl.data.envs.base import Event, make_env
from memrl.data.schemas import EnvSpec, QAPair, Turn

__all__ = ["TEMPLATES", "check_qa", "generate_qa", "replay_views"]

INVENTORY = "inventory"


@dataclass
class _Index:
    """Events of a trajectory, indexed for the templates."""

    n_turns: int
    place_events: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # obj -> (turn, place)
    first_seen: dict[str, tuple[int, str]] = field(default_factory=dict)
    inventory_moves: list[tuple[int, str, bool]] = field(default_factory=list)  # (turn, obj, into inventory)
    unlocks: list[tuple[int, str, str]] = field(default_factory=list)  # (turn, target, key)
    lock_seen: dict[str, list[int]] = field(default_factory=dict)
    fails: list[tuple[int, str, str]] = field(default_factory=list)
    goals_done: list[tuple[int, str]] = field(default_factory=list)
    first_enter: list[tuple[int, str]] = field(default_factory=list)
    opens: list[tuple[int, str]] = field(default_factory=list)


def _index(events: list[list[Event]]) -> _Index:
    idx = _Index(n_turns=len(events))
    entered: set[str] = set()
    for t, evs in enumerate(events):
        for e in evs:
            if e.kind == "see":
                obj, place = e.args
                idx.place_events.setdefault(obj, []).append((t, place))
                idx.first_seen.setdefault(obj, (t, place))
            elif e.kind == "move":
                obj, _, dst = e.args
                idx.place_events.setdefault(obj, []).append((t, dst))
                idx.inventory_moves.append((t, obj, dst == INVENTORY))
            elif e.kind == "unlock":
                idx.unlocks.append((t, e.args[0], e.args[1]))
            elif e.kind == "see_lock":
                idx.lock_seen.setdefault(e.args[0], []).append(t)
            elif e.kind == "fail":
                idx.fails.append((t, e.args[0], e.args[1]))
            elif e.kind == "goal_done":
                idx.goals_done.append((t, e.args[0]))
            elif e.kind == "enter" and e.args[0] not in entered:
                entered.add(e.args[0])
                idx.first_enter.append((t, e.args[0]))
            elif e.kind == "open":
                idx.opens.append((t, e.args[0]))
    return idx


Candidate = tuple[str, str, list[int], dict[str, Any], dict[int, list[str]]]  # question, answer, needles, args, ev


def _pick_turn(rng: random.Random, lo: int, hi: int) -> int:
    return rng.randint(lo, hi) if hi > lo else lo


# ---------------------------------------------------------------------------------------------------- A recall
def _a_action_at(idx: _Index, turns: list[Turn], rng: random.Random) -> Candidate | None:
    n = _pick_turn(rng, 1, idx.n_turns - 1)
    action = turns[n].action
    return f"What action did the agent take at turn {n}?", action, [n], {"turn": n}, {n: [action]}


def _a_first_seen(idx: _Index, turns: list[Turn], rng: random.Random) -> Candidate | None:
    if not idx.first_seen:
        return None
    obj = rng.choice(sorted(idx.first_seen))
    t, place = idx.first_seen[obj]
    return f"Where was the {obj} when the agent first saw it?", place, [t], {"object": obj}, {t: [obj, place]}


def _a_contents(idx: _Index, turns: list[Turn], rng: random.Random) -> Candidate | None:
    if idx.opens:
        t, c = rng.choice(idx.opens)
        held = sorted(o for o, evs in idx.place_events.items() if (t, c) in evs)
        answer = ", ".join(held) or "nothing"
        q = f"Which items were in {c} when the agent opened it at turn {t}?"
        return q, answer, [t], {"container": c, "turn": t}, {t: [c, *held]}
    if len(idx.first_enter) < 2:
        return None
    t, room = rng.choice(idx.first_enter[1:])
    held = sorted(o for o, evs in idx.place_events.items() if (t, room) in evs)
    answer = ", ".join(held) or "nothing"
    q = f"Which objects did the agent see in {room} when it first entered it?"
    return q, answer, [t], {"room": room, "turn": t}, {t: [room, *held]}


# ---------------------------------------------------------------------------------------------------- B causal
def _b_unlock_key(idx: _Index, turns: list[Turn], rng: random.Random) -> Candidate | None:
    if not idx.unlocks:
        return None
    t, target, key = rng.choice(idx.unlocks)
    return (
        f"Which key did the agent use to unlock the {target}?",
        key,
        [t],
        {"target": target, "turn": t},
        {t: [key.split()[0], target]},
    )


def _b_fail_reason(idx: _Index, turns: list[Turn], rng: random.Random) -> Candidate | None:
    if not idx.fails:
        return None
    t, action, reason = rng.choice(idx.fails)
    return f"Why did the action '{action}' at turn {t} fail?", reason, [t], {"turn": t}, {t: [reason]}


def _b_goal_action(idx: _Index, turns: list[Turn], rng: random.Random) -> Candidate | None:
    if not idx.goals_done:
        return None
    t, goal = rng.choice(idx.goals_done)
    action = turns[t].action
    return (
        f"Which action completed the goal '{goal}'?",
        action,
        [t],
        {"goal": goal, "turn": t},
        {t: [action, f"goal done: {goal}"]},
    )


# ---------------------------------------------------------------------------------------------------- C updating
def _c_location_after(idx: _Index, turns: list[Turn], rng: random.Random) -> Candidate | None:
    objs = sorted(idx.place_events)
    if not objs:
        return None
    obj = rng.choice(objs)
    evs = idx.place_events[obj]
    n = _pick_turn(rng, evs[0][0], idx.n_turns - 1)
    t, place = max(e for e in evs if e[0] <= n)
    if place == INVENTORY:
        return None
    return f"Where was the {obj} after turn {n}?", place, [t], {"object": obj, "turn": n}, {t: [obj, place]}


def _c_carrying_after(idx: _Index, turns: list[Turn], rng: random.Random) -> Candidate | None:
    if not idx.inventory_moves:
        return None
    n = _pick_turn(rng, idx.inventory_moves[0][0], idx.n_turns - 1)
    last: dict[str, tuple[int, bool]] = {}
    for t, obj, into in idx.inventory_moves:
        if t <= n:
            last[obj] = (t, into)
    held = sorted(o for o, (_, into) in last.items() if into)
    if held:
        needles = sorted({last[o][0] for o in held})
        evidence = {t: [o for o in held if last[o][0] == t] for t in needles}
    else:
        t = max(t for t, _ in last.values())
        needles, evidence = [t], {t: [o for o, (tt, _) in last.items() if tt == t]}
    return f"What was the agent carrying after turn {n}?", ", ".join(held) or "nothing", needles, {"turn": n}, evidence


def _c_locked_after(idx: _Index, turns: list[Turn], rng: random.Random) -> Candidate | None:
    targets = sorted(set(idx.lock_seen) | {u[1] for u in idx.unlocks})
    if not targets:
        return None
    target = rng.choice(targets)

    def asked(n: int, locked: bool, needle: int) -> Candidate:
        """The question about turn ``n``, answered by the lock seen (``locked``) or the unlock at turn ``needle``."""
        meta, evidence = {"target": target, "turn": n}, {needle: [target, "locked" if locked else "unlock"]}
        return f"Was the {target} still locked after turn {n}?", "yes" if locked else "no", [needle], meta, evidence

    unlock = next((t for t, tg, _ in idx.unlocks if tg == target), None)
    seen = idx.lock_seen.get(target, [])
    if unlock is not None and (not seen or seen[0] > unlock or rng.random() < 0.5):
        return asked(_pick_turn(rng, unlock, idx.n_turns - 1), False, unlock)
    if not seen:
        return None
    n = _pick_turn(rng, seen[0], (unlock - 1) if unlock is not None else idx.n_turns - 1)
    return asked(n, True, max(s for s in seen if s <= n))


# ---------------------------------------------------------------------------------------------------- D abstraction
def _count(
    question: str, hits: list[tuple[int, str]], idx: _Index, rng: random.Random, key: str, min_hits: int = 1
) -> Candidate | None:
    if len(hits) < min_hits:
        return None
    n = _pick_turn(rng, hits[min_hits - 1][0], idx.n_turns - 1)
    chosen = [(t, s) for t, s in hits if t <= n]
    evidence: dict[int, list[str]] = {}
    for t, s in chosen:
        evidence.setdefault(t, []).append(s)
    return question.format(n=n), str(len(chosen)), sorted(evidence), {"turn": n, "kind": key}, evidence


def _d_unlock_count(idx: _Index, turns: list[Turn], rng: random.Random) -> Candidate | None:
    hits = [(t, target) for t, target, _ in idx.unlocks]
    return _count("How many locks had the agent opened after turn {n}?", hits, idx, rng, "unlock")


def _d_goals_count(idx: _Index, turns: list[Turn], rng: random.Random) -> Candidate | None:
    hits = [(t, f"goal done: {g}") for t, g in idx.goals_done]
    return _count("How many goals had the agent completed after turn {n}?", hits, idx, rng, "goals")


def _d_rooms_count(idx: _Index, turns: list[Turn], rng: random.Random) -> Candidate | None:
    return _count(
        "How many different rooms had the agent visited after turn {n}?", idx.first_enter, idx, rng, "rooms", 2
    )


TEMPLATES: dict[str, tuple[str, Callable[[_Index, list[Turn], random.Random], Candidate | None]]] = {
    "action_at": ("A", _a_action_at),
    "first_seen": ("A", _a_first_seen),
    "contents": ("A", _a_contents),
    "unlock_key": ("B", _b_unlock_key),
    "fail_reason": ("B", _b_fail_reason),
    "goal_action": ("B", _b_goal_action),
    "location_after": ("C", _c_location_after),
    "carrying_after": ("C", _c_carrying_after),
    "locked_after": ("C", _c_locked_after),
    "unlock_count": ("D", _d_unlock_count),
    "goals_count": ("D", _d_goals_count),
    "rooms_count": ("D", _d_rooms_count),
}
"""Template name -> (capability type, candidate generator)."""


def generate_qa(
    turns: list[Turn], events: list[list[Event]], *, per_type: int = 3, seed: int = 0, id_prefix: str = "q"
) -> list[QAPair]:
    """Up to ``per_type`` QA pairs of each type A-D, cycling through the type's templates; needle turns are spread
    over the early, middle and late parts of the trajectory (AMA-Bench's diversity-first sampling)."""
    rng = random.Random(seed)
    idx = _index(events)
    out: list[QAPair] = []
    seen_questions: set[str] = set()
    for qtype in "ABCD":
        names = [n for n, (t, _) in TEMPLATES.items() if t == qtype]
        offset = rng.randrange(len(names))
        for slot in range(per_type):
            want_third = slot % 3
            chosen: tuple[str, Candidate] | None = None
            for k in range(len(names)):
                name = names[(slot + offset + k) % len(names)]
                fallback = None
                for _ in range(8):
                    cand = TEMPLATES[name][1](idx, turns, rng)
                    if cand is None or cand[0] in seen_questions:
                        continue
                    if min(2, 3 * max(cand[2]) // max(1, idx.n_turns)) == want_third:
                        chosen = (name, cand)
                        break
                    fallback = fallback or (name, cand)
                chosen = chosen or fallback
                if chosen is not None:
                    break
            if chosen is None:
                continue
            name, (question, answer, needles, args, evidence) = chosen
            seen_questions.add(question)
            out.append(
                QAPair(
                    question=question,
                    answer=answer,
                    type=qtype,
                    needle_turns=needles,
                    qa_id=f"{id_prefix}{len(out)}",
                    metadata={
                        "template": name,
                        "args": args,
                        "evidence": {str(t): s for t, s in evidence.items()},
                    },
                )
            )
    return out


# ---------------------------------------------------------------------------------------------------- checking
def replay_views(spec: EnvSpec, turns: list[Turn]) -> list[dict[str, Any]]:
    """Rebuild the environment from ``spec``, replay the trajectory's actions (turn 0 is the reset) and return the
    latent-state view after every turn. Raises ValueError if an observation differs from the recorded one."""
    env = make_env(spec)
    first = env.reset()
    if first != turns[0].observation:
        raise ValueError("turn 0: the rebuilt environment's first observation differs")
    views = [env.view()]
    for turn in turns[1:]:
        obs = env.step(turn.action)
        if obs != turn.observation:
            raise ValueError(f"turn {turn.turn_idx}: replayed observation differs from the recorded one")
        views.append(env.view())
    return views


def _joined(items: list[str]) -> str:
    return ", ".join(sorted(items)) or "nothing"


def _expected(qa: QAPair, turns: list[Turn], views: list[dict[str, Any]]) -> str:
    """The answer to ``qa`` computed from the replayed latent state (not from the generator's event log)."""
    name, args = qa.metadata["template"], qa.metadata["args"]
    n = args.get("turn", 0)
    if name == "action_at":
        return turns[n].action
    if name == "first_seen":
        obj = args["object"]
        t = next(i for i, v in enumerate(views) if obj in v["visible"])
        return views[t]["locations"][obj]
    if name == "contents":
        place = args.get("container") or args["room"]
        return _joined([o for o, p in views[n]["locations"].items() if p == place])
    if name == "unlock_key":
        target = args["target"]
        t = next(
            i for i in range(1, len(views)) if target in views[i - 1]["locked"] and target not in views[i]["locked"]
        )
        words = turns[t].action.split()
        keys = [o for o in views[t - 1]["carrying"] if o.endswith(" key") and o.split()[0] in words]
        return keys[0] if len(keys) == 1 else f"ambiguous: {keys}"
    if name == "fail_reason":
        return views[n]["last_failure"] or "it did not fail"
    if name == "goal_action":
        return turns[n].action if views[n]["goals_done"] == views[n - 1]["goals_done"] + 1 else "no goal was done"
    if name == "location_after":
        return views[n]["locations"][args["object"]]
    if name == "carrying_after":
        return _joined(views[n]["carrying"])
    if name == "locked_after":
        return "yes" if args["target"] in views[n]["locked"] else "no"
    if name == "unlock_count":
        return str(sum(len(set(views[i - 1]["locked"]) - set(views[i]["locked"])) for i in range(1, n + 1)))
    if name == "goals_count":
        return str(views[n]["goals_done"])
    if name == "rooms_count":
        return str(len(views[n]["visited"]))
    raise ValueError(f"unknown template {name!r}")


def check_qa(qa: QAPair, turns: list[Turn], views: list[dict[str, Any]]) -> list[str]:
    """Problems with ``qa`` against the replayed state ``views`` (empty when the answer is right and every needle
    turn holds its evidence)."""
    problems = []
    expected = _expected(qa, turns, views)
    if expected != qa.answer:
        problems.append(f"{qa.qa_id}: answer {qa.answer!r} but the replayed state says {expected!r}")
    if not qa.needle_turns:
        problems.append(f"{qa.qa_id}: no needle turns")
    evidence = qa.metadata.get("evidence", {})
    for t in qa.needle_turns:
        text = f"{turns[t].action}\n{turns[t].observation}"
        for s in evidence.get(str(t), []):
            if s not in text:
                problems.append(f"{qa.qa_id}: needle turn {t} does not contain {s!r}")
        if str(t) not in evidence:
            problems.append(f"{qa.qa_id}: needle turn {t} has no evidence recorded")
    return problems
