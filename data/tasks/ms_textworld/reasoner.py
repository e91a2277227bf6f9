"""The frozen programmatic reasoner of the ``ms_textworld`` family (:class:`TwReasoner`; the package docstring says
what it reads and how it acts)."""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from memrl.data.formats import (
    ADMISSIBLE_ACTIONS_PREFIX,
    parse_sam_memory_block,
    parse_sam_recalled,
    parse_tool_calls,
    render_tool_call,
)
from memrl.data.registry import register_reasoner
from memrl.data.tasks.common import content_of, role_of
from memrl.data.tasks.ms_textworld.parsing import (
    COOK_APPLIANCE,
    COOK_DONE,
    CUT_DONE,
    CUT_VERBS,
    EAT_VERBS,
    EXAMINE_VERBS,
    GOAL_INTENT,
    OPPOSITE,
    PREP_RESULT,
    RECIPE_INTENT,
    SAFE_VERBS,
    SENTENCE,
    TAKE_VERBS,
    VERB_WORDS,
    Recipe,
    TwCue,
    command_instrument,
    command_object,
    exits_of,
    inventory_of,
    mentions,
    objective_of,
    parse_recipe,
    parse_tw_cue,
    room_of,
)


@dataclass
class _Knowledge:
    """What the reasoner could rebuild from its context."""

    room: str | None = None
    moves: set[tuple[str, str, str]] = field(default_factory=set)  # (room, direction, room)
    entered: dict[str, tuple[str, str]] = field(default_factory=dict)  # room -> (room it was first entered from, dir)
    exits: dict[str, set[str]] = field(default_factory=dict)
    seen: dict[str, set[str]] = field(default_factory=dict)  # room -> things named there (cues)
    texts: dict[str, list[str]] = field(default_factory=dict)  # room -> raw texts seen there
    goal: list[str] = field(default_factory=list)  # texts that state the goal
    recipe: Recipe | None = None
    inventory: list[str] | None = None  # item phrases with their states, None: unknown
    goal_pages: list[int] = field(default_factory=list)
    recipe_pages: list[int] = field(default_factory=list)
    recipe_room: str | None = None  # where the recipe was read (where the meal is prepared)
    recalled: dict[str, int] = field(default_factory=dict)  # live recalls per intent
    last_move: str | None = None
    examined: set[str] = field(default_factory=set)
    actions: list[str] = field(default_factory=list)  # the game commands sent so far (pages' cues, then live turns)


def _memory_mode(system: str | None) -> Literal["cues", "intent", "none"]:
    if system is None or "memory(intent, page_ids)" in system:
        return "cues"
    return "intent" if "memory(intent)" in system else "none"


def _admissible(text: str) -> list[str] | None:
    if not text.startswith(ADMISSIBLE_ACTIONS_PREFIX):
        return None
    return [line.strip() for line in text[len(ADMISSIBLE_ACTIONS_PREFIX) :].split("\n") if line.strip()]


