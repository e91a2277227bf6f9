"""The slow tier stays small: every test marked ``slow`` says, in a ``# protects:`` comment above it (or in its
docstring, or above a module's ``pytestmark``), what it protects that no fast test does. A slow test without one is
either moved to the fast tier or removed."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _says_what_it_protects(lines: list[str], first_line: int, docstring: str | None) -> bool:
    """A ``# protects:`` comment in the comment block right above line ``first_line`` (1-based), or the docstring."""
    if docstring and "protects:" in docstring:
        return True
    i = first_line - 2
    while i >= 0 and lines[i].lstrip().startswith("#"):
        if lines[i].lstrip().startswith("# protects:"):
            return True
        i -= 1
    return False


def unexplained_slow_tests(path: Path) -> list[str]:
    """The slow marks of ``path`` without a ``# protects:`` line: 'file:line name' for each."""
    source = path.read_text()
    if "pytest.mark.slow" not in source:
        return []
    lines = source.splitlines()
    tree = ast.parse(source)
    missing = []
    for node in tree.body:
        text = "\n".join(lines[node.lineno - 1 : node.end_lineno])  # (ast.get_source_segment re-reads the source)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            marks = [d for d in node.decorator_list if "pytest.mark.slow" in ast.unparse(d)]
            if marks and not _says_what_it_protects(
                lines, node.decorator_list[0].lineno, ast.get_docstring(node, clean=False)
            ):
                missing.append(f"{path.name}:{node.lineno} {node.name}")
        elif "pytest.mark.slow" in text:  # pytestmark, or slow marks in parameters built at module level
            docstring = ast.get_docstring(tree) if "pytestmark" in text else None
            if not _says_what_it_protects(lines, node.lineno, docstring):
                missing.append(f"{path.name}:{node.lineno} {text.splitlines()[0][:60]}")
    return missing


def test_every_slow_test_says_what_it_protects() -> None:
    missing = [entry for path in sorted(TESTS.rglob("test_*.py")) for entry in unexplained_slow_tests(path)]
    assert not missing, "slow tests without a '# protects:' line:\n" + "\n".join(missing)


def test_a_slow_test_without_a_protects_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "test_x.py"
    path.write_text(
        "import pytest\n\n\n# protects: a\n@pytest.mark.slow\ndef test_a():\n    pass\n\n\n"
        "# what it does\n@pytest.mark.slow\n@pytest.mark.vllm\ndef test_b():\n    pass\n\n\n"
        "@pytest.mark.slow\ndef test_c():\n    '''protects: c'''\n\n\n"
        "def test_fast():\n    pass\n\n\n"
        "CASES = [pytest.param(1, marks=pytest.mark.slow)]\n"
    )
    assert unexplained_slow_tests(path) == [
        "test_x.py:13 test_b",
        "test_x.py:26 CASES = [pytest.param(1, marks=pytest.mark.slow)]",
    ]
    path.write_text("'''protects: every test here'''\nimport pytest\n\npytestmark = pytest.mark.slow\n")
    assert unexplained_slow_tests(path) == []
    path.write_text("import pytest\n\npytestmark = [pytest.mark.slow]\n")
    assert unexplained_slow_tests(path) == ["test_x.py:3 pytestmark = [pytest.mark.slow]"]
