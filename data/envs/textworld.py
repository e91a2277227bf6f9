"""A text-adventure world (TextWorld-like): rooms joined by exits, containers (some locked) holding items, an
inventory, and an endless chain of ``put the X in the C`` goals. With ``chain_length`` k > 1 each goal is an
instruction chain of k steps done in order (``put the red key in chest 3, then take the blue map to the kitchen``):
the first step is a ``put``, later ones a ``put`` or a ``take the X to the ROOM`` (carry it there); the transition
function checks the current step after every action (``goal step i of k done: ...``) and the goal is done when the
last step is.

Actions: ``go DIR``, ``open C``, ``close C``, ``take X from C``, ``take X`` (from the floor), ``put X in C``,
``unlock C with K``, ``look``, ``inventory``. An impossible action fails with a reason and changes nothing.
Observation verbosity: 0 terse symbolic, 1 short sentences (one fact per line, key before value:
``the red key is in drawer 5``), 2 sentences plus the inventory and the goal after every step.
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from memrl.data.config import ConfigModel
from memrl.data.envs.base import Env, Event, register
from memrl.data.envs.vocab import COLORS, CONTAINERS, DIRECTIONS, NOUNS, OPPOSITE, ROOMS

__all__ = ["TextWorldEnv", "TextWorldParams"]

INVENTORY = "inventory"


class TextWorldParams(ConfigModel):
    """Difficulty vector of the text world."""

    n_rooms: int = Field(6, ge=1, le=20000)
    containers_per_room: int = Field(2, ge=1, le=8)
    items_per_container: int = Field(2, ge=0, le=8)
    floor_items: int = Field(1, ge=0, le=16)
    n_locked: int = Field(2, ge=0, description="locked containers, each opened by its own key")
    n_colors: int = Field(len(COLORS), ge=1, le=len(COLORS))
    n_nouns: int = Field(len(NOUNS), ge=1, le=len(NOUNS))
    n_container_kinds: int = Field(len(CONTAINERS), ge=1, le=len(CONTAINERS))
    item_variants: int = Field(1, ge=1, le=1000, description="numbered copies of each colour+noun name")
    verbosity: int = Field(1, ge=0, le=2)
    lock_hints: bool = Field(True, description="a locked container names the key that opens it")
    chain_length: int = Field(
        1, ge=1, le=16, description="steps per goal (an instruction chain)", json_schema_extra={"omit_if_default": True}
    )


@dataclass
class TextWorldState:
    """The latent state."""

    rooms: list[str] = field(default_factory=list)
    exits: dict[str, dict[str, str]] = field(default_factory=dict)
    container_room: dict[str, str] = field(default_factory=dict)
    opened: set[str] = field(default_factory=set)
    locked: dict[str, str] = field(default_factory=dict)  # container -> key item
    key_of: dict[str, str] = field(default_factory=dict)  # key item -> container it opens (kept after unlocking)
    loc: dict[str, str] = field(default_factory=dict)  # item -> container, room (floor) or "inventory"
    held: dict[str, list[str]] = field(default_factory=dict)  # place -> items (the index of ``loc``)
    room_containers: dict[str, list[str]] = field(default_factory=dict)
    room: str = ""
    visited: list[str] = field(default_factory=list)
    goal: tuple[str, str, str] | None = None  # the current step of ``chain``: ("put", item, container) or
    # ("bring", item, room)
    chain: list[tuple[str, str, str]] = field(default_factory=list)
    chain_pos: int = 0
    goals_done: int = 0
    last_failure: str | None = None
    rng: random.Random = field(default_factory=random.Random)


_ACTION_RE = [
    ("go", re.compile(r"go (\w+)\Z")),
    ("take_from", re.compile(r"take (.+?) from (.+)\Z")),
    ("take", re.compile(r"take (.+)\Z")),
    ("put", re.compile(r"put (.+?) in (.+)\Z")),
    ("unlock", re.compile(r"unlock (.+?) with (.+)\Z")),
    ("open", re.compile(r"open (.+)\Z")),
    ("close", re.compile(r"close (.+)\Z")),
    ("look", re.compile(r"look\Z")),
    ("inventory", re.compile(r"inventory\Z")),
]


def _strip_the(name: str) -> str:
    return name[4:] if name.startswith("the ") else name


@register
class TextWorldEnv(Env):
    """The text-adventure world (see the module docstring)."""

    name = "textworld"
    params_model = TextWorldParams
    params: TextWorldParams
    state_model = TextWorldState
    s: TextWorldState

    # ------------------------------------------------------------------------------------------------ building
    def reset(self) -> str:
        """Build the world from the seed and return the first observation."""
        p = self.params
        rng, s = self._seeded_state()
        s.rooms = self._room_names(rng, p.n_rooms)
        self._layout(rng, s)
        kinds = list(CONTAINERS[: p.n_container_kinds])
        n_containers = p.n_rooms * p.containers_per_room
        per_kind = -(-n_containers // len(kinds))
        numbers = {k: rng.sample(range(1, max(10, 3 * per_kind) + 1), per_kind) for k in kinds}
        names = [f"{k} {numbers[k][i]}" for i in range(per_kind) for k in kinds][:n_containers]
        rng.shuffle(names)
        containers = []
        for r_index, room in enumerate(s.rooms):
            for c in names[r_index * p.containers_per_room : (r_index + 1) * p.containers_per_room]:
                s.container_room[c] = room
                s.room_containers.setdefault(room, []).append(c)
                containers.append(c)
        colors = list(COLORS[: p.n_colors])
        n_locked = min(p.n_locked, len(containers) - 1, len(colors))
        key_colors = rng.sample(colors, n_locked)
        pool = [f"{c} {n}" for c in colors for n in NOUNS[: p.n_nouns]]
        pool += [f"{name} {k}" for k in range(2, p.item_variants + 1) for name in pool]
        n_items = len(containers) * p.items_per_container + p.n_rooms * p.floor_items
        if n_items > len(pool):
            raise ValueError(
                f"textworld needs {n_items} distinct items but the vocabulary has {len(pool)} "
                f"(raise n_colors/n_nouns or lower items_per_container/floor_items)"
            )
        items = rng.sample(pool, n_items)
        # Locked containers get an order; the key of the i-th sits somewhere reachable once the first i-1 are open,
        # so the world is always solvable (goals only ever put items into open, hence unlocked, containers).
        locked = rng.sample(containers, n_locked)
        unlocked = [c for c in containers if c not in locked]
        slots = {c: p.items_per_container for c in containers}
        cursor = 0
        for c in containers:
            for _ in range(slots[c]):
                s.loc[items[cursor]] = c
                cursor += 1
        for room in s.rooms:
            for _ in range(p.floor_items):
                s.loc[items[cursor]] = room
                cursor += 1
        for i, c in enumerate(locked):
            key = f"{key_colors[i]} key"
            s.locked[c] = key
            s.key_of[key] = c
            home = rng.choice(unlocked + locked[:i])
            s.loc[key] = home
        for item, place in s.loc.items():
            s.held.setdefault(place, []).append(item)
        s.room = s.rooms[0]
        s.visited = [s.room]
        self.s = s
        self.events = [Event("enter", (s.room,))]
        lines = self._describe_room(full=True)
        lines += self._new_goal()
        return "\n".join(lines)

    @staticmethod
    def _room_names(rng: random.Random, n: int) -> list[str]:
        base = list(ROOMS)
        rng.shuffle(base)
        names = list(base[:n])
        k = 2
        while len(names) < n:
            names += [f"{r} {k}" for r in base][: n - len(names)]
            k += 1
        return names

    @staticmethod
    def _layout(rng: random.Random, s: TextWorldState) -> None:
        """Place rooms on a grid by random growth; adjacent placements become exits (a tree plus a few loops)."""
        delta = {"north": (0, 1), "south": (0, -1), "east": (1, 0), "west": (-1, 0)}
        pos = {s.rooms[0]: (0, 0)}
        taken = {(0, 0): s.rooms[0]}
        s.exits = {r: {} for r in s.rooms}
        for room in s.rooms[1:]:
            while True:
                anchor = rng.choice(list(pos))
                d = rng.choice(DIRECTIONS)
                x, y = pos[anchor]
                cell = (x + delta[d][0], y + delta[d][1])
                if cell not in taken:
                    break
            pos[room], taken[cell] = cell, room
            s.exits[anchor][d] = room
            s.exits[room][OPPOSITE[d]] = anchor
        for room, (x, y) in pos.items():
            for d, (dx, dy) in delta.items():
                other = taken.get((x + dx, y + dy))
                if other and d not in s.exits[room] and rng.random() < 0.3:
                    s.exits[room][d] = other
                    s.exits[other][OPPOSITE[d]] = room

    # ------------------------------------------------------------------------------------------------ rendering
    def _fact(self, item: str, place: str) -> str:
        v = self.params.verbosity
        if place == INVENTORY:
            return f"you carry the {item}" if v else f"carry: {item}"
        if place in self.s.container_room:
            return f"the {item} is in {place}" if v else f"{place}: {item}"
        return f"the {item} is on the floor of the {place}" if v else f"{place} floor: {item}"

    def _contents(self, place: str) -> list[str]:
        return list(self.s.held.get(place, []))

    def _move(self, item: str, dst: str) -> None:
        s = self.s
        s.held[s.loc[item]].remove(item)
        s.loc[item] = dst
        s.held.setdefault(dst, []).append(item)

    def _describe_room(self, full: bool) -> list[str]:
        s, v = self.s, self.params.verbosity
        exits = sorted(s.exits[s.room])
        here = s.room_containers.get(s.room, [])
        floor = self._contents(s.room)
        if v == 0:
            lines = [f"{s.room}. exits: {' '.join(exits)}. {' '.join(here)}"]
        else:
            lines = [f"you are in the {s.room}.", f"exits: {', '.join(exits)}.", f"you see {', '.join(here)}."]
        for item in floor:
            lines.append(self._fact(item, s.room))
            self.events.append(Event("see", (item, s.room)))
        if full:
            for c in here:
                if c in s.opened:
                    for item in self._contents(c):
                        lines.append(self._fact(item, c))
                        self.events.append(Event("see", (item, c)))
        return lines

    def _new_goal(self) -> list[str]:
        s = self.s
        items = sorted(s.loc)
        # Later steps are drawn against the state the earlier ones leave behind (a projection), so no step is
        # trivially met when it is drawn.
        loc, room = dict(s.loc), s.room
        chain: list[tuple[str, str, str]] = []
        while len(chain) < self.params.chain_length:
            kind = "put" if not chain else s.rng.choice(["put", "put", "bring"])
            item = s.rng.choice(items)
            rooms = [r for r in s.rooms if r != room]
            if kind == "bring" and rooms:
                step = ("bring", item, s.rng.choice(rooms))
                loc[item], room = INVENTORY, step[2]
            else:
                targets = sorted(c for c in s.container_room if c != loc[item])
                step = ("put", item, s.rng.choice(targets))
                loc[item], room = step[2], s.container_room[step[2]]
            chain.append(step)
        s.chain, s.chain_pos, s.goal = chain, 0, chain[0]
        text = self.goal_text()
        self.events.append(Event("goal", (text,)))
        return [f"goal: {text}"]

    @staticmethod
    def step_text(step: tuple[str, str, str]) -> str:
        """One step of a goal chain as text."""
        if step[0] == "bring":
            return f"take the {step[1]} to the {step[2]}"
        return f"put the {step[1]} in {step[2]}"

    def step_met(self, step: tuple[str, str, str]) -> bool:
        """Whether the true state satisfies one chain step."""
        s = self.s
        if step[0] == "bring":
            return s.loc[step[1]] == INVENTORY and s.room == step[2]
        return s.loc[step[1]] == step[2]

    # ------------------------------------------------------------------------------------------------ stepping
    def _act(self, action: str) -> list[str] | str:
        """The observation lines of ``action`` applied, or the diagnostic of an impossible one."""
        s, v = self.s, self.params.verbosity
        kind, m = next(((k, r.match(action)) for k, r in _ACTION_RE if r.match(action)), (None, None))
        lines: list[str]
        if kind is None or m is None:
            return self._fail(action, "unknown action")
        if kind == "go":
            d = m.group(1)
            if d not in s.exits[s.room]:
                return self._fail(action, f"there is no exit {d}")
            s.room = s.exits[s.room][d]
            if s.room not in s.visited:
                s.visited.append(s.room)
            self.events.append(Event("enter", (s.room,)))
            lines = ([f"you go {d}."] if v else []) + self._describe_room(full=v >= 2)
        elif kind in ("open", "close"):
            c = _strip_the(m.group(1))
            if reason := self._unusable(c):
                return self._fail(action, reason)
            if kind == "close":
                if c not in s.opened:
                    return self._fail(action, f"{c} is already closed")
                s.opened.discard(c)
                lines = [f"you close {c}." if v else f"{c} closed"]
            elif c in s.locked:
                reason = f"{c} is locked"
                self.events.append(Event("see_lock", (c,)))
                lines = [self._fail(action, reason)]
                if self.params.lock_hints:
                    key = s.locked[c]
                    lines.append(f"the {key} opens {c}" if v else f"{key} opens {c}")
                    self.events.append(Event("hint", (key, c)))
                return "\n".join(lines)
            elif c in s.opened:
                return self._fail(action, f"{c} is already open")
            else:
                s.opened.add(c)
                self.events.append(Event("open", (c,)))
                contents = self._contents(c)
                lines = [f"you open {c}." if v else f"{c} open"]
                for item in contents:
                    lines.append(self._fact(item, c))
                    self.events.append(Event("see", (item, c)))
                if not contents:
                    lines.append(f"{c} is empty" if v else f"{c}: empty")
        elif kind == "take_from":
            item, c = _strip_the(m.group(1)), _strip_the(m.group(2))
            if reason := self._unusable(c, must_be_open=True):
                return self._fail(action, reason)
            if s.loc.get(item) != c:
                return self._fail(action, f"there is no {item} in {c}")
            self._move(item, INVENTORY)
            self.events.append(Event("move", (item, c, INVENTORY)))
            lines = [f"you take the {item} from {c}." if v else f"took {item} from {c}"]
        elif kind == "take":
            item = _strip_the(m.group(1))
            if s.loc.get(item) != s.room:
                return self._fail(action, f"there is no {item} here")
            self._move(item, INVENTORY)
            self.events.append(Event("move", (item, s.room, INVENTORY)))
            lines = [f"you take the {item} from the floor of the {s.room}." if v else f"took {item} from {s.room}"]
        elif kind == "put":
            item, c = _strip_the(m.group(1)), _strip_the(m.group(2))
            if reason := self._unusable(c, must_be_open=True, carrying=item):
                return self._fail(action, reason)
            self._move(item, c)
            self.events.append(Event("move", (item, INVENTORY, c)))
            lines = [f"you put the {item} in {c}." if v else f"put {item} in {c}"]
        elif kind == "unlock":
            c, key = _strip_the(m.group(1)), _strip_the(m.group(2))
            if reason := self._unusable(c):
                return self._fail(action, reason)
            if c not in s.locked:
                return self._fail(action, f"{c} is not locked")
            if s.loc.get(key) != INVENTORY:
                return self._fail(action, f"you do not carry the {key}")
            if s.locked[c] != key:
                return self._fail(action, f"the {key} does not fit {c}")
            del s.locked[c]
            self.events.append(Event("unlock", (c, key)))
            lines = [f"you unlock {c} with the {key}." if v else f"unlocked {c} with {key}"]
        elif kind == "look":
            lines = self._describe_room(full=True)
        else:
            carried = sorted(self._contents(INVENTORY))
            lines = [f"you carry: {', '.join(carried) or 'nothing'}." if v else f"carry: {' '.join(carried) or '-'}"]
        return lines

    def _unusable(self, c: str, *, must_be_open: bool = False, carrying: str | None = None) -> str | None:
        """Why an action cannot use container ``c`` (with ``must_be_open``, open) while carrying ``carrying``, the
        carrying checked first; None when it can."""
        s = self.s
        if carrying is not None and s.loc.get(carrying) != INVENTORY:
            return f"you do not carry the {carrying}"
        if s.container_room.get(c) != s.room:
            return f"there is no {c} here"
        if must_be_open and c not in s.opened:
            return f"{c} is closed"
        return None

    def _carry_line(self) -> str:
        return f"you carry: {', '.join(sorted(self._contents(INVENTORY))) or 'nothing'}."

    # ------------------------------------------------------------------------------------------------ policy
    def _path_step(self, target_room: str) -> str | None:
        """The first ``go DIR`` of a shortest path to ``target_room`` (None when already there)."""
        s = self.s
        if s.room == target_room:
            return None
        first: dict[str, str] = {}
        queue = deque([s.room])
        seen = {s.room}
        while queue:
            room = queue.popleft()
            for d, nxt in sorted(s.exits[room].items()):
                if nxt in seen:
                    continue
                seen.add(nxt)
                first[nxt] = first.get(room, d)
                if nxt == target_room:
                    return f"go {first[nxt]}"
                queue.append(nxt)
        raise RuntimeError(f"room {target_room!r} is unreachable")

    def _ready(self, c: str, depth: int = 0) -> str | None:
        """Next action to stand by container ``c`` with it open (None when it is)."""
        s = self.s
        if c in s.locked and s.loc[s.locked[c]] != INVENTORY:
            return self._fetch(s.locked[c], depth + 1)
        step = self._path_step(s.container_room[c])
        if step:
            return step
        if c in s.locked:
            return f"unlock {c} with {s.locked[c]}"
        if c not in s.opened:
            return f"open {c}"
        return None

    def _fetch(self, item: str, depth: int = 0) -> str:
        """Next action to get ``item`` into the inventory."""
        if depth > 64:
            raise RuntimeError("key dependencies form a cycle")
        place = self.s.loc[item]
        if place in self.s.container_room:
            return self._ready(place, depth) or f"take {item} from {place}"
        return self._path_step(place) or f"take {item}"

    def optimal_action(self) -> str:
        """Shortest plan toward the current goal, one action at a time."""
        s = self.s
        assert s.goal is not None
        kind, item, target = s.goal
        if s.loc[item] != INVENTORY:
            return self._fetch(item)
        if kind == "bring":
            return self._path_step(target) or "look"
        return self._ready(target) or f"put {item} in {target}"

    def random_action(self, rng: random.Random) -> str:
        """A random plausible action (some fail: containers of other rooms, closed containers, ...)."""
        s = self.s
        here = sorted(c for c, r in s.container_room.items() if r == s.room)
        choice = rng.random()
        if choice < 0.3:
            return f"go {rng.choice(DIRECTIONS)}"
        if choice < 0.55:
            return f"open {rng.choice(sorted(s.container_room))}"
        if choice < 0.7 and here:
            return f"close {rng.choice(here)}"
        if choice < 0.85:
            item = rng.choice(sorted(s.loc))
            place = s.loc[item]
            return f"take {item} from {place}" if place in s.container_room else f"take {item}"
        return rng.choice(["look", "inventory"])

    def view(self) -> dict[str, Any]:
        """The queryable latent state (see :meth:`Env.view`)."""
        s = self.s
        visible = [i for i, p in s.loc.items() if p in (INVENTORY, s.room)]
        visible += [i for i, p in s.loc.items() if p in s.opened and s.container_room.get(p) == s.room]
        return {
            "locations": dict(s.loc),
            "carrying": sorted(i for i, p in s.loc.items() if p == INVENTORY),
            "room": s.room,
            "locked": sorted(s.locked),
            "opened": sorted(s.opened),
            "visited": list(s.visited),
            "visible": sorted(visible),
            "goals_done": s.goals_done,
            "goal_steps_done": s.chain_pos,
            "last_failure": s.last_failure,
        }

    # ------------------------------------------------------------------------------------------------ helpers
    def containers_in(self, room: str) -> list[str]:
        """The containers of ``room``, in a stable order."""
        return sorted(self.s.room_containers.get(room, []))
