"""Atomic checkpoints for the online loops: policy (adapter only for LoRA), optimizer, scheduler, RNG states of every
process (accelerate's ``save_state``), plus the loop's own state (iteration, data position, policy version) and
attached directories such as the reward cache. The cache is content-addressed and append-only, so a checkpoint holds a
hard-linked snapshot of it (a copy across filesystems), and loading puts back the entries the live cache lacks: a
checkpoint copied elsewhere resumes without paying for committee calls again.

A checkpoint is written into a temporary directory and renamed into place once every file is there, so a kill at
any moment leaves either the previous checkpoints or a complete new one. Its ``manifest.json`` (every file's size and
SHA-256) is written last, before the ``COMPLETE`` marker. :meth:`CheckpointManager.latest` returns the newest
checkpoint that verifies (manifest sizes and checksums, safetensors headers against their file sizes, the loop state
parses); a newer one that does not is reported (a warning naming the file and what is wrong) and skipped. Every save
is also recorded in ``<root>.log`` beside the checkpoint folder (SFT's Hugging Face Trainer checkpoints too), so a
resume can tell a run that never reached a checkpoint (it starts over) from one whose checkpoints are all gone or
damaged (an error): :func:`resume_point` makes that decision for both kinds. Loading uses accelerate's safe loader
(``weights_only``) and safetensors: nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from memrl.data.checks import safetensors_problem
from memrl.data.errors import UserError
from memrl.data.io import atomic_write_text, storage_guard

__all__ = [
    "CheckpointManager",
    "check_checkpoints_remain",
    "journal_of",
    "record_saved",
    "resume_point",
    "saved_before",
    "verify_checkpoint",
    "verify_trainer_checkpoint",
]

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^ckpt-(\d{6})$")
_MARKER = "COMPLETE"
MANIFEST = "manifest.json"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _write_manifest(folder: Path) -> None:
    """Record every file's size and SHA-256 (written last: it vouches for everything else)."""
    files = {
        str(f.relative_to(folder)): {"bytes": f.stat().st_size, "sha256": _sha256(f)}
        for f in sorted(folder.rglob("*"))
        if f.is_file() and f.name not in (MANIFEST, _MARKER)
    }
    (folder / MANIFEST).write_text(json.dumps({"files": files}, indent=1, sort_keys=True))


