"""The ``ms_textworld`` task family: splits, named sizes, the task set's settings and the task (a TextWorld game behind
the Gym adapter, re-entered by replay)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from memrl.data.envs.gym import GymFactory, GymTask
from memrl.data.envs.ms_textworld import GameCache, GameRecord, MsTextWorldEnv, MsTextWorldParams
from memrl.data.registry import register_task
from memrl.data.tasks.ms_textworld.parsing import (
    gold_entities,
)

MS_TEXTWORLD_TASK = "play the text game: win it by doing what its opening text asks."
"""The instruction heading the reasoner's context (the game's own objective is in its first observation only)."""

MS_TEXTWORLD_SPLITS: dict[str, int] = {"sft": 0, "train": 100_000, "dev": 300_000, "test": 400_000}
"""First seed of each split (games ``seed, seed + 1, ...``): settings are chosen on dev, figures reported on test."""

MS_TEXTWORLD_SIZES: dict[str, dict[str, dict[str, Any]]] = {
    # TextWorld's levels: 1-10 five rooms, no doors; 11-20 ten rooms, closed doors and containers; 21-30 twenty rooms,
    # locked ones (keys in the inventory). The quest grows with the level inside each band.
    "treasure_hunter": {"small": {"level": 5}, "medium": {"level": 15}, "large": {"level": 25}},
    # (L - 1) // 100 distractor rooms per room of a chain of (L - 1) % 100 + 1 rooms: 5, 20 and 40 rooms.
    "coin_collector": {"small": {"level": 5}, "medium": {"level": 110}, "large": {"level": 120}},
    "cooking": {
        "small": {"recipe": 1, "take": 1, "go": 1},
        "medium": {"recipe": 2, "take": 2, "go": 6, "open": True, "cut": True},
        "large": {"recipe": 3, "take": 3, "go": 9, "open": True, "cook": True, "cut": True},
    },
}
"""Three named sizes per challenge (``size: small|medium|large``): the benchmark's difficulty axis."""


def size_params(challenge: str, size: str) -> dict[str, Any]:
    """The settings of a named size (:data:`MS_TEXTWORLD_SIZES`)."""
    return dict(MS_TEXTWORLD_SIZES[challenge][size])


