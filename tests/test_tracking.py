from __future__ import annotations

import json
from pathlib import Path

from memrl.data.config import WandbConfig
from memrl.data.tracking import MetricsLogger


def test_metrics_jsonl_console_and_offline_wandb(tmp_path: Path, capsys) -> None:
    from memrl.launch.console import console

    with console():
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


CONSOLE_SCRIPT = r"""
import atexit, logging, os, subprocess, sys, warnings
from pathlib import Path

from tqdm import tqdm

from memrl.data.tracking import MetricsLogger, bind_run_log, progress_bar, run_log_path
from memrl.launch.console import console
from memrl.launch.quickstart import _Stages

run_dir, verbose = Path(sys.argv[1]), sys.argv[2] == "verbose"
with console(verbose=verbose):
    temporary = run_log_path()
    assert temporary is not None and temporary.exists()
    _Stages().run("stage", "a memrl banner", lambda: None)
    for _ in progress_bar(range(3), desc="memrl bar"):
        pass
    # vLLM configures its loggers when imported, mid-run: logging.config closes every handler it knows
    import logging.config
    logging.config.dictConfig({"version": 1, "disable_existing_loggers": False,
                               "loggers": {"vllm.config": {"level": "INFO"}}})
    MetricsLogger(run_dir).log(0, {"loss": 1.5})
    warnings.warn("a third-party FutureWarning", FutureWarning, stacklevel=1)
    engine_log = logging.getLogger("vllm.fake")
    engine_log.propagate = False
    engine_log.addHandler(logging.StreamHandler())  # bound to sys.stderr, as libraries do
    engine_log.warning("engine start-up line")
    logging.getLogger("transformers.fake").warning("a library record")
    for _ in tqdm(range(2), desc="library bar"):
        pass
    os.write(2, b"NUMA binding: written by C++ to fd 2\n")
    print("a print from a module outside memrl")
    assert bind_run_log(run_dir) == run_dir / "run.log" and not temporary.exists()
    os.write(1, b"fd 1 after the run directory exists\n")
    subprocess.run([sys.executable, "-c", "print('a child process')"], check=True)
    left_open = progress_bar(total=2, desc="a bar never closed")
    # an atexit hook of a library logging through the handler it bound during the run (where the old stdout router
    # raised "I/O operation on closed file")
    atexit.register(lambda: engine_log.warning("engine shutdown line"))
assert run_log_path() is None
"""

NOISE = (
    "FutureWarning",
    "engine start-up line",
    "a library record",
    "library bar",
    "NUMA binding",
    "outside memrl",
    "fd 1 after",
    "a child process",
)


def _run_console_script(tmp_path: Path, mode: str) -> tuple[str, str, str]:
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-c", CONSOLE_SCRIPT, str(tmp_path), mode],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    log = tmp_path / "run.log"
    return res.stdout, res.stderr, log.read_text() if log.exists() else ""


def test_console_shows_memrl_output_and_run_log_gets_everything(tmp_path: Path) -> None:
    """memrl's banners, metrics lines and progress bars are on the console; warnings, library log records and
    progress bars, prints of other modules, raw fd writes (C++ engine start-up) and child processes go to a temporary
    log, moved into run.log when the run directory exists; nothing writes to a closed file at exit."""
    out, err, log = _run_console_script(tmp_path, "quiet")
    assert "[quickstart] === stage: a memrl banner" in out and "[quickstart] stage done" in out
    assert "[step 0] loss=1.5" in out and "memrl bar" in err
    for noise in NOISE:
        assert noise not in out + err, noise
        assert noise in log, noise
    assert "a memrl banner" in log and "[step 0] loss=1.5" in log  # run.log gets memrl's records too
    assert "Traceback" not in err and "closed file" not in err and "Exception ignored" not in err
    assert "engine shutdown line" in err  # after the command the streams are the process's own again


def test_verbose_console_shows_third_party_output_too(tmp_path: Path) -> None:
    out, err, log = _run_console_script(tmp_path, "verbose")
    assert "[quickstart] === stage: a memrl banner" in out and "memrl bar" in err
    for shown in NOISE:
        assert shown in out + err, shown
    assert "engine start-up line" in log or "a library record" in log  # log records still reach run.log
    assert "Traceback" not in err and "closed file" not in err


def test_console_without_a_run_leaves_no_file(capfd) -> None:
    import os

    from memrl.data.tracking import run_log_path
    from memrl.launch.console import console

    with console():
        temporary = run_log_path()
        os.write(2, b"noise\n")
    assert temporary is not None and not temporary.exists()
    assert "noise" not in "".join(capfd.readouterr())


