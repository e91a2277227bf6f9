"""The slow tier's grouping (tests/conftest.py) holds under ``-n 2 --dist loadgroup``: the tests that share the
session's vLLM server run on one worker, which starts it once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SHARED = """
import os
import pytest

@pytest.fixture(scope="session")
def vllm_server_16k(tmp_path_factory):
    with open(os.environ["STARTS"], "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
    return "url", None
"""


def test_the_tests_sharing_the_vllm_server_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text() + SHARED)
    for module in "abcdefgh":
        (tmp_path / f"test_{module}.py").write_text(
            f"def test_{module}(vllm_server_16k): pass\n\n\ndef test_{module}_alone(): pass\n"
        )
    starts = tmp_path / "starts.txt"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env={**os.environ, "STARTS": str(starts)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "16 passed" in proc.stdout
    assert len(starts.read_text().split()) == 1, starts.read_text()
