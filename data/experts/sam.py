"""The SAM oracle expert: writes page cues and reads pages under an intent, from the page's true facts.

It answers the two SAM memory-model prompts of :mod:`memrl.data.formats`:

- consolidation (:func:`~memrl.data.formats.render_sam_consolidate_prompt`): one compact cue listing the entities the
page locates (``red key, blue box, chest 7``), or the rooms it passes through when it locates nothing;
- recall (:func:`~memrl.data.formats.render_sam_recall_prompt`): the running extraction plus the page's fact lines that
  serve the intent (an item the intent names, or a container / key it asks about), or
  :data:`~memrl.data.formats.NOTHING_RELEVANT`.

Knobs make it an imperfect expert, so rejection sampling has something to reject: ``error_rate`` (a cue that drops
the relevant entity; a recall that returns a wrong place), recall style probabilities ``verbatim`` /
``paraphrase`` / ``omission`` (``drawer 5 holds the red key``, or the page's lines left out), drawn once per recall
call (independent draws per call), and ``cue_omission`` (each entity of a cue dropped independently). The relevant
entities come from request metadata ``gold_entities`` when the caller passes them (the true state), else the errors
hit a random entity.

``defer_to_later`` is the privileged expert's habit: reading a page whose relevant fact the tour states again on a
later page (request metadata ``evidence_steps``, the true state), it answers "nothing relevant" with this probability
and leaves the fact to the later page. That never hurts the expert, so its traces survive rejection sampling; a
student that imitates it cannot see the later page and learns to drop the fact blindly (an imitation gap RL removes).

``cue_max_entities`` keeps cues compact on long pages: at most that many entities, the relevant ones (the true state,
``gold_entities``) first. That is oracle knowledge a real memory model does not have; it lets a benchmark measure the
framework's context scaling with pages of many facts.
"""

from __future__ import annotations

import random
import re
from abc import ABC, abstractmethod
from typing import Any

from pydantic import Field, model_validator

from memrl.data.config import ConfigModel
from memrl.data.formats import NOTHING_RELEVANT, parse_sam_consolidate_prompt, parse_sam_recall_prompt
from memrl.data.tasks.sam import parse_facts

__all__ = ["SamOracle", "SamOracleConfig", "SamPromptOracle"]

_ROOM = re.compile(r"^you are in the (.+)\.$", re.MULTILINE)
_STEP = re.compile(r"^t(\d+)> ", re.MULTILINE)


class SamOracleConfig(ConfigModel):
    """Noise knobs of the SAM oracle (defaults: a perfect expert)."""

    error_rate: float = Field(0.0, ge=0, le=1)  # chance of a cue missing the gold entity / a wrong recalled place
    verbatim: float = Field(1.0, ge=0)  # relative weight of verbatim recall style (drawn once per call)
    paraphrase: float = Field(0.0, ge=0)  # relative weight of paraphrased recall style
    omission: float = Field(0.0, ge=0)  # relative weight of recall that leaves the page's lines out
    cue_omission: float = Field(0.0, ge=0, le=1)  # probability each entity of a cue is dropped
    defer_to_later: float = Field(0.0, ge=0, le=1, description="drop a fact the tour restates on a later page")
    cue_max_entities: int = Field(0, ge=0, description="at most this many entities per cue, gold first (0: all)")

    @model_validator(mode="after")
    def _some_style(self) -> SamOracleConfig:
        if self.verbatim + self.paraphrase + self.omission <= 0:
            raise ValueError("verbatim + paraphrase + omission must be positive")
        return self


def _mentions(text: str, entity: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(entity)}(?![\w]| \d)", text) is not None


class SamPromptOracle(ABC):
    """An expert answering SAM's two memory prompts: the cue of a consolidate prompt, the recall of a recall prompt."""

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        """The cue or the recall for the prompt in ``messages`` (empty text for any other prompt)."""
        consolidate = parse_sam_consolidate_prompt(messages)
        if consolidate is not None:
            return self.cue(consolidate[1], rng, self.gold(metadata))
        recall = parse_sam_recall_prompt(messages)
        if recall is not None:
            intent, _, page_text, so_far = recall
            return self.answer_recall(intent, page_text, so_far, rng, metadata)
        return ""

    def gold(self, metadata: dict[str, Any]) -> list[str]:
        """The task's gold entities, as the cue matches them."""
        return list(metadata.get("gold_entities", []))

    @abstractmethod
    def cue(self, page_text: str, rng: random.Random, gold: list[str] | None = None) -> str:
        """The cue of a page."""

    @abstractmethod
    def answer_recall(
        self, intent: str, page_text: str, so_far: str, rng: random.Random, metadata: dict[str, Any]
    ) -> str:
        """``so_far`` plus what the page says that serves ``intent``."""


