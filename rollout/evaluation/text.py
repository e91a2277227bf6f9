"""Text helpers the reader and the extractive memory model share: content words, stems, normalised text."""

from __future__ import annotations

import re

__all__ = ["STOPWORDS", "WORD_PATTERN", "normalised", "stems", "terms"]


STOPWORDS = frozenset(
    re.findall(
        r"\w+",
        """
    a an the of in on at to from for by with and or is was were are be been did does do what which who whom whose
    where when why how that this these those it its after before into than then there their they he she his her
    you your i me my we our as if not no yes any all
""",
    )
)


WORD_PATTERN = re.compile(r"[a-z0-9]+")


def terms(text: str) -> list[str]:
    """Content terms of ``text``: lower-case words and numbers without stopwords, in order, deduplicated."""
    out: list[str] = []
    for word in WORD_PATTERN.findall(text.lower()):
        if word not in STOPWORDS and word not in out:
            out.append(word)
    return out


def normalised(text: str) -> str:
    """``text`` lower-cased with its whitespace collapsed (for substring tests that ignore case and line breaks)."""
    return " ".join(text.lower().split())


def stems(text: str) -> set[str]:
    """Crudely stemmed content terms (``painted`` and ``paints`` -> ``paint``), so a question matches the words of a
    conversation that inflects them differently."""
    return {_stem(t) for t in terms(text)}


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word
