"""SIGTERM, SIGINT and kill -9 of a run's driver: ``train oat-grpo`` on a 2-worker Ray fleet and ``sft``.

Each run is signalled once its first checkpoint is complete. SIGTERM / SIGINT must end it with exit 143 / 130 and
one ``memrl:`` line (no traceback); with kill -9 too, no process of the run (walked from the driver's process tree
before the signal: the Ray head, its agents and the rollout workers below the raylet) may be alive 10 s later; and
``--resume`` must end with the uninterrupted run's weights and metrics steps.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import psutil
import pytest
from safetensors.torch import load_file

from benchmarks.resume_faults import env, same_weights, steps

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "memrl.launch.cli", *args]


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr[-4000:]
    return proc


def _alive(procs: list[psutil.Process]) -> list[str]:
    out = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{proc.pid} {_cmdline(proc)[:80]}")
        except psutil.Error:
            continue
    return out


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def signal_when(cmd: list[str], ready: Path, sig: int) -> tuple[int, str, list[psutil.Process], list[str]]:
    """Start ``cmd``, send ``sig`` to its driver once ``ready`` exists; returns (exit code, stderr, the processes
    of its tree at the signal, their command lines then)."""
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    tree: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 600
        while not ready.exists():
            assert proc.poll() is None, f"the run ended before {ready} appeared:\n{proc.stderr.read()[-4000:]}"
            assert time.monotonic() < deadline, f"{ready} did not appear"
            time.sleep(0.01)
        # stopped at once, the driver writes nothing more while its tree is walked (seconds on a loaded machine)
        os.kill(proc.pid, signal.SIGSTOP)
        tree = psutil.Process(proc.pid).children(recursive=True)
        commands = [_cmdline(p) for p in tree]
        os.kill(proc.pid, sig)
        os.kill(proc.pid, signal.SIGCONT)  # a pending SIGTERM / SIGINT is handled once it runs again
        _, err = proc.communicate(timeout=180)
        deadline = time.monotonic() + 10
        while _alive(tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        return proc.returncode, err, tree, commands
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for leftover in tree:  # never leave a failing test's processes behind
            with contextlib.suppress(psutil.Error):
                leftover.kill()


def check_ending(code: int, err: str, tree: list[psutil.Process], sig: int) -> None:
    assert not _alive(tree), f"alive 10 s after {signal.Signals(sig).name}: {_alive(tree)}"
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
        return
    assert code == 128 + sig, (code, err[-3000:])
    rest = err
    assert "Traceback" not in rest and "Exception ignored" not in rest, rest[-3000:]
    last = [line for line in rest.replace("\r", "\n").splitlines() if line.startswith("memrl:")]
    word = "terminated (SIGTERM)" if sig == signal.SIGTERM else "interrupted (SIGINT)"
    assert len(last) == 1 and last[0].startswith(f"memrl: {word}") and "--resume" in last[0], rest[-2000:]


def weights(folder: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


# ----------------------------------------------------------------------------------------------------------------
# the shutdown path in this process


def test_sigterm_is_raised_like_ctrl_c_and_maps_to_143(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from memrl.launch import cli
    from memrl.launch.shutdown import Terminated, exit_code, handle_signals

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated) as caught, handle_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
    assert exit_code(caught.value) == 143 and exit_code(KeyboardInterrupt()) == 130
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored

    def terminated(args: object) -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        return 0

    # in this process the children are the test session's own (wandb's service, ...): record the call, stop none
    from memrl.launch import shutdown

    stopped = []
    monkeypatch.setattr(shutdown, "stop_children", lambda grace_s=shutdown.CHILD_GRACE_S: stopped.append(grace_s))
    monkeypatch.setattr(cli, "_config_show", terminated)
    assert cli.main(["config", "show", "--command", "sft"]) == 143
    err = capsys.readouterr().err.strip()
    assert err == "memrl: terminated (SIGTERM): stopped", err
    assert stopped, "the shutdown path did not stop the children"


# ----------------------------------------------------------------------------------------------------------------
# train oat-grpo on a 2-worker fleet


def oat(model: Path, out: Path, name: str, *extra: str) -> list[str]:
    from test_fleet import scripted_policy_overrides

    return _cli(
        "train",
        "oat-grpo",
        "--config",
        str(ROOT / "configs" / "oat_grpo_tiny.yaml"),
        *scripted_policy_overrides(model, out, name, 3),
        "fleet.workers=2",
        "fleet.cpus_per_worker=0.5",
        *extra,
    )


@pytest.fixture(scope="module")
def oat_reference(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run, its rollouts in the driver: no Ray start (the fast
    test_fleet.py::test_two_workers_match_one_and_the_trainer_agrees checks that 2 Ray workers give its groups)."""
    out = tmp_path_factory.mktemp("oat-signals")
    _run(oat(tiny_model_dir, out, "reference", "fleet.workers=0"))
    return out / "reference"


