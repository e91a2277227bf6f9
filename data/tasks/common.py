"""Pieces shared by the task families: answer normalisation and message helpers."""

from __future__ import annotations

import re
import string
from typing import Any

from memrl.data.schemas import Message

__all__ = ["as_messages", "content_of", "normalize_answer", "role_of"]


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
