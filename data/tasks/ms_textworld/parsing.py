"""Reading TextWorld's text: the grammar the ``ms_textworld`` reasoner and its expert share (rooms, exits, the
cookbook's recipe, the inventory, command objects, the walkthrough's gold entities) and the cue format SAM's memory
model writes (:func:`render_tw_cue` / :func:`parse_tw_cue`, the one home of that format)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

GOAL_INTENT = "what is the goal: the task or quest the game gave at the start"
RECIPE_INTENT = "what does the recipe say: its ingredients and directions"
DIRECTIONS = ("north", "east", "south", "west")
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}
# The cooking grammar: what each recipe verb is as a command (cut with the knife; cook with an appliance).
CUT_VERBS = ("slice", "dice", "chop")
COOK_APPLIANCE = {"fry": "stove", "roast": "oven", "grill": "bbq"}
CUT_DONE = {"slice": "sliced", "dice": "diced", "chop": "chopped"}
COOK_DONE = {"fry": "fried", "roast": "roasted", "grill": "grilled"}
EXAMINE_VERBS = ("check", "read", "examine", "consult", "look at")
EAT_VERBS = ("eat", "enjoy")
TAKE_VERBS = ("take", "pick up", "pick-up", "retrieve", "recover", "lift", "grab", "get", "got", "picked up")
SAFE_VERBS = ("go", "open", "examine", "look", "inventory")
# How a goal's sentences say each TextWorld command verb ("rest the milk on the stove" is ``put milk on stove``): the
# synonyms of TextWorld's instruction grammar (text_grammars/house_instruction.twg), plus a few common ones.
VERB_WORDS: dict[str, tuple[str, ...]] = {
    "open": ("open", "opened", "ajar"),
    "close": ("close", "closed", "shut"),
    "unlock": ("unlock", "unlocked"),
    "lock": ("lock", "locked"),
    "take": TAKE_VERBS,
    "put": ("put", "rest", "place", "set", "sit", "leave", "deposit", "stick"),
    "insert": ("insert", "put", "place", "stick", "deposit", "leave", "stow"),
    "drop": ("drop", "ditch", "throw", "toss", "leave"),
    "go": ("go", "head", "travel", "walk", "move", "venture", "proceed", "make your way", "trip", "journey", "step"),
    "eat": EAT_VERBS,
    "drink": ("drink",),
    "examine": EXAMINE_VERBS,
}


_HEADER = re.compile(r"^-= (.+?) =-$", re.MULTILINE)
_DIR_WORD = re.compile(r"\b(north|east|south|west)\b")
SENTENCE = re.compile(r"[^.!?]+[.!?]?")
_CARRYING = re.compile(r"You are carrying:?\s*(.*)", re.DOTALL)
PREP_RESULT = re.compile(r"\bYou (slice|dice|chop|roasted|fried|grilled) the (.+?)[.!]")
_ARTICLE = re.compile(r"^(?:a|an|some|the)\s+")
_SEPARATORS = (" from ", " with ", " into ", " on ")


def room_of(text: str) -> str | None:
    """The room a text's last TextWorld header names (lower case), or None."""
    found = _HEADER.findall(text)
    return found[-1].strip().lower() if found else None


def objective_of(text: str) -> str | None:
    """The opening text's objective: what comes before the first room header of the game's first observation."""
    m = _HEADER.search(text)
    head = text[: m.start()].strip() if m else ""
    return head or None


def exits_of(text: str) -> list[str]:
    """The directions a room description names (after its header), in compass order."""
    headers = list(_HEADER.finditer(text))
    if not headers:
        return []
    found = set(_DIR_WORD.findall(text[headers[-1].end() :].lower()))
    return [d for d in DIRECTIONS if d in found]


def command_object(command: str) -> tuple[str, str]:
    """(verb, object) of an admissible command: ``take red potato from fridge`` -> (``take``, ``red potato``)."""
    verb, _, rest = command.strip().lower().partition(" ")
    padded = f" {rest} "
    cuts = [padded.find(sep) for sep in _SEPARATORS if padded.find(sep) > 0]
    obj = padded[: min(cuts)] if cuts else padded
    return verb, obj.strip()


def command_instrument(command: str) -> str | None:
    """What follows ``from`` / ``with`` / ``on`` / ``into`` in a command (``fridge``, ``knife``), or None."""
    _, _, rest = command.strip().lower().partition(" ")
    padded = f" {rest} "
    for sep in _SEPARATORS:
        if (at := padded.find(sep)) > 0:
            return padded[at + len(sep) :].strip() or None
    return None


def mentions(text: str, phrase: str) -> bool:
    """Whether ``text`` names ``phrase`` as a whole word or phrase (any case; ``red potato`` is not in
    ``red potatoes``)."""
    return bool(phrase) and re.search(rf"(?<![\w-]){re.escape(phrase)}(?![\w-])", text, re.IGNORECASE) is not None


