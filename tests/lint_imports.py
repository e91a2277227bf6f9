"""Check the import-linter contracts of pyproject.toml (layers data <- rollout <- rewards <- train <- launch, no cycles
inside a layer) on the package as it installs.

import-linter reads a package from the file system under its ``__init__.py``, so it cannot follow setuptools'
``package-dir`` mapping (``memrl.data`` lives in ``data/``). This script copies the Python files into a temporary
``memrl/`` laid out as the wheel installs them and runs ``lint-imports`` there.

    python tests/lint_imports.py [--root DIR]

Exit 0 when every contract is kept; otherwise import-linter's report and exit 1.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("data", "rollout", "rewards", "train", "launch")


def stage(root: Path, into: Path) -> Path:
    """Copy ``root``'s memrl package files into ``into/memrl`` (the installed layout) and return ``into``."""
    package = into / "memrl"
    shutil.copytree(root / "memrl", package, ignore=shutil.ignore_patterns("__pycache__"))
    for layer in LAYERS:
        shutil.copytree(root / layer, package / layer, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(root / "pyproject.toml", into / "pyproject.toml")
    return into


def lint(root: Path = ROOT) -> tuple[bool, str]:
    """Run import-linter on a staged copy of ``root``; (every contract kept, its report)."""
    with tempfile.TemporaryDirectory(prefix="memrl-lint-") as tmp:
        staged = stage(root, Path(tmp))
        env = {**os.environ, "PYTHONPATH": str(staged), "NO_COLOR": "1"}
        lint_imports = Path(sys.executable).with_name("lint-imports")
        res = subprocess.run(
            [str(lint_imports), "--no-cache"], cwd=staged, env=env, capture_output=True, text=True, check=False
        )
    report = res.stdout + res.stderr
    # lint-imports has exited 0 after a crash while building its graph: trust the summary line, not the exit code
    summary = re.search(r"Contracts: (\d+) kept, (\d+) broken", report)
    kept = res.returncode == 0 and summary is not None and int(summary.group(2)) == 0 and int(summary.group(1)) > 0
    return kept, report


def main() -> int:
    """Command line: lint the checkout (or ``--root``) and print the report when a contract is broken."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout to lint (default: this one)")
    args = parser.parse_args()
    kept, report = lint(args.root)
    if not kept:
        sys.stderr.write(report)
        return 1
    sys.stdout.write(report.strip().splitlines()[-1] + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