class SamOracle(SamPromptOracle):
    """Programmatic expert for both SAM memory roles (a :class:`~memrl.data.schemas.ScriptedPolicy`)."""

    name = "sam-oracle"

    def __init__(self, config: SamOracleConfig | dict[str, Any] | None = None) -> None:
        self.config = config if isinstance(config, SamOracleConfig) else SamOracleConfig.model_validate(config or {})

    def answer_recall(
        self, intent: str, page_text: str, so_far: str, rng: random.Random, metadata: dict[str, Any]
    ) -> str:
        """The recall, or ``so_far`` unchanged when a later page restates the facts and the oracle defers to it."""
        later = [int(x) for x in metadata.get("evidence_steps", [])]
        steps = [int(x) for x in _STEP.findall(page_text)]
        restated_later = steps and any(e > max(steps) for e in later) and any(e in steps for e in later)
        if restated_later and self.config.defer_to_later and rng.random() < self.config.defer_to_later:
            return so_far or NOTHING_RELEVANT
        return self.recall(intent, page_text, so_far, rng)

    def cue(self, page_text: str, rng: random.Random, gold: list[str] | None = None) -> str:
        """The entities the page locates, in order of appearance (noisy per the config)."""
        entities: list[str] = []
        for line in page_text.split("\n"):
            one = parse_facts(line)
            for item in one.location:
                entities.append(item)
            for container, key in one.opener.items():
                entities += [key, container]
        entities = list(dict.fromkeys(entities))
        cfg = self.config
        if entities and rng.random() < cfg.error_rate:
            relevant = [e for e in entities if e in (gold or [])]
            victim = relevant[0] if relevant else rng.choice(entities)
            entities = [e for e in entities if e != victim]
        entities = [e for e in entities if not (cfg.cue_omission and rng.random() < cfg.cue_omission)]
        if cfg.cue_max_entities and len(entities) > cfg.cue_max_entities:
            relevant = set(gold or [])
            ranked = [e for e in entities if e in relevant] + [e for e in entities if e not in relevant]
            keep = set(ranked[: cfg.cue_max_entities])
            entities = [e for e in entities if e in keep]
        if entities:
            return ", ".join(entities)
        rooms = list(dict.fromkeys(_ROOM.findall(page_text)))
        return ", ".join(rooms) if rooms else NOTHING_RELEVANT

    def recall(self, intent: str, page_text: str, so_far: str, rng: random.Random) -> str:
        """``so_far`` plus the page's lines that serve ``intent``, in one style drawn for the whole call."""
        cfg = self.config
        style: list[str] = []  # drawn at the first relevant line, then shared by the call's lines
        lines = [line for line in so_far.split("\n") if line.strip()] if so_far else []
        places = sorted({p for p in re.findall(r"\b[a-z]+ \d+\b", page_text)})
        for raw in page_text.split("\n"):
            facts = parse_facts(raw)
            new: str | None = None
            for item, place in facts.location.items():
                if _mentions(intent, item):
                    if rng.random() < cfg.error_rate:
                        place = rng.choice([p for p in places if p != place] or [place])
                    new = self._style(f"the {item} is in {place}", f"{place} holds the {item}", rng, style)
            for container, key in facts.opener.items():
                if _mentions(intent, container) or _mentions(intent, key):
                    new = self._style(f"the {key} opens {container}", f"{container} opens with the {key}", rng, style)
            if new and new not in lines:
                lines.append(new)
        return "\n".join(lines) if lines else NOTHING_RELEVANT

    def _style(self, verbatim: str, paraphrase: str, rng: random.Random, drawn: list[str]) -> str | None:
        if not drawn:
            cfg = self.config
            r = rng.random() * (cfg.verbatim + cfg.paraphrase + cfg.omission)
            drawn.append(
                "verbatim" if r < cfg.verbatim else "paraphrase" if r < cfg.verbatim + cfg.paraphrase else "omission"
            )
        return {"verbatim": verbatim, "paraphrase": paraphrase}.get(drawn[0])
