"""What the docs scripts that write committed files share: write every file, or with ``--check`` name the stale ones
(``tests/test_docs.py`` runs the check, so a committed file cannot drift from its script)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def write_or_check(files: dict[Path, str], script: str, doc: str, argv: list[str] | None = None) -> int:
    """Write ``files`` (path -> text), or with ``--check`` exit 1 naming each one whose committed text differs (the
    command line of ``script``, whose docstring is ``doc``)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a committed file differs")
    args = parser.parse_args(argv)
    stale = []
    for path, text in files.items():
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if stale:
        print(f"stale: {', '.join(stale)}: run python {Path(script).resolve().relative_to(ROOT)}", file=sys.stderr)
        return 1
    return 0
