"""The benchmarks as a whole: every benchmark module in benchmarks/ has a smoke test that runs it at its smallest
setting (``tests/test_bench_<name>.py`` calls :func:`tests.bench_run.run_benchmark` or ``bench_process`` on it), so a
benchmark that stops running fails the suite instead of rotting unseen; none edits ``sys.path`` (they run as
``python -m benchmarks.<name>`` and share :mod:`benchmarks.harness`); no two define a class of the same name."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = {"harness", "sam_start"}  # modules benchmarks import; not benchmarks themselves


def _benchmarks() -> list[str]:
    return sorted(
        p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_") and p.stem not in SHARED
    )


def _runs(test_file: Path, name: str) -> bool:
    """Whether the test file runs the benchmark: a call of run_benchmark("<name>", ...) or bench_process("<name>",
    ...), or the script's path or module named in a subprocess command."""
    tree = ast.parse(test_file.read_text())
    for node in ast.walk(tree):
        called = getattr(node.func, "id", getattr(node.func, "attr", "")) if isinstance(node, ast.Call) else ""
        if (
            called in ("run_benchmark", "bench_process")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == name
        ):
            return True
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and (node.value in (f"benchmarks/{name}.py", f"{name}.py", f"benchmarks.{name}"))
        ):
            return True
    return False


def test_every_benchmark_has_a_smoke_test() -> None:
    missing, idle = [], []
    for name in _benchmarks():
        test_file = ROOT / "tests" / f"test_bench_{name}.py"
        if not test_file.is_file():
            missing.append(f"tests/test_bench_{name}.py")
        elif not _runs(test_file, name):
            idle.append(f"{test_file.relative_to(ROOT)} never runs benchmarks/{name}.py")
    assert not missing and not idle, "benchmarks without a smoke test:\n" + "\n".join(missing + idle)


def test_the_meta_test_sees_what_it_checks(tmp_path: Path) -> None:
    """The check itself: a file that runs the benchmark passes, one that only mentions it in a comment does not."""
    good = tmp_path / "good.py"
    good.write_text(
        'from tests.bench_run import run_benchmark\n\n\ndef test_x():\n    run_benchmark("synth_speed", [])\n'
    )
    bad = tmp_path / "bad.py"
    bad.write_text("# synth_speed is slow\ndef test_x():\n    pass\n")
    assert _runs(good, "synth_speed") and not _runs(bad, "synth_speed")
    assert "rollout_scaling" in _benchmarks() and "ablations" in _benchmarks()


def _module(name: str) -> ast.Module:
    return ast.parse((ROOT / "benchmarks" / f"{name}.py").read_text())


def test_no_benchmark_edits_sys_path() -> None:
    edits = []
    for name in [*_benchmarks(), *SHARED]:
        for node in ast.walk(_module(name)):
            target = (
                node.func if isinstance(node, ast.Call) else node.targets[0] if isinstance(node, ast.Assign) else None
            )
            if isinstance(target, ast.Subscript):
                target = target.value
            text = ast.unparse(target) if target is not None else ""
            if text.startswith("sys.path"):
                edits.append(f"benchmarks/{name}.py:{node.lineno}: {ast.unparse(node)[:80]}")
    assert not edits, "run benchmarks as python -m benchmarks.<name> instead:\n" + "\n".join(edits)


def test_no_two_benchmarks_define_a_class_of_the_same_name() -> None:
    where: dict[str, list[str]] = {}
    for name in [*_benchmarks(), *SHARED]:
        for node in _module(name).body:
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(name)
    assert not {c: m for c, m in where.items() if len(m) > 1}
