"""Every script in benchmarks/ has a smoke test that runs it at its smallest setting (issue 41, acceptance 5;
SEAMS seam 4): ``tests/test_bench_<name>.py`` calls :func:`tests.bench_run.run_benchmark` on it, so a benchmark that
stops running fails the suite instead of rotting unseen (benchmarks/rollout_scaling.py once crashed after its first
figure and nothing noticed).

The smoke tests of the benchmarks other helpers own are theirs to write (evidence: ablations, pivot_learning,
learning; shaping: credit_accuracy, tree_vs_flat; byoa: reentry; syncobs: soak; textworld: textworld): until their
branches are merged this test lists them as missing."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OWNERS = {
    "ablations": "evidence",
    "pivot_learning": "evidence",
    "learning": "evidence",
    "credit_accuracy": "shaping",
    "tree_vs_flat": "shaping",
    "advantage_shares": "shaping",
    "reentry": "byoa",
    "soak": "syncobs",
    "textworld": "textworld",
}


def _benchmarks() -> list[str]:
    return sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_"))


def _runs(test_file: Path, name: str) -> bool:
    """Whether the test file runs benchmarks/<name>.py: a call of run_benchmark("<name>", ...), or the script's
    path or module named in a subprocess command."""
    tree = ast.parse(test_file.read_text())
    for node in ast.walk(tree):
        called = getattr(node.func, "id", getattr(node.func, "attr", "")) if isinstance(node, ast.Call) else ""
        if (
            called == "run_benchmark"
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
            owner = OWNERS.get(name)
            missing.append(f"tests/test_bench_{name}.py" + (f" (owned by {owner})" if owner else ""))
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