def final_policy(run_dir: Path) -> Path:
    return sorted((run_dir / "policy").glob("v*"))[-1]


# protects: a real Ray fleet run ended by SIGTERM (exit 143, one line) and, once resumed, by kill -9 leaves no Ray
# process behind either time and resumes to the uninterrupted run's weights (SIGINT takes the same shutdown path: the
# fast test_sigterm_is_raised_like_ctrl_c_and_maps_to_143 checks its 130)
@pytest.mark.slow
def test_fleet_run_stops_cleanly_and_resumes_equal(oat_reference: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    """One run, signalled twice: SIGTERM once its first checkpoint is complete, then kill -9 of its resumed run once
    it has completed a checkpoint of its own, then a resume to the end (one start less than a run per signal), which
    must start from the newest complete checkpoint (a checkpoint the run completed before the kill landed counts)."""
    run_dir = tmp_path / "signalled"
    newest = -1
    for sig, resumed in [(signal.SIGTERM, ()), (signal.SIGKILL, ("--resume",))]:
        cmd = oat(tiny_model_dir, tmp_path, "signalled", *resumed)
        ready = run_dir / "checkpoints" / f"ckpt-{newest + 1:06d}" / "COMPLETE"
        code, err, tree, commands = signal_when(cmd, ready, sig)
        assert sum("RolloutWorker" in c for c in commands) == 2, f"both workers were up: {commands}"
        check_ending(code, err, tree, sig)
        assert not (run_dir / "summary.json").exists()
        newest = max(int(marker.parent.name.split("-")[1]) for marker in run_dir.glob("checkpoints/ckpt-*/COMPLETE"))
    resumed = _run(oat(tiny_model_dir, tmp_path, "signalled", "--resume"))
    assert f"resumed from ckpt-{newest:06d}" in resumed.stdout + resumed.stderr
    assert steps(run_dir) == steps(oat_reference)
    assert same_weights(weights(final_policy(run_dir)), weights(final_policy(oat_reference)))


# ----------------------------------------------------------------------------------------------------------------
# sft


def sft(model: Path, data: Path, out: Path, name: str, *extra: str) -> list[str]:
    return _cli(
        "sft",
        f"model.base={model}",
        f"data.dir={data}",
        "data.roles=[consolidate, recall]",
        f"run.output_dir={out}",
        f"run.name={name}",
        "lora.enabled=false",
        "train.max_steps=8",
        "train.batch_size=4",
        "train.lr=2e-3",
        "train.warmup=0",
        "train.logging_steps=1",
        "train.save_steps=2",
        "train.max_length=256",
        "train.progress=false",
        *extra,
    )


@pytest.fixture(scope="module")
def sft_reference(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from test_sft import sam_traces

    from memrl.data.distill import distill_traces

    data = tmp_path_factory.mktemp("sft-data")
    distill_traces(sam_traces(40), data, progress=False)
    out = tmp_path_factory.mktemp("sft-signals")
    _run(sft(tiny_model_dir, data, out, "reference"))
    return data, out / "reference"


# protects: the sft command (HF Trainer) stopped by SIGTERM mid-run exits 143 with one line and resumes to the
# uninterrupted run's weights (the fast test_sft resume test never signals a running trainer)
@pytest.mark.slow
def test_sft_stops_cleanly_and_resumes_equal(
    sft_reference: tuple[Path, Path], tiny_model_dir: Path, tmp_path: Path
) -> None:
    sig = signal.SIGTERM
    data, reference = sft_reference
    run_dir = tmp_path / "signalled"
    code, err, tree, _ = signal_when(
        sft(tiny_model_dir, data, tmp_path, "signalled"),
        run_dir / "checkpoints" / "checkpoint-2" / "trainer_state.json",
        sig,
    )
    check_ending(code, err, tree, sig)
    _run(sft(tiny_model_dir, data, tmp_path, "signalled", "--resume"))
    assert same_weights(weights(run_dir / "final"), weights(reference / "final"))


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


# protects: sft --resume of a finished, changed or emptied run exits 2 with one line and leaves the folder untouched
@pytest.mark.slow
def test_sft_resume_of_a_finished_changed_or_emptied_run_exits_2(
    sft_reference: tuple[Path, Path], tiny_model_dir: Path, tmp_path: Path
) -> None:
    """``sft`` records its checkpoints in the run's journal as the online loops do: ``--resume`` of the finished run
    says it is finished and trains nothing, with a changed key it names the key, and with every checkpoint deleted it
    is an error, not a fresh start; each exit 2 with one line and the run folder untouched."""
    data, reference = sft_reference
    run_dir = tmp_path / reference.name
    shutil.copytree(reference, run_dir)
    assert (run_dir / "checkpoints.log").read_text().split() == [f"checkpoint-{s}" for s in (2, 4, 6, 8)]

    def refused(*extra: str) -> str:
        before = _files(run_dir)
        proc = subprocess.run(
            sft(tiny_model_dir, data, tmp_path, reference.name, *extra, "--resume"),
            cwd=ROOT,
            env=env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("memrl:"), proc.stderr[-3000:]
        assert _files(run_dir) == before
        return lines[0]

    assert "is finished" in refused()
    assert "train.lr (0.002 -> 0.5)" in refused("train.lr=0.5")
    (run_dir / "summary.json").unlink()
    shutil.rmtree(run_dir / "checkpoints")
    gone = refused()
    assert "every checkpoint of run" in gone and "checkpoint-2, checkpoint-4, checkpoint-6, checkpoint-8" in gone


# ----------------------------------------------------------------------------------------------------------------
# absurd sizes: progress at once, an estimate measured from the first items, a clean Ctrl-C


def test_a_huge_count_shows_progress_and_an_estimate_at_once_and_stops_cleanly(tmp_path: Path) -> None:
    """``data synth`` of a million episodes: the bar is on the console within seconds of the start, one line then
    says how long all of it would take at the rate of the first items, and Ctrl-C ends it with exit 130 and one
    line, with nothing of the output written (only the run's config, log and lock)."""
    import threading

    cmd = _cli(
        "data",
        "synth",
        "sources=[{family: sam, count: 1000000, params: {horizon_steps: 12}}]",
        "arrow=false",
        f"run.output_dir={tmp_path}",
        "run.name=big",
    )
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    seen = {"out": "", "err": ""}
    first: dict[str, float] = {}

    def read(stream: IO[bytes], key: str, marker: str) -> None:
        while chunk := os.read(stream.fileno(), 4096):
            seen[key] += chunk.decode(errors="replace")
            if marker in seen[key] and key not in first:
                first[key] = time.monotonic() - started

    readers = [
        threading.Thread(target=read, args=(proc.stdout, "out", "to go"), daemon=True),
        threading.Thread(target=read, args=(proc.stderr, "err", "/1000000"), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        deadline = started + 120
        while len(first) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(first) == 2, (first, seen["out"][-2000:], seen["err"][-2000:])
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    for reader in readers:
        reader.join(timeout=10)
    print(f"bar after {first['err']:.1f} s, estimate after {first['out']:.1f} s")
    assert first["err"] < 30, "no progress bar within 30 s of the start"
    assert first["out"] - first["err"] < 20, "no time estimate within 20 s of the bar"
    (estimate,) = [line for line in seen["out"].splitlines() if "to go" in line]
    assert estimate.startswith("synth: 1,000,000 episodes to generate; ") and "/s): about " in estimate, estimate
    lines = [line for line in seen["err"].replace("\r", "\n").splitlines() if line.startswith("memrl:")]
    assert len(lines) == 1 and lines[0].startswith("memrl: interrupted"), seen["err"][-2000:]
    assert "Traceback" not in seen["err"]
    assert sorted(p.name for p in (tmp_path / "big").iterdir()) == [".lock", "config.yaml", "run.log"]
