"""memrl installs as one namespace (``memrl.data``, ``memrl.train``, ...), ships its recipes as package data, and keeps
its layering contract (data <- rollout <- rewards <- train <- launch) checked by import-linter."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import tomllib

from tests.lint_imports import lint
from tests.wheel_venv import wheel_venv

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("data", "rollout", "rewards", "train", "launch")


def test_every_python_folder_is_a_listed_package():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = {"memrl", "memrl.configs"}
    for layer in LAYERS:
        for init in (ROOT / layer).rglob("*.py"):
            found.add("memrl." + ".".join(init.parent.relative_to(ROOT).parts))
    assert found == listed, f"[tool.setuptools] packages: missing {found - listed}, extra {listed - found}"
    for folder in found - {"memrl"}:
        assert (ROOT / folder.removeprefix("memrl.").replace(".", "/") / "__init__.py").is_file(), folder


def test_layers_contract_holds_and_catches_an_upward_import(tmp_path):
    kept, report = lint(ROOT)
    assert kept, report
    # the same check on a copy with one upward import planted (data importing train) must fail, naming it
    for part in ("memrl", *LAYERS):
        subprocess.run(["cp", "-r", str(ROOT / part), str(tmp_path / part)], check=True)
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    with (tmp_path / "data" / "io.py").open("a") as f:
        f.write("\nfrom memrl.train import surrogate  # noqa: E402,F401\n")
    kept, report = lint(tmp_path)
    assert not kept
    assert "memrl.data.io -> memrl.train.surrogate" in report


@pytest.mark.slow
def test_built_wheel_installs_one_namespace(tmp_path):
    """Build the wheel, install it (no dependencies) into a fresh venv that borrows this venv's third-party packages,
    and run it from a folder holding a user's own ``data/`` package and ``train.py``."""
    python, site = wheel_venv(tmp_path)
    venv = python.parent.parent
    installed = sorted(p.name for p in site.iterdir())
    assert not set(LAYERS) & set(installed), installed
    assert "memrl" in installed

    user = tmp_path / "user_project"
    (user / "data").mkdir(parents=True)
    (user / "data" / "__init__.py").write_text("WHOSE = 'user'\n")
    (user / "train.py").write_text("WHOSE = 'user'\n")
    probe = (
        "import memrl, memrl.train.oat_grpo, memrl.data.config as c, data, train, importlib.util as u;"
        "assert data.WHOSE == train.WHOSE == 'user';"
        "assert all(u.find_spec(n) is None for n in ('rollout', 'rewards', 'launch'));"
        "print(memrl.__file__); print(c.shipped_configs())"
    )
    res = subprocess.run([str(python), "-c", probe], cwd=user, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert all(str(site) in line for line in res.stdout.splitlines()), res.stdout

    memrl = venv / "bin" / "memrl"
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "WANDB_MODE": "offline"}
    shown = subprocess.run(
        [str(memrl), "config", "show", "--config", "oat_grpo_tiny"],
        cwd=user,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert "command: train oat-grpo" in shown.stdout
    assert (
        "deepspeed"
        in subprocess.run(
            [str(python), "-c", "from memrl.data.config import resolve_deepspeed_config as r; print(r('zero2'))"],
            cwd=user,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    tiny = subprocess.run(
        [str(memrl), "model", "tiny", "--out", str(tmp_path / "tiny")],
        cwd=user,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert tiny.returncode == 0, tiny.stderr + tiny.stdout
    assert (tmp_path / "tiny" / "config.json").is_file()
