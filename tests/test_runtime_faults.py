"""Runtime faults that are not bad inputs (issue 41, part A): each ends with exit 2 (143 for SIGTERM) and one
``memrl:`` line naming the file, folder, endpoint or key and what to do, and leaves nothing half-written. Classes, at
least two cases each: a full disk or a file-size limit while sft, OAT-GRPO or export writes (a real tmpfs in a private
mount namespace where ``unshare -rm`` works, RLIMIT_FSIZE otherwise); an OpenAI-compatible endpoint that keeps failing
(tests/fault_server.py's PlanServer: redirects and loops, 429 with an absurd Retry-After, a gzip bomb, HTML with 200,
a wrong JSON schema, NaN usage, a drip-fed body); SIGTERM on the Ray path; odd run folders and process states; damaged
GGUF files; the benchmarks' own inputs; bounds on sizes; config bounds at their edges; a resume that forgets the
trainer's RNG state."""

from __future__ import annotations

import json
import logging
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness import tiny_oat_overrides
from benchmarks.resume_faults import env
from memrl.launch.cli import main
from tests.fault_server import BOMB_BYTES, PlanServer
from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[1]
LIMITED = ROOT / "tests" / "scripts" / "limited_run.py"


def _env() -> dict[str, str]:
    return {**env(), "PYTHONPATH": str(ROOT)}


def _run_script(source: str) -> subprocess.CompletedProcess[str]:
    """Run a Python script in its own session (a signal it sends reaches only it), its output captured."""
    return subprocess.run(
        [sys.executable, "-c", source],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )


def one_line(err: str) -> str:
    """The single ``memrl:`` line of a command's stderr (no traceback anywhere)."""
    assert "Traceback" not in err, err[-3000:]
    lines = [line.strip() for line in err.replace("\r", "\n").splitlines() if line.strip().startswith("memrl:")]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def one_message(err: str) -> str:
    """A command's whole stderr when it is one ``memrl:`` paragraph (a config error lists its keys below its first
    line), for the cases that stop before anything runs."""
    message = err.strip()
    assert message.startswith("memrl:") and "\n\n" not in message and "Traceback" not in message, err[-3000:]
    return message


def _can_unshare() -> bool:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    probe = subprocess.run(
        [
            "unshare",
            "-rm",
            "sh",
            "-c",
            "mount -t tmpfs -o size=1m tmpfs /mnt 2>/dev/null || mount -t tmpfs -o size=1m tmpfs /tmp",
        ],
        capture_output=True,
        timeout=30,
    )
    return probe.returncode == 0


TMPFS = _can_unshare()


