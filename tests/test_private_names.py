"""No memrl module imports another module's private (``_name``) helper: a helper two modules share is a public name of
the module that owns its concept. Tests may reach into privates; the package may not."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = ("memrl", "data", "rollout", "rewards", "train", "launch")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(root: Path) -> list[str]:
    """``file:line: module name`` for every import of a private name (or module) of memrl in the package folders
    under ``root``."""
    found = []
    for folder in PACKAGE_FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            hits: list[tuple[int, str]] = []
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("memrl")):
                    module = "." * node.level + (node.module or "")
                    hits += [
                        (node.lineno, f"{module} {a.name}")
                        for a in node.names
                        if _private(a.name) or any(_private(p) for p in module.lstrip(".").split(".") if p)
                    ]
                elif isinstance(node, ast.Import):
                    hits += [
                        (node.lineno, a.name)
                        for a in node.names
                        if a.name.startswith("memrl.") and any(_private(p) for p in a.name.split("."))
                    ]
            found += [f"{path.relative_to(root)}:{line}: {what}" for line, what in sorted(hits)]
    return found


def test_no_module_imports_another_modules_private_name() -> None:
    assert private_imports(ROOT) == []


def test_a_planted_private_import_is_found(tmp_path: Path) -> None:
    for folder in PACKAGE_FOLDERS:
        (tmp_path / folder).mkdir()
    (tmp_path / "rollout" / "ok.py").write_text("from memrl.data.io import read_jsonl\nfrom .x import __version__\n")
    (tmp_path / "train" / "bad.py").write_text(
        "from memrl.rollout.pivots.detect import detect_pivots, _helper\n"
        "def f():\n    from .sibling import _hidden\n"
        "import memrl.data._internal\n"
    )
    assert private_imports(tmp_path) == [
        "train/bad.py:1: memrl.rollout.pivots.detect _helper",
        "train/bad.py:3: .sibling _hidden",
        "train/bad.py:4: memrl.data._internal",
    ]
