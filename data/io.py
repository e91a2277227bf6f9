"""Record IO: validated JSONL and ``datasets`` Arrow, written atomically.

Readers reject a malformed record with the file, the line (or row) and the field that is wrong. Writers never leave a
half-written file: they write a temporary sibling and rename it into place. :func:`append_jsonl` is the resumable
per-item path (evaluation results, distilled rows): a torn last line from a killed process is ignored on resume.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from memrl.data.errors import UserError

__all__ = [
    "RecordError",
    "append_jsonl",
    "atomic_write_bytes",
    "atomic_write_text",
    "iter_jsonl",
    "read_arrow",
    "read_jsonl",
    "to_arrow_rows",
    "write_arrow",
    "write_jsonl",
]

M = TypeVar("M", bound=BaseModel)


class RecordError(UserError, ValueError):
    """A malformed record: the message names the file, the line (or row) and the field."""


# ----------------------------------------------------------------------------------------------------------------
# atomic writes


def atomic_write_bytes(path: str | Path, payload: bytes) -> Path:
    """Write ``payload`` to ``path`` through a temporary file and a rename (readers never see a partial file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """UTF-8 text version of :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def _as_json_line(record: BaseModel | dict[str, Any]) -> str:
    if isinstance(record, BaseModel):
        return record.model_dump_json()
    return json.dumps(record, ensure_ascii=False, allow_nan=False)


def write_jsonl(path: str | Path, records: Iterable[BaseModel | dict[str, Any]]) -> Path:
    """Write records as JSON lines, atomically; returns the path."""
    lines = [_as_json_line(r) for r in records]
    text = "".join(line + "\n" for line in lines)
    return atomic_write_text(path, text)


def append_jsonl(path: str | Path, record: BaseModel | dict[str, Any]) -> None:
    """Append one record and fsync (the resumable path: each finished item is durable once this returns)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (_as_json_line(record) + "\n").encode("utf-8")
    with open(path, "ab") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


# ----------------------------------------------------------------------------------------------------------------
# reading


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "<record>"


def describe_validation_error(exc: ValidationError) -> str:
    """Render a pydantic error as ``field 'a.b[0].c': message`` parts joined by '; '."""
    parts = []
    for err in exc.errors():
        parts.append(f"field '{_field_path(err['loc'])}': {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


def iter_jsonl(
    path: str | Path, model: type[M] | None = None, *, tolerate_torn_tail: bool = False
) -> Iterator[M | dict[str, Any]]:
    """Yield validated records (or plain dicts when ``model`` is None) from a JSONL file.

    ``tolerate_torn_tail`` skips a last line without its newline that does not parse (a writer killed mid-append).
    """
    path = Path(path)
    if not path.is_file():
        raise RecordError(f"{path}: file not found")
    with open(path, "rb") as fh:
        raw_lines = fh.read().split(b"\n")
    last = len(raw_lines) - 1
    for index, raw in enumerate(raw_lines):
        lineno = index + 1
        if not raw.strip():
            continue
        torn = index == last  # no trailing newline: possibly a partial write
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            if torn and tolerate_torn_tail:
                return
            raise RecordError(f"{path}:{lineno}: not UTF-8 ({exc.reason} at byte {exc.start} of the line)") from None
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            if torn and tolerate_torn_tail:
                return
            raise RecordError(f"{path}:{lineno}: invalid JSON: {exc.msg} (column {exc.colno})") from None
        if model is None:
            if not isinstance(obj, dict):
                raise RecordError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            yield obj
            continue
        try:
            yield model.model_validate(obj)
        except ValidationError as exc:
            raise RecordError(f"{path}:{lineno}: {describe_validation_error(exc)}") from None


def read_jsonl(path: str | Path, model: type[M], *, tolerate_torn_tail: bool = False) -> list[M]:
    """Read and validate every record of a JSONL file (see :func:`iter_jsonl`)."""
    return list(iter_jsonl(path, model, tolerate_torn_tail=tolerate_torn_tail))  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------------------------
# Arrow (``datasets``)


def to_arrow_rows(records: Iterable[BaseModel]) -> list[dict[str, Any]]:
    """Rows for ``datasets.Dataset.from_list``: free-form ``JsonDict`` fields become JSON strings (Arrow needs
    one type per column), everything else stays native."""
    return [r.model_dump(mode="python", context={"arrow": True}) for r in records]


def write_arrow(path: str | Path, records: Iterable[BaseModel]) -> Path:
    """Save records as a ``datasets`` Arrow dataset directory, atomically (temp dir, then rename)."""
    import datasets

    path = Path(path)
    rows = to_arrow_rows(records)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        ds = datasets.Dataset.from_list(rows) if rows else datasets.Dataset.from_dict({})
        ds.save_to_disk(str(tmp))
        if path.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
            os.replace(path, trash / "old")
            os.replace(tmp, path)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def read_arrow(path: str | Path, model: type[M]) -> list[M]:
    """Load a dataset written by :func:`write_arrow` and validate every row."""
    import datasets

    path = Path(path)
    if not path.is_dir():
        raise RecordError(f"{path}: Arrow dataset directory not found")
    ds = datasets.load_from_disk(str(path))
    out: list[M] = []
    for row_index, row in enumerate(ds):
        try:
            out.append(model.model_validate(row))
        except ValidationError as exc:
            raise RecordError(f"{path}: row {row_index}: {describe_validation_error(exc)}") from None
    return out
