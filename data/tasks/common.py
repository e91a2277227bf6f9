"""Pieces shared by the task families: rebuilding a task from its spec, answer normalisation, message helpers."""

from __future__ import annotations

import re
import string
from typing import Any, ClassVar

from typing_extensions import Self

from memrl.data.envs.base import turn_tokens
from memrl.data.schemas import EnvSpec, Episode, Message, QAPair, Turn

__all__ = ["SpecTask", "as_messages", "content_of", "normalize_answer", "role_of"]


class SpecTask:
    """A synthetic task that an :class:`EnvSpec` named after its ``family`` rebuilds: deterministic for its
    (params, seed), constructed as ``cls(params, seed, task_id)``."""

    family: ClassVar[str]
    params: Any  # the family's parameter model
    seed: int
    task_id: str
    task: str  # the task statement

    @classmethod
    def from_spec(cls, spec: EnvSpec, task_id: str = "") -> Self:
        """Rebuild from an :class:`EnvSpec` named after the family."""
        return cls(spec.params, spec.seed, task_id)  # type: ignore[call-arg]

    @property
    def spec(self) -> EnvSpec:
        """The spec that rebuilds this task."""
        return EnvSpec(name=self.family, seed=self.seed, params=self.params.model_dump(mode="json"))

    def _episode(
        self, turns: list[Turn], qa_pairs: list[QAPair], *, task_type: str, domain: str, metadata: dict[str, Any]
    ) -> Episode:
        """This task as an episode in AMA-Bench's shape: ``turns`` its trajectory (the horizon their token count),
        the spec that rebuilds it as its environment."""
        return Episode(
            episode_id=self.task_id,
            task=self.task,
            task_type=task_type,
            domain=domain,
            trajectory=turns,
            qa_pairs=qa_pairs,
            env=self.spec,
            horizon_tokens=sum(turn_tokens(t.action, t.observation) for t in turns),
            metadata=metadata,
        )


def normalize_answer(text: str | None) -> str:
    """Lower-case, drop punctuation, articles and extra spaces (SQuAD-style normalisation)."""
    if text is None:
        return ""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def role_of(message: Any) -> str:
    """The role of a :class:`Message` or a ``{"role", "content"}`` dict."""
    return message["role"] if isinstance(message, dict) else message.role


def content_of(message: Any) -> str:
    """The content of a :class:`Message` or a ``{"role", "content"}`` dict."""
    return message["content"] if isinstance(message, dict) else message.content


def as_messages(items: list[dict[str, str]]) -> list[Message]:
    """Rendered prompt dicts (as :mod:`memrl.data.formats` returns them) as :class:`Message` objects."""
    return [Message(role=m["role"], content=m["content"]) for m in items]  # type: ignore[arg-type]
