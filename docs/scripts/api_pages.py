"""Write the API reference pages (``docs/api/<layer>.md``): one mkdocstrings block per public module of each layer.

A module is public when no part of its path starts with ``_`` (``__init__`` stands for its package). The pages are
generated so a new module cannot be forgotten: ``tests/test_docs.py`` fails when a committed page is stale.

    python docs/scripts/api_pages.py [--check]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from generated import write_or_check

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "docs" / "api"
LAYERS = {
    "data": "Schemas, typed configs, record IO, synthetic environments, task families, benchmark loaders, experts and "
    "distillation.",
    "rollout": "Engines, memory systems, the agent loop, memory-call trees, the rollout fleet, pivots and the "
    "evaluation harness.",
    "rewards": "Outcome scorers, the committee and judge, OAT credit, group advantages, pivot rewards, trainer groups.",
    "train": "SFT, the group trainer and its surrogate loss, the online loop, OAT-GRPO, pivot-turn GRPO, checkpoints, "
    "export.",
    "launch": "The `memrl` command line, the quickstart, launch layouts, `memrl plan`, the evaluation command.",
}


def modules(layer: str) -> list[str]:
    """Dotted names of the public modules of ``memrl.<layer>``, packages first, in path order."""
    base = ROOT / layer
    names = []
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and parts[-1] == "__main__":
            continue
        if any(p.startswith("_") for p in parts):
            continue
        names.append(".".join(["memrl", layer, *parts]))
    return sorted(names, key=lambda n: n.split("."))


def first_line(name: str) -> str:
    """The first line of a module's docstring."""
    parts = name.split(".")[1:]
    path = ROOT.joinpath(*parts)
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return doc.split("\n\n")[0].replace("\n", " ").strip()


def page(layer: str) -> str:
    """The Markdown of ``docs/api/<layer>.md``."""
    lines = [
        f"# `memrl.{layer}`",
        "",
        f"{LAYERS[layer]} Generated from the docstrings by mkdocstrings; the page itself is written by "
        "`python docs/scripts/api_pages.py` (do not edit by hand).",
        "",
    ]
    for name in modules(layer):
        lines += [f"::: {name}", "    options:", "      show_submodules: false", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check``, compare) every API page."""
    return write_or_check({API / f"{layer}.md": page(layer) for layer in LAYERS}, __file__, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
