"""Checks of what a command will read and write, run before it creates anything.

Each check raises :class:`~memrl.data.errors.UserError` with a message that names the key, the path (and for records the
file:line:field) and says what to do. Model references: a path that exists locally must hold a checkpoint
(``config.json``) or an adapter (``adapter_config.json`` plus its safetensors weights); anything else is only taken
for a Hugging Face Hub id when it has the ``org/name`` form, and then only when the hub may be used: with
``HF_HUB_OFFLINE`` set it must already be in the local hub cache. So a mistyped local path fails at once, naming
itself, instead of after a minute of hub retries.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from memrl.data.errors import UserError

__all__ = [
    "check_adapter_dir",
    "check_existing_file",
    "check_model_ref",
    "check_output_dir",
    "check_resume_target",
    "hub_offline",
    "looks_like_hub_id",
]

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_ADAPTER_WEIGHTS = ("adapter_model.safetensors",)


def hub_offline() -> bool:
    """Whether the environment forbids hub access (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``)."""
    return any(os.environ.get(v, "").strip().lower() in {"1", "true", "yes", "on"}
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


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


def check_model_ref(ref: str, key: str, *, needs: str = "config.json") -> None:
    """A base checkpoint or tokenizer reference ``ref`` (config key ``key``): a local directory holding ``needs``,
    or a hub ``org/name`` id (cached, when offline)."""
    path = Path(ref).expanduser()
    if path.exists():
        if not path.is_dir():
            raise UserError(f"{key}: {ref} is a file, not a model directory (give the folder holding {needs})")
        if not (path / needs).is_file():
            raise UserError(f"{key}: {ref} holds no {needs}, so it is not a model checkpoint; point {key} at the "
                            f"folder written by save_pretrained (or `memrl model tiny --out {ref}`)")
        return
    if not looks_like_hub_id(ref) or path.parent.is_dir():
        # Not of the org/name form, or its first part is a local folder (runs/sft-tiny): a local path, so missing.
        raise UserError(f"{key}: model path {ref} does not exist ({path.absolute()}); check the path, or build "
                        "the model there first")
    if hub_offline() and not _in_hub_cache(ref, needs):
        raise UserError(f"{key}: {ref} is not a local folder, and as a Hub id it is not in the local Hub cache while "
                        "HF_HUB_OFFLINE is set; give a local model folder, or download it with hub access enabled")


def check_adapter_dir(ref: str, key: str) -> None:
    """A PEFT LoRA adapter folder: ``adapter_config.json`` and safetensors weights must be there."""
    path = Path(ref).expanduser()
    if not path.exists():
        if looks_like_hub_id(ref) and not path.parent.is_dir() and not hub_offline():
            return
        raise UserError(f"{key}: adapter folder {ref} does not exist ({path.absolute()}); give the folder a LoRA "
                        "run saved (adapter_config.json + adapter_model.safetensors)")
    if not path.is_dir():
        raise UserError(f"{key}: {ref} is a file, not an adapter folder")
    missing = [name for name in ("adapter_config.json",) if not (path / name).is_file()]
    if not any((path / w).is_file() for w in _ADAPTER_WEIGHTS):
        missing.append(_ADAPTER_WEIGHTS[0])
    if missing:
        raise UserError(f"{key}: adapter folder {ref} lacks {', '.join(missing)}; it is not a complete saved "
                        "LoRA adapter (safetensors only)")


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


def check_output_dir(ref: str, key: str) -> None:
    """An output folder must be creatable and writable (checked without creating it)."""
    path = Path(ref).expanduser()
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
        raise UserError(f"--resume: run {name!r} does not exist in {root} ({listing}); fix run.name, or drop "
                        "--resume to start a new run")
