"""The documentation: generated pages are current, citations resolve, nothing cites a file outside the
repository, the README links to every page of the site, and the results pages open
with their claim and a plot drawn from the committed JSON.

The site's strict build itself (every internal link and anchor) is a step of the test command (launch/docs.sh, run
by launch/test.sh); the tutorials' code runs in tests/test_tutorials.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
ARCH_CITATION = re.compile(r"docs/architecture\.md#([a-z0-9-]+)")
# A repository path in backticks: a top-level folder of ours, then a path (placeholders and globs are not checked).
REPO_PATH = re.compile(r"`((?:data|rollout|rewards|train|launch|configs|benchmarks|tests|docs|memrl)/[\w./-]+)`")
# the design notes and papers beside the repository, or this machine's folders
OUTSIDE = re.compile(
    r"(ARCHITECTURE(?:\.md| section)|/work/(?:main|wt|coord|shared)\b|\bshared/(?:seeds|ARCHITECTURE)|"
    r"\bseeds/\d{3}_)"
)


def tracked(*patterns: str) -> list[Path]:
    """The repository's tracked (and new, not ignored) files matching the git pathspecs."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *patterns],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [ROOT / line for line in out.splitlines() if line and (ROOT / line).is_file()]


def slugs(markdown: str) -> set[str]:
    """The anchors MkDocs gives a page's headings (its toc slugify), plus explicit ``<a id>`` anchors."""
    from markdown.extensions.toc import slugify

    found = set()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (m := re.match(r"#{1,6}\s+(.*?)\s*$", line)):
            text = re.sub(r"<[^>]+>", "", m.group(1)).replace("`", "")
            found.add(slugify(text, "-"))
    found.update(re.findall(r'<a id="([^"]+)">', markdown))
    return found


def nav_pages(nav: list) -> list[str]:
    """Every page of mkdocs.yml's nav, in order."""
    pages = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages.extend(nav_pages(value) if isinstance(value, list) else [value])
    return pages


def load_mkdocs() -> dict:
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *a: None)
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)  # a SafeLoader subclass


