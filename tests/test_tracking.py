from __future__ import annotations

import json
from pathlib import Path

from memrl.data.config import WandbConfig
from memrl.data.tracking import MetricsLogger


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


def test_quiet_console_keeps_memrl_output_and_sends_the_rest_to_run_log(tmp_path: Path, capfd) -> None:
    """memrl's banners stay on the console; warnings, library log records, prints of other modules and raw fd
    writes (C++ engine start-up) go to a temporary log, moved into run.log when the run directory exists."""
    import importlib.util
    import logging
    import os

    from memrl.data.tracking import bind_run_log, quiet_console, run_log_path
    from memrl.launch.quickstart import _Stages

    with quiet_console():
        temporary = run_log_path()
        assert temporary is not None and temporary.exists()
        _Stages().run("stage", "a memrl banner", lambda: None)
        # pytest records warnings itself: show this one through a fresh copy of the warnings module, as Python would
        spec = importlib.util.find_spec("warnings")
        fresh = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fresh)
        fresh.showwarning("a third-party FutureWarning", FutureWarning, "lib.py", 1)
        engine_log = logging.getLogger("vllm.fake")
        engine_log.addHandler(logging.StreamHandler())  # bound to the routed sys.stderr, as libraries do
        engine_log.warning("engine start-up line")
        engine_log.handlers.clear()
        os.write(2, b"NUMA binding: written by C++ to fd 2\n")
        print("a print from a module outside memrl")
        assert bind_run_log(tmp_path) == tmp_path / "run.log" and not temporary.exists()
        os.write(1, b"fd 1 after the run directory exists\n")
    out, err = capfd.readouterr()
    assert "[quickstart] === stage: a memrl banner" in out and "[quickstart] stage done" in out
    log = (tmp_path / "run.log").read_text()
    for noise in ("FutureWarning", "engine start-up line", "NUMA binding", "outside memrl", "fd 1 after"):
        assert noise not in out + err, noise
        assert noise in log, noise
    assert run_log_path() is None


def test_quiet_console_without_a_run_leaves_no_file(capfd) -> None:
    import os

    from memrl.data.tracking import quiet_console, run_log_path

    with quiet_console():
        temporary = run_log_path()
        os.write(2, b"noise\n")
    assert temporary is not None and not temporary.exists()
    assert "noise" not in "".join(capfd.readouterr())
