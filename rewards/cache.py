"""A content-addressed JSON cache on disk for committee and judge answers.

Keys are SHA-256 hashes of the inputs (engine identity, messages, settings), so reruns and resumed runs reuse every
answer they already paid for. Entries are written atomically; a corrupt entry is treated as a miss.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from memrl.data.io import atomic_write_text

__all__ = ["JsonCache", "content_key"]


def content_key(*parts: Any) -> str:
    """A stable hash of JSON-serialisable parts."""
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class JsonCache:
    """``get``/``put`` JSON values by key under ``root`` (in-memory only when ``root`` is None)."""

    def __init__(self, root: str | Path | None) -> None:
        self.root = Path(root) if root is not None else None
        self._memory: dict[str, Any] = {}
        self.hits = 0
        self.misses = 0

    def _path(self, key: str) -> Path:
        assert self.root is not None
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> Any | None:
        """The cached value, or None."""
        if key in self._memory:
            self.hits += 1
            return self._memory[key]
        if self.root is not None:
            path = self._path(key)
            if path.is_file():
                try:
                    value = json.loads(path.read_text(encoding="utf-8"))
                except (json.JSONDecodeError, UnicodeDecodeError):
                    value = None
                if value is not None:
                    self._memory[key] = value
                    self.hits += 1
                    return value
        self.misses += 1
        return None

    def put(self, key: str, value: Any) -> None:
        """Store a value (atomically on disk)."""
        self._memory[key] = value
        if self.root is not None:
            atomic_write_text(self._path(key), json.dumps(value, ensure_ascii=False))
