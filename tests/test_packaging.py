"""memrl installs as one namespace (``memrl.data``, ``memrl.train``, ...), ships its recipes as package data, and keeps
its layering contract (data <- rollout <- rewards <- train <- launch) checked by import-linter."""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
import tomllib

from tests.commands import run_ok
from tests.lint_imports import lint
from tests.wheel_venv import build_wheel, wheel_venv

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("data", "rollout", "rewards", "train", "launch")


def _shipped_folders() -> tuple[set[str], set[str]]:
    """(packages of folders holding Python files, packages of folders holding only shipped data files)."""
    python, data = {"memrl", "memrl.configs"}, set()
    for part in ("configs", *LAYERS):
        for file in (ROOT / part).rglob("*"):
            if file.is_file() and "__pycache__" not in file.parts:
                package = "memrl." + ".".join(file.parent.relative_to(ROOT).parts)
                (python if file.suffix == ".py" else data).add(package)
    return python, data - python


def test_every_python_or_data_folder_is_a_listed_package():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    python, data = _shipped_folders()
    assert python | data == listed, (
        f"[tool.setuptools] packages: missing {(python | data) - listed}, extra {listed - (python | data)}"
    )
    for folder in python - {"memrl"}:
        assert (ROOT / folder.removeprefix("memrl.").replace(".", "/") / "__init__.py").is_file(), folder


def test_wheel_builds_without_warnings_and_ships_every_config_and_script(tmp_path):
    """A setuptools warning in the build (a data folder missing from ``packages``) fails; the wheel holds every data
    file of configs/ and launch/ (recipes, DeepSpeed and Accelerate configs, shell and Slurm scripts)."""
    src = tmp_path / "src"
    for part in ("memrl", "configs", *LAYERS):
        shutil.copytree(ROOT / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # its "byte-compiling" notes
    built = build_wheel(src, src / "dist", env)
    assert built.returncode == 0, built.stderr
    warnings = [line for line in (built.stdout + built.stderr).splitlines() if "warning" in line.lower()]
    assert not warnings, "\n".join(warnings)
    (wheel,) = (src / "dist").glob("memrl-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        f"memrl/{file.relative_to(ROOT).as_posix()}"
        for part in ("configs", "launch")
        for file in (ROOT / part).rglob("*")
        if file.is_file() and file.suffix != ".py" and "__pycache__" not in file.parts
    }
    assert expected - shipped == set(), expected - shipped
    assert "memrl/launch/slurm/memrl.sbatch" in shipped and "memrl/configs/deepspeed/zero2.json" in shipped


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


# protects: the built wheel installed in a fresh venv: one memrl namespace beside a user's data/ and train.py, the
# console script and the shipped configs work
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
    resolved = run_ok(
        [str(python), "-c", "from memrl.data.config import resolve_deepspeed_config as r; print(r('zero2'))"], cwd=user
    )
    assert "deepspeed" in resolved.stdout
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
