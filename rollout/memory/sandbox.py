"""A best-effort sandbox for model-written scripts (AMA-Agent's keyword/script search tool: "AMA-Bench: Evaluating
Long-Horizon Memory for Agentic Applications" (arXiv 2602.22769), section 5.2).

:func:`run_script` runs a Python script in a child process and always returns a :class:`SandboxResult`; it never
raises into the caller. Limits, each stopped and reported with its own status:

- wall time: the child runs in its own session and the whole process group is killed at ``time_limit_s``
  (plus ``RLIMIT_CPU`` as a backstop) -> ``timeout``;
- memory: ``RLIMIT_AS``; an allocation past it raises ``MemoryError`` in the child -> ``memory``;
- network: the child runs inside a fresh network namespace (``unshare -n``, only a down loopback) when the host
  allows it, and an audit hook (PEP 578, cannot be removed once installed) stops socket creation, DNS look-ups and
  connects at the first attempt -> ``network``;
- filesystem: the script starts in a fresh temporary directory holding only ``script.py`` and the input JSON file; the
  audit hook stops opening any file for writing outside that directory, opening any file for reading outside it and
  the Python standard library, listing other directories, and removing/renaming/linking/chmod-ing paths outside it;
  ``RLIMIT_FSIZE`` caps the size of any file (and of stdout/stderr) -> ``fs_violation``;
- processes and native code: ``fork``/``exec``/``subprocess``/``os.system``/``kill`` and ``ctypes``/``cffi`` are
  stopped -> ``forbidden``;
- when the parent runs as root the child drops to the ``nobody`` user after entering the namespace, so the kernel
  also refuses writes to files it does not own.

Resource limits are set by the child's bootstrap before any user code runs, not in a ``preexec_fn``: Python code
between fork and exec can deadlock when the parent has threads (engines and tokenizers do).

This is not a security boundary against a determined attacker: audit hooks live inside the interpreter they guard
(code that reaches raw memory can disable them), C-level file access made by the interpreter itself is not audited,
and without namespaces or root the network and user isolation fall back to the hook alone
(``SandboxResult.isolation`` says which layers were active). It keeps honest-but-buggy model-written scripts from
hanging, exhausting memory, touching the network or the filesystem, or reading other files (e.g. gold answers).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from memrl.data.config import ConfigModel

__all__ = ["SandboxConfig", "SandboxResult", "SandboxStatus", "run_script"]

SandboxStatus = Literal["ok", "timeout", "memory", "network", "fs_violation", "forbidden", "error"]


class SandboxConfig(ConfigModel):
    """Limits of one sandboxed script run."""

    time_limit_s: float = 5.0  # wall-time limit, seconds
    memory_limit_mb: int = 512  # address-space limit (RLIMIT_AS), MiB
    file_size_limit_mb: int = 8  # largest file (and stdout/stderr) it may write, MiB
    max_open_files: int = 64  # open file descriptors at most
    max_output_chars: int = 8000  # stdout and stderr read back up to this many characters
    isolate_network: bool = True  # enter a fresh network namespace when the host allows it
    drop_privileges: bool = True  # run as `nobody` when the parent is root


@dataclass
class SandboxResult:
    """What a sandboxed run produced. ``status`` is ``ok`` only when the script exited 0 within every limit."""

    status: SandboxStatus
    stdout: str
    stderr: str
    returncode: int | None
    detail: str
    duration_s: float
    isolation: str

    @property
    def ok(self) -> bool:
        """True when the script ran to completion within every limit."""
        return self.status == "ok"


# The child's bootstrap: drop privileges, install the audit hook, then run the user's script. A violation writes
# "<status>: <what>" to the report fd and ends the process with os._exit, so user code cannot catch and continue.
_BOOTSTRAP = r"""
import os, sys
_report_fd, _workdir, _script = int(sys.argv[1]), sys.argv[2], sys.argv[3]
_uid, _gid = int(sys.argv[4]), int(sys.argv[5])
import resource
for _name, _value in zip(("RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_CPU", "RLIMIT_CORE", "RLIMIT_NOFILE"), sys.argv[6:11]):
    resource.setrlimit(getattr(resource, _name), (int(_value), int(_value)))
