"""Shared loader machinery: reading JSON / JSONL / parquet records with their line (or row) numbers, typed field
access whose errors name the file, the line and the field, and all-or-nothing conversion to episode JSONL."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from memrl.data.io import RecordError, describe_validation_error, iter_json_lines, write_jsonl
from memrl.data.schemas import Episode

__all__ = ["MAX_TURN_CHARS", "Where", "convert", "read_records", "unique_episodes"]


class Where:
    """A record's location (file and line, or row) for error messages."""

    def __init__(self, path: Path, line: int, unit: str = "line") -> None:
        self.path, self.line, self.unit = path, line, unit

    def error(self, field: str, message: str) -> RecordError:
        """A :class:`RecordError` naming the file, the line and ``field``."""
        where = f"{self.path}:{self.line}" if self.unit == "line" else f"{self.path}: row {self.line}"
        return RecordError(f"{where}: field '{field}': {message}")

    def get(self, obj: dict[str, Any], field: str, kind: type | tuple[type, ...], prefix: str = "") -> Any:
        """``obj[field]``, checked to be of type ``kind`` (bool is not accepted as int)."""
        name = f"{prefix}{field}"
        if field not in obj:
            raise self.error(name, "missing")
        value = obj[field]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds:
            raise self.error(name, f"expected {_names(kinds)}, got bool")
        if not isinstance(value, kinds):
            raise self.error(name, f"expected {_names(kinds)}, got {_json_type(value)}")
        return value

    def objects(self, obj: dict[str, Any], field: str, prefix: str = "") -> Iterator[tuple[int, str, dict[str, Any]]]:
        """The objects of the array ``obj[field]``: (index, the field prefix ``field[i].``, object); an element that
        is not an object is an error naming it."""
        for i, item in enumerate(self.get(obj, field, list, prefix)):
            if not isinstance(item, dict):
                raise self.error(f"{prefix}{field}[{i}]", "expected an object")
            yield i, f"{prefix}{field}[{i}].", item

    def text(self, obj: dict[str, Any], field: str, prefix: str = "") -> str:
        """A string field; integers and floats (some benchmarks store numeric answers) become text."""
        value = self.get(obj, field, (str, int, float), prefix)
        return value if isinstance(value, str) else str(value)

    def optional_text(self, obj: dict[str, Any], field: str, default: str | None, prefix: str = "") -> str | None:
        """Like :meth:`text`, but ``default`` when the field is absent (a present null or object is an error,
        not the string ``"None"``)."""
        return self.text(obj, field, prefix) if field in obj else default

    def int_list(self, obj: dict[str, Any], field: str, prefix: str = "") -> list[int]:
        """An optional array of integers (absent -> ``[]``); a wrong container or element type is an error."""
        if field not in obj:
            return []
        values = self.get(obj, field, list, prefix)
        for i, value in enumerate(values):
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.error(f"{prefix}{field}[{i}]", f"expected integer, got {_json_type(value)}")
        return list(values)

    def str_list(self, obj: dict[str, Any], field: str, prefix: str = "") -> list[str]:
        """An optional array of strings (absent -> ``[]``); a wrong container or element type is an error."""
        if field not in obj:
            return []
        values = self.get(obj, field, list, prefix)
        for i, value in enumerate(values):
            if not isinstance(value, str):
                raise self.error(f"{prefix}{field}[{i}]", f"expected string, got {_json_type(value)}")
        return list(values)

    def episode(self, data: dict[str, Any], turn_fields: list[str] | None = None) -> Episode:
        """Validate an :class:`Episode`, reporting the first problem against this location: a turn longer than
        :data:`MAX_TURN_CHARS` and a question id used twice are errors too. ``turn_fields``: each turn's field as the
        source file names it (LoCoMo's ``conversation.session_1[0].text``), for those errors; default
        ``trajectory[i]``."""
        try:
            episode = Episode.model_validate(data)
        except ValidationError as exc:
            raise RecordError(f"{self.path}:{self.line}: {describe_validation_error(exc)}") from None
        if not episode.trajectory:
            raise self.error("trajectory", "empty trajectory")
        for i, turn in enumerate(episode.trajectory):
            size = len(turn.action) + len(turn.observation)
            if size > MAX_TURN_CHARS:
                raise self.error(
                    turn_fields[i] if turn_fields is not None else f"trajectory[{i}]",
                    f"a turn of {size:,} characters (more than {MAX_TURN_CHARS:,}, "
                    "far beyond any context window): split it into several turns, or leave it out",
                )
        seen: dict[str, int] = {}
        for i, qa in enumerate(episode.qa_pairs):
            if qa.qa_id is not None:
                if qa.qa_id in seen:
                    raise self.error(
                        f"qa_pairs[{i}].qa_id",
                        f"{qa.qa_id!r} again (first at qa_pairs[{seen[qa.qa_id]}])"
                        ": every question needs its own id, or its results overwrite each other",
                    )
                seen[qa.qa_id] = i
        return episode

    @property
    def label(self) -> str:
        """``file:line`` (or ``file: row N``)."""
        return f"{self.path}:{self.line}" if self.unit == "line" else f"{self.path}: row {self.line}"


