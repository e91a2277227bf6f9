from __future__ import annotations

import json
from pathlib import Path

from data.config import WandbConfig
from data.tracking import MetricsLogger


def test_metrics_jsonl_console_and_offline_wandb(tmp_path: Path, capsys) -> None:
    logger = MetricsLogger(tmp_path, WandbConfig(enabled=True, mode="offline", project="memrl-test"), {"a": 1})
    logger.log(0, {"loss": 1.5, "reward_mean": 0.25, "nan": float("nan")})
    logger.log(1, {"loss": 1.0})
    logger.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1] and lines[0]["nan"] is None and lines[1]["loss"] == 1.0
    assert "reward_mean=0.25" in capsys.readouterr().out
    assert list((tmp_path / "wandb").glob("offline-run-*"))  # a real offline wandb run directory


def test_resume_truncates_steps_after_the_checkpoint(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path, console=False)
    for step in range(5):
        logger.log(step, {"loss": float(step)})
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 5, "lo')  # torn by a kill
    MetricsLogger(tmp_path, console=False, resume_from_step=2)
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2]