@dataclass
class Recipe:
    """The cookbook's recipe: ingredients and directions (``slice the red potato``, ``prepare meal``)."""

    ingredients: list[str] = field(default_factory=list)
    directions: list[str] = field(default_factory=list)

    def steps(self) -> list[tuple[str, str]]:
        """(verb, ingredient) of every direction before ``prepare meal``."""
        out = []
        for d in self.directions:
            verb, _, rest = d.partition(" ")
            item = _ARTICLE.sub("", rest.strip().lower())
            if verb in CUT_VERBS or verb in COOK_APPLIANCE:
                out.append((verb, item))
        return out


def parse_recipe(text: str) -> Recipe | None:
    """The recipe in a text (the cookbook's ``Ingredients:`` / ``Directions:`` layout), or None."""
    lower = text.lower()
    if "ingredients:" not in lower:
        return None
    start = lower.index("ingredients:")
    body = re.sub(r"(?i)\s*\b(directions:)", r"\n\1", text[start:]).split("\n")
    recipe = Recipe()
    section = None
    for raw in body:
        line = raw.strip().rstrip(".").lower()
        if line.startswith("ingredients:"):
            section, line = "i", line[len("ingredients:") :].strip()
        elif line.startswith("directions:"):
            section, line = "d", line[len("directions:") :].strip()
        if not line:
            if section == "d" and recipe.directions:
                break
            continue
        items = [x.strip() for x in line.split(",") if x.strip()] if "," in line else [line]
        if section == "i":
            recipe.ingredients += items
        elif section == "d":
            recipe.directions += items
    return recipe if recipe.ingredients or recipe.directions else None


def inventory_of(text: str) -> list[str] | None:
    """The item phrases of an inventory line (``a sliced red potato``), or None when the text is not one."""
    if "You are carrying nothing" in text:
        return []
    m = _CARRYING.search(text)
    if m is None:
        return None
    body = m.group(1).strip().rstrip(".")
    parts = re.split(r",\s*|\s+and\s+", body)
    return [_ARTICLE.sub("", p.strip().lower()) for p in parts if p.strip()]


def gold_entities(walkthrough: list[str]) -> list[str]:
    """The things a walkthrough acts on (the privileged expert's view of what matters): objects and instruments of
    its commands, the final target first (moves and bare verbs left out)."""
    found: list[str] = []
    for command in reversed(walkthrough):
        verb, obj = command_object(command)
        if verb in ("go", "inventory", "look", "prepare"):
            continue
        for thing in (obj, command_instrument(command)):
            if thing and thing not in found:
                found.append(thing)
    return found


# ----------------------------------------------------------------------------------------------------------------
# the cue grammar


@dataclass
class TwCue:
    """One page's cue: the action, the room it ends in, the room's exits, flags and things seen."""

    action: str = ""
    room: str | None = None
    exits: list[str] = field(default_factory=list)
    goal: bool = False
    recipe: bool = False
    memory: str | None = None  # a recall page: what it recalled (goal / recipe / ...)
    content: str = ""  # ... and what the recall established, kept in the cue
    seen: list[str] = field(default_factory=list)


def render_tw_cue(cue: TwCue) -> str:
    """``go east -> bar; exits north south; goal; recipe; seen worm, key`` (``memory: goal`` for a recall page)."""
    if cue.memory is not None:
        return f"memory: {cue.memory}: {cue.content}" if cue.content else f"memory: {cue.memory}"
    head = f"{cue.action} -> {cue.room}" if cue.room else (cue.action or "look")
    parts = [head]
    if cue.exits:
        parts.append("exits " + " ".join(cue.exits))
    if cue.goal:
        parts.append("goal")
    if cue.recipe:
        parts.append("recipe")
    if cue.seen:
        parts.append("seen " + ", ".join(cue.seen))
    return "; ".join(parts)


@functools.lru_cache(maxsize=1 << 14)
def parse_tw_cue(text: str) -> TwCue:
    """Whatever a cue says in :func:`render_tw_cue`'s grammar (unknown parts are ignored)."""
    cue = TwCue()
    text = text.strip()
    if text.lower().startswith("memory:"):
        subject, _, content = text[len("memory:") :].strip().partition(":")
        cue.memory, cue.content = subject.strip().lower(), content.strip()
        return cue
    text = text.lower()
    for i, part in enumerate(p.strip() for p in text.split(";")):
        if i == 0 and "->" in part:
            action, _, room = part.partition("->")
            cue.action, cue.room = action.strip(), room.strip() or None
        elif i == 0:
            cue.action = part
        elif part.startswith("exits"):
            cue.exits = [d for d in part[len("exits") :].split() if d in OPPOSITE]
        elif part == "goal":
            cue.goal = True
        elif part == "recipe":
            cue.recipe = True
        elif part.startswith("seen "):
            cue.seen = [s.strip() for s in part[len("seen ") :].split(",") if s.strip()]
    return cue


# ----------------------------------------------------------------------------------------------------------------
# the reasoner