import traceback
if _uid >= 0:
    # After the drop the standard library may be unreadable (e.g. under /root): import what analysis scripts use now.
    import json, re, math, collections, itertools, functools, statistics, string, datetime, heapq, bisect, csv
    import textwrap, difflib, operator, copy, typing, dataclasses, enum, io, unicodedata, time, glob, fnmatch
    import encodings.idna, encodings.ascii, encodings.latin_1
    import socket, subprocess  # so that a script using them meets the hook (network/forbidden), not an ImportError
_exit, _write, _fspath, _getcwd = os._exit, os.write, os.fspath, os.getcwd
_realpath, _join = os.path.realpath, os.path.join
_sep = os.sep
if _uid >= 0 and os.getuid() == 0:
    try:
        os.setgroups([]); os.setgid(_gid); os.setuid(_uid)
    except OSError:
        pass
os.chdir(_workdir)
_root = _realpath(_workdir)
_read_roots = tuple(_realpath(p) for p in sys.path if p) + ("/dev/null", "/dev/urandom")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_NETWORK = {"socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
            "socket.gethostbyaddr", "socket.getnameinfo", "socket.sendto", "socket.sendmsg"}
_FORBIDDEN = {"os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen",
              "os.kill", "os.killpg", "pty.spawn", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdll.LoadLibrary",
              "ctypes.dll.LoadLibrary", "os.startfile", "sys.remote_exec", "os.setuid", "os.setgid"}
_FS_MUTATE = {"os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.symlink", "os.link", "os.chmod", "os.chown",
              "os.truncate", "os.utime", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr",
              "shutil.rmtree", "shutil.chown", "os.chdir"}
_FS_LIST = {"os.listdir", "os.scandir", "glob.glob", "os.listxattr"}
_BLOCKED_IMPORTS = {"ctypes", "_ctypes", "cffi", "_posixsubprocess"}

def _violate(kind, what):
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    _write(_report_fd, (kind + ": " + what).encode("utf-8", "replace")[:500])
    _exit(70)

def _resolve(path):
    if isinstance(path, bytes):
        path = path.decode("utf-8", "replace")
    path = _fspath(path)
    return _realpath(path if path.startswith(_sep) else _join(_getcwd(), path))

def _inside(path, roots):
    return any(path == r or path.startswith(r.rstrip(_sep) + _sep) for r in roots)

def _paths(args):
    for a in args:
        if isinstance(a, (str, bytes)) or hasattr(a, "__fspath__"):
            yield a

def _hook(event, args):
    if event == "open":
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        if path is None or isinstance(path, int):
            return
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
        where = _resolve(path)
        if writing and not _inside(where, (_root,)):
            _violate("fs_violation", "write " + where)
        if not writing and not _inside(where, (_root,) + _read_roots):
            _violate("fs_violation", "read " + where)
    elif event in _NETWORK:
        _violate("network", event)
    elif event in _FORBIDDEN:
        _violate("forbidden", event)
    elif event in _FS_MUTATE:
        for p in _paths(args):
            where = _resolve(p)
            if not _inside(where, (_root,)):
                _violate("fs_violation", event + " " + where)
    elif event in _FS_LIST:
        for p in _paths(args):
            where = _resolve(p)
            if not _inside(where, (_root,) + _read_roots):
                _violate("fs_violation", event + " " + where)
    elif event == "import" and args and str(args[0]).split(".")[0] in _BLOCKED_IMPORTS:
        _violate("forbidden", "import " + str(args[0]))

sys.dont_write_bytecode = True
with open(_script, encoding="utf-8") as _f:
    _source = _f.read()
_code = compile(_source, "script.py", "exec")
sys.argv = ["script.py"]
sys.addaudithook(_hook)
try:
    exec(_code, {"__name__": "__main__", "__builtins__": __builtins__})
except MemoryError:
    _violate("memory", "MemoryError")
except SystemExit:
    raise
except BaseException:
    traceback.print_exc()
    sys.stderr.flush()
    _exit(1)
"""


@lru_cache(maxsize=1)
def _unshare_prefix() -> tuple[str, ...] | None:
    """The command prefix that enters a fresh network namespace here, or None when the host does not allow it."""
    exe = shutil.which("unshare")
    if exe is None:
        return None
    for prefix in ((exe, "-n"), (exe, "-r", "-n")):
        try:
            probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0:
            return prefix
    return None


def _nobody() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


def _limits(config: SandboxConfig) -> list[str]:
    """RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_CPU, RLIMIT_CORE and RLIMIT_NOFILE values, in the bootstrap's order."""
    cpu = math.ceil(config.time_limit_s) + 1
    return [
        str(v) for v in (config.memory_limit_mb << 20, config.file_size_limit_mb << 20, cpu, 0, config.max_open_files)
    ]