MAX_TURN_CHARS = 1_000_000  # one trajectory turn at most (about 250K tokens): a longer one is refused, not crawled


def unique_episodes(episodes: list[tuple[Where, Episode]]) -> list[Episode]:
    """The episodes of one file, checked to have distinct ids: two records with one id would be scored twice under
    one key; a :class:`RecordError` names both places."""
    first: dict[str, Where] = {}
    for where, episode in episodes:
        if episode.episode_id in first:
            raise RecordError(
                f"{where.label}: episode id {episode.episode_id!r} again (first at "
                f"{first[episode.episode_id].label}): every record needs its own id"
            )
        first[episode.episode_id] = where
    return [episode for _, episode in episodes]


def _names(kinds: tuple[type, ...]) -> str:
    names = {str: "string", int: "integer", float: "number", list: "array", dict: "object", bool: "boolean"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _json_type(value: Any) -> str:
    names = {
        str: "string",
        int: "integer",
        float: "number",
        list: "array",
        dict: "object",
        bool: "boolean",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)


def _decode(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise RecordError(f"{path}:{line}: not UTF-8 ({exc.reason} at byte {exc.start})") from None


def _json_error(path: Path, text: str, exc: json.JSONDecodeError, offset: int = 0) -> RecordError:
    line = text.count("\n", 0, offset + exc.pos) + 1
    return RecordError(f"{path}:{line}: invalid JSON: {exc.msg}")


def read_records(path: str | Path) -> Iterator[tuple[Where, dict[str, Any]]]:
    """Yield (location, object) for every record of a ``.jsonl`` file (one per line), a ``.json`` file (an array of
    objects, or one object) or a ``.parquet`` file (one per row)."""
    path = Path(path)
    if not path.is_file():
        raise RecordError(f"{path}: file not found")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for row, obj in enumerate(pq.read_table(path).to_pylist()):
            yield Where(path, row, "row"), obj
        return
    if path.suffix != ".json":  # JSONL, read a line at a time (a huge line is refused before it is read whole)
        for lineno, obj in iter_json_lines(path):
            yield _object(Where(path, lineno), obj)
        return
    text = _decode(path)
    if path.suffix == ".json":
        decoder = json.JSONDecoder()
        start = len(text) - len(text.lstrip())
        if text[start : start + 1] != "[":
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise _json_error(path, text, exc) from None
            yield _object(Where(path, text.count("\n", 0, start) + 1), obj)
            return
        pos = start + 1
        while True:
            while pos < len(text) and text[pos] in " \t\r\n,":
                pos += 1
            if pos >= len(text):
                raise RecordError(f"{path}:{text.count(chr(10)) + 1}: invalid JSON: unterminated array")
            if text[pos] == "]":
                return
            try:
                obj, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as exc:
                raise _json_error(path, text, exc) from None
            yield _object(Where(path, text.count("\n", 0, pos) + 1), obj)
            pos = end


def _object(where: Where, obj: Any) -> tuple[Where, dict[str, Any]]:
    if not isinstance(obj, dict):
        raise where.error("<record>", f"expected an object, got {_json_type(obj)}")
    return where, obj


def convert(src: str | Path, dst: str | Path, loader: Callable[[str | Path], list[Episode]]) -> list[Episode]:
    """Load every episode of ``src`` with ``loader`` and write them to ``dst`` as JSONL. All or nothing: a malformed
    record raises before anything is written."""
    episodes = loader(src)
    write_jsonl(dst, episodes)
    return episodes
