"""A real vLLM OpenAI-compatible server on a local model, for the slow tests that talk to one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port(count: int = 1) -> int:
    """A port P such that P..P+count-1 are free now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count >= 65535:
            continue
        try:
            socks = []
            for p in range(base, base + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError("no free port range")


SERVE_SCRIPT = ROOT / "launch" / "serve_endpoints.sh"


def serve_script(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``launch/serve_endpoints.sh ARGS`` with this interpreter, its output captured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM") and k != "CUDA_VISIBLE_DEVICES"}
    env["MEMRL_PYTHON"] = sys.executable
    return subprocess.run(
        ["bash", str(SERVE_SCRIPT), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@contextmanager
def vllm_server(model_dir: Path, work: Path, *vllm_args: str) -> Iterator[str]:
    """Serve ``model_dir`` as ``tiny`` on one CPU server on 127.0.0.1 until the block ends, started, awaited and
    stopped by ``launch/serve_endpoints.sh`` (the command line a user runs; ``vllm_args`` go after its ``--``); yields
    the ``/v1`` base URL. Each step of the script must succeed, and after ``stop`` no process of the server may be
    left. The server's log is under ``work/logs`` (its tail is in the error when it does not become healthy)."""
    import psutil

    port = free_port()
    pid_file = work / "serve.pid"
    url = f"http://127.0.0.1:{port}/v1"
    started = serve_script(
        "start", "--pid-file", str(pid_file), "--model", str(model_dir), "--served-model-name", "tiny",
        "--device", "cpu", "--host", "127.0.0.1", "--port", str(port), "--log-dir", str(work / "logs"),
        *vllm_args,
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    runner = psutil.Process(int(pid_file.read_text()))
    try:
        ready = serve_script("wait", "--timeout", "600", "--watch-pid", str(runner.pid), url, timeout=700)
        logs = "".join(p.read_text()[-3000:] for p in (work / "logs").glob("*.log"))
        assert ready.returncode == 0, ready.stdout + ready.stderr + logs
        yield url
    finally:
        server = [runner, *runner.children(recursive=True)] if runner.is_running() else []
        stopped = serve_script("stop", "--pid-file", str(pid_file), timeout=200)
    assert stopped.returncode == 0 and not pid_file.exists(), stopped.stdout + stopped.stderr
    _, alive = psutil.wait_procs(server, timeout=10)
    alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left after serve_endpoints.sh stop: {alive}"