def limited(
    argv: list[str], listing: Path, *, fsize: int | None = None, tmpfs: str | None = None, timeout: float = 600
) -> tuple[int, str, dict[str, int]]:
    """Run ``memrl argv`` under a file-size limit or on a tmpfs of ``tmpfs`` bytes mounted on ``listing``; returns
    the exit code, stderr and what was left under ``listing`` (path -> size, -1 for a folder)."""
    cmd = [sys.executable, str(LIMITED), "--list", str(listing)]
    if fsize is not None:
        cmd += ["--fsize", str(fsize)]
    if tmpfs is not None:
        cmd = ["unshare", "-rm", *cmd, "--mount-tmpfs", str(listing), "--size", tmpfs]
    proc = subprocess.run([*cmd, "--", *argv], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    left = [line for line in proc.stdout.splitlines() if line.startswith("LEFT ")]
    assert left, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.returncode, proc.stderr, json.loads(left[-1][5:])


def half_written(left: dict[str, int]) -> list[str]:
    """Temporary or torn folders among what a run left: ``.tmp-ckpt-*``, ``.*.partial-*``, an SFT
    ``checkpoint-N`` without ``trainer_state.json``, a policy version without weights."""
    bad = [
        p
        for p in left
        if any(part.startswith((".tmp-", ".")) and ("partial" in part or "tmp-ckpt" in part) for part in p.split("/"))
    ]
    folders = {p for p, size in left.items() if size == -1}
    for folder in folders:
        name = folder.rsplit("/", 1)[-1]
        if name.startswith("checkpoint-") and f"{folder}/trainer_state.json" not in left:
            bad.append(folder)
        if name.startswith("ckpt-") and f"{folder}/COMPLETE" not in left:
            bad.append(folder)
        if folder.split("/")[-2:-1] == ["policy"] and not any(
            p.startswith(f"{folder}/") and p.endswith(".safetensors") for p in left
        ):
            bad.append(folder)
    return bad


# ----------------------------------------------------------------------------------------------------------------
# storage: a full disk or a file-size limit


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from test_sft import sam_traces

    from memrl.data.distill import distill_traces

    out = tmp_path_factory.mktemp("sft-data")
    distill_traces(sam_traces(32), out, progress=False)
    return out


def _sft(model: Path, data: Path, out: Path) -> list[str]:
    return [
        "sft",
        f"model.base={model}",
        f"data.dir={data}",
        "data.roles=[recall]",
        "train.max_steps=4",
        "train.save_steps=2",
        "train.batch_size=4",
        "train.max_length=256",
        f"run.output_dir={out}",
        "run.name=s",
        "lora.enabled=false",
        "train.progress=false",
    ]


def _oat(model: Path, out: Path) -> list[str]:
    return [
        "train",
        "oat-grpo",
        "--config",
        str(ROOT / "configs" / "oat_grpo_tiny.yaml"),
        *tiny_oat_overrides(model, out, "o", config_sampling=True),
        "loop.iterations=2",
        "loop.eval_every=0",
        "loop.checkpoint_every=1",
    ]


def test_sft_over_the_file_size_limit(tiny_model_dir: Path, sft_data: Path, tmp_path: Path) -> None:
    """The first checkpoint (full weights, 2.2 MB) passes a 1 MB ``ulimit -f``: one line naming the checkpoints
    folder and the limit, exit 2, the torn ``checkpoint-2`` removed, the run's config and log kept."""
    code, err, left = limited(_sft(tiny_model_dir, sft_data, tmp_path), tmp_path, fsize=1_000_000)
    line = one_line(err)
    assert code == 2 and line.startswith("memrl: error: sft checkpoint:"), err[-2000:]
    assert "file-size limit" in line and str(tmp_path / "s" / "checkpoints") in line and "ulimit -f" in line
    assert "--resume" in line  # sft is resumable: what it saved is kept
    assert not half_written(left), left
    assert "s/config.yaml" in left and "s/run.log" in left and "s/checkpoints/checkpoint-2" not in left


def test_oat_grpo_over_the_file_size_limit(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The first policy version (full weights) passes the limit: its folder is absent, not half-written."""
    code, err, left = limited(_oat(tiny_model_dir, tmp_path), tmp_path, fsize=1_000_000)
    line = one_line(err)
    assert code == 2 and "policy weights v00000" in line and "file-size limit" in line, err[-2000:]
    assert str(tmp_path / "o" / "policy") in line
    assert not half_written(left), left
    assert not [p for p in left if p.startswith("o/policy/")], left  # absent, not a config.json alone


# protects: `memrl export` over a file-size limit: one line, exit 2, no half-written model
@pytest.mark.slow
def test_export_over_the_file_size_limit(tiny_model_dir: Path, tmp_path: Path) -> None:
    code, err, left = limited(
        [
            "export",
            f"policy.base={tiny_model_dir}",
            "verify.vllm=false",
            "verify.transformers=false",
            f"run.output_dir={tmp_path}",
            "run.name=e",
        ],
        tmp_path,
        fsize=1_000_000,
    )
    line = one_line(err)
    assert code == 2 and line.startswith("memrl: error: export model:") and "file-size limit" in line, err[-2000:]
    assert not half_written(left) and not [p for p in left if p.startswith("e/model")], left


# protects: sft on a real full disk (tmpfs): one line, exit 2, nothing half-written
@pytest.mark.slow
@pytest.mark.skipif(not TMPFS, reason="no private mount namespace here (unshare -rm): the RLIMIT_FSIZE cases run")
def test_sft_on_a_full_disk(tiny_model_dir: Path, sft_data: Path, tmp_path: Path) -> None:
    """A real "no space left on device": a 3 MB tmpfs under the run."""
    disk = tmp_path / "disk"
    code, err, left = limited(_sft(tiny_model_dir, sft_data, disk), disk, tmpfs="3m")
    line = one_line(err)
    assert code == 2 and "no space left on the device" in line and str(disk / "s" / "checkpoints") in line, err
    assert "free there now" in line
    assert not half_written(left), left


# protects: oat-grpo on a real full disk (tmpfs): complete checkpoints and policy versions only
@pytest.mark.slow
@pytest.mark.skipif(not TMPFS, reason="no private mount namespace here (unshare -rm): the RLIMIT_FSIZE cases run")
def test_oat_grpo_on_a_full_disk(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A 6 MB tmpfs: the first checkpoint fits, a later write does not; every checkpoint and policy version left
    is complete."""
    disk = tmp_path / "disk"
    code, err, left = limited(_oat(tiny_model_dir, disk), disk, tmpfs="6m")
    line = one_line(err)
    assert code == 2 and "no space left on the device" in line and str(disk / "o") in line, err[-2000:]
    assert not half_written(left), left
    assert "o/checkpoints/ckpt-000000/COMPLETE" in left


@pytest.fixture
def file_size_limit() -> Any:
    """Set this process's file-size limit for the block (Python ignores SIGXFSZ: a write past it fails with EFBIG)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)

    def set_limit(limit: int) -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))

    yield set_limit
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_checkpoint_and_policy_writes_are_whole_or_absent(
    tiny_model_dir: Path, tmp_path: Path, file_size_limit: Any
) -> None:
    """CheckpointManager.save and save_policy under a 200 KB limit (the weights are 2.2 MB): a StorageError naming
    the folder; no temporary folder, no new checkpoint, the previous policy version intact."""
    from memrl.data.io import StorageError
    from memrl.train.checkpoint import CheckpointManager
    from memrl.train.group_trainer import GroupTrainer, GroupTrainerConfig
    from memrl.train.policy import LoraSettings, PolicySpec

    trainer = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), GroupTrainerConfig(lora=LoraSettings(enabled=False)))
    manager = CheckpointManager(tmp_path / "checkpoints")
    trainer.save_policy(str(tmp_path / "policy" / "v00000"))
    before = {p.name: p.stat().st_size for p in (tmp_path / "policy" / "v00000").iterdir()}
    file_size_limit(200_000)
    with pytest.raises(StorageError, match="checkpoint ckpt-000000: a file reached the process's file-size limit"):
        manager.save(0, trainer.accelerator, trainer.model, {"iteration": 0})
    with pytest.raises(StorageError, match=f"policy weights v00000: .* while writing {tmp_path / 'policy'}"):
        trainer.save_policy(str(tmp_path / "policy" / "v00000"))
    with pytest.raises(StorageError, match="policy weights v00001"):
        trainer.save_policy(str(tmp_path / "policy" / "v00001"))
    file_size_limit(resource.RLIM_INFINITY)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "policy").iterdir()) == ["v00000"]
    assert {p.name: p.stat().st_size for p in (tmp_path / "policy" / "v00000").iterdir()} == before


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Error while serializing: I/O error: No space left on device (os error 28)", "no space left"),
        ("Error while serializing: I/O error: File too large (os error 27)", "file-size limit"),
        ("[Errno 122] Disk quota exceeded", "quota"),
        ("[Errno 30] Read-only file system: '/runs/x'", "read-only"),
    ],
)
def test_storage_faults_are_recognised_in_the_writers_own_words(message: str, expected: str, tmp_path: Path) -> None:
    from memrl.data.io import storage_error

    error = storage_error(RuntimeError(message), tmp_path, "checkpoint ckpt-000003")
    assert error is not None and expected in str(error) and str(tmp_path) in str(error)
    assert str(error).startswith("checkpoint ckpt-000003: ")
    assert storage_error(RuntimeError("CUDA out of memory"), tmp_path, "x") is None  # a bug stays a bug
    assert storage_error(ValueError("cannot reshape array"), tmp_path, "x") is None


# ----------------------------------------------------------------------------------------------------------------
# endpoints that keep failing


@pytest.fixture(scope="module")
def plans() -> Any:
    server = PlanServer()
    yield server
    server.close()


def _engine(url: str, **kw: Any) -> Any:
    from memrl.rollout.engines import EndpointConfig
    from memrl.rollout.engines.openai_engine import OpenAIEngine

    endpoint = kw.pop("endpoint", {})
    options = {"request_timeout_s": 2.0, "max_retries": 2, "backoff_base_s": 0.01, "backoff_max_s": 0.2, **kw}
    return OpenAIEngine([EndpointConfig(url=url, model="m", **endpoint)], api="chat", **options)


def _ask(engine: Any) -> Any:
    from memrl.data.schemas import Message
    from memrl.rollout.engines import GenerationRequest, SamplingParams

    request = GenerationRequest(
        messages=[Message(role="user", content="where is the key?")], sampling=SamplingParams(max_tokens=8)
    )
    return engine.generate([request])[0]


@pytest.mark.parametrize("status", ["redirect", "redirect307"])
def test_redirects_are_followed_with_the_post_and_not_the_key(
    plans: PlanServer, status: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 302 is followed (it was 'not retryable' at the first request), the POST and its body kept; the key goes to
    the configured host only (the redirect leads to localhost, another origin)."""
    monkeypatch.setenv("MEMRL_TEST_KEY", "sk-test-secret")
    with _engine(plans.url(status, status), endpoint={"api_key_env": "MEMRL_TEST_KEY"}) as engine:
        result = _ask(engine)
    assert result.completions[0].text == "answer(drawer 5)"
    assert plans.methods[status] == ["POST"] and plans.methods[f"{status}-moved"] == ["POST"]
    assert plans.auth[status] == ["Bearer sk-test-secret"] and plans.auth[f"{status}-moved"] == [None]


@pytest.mark.parametrize(("plan", "expected"), [("loop", "a redirect loop"), ("hops", "more than 5 redirects")])
def test_a_redirect_loop_fails_at_once_naming_the_endpoint(plans: PlanServer, plan: str, expected: str) -> None:
    from memrl.rollout.engines.openai_engine import EndpointError

    url = plans.url(plan, plan)
    with _engine(url) as engine, pytest.raises(EndpointError) as caught:
        _ask(engine)
    assert expected in str(caught.value) and url in str(caught.value)
    assert plans.attempts[plan] == 1  # not retried: the same redirects would come back


@pytest.mark.parametrize("plan", ["retry-huge", "retry-date"])
def test_an_absurd_retry_after_is_capped(plans: PlanServer, plan: str) -> None:
    """``Retry-After: 1000000000`` (or a date in 2100) waits backoff_max_s (0.2 s here), and the retry is answered."""
    start = time.monotonic()
    with _engine(plans.url(plan, f"{plan},ok")) as engine:
        result = _ask(engine)
    assert result.completions[0].text == "answer(drawer 5)" and plans.attempts[plan] == 2
    assert time.monotonic() - start < 30


@pytest.mark.parametrize(
    ("plan", "expected"),
    [
        ("html", "HTTP 200 with a body that is not JSON (text/html"),
        ("schema", "HTTP 200 with an unexpected body (KeyError: 'choices')"),
        ("bomb", "larger than 64 MiB once decompressed"),
        ("drip", "timeout after"),
        ("503", "HTTP 503"),
    ],
)
def test_an_endpoint_that_keeps_failing_is_one_error_after_its_retries(
    plans: PlanServer, plan: str, expected: str
) -> None:
    """Each fault is retried (max_retries 2: 3 attempts), then one EndpointError (a RunFault: exit 2 in the CLI)
    names the engine, the endpoint, the last status and what to check. The gzip bomb (80 MiB once decompressed) is
    refused without holding it: the process grows by far less."""
    from memrl.data.errors import RunFault
    from memrl.rollout.engines.openai_engine import EndpointError

    url = plans.url(plan, plan)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    timeout = 1.0 if plan == "drip" else scaled(10.0, cap=120.0)  # decompressing 64 MiB takes seconds when loaded
    with _engine(url, request_timeout_s=timeout) as engine, pytest.raises(EndpointError) as caught:
        _ask(engine)
    message = str(caught.value)
    assert isinstance(caught.value, RunFault) and expected in message and url in message
    assert "3 attempt(s)" in message and "check that the server is up" in message
    assert plans.attempts[plan] == 3
    if plan == "bomb":
        grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss
        assert grown_kib * 1024 < BOMB_BYTES, grown_kib  # at most the 64 MiB limit, and far from its gigabytes


def test_nan_usage_keeps_the_answer(plans: PlanServer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING), _engine(plans.url("nan", "nan")) as engine:
        result = _ask(engine)
        stats = next(iter(engine.stats().values()))
    assert result.completions[0].text == "answer(drawer 5)" and plans.attempts["nan"] == 1
    assert result.usage.prompt_tokens == 0 and result.usage.completion_tokens == 0  # estimated, not NaN
    assert stats.requests == 1 and stats.failed_attempts == 0
    assert "reports usage nan, not a token count" in caplog.text


def _client(name: str, url: str, retries: int = 1) -> str:
    return (
        f"{{backend: openai, name: {name}, model: {name}, api: chat, endpoints: [{{url: '{url}'}}], "
        f"request_timeout_s: 2.0, max_retries: {retries}, backoff_base_s: 0.01, backoff_max_s: 0.05}}"
    )


def _eval(out: Path, name: str, *extra: str) -> list[str]:
    return [
        "eval",
        f"run.output_dir={out}",
        f"run.name={name}",
        "datasets=[{name: d, kind: ama_synthetic, episodes_per_setting: 1}]",
        "systems=[{memory: {name: bm25}}]",
        *extra,
    ]


def test_eval_stops_with_one_line_when_its_reasoner_keeps_failing(
    plans: PlanServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reasoner is needed for every answer, so the eval cannot go on: exit 2, one line naming the endpoint and
    the status, the run folder kept for --resume (not removed as after a bad start)."""
    for plan in ("html", "loop"):
        url = plans.url(f"reasoner-{plan}", plan)
        assert main(_eval(tmp_path, plan, f"reasoner={_client('reasoner', url)}")) == 2
        line = one_line(capsys.readouterr().err)
        assert line.startswith("memrl: error: reasoner: ") and url in line and "--resume" in line, line
        assert (tmp_path / plan / "config.yaml").is_file()


def test_eval_goes_on_when_judge_requests_fail(plans: PlanServer, tmp_path: Path) -> None:
    """A judge request that fails after its retries costs its own item: the eval completes, the item is scored by
    token F1 and counted in ``judge_failed``; the answered ones are the judge's."""
    url = plans.url("judge", "ok,ok,500,500,ok,bomb,html,ok")  # no retries: attempts 2, 3, 5 and 6 are lost
    assert main(_eval(tmp_path, "judged", f"judge={_client('judge', url, retries=0)}")) == 0
    records = [json.loads(line) for line in (tmp_path / "judged" / "results.jsonl").read_text().splitlines()]
    failed = [r for r in records if r["scores"]["judge_failed"] == 1.0]
    assert len(records) == 8 and len(failed) == 4, [r["scores"]["judge_failed"] for r in records]
    assert all(r["scores"]["judge_parsed"] == 0.0 for r in failed) and plans.attempts["judge"] == 8


# ----------------------------------------------------------------------------------------------------------------
# SIGTERM: 143 on every path


def test_sigterm_turned_into_a_plain_interrupt_by_a_library_still_exits_143(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray's ray.get catches the interrupt and raises its own KeyboardInterrupt (the fleet path read as 130 and
    'interrupted (SIGINT)'): the signal received decides the exit code, not the exception's type."""
    from memrl.launch import cli, shutdown

    def swallowed(args: object) -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except KeyboardInterrupt:
            raise KeyboardInterrupt() from None  # what ray.get raises
        return 0

    monkeypatch.setattr(shutdown, "stop_children", lambda grace_s=shutdown.CHILD_GRACE_S: None)
    monkeypatch.setattr(cli, "_config_show", swallowed)
    assert cli.main(["config", "show", "--command", "sft"]) == 143
    assert capsys.readouterr().err.strip() == "memrl: terminated (SIGTERM): stopped"

    def interrupted(args: object) -> int:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        return 0

    monkeypatch.setattr(cli, "_config_show", interrupted)
    assert cli.main(["config", "show", "--command", "sft"]) == 130  # a later Ctrl-C is still a Ctrl-C
    assert capsys.readouterr().err.strip() == "memrl: interrupted (SIGINT): stopped"


_RAY_GET = """
import os, signal, sys, threading, time
from memrl.launch import cli

def blocked(args):
    import ray
    handler = signal.getsignal(signal.SIGTERM)
    ray.init(num_cpus=1, include_dashboard=False)
    signal.signal(signal.SIGTERM, handler)  # as RolloutFleet does: memrl's shutdown path stays in charge

    @ray.remote
    def slow():
        time.sleep(120)

    ref = slow.remote()
    threading.Timer(3.0, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
    ray.get(ref)
    return 0

cli._config_show = blocked
sys.exit(cli.main(["config", "show", "--command", "sft"]))
"""


_RAY_WORKER_ENDPOINT = """
import sys
from memrl.launch import cli

def blocked(args):
    import ray
    from memrl.rollout.engines.openai_engine import EndpointError

    ray.init(num_cpus=1, include_dashboard=False)

    @ray.remote
    def rollout():
        raise EndpointError("reasoner: request failed after 3 attempt(s); last endpoint http://h:8000/v1 -> HTTP 503")

    return ray.get(rollout.remote())

cli._config_show = blocked
sys.exit(cli.main(["config", "show", "--command", "sft"]))
"""


# protects: an endpoint error raised in a real Ray worker reaches the driver as one line
@pytest.mark.slow
def test_an_endpoint_failing_in_a_ray_worker_is_one_line() -> None:
    """Ray hands the driver RayTaskError(EndpointError), whose text is the worker's traceback: the line is the
    endpoint's own message."""
    proc = _run_script(_RAY_WORKER_ENDPOINT)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert one_line(proc.stderr) == (
        "memrl: error: reasoner: request failed after 3 attempt(s); last endpoint http://h:8000/v1 -> HTTP 503"
    )


# protects: SIGTERM while the driver waits in a real ray.get exits 143
@pytest.mark.slow
def test_sigterm_during_ray_get_exits_143() -> None:
    """The fleet path for real: SIGTERM while the driver waits in ray.get (a rollout in flight)."""
    proc = _run_script(_RAY_GET)
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert one_line(proc.stderr) == "memrl: terminated (SIGTERM): stopped"


# ----------------------------------------------------------------------------------------------------------------
# odd run folders and process states


def _synth(out: Path, *extra: str) -> list[str]:
    return ["data", "synth", f"run.output_dir={out}", "sources=[{family: sam, count: 2}]", "arrow=false", *extra]


def test_odd_run_folders_are_refused_before_anything_is_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "afile").write_text("x")
    (runs / "tofile").symlink_to(tmp_path / "afile")
    newline = tmp_path / "newline.yaml"
    newline.write_text('command: data synth\nrun:\n  name: "two\\nlines"\n')
    cases = [
        (_synth(runs, "run.name=dangling"), ["run.name", "symbolic link", "does not exist", "nowhere"]),
        (_synth(runs, "run.name=tofile"), ["run.name", "symbolic link to the file", "afile"]),
        (_synth(runs, f"run.name={'a' * 300}"), ["run.name", "300 bytes", "at most 200"]),
        (["data", "synth", "--config", str(newline), f"run.output_dir={runs}"], ["run.name", "control characters"]),
        (_synth(tmp_path / "afile" / "runs"), ["run.output_dir", "afile", "a file, not a folder"]),
        (_synth(tmp_path / ("b" * 300) / "runs"), ["run.output_dir", "300 bytes", "shorter"]),
    ]
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    for argv, expected in cases:
        assert main(argv) == 2, argv
        message = one_message(capsys.readouterr().err)
        assert all(e in message for e in expected), (expected, message)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # nothing created, nothing followed


def test_a_deleted_working_folder_is_one_line(tmp_path: Path) -> None:
    """torch cannot even load in a deleted working folder (oneMKL: 'Cannot load libtorch_cpu.so'): refused first."""
    gone = tmp_path / "gone"
    gone.mkdir()
    for argv in (["sft", f"run.output_dir={tmp_path}"], _synth(tmp_path, "run.name=x")):
        proc = subprocess.run(
            [
                "sh",
                "-c",
                f'cd "{gone}" && rmdir "{gone}" && exec "$@"',
                "sh",
                sys.executable,
                "-m",
                "memrl.launch.cli",
                *argv,
            ],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        gone.mkdir()
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "the working folder no longer exists" in one_line(proc.stderr)
    assert not (tmp_path / "x").exists()


def _run_with_output_closed(argv: list[str], timeout: int) -> subprocess.CompletedProcess:
    """``argv >&- 2>&-``: the command with its stdout and stderr closed."""
    return subprocess.run(argv, cwd=ROOT, env=_env(), preexec_fn=lambda: (os.close(1), os.close(2)), timeout=timeout)


def test_a_closed_stdout_is_given_dev_null(tmp_path: Path) -> None:
    """``memrl config show >&-`` (sys.stdout is None) and ``memrl data synth >&- 2>&-``: exit 0, the files written;
    nothing of the run lands in a file that took descriptor 1."""
    cli = [sys.executable, "-m", "memrl.launch.cli"]
    closed = subprocess.run(
        [*cli, "config", "show", "--command", "data synth"],
        cwd=ROOT,
        env=_env(),
        preexec_fn=lambda: os.close(1),
        capture_output=False,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )
    assert closed.returncode == 0 and "Traceback" not in closed.stderr, closed.stderr[-2000:]
    synth = _run_with_output_closed([*cli, *_synth(tmp_path, "run.name=closed")], timeout=120)
    assert synth.returncode == 0 and (tmp_path / "closed" / "train.jsonl").is_file()
    log = (tmp_path / "closed" / "run.log").read_text()
    assert "Traceback" not in log and (tmp_path / "closed" / "config.yaml").read_text().startswith("command:")


# protects: memrl eval with a closed stdout or a closed pipe completes and writes its report
@pytest.mark.slow
def test_a_closed_stdout_or_a_closed_pipe_does_not_stop_an_eval(tmp_path: Path) -> None:
    """``memrl eval ... >&- 2>&-`` and ``memrl eval ... -v | head -c 1``: the eval completes (exit 0) and writes its
    report; its console output goes nowhere (the run's log has it)."""
    cli = [sys.executable, "-m", "memrl.launch.cli"]
    both = _run_with_output_closed([*cli, *_eval(tmp_path, "closed")], timeout=300)
    assert both.returncode == 0 and (tmp_path / "closed" / "report.md").is_file()
    reader = subprocess.Popen(
        [*cli, *_eval(tmp_path, "piped"), "-v"], cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert reader.stdout is not None
    reader.stdout.read(1)
    reader.stdout.close()  # the reader went away: every later write to the pipe is EPIPE
    assert reader.wait(timeout=300) == 0
    assert (tmp_path / "piped" / "report.md").is_file() and (tmp_path / "piped" / "summary.json").is_file()


# ----------------------------------------------------------------------------------------------------------------
# damaged model files for the converters


def test_from_gguf_refuses_damaged_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gguf = pytest.importorskip("gguf")
    import numpy as np

    whole = tmp_path / "whole.gguf"
    writer = gguf.GGUFWriter(str(whole), "llama")
    writer.add_uint32("llama.context_length", 128)
    writer.add_tensor("token_embd.weight", np.zeros((64, 64), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones((64,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    data = whole.read_bytes()
    files = {
        "text.gguf": (b"just some text\n", "not a GGUF file"),
        "empty.gguf": (b"", "an empty file (0 bytes)"),
        "garbage.gguf": (data[:40] + random.Random(0).randbytes(4000), "a damaged GGUF file"),
        "version.gguf": (b"GGUF" + (99).to_bytes(4, "little") + bytes(16), "version 99"),
        "counts.gguf": (
            b"GGUF" + (3).to_bytes(4, "little") + (2**60).to_bytes(8, "little") + bytes(8),
            "a damaged GGUF file",
        ),
        "cut.gguf": (data[: len(data) - 200], "cut short"),
    }
    from memrl.rollout.models import check_gguf_file

    check_gguf_file(whole)  # the whole file passes
    for name, (payload, expected) in files.items():
        (tmp_path / name).write_bytes(payload)
        assert main(["model", "from-gguf", str(tmp_path / name), "--out", str(tmp_path / f"out-{name}")]) == 2
        line = one_line(capsys.readouterr().err)
        assert line.startswith("memrl: error: ") and name in line and expected in line, (name, line)
        assert not (tmp_path / f"out-{name}").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out-")]


# ----------------------------------------------------------------------------------------------------------------
# the benchmarks' own inputs


def test_benchmark_progress_files_are_checked_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks.harness import check_bench_inputs

    good = tmp_path / "good.jsonl"
    good.write_text('{"key": "k", "variant": "oat", "seed": 0}\n{"key": "k", "variant": "sft", "se')  # torn tail ok
    check_bench_inputs(tmp_path, [good, tmp_path / "absent.jsonl"])
    cases = {
        "garbage.jsonl": (b"not json at all\n", "garbage.jsonl:1: invalid JSON"),
        "binary.jsonl": (b"\xff\xfe\x00\x81\x9c" * 40 + b"\n", "binary.jsonl:1: not UTF-8"),
        "list.jsonl": (b"[1, 2, 3]\n", "list.jsonl:1: expected a JSON object, got list"),
        "folder.jsonl": (None, "folder.jsonl is not a file"),
    }
    for name, (payload, expected) in cases.items():
        if payload is None:
            (tmp_path / name).mkdir()
        else:
            (tmp_path / name).write_bytes(payload)
        with pytest.raises(SystemExit) as caught:
            check_bench_inputs(tmp_path, [tmp_path / name])
        err = capsys.readouterr().err
        assert caught.value.code == 2 and expected in err and "--work" in err, err
    (tmp_path / "afile").write_text("x")
    with pytest.raises(SystemExit):
        check_bench_inputs(tmp_path / "afile", [])
    assert "a file, not a folder" in capsys.readouterr().err


@pytest.mark.parametrize("script", ["ablations", "credit_accuracy"])
def test_benchmarks_refuse_bad_work_folders_before_the_sft_start(script: str, tmp_path: Path) -> None:
    """Both scripts that rebuild the shared SFT start stop in seconds: exit 2, one line, no traceback, no model (the
    ablation also checks its progress file)."""
    (tmp_path / "afile").write_text("x")
    split = "test" if script == "ablations" else "dev"
    damaged = tmp_path / "w" / "multihop" / "quick" / split  # one folder per setting (the default: multihop)
    damaged.mkdir(parents=True)
    (damaged / "progress.jsonl").write_text("[1, 2]\n")
    cases = [(tmp_path / "afile", "a file, not a folder")]
    if script == "ablations":
        cases.append((tmp_path / "w", "progress.jsonl:1: expected a JSON object"))
    for work, expected in cases:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                f"benchmarks.{script}",
                "--quick",
                "--work",
                str(work),
                "--model-cache",
                str(tmp_path / "models"),
            ],
            cwd=ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert expected in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "models").exists()


# ----------------------------------------------------------------------------------------------------------------
# bounds on sizes


def test_config_file_size_and_list_lengths_are_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from memrl.data.config import MAX_CONFIG_BYTES, MAX_LIST_ITEMS

    big = tmp_path / "big.yaml"
    big.write_text("command: data synth\n" + "# padding\n" * (MAX_CONFIG_BYTES // 10 + 1))
    listed = tmp_path / "list.yaml"
    listed.write_text("command: data synth\nsources:\n" + "  - {family: sam, count: 1}\n" * (MAX_LIST_ITEMS + 1))
    cases = [
        (["data", "synth", "--config", str(big)], ["big.yaml", "refused before reading it"]),
        (["data", "synth", "--config", str(listed)], ["list.yaml:2", "'sources'", f"{MAX_LIST_ITEMS + 1:,} items"]),
        (
            ["data", "synth", f"histogram_bins=[{', '.join(['1'] * (MAX_LIST_ITEMS + 1))}]"],
            ["command-line override", "'histogram_bins'"],
        ),
    ]
    for argv, expected in cases:
        start = time.monotonic()
        assert main(argv) == 2
        line = one_line(capsys.readouterr().err)
        assert all(e in line for e in expected), (expected, line)
        assert time.monotonic() - start < 20
    ok = tmp_path / "ok.yaml"
    ok.write_text("command: data synth\nsources:\n" + "  - {family: sam, count: 1}\n" * 3)
    from memrl.data.config import load_config
    from memrl.data.synth import SynthConfig

    assert len(load_config(SynthConfig, ok).sources) == 3  # under the bounds: loads as before


_HUGE_LINE = """
import sys
from memrl.data.io import RecordError, iter_jsonl
from memrl.data.loaders.common import read_records
for reader in (lambda p: list(iter_jsonl(p)), lambda p: list(read_records(p))):
    try:
        reader(sys.argv[1])
    except RecordError as exc:
        print("REFUSED", exc)
# the peak of this process image (getrusage's ru_maxrss would carry the forking pytest's peak across exec)
print("MAXRSS_KIB", [line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")][0])
"""


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads the peak memory from /proc")
def test_a_1_gib_jsonl_line_is_refused_before_it_is_read_whole(tmp_path: Path) -> None:
    """A sparse 1 GiB file with one good record then a single line of zeros: both record readers refuse the line
    after 64 MiB of it (they read 3.4 GB before)."""
    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as fh:
        fh.write(b'{"episode_id": "a"}\n')
        fh.truncate(1 << 30)
    proc = subprocess.run(
        [sys.executable, "-c", _HUGE_LINE, str(path)], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300
    )
    refused = [line for line in proc.stdout.splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 2 and all("huge.jsonl:2: a line longer than 64.0 MiB" in r for r in refused), proc.stdout
    peak_mib = int(proc.stdout.split("MAXRSS_KIB ")[1].split()[0]) / 1024
    assert peak_mib < 400, peak_mib  # 165 MiB measured (64 MiB read, twice while the buffer grows)


def _amabench(episode_id: str, qa_ids: tuple[str | None, ...] = (None,), observation: str = "o") -> dict[str, Any]:
    return {
        "episode_id": episode_id,
        "trajectory": [{"turn_idx": 0, "action": "look", "observation": observation}],
        "qa_pairs": [{"question": "q", "answer": "a", **({"qa_id": q} if q else {})} for q in qa_ids],
    }


def _locomo(sample_id: str) -> dict[str, Any]:
    return {
        "sample_id": sample_id,
        "conversation": {
            "speaker_a": "A",
            "speaker_b": "B",
            "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "hi"}],
        },
        "qa": [{"question": "q", "answer": "a", "category": 1, "evidence": ["D1:1"]}],
    }


def test_duplicate_ids_and_huge_turns_in_benchmark_files_name_their_places(tmp_path: Path) -> None:
    from memrl.data.io import RecordError
    from memrl.data.loaders.common import MAX_TURN_CHARS
    from memrl.data.loaders.formats import load_amabench, load_locomo

    ama = tmp_path / "ama.jsonl"
    ama.write_text("\n".join(json.dumps(_amabench(i)) for i in ("e1", "e2", "e1")) + "\n")
    with pytest.raises(RecordError, match=r"ama.jsonl:3: episode id 'e1' again \(first at .*ama.jsonl:1\)"):
        load_amabench(ama)
    locomo = tmp_path / "locomo.json"
    locomo.write_text("[\n" + ",\n".join(json.dumps(_locomo(i)) for i in ("c1", "c1")) + "\n]\n")
    with pytest.raises(RecordError, match=r"locomo.json:3: episode id 'c1' again \(first at .*locomo.json:2\)"):
        load_locomo(locomo)
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps(_amabench("e1", ("q1", "q2", "q1"))) + "\n")
    with pytest.raises(RecordError, match=r"questions.jsonl:1: field 'qa_pairs\[2\].qa_id': 'q1' again"):
        load_amabench(questions)
    turn = tmp_path / "turn.jsonl"
    turn.write_text(json.dumps(_amabench("e1", observation="x" * (MAX_TURN_CHARS - 3))) + "\n")  # + "look"
    with pytest.raises(RecordError, match=r"turn.jsonl:1: field 'trajectory\[0\]': a turn of 1,000,001 characters"):
        load_amabench(turn)
    distinct = tmp_path / "distinct.jsonl"
    distinct.write_text("\n".join(json.dumps(_amabench(i, ("q1", "q2"))) for i in ("e1", "e2")) + "\n")
    assert [e.episode_id for e in load_amabench(distinct)] == ["e1", "e2"]


def test_fleet_workers_beyond_the_cores_warn_with_the_numbers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from memrl.data.errors import UserError
    from memrl.launch.preflight import MAX_WORKERS_PER_CORE, _check_fleet_size
    from memrl.rollout.fleet import FleetConfig

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    with caplog.at_level(logging.WARNING):
        _check_fleet_size(FleetConfig(workers=2, cpus_per_worker=1.0), "fleet")
        assert not caplog.text
        _check_fleet_size(FleetConfig(workers=5, cpus_per_worker=1.0), "fleet")
    assert "fleet.workers=5 x fleet.cpus_per_worker=1 asks for 5 CPUs on a machine with 2 cores" in caplog.text
    with pytest.raises(UserError, match=f"fleet.workers=100: .* on 2 cores \\(at most {MAX_WORKERS_PER_CORE} per"):
        _check_fleet_size(FleetConfig(workers=100), "fleet")
    _check_fleet_size(FleetConfig(workers=100, address="ray://head:10001"), "fleet")  # a cluster: its own cores


# ----------------------------------------------------------------------------------------------------------------
# config bounds at their edges (acceptance 7)


def test_seed_and_upper_bounds_at_their_edges() -> None:
    from memrl.data.config import ConfigError, PolicyPlacement, RunConfig, load_config
    from memrl.rollout.engines.config import EngineConfig
    from memrl.train.export import VerifyConfig
    from memrl.train.group_trainer import GroupTrainerConfig

    for cls, key in ((RunConfig, "seed"), (GroupTrainerConfig, "seed"), (EngineConfig, "seed")):
        base = {"backend": "scripted"} if cls is EngineConfig else {}
        assert getattr(cls.model_validate({**base, key: 2**32 - 1}), key) == 2**32 - 1
        assert getattr(cls.model_validate({**base, key: 0}), key) == 0
        for bad in (2**32, -1):
            with pytest.raises(ValueError, match=key):
                cls.model_validate({**base, key: bad})
    for cls, key in (
        (PolicyPlacement, "gpu_memory_utilization"),
        (EngineConfig, "gpu_memory_utilization"),
        (VerifyConfig, "vllm_gpu_memory_utilization"),
    ):
        base = {"backend": "vllm", "model": "m"} if cls is EngineConfig else {}
        assert getattr(cls.model_validate({**base, key: 1.0}), key) == 1.0
        for bad in (1.0000001, 0.0, -0.5):
            with pytest.raises(ValueError, match=key):
                cls.model_validate({**base, key: bad})
    from memrl.data.synth import SynthConfig

    with pytest.raises(ConfigError, match=r"run\.seed"):
        load_config(SynthConfig, None, [f"run.seed={2**32}"])


def test_the_largest_seed_runs(tmp_path: Path, tiny_model_dir: Path, sft_data: Path) -> None:
    """run.seed = 2**32 - 1 passes validation, so it must run: data synth, and an SFT step (transformers' set_seed,
    numpy and the data shuffle take it)."""
    seed = f"run.seed={2**32 - 1}"
    assert main(_synth(tmp_path, "run.name=synth", seed)) == 0
    assert (
        main(
            [*_sft(tiny_model_dir, sft_data, tmp_path), "train.max_steps=1", "train.save_steps=0", seed, "run.name=sft"]
        )
        == 0
    )
    assert (tmp_path / "sft" / "final" / "model.safetensors").is_file()


def test_a_resume_that_forgets_the_trainer_rng_is_caught(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several optimizer steps per batch (2 epochs x 3 steps): the row order comes from the trainer's RNG, so a run
    stopped after its first iteration and resumed ends on the uninterrupted run's weights only if the checkpoint
    carried that RNG. A resume that forgets it (set_rng_state a no-op) ends elsewhere: this test would fail."""
    import torch
    from test_group_trainer import checkpointed_updates, groups_for

    from memrl.train.group_trainer import GroupTrainer, GroupTrainerConfig
    from memrl.train.policy import LoraSettings, PolicySpec

    def run(name: str, stop_after: int | None, resume: bool = False) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        trainer = GroupTrainer(
            PolicySpec(base=str(tiny_model_dir)),
            GroupTrainerConfig(
                lr=5e-3, lora=LoraSettings(r=4, alpha=8), update_epochs=2, optimizer_steps_per_epoch=3, probe_rows=0
            ),
        )
        groups = groups_for(trainer.tokenizer, "the red key is in drawer 5", "nothing relevant", n_groups=6)
        for k, group in enumerate(groups):  # rows that differ, so their order changes the steps
            group.samples[0].response_ids = group.samples[0].response_ids[: 3 + k]
        checkpointed_updates(trainer, groups, tmp_path / name, stop_after, resume)
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}

    def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
        return all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-7) for k in a)

    whole = run("whole", None)
    run("stopped", 0)
    assert same(run("stopped", None, resume=True), whole)
    run("forgetful", 0)
    monkeypatch.setattr(GroupTrainer, "set_rng_state", lambda self, state: None)
    assert not same(run("forgetful", None, resume=True), whole)
