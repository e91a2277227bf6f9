"""Record IO: validated JSONL and ``datasets`` Arrow, written atomically.

Readers reject a malformed record with the file, the line (or row) and the field that is wrong. Writers never leave a
half-written file: they write a temporary sibling and rename it into place. :func:`append_jsonl` is the resumable
per-item path (evaluation results, distilled rows): a torn last line from a killed process is ignored on resume.

A write that fails because the storage cannot take it (no space left, the process's file-size limit ``ulimit -f``,
a quota, a read-only file system) is a :class:`StorageError`: one line naming the folder, what was being written and
what to do, instead of the writer library's own error (safetensors' ``IoError``, torch's ``inline_container.cc``).
:func:`storage_guard` turns such a failure into one and removes the temporary folder the write was filling.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from memrl.data.errors import RunFault, UserError

__all__ = [
    "RecordError",
    "StorageError",
    "append_jsonl",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_jsonl_file",
    "iter_json_lines",
    "iter_jsonl",
    "iter_lines",
    "read_arrow",
    "read_jsonl",
    "read_mapping",
    "replace_folder",
    "storage_error",
    "storage_guard",
    "to_arrow_rows",
    "write_arrow",
    "write_jsonl",
]

M = TypeVar("M", bound=BaseModel)


class RecordError(UserError, ValueError):
    """A malformed record: the message names the file, the line (or row) and the field."""


def read_mapping(path: Path) -> dict[str, Any]:
    """The mapping a ``.json`` file, or any other file read as YAML (safe loader), holds; a ValueError saying why
    (``does not parse as JSON (...)``, ``holds no mapping of keys``) when it cannot be read or holds something else."""
    json_file = path.suffix == ".json"
    kind, parse, error = (
        ("JSON", json.loads, json.JSONDecodeError) if json_file else ("YAML", yaml.safe_load, yaml.YAMLError)
    )
    try:
        data = parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, error) as exc:
        raise ValueError(f"does not parse as {kind} ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError("holds no mapping of keys")
    return data


# ----------------------------------------------------------------------------------------------------------------
# storage faults


class StorageError(RunFault):
    """A write the storage could not take (full, over the file-size limit or quota, read-only); names the folder."""


_REASONS = {
    errno.ENOSPC: "no space left on the device",
    errno.EFBIG: "a file reached the process's file-size limit",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EIO: "the storage reported an I/O error",
}
# how the writer libraries word these (safetensors: "I/O error: No space left on device (os error 28)")
_WORDINGS = (
    ("no space left on device", errno.ENOSPC),
    ("os error 28", errno.ENOSPC),
    ("storagefull", errno.ENOSPC),
    ("file too large", errno.EFBIG),
    ("os error 27", errno.EFBIG),
    ("filetoolarge", errno.EFBIG),
    ("disk quota exceeded", errno.EDQUOT),
    ("os error 122", errno.EDQUOT),
    ("read-only file system", errno.EROFS),
    ("os error 30", errno.EROFS),
)
# torch.save's writer says neither (``[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534``)
_WRITER_FAILURES = ("inline_container.cc", "pytorchstreamwriter", "file write failed")
LOW_SPACE_BYTES = 256 << 20  # a writer failure with less free space than this is taken as a full disk


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(_existing(folder)).free
    except OSError:
        return None


def _size_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _human(n: int) -> str:
    size = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} bytes"


def storage_errno(exc: BaseException, folder: str | Path) -> int | None:
    """The errno (ENOSPC, EFBIG, EDQUOT, EROFS, EIO) of a write that failed because of the storage under ``folder``,
    found in ``exc`` or its causes (an ``OSError`` or a writer library's wording of one), or None."""
    chain = list(_causes(exc))
    for cause in chain:
        if isinstance(cause, OSError) and cause.errno in _REASONS:
            return cause.errno
        text = str(cause).lower()
        for wording, code in _WORDINGS:
            if wording in text:
                return code
    if any(w in str(cause).lower() for cause in chain for w in _WRITER_FAILURES):
        if _size_limit() is not None:
            return errno.EFBIG
        free = _free_bytes(Path(folder))
        return errno.ENOSPC if free is not None and free < LOW_SPACE_BYTES else errno.EIO
    return None


def storage_error(exc: BaseException, folder: str | Path, what: str) -> StorageError | None:
    """A :class:`StorageError` for ``exc`` when the storage under ``folder`` refused a write (see
    :func:`storage_errno`), naming ``what`` was being written, the folder, the free space or the limit, and the fix;
    None when ``exc`` is something else."""
    code = storage_errno(exc, folder)
    if code is None:
        return None
    folder = Path(folder)
    detail, fix = "", "check the storage"
    if code == errno.ENOSPC:
        free = _free_bytes(folder)
        detail = f" ({_human(free)} free there now)" if free is not None else ""
        fix = "free some space there (or point run.output_dir at a larger disk)"
    elif code == errno.EFBIG:
        limit = _size_limit()
        detail = f" (ulimit -f: {_human(limit)})" if limit is not None else ""
        fix = "raise the limit (ulimit -f unlimited)"
    elif code == errno.EDQUOT:
        fix = "free some space within the quota (or write elsewhere)"
    elif code == errno.EROFS:
        fix = "write elsewhere (run.output_dir)"
    return StorageError(f"{what}: {_REASONS[code]} while writing {folder}{detail}; {fix}, then run the command again")


@contextlib.contextmanager
def storage_guard(folder: str | Path, what: str, cleanup: Iterable[str | Path] = ()) -> Iterator[None]:
    """Run a write into ``folder``; when it fails for any reason, remove the ``cleanup`` paths (the temporary
    folder or file it was filling: nothing half-written stays), and when the storage refused it, raise a
    :class:`StorageError` instead (see :func:`storage_error`)."""
    try:
        yield
    except BaseException as exc:
        for path in cleanup:
            path = Path(path)
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
        if isinstance(exc, Exception) and (error := storage_error(exc, folder, what)) is not None:
            raise error from exc
        raise


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
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = str(path)  # a failed write() names no file: say which one
        raise
    return path


def replace_folder(complete: Path, path: Path) -> None:
    """Put the complete folder ``complete`` (a sibling of ``path``) in ``path``'s place: a reader sees the old
    folder or the new one, never a mix (the old one is moved aside, then removed)."""
    if path.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
        os.replace(path, trash / "old")
        os.replace(complete, path)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(complete, path)


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
    try:
        with open(path, "ab") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)  # a failed write() names no file: say which one
        raise


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


