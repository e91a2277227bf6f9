"""Real-text memory tasks: a SAM episode ("SAM: State-Adaptive Memory for Long-Horizon Reasoning Agent", arXiv
2605.24468) told as an English conversation between two housemates: LoCoMo-style dialogue sessions over a narrated
agent trajectory, as in "AMA-Bench: Evaluating Long-Horizon Memory for Agentic Applications" (arXiv 2602.22769), with
the question at the end.

The world, tour, question and gold answer are a :class:`~memrl.data.tasks.sam.SamTask`'s (the same seed gives the
same facts); only the text changes. Every observation becomes a short session: the two speakers say where they are,
what they open and what they chat about (small talk that carries no fact), and a fact is read out as one sentence of
its own (``the pink shoe is in trunk 10.`` or ``trunk 10 holds the pink shoe.``), the form the programmatic reasoner
and the oracle expert read. The ``next:`` / ``question:`` lines stay as the environment's prompt to the reasoner.
Pages are therefore mostly English prose with the facts scattered across sessions; cue writing and recall must keep
the few sentences that matter and drop the rest, which a pretrained instruct model can read and write.

Splits (:data:`DIALOGUE_SPLITS`): disjoint seed ranges for SFT data, RL training, dev (choose settings) and test
(report), the same parameters for dev and test.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any

from pydantic import Field

from memrl.data.registry import register_task
from memrl.data.tasks.sam import SamTask, SamTaskParams

__all__ = ["DIALOGUE_SPLITS", "DIALOGUE_TASK", "DialogueParams", "DialogueTask", "narrate"]

DIALOGUE_TASK = "follow the housemates' conversation and answer the question at the end."

DIALOGUE_SPLITS: dict[str, int] = {"sft": 0, "train": 100_000, "dev": 300_000, "test": 400_000}
"""First seed of each split (tasks ``seed, seed + 1, ...``): settings are chosen on dev, figures reported on test."""

SPEAKERS = [("Maya", "Jon"), ("Priya", "Sam"), ("Lena", "Omar"), ("Chloe", "Ravi"), ("Nora", "Tom")]

_SMALL_TALK = [
    "Did you water the plants this morning?",
    "I still can't believe how cold it was yesterday.",
    "Remind me to call my sister after dinner.",
    "The neighbours are having another party tonight.",
    "I think we should repaint this place in the spring.",
    "My train was late again, twenty minutes this time.",
    "Have you tried the new bakery on the corner?",
    "I started reading that mystery novel you lent me.",
    "We really need to sort out the recycling.",
    "The football match went to penalties last night.",
    "I'm thinking of taking a week off in June.",
    "Someone left the radio on all afternoon.",
    "Let's order pizza if this takes much longer.",
    "I found an old photo of us from university.",
    "The landlord says the heating will be fixed on Friday.",
    "My phone battery dies by lunchtime these days.",
]
_REPLIES = [
    "Yes, I did.",
    "Honestly, no idea.",
    "Sounds good to me.",
    "Let's talk about it later.",
    "Ha, fair enough.",
    "Me neither.",
    "Good point.",
    "Maybe tomorrow.",
]
_ENTER = [
    "{a}: Okay, we're in the {room} now.",
    "{a}: Right, this is the {room}.",
    "{b}: Here we are, the {room}.",
]
_EXITS = ["{b}: There are doors to the {exits}.", "{a}: From here we can go {exits}."]
_SEE = ["{b}: I can see {things} in here.", "{a}: There's {things} over there."]
_OPEN = ["{a}: Let me open {c}.", "{b}: I'll take a look inside {c}.", "{a}: Opening {c} now."]
_OPENED = ["{b}: It's open. There's a label inside, I'll read it out:", "{a}: Got it open. The tag says:"]
_LOCKED = ["{b}: {c} won't budge, it's locked. There's a note taped to it:", "{a}: Locked. The sticker on it reads:"]
_CLOSE = ["{a}: I'll close {c} again.", "{b}: Closing {c}."]
_GO = ["{a}: Let's head {d}.", "{b}: Come on, let's go {d}."]
_FACT_FORMS = ["the {item} is in {place}.", "{place} holds the {item}."]
_FACT = re.compile(r"^the (.+?) is in (\w+ \d+)$")
_OPENS = re.compile(r"^the (.+?) opens (\w+ \d+)$")


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def narrate(observation: str, rng: random.Random, speakers: tuple[str, str], small_talk: float = 0.7) -> str:
    """One text-world observation (``you open trunk 10.`` / ``the pink shoe is in trunk 10`` / ...) as a short
    English exchange between ``speakers``; fact lines become one sentence each, read out on their own line; other
    lines become speech; with probability ``small_talk`` an exchange of chat that states no fact is added."""
    a, b = speakers
    out: list[str] = []
    for raw in observation.split("\n"):
        line = raw.strip().rstrip(".")
        if not line:
            continue
        if m := re.match(r"^you are in the (.+)$", line):
            out.append(rng.choice(_ENTER).format(a=a, b=b, room=m.group(1)))
        elif m := re.match(r"^exits: (.+)$", line):
            out.append(rng.choice(_EXITS).format(a=a, b=b, exits=_join(m.group(1).split(", "))))
        elif m := re.match(r"^you see (.+)$", line):
            out.append(rng.choice(_SEE).format(a=a, b=b, things=_join(m.group(1).split(", "))))
        elif m := re.match(r"^you open (\w+ \d+)$", line):
            out.append(rng.choice(_OPEN).format(a=a, b=b, c=m.group(1)))
            out.append(rng.choice(_OPENED).format(a=a, b=b))
        elif m := re.match(r"^you cannot open (\w+ \d+): .*locked$", line):
            out.append(rng.choice(_OPEN).format(a=a, b=b, c=m.group(1)))
            out.append(rng.choice(_LOCKED).format(a=a, b=b, c=m.group(1)))
        elif m := re.match(r"^you close (\w+ \d+)$", line):
            out.append(rng.choice(_CLOSE).format(a=a, b=b, c=m.group(1)))
        elif m := re.match(r"^you go (\w+)$", line):
            out.append(rng.choice(_GO).format(a=a, b=b, d=m.group(1)))
        elif m := _FACT.match(line):
            form = rng.choice(_FACT_FORMS)
            out.append(form.format(item=m.group(1), place=m.group(2)))
        elif _OPENS.match(line):
            out.append(line + ".")
        else:  # anything else the world says (an error, an empty container) is spoken as it is
            out.append(f"{a}: {line[:1].upper()}{line[1:]}.")
    if rng.random() < small_talk:
        first, second = (a, b) if rng.random() < 0.5 else (b, a)
        out.append(f"{first}: {rng.choice(_SMALL_TALK)}")
        out.append(f"{second}: {rng.choice(_REPLIES)}")
    return "\n".join(out)


class DialogueParams(SamTaskParams):
    """Knobs of a dialogue task: the SAM task's, plus how much small talk each session carries."""

    small_talk: float = Field(0.7, ge=0, le=1, description="chance that a session adds an exchange of small talk")


