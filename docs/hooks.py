"""MkDocs hooks of the documentation site (mkdocs.yml ``hooks:``).

1. ``on_startup``: stage the package as it installs (``memrl.data`` lives in ``data/``, ``memrl.train`` in ``train/``,
   ...) under ``build/docs-api/memrl`` as symbolic links, so mkdocstrings' static analysis (griffe) finds every
   module without importing anything: setuptools' ``package-dir`` mapping is invisible to a file-system walk.
2. ``on_page_content``: the code's docstrings use reStructuredText roles (``:func:`x```, ``:class:`~a.b.C```); rendered
   as Markdown they would show the role's name. The role is dropped and ``~a.b.C`` is shortened to ``C``, as Sphinx
   shows it.
3. ``on_files``: the results pages' plots, drawn by ``docs/scripts/plots.py`` from the JSON in ``docs/figures`` at
   every build and served as ``figures/plots/<name>.svg`` (never written into the source tree).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
STAGE = ROOT / "build" / "docs-api"
# memrl sub-package -> its folder in the repository (pyproject.toml [tool.setuptools.package-dir])
LAYOUT = {
    "data": "data",
    "rollout": "rollout",
    "rewards": "rewards",
    "train": "train",
    "launch": "launch",
    "configs": "configs",
}

_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|data|attr|obj|exc|const|ref|doc):(<code>)(~?)([^<]*)(</code>)")


def stage_package(root: Path = ROOT, into: Path = STAGE) -> Path:
    """Lay out ``memrl`` under ``into`` as the wheel installs it (links into ``root``); returns ``into``."""
    package = into / "memrl"
    if package.exists() or package.is_symlink():
        shutil.rmtree(package)
    package.mkdir(parents=True)
    os.symlink(root / "memrl" / "__init__.py", package / "__init__.py")
    for name, folder in LAYOUT.items():
        os.symlink(root / folder, package / name, target_is_directory=True)
    return into


def strip_roles(html: str) -> str:
    """``:func:<code>~a.b.c</code>`` -> ``<code>c</code>``; ``:class:<code>a.B</code>`` -> ``<code>a.B</code>``."""

    def replace(match: re.Match[str]) -> str:
        opening, tilde, target, closing = match.groups()
        if tilde:
            target = target.rsplit(".", 1)[-1]
        # ``name <target>`` (an explicit title) shows the title only
        target = re.sub(r"\s*&lt;[^&]*&gt;$", "", target)
        return f"{opening}{target}{closing}"

    return _ROLE.sub(replace, html)


def on_startup(command: str, dirty: bool) -> None:
    """Stage the package before mkdocstrings' handler looks for it."""
    stage_package()


def load_plots_module() -> Any:
    """``docs/scripts/plots.py`` as a module (the scripts folder is not a package)."""
    spec = importlib.util.spec_from_file_location("memrl_docs_plots", ROOT / "docs" / "scripts" / "plots.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_files(files: Files, config: Any) -> Files:
    """Add the plots, drawn now from the committed JSON, as generated files of the site."""
    for name, content in load_plots_module().render_all().items():
        files.append(File.generated(config, f"figures/plots/{name}", content=content))
    return files


def on_page_content(html: str, page: object, config: object, files: object) -> str:
    """Drop reStructuredText roles from the rendered page (docstrings)."""
    return strip_roles(html)
