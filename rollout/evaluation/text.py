"""Text helpers the reader and the extractive memory model share: content words, stems, a message's role and text.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["stems", "terms"]


_STOPWORDS = frozenset(re.findall(r"\w+", """
    a an the of in on at to from for by with and or is was were are be been did does do what which who whom whose
    where when why how that this these those it its after before into than then there their they he she his her
    you your i me my we our as if not no yes any all
"""))


_WORD = re.compile(r"[a-z0-9]+")


def terms(text: str) -> list[str]:
    """Content terms of ``text``: lower-case words and numbers without stopwords, in order, deduplicated."""
    out: list[str] = []
    for word in _WORD.findall(text.lower()):
        if word not in _STOPWORDS and word not in out:
            out.append(word)
    return out


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _role(message: Any) -> str:
    return message["role"] if isinstance(message, dict) else message.role


def _content(message: Any) -> str:
    return message["content"] if isinstance(message, dict) else message.content


def stems(text: str) -> set[str]:
    """Crudely stemmed content terms (``painted`` and ``paints`` -> ``paint``), so a question matches the words of a
    conversation that inflects them differently."""
    return {_stem(t) for t in terms(text)}


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word