@register_reasoner("ms_textworld")
class TwReasoner:
    """The frozen programmatic reasoner of the ``ms_textworld`` family (module docstring); a
    :class:`~memrl.data.schemas.ScriptedPolicy`. ``explore``: ``dfs`` walks the map it can rebuild, ``random`` ignores
    it (a floor for the benchmark)."""

    name = "ms-textworld-reasoner"

    def __init__(self, max_pages: int = 2, explore: Literal["dfs", "random"] = "dfs") -> None:
        self.max_pages = max_pages
        self.explore = explore

    # ------------------------------------------------------------------------------------------------ reading
    def _read(self, messages: list[Any]) -> tuple[_Knowledge, list[str], str | None]:
        know = _Knowledge()
        admissible: list[str] = []
        system: str | None = None
        cues: dict[int, str] = {}
        events: list[tuple[str, str | None, str]] = []  # (kind, action, text): kind cue | obs | recalled
        pending_action: str | None = None
        first_user = True
        for m in messages:
            role, text = role_of(m), content_of(m)
            if role == "system":
                system = text
                continue
            if role == "user" and text.startswith("task: "):
                cues.update(parse_sam_memory_block(text)[1])
                continue
            if role == "user" and (acts := _admissible(text)) is not None:
                admissible = acts
                continue
            if role == "assistant":
                pending_action = None
                for call in parse_tool_calls(text).calls:
                    if call.name == "act":
                        pending_action = str(call.arguments.get("action", "")).strip().lower()
                    elif call.name == "memory":
                        pending_action = None
                continue
            recalled = parse_sam_recalled(text) if role == "user" else None
            if recalled is not None:
                events.append(("recalled", recalled[0], recalled[2]))
                know.recalled[recalled[0]] = know.recalled.get(recalled[0], 0) + 1
            elif role == "user" and first_user and pending_action is None:
                events.append(("obs", "start", text))
            else:
                events.append(("obs", pending_action, text))
            first_user = False
            pending_action = None
        # cues come first: their pages are older than anything live
        timeline: list[tuple[str, Any, Any]] = [
            ("cue", pid, parse_tw_cue(part)) for pid, c in sorted(cues.items()) for part in c.split(" | ")
        ]
        timeline += [(kind, action, text) for kind, action, text in events]
        for kind, a, b in timeline:
            if kind == "cue":
                self._take_cue(know, a, b)
            elif kind == "obs":
                self._take_obs(know, a, b)
            else:
                self._take_recalled(know, a, b)
        return know, admissible, system

    @staticmethod
    def _move(know: _Knowledge, action: str | None, room: str) -> None:
        if action and action.startswith("go ") and know.room is not None and know.room != room:
            d = action[3:].strip()
            if d in OPPOSITE:
                know.moves.add((know.room, d, room))
                know.moves.add((room, OPPOSITE[d], know.room))
                know.entered.setdefault(room, (know.room, d))
                know.last_move = d
        know.room = room

    def _take_cue(self, know: _Knowledge, page_id: int, cue: TwCue) -> None:
        if cue.memory is not None:
            if "goal" in cue.memory:
                know.goal_pages.append(page_id)
                if cue.content:
                    know.goal.append(cue.content)
            if "recipe" in cue.memory:
                know.recipe_pages.append(page_id)
                if cue.content:
                    self._take_text(know, cue.content)
            return
        if cue.action and cue.action != "look":
            know.actions.append(cue.action)
        if cue.room:
            self._move(know, cue.action, cue.room)
            if cue.exits:
                know.exits.setdefault(cue.room, set()).update(cue.exits)
        if cue.goal:
            know.goal_pages.append(page_id)
        if cue.recipe:
            know.recipe_pages.append(page_id)
            know.recipe_room = know.room
        if cue.action.startswith("examine "):
            know.examined.add(cue.action[len("examine ") :])
        if cue.seen and know.room is not None:
            know.seen.setdefault(know.room, set()).update(cue.seen)

    def _take_obs(self, know: _Knowledge, action: str | None, text: str) -> None:
        if action and action != "start":
            know.actions.append(action)
        if action == "start" and (objective := objective_of(text)):
            know.goal.append(objective)
        room = room_of(text)
        if room is not None:
            self._move(know, action, room)
            know.exits.setdefault(room, set()).update(exits_of(text))
        if know.room is not None and (room is not None or (action or "").startswith("open ")):
            shown = text[text.find("-= ") :] if action == "start" else text  # not the opening text's plans
            know.texts.setdefault(know.room, []).append(shown)
        if action and action.startswith("examine "):
            know.examined.add(action[len("examine ") :])
        self._take_text(know, text)
        if know.recipe is not None and know.recipe_room is None and parse_recipe(text) is not None:
            know.recipe_room = know.room
        inv = inventory_of(text)
        if inv is not None:
            know.inventory = inv
        elif know.inventory is not None:
            self._apply_result(know, action, text)

    def _take_recalled(self, know: _Knowledge, intent: str, text: str) -> None:
        if intent == GOAL_INTENT and text.strip():
            know.goal.append(text)
        self._take_text(know, text)
        for block in re.split(r"(?m)^page \d+:\n", text):  # retrieval baselines return raw pages
            room = room_of(block)
            if room is not None:
                know.texts.setdefault(room, []).append(block)
                if not re.match(r"t\d+> ", block) and (objective := objective_of(block)):
                    know.goal.append(objective)

    @staticmethod
    def _take_text(know: _Knowledge, text: str) -> None:
        recipe = parse_recipe(text)
        if recipe is not None:
            know.recipe = recipe

    @staticmethod
    def _apply_result(know: _Knowledge, action: str | None, text: str) -> None:
        """Update a known inventory by what a later command did."""
        assert know.inventory is not None
        if action is None:
            return
        verb, obj = command_object(action)
        if verb == "take" and text.startswith(("You take", "You pick up")):
            know.inventory = None  # its state (raw, sliced, fried, ...) shows only in the inventory line
            return
        elif verb == "drop" and text.startswith("You drop"):
            know.inventory = [i for i in know.inventory if not i.endswith(obj)]
        elif action == "prepare meal" and text.startswith("Adding the meal"):
            know.inventory = ["meal"]
        for m in PREP_RESULT.finditer(text):
            done = CUT_DONE.get(m.group(1), m.group(1))
            item = m.group(2).lower()
            know.inventory = [f"{done} {i}" if i.endswith(item) else i for i in know.inventory]

    # ------------------------------------------------------------------------------------------------ deciding
    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        """One tool call: ``act`` with an admissible command, or ``memory`` for the goal or the recipe."""
        know, admissible, system = self._read(messages)
        mode = _memory_mode(system)
        if not admissible:
            return render_tool_call("act", {"action": "look"})
        goal_text = "\n".join(know.goal)
        # 1. the goal's own actions and the recipe's next step
        command = self._goal_action(know, admissible, goal_text)
        if command is not None:
            return render_tool_call("act", {"action": command})
        # 2. ask the memory for what is missing, when it could decide the next action
        recall = self._recall(know, admissible, goal_text, mode)
        if recall is not None:
            return recall
        # 3. open and unlock what is closed here
        for prefix in ("unlock ", "open "):
            for c in admissible:
                if c.startswith(prefix):
                    return render_tool_call("act", {"action": c})
        # 4. walk to where a wanted thing was seen, else explore
        return render_tool_call("act", {"action": self._walk(know, admissible, goal_text, rng)})

    def _wanted(self, know: _Knowledge, goal_text: str) -> list[str]:
        """Things worth walking to now: the goal's targets, the recipe's ingredients not held, the knife while a cut
        is pending, and, once everything is held, the appliance of the next cooking step."""
        sentences = [x.lower() for x in SENTENCE.findall(goal_text)]
        out = [
            thing
            for room_things in know.seen.values()
            for thing in room_things
            if any(mentions(x, thing) and any(re.search(rf"\b{v}\b", x) for v in TAKE_VERBS) for x in sentences)
        ]
        if know.recipe is None:
            return out
        held = know.inventory or []
        missing = [i for i in know.recipe.ingredients if not any(h.endswith(i) for h in held)]
        steps = know.recipe.steps()
        pending = [
            (v, i)
            for v, i in steps
            if not any(h.endswith(i) and (CUT_DONE.get(v) or COOK_DONE.get(v, "")) in h.split() for h in held)
        ]
        if any(v in CUT_VERBS for v, _ in pending) and not any(h.endswith("knife") for h in held):
            missing.append("knife")
        if not missing and pending and pending[0][0] in COOK_APPLIANCE:
            missing.append(COOK_APPLIANCE[pending[0][0]])
        return out + missing

    def _goal_action(self, know: _Knowledge, admissible: list[str], goal_text: str) -> str | None:
        by_verb: dict[str, list[tuple[str, str]]] = {}
        for c in admissible:
            verb, obj = command_object(c)
            by_verb.setdefault(verb, []).append((obj, c))
        if know.recipe is not None:
            command = self._cook(know, admissible, by_verb)
            if command is not None:
                return command
        if goal_text and know.recipe is None:
            errand = self._errand_step(know, admissible, goal_text)
            if errand is not None:
                return errand
        if goal_text:
            sentences = [x.lower() for x in SENTENCE.findall(goal_text)]

            def said(verbs: tuple[str, ...], obj: str) -> bool:
                return any(mentions(x, obj) and any(re.search(rf"\b{v}\b", x) for v in verbs) for x in sentences)

            for obj, c in by_verb.get("take", []):
                # a thing the goal names is part of the quest (TextWorld never names the thing that loses the game);
                # one it says to read or check is examined instead
                wanted = said(TAKE_VERBS, obj) or (
                    any(mentions(x, obj) for x in sentences) and not said(EXAMINE_VERBS, obj)
                )
                if obj != "meal" and wanted and (know.recipe is None or obj in know.recipe.ingredients):
                    return c
            for obj, c in by_verb.get("eat", []):
                if said(EAT_VERBS, obj) and (know.recipe is None or obj == "meal"):
                    return c
            if know.recipe is None:
                for obj, c in by_verb.get("examine", []):
                    if obj not in know.examined and said(EXAMINE_VERBS, obj):
                        return c
        return None

    @staticmethod
    def _says(sentence: str, command: str) -> int:
        """How well a goal sentence asks for ``command``: 0 unless it names its verb (:data:`VERB_WORDS`) and its
        object (``go D``: a moving verb and D); 2 when it names the instrument too (``from`` / ``with`` / ``on`` /
        ``into`` what) or the command has none, else 1 ("unlock the door" asks for ``unlock door with key``)."""
        verb, obj = command_object(command)
        words = VERB_WORDS.get(verb)
        if words is None or not any(re.search(rf"\b{w}\b", sentence) for w in words):
            return 0
        if verb == "go":
            return 2 * (re.search(rf"\b{re.escape(obj)}\b", sentence) is not None)
        if not mentions(sentence, obj):
            return 0
        instrument = command_instrument(command)
        return 2 if instrument is None or mentions(sentence, instrument) else 1

    def _errand_step(self, know: _Knowledge, admissible: list[str], goal_text: str) -> str | None:
        """The next step of a goal told step by step (TextWorld's detailed goals: "open the trunk. Then, take the
        key from the trunk. ... rest the milk on the stove"): the goal's sentences in order, each done once a
        command it asks for was sent after the one before it; the first sentence not done whose command is
        admissible now. None when the goal gives no such step (then the map and the things seen decide)."""
        sentences = [x.lower() for x in SENTENCE.findall(goal_text)]
        asks = [x for x in sentences if any(self._says(x, c) for c in admissible) or self._is_step(x)]
        sent = 0
        for sentence in asks:
            done = next((i for i in range(sent, len(know.actions)) if self._says(sentence, know.actions[i])), None)
            if done is not None:
                sent = done + 1
                continue
            fits = [(self._says(sentence, c), c) for c in admissible]
            best = max(fits, default=(0, ""))
            return best[1] if best[0] else None
        return None

    @staticmethod
    def _is_step(sentence: str) -> bool:
        """Whether a sentence reads as one command (a verb of :data:`VERB_WORDS` with a thing or a direction)."""
        return any(
            re.search(rf"\b{w}\b", sentence)
            for words in VERB_WORDS.values()
            for w in words
            if w not in ("set", "leave", "get", "got", "check")
        ) and bool(re.search(r"\b(the|a|an|some|north|east|south|west)\b", sentence))

    def _cook(self, know: _Knowledge, admissible: list[str], by_verb: dict[str, list[tuple[str, str]]]) -> str | None:
        recipe = know.recipe
        assert recipe is not None
        if "eat meal" in admissible:
            return "eat meal"
        if know.inventory is None:
            return "inventory" if "inventory" in admissible else None
        held = know.inventory
        for obj, c in by_verb.get("take", []):
            if obj in recipe.ingredients and not any(h.endswith(obj) for h in held):
                return c
        if any(v in CUT_VERBS for v, _ in recipe.steps()) and not any(h.endswith("knife") for h in held):
            for obj, c in by_verb.get("take", []):
                if obj == "knife":
                    return c
        if not all(any(h.endswith(i) for h in held) for i in recipe.ingredients):
            return None
        for verb, item in recipe.steps():
            state = next((h for h in held if h.endswith(item)), "")
            done = CUT_DONE.get(verb) or COOK_DONE.get(verb)
            if done and done in state.split():
                continue
            command = f"{verb} {item} with knife" if verb in CUT_VERBS else f"cook {item} with {COOK_APPLIANCE[verb]}"
            match = next((c for c in admissible if c.lower() == command), None)
            if match is not None:
                return match
            return None  # the step is not possible here: walk to the knife or the appliance
        if "prepare meal" in admissible:
            return "prepare meal"
        return None

    def _recall(
        self, know: _Knowledge, admissible: list[str], goal_text: str, mode: Literal["cues", "intent", "none"]
    ) -> str | None:
        if mode == "none":
            return None
        takes = [command_object(c)[1] for c in admissible if c.startswith("take ")]
        cooking = any(c.startswith(("cook ", "prepare ", "slice ", "dice ", "chop ")) for c in admissible)
        needs: list[tuple[str, list[int]]] = []
        if not goal_text:
            needs.append((GOAL_INTENT, know.goal_pages or [0]))  # the opening text is the first page
        if know.recipe is None and (cooking or (takes and know.recipe_pages)):
            needs.append((RECIPE_INTENT, know.recipe_pages))
        for intent, pages in needs:
            if know.recalled.get(intent):
                continue  # asked within the live context already
            if mode == "intent":
                return render_tool_call("memory", {"intent": intent})
            if pages:
                chosen = sorted(set(pages))[-self.max_pages :]
                return render_tool_call("memory", {"intent": intent, "page_ids": chosen})
        return None

    def _walk(self, know: _Knowledge, admissible: list[str], goal_text: str, rng: random.Random) -> str:
        goes = [c for c in admissible if c.startswith("go ") and c[3:] in OPPOSITE]
        if not goes:  # nowhere to go: look (never a random take, eat or drop: those can lose the game)
            return (
                "look"
                if "look" in admissible
                else rng.choice([c for c in admissible if c.split(" ", 1)[0] in SAFE_VERBS] or admissible)
            )
        room = know.room
        if self.explore == "dfs" and room is not None:
            held = {command_object(c)[1] for c in admissible if c.startswith("drop ")}  # what can be dropped is held
            wanted = [w for w in self._wanted(know, goal_text) if w not in held]
            target_rooms = {r for r, things in know.seen.items() if any(w in things for w in wanted)}
            target_rooms |= {r for r, texts in know.texts.items() if any(mentions(t, w) for t in texts for w in wanted)}
            if self._ready_to_prepare(know) and "prepare meal" not in admissible and know.recipe_room:
                target_rooms = {know.recipe_room}  # everything is done: back to where the meal is made
            if target_rooms and room not in target_rooms:
                step = self._path_step(know, room, target_rooms)
                if step is not None and f"go {step}" in goes:
                    return f"go {step}"
            tried = {d for (r, d, _) in know.moves if r == room}
            untried = [c for c in goes if c[3:] not in tried]
            if untried:
                return untried[0]
            frontier = {
                r for r, exits in know.exits.items() if r != room and exits - {d for (x, d, _) in know.moves if x == r}
            }
            step = self._path_step(know, room, frontier) if frontier else None
            if step is None and room in know.entered:
                step = OPPOSITE[know.entered[room][1]]
            if step is not None and f"go {step}" in goes:
                return f"go {step}"
        back = OPPOSITE.get(know.last_move or "")
        choices = [c for c in goes if c[3:] != back] or goes
        return rng.choice(choices)

    @staticmethod
    def _ready_to_prepare(know: _Knowledge) -> bool:
        """The recipe is known, every ingredient is held and every direction done."""
        if know.recipe is None or know.inventory is None:
            return False
        held = know.inventory
        if not all(any(h.endswith(i) for h in held) for i in know.recipe.ingredients):
            return False
        return all(
            any(h.endswith(i) and (CUT_DONE.get(v) or COOK_DONE.get(v, "")) in h.split() for h in held)
            for v, i in know.recipe.steps()
        )

    @staticmethod
    def _path_step(know: _Knowledge, start: str, targets: set[str]) -> str | None:
        """The first direction of a shortest path on the known moves from ``start`` to any of ``targets``."""
        graph: dict[str, list[tuple[str, str]]] = {}
        for a, d, b in know.moves:
            graph.setdefault(a, []).append((d, b))
        queue: deque[tuple[str, str | None]] = deque([(start, None)])
        seen = {start}
        while queue:
            node, first = queue.popleft()
            if node in targets and first is not None:
                return first
            for d, nxt in sorted(graph.get(node, [])):
                if nxt not in seen:
                    seen.add(nxt)
                    queue.append((nxt, first or d))