class MsTextWorldTaskParams(MsTextWorldParams):
    """A TextWorld task set's game settings: :class:`~memrl.data.envs.ms_textworld.MsTextWorldParams` plus a named
    ``size`` (which fills the challenge's knobs; setting both is an error naming the knob) and the reasoner calls
    allowed beyond ``max_steps`` for its memory tool. ``mix`` (``["treasure_hunter/small", "cooking/medium"]``)
    makes a task set of several challenges and sizes: game ``seed`` is of cell ``mix[seed % len(mix)]``."""

    size: Literal["small", "medium", "large"] | None = None  # a preset of MS_TEXTWORLD_SIZES[challenge]
    recall_slack: float = Field(0.5, ge=0, le=10, description="memory-tool calls allowed: this share of max_steps")
    mix: list[str] | None = Field(None, min_length=1, description="challenge/size cells the seeds cycle through")

    @field_validator("mix")
    @classmethod
    def _cells(cls, mix: list[str] | None, info: ValidationInfo) -> list[str] | None:
        for cell in mix or []:
            challenge, _, size = cell.partition("/")
            if size not in MS_TEXTWORLD_SIZES.get(challenge, {}):
                raise ValueError(
                    f"mix entry {cell!r}: expected challenge/size with challenge one of "
                    f"{', '.join(MS_TEXTWORLD_SIZES)} and size small, medium or large"
                )
        if mix and any(info.data.get(k) is not None for k in ("level", "recipe", "take", "go", "size")):
            raise ValueError("mix names each cell's challenge and size: set no level, recipe, take, go or size")
        return mix

    def cell(self, seed: int) -> MsTextWorldTaskParams:
        """The settings of game ``seed``: these, or its cell of ``mix``."""
        if not self.mix:
            return self
        challenge, _, size = self.mix[seed % len(self.mix)].partition("/")
        data = self.model_dump(exclude={"mix"}, exclude_none=True)
        return MsTextWorldTaskParams.model_validate({**data, "challenge": challenge, "size": size})

    @model_validator(mode="before")
    @classmethod
    def _fill_size(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("size") is not None:
            challenge = data.get("challenge", "treasure_hunter")
            presets = MS_TEXTWORLD_SIZES.get(challenge)
            if presets is not None and data["size"] in presets:
                data = dict(data)
                for knob, value in presets[data["size"]].items():
                    if data.get(knob) is not None and data[knob] != value:
                        raise ValueError(
                            f"size {data['size']!r} sets {knob}={value}, and {knob}={data[knob]!r} is "
                            f"given too: drop one of them"
                        )
                    data[knob] = value
        return data

    def game_params(self) -> MsTextWorldParams:
        """The environment's parameters (without the task-level keys)."""
        if self.mix:
            raise ValueError("a mixed task set has no single game: take its cell(seed) first")
        return MsTextWorldParams.model_validate(self.model_dump(exclude={"size", "recall_slack", "mix"}))

    def reasoner_steps(self) -> int:
        """Reasoner calls an episode may make: game commands plus the memory-tool slack."""
        return self.max_steps + round(self.max_steps * self.recall_slack)


@register_task(
    "ms_textworld",
    params=MsTextWorldTaskParams,
    reasoner="ms_textworld",
    memory="sam",
    oracle="memrl.data.experts.ms_textworld:TwOracle",
)
class MsTextWorldTask(GymTask):
    """One TextWorld game as a memrl task: the Gym adapter (:class:`~memrl.data.envs.gym.GymTask`) over
    :class:`~memrl.data.envs.ms_textworld.MsTextWorldEnv`, re-entered by replay (TextWorld has no snapshot here), with
    the family's hooks: the instruction, SAM's settings for TextWorld pages, and the expert's privileged metadata."""

    family = "ms_textworld"

    def __init__(
        self, params: MsTextWorldTaskParams | dict[str, Any] | None = None, seed: int = 0, task_id: str = ""
    ) -> None:
        given = (
            params if isinstance(params, MsTextWorldTaskParams) else MsTextWorldTaskParams.model_validate(params or {})
        )
        self.settings = given.cell(seed)
        game = self.settings.game_params()
        super().__init__(
            GymFactory(MsTextWorldEnv, game.model_dump(mode="json")),
            seed=seed,
            task_id=task_id or f"tw-{seed}",
            family=self.family,
            max_steps=self.settings.reasoner_steps(),
            reentry="replay",
        )
        kind = "files" if game.game_files else game.challenge
        self.horizon_label = f"{kind}/{self.settings.size or game.size_label()}"

    @property
    def task(self) -> str:
        """The instruction heading the reasoner's context (the game's objective is in its first observation)."""
        return MS_TEXTWORLD_TASK

    def record(self) -> GameRecord:
        """The game's cache record (generated first when the cache does not hold it)."""
        return GameCache(self.settings.cache_dir).record(self.settings.game_params(), self.seed)

    def memory_defaults(self, config: Any) -> dict[str, Any]:
        """One-turn pages with three turns live (the reasoner's own short context) and cues long enough for a
        recalled recipe; only keys the memory system's config has, and only where the recipe set none."""
        wanted = {
            "page_turns": 1,
            "live_capacity_turns": 4,
            "keep_recent_turns": 3,
            "max_cue_tokens": 192,
            "expert_metadata": ["gold_entities"],
        }
        fields = getattr(type(config), "model_fields", {})
        return {k: v for k, v in wanted.items() if k in fields}

    def rollout_metadata(self, system: Any, config: Any) -> dict[str, Any]:
        """The episode metadata: what the privileged expert reads (``gold_entities``: what the walkthrough acts on,
        the target first); a model engine never sees it."""
        record = self.record()
        return {
            "family": self.family,
            "memory": getattr(system, "name", "memory"),
            "gold_entities": gold_entities(record.walkthrough),
            "walkthrough_steps": len(record.walkthrough),
            "challenge": record.challenge,
        }
