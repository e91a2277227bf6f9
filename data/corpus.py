"""The project's synthetic text corpus: what the offline tokenizer of the tiny models is trained on.

The corpus is deterministic for a given seed, so the tokenizer (and therefore every tiny model) is byte-identical
across machines. It holds the vocabulary of the synthetic environments and the scaffolding of the prompts, so that
the words the tiny models read and write are single tokens.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

__all__ = ["BASE_WORDS", "synthetic_corpus"]

_BASE_TEXT = """
the a an of to in on at by for from with without into onto over under is are was were be been has have had do does
did not no yes and or but if then else when while after before because so than as it its this that these those there
here you your we our they their he she his her i me my what which who whom where why how all any each every some none
one two three four five six seven eight nine ten first second third last next previous step turn page cue intent
recall memory tool call result error ok fail failed success passed open closed locked unlocked key door room box
chest drawer crate shelf table lamp coin book map note north south east west up down left right go take drop put use
look examine inventory carry holding found see saw contains inside empty task question answer true false unknown
status knowledge procedural reminder requirement command output file path run test install build check verify done
established ruled out unresolved may matter later relevant nothing information page_ids pages evidence fact facts
"""
BASE_WORDS: tuple[str, ...] = tuple(_BASE_TEXT.split())

def synthetic_corpus(seed: int = 0, repeats: int = 50) -> Iterator[str]:
    """Yield the corpus texts: the base vocabulary in random sentences and numbers."""
    rng = random.Random(seed)
    words = list(BASE_WORDS)
    for _ in range(repeats):
        rng.shuffle(words)
        yield " ".join(words)
    yield " ".join(str(i) for i in range(0, 1000))
    yield "\n".join(f"t{i}: step {i}" for i in range(0, 512))