def _read(path: Path, limit: int) -> str:
    with open(path, "rb") as f:
        data = f.read(limit * 4 + 4)
    text = data.decode("utf-8", "replace")
    return text if len(text) <= limit else text[:limit] + "\n[output truncated]"


def run_script(
    source: str, inputs: Any, config: SandboxConfig | None = None, input_name: str = "trajectory.json"
) -> SandboxResult:
    """Run ``source`` as ``script.py`` in a fresh directory that holds only ``input_name`` (``inputs`` as JSON)."""
    config = config or SandboxConfig()
    start = time.monotonic()
    isolation = "audit-hook"
    private = None
    try:
        private = Path(tempfile.mkdtemp(prefix="memrl-sandbox-"))
        workdir = private / "work"
        workdir.mkdir()
        (workdir / "script.py").write_text(source, encoding="utf-8")
        (workdir / input_name).write_text(json.dumps(inputs, ensure_ascii=False), encoding="utf-8")
        uid, gid = -1, -1
        if config.drop_privileges and os.geteuid() == 0:
            uid, gid = _nobody()
            os.chmod(private, 0o711)  # `nobody` may traverse to its workdir but not list the outputs beside it
            os.chown(workdir, uid, gid)
            for child in workdir.iterdir():
                os.chown(child, uid, gid)
            isolation += "+nobody"
        prefix: tuple[str, ...] = ()
        if config.isolate_network:
            found = _unshare_prefix()
            if found is not None:
                prefix = found
                isolation += "+netns"
        python = getattr(sys, "_base_executable", None) or sys.executable
        out_path, err_path, report_path = private / "stdout", private / "stderr", private / "report"
        with open(out_path, "wb") as out, open(err_path, "wb") as err, open(report_path, "wb") as report:
            cmd = [
                *prefix,
                python,
                "-I",
                "-S",
                "-B",
                "-c",
                _BOOTSTRAP,
                str(report.fileno()),
                str(workdir),
                str(workdir / "script.py"),
                str(uid),
                str(gid),
                *_limits(config),
            ]
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=workdir,
                start_new_session=True,
                pass_fds=(report.fileno(),),
                env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
            )
            timed_out = False
            try:
                proc.wait(timeout=config.time_limit_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        stdout = _read(out_path, config.max_output_chars)
        stderr = _read(err_path, config.max_output_chars)
        report_text = report_path.read_text(encoding="utf-8", errors="replace").strip()
        status, detail = _classify(proc.returncode, timed_out, report_text, stderr, config)
        return SandboxResult(status, stdout, stderr, proc.returncode, detail, time.monotonic() - start, isolation)
    except Exception as exc:  # the harness must go on whatever happened here
        return SandboxResult(
            "error", "", "", None, f"sandbox failure: {type(exc).__name__}: {exc}", time.monotonic() - start, isolation
        )
    finally:
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)


def _classify(
    returncode: int, timed_out: bool, report: str, stderr: str, config: SandboxConfig
) -> tuple[SandboxStatus, str]:
    if timed_out:
        return "timeout", f"killed after the {config.time_limit_s:g} s wall-time limit"
    if report:
        kind, _, what = report.partition(":")
        if kind in ("network", "fs_violation", "forbidden", "memory"):
            return kind, what.strip()  # type: ignore[return-value]
    if returncode < 0:
        sig = -returncode
        if sig == signal.SIGXCPU:
            return "timeout", "CPU-time limit reached"
        if sig == signal.SIGXFSZ:
            return "fs_violation", f"file-size limit of {config.file_size_limit_mb} MiB reached"
        if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
            return "memory", f"killed by signal {sig} after running out of memory"
        return "error", f"killed by signal {sig}"
    if "MemoryError" in stderr:
        return "memory", "MemoryError"
    if "File too large" in stderr:
        return "fs_violation", f"file-size limit of {config.file_size_limit_mb} MiB reached"
    if returncode != 0:
        last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        return "error", f"exit code {returncode}" + (f": {last}" if last else "")
    return "ok", ""