@register_task(
    "dialogue",
    params=DialogueParams,
    section="dialogue",
    reasoner="sam",
    memory="sam",
    oracle="memrl.data.experts.sam:SamOracle",
)
class DialogueTask(SamTask):
    """A SAM episode as an English conversation (module docstring); the agent loop's SAM interface unchanged."""

    family = "dialogue"

    def __init__(self, params: DialogueParams | dict[str, Any] | None = None, seed: int = 0, task_id: str = "") -> None:
        params = params if isinstance(params, DialogueParams) else DialogueParams.model_validate(params or {})
        self.speakers = SPEAKERS[seed % len(SPEAKERS)]
        super().__init__(params, seed, task_id or f"dialogue-{seed}")
        self.task = DIALOGUE_TASK

    def _strip(self, observation: str) -> str:  # type: ignore[override]
        """The observation without its goal line, narrated; the wording is a pure function of (seed, text), so a
        restored or replayed episode reads the same."""
        plain = SamTask._strip(observation)
        digest = hashlib.sha256(f"{self.seed}/{plain}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "little"))
        return narrate(plain, rng, self.speakers, self.params.small_talk)  # type: ignore[attr-defined]

    def episode(self) -> Any:
        """The episode in AMA-Bench's shape (see :meth:`SamTask.episode`), marked as the dialogue family."""
        ep = super().episode()
        return ep.model_copy(
            update={"task_type": "dialogue", "domain": "dialogue", "metadata": {**ep.metadata, "family": "dialogue"}}
        )
