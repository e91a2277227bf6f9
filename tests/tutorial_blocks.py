"""The code blocks of the tutorial pages (``docs/tutorials/*.md`` and ``docs/own_agent.md``), as
``tests/test_tutorials.py`` runs them.

Every fenced ``bash`` or ``python`` block of a tutorial runs, in page order, in one scratch folder per page that looks
like the repository root (its top-level folders linked in, ``runs/`` fresh). HTML comments just above a block, which
the rendered page does not show, adapt it to a test's scale:

    <!-- tutorial-test: skip REASON -->            not run (a reason is required)
    <!-- tutorial-test: append ARGS -->            ARGS appended to every ``memrl ...`` command of the block
    <!-- tutorial-test: replace OLD => NEW -->     text replaced in the block before it runs
    <!-- tutorial-test: before COMMAND -->         a shell command run first (e.g. a small stand-in data file)
    <!-- tutorial-test: write PATH -->             the block is a file the reader saves: written to PATH, not run
    <!-- tutorial-test: timeout SECONDS -->        the block's time limit (default 600 s)

Blocks in other languages (``text``, ``yaml`` without ``write``) are shown, not run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "docs" / "tutorials"
RUN_LANGUAGES = ("bash", "python")
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
_DIRECTIVE = re.compile(r"<!--\s*tutorial-test:\s*(\w+)\s*(.*?)\s*-->")
KEYS = ("skip", "append", "replace", "before", "write", "timeout")


@dataclass
class Block:
    """One fenced code block of a page and the directives above it."""

    page: str
    line: int
    language: str
    code: str
    directives: list[tuple[str, str]] = field(default_factory=list)

    def get(self, key: str) -> list[str]:
        """The values of every directive ``key`` of the block, in order."""
        return [value for k, value in self.directives if k == key]

    @property
    def where(self) -> str:
        """``page:line`` of the block's opening fence."""
        return f"{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        """Whether the test runs (or writes) this block."""
        return not self.get("skip") and (self.language in RUN_LANGUAGES or bool(self.get("write")))

    def script(self) -> str:
        """The block's code as the test runs it: replacements made, ``append`` arguments added."""
        code = self.code
        for rule in self.get("replace"):
            old, sep, new = rule.partition("=>")
            if not sep:
                raise ValueError(f"{self.where}: replace needs 'OLD => NEW', got {rule!r}")
            if old.strip() not in code:
                raise ValueError(f"{self.where}: replace: {old.strip()!r} is not in the block")
            code = code.replace(old.strip(), new.strip())
        extra = " ".join(self.get("append"))
        if extra:
            code = append_to_memrl_commands(code, extra, self.where)
        return code


def append_to_memrl_commands(code: str, extra: str, where: str) -> str:
    """``extra`` added at the end of every logical line (backslash continuations joined) that runs ``memrl``."""
    lines = code.replace("\\\n", " ").splitlines()
    hits = 0
    for i, line in enumerate(lines):
        if re.match(r"\s*memrl\s", line):
            lines[i] = f"{line.rstrip()} {extra}"
            hits += 1
    if not hits:
        raise ValueError(f"{where}: append: the block runs no memrl command")
    return "\n".join(lines) + "\n"


def parse_page(path: Path) -> list[Block]:
    """Every fenced block of a Markdown page with the directives in the comments right above it."""
    text = path.read_text(encoding="utf-8")
    blocks = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()]
        # the directives: consecutive comment lines immediately above the fence
        directives: list[tuple[str, str]] = []
        for line in reversed(before.rstrip("\n").splitlines()):
            found = _DIRECTIVE.fullmatch(line.strip())
            if not found:
                break
            key, value = found.group(1), found.group(2)
            if key not in KEYS:
                raise ValueError(f"{path.name}:{before.count(chr(10))}: unknown tutorial-test directive {key!r}")
            if key == "skip" and not value:
                raise ValueError(f"{path.name}:{before.count(chr(10))}: skip needs a reason")
            directives.insert(0, (key, value))
        blocks.append(
            Block(
                page=path.name,
                line=before.count("\n") + 1,
                language=match.group(1),
                code=match.group(2),
                directives=directives,
            )
        )
    return blocks


def tutorial_pages() -> list[Path]:
    """The tutorial pages (their index excluded), and the own-agent page, a tutorial that lives beside them."""
    pages = sorted(p for p in TUTORIALS.glob("*.md") if p.name != "index.md")
    own = TUTORIALS.parent / "own_agent.md"
    return [*pages, own] if own.exists() else pages
