"""A fresh venv with memrl installed from its built wheel (no dependencies), borrowing this venv's third-party
packages by path only: its .pth files (the editable memrl among them) are not run. Shared by the wheel tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_wheel(source: Path, outdir: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m build --wheel`` of ``source`` into ``outdir`` with this venv's setuptools (no isolation); its
    output is captured, the exit status left to the caller."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--skip-dependency-check",
            "--outdir",
            str(outdir),
            str(source),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def wheel_venv(tmp_path: Path) -> tuple[Path, Path]:
    """Build the wheel, install it into ``tmp_path/venv``; (its python, its site-packages)."""
    dist = tmp_path / "dist"
    built = build_wheel(ROOT, dist)
    if built.returncode != 0:
        raise subprocess.CalledProcessError(built.returncode, built.args, built.stdout, built.stderr)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    ours = Path(
        subprocess.run(
            [sys.executable, "-c", "import torch, pathlib; print(pathlib.Path(torch.__file__).parents[1])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (site / "borrowed.pth").write_text(f"{ours}\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--quiet",
            str(next(dist.glob("memrl-*.whl"))),
        ],
        check=True,
    )
    return python, site
