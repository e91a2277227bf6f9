"""The privileged expert of the ``ms_textworld`` family: SAM's memory roles written from the game's walkthrough.

It answers SAM's two memory-model prompts (:func:`~memrl.data.formats.render_sam_consolidate_prompt`,
:func:`~memrl.data.formats.render_sam_recall_prompt`) for pages of a Microsoft TextWorld game, knowing what a memory
model cannot: the walkthrough (TextWorld's ``policy_commands`` from the start) and so which things of the game matter
(request metadata ``gold_entities``, from :func:`~memrl.data.tasks.ms_textworld.gold_entities`: the target first).

- **consolidation**: one cue per page in the family's cue grammar
  (:func:`~memrl.data.tasks.ms_textworld.render_tw_cue`): the command and the room it led to, the room's exits,
  whether the page states the goal or the recipe, and the things on the page that the walkthrough uses (``seen ...``;
  the privileged part: a cue names only those, so it stays short in a kitchen of twenty things); a recall's page keeps
  what the recall established (``memory: goal: ...`` / ``memory: recipe: ...``), so one recall serves the episode;
- **recall**: under a goal intent the opening text's sentences that name a thing the walkthrough uses (all of them if
  none does); under a recipe intent the cookbook's ingredients and directions; under any other intent the page's
  sentences that name what the intent asks about; else :data:`~memrl.data.formats.NOTHING_RELEVANT`.

Noise knobs make it an imperfect expert, so rejection sampling has something to reject: ``error_rate`` (a cue loses
its room or what it saw; a recall returns nothing), ``seen_all`` (cues name every thing on the page, as a memory
model without the walkthrough would).
"""

from __future__ import annotations

import random
import re
from typing import Any

from pydantic import Field

from memrl.data.config import ConfigModel
from memrl.data.experts.sam import SamPromptOracle
from memrl.data.formats import (
    NOTHING_RELEVANT,
    parse_sam_recalled,
    parse_tool_calls,
)
from memrl.data.tasks.ms_textworld import (
    TwCue,
    exits_of,
    objective_of,
    parse_recipe,
    render_tw_cue,
    room_of,
)

__all__ = ["TwOracle", "TwOracleConfig", "page_units"]

_UNIT = re.compile(r"^t(\d+)> (.*)$", re.MULTILINE)
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")
_THING = re.compile(r"\b(?:a|an|the|some)\s+([a-z][a-z' -]*?)(?=[,.!?:;]| and | on | in | from |\n|$)")


class TwOracleConfig(ConfigModel):
    """Noise knobs of the TextWorld expert (defaults: a perfect expert)."""

    error_rate: float = Field(0.0, ge=0, le=1)  # chance a cue loses its room / seen things, a recall returns nothing
    seen_all: bool = False  # cues name every thing on the page, not only what the walkthrough uses


def page_units(page_text: str) -> list[tuple[str, str]]:
    """(action, observation) of each turn of a page (``tN> action`` lines; the first observation has no action)."""
    marks = list(_UNIT.finditer(page_text))
    if not marks:
        return [("", page_text)]
    units = []
    if marks[0].start() > 0:
        units.append(("", page_text[: marks[0].start()].strip("\n")))
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(page_text)
        units.append((m.group(2).strip(), page_text[m.end() : end].strip("\n")))
    return units


def _memory_subject(action: str, observation: str) -> tuple[str, str] | None:
    """(``goal`` / ``recipe`` / the intent, the recalled content) when a turn is a memory-tool call."""
    recalled = parse_sam_recalled(observation)
    if recalled is None:
        calls = parse_tool_calls(action).calls
        if not (calls and calls[0].name == "memory") and not action.startswith("memory("):
            return None
        intent, content = (str(calls[0].arguments.get("intent", "")) if calls else action), ""
    else:
        intent, content = recalled[0], recalled[2]
    low = intent.lower()
    subject = "goal" if "goal" in low else "recipe" if "recipe" in low else low[:40]
    return subject, "" if content.strip().lower() == NOTHING_RELEVANT else " ".join(content.split())