def test_progress_estimate_reaches_the_console_only_for_a_long_job(monkeypatch, caplog) -> None:
    """A bar with ``work`` logs its projection at INFO (the console) only when the rest would take LONG_JOB_S or more;
    a short job's projection goes to the debug log, so short runs' consoles do not change."""
    import logging

    from memrl.data import tracking

    monkeypatch.setattr(tracking, "ESTIMATE_AFTER_S", 0.0)
    caplog.set_level(logging.DEBUG, logger="memrl.data.tracking")
    for total in (3, 10**12):
        with tracking.progress_bar(total=total, desc=f"job{total}", work=f"{total} items", disable=False) as bar:
            bar.update(1)
    records = {r.getMessage().split(":")[0]: r.levelno for r in caplog.records if "to go" in r.getMessage()}
    assert records == {"job3": logging.DEBUG, f"job{10**12}": logging.INFO}


def tensorboard_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files under ``directory``, read back with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_backend_list_writes_tensorboard_events_and_an_mlflow_run(tmp_path: Path) -> None:
    """Acceptance 8: ``run.logging.backends: [jsonl, tensorboard, mlflow]`` writes an event file TensorBoard reads
    back and an MLflow run (local file store) MLflow reads back, with the same numbers as metrics.jsonl; a resume
    continues the MLflow run and TensorBoard's events past the resumed step are dropped."""
    import pytest

    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    from mlflow import MlflowClient

    from memrl.data.config import LoggingConfig

    cfg = LoggingConfig(backends=["jsonl", "tensorboard", "mlflow"], mlflow_experiment="memrl-test")
    logger = MetricsLogger(tmp_path, None, {"trainer": {"lr": 0.001}}, name="run-a", console=False, logging=cfg)
    assert logger.backends == ["tensorboard", "mlflow"]
    for step in range(4):
        logger.log(
            step,
            {"loss": 1.0 / (step + 1), "eval/success": 0.25 * step, "note": "text", "flag": True, "nan": float("nan")},
        )
    logger.close()
    scalars = tensorboard_scalars(tmp_path / "tensorboard")
    assert sorted(scalars) == ["eval/success", "loss"]
    assert scalars["loss"] == [(s, pytest.approx(1.0 / (s + 1))) for s in range(4)]

    run_id = (tmp_path / "mlflow_run_id").read_text().strip()
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    run = client.get_run(run_id)
    assert run.info.run_name == "run-a" and run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "memrl-test"
    history = client.get_metric_history(run_id, "eval/success")
    assert [(m.step, m.value) for m in history] == [(s, 0.25 * s) for s in range(4)]
    assert set(run.data.metrics) == {"loss", "eval/success"}
    assert json.loads((Path(client.download_artifacts(run_id, "config.json", str(tmp_path / "dl")))).read_text()) == {
        "trainer": {"lr": 0.001}
    }

    # a resume from step 1: metrics.jsonl and TensorBoard keep steps 0-1, MLflow continues the same run
    resumed = MetricsLogger(tmp_path, None, {}, name="run-a", console=False, logging=cfg, resume_from_step=1)
    resumed.log(2, {"loss": 9.0})
    resumed.close()
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]
    assert tensorboard_scalars(tmp_path / "tensorboard")["loss"] == [(0, 1.0), (1, 0.5), (2, 9.0)]
    assert (tmp_path / "mlflow_run_id").read_text().strip() == run_id
    assert [m.value for m in client.get_metric_history(run_id, "loss") if m.step == 2][-1] == 9.0


def test_a_backend_without_its_package_is_a_config_error(tmp_path: Path, monkeypatch) -> None:
    import importlib.util

    import pytest

    from memrl.data.config import ConfigError, LoggingConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(
        ConfigError,
        match=r"run.logging.backends lists mlflow, but the mlflow package is not "
        r"installed: pip install 'memrl\[tracking\]'",
    ):
        MetricsLogger(tmp_path, logging=LoggingConfig(backends=["mlflow"]))
    assert not (tmp_path / "mlruns").exists()


def test_a_top_level_logging_key_points_to_run_logging() -> None:
    """The issue's own spelling, ``logging.backends``, lives under ``run``: the error says where."""
    import pytest

    from memrl.data.config import ConfigError, apply_overrides
    from memrl.launch.evaluation.config import EvalConfig

    with pytest.raises(ConfigError, match=r"unknown key 'logging.backends'; did you mean 'run.logging'\?"):
        apply_overrides(EvalConfig, {}, ["logging.backends=[jsonl, tensorboard]"])
    assert apply_overrides(EvalConfig, {}, ["run.logging.backends=[jsonl, mlflow]"]) == {
        "run": {"logging": {"backends": ["jsonl", "mlflow"]}}
    }
