"""Checks of what a command will read and write, run before it creates anything.

Each check raises :class:`~memrl.data.errors.UserError` with a message that names the key, the path (and for records the
file:line:field) and says what to do. Model references: a path that exists locally must hold a checkpoint
(``config.json``) or an adapter (``adapter_config.json`` plus its safetensors weights); anything else is only taken
for a Hugging Face Hub id when it has the ``org/name`` form, and then only when the hub may be used: with
``HF_HUB_OFFLINE`` set it must already be in the local hub cache. So a mistyped local path fails at once, naming
itself, instead of after a minute of hub retries.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import Any

from memrl.data.errors import UserError
from memrl.data.io import read_mapping

__all__ = [
    "check_adapter_dir",
    "check_existing_file",
    "check_model_ref",
    "check_output_dir",
    "check_resume_target",
    "hub_offline",
    "looks_like_hub_id",
    "safetensors_problem",
    "safetensors_shapes",
]

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_ADAPTER_WEIGHTS = ("adapter_model.safetensors",)


def hub_offline() -> bool:
    """Whether the environment forbids hub access (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``)."""
    return any(
        os.environ.get(v, "").strip().lower() in {"1", "true", "yes", "on"}
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def looks_like_hub_id(ref: str) -> bool:
    """``org/name`` (one slash, no leading ``.``, ``/`` or ``~``): the only form taken for a Hub repository."""
    return bool(_HUB_ID.match(ref)) and not ref.startswith((".", "~"))


def _in_hub_cache(repo_id: str, filename: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers always brings it
        return False
    found = try_to_load_from_cache(repo_id, filename)
    return isinstance(found, str)


def _safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """A safetensors file's header and its length; ValueError saying what is wrong."""
    size = path.stat().st_size
    if size < 8:
        raise ValueError(f"{size} bytes: too short for a safetensors file")
    with open(path, "rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        if length > size - 8:
            raise ValueError(f"its header claims {length} bytes but the file holds {size} (truncated?)")
        try:
            header = json.loads(fh.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ValueError("its header is not JSON (not a safetensors file, or damaged)") from None
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    return header, length


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with a ``.safetensors`` file (its header does not parse, or its tensors do not fill the file
    exactly), or None. Reads the header only."""
    try:
        header, length = _safetensors_header(path)
    except (OSError, ValueError) as exc:
        return str(exc)
    ends = [
        t["data_offsets"][1]
        for k, t in header.items()
        if k != "__metadata__" and isinstance(t, dict) and isinstance(t.get("data_offsets"), list)
    ]
    expected, size = 8 + length + max(ends, default=0), path.stat().st_size
    if expected != size:
        return f"its tensors need {expected} bytes but the file holds {size} (truncated?)"
    return None


def safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape of a safetensors file (header only)."""
    header, _ = _safetensors_header(path)
    return {k: list(t["shape"]) for k, t in header.items() if k != "__metadata__" and isinstance(t, dict)}


def _json_file(path: Path, key: str) -> dict[str, Any]:
    try:
        return read_mapping(path)
    except ValueError as exc:
        raise UserError(f"{key}: {path} {exc}; the folder is damaged or not a saved model") from None


def _check_weights(path: Path, key: str) -> None:
    """A checkpoint folder's weights: safetensors headers against their file sizes, index shards present."""
    files = sorted(path.glob("*.safetensors"))
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = set(_json_file(index, key).get("weight_map", {}).values())
        missing = sorted(s for s in shards if not (path / s).is_file())
        if missing:
            raise UserError(f"{key}: {index} names shards that are not there: {', '.join(missing[:5])}")
    if not files and not list(path.glob("pytorch_model*.bin")):
        raise UserError(f"{key}: {path} holds no weights (*.safetensors), so it is not a complete checkpoint")
    for file in files:
        if (problem := safetensors_problem(file)) is not None:
            raise UserError(f"{key}: {file} is not a valid safetensors file: {problem}; save the model again")


def _check_tokenizer_files(path: Path, key: str) -> None:
    if not (path / "tokenizer_config.json").is_file() or not any(
        (path / name).is_file() for name in ("tokenizer.json", "vocab.json", "tokenizer.model", "vocab.txt")
    ):
        raise UserError(
            f"{key}: {path} holds no tokenizer files (tokenizer_config.json and tokenizer.json or a "
            "vocabulary); save the tokenizer with the model (tokenizer.save_pretrained), or name a "
            "tokenizer folder"
        )
    _json_file(path / "tokenizer_config.json", key)


def check_model_ref(ref: str, key: str, *, needs: str = "config.json", tokenizer: bool = False) -> None:
    """A base checkpoint or tokenizer reference ``ref`` (config key ``key``): a local directory holding ``needs``,
    or a hub ``org/name`` id (cached, when offline). A local checkpoint's ``config.json`` must parse and its
    safetensors files must be whole; with ``tokenizer`` (or ``needs="tokenizer_config.json"``) its tokenizer files
    must be there too."""
    path = Path(ref).expanduser()
    if path.exists():
        if not path.is_dir():
            raise UserError(f"{key}: {ref} is a file, not a model directory (give the folder holding {needs})")
        if not (path / needs).is_file():
            raise UserError(
                f"{key}: {ref} holds no {needs}, so it is not a model checkpoint; point {key} at the "
                f"folder written by save_pretrained (or `memrl model tiny --out {ref}`)"
            )
        if needs == "config.json":
            _json_file(path / needs, key)
            _check_weights(path, key)
        if tokenizer or needs == "tokenizer_config.json":
            _check_tokenizer_files(path, key)
        return
    if not looks_like_hub_id(ref) or path.parent.is_dir():
        # Not of the org/name form, or its first part is a local folder (runs/sft-tiny): a local path, so missing.
        raise UserError(
            f"{key}: model path {ref} does not exist ({path.absolute()}); check the path, or build "
            "the model there first"
        )
    if hub_offline() and not _in_hub_cache(ref, needs):
        raise UserError(
            f"{key}: {ref} is not a local folder, and as a Hub id it is not in the local Hub cache while "
            "HF_HUB_OFFLINE is set; give a local model folder, or download it with hub access enabled"
        )


def check_adapter_dir(ref: str, key: str, *, base: str | None = None) -> None:
    """A PEFT LoRA adapter folder: ``adapter_config.json`` (parsing) and whole safetensors weights must be there;
    with a local ``base`` checkpoint, every LoRA matrix must fit a module of the base (its shape): an adapter
    trained on another base is refused here, not deep inside PEFT."""
    path = Path(ref).expanduser()
    if not path.exists():
        if looks_like_hub_id(ref) and not path.parent.is_dir() and not hub_offline():
            return
        raise UserError(
            f"{key}: adapter folder {ref} does not exist ({path.absolute()}); give the folder a LoRA "
            "run saved (adapter_config.json + adapter_model.safetensors)"
        )
    if not path.is_dir():
        raise UserError(f"{key}: {ref} is a file, not an adapter folder")
    missing = [name for name in ("adapter_config.json",) if not (path / name).is_file()]
    if not any((path / w).is_file() for w in _ADAPTER_WEIGHTS):
        missing.append(_ADAPTER_WEIGHTS[0])
    if missing:
        raise UserError(
            f"{key}: adapter folder {ref} lacks {', '.join(missing)}; it is not a complete saved "
            "LoRA adapter (safetensors only)"
        )
    config = _json_file(path / "adapter_config.json", key)
    weights = path / _ADAPTER_WEIGHTS[0]
    if (problem := safetensors_problem(weights)) is not None:
        raise UserError(f"{key}: {weights} is not a valid safetensors file: {problem}")
    if base is not None and (Path(base).expanduser() / "config.json").is_file():
        _check_adapter_fits(path, config, Path(base).expanduser(), key)


def _check_adapter_fits(adapter: Path, config: dict[str, Any], base: Path, key: str) -> None:
    base_shapes: dict[str, list[int]] = {}
    for file in sorted(base.glob("*.safetensors")):
        base_shapes.update(safetensors_shapes(file))
    if not base_shapes:
        return
    trained_on = config.get("base_model_name_or_path")
    for name, shape in safetensors_shapes(adapter / _ADAPTER_WEIGHTS[0]).items():
        match = re.match(r"^(?:base_model\.model\.)?(.+)\.lora_([AB])(?:\.[^.]+)?\.weight$", name)
        if match is None:
            continue
        module, side = match.group(1) + ".weight", match.group(2)
        target = base_shapes.get(module)
        fits = (
            target is not None
            and len(shape) == 2
            and len(target) == 2
            and (shape[1] == target[1] if side == "A" else shape[0] == target[0])
        )
        if not fits:
            found = f"shape {target}" if target is not None else "no such module"
            raise UserError(
                f"{key}: adapter {adapter} does not fit base {base}: {name} has shape {shape}, the base's "
                f"{module} {found}; it was trained on {trained_on or 'another base'} (adapter_config.json "
                "base_model_name_or_path): use the adapter with the base it was trained on"
            )


def check_existing_file(ref: str, key: str, *, what: str = "file", nonempty: bool = True) -> None:
    """A file the command reads must exist (and hold something)."""
    path = Path(ref).expanduser()
    if not path.exists():
        raise UserError(f"{key}: {what} {ref} does not exist")
    if path.is_dir():
        raise UserError(f"{key}: {ref} is a folder; {key} takes a {what}")
    if nonempty and path.stat().st_size == 0:
        raise UserError(f"{key}: {what} {ref} is empty")


def _nearest_existing(path: Path) -> Path:
    probe = path.absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


NAME_MAX_BYTES = 255  # longest file name (one path component) of Linux file systems
PATH_MAX_BYTES = 4096


def check_output_dir(ref: str, key: str) -> None:
    """An output folder must be creatable and writable (checked without creating it): no component longer than a
    file system takes, no symbolic link on the way that points nowhere or at a file."""
    path = Path(ref).expanduser()
    try:
        absolute = path.absolute()
    except OSError as exc:  # the working folder was deleted
        raise UserError(
            f"{key}: {ref} is relative to the working folder, which no longer exists ({exc.strerror}); "
            "cd into an existing folder, or give an absolute path"
        ) from None
    too_long = [part for part in absolute.parts if len(os.fsencode(part)) > NAME_MAX_BYTES]
    if too_long:
        raise UserError(
            f"{key}: {ref} has a name of {len(os.fsencode(too_long[0]))} bytes ({too_long[0][:40]}...); "
            f"file systems take at most {NAME_MAX_BYTES}: choose a shorter name"
        )
    if len(os.fsencode(str(absolute))) > PATH_MAX_BYTES - NAME_MAX_BYTES:
        raise UserError(
            f"{key}: {ref} is {len(os.fsencode(str(absolute)))} bytes long, too long for the files "
            "written under it: choose a shorter path"
        )
    for probe in (absolute, *absolute.parents):
        if probe.is_symlink():
            target = os.readlink(probe)
            if not probe.exists():
                raise UserError(
                    f"{key}: {probe} is a symbolic link to {target}, which does not exist: create "
                    f"{target}, or remove the link"
                )
            if not probe.is_dir():
                raise UserError(
                    f"{key}: {probe} is a symbolic link to the file {target}, not a folder: remove the "
                    "link, or choose another path"
                )
    anchor = _nearest_existing(path)
    if not anchor.is_dir():
        raise UserError(f"{key}: cannot create {ref}: {anchor} is a file, not a folder")
    if not os.access(anchor, os.W_OK | os.X_OK):
        raise UserError(f"{key}: {anchor} is not writable, so {ref} cannot be written; choose another {key}")


def check_resume_target(output_dir: str, name: str | None) -> None:
    """``--resume`` continues a run that exists: name it, and it must be there (the message lists the runs that
    are)."""
    root = Path(output_dir)
    runs = sorted(p.name for p in root.iterdir() if (p / "config.yaml").is_file()) if root.is_dir() else []
    listing = f"runs in {root}: {', '.join(runs)}" if runs else f"{root} holds no runs"
    if name is None:
        raise UserError(f"--resume needs the run to continue: set run.name ({listing})")
    if not (root / name / "config.yaml").is_file():
        raise UserError(
            f"--resume: run {name!r} does not exist in {root} ({listing}); fix run.name, or drop "
            "--resume to start a new run"
        )