class TwOracle(SamPromptOracle):
    """Programmatic expert for SAM's memory roles on TextWorld pages (a :class:`~memrl.data.schemas.ScriptedPolicy`)."""

    name = "ms-textworld-oracle"

    def __init__(self, config: TwOracleConfig | dict[str, Any] | Any = None) -> None:
        if config is not None and not isinstance(config, (TwOracleConfig, dict)):
            # another expert's noise settings (``memrl data distill`` hands every SAM-style oracle its sam_oracle
            # section): the knob they share is the error rate
            config = {"error_rate": getattr(config, "error_rate", 0.0)}
        self.config = config if isinstance(config, TwOracleConfig) else TwOracleConfig.model_validate(config or {})

    def gold(self, metadata: dict[str, Any]) -> list[str]:
        """The task's gold entities, lower-cased as the pages' text is matched."""
        return [str(g).lower() for g in metadata.get("gold_entities", [])]

    def answer_recall(
        self, intent: str, page_text: str, so_far: str, rng: random.Random, metadata: dict[str, Any]
    ) -> str:
        """:meth:`recall` with the task's gold entities."""
        return self.recall(intent, page_text, so_far, rng, self.gold(metadata))

    # ------------------------------------------------------------------------------------------------ cues
    def _unit_cue(self, action: str, observation: str, rng: random.Random, gold: list[str]) -> TwCue:
        memory = _memory_subject(action, observation)
        if memory is not None:  # a recall's page: its cue keeps what the recall established
            return TwCue(memory=memory[0], content=memory[1])
        room = room_of(observation)
        cue = TwCue(action=action.strip().lower() or "start", room=room)
        if room is not None:
            cue.exits = exits_of(observation)
        cue.goal = not action and objective_of(observation) is not None
        cue.recipe = parse_recipe(observation) is not None
        # what a page shows of where things are: a room's description, or what opening a container revealed (not an
        # inventory line, the recipe's ingredients or the opening text's plans)
        text = observation.lower() if room is not None or cue.action.startswith("open ") else ""
        if room is not None and cue.goal:
            text = text[text.find("-= ") :]
        if self.config.seen_all:
            things = [t.strip() for t in _THING.findall(text)]
            cue.seen = [t for t in dict.fromkeys(things) if t and t != room]
        else:
            found = [(text.find(g), g) for g in gold if re.search(rf"(?<![\w-]){re.escape(g)}(?![\w-])", text)]
            cue.seen = [g for _, g in sorted(found) if g != room]
        if self.config.error_rate and rng.random() < self.config.error_rate:
            if cue.seen:
                cue.seen = cue.seen[1:]
            else:
                cue.room, cue.exits = None, []
        return cue

    def cue(self, page_text: str, rng: random.Random, gold: list[str] | None = None) -> str:
        """The page's cue: one cue per turn, joined by `` | `` (one-turn pages have one)."""
        units = page_units(page_text)
        return " | ".join(render_tw_cue(self._unit_cue(a, o, rng, gold or [])) for a, o in units)

    # ------------------------------------------------------------------------------------------------ recall
    def recall(
        self, intent: str, page_text: str, so_far: str, rng: random.Random, gold: list[str] | None = None
    ) -> str:
        """``so_far`` plus what the page says that serves ``intent`` (module docstring)."""
        lines = [line for line in so_far.split("\n") if line.strip()] if so_far else []
        if not (self.config.error_rate and rng.random() < self.config.error_rate):
            for line in self._extract(intent.lower(), page_text, gold or []):
                if line not in lines:
                    lines.append(line)
        return "\n".join(lines) if lines else NOTHING_RELEVANT

    def _extract(self, intent: str, page_text: str, gold: list[str]) -> list[str]:
        out: list[str] = []
        for action, observation in page_units(page_text):
            recalled = parse_sam_recalled(observation)
            text = recalled[2] if recalled is not None else observation
            if "recipe" in intent:
                recipe = parse_recipe(text)
                if recipe is not None:
                    directions = [re.sub(r"\b(?:the|a|an) ", "", d) for d in recipe.directions]
                    out += [f"Ingredients: {', '.join(recipe.ingredients)}", f"Directions: {', '.join(directions)}"]
            elif "goal" in intent:
                objective = text if recalled is not None else (objective_of(text) if not action else None)
                if objective:
                    sentences = [s.strip() for s in _SENTENCE.findall(objective) if s.strip()]
                    keep = [  # the steps that name a thing the walkthrough uses, or a direction to go
                        s
                        for s in sentences
                        if any(re.search(rf"\b{re.escape(g)}\b", s.lower()) for g in gold)
                        or re.search(r"\b(north|east|south|west)\b", s.lower())
                    ]
                    out += keep or sentences
            else:
                wanted = [w for w in re.findall(r"[a-z]+", intent) if len(w) > 3]
                for s in _SENTENCE.findall(text):
                    if any(w in s.lower() for w in wanted):
                        out.append(s.strip())
        return out
