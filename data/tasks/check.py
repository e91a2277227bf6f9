"""Replay checks of the QA pairs every synthetic family writes, against the true state (not the generator's log).

- ``ama``: :func:`memrl.data.qa.check_qa` on the latent-state views of the replayed environment.
- ``sam``: the tour is replayed in the task rebuilt from the episode's spec; the answer must be where the asked item
  (or the key that opens the asked container) lies in the replayed world, and the needle turns must state the facts
  that lead there (``the red key is in drawer 5``, ``the brass key opens chest 7``).
- ``proactive``: the commands are replayed in the task rebuilt from the spec; the answer must be the planted value of
  the asked fact, and the needle turn must state that value.

Every check also fails when a replayed observation differs from the recorded one (a tampered or stale episode).
"""

from __future__ import annotations

import re
from typing import Any

from memrl.data.qa import check_qa, replay_views
from memrl.data.schemas import Episode, Turn
from memrl.data.tasks.proactive import FACT_KINDS, ProactiveTask, fact_value
from memrl.data.tasks.sam import SamTask

__all__ = ["check_episode_qa", "check_proactive_qa", "check_sam_qa"]

_SAM_Q = re.compile(r"where is the (.+)\?")
_OPENER_Q = "key that opens "
_PROACTIVE_Q = re.compile(r"what is the (.+) fact of this task\?")


def _replayed(episode: Episode, family: type[SamTask] | type[ProactiveTask]) -> tuple[Any, str | None]:
    """The task rebuilt from the episode's spec with every recorded action replayed, or the first problem: no spec,
    or a replayed observation that differs from the recorded one."""
    if episode.env is None:
        return None, f"{episode.episode_id}: no env spec to replay"
    task = family.from_spec(episode.env, episode.episode_id)
    turns: list[Turn] = episode.trajectory
    if task.reset() != turns[0].observation:
        return None, f"{episode.episode_id}: turn 0: the rebuilt task's first observation differs"
    for turn in turns[1:]:
        observation, _ = task.step(turn.action)
        if observation != turn.observation:
            where = f"{episode.episode_id}: turn {turn.turn_idx}"
            return None, f"{where}: replayed observation differs from the recorded one"
    return task, None


def _needle_problems(qa_id: str, turns: list[Turn], needles: list[int], statements: list[str]) -> list[str]:
    """Every statement is a line of some needle turn, and every needle turn holds one of them."""
    if not needles:
        return [f"{qa_id}: no needle turns"]
    problems = []
    lines: dict[int, set[str]] = {}
    for t in needles:
        if not 0 <= t < len(turns):
            problems.append(f"{qa_id}: needle turn {t} is outside the trajectory")
            continue
        lines[t] = {line.strip().rstrip(".") for line in turns[t].observation.split("\n")}
        if not any(s in lines[t] for s in statements):
            problems.append(f"{qa_id}: needle turn {t} states none of {statements}")
    for s in statements:
        if not any(s in held for held in lines.values()):
            problems.append(f"{qa_id}: no needle turn states {s!r}")
    return problems


def check_sam_qa(episode: Episode) -> list[str]:
    """Problems with a SAM episode's QA pairs against its replayed world (empty when all are right)."""
    task, problem = _replayed(episode, SamTask)
    if task is None:
        return [str(problem)]
    world = task.env.s
    last = episode.trajectory[-1].observation
    problems = []
    for qa in episode.qa_pairs:
        qa_id = qa.qa_id or qa.question
        m = _SAM_Q.fullmatch(qa.question)
        if m is None:
            problems.append(f"{qa_id}: not a SAM question: {qa.question!r}")
            continue
        if f"question: {qa.question}" not in last.split("\n"):
            problems.append(f"{qa_id}: the last turn does not ask {qa.question!r}")
        target = m.group(1)
        if target.startswith(_OPENER_Q):
            container = target[len(_OPENER_Q) :]
            keys = sorted(k for k, c in world.key_of.items() if c == container)
            if len(keys) != 1:
                problems.append(f"{qa_id}: {container} is opened by {keys or 'no key'} in the replayed world")
                continue
            place = world.loc[keys[0]]
            statements = [f"the {keys[0]} opens {container}", f"the {keys[0]} is in {place}"]
        else:
            if target not in world.loc:
                problems.append(f"{qa_id}: there is no {target} in the replayed world")
                continue
            place = world.loc[target]
            statements = [f"the {target} is in {place}"]
        if qa.answer != place:
            problems.append(f"{qa_id}: answer {qa.answer!r} but the replayed state says {place!r}")
        problems += _needle_problems(qa_id, episode.trajectory, qa.needle_turns, statements)
    return problems


def check_proactive_qa(episode: Episode) -> list[str]:
    """Problems with a proactive episode's QA pairs against its replayed terminal (empty when all are right)."""
    task, problem = _replayed(episode, ProactiveTask)
    if task is None:
        return [str(problem)]
    problems = []
    for qa in episode.qa_pairs:
        qa_id = qa.qa_id or qa.question
        m = _PROACTIVE_Q.fullmatch(qa.question)
        kind = m.group(1).replace(" ", "_") if m else None
        if kind not in FACT_KINDS or kind not in task.facts:
            problems.append(f"{qa_id}: not a question about a planted fact: {qa.question!r}")
            continue
        truth = task.values[kind]
        if qa.answer != truth:
            problems.append(f"{qa_id}: answer {qa.answer!r} but the task's state says {truth!r}")
        if not qa.needle_turns:
            problems.append(f"{qa_id}: no needle turns")
        for t in qa.needle_turns:
            if not 0 <= t < len(episode.trajectory):
                problems.append(f"{qa_id}: needle turn {t} is outside the trajectory")
            elif fact_value(kind, episode.trajectory[t].observation) != truth:
                problems.append(f"{qa_id}: needle turn {t} does not state {kind} = {truth!r}")
    return problems


def check_episode_qa(episode: Episode) -> list[str]:
    """Problems with any synthetic episode's QA pairs, by its family (``metadata.family``); empty when all answers
    replay correctly and every needle turn holds its evidence."""
    family = episode.metadata.get("family")
    if family == "sam":
        return check_sam_qa(episode)
    if family == "proactive":
        return check_proactive_qa(episode)
    if family == "ama":
        if episode.env is None:
            return [f"{episode.episode_id}: no env spec to replay"]
        try:
            views = replay_views(episode.env, episode.trajectory)
        except ValueError as exc:
            return [f"{episode.episode_id}: {exc}"]
        return [p for qa in episode.qa_pairs for p in check_qa(qa, episode.trajectory, views)]
    return [f"{episode.episode_id}: no replay check for family {family!r}"]
