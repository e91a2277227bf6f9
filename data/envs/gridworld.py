"""A grid/room world (BabyAI-like): a grid of square rooms joined by doors (some locked, each opened by the key of
its colour), balls, boxes and keys to carry (one at a time), and an endless chain of goals (``pick up the X``,
``put the X in room N``, ``go to room N``). With ``chain_length`` k > 1 each goal is an instruction chain of k such
steps (``put the red ball in room 3, then go to room 1``) that must be done in order: the transition function checks
the current step after every action (``goal step i of k done: ...``) and the goal is done when the last step is.

Actions: ``go north|south|east|west`` (one cell), ``pick up the X`` (on its cell, hands empty), ``drop the X`` (on a
free, non-door cell), ``unlock the C door`` (next to it, carrying the C key), ``look``. The agent sees its own room
only (partial observability). Verbosity: 0 terse symbolic, 1 short sentences, 2 sentences plus doors, the carried
object and the goal after every step.
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
from memrl.data.envs.vocab import COLORS

__all__ = ["GridWorldEnv", "GridWorldParams"]

INVENTORY = "inventory"
_MOVES = {"north": (0, -1), "south": (0, 1), "east": (1, 0), "west": (-1, 0)}
Cell = tuple[int, int]


class GridWorldParams(ConfigModel):
    """Difficulty vector of the grid world."""

    rooms_x: int = Field(3, ge=1, le=12)
    rooms_y: int = Field(3, ge=1, le=12)
    room_size: int = Field(4, ge=2, le=12)
    n_objects: int = Field(6, ge=1, le=64, description="balls and boxes")
    n_locked: int = Field(2, ge=0, le=len(COLORS))
    verbosity: int = Field(1, ge=0, le=2)
    chain_length: int = Field(
        1, ge=1, le=16, description="steps per goal (an instruction chain)", json_schema_extra={"omit_if_default": True}
    )


@dataclass
class GridState:
    """The latent state."""

    agent: Cell = (1, 1)
    doors: dict[Cell, str | None] = field(default_factory=dict)  # door cell -> colour when locked, else None
    door_color: dict[str, Cell] = field(default_factory=dict)  # colour -> door cell (kept after unlocking)
    objects: dict[str, Cell | None] = field(default_factory=dict)  # name -> cell, None when carried
    carrying: str | None = None
    visited: list[str] = field(default_factory=list)
    goal: tuple[str, ...] | None = None  # the current step of ``chain``
    chain: list[tuple[str, ...]] = field(default_factory=list)
    chain_pos: int = 0
    goals_done: int = 0
    last_failure: str | None = None
    rng: random.Random = field(default_factory=random.Random)


@register
class GridWorldEnv(Env):
    """The grid/room world (see the module docstring)."""

    name = "gridworld"
    params_model = GridWorldParams
    params: GridWorldParams
    state_model = GridState
    s: GridState

    def __init__(self, params: dict[str, Any] | ConfigModel | None = None, seed: int = 0) -> None:
        super().__init__(params, seed)
        p = self.params
        self.step_size = p.room_size + 1
        self.width = p.rooms_x * self.step_size + 1
        self.height = p.rooms_y * self.step_size + 1

    # ------------------------------------------------------------------------------------------------ geometry
    def room_of(self, cell: Cell) -> str:
        """The name of the room holding ``cell`` (a door cell belongs to the room west / north of it)."""
        x, y = cell
        i = min((x - 1) // self.step_size, self.params.rooms_x - 1)
        j = min((y - 1) // self.step_size, self.params.rooms_y - 1)
        return f"room {j * self.params.rooms_x + i + 1}"

    def _is_wall(self, cell: Cell) -> bool:
        x, y = cell
        if not (0 <= x < self.width and 0 <= y < self.height):
            return True
        if cell in self.s.doors:
            return False
        return x % self.step_size == 0 or y % self.step_size == 0

    def _room_cells(self, room: str) -> list[Cell]:
        n = int(room.split()[1]) - 1
        i, j = n % self.params.rooms_x, n // self.params.rooms_x
        x0, y0 = i * self.step_size + 1, j * self.step_size + 1
        size = self.params.room_size
        return [(x, y) for y in range(y0, y0 + size) for x in range(x0, x0 + size)]

    def _free(self, cell: Cell) -> bool:
        return cell not in self.s.doors and cell not in self._occupied()

    def _occupied(self) -> set[Cell]:
        return {c for c in self.s.objects.values() if c is not None}

    # ------------------------------------------------------------------------------------------------ building
    def reset(self) -> str:
        """Build the world from the seed and return the first observation."""
        p = self.params
        rng, s = self._seeded_state()
        half = p.room_size // 2
        for j in range(p.rooms_y):
            for i in range(p.rooms_x):
                if i + 1 < p.rooms_x:
                    s.doors[((i + 1) * self.step_size, j * self.step_size + 1 + half)] = None
                if j + 1 < p.rooms_y:
                    s.doors[(i * self.step_size + 1 + half, (j + 1) * self.step_size)] = None
        self.s = s
        rooms = [f"room {n + 1}" for n in range(p.rooms_x * p.rooms_y)]
        cells = {r: self._room_cells(r) for r in rooms}
        s.agent = rng.choice(cells[rooms[0]])
        colors = rng.sample(list(COLORS), min(p.n_locked, len(s.doors), len(COLORS)))
        chosen = rng.sample(sorted(s.doors), len(colors))
        taken: set[Cell] = set()
        for door in chosen:
            s.doors[door] = "locked"
        # Solvable by construction: the i-th door to unlock borders the region reachable once doors 1..i-1 are
        # open, and its key lies in that region. Keys only ever move inside the reachable region, so the
        # lowest-ordered locked door always borders it and has a reachable key.
        opened: list[Cell] = []
        for color in colors:
            reach = self._reachable_with(opened)
            door = next(d for d in chosen if d not in opened and self._borders(d, reach))
            s.doors[door] = color
            s.door_color[color] = door
            cell = rng.choice(sorted(c for c in reach if c not in s.doors and c not in taken))
            s.objects[f"{color} key"] = cell
            taken.add(cell)
            opened.append(door)
        pool = [f"{c} {k}" for c in COLORS for k in ("ball", "box")]
        for name in rng.sample(pool, min(p.n_objects, len(pool))):
            free = [c for r in rooms for c in cells[r] if c not in taken]
            cell = rng.choice(free)
            s.objects[name] = cell
            taken.add(cell)
        s.visited = [self.room_of(s.agent)]
        self.events = [Event("enter", (s.visited[0],))]
        lines = self._describe(full=True)
        lines += self._new_goal()
        return "\n".join(lines)

    def _reachable_with(self, unlocked: list[Cell]) -> set[Cell]:
        saved = {d: self.s.doors[d] for d in unlocked}
        for d in unlocked:
            self.s.doors[d] = None
        try:
            return self._reachable(self.s.agent, ignore_locks=False)
        finally:
            self.s.doors.update(saved)

    @staticmethod
    def _borders(door: Cell, region: set[Cell]) -> bool:
        return any((door[0] + dx, door[1] + dy) in region for dx, dy in _MOVES.values())

    def _reachable(self, start: Cell, ignore_locks: bool) -> set[Cell]:
        seen = {start}
        queue = deque([start])
        while queue:
            x, y = queue.popleft()
            for dx, dy in _MOVES.values():
                nxt = (x + dx, y + dy)
                if nxt in seen or self._is_wall(nxt) or (not ignore_locks and self.s.doors.get(nxt)):
                    continue
                seen.add(nxt)
                queue.append(nxt)
        return seen

    # ------------------------------------------------------------------------------------------------ rendering
    def _describe(self, full: bool) -> list[str]:
        s, v = self.s, self.params.verbosity
        room = self.room_of(s.agent)
        x, y = s.agent
        cells = set(self._room_cells(room))
        seen = sorted((n, c) for n, c in s.objects.items() if c is not None and c in cells)
        for name, _ in seen:
            self.events.append(Event("see", (name, room)))
        if v == 0:
            parts = [f"{room} at {x} {y}"] + [f"{n} {c[0]} {c[1]}" for n, c in seen]
            return [" | ".join(parts)]
        lines = [f"you are in {room} at {x} {y}."]
        lines += [f"the {n} is in {room} at {c[0]} {c[1]}" for n, c in seen]
        if full or v >= 2:
            for d in _MOVES:
                for door, color in s.doors.items():
                    if self._door_side(door, room) == d:
                        lines.append(f"the {color} door {d} is locked" if color else f"a door leads {d}")
                        if color:
                            self.events.append(Event("see_lock", (f"{color} door",)))
        return lines

    def _door_side(self, door: Cell, room: str) -> str | None:
        cells = set(self._room_cells(room))
        for d, (dx, dy) in _MOVES.items():
            if (door[0] - dx, door[1] - dy) in cells:
                return d
        return None

    def _new_goal(self) -> list[str]:
        s = self.s
        things = sorted(n for n in s.objects if not n.endswith(" key"))
        rooms = [f"room {n + 1}" for n in range(self.params.rooms_x * self.params.rooms_y)]
        # Later steps are drawn against the state the earlier ones leave behind (a projection), so no step is
        # trivially met when it is drawn; the first step sees the true state.
        here = self.room_of(s.agent)
        carrying = s.carrying
        where = {n: (self.room_of(c) if c is not None else None) for n, c in s.objects.items()}
        chain: list[tuple[str, ...]] = []
        while len(chain) < self.params.chain_length:
            kind = s.rng.choice(["pick", "put", "put", "go"])
            if kind == "pick" and things:
                step: tuple[str, ...] = ("pick", s.rng.choice(things))
            elif kind == "put" and things:
                thing = s.rng.choice(things)
                current = where[thing]
                step = ("put", thing, s.rng.choice([r for r in rooms if r != current] or rooms))
            else:
                step = ("go", s.rng.choice([r for r in rooms if r != here] or rooms))
            if step[0] == "pick":
                met = carrying == step[1]
            else:
                met = (where[step[1]] if step[0] == "put" else here) == step[-1]
            if met:
                continue
            chain.append(step)
            if step[0] in ("pick", "put") and carrying not in (None, step[1]):
                where[str(carrying)] = "?"  # the policy drops it somewhere on the way
            if step[0] == "pick":
                here = where[step[1]] or "?"
                carrying, where[step[1]] = step[1], None
            elif step[0] == "put":
                where[step[1]], here, carrying = step[2], step[2], None
            else:
                here = step[1]
        s.chain, s.chain_pos, s.goal = chain, 0, chain[0]
        text = self.goal_text()
        self.events.append(Event("goal", (text,)))
        return [f"goal: {text}"]

    @staticmethod
    def step_text(step: tuple[str, ...]) -> str:
        """One step of a goal chain as text."""
        if step[0] == "pick":
            return f"pick up the {step[1]}"
        if step[0] == "put":
            return f"put the {step[1]} in {step[2]}"
        return f"go to {step[1]}"

    def step_met(self, step: tuple[str, ...]) -> bool:
        """Whether the true state satisfies one chain step."""
        s = self.s
        if step[0] == "pick":
            return s.carrying == step[1]
        if step[0] == "put":
            cell = s.objects[step[1]]
            return cell is not None and self.room_of(cell) == step[2]
        return self.room_of(s.agent) == step[1]

    # ------------------------------------------------------------------------------------------------ stepping
    def _act(self, action: str) -> list[str] | str:
        """The observation lines of ``action`` applied, or the diagnostic of an impossible one."""
        s, v = self.s, self.params.verbosity
        before = self.room_of(s.agent)
        if m := re.fullmatch(r"go (north|south|east|west)", action):
            dx, dy = _MOVES[m.group(1)]
            nxt = (s.agent[0] + dx, s.agent[1] + dy)
            if self._is_wall(nxt):
                return self._fail(action, "a wall is in the way")
            if s.doors.get(nxt):
                self.events.append(Event("see_lock", (f"{s.doors[nxt]} door",)))
                return self._fail(action, f"the {s.doors[nxt]} door is locked")
            s.agent = nxt
            room = self.room_of(nxt)
            entered = room != before
            if entered:
                self.events.append(Event("enter", (room,)))
                if room not in s.visited:
                    s.visited.append(room)
            lines = ([f"you go {m.group(1)}."] if v else []) + self._describe(full=entered)
        elif m := re.fullmatch(r"pick up (?:the )?(.+)", action):
            name = m.group(1)
            if s.objects.get(name, "absent") != s.agent:
                return self._fail(action, f"there is no {name} here")
            if s.carrying is not None:
                return self._fail(action, f"you already carry the {s.carrying}")
            s.objects[name] = None
            s.carrying = name
            self.events.append(Event("move", (name, before, INVENTORY)))
            lines = [f"you pick up the {name}." if v else f"picked {name}"]
        elif m := re.fullmatch(r"drop (?:the )?(.+)", action):
            name = m.group(1)
            if s.carrying != name:
                return self._fail(action, f"you do not carry the {name}")
            if not self._free(s.agent):
                return self._fail(action, "there is no room here")
            s.objects[name] = s.agent
            s.carrying = None
            self.events.append(Event("move", (name, INVENTORY, before)))
            lines = [f"you drop the {name} in {before}." if v else f"dropped {name} in {before}"]
        elif m := re.fullmatch(r"unlock (?:the )?(\w+) door", action):
            color = m.group(1)
            door = s.door_color.get(color)
            if door is None or abs(door[0] - s.agent[0]) + abs(door[1] - s.agent[1]) != 1:
                return self._fail(action, f"there is no {color} door next to you")
            if s.doors[door] is None:
                return self._fail(action, f"the {color} door is not locked")
            if s.carrying != f"{color} key":
                return self._fail(action, f"you do not carry the {color} key")
            s.doors[door] = None
            self.events.append(Event("unlock", (f"{color} door", f"{color} key")))
            lines = [f"you unlock the {color} door." if v else f"unlocked {color} door"]
        elif action == "look":
            lines = self._describe(full=True)
        else:
            return self._fail(action, "unknown action")
        return lines

    def _carry_line(self) -> str:
        return f"you carry the {self.s.carrying}." if self.s.carrying else "you carry nothing."

    # ------------------------------------------------------------------------------------------------ policy
    def _bfs(self, targets: set[Cell], ignore_locks: bool = False) -> list[Cell] | None:
        start = self.s.agent
        if start in targets:
            return [start]
        parent: dict[Cell, Cell] = {start: start}
        queue = deque([start])
        while queue:
            cur = queue.popleft()
            for dx, dy in _MOVES.values():
                nxt = (cur[0] + dx, cur[1] + dy)
                if nxt in parent or self._is_wall(nxt) or (not ignore_locks and self.s.doors.get(nxt)):
                    continue
                parent[nxt] = cur
                if nxt in targets:
                    path = [nxt]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return path[::-1]
                queue.append(nxt)
        return None

    @staticmethod
    def _direction(a: Cell, b: Cell) -> str:
        delta = (b[0] - a[0], b[1] - a[1])
        return next(d for d, m in _MOVES.items() if m == delta)

    def _toward(self, targets: set[Cell], depth: int = 0) -> str | None:
        """Next action toward any cell of ``targets`` (None when the agent stands on one)."""
        if depth > 32:
            raise RuntimeError("key dependencies form a cycle")
        path = self._bfs(targets)
        if path is not None:
            return None if len(path) == 1 else f"go {self._direction(path[0], path[1])}"
        s = self.s
        reach = self._reachable(s.agent, ignore_locks=False)

        def key_at_hand(door: Cell) -> bool:
            key = f"{s.doors[door]} key"
            cell = s.objects.get(key)
            return s.carrying == key or (cell is not None and cell in reach)

        ready = sorted(d for d, c in s.doors.items() if c and self._borders(d, reach) and key_at_hand(d))
        if not ready:
            raise RuntimeError("no locked door can be opened: the world is unsolvable")
        blocked = self._bfs(targets, ignore_locks=True) or []
        on_path = [c for c in blocked if c in ready]
        return self._unlock(on_path[0] if on_path else ready[0], depth + 1)

    def _unlock(self, door: Cell, depth: int) -> str:
        color = self.s.doors[door]
        assert color is not None
        key = f"{color} key"
        if self.s.carrying != key:
            return self._fetch(key, depth)
        near = {(door[0] + dx, door[1] + dy) for dx, dy in _MOVES.values()}
        near = {c for c in near if not self._is_wall(c) and not self.s.doors.get(c)}
        return self._toward(near, depth) or f"unlock the {color} door"

    def _fetch(self, name: str, depth: int = 0) -> str:
        """Next action to hold object ``name``."""
        s = self.s
        if s.carrying is not None and s.carrying != name:
            return self._drop_here(depth)
        cell = s.objects[name]
        assert cell is not None
        return self._toward({cell}, depth) or f"pick up the {name}"

    def _drop_here(self, depth: int, room: str | None = None) -> str:
        """Drop what the agent carries on the nearest free cell (of ``room`` when given)."""
        s = self.s
        assert s.carrying is not None
        if self._free(s.agent) and (room is None or self.room_of(s.agent) == room):
            return f"drop the {s.carrying}"
        occupied = self._occupied()
        cells = self._room_cells(room) if room else [c for c in self._reachable(s.agent, ignore_locks=False)]
        free = {c for c in cells if c not in s.doors and c not in occupied and not self._is_wall(c)}
        return self._toward(free, depth) or f"drop the {s.carrying}"

    def optimal_action(self) -> str:
        """Shortest plan toward the current goal, one action at a time."""
        g = self.s.goal
        assert g is not None
        if g[0] == "pick":
            return self._fetch(g[1])
        if g[0] == "put":
            if self.s.carrying != g[1]:
                return self._fetch(g[1])
            return self._drop_here(0, room=g[2])
        return self._toward(set(self._room_cells(g[1]))) or "look"

    def random_action(self, rng: random.Random) -> str:
        """A random plausible action (some fail: walls, locked doors, full hands, ...)."""
        s = self.s
        choice = rng.random()
        if choice < 0.6:
            return f"go {rng.choice(list(_MOVES))}"
        if choice < 0.75:
            return f"pick up the {rng.choice(sorted(s.objects))}"
        if choice < 0.85 and s.carrying:
            return f"drop the {s.carrying}"
        if choice < 0.95 and s.door_color:
            return f"unlock the {rng.choice(sorted(s.door_color))} door"
        return "look"

    def view(self) -> dict[str, Any]:
        """The queryable latent state (see :meth:`Env.view`)."""
        s = self.s
        room = self.room_of(s.agent)
        cells = set(self._room_cells(room))
        locations = {n: (self.room_of(c) if c is not None else INVENTORY) for n, c in s.objects.items()}
        return {
            "locations": locations,
            "carrying": [s.carrying] if s.carrying else [],
            "room": room,
            "locked": sorted(f"{c} door" for c, d in s.door_color.items() if s.doors[d]),
            "visited": list(s.visited),
            "visible": sorted(n for n, c in s.objects.items() if c is None or c in cells),
            "goals_done": s.goals_done,
            "goal_steps_done": s.chain_pos,
            "last_failure": s.last_failure,
        }