def verify_checkpoint(path: Path, *, checksums: bool = True) -> str | None:
    """What is wrong with checkpoint ``path`` (a missing, resized or changed file, an unreadable safetensors file, a
    loop state that does not parse), or None when it is intact."""
    if not (path / _MARKER).exists():
        return "incomplete (no COMPLETE marker)"
    try:
        manifest = json.loads((path / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{path / MANIFEST} is missing or does not parse"
    for name, entry in manifest.items():
        file = path / name
        if not file.is_file():
            return f"{file} is missing"
        if file.stat().st_size != entry["bytes"]:
            return f"{file} has {file.stat().st_size} bytes, the manifest says {entry['bytes']}"
        if file.suffix == ".safetensors" and (problem := safetensors_problem(file)):
            return f"{file}: {problem}"
        if checksums and _sha256(file) != entry["sha256"]:
            return f"{file} does not match its checksum in the manifest (changed or damaged)"
    return _json_object_problem(path / "loop_state.json")


def _json_object_problem(file: Path) -> str | None:
    """What is wrong with a state file that must hold a JSON object, or None."""
    try:
        state = json.loads(file.read_text())
    except (OSError, ValueError):
        return f"{file} is missing or does not parse"
    return None if isinstance(state, dict) else f"{file} is not a JSON object"


def verify_trainer_checkpoint(path: Path) -> str | None:
    """What is wrong with a Hugging Face Trainer ``checkpoint-N`` folder (SFT), which has no manifest: its
    ``trainer_state.json`` must parse, its safetensors weights be whole, its optimizer and scheduler states be there
    and not empty (DeepSpeed keeps its own under ``global_step*``), or None when it looks intact."""
    if problem := _json_object_problem(path / "trainer_state.json"):
        return problem
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        return f"{path} holds no weights (*.safetensors)"
    for file in weights:
        if (problem := safetensors_problem(file)) is not None:
            return f"{file}: {problem}"
    if not any(path.glob("global_step*")):
        for name in ("optimizer.pt", "scheduler.pt"):
            file = path / name
            if not file.is_file() or file.stat().st_size == 0:
                return f"{file} is missing or empty"
    return None


def journal_of(root: Path) -> Path:
    """``<root>.log`` beside the checkpoint folder ``root``: one line per checkpoint saved, kept when the checkpoints
    are deleted."""
    return root.parent / f"{root.name}.log"


def record_saved(root: Path, name: str) -> None:
    """Note in the journal that checkpoint ``name`` under ``root`` is complete (call once it is)."""
    with open(journal_of(root), "a", encoding="utf-8") as fh:
        fh.write(f"{name}\n")


def saved_before(root: Path) -> list[str]:
    """The checkpoints the run writing into ``root`` recorded saving."""
    journal = journal_of(root)
    if not journal.is_file():
        return []
    return [line.split()[0] for line in journal.read_text().splitlines() if line.strip()]


def _lost(root: Path, problems: list[str]) -> UserError:
    damaged = f" ({'; '.join(problems)})" if problems else ""
    return UserError(
        f"--resume: every checkpoint of run {root.parent} is gone or damaged{damaged}; it saved "
        f"{', '.join(saved_before(root))} (listed in {journal_of(root)}). Restore one, or start a new "
        "run without --resume"
    )


def check_checkpoints_remain(root: Path) -> None:
    """Before a resume writes anything: a run that recorded checkpoints under ``root`` still has one of them
    (:class:`~memrl.data.errors.UserError` otherwise; whether it is intact is :func:`resume_point`'s question)."""
    saved = saved_before(root)
    if saved and not any((root / name).is_dir() for name in saved):
        raise _lost(root, [])


def resume_point(root: Path, candidates: list[Path], verify: Any) -> Path | None:
    """Where a resume continues: the newest of ``candidates`` (checkpoints under ``root``, oldest first) that
    ``verify`` finds nothing wrong with, each newer one that fails reported with what is wrong; None when the run
    never saved a checkpoint (it starts over). A run whose recorded checkpoints are all gone or damaged is a
    :class:`~memrl.data.errors.UserError`: starting over would silently discard it."""
    skipped: list[tuple[str, str]] = []
    for path in reversed(candidates):
        problem = verify(path)
        if problem is None:
            for name, why in skipped:
                logger.warning("checkpoint %s skipped: %s; resuming from %s instead", name, why, path.name)
            return path
        skipped.append((path.name, problem))
    if saved_before(root):
        raise _lost(root, [f"{name}: {why}" for name, why in skipped])
    for name, why in skipped:
        logger.warning("checkpoint %s skipped: %s; starting over", name, why)
    return None


class CheckpointManager:
    """Saves and finds checkpoints under ``root`` (keeps the newest ``keep``)."""

    def __init__(self, root: str | Path, keep: int = 2) -> None:
        self.root = Path(root)
        self.keep = max(keep, 1)

    def latest(self) -> Path | None:
        """The newest checkpoint that verifies (:func:`verify_checkpoint`; see :func:`resume_point`)."""
        found = sorted(p for p in self.root.iterdir() if _NAME.match(p.name)) if self.root.is_dir() else []
        return resume_point(self.root, found, verify_checkpoint)  # ckpt-NNNNNN: the name order is the step order

    def save(
        self,
        iteration: int,
        accelerator: Any,
        model: Any,
        state: dict[str, Any],
        attach: dict[str, Path] | None = None,
    ) -> Path:
        """Checkpoint after ``iteration``: accelerator state (all processes), the loop's ``state`` (JSON) and a
        snapshot of every ``attach`` directory under its name."""
        final = self.root / f"ckpt-{iteration:06d}"
        tmp = self.root / f".tmp-ckpt-{iteration:06d}"
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        accelerator.wait_for_everyone()
        # A failed write (a full disk, the file-size limit) removes the temporary folder and is one clear error.
        with storage_guard(self.root, f"checkpoint {final.name}", cleanup=[tmp] if accelerator.is_main_process else []):
            hook = accelerator.register_save_state_pre_hook(_adapter_only_hook)
            try:
                accelerator.save_state(str(tmp), safe_serialization=True)
            finally:
                hook.remove()
            # Every rank writes its own files (RNG states, DeepSpeed optimizer shards): all must be done before the
            # main process renames the directory, or a slower rank writes into a path that no longer exists.
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                (tmp / "loop_state.json").write_text(json.dumps(state, indent=1, sort_keys=True))
                for name, source in (attach or {}).items():
                    _link_tree(Path(source), tmp / name)
                _write_manifest(tmp)
                (tmp / _MARKER).write_text("ok\n")
                if final.exists():
                    shutil.rmtree(final)
                os.replace(tmp, final)
        if accelerator.is_main_process:
            with storage_guard(self.root, f"checkpoint {final.name}"):
                atomic_write_text(self.root / "latest", final.name + "\n")
                record_saved(self.root, final.name)
            self._prune()
        accelerator.wait_for_everyone()
        return final

    def load(self, path: str | Path, accelerator: Any, attach: dict[str, Path] | None = None) -> dict[str, Any]:
        """Restore the accelerator state saved at ``path``, put the attached snapshots' missing entries back into the
        ``attach`` directories, and return the loop's state."""
        path = Path(path)
        if (problem := verify_checkpoint(path, checksums=False)) is not None:
            raise UserError(f"checkpoint {path} cannot be loaded: {problem}")
        accelerator.load_state(str(path), strict=False)
        if accelerator.is_main_process:
            for name, target in (attach or {}).items():
                _link_tree(path / name, Path(target))
        return json.loads((path / "loop_state.json").read_text())

    def _prune(self) -> None:
        complete = sorted(
            (int(m.group(1)), p) for p in self.root.iterdir() if (m := _NAME.match(p.name)) and (p / _MARKER).exists()
        )  # the just-written one is among the kept ones: a damaged older one never outlives every intact one
        for _, old in complete[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.root.glob(".tmp-ckpt-*"):
            shutil.rmtree(stale, ignore_errors=True)


def _link_tree(source: Path, target: Path) -> None:
    """Hard-link every file of ``source`` into ``target`` (copy when linking fails); existing files are kept."""
    if not source.is_dir():
        return
    for file in source.rglob("*"):
        if not file.is_file() or file.name.startswith("."):
            continue
        dest = target / file.relative_to(source)
        if dest.exists():
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(file, dest)
        except OSError:
            shutil.copy2(file, dest)


def _adapter_only_hook(models: list[Any], weights: list[Any], output_dir: str) -> None:
    """Save only the trainable parameters when some are frozen (LoRA): a 9B base would otherwise be copied into every
    checkpoint. Keys stay those of the model's own state dict, so loading with ``strict=False`` restores them."""
    for i, model in enumerate(models):
        if i >= len(weights):  # DeepSpeed writes its own checkpoint files
            continue
        params = dict(model.named_parameters())
        trainable = {name for name, p in params.items() if p.requires_grad}
        if trainable and len(trainable) < len(params):
            weights[i] = {k: v for k, v in weights[i].items() if k in trainable}