MAX_RECORD_BYTES = 64 << 20  # one JSONL line (a record) at most: a longer one is refused before it is read whole


def iter_lines(path: str | Path, max_bytes: int = MAX_RECORD_BYTES) -> Iterator[tuple[int, bytes, bool]]:
    """``(line number, line without its newline, torn)`` for every line of ``path``, read one at a time: a line
    longer than ``max_bytes`` is a :class:`RecordError` after reading ``max_bytes`` of it, never the whole line (a
    1 GiB line costs 64 MiB, not gigabytes). ``torn``: the last line has no newline (a writer killed mid-append)."""
    path = Path(path)
    with open(path, "rb") as fh:
        lineno = 0
        while raw := fh.readline(max_bytes + 1):
            lineno += 1
            ended = raw.endswith(b"\n")
            if not ended and len(raw) > max_bytes:
                raise RecordError(
                    f"{path}:{lineno}: a line longer than {_human(max_bytes)}: refused before reading "
                    "it whole (a JSONL file holds one record per line; is this the file you meant?)"
                )
            yield lineno, raw[:-1] if ended else raw, not ended


def iter_json_lines(path: str | Path, *, tolerate_torn_tail: bool = False) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed JSON value)`` for every non-blank line of ``path`` (see :func:`iter_lines`); a line
    that is not UTF-8 or not JSON is a :class:`RecordError` naming the file and line. ``tolerate_torn_tail`` skips a
    last line without its newline that does not parse (a writer killed mid-append)."""
    for lineno, raw, torn in iter_lines(path):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            if torn and tolerate_torn_tail:
                return
            raise RecordError(f"{path}:{lineno}: not UTF-8 ({exc.reason} at byte {exc.start} of the line)") from None
        try:
            yield lineno, json.loads(text)
        except json.JSONDecodeError as exc:
            if torn and tolerate_torn_tail:
                return
            raise RecordError(f"{path}:{lineno}: invalid JSON: {exc.msg} (column {exc.colno})") from None


def iter_jsonl(
    path: str | Path, model: type[M] | None = None, *, tolerate_torn_tail: bool = False
) -> Iterator[M | dict[str, Any]]:
    """Yield validated records (or plain dicts when ``model`` is None) from a JSONL file.

    ``tolerate_torn_tail`` skips a last line without its newline that does not parse (a writer killed mid-append).
    """
    path = Path(path)
    if not path.is_file():
        raise RecordError(f"{path}: file not found")
    for lineno, obj in iter_json_lines(path, tolerate_torn_tail=tolerate_torn_tail):
        if model is None:
            if not isinstance(obj, dict):
                raise RecordError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            yield obj
            continue
        try:
            yield model.model_validate(obj)
        except ValidationError as exc:
            raise RecordError(f"{path}:{lineno}: {describe_validation_error(exc)}") from None


def check_jsonl_file(path: str | Path, what: str) -> None:
    """A JSONL file a tool appends to and reads back (a benchmark's ``progress.jsonl``) must be absent or a file
    whose every line is a JSON object (a torn last line from a kill is allowed): anything else (a folder, binary,
    garbage, a list) is a :class:`RecordError` naming the file, the line and the way out, raised before any work."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return
    if not path.is_file():
        raise RecordError(f"{what}: {path} is not a file (a folder, or a link to nothing); remove it to start over")
    try:
        for _ in iter_jsonl(path, tolerate_torn_tail=True):
            pass
    except RecordError as exc:
        raise RecordError(f"{what}: {exc}; fix that line, or remove the file to compute everything again") from None


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
        replace_folder(tmp, path)
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
