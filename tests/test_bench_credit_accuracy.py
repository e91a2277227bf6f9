"""benchmarks/credit_accuracy.py at its smallest setting (the noisy scripted expert as the policy, no checkpoint):
every method, the recoverability committee, and the scores on outcome-tied groups are in its JSON."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests.bench_run import model_cache, run_benchmark


# protects: benchmarks/credit_accuracy.py's JSON at its smallest setting: every credit method and the committee scored
# against replayed values
@pytest.mark.slow
def test_credit_accuracy_scores_every_method_on_all_and_on_tied_groups(tmp_path: Path) -> None:
    args = shlex.split("--quick --policy noisy-oracle --tasks 2 --states-per-task 1 --replays 2")
    args += ["--work", str(tmp_path), "--model-cache", model_cache()]
    record = run_benchmark("credit_accuracy", args, timeout=900)
    assert record == json.loads((tmp_path / "credit_accuracy_quick.json").read_text())
    assert record["states"] >= 1 and record["policy"].startswith("noisy-oracle")
    for criterion in ("committee", "committee_recoverability"):
        assert record[f"{criterion}_vs_true_value"]["pairs"] == record["states"] * 8
    for k in ("K=2", "K=4", "K=8"):
        row = record["by_k"][k]
        assert {"tree", "oat", "flat", "committee", "oat_recoverability", "committee_recoverability"} <= set(row)
        tied = row["tied_groups"]
        assert 0 <= tied["groups"] <= row["groups"]
        if tied["groups"]:
            assert tied["oat"]["sign_agreement"]["actions"] == tied["groups"] * int(k[2:])
