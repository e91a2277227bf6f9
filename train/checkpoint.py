"""Atomic checkpoints for the online loops: policy (adapter only for LoRA), optimizer, scheduler, RNG states of every
process (accelerate's ``save_state``), plus the loop's own state (iteration, data position, policy version) and
attached directories such as the reward cache. The cache is content-addressed and append-only, so a checkpoint holds a
hard-linked snapshot of it (a copy across filesystems), and loading puts back the entries the live cache lacks: a
checkpoint copied elsewhere resumes without paying for committee calls again.

A checkpoint is written into a temporary directory and renamed into place once every file is there, so a kill at
any moment leaves either the previous checkpoints or a complete new one; :meth:`CheckpointManager.latest` only sees
complete ones. Loading uses accelerate's safe loader (``weights_only``) and safetensors: nothing is unpickled.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from memrl.data.io import atomic_write_text

__all__ = ["CheckpointManager"]

_NAME = re.compile(r"^ckpt-(\d{6})$")
_MARKER = "COMPLETE"


class CheckpointManager:
    """Saves and finds checkpoints under ``root`` (keeps the newest ``keep``)."""

    def __init__(self, root: str | Path, keep: int = 2) -> None:
        self.root = Path(root)
        self.keep = max(keep, 1)

    def latest(self) -> Path | None:
        """The newest complete checkpoint directory, or None."""
        if not self.root.is_dir():
            return None
        found = sorted(
            (int(m.group(1)), p) for p in self.root.iterdir() if (m := _NAME.match(p.name)) and (p / _MARKER).exists()
        )
        return found[-1][1] if found else None

    def save(
        self, iteration: int, accelerator: Any, model: Any, state: dict[str, Any],
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
        hook = accelerator.register_save_state_pre_hook(_adapter_only_hook)
        try:
            accelerator.save_state(str(tmp), safe_serialization=True)
        finally:
            hook.remove()
        # Every rank writes its own files (RNG states, DeepSpeed optimizer shards): all must be done before the main
        # process renames the directory, or a slower rank writes into a path that no longer exists.
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            (tmp / "loop_state.json").write_text(json.dumps(state, indent=1, sort_keys=True))
            for name, source in (attach or {}).items():
                _link_tree(Path(source), tmp / name)
            (tmp / _MARKER).write_text("ok\n")
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            atomic_write_text(self.root / "latest", final.name + "\n")
            self._prune()
        accelerator.wait_for_everyone()
        return final

    def load(self, path: str | Path, accelerator: Any, attach: dict[str, Path] | None = None) -> dict[str, Any]:
        """Restore the accelerator state saved at ``path``, put the attached snapshots' missing entries back into the
        ``attach`` directories, and return the loop's state."""
        path = Path(path)
        if not (path / _MARKER).exists():
            raise FileNotFoundError(f"{path} is not a complete checkpoint")
        accelerator.load_state(str(path), strict=False)
        if accelerator.is_main_process:
            for name, target in (attach or {}).items():
                _link_tree(path / name, Path(target))
        return json.loads((path / "loop_state.json").read_text())

    def _prune(self) -> None:
        complete = sorted(
            (int(m.group(1)), p) for p in self.root.iterdir() if (m := _NAME.match(p.name)) and (p / _MARKER).exists()
        )
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
