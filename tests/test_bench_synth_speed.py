"""benchmarks/synth_speed.py at its smallest setting (``--quick``: bins up to 16K, no tokenizer calibration)."""

from __future__ import annotations

from tests.bench_run import run_benchmark


def test_synth_speed_quick() -> None:
    record = run_benchmark("synth_speed", ["--quick"])
    assert record["qa_checked"] > 0 and record["qa_wrong"] == 0
    assert 0 <= record["max_rel_error_sam"] < 0.1 and 0 <= record["max_rel_error_ama"] < 0.1
    assert record["bins"] and max(record["bins"]) <= 16384
