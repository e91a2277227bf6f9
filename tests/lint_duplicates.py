"""Fail on newly copied library code: pylint's similarity checker (``symilar``, the engine of pylint's
``duplicate-code``) over the library's Python files, against a committed baseline of the copies that exist today.

A copy is a run of at least ``MIN_LINES`` lines (comments, docstrings, imports and blank lines left out, as pylint's
``duplicate-code`` does by default) that stands in two or more library files. The baseline
(``tests/duplicate_code_baseline.txt``) records each place of each known copy as ``path  sha1-of-the-shared-lines
line-count``, without line numbers, so editing elsewhere in a file does not disturb it. A place not in the baseline
fails the check: move the shared lines to one home and call it from both places. A copy that is deliberate can be
accepted with ``--update`` (the baseline is rewritten; review its diff). Places in the baseline that are gone are
reported, and dropped by ``--update``.

    python tests/lint_duplicates.py [--root DIR] [--baseline FILE] [--update]

Exit 0 when no new copy is found; otherwise the new copies, with their places and lines, and exit 1.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("data", "rollout", "rewards", "train", "launch", "memrl")
BASELINE = ROOT / "tests" / "duplicate_code_baseline.txt"
MIN_LINES = 6
_HEADER = re.compile(r"^(\d+) similar lines in (\d+) files$")
_PLACE = re.compile(r"^==(.+):\[(\d+):(\d+)\]$")


@dataclass(frozen=True)
class Copy:
    """One run of shared lines and the places (path, first line, end line) it stands in."""

    lines: tuple[str, ...]
    places: tuple[tuple[str, int, int], ...]

    @property
    def digest(self) -> str:
        """sha1 of the shared lines (stripped), the copy's identity in the baseline."""
        return hashlib.sha1("\n".join(line.strip() for line in self.lines).encode()).hexdigest()

    def keys(self) -> set[str]:
        """The baseline lines of this copy's places."""
        return {f"{path}  {self.digest}  {len(self.lines)}" for path, _, _ in self.places}


def library_files(root: Path) -> list[str]:
    """The library's Python files under ``root``, as paths relative to it, sorted."""
    return sorted(
        str(path.relative_to(root))
        for folder in LIBRARY
        if (root / folder).is_dir()
        for path in (root / folder).rglob("*.py")
        if "__pycache__" not in path.parts
    )


def without_imports(text: str) -> str:
    """``text`` with the lines of its import statements blank, line numbers kept: what pylint's ``--ignore-imports``
    leaves out (its own implementation of that flag takes minutes over the library; this takes milliseconds)."""
    lines = text.splitlines()
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            lines[node.lineno - 1 : node.end_lineno] = [""] * (node.end_lineno - node.lineno + 1)
    return "\n".join(lines) + "\n"


def find_copies(root: Path, min_lines: int = MIN_LINES) -> list[Copy]:
    """Run ``symilar`` over the library files of ``root``, their import statements left out; the copies it reports."""
    files = library_files(root)
    if len(files) < 2:
        return []
    command = [sys.executable, "-m", "pylint.checkers.symilar", "-d", str(min_lines), "-i", "--ignore-docstrings"]
    with tempfile.TemporaryDirectory() as tmp:
        for name in files:
            (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / name).write_text(without_imports((root / name).read_text(encoding="utf-8")), encoding="utf-8")
        out = subprocess.run([*command, *files], cwd=tmp, capture_output=True, text=True, check=False)
        if out.returncode != 0 or "TOTAL lines=" not in out.stdout:
            raise RuntimeError(f"symilar failed (exit {out.returncode}): {out.stderr.strip() or out.stdout[-2000:]}")
        return parse_report(out.stdout, Path(tmp))


def parse_report(text: str, root: Path) -> list[Copy]:
    """The copies of a ``symilar`` report (a header line, then one ``==path:[start:end]`` line per place); a copy's
    lines are read from its first place, without blank and comment lines."""
    copies: list[Copy] = []
    rows = [row.strip() for row in text.splitlines()]
    for i, row in enumerate(rows):
        header = _HEADER.match(row)
        if header is None:
            continue
        places = []
        for line in rows[i + 1 : i + 1 + int(header.group(2))]:
            place = _PLACE.match(line)
            if place is None:
                raise RuntimeError(f"unexpected symilar output line after {row!r}: {line!r}")
            path, start, end = place.group(1), int(place.group(2)), int(place.group(3))
            source = (root / path).read_text(encoding="utf-8").splitlines()
            while end > start and not source[end - 1].strip():  # symilar's range takes in the blank lines after it
                end -= 1
            places.append((path, start, end))
        path, start, end = places[0]
        source = (root / path).read_text(encoding="utf-8").splitlines()[start:end]
        shared = tuple(line for line in source if line.strip() and not line.lstrip().startswith("#"))
        copies.append(Copy(shared, tuple(places)))
    return copies


def read_baseline(path: Path) -> set[str]:
    """The accepted places (one ``path  digest  count`` a line; ``#`` comments and blank lines skipped)."""
    if not path.exists():
        return set()
    rows = path.read_text(encoding="utf-8").splitlines()
    return {"  ".join(row.split()) for row in rows if row.strip() and not row.lstrip().startswith("#")}


def write_baseline(path: Path, keys: set[str]) -> None:
    """Write the accepted places, sorted, under a header that says how to regenerate them."""
    header = (
        "# Copies of library code accepted by tests/lint_duplicates.py (pylint's symilar, runs of "
        f"{MIN_LINES}+ lines).\n# One place a line: path, sha1 of the shared lines, their count. Regenerate with "
        "`python tests/lint_duplicates.py --update`\n# after removing a copy; a new entry is a new copy: give it one "
        "home instead where you can.\n"
    )
    path.write_text(header + "".join(f"{key}\n" for key in sorted(keys)), encoding="utf-8")


def check(root: Path = ROOT, baseline: Path = BASELINE) -> tuple[list[Copy], set[str]]:
    """(the copies with a place not in the baseline, the baseline places no longer found)."""
    accepted = read_baseline(baseline)
    copies = find_copies(root)
    found = set().union(*(c.keys() for c in copies)) if copies else set()
    return [c for c in copies if not c.keys() <= accepted], accepted - found


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to scan")
    parser.add_argument("--baseline", type=Path, default=None, help="the accepted copies (default: the root's)")
    parser.add_argument("--update", action="store_true", help="accept today's copies: rewrite the baseline")
    args = parser.parse_args(argv)
    baseline = args.baseline or args.root / "tests" / BASELINE.name
    if args.update:
        copies = find_copies(args.root)
        keys = set().union(*(c.keys() for c in copies)) if copies else set()
        write_baseline(baseline, keys)
        print(f"wrote {baseline}: {len(keys)} places of {len(copies)} copies")
        return 0
    new, gone = check(args.root, baseline)
    for copy in new:
        places = ", ".join(f"{path}:{start + 1}-{end}" for path, start, end in copy.places)
        print(f"new copy of {len(copy.lines)} lines in {places}:")
        print("\n".join(f"    {line}" for line in copy.lines))
    if gone:
        print(f"{len(gone)} place(s) in {baseline.name} no longer copied; `--update` drops them")
    if new:
        print(
            f"{len(new)} new copied block(s) of library code: give the shared lines one home and call it from each "
            f"place (or, for a deliberate copy, accept it with `python tests/lint_duplicates.py --update`)"
        )
        return 1
    print(f"duplicate code: no new copies ({len(read_baseline(baseline))} known places)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
