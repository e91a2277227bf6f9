"""The duplicate-code check of the test command (tests/lint_duplicates.py): a block copied into a second library file
fails it, naming both places; a run one line shorter than the threshold does not; an accepted copy passes; a shared
block of imports is no copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lint_duplicates import MIN_LINES, check, main

BLOCK = [
    "def scaled_total(values, scale):",
    "    total = 0",
    "    for value in values:",
    "        if value is None:",
    "            continue",
    "        total += value * scale",
    "    return total",
]


def _tree(tmp_path: Path, shared: list[str]) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "rollout").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "data" / "one.py").write_text("\n".join(["import os", "", *shared, "", "HOME = os.sep"]) + "\n")
    (tmp_path / "rollout" / "two.py").write_text("\n".join(["X = 1", "", *shared, "", "Y = 2"]) + "\n")
    return tmp_path


def test_a_copied_block_fails_the_check_naming_both_places(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _tree(tmp_path, BLOCK[: MIN_LINES + 1])
    new, gone = check(root, root / "tests" / "baseline.txt")
    assert len(new) == 1 and not gone
    assert {path for path, _, _ in new[0].places} == {"data/one.py", "rollout/two.py"}
    assert main(["--root", str(root)]) == 1
    assert "new copy of 7 lines in data/one.py:3-9, rollout/two.py:3-9" in capsys.readouterr().out
    assert main(["--root", str(root), "--update"]) == 0  # accepted: now part of the baseline
    assert main(["--root", str(root)]) == 0


def test_a_run_shorter_than_the_threshold_is_no_copy(tmp_path: Path) -> None:
    root = _tree(tmp_path, BLOCK[: MIN_LINES - 1])
    assert check(root, root / "tests" / "baseline.txt") == ([], set())


def test_a_shared_import_block_is_no_copy(tmp_path: Path) -> None:
    imports = [f"from package.module_{i} import name_{i}" for i in range(MIN_LINES + 2)]
    root = _tree(tmp_path, imports)
    assert check(root, root / "tests" / "baseline.txt") == ([], set())