@pytest.mark.parametrize("script", ["docs/scripts/api_pages.py", "docs/scripts/diagrams.py"])
def test_generated_pages_are_current(script: str) -> None:
    res = subprocess.run([sys.executable, script, "--check"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_every_architecture_citation_resolves() -> None:
    anchors = slugs((DOCS / "architecture.md").read_text())
    cited = 0
    for path in tracked("*.py", "*.md", "*.yaml", "*.sh", "*.sbatch", "*.toml"):
        for anchor in ARCH_CITATION.findall(path.read_text(encoding="utf-8", errors="replace")):
            cited += 1
            assert anchor in anchors, f"{path.relative_to(ROOT)} cites docs/architecture.md#{anchor}: no such section"
    assert cited >= 3  # the code's citations of the design (data/schemas.py, rewards/scorers.py, ...)


def test_nothing_cites_a_file_outside_the_repository() -> None:
    offenders = []
    for path in tracked("*.py", "*.md", "*.yaml", "*.sh", "*.sbatch", "*.toml"):
        if path == Path(__file__):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not offenders, "citations of files outside the repository:\n" + "\n".join(offenders)


def test_repository_paths_named_in_the_docs_exist() -> None:
    missing = []
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for cited in REPO_PATH.findall(page.read_text(encoding="utf-8")):
            if any(c in cited for c in "<*{"):
                continue
            if not (ROOT / cited.rstrip(".")).exists():
                missing.append(f"{page.relative_to(ROOT)}: {cited}")
    assert not missing, "pages name files that do not exist:\n" + "\n".join(missing)


def test_readme_is_short_starts_with_its_two_commands_and_links_every_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 260
    first_block = readme.split("```", 2)[1]
    assert readme.index("```") < readme.index("\n## ")  # the commands come before any section
    assert "bash launch/quickstart.sh" in first_block and "bash launch/test.sh" in first_block
    links = set(re.findall(r"\]\((docs/[^)#\s]+)", readme))
    for link in links:
        assert (ROOT / link).exists(), f"README links to {link}, which does not exist"
    pages = nav_pages(load_mkdocs()["nav"])
    assert pages, "mkdocs.yml has no nav"
    unlinked = [p for p in pages if f"docs/{p}" not in links]
    assert not unlinked, f"README does not link to: {unlinked}"


def test_the_nav_lists_every_page_and_no_missing_one() -> None:
    pages = set(nav_pages(load_mkdocs()["nav"]))
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages <= on_disk, f"nav pages missing on disk: {sorted(pages - on_disk)}"
    assert on_disk <= pages, f"pages not in the nav: {sorted(on_disk - pages)}"


def test_the_advantage_preset_marked_default_is_the_default() -> None:
    from memrl.rewards.advantage import ADVANTAGE_PRESETS
    from memrl.rewards.credit import CreditConfig

    page = (DOCS / "concepts" / "oat_grpo.md").read_text()
    marked = re.findall(r"^\| `(\w+)` \(default\) \|", page, flags=re.M)
    actual = [name for name, cfg in ADVANTAGE_PRESETS.items() if cfg == CreditConfig().advantage]
    assert len(marked) == 1 and marked == actual[:1], (
        f"docs/concepts/oat_grpo.md marks {marked} as the default advantage preset; credit.advantage's default is "
        f"{actual}"
    )
    rows = set(re.findall(r"^\| `(\w+)`(?: \(default\))? \|", page, flags=re.M))
    assert set(ADVANTAGE_PRESETS) <= rows, f"presets missing from the page's table: {set(ADVANTAGE_PRESETS) - rows}"


def plots_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("memrl_docs_plots", DOCS / "scripts" / "plots.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RESULTS_PAGES = sorted((DOCS / "results").glob("*.md"))
PLOT_LINK = re.compile(r"!\[[^\]]+\]\(\.\./figures/plots/([\w-]+)\.svg\)")


@pytest.mark.parametrize("page", RESULTS_PAGES, ids=lambda p: p.name)
def test_each_results_page_opens_with_its_claim_then_a_drawn_plot(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    blocks = [b.strip() for b in text.split("\n\n") if b.strip()]
    assert blocks[0].startswith("# "), f"{page.name} does not start with its title"
    claim = blocks[1]
    assert not claim.startswith(("|", "!", "#", "??", "```")), f"{page.name}: the first paragraph is not a claim"
    sentences = re.split(r"(?<=[.!?])\*{0,2}\s+(?=[A-Z*(])", re.sub(r"\s+", " ", claim))
    assert len(sentences) <= 2, f"{page.name}: the opening claim is {len(sentences)} sentences, not one or two"
    plots = PLOT_LINK.findall(text)
    assert plots, f"{page.name} shows no plot drawn from the committed JSON (../figures/plots/<name>.svg)"
    assert text.index("](../figures/plots/") < text.index("\n## ") if "\n## " in text else True
    unknown = set(plots) - set(plots_module().PLOTS)
    assert not unknown, f"{page.name} shows plots docs/scripts/plots.py does not draw: {unknown}"


def test_plots_are_drawn_only_from_committed_json_and_the_same_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    plots = plots_module()
    read: set[str] = set()
    load = plots.load

    def recording_load(name: str) -> dict:
        read.add(name)
        return load(name)

    monkeypatch.setattr(plots, "load", recording_load)
    first = plots.render_all()
    assert first == plots.render_all(), "the same JSON drew different SVG bytes"
    assert all(content.startswith(b"<?xml") and b"<svg" in content for content in first.values())
    committed = {p.name for p in tracked("docs/figures/*.json")}
    assert read and read <= committed, f"plots read files that are not committed: {sorted(read - committed)}"


# Words about how the project was made, which no user-facing text carries (the changelog is the history).
PROCESS_WORDS = re.compile(r"issue [0-9]|this wave|lease|acceptance [0-9]", re.IGNORECASE)


def test_no_page_speaks_of_how_the_project_was_made() -> None:
    pages = [ROOT / "README.md", *[p for p in tracked("docs/*") if p.name != "changelog.md"]]
    offenders = [
        f"{page.relative_to(ROOT)}:{n}: {line.strip()[:100]}"
        for page in pages
        if page.suffix in {".md", ".json", ".sh", ".py", ".yml"}
        for n, line in enumerate(page.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if PROCESS_WORDS.search(line)
    ]
    assert not offenders, "\n".join(offenders)


def test_no_library_docstring_speaks_of_how_the_project_was_made() -> None:
    import ast

    offenders = []
    for path in tracked("data/*.py", "rollout/*.py", "rewards/*.py", "train/*.py", "launch/*.py", "memrl/*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node, clean=False) or ""
                offenders += [f"{path.relative_to(ROOT)}: {line.strip()[:100]}" for line in doc.splitlines()
                              if PROCESS_WORDS.search(line)]  # fmt: skip
    assert not offenders, "\n".join(offenders)
