"""The script sandbox: every violation is stopped and reported as a status, never raised, and the caller goes on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memrl.rollout.memory.sandbox import SandboxConfig, run_script

TRAJECTORY = [
    {"turn_idx": 0, "action": "look", "observation": "a red key"},
    {"turn_idx": 1, "action": "take key", "observation": "you hold the red key"},
]
# Generous wall time: the interpreter starts on a shared, busy machine; only the two timeout cases wait it out.
FAST = SandboxConfig(time_limit_s=3.0, memory_limit_mb=256)


def test_a_script_reads_the_trajectory_and_writes_in_its_directory() -> None:
    source = (
        "import json, os\n"
        "turns = json.load(open('trajectory.json'))\n"
        "open('notes.txt', 'w').write('scratch')\n"
        "print([t['turn_idx'] for t in turns if 'key' in t['observation']], sorted(os.listdir('.')))\n"
    )
    result = run_script(source, TRAJECTORY, FAST)
    assert result.status == "ok" and result.returncode == 0
    assert result.stdout.strip() == "[0, 1] ['notes.txt', 'script.py', 'trajectory.json']"


@pytest.mark.parametrize(
    ("source", "status", "detail"),
    [
        ("import socket\ns = socket.socket()\nprint('connected')", "network", "socket.__new__"),
        (
            "try:\n    import socket; socket.create_connection(('10.0.0.1', 80), timeout=1)\nexcept OSError:\n"
            "    print('caught')\nprint('went on')",
            "network",
            "socket",
        ),
        ("while True:\n    pass", "timeout", "wall-time"),
        ("import time\ntime.sleep(60)", "timeout", "wall-time"),
        ("block = bytearray(1 << 30)\nprint(len(block))", "memory", "MemoryError"),
        ("chunks = []\nwhile True:\n    chunks.append(bytearray(8 << 20))", "memory", "MemoryError"),
        ("open('/tmp/memrl-sandbox-escape.txt', 'w').write('x')", "fs_violation", "write /tmp/memrl-sandbox-escape"),
        ("open('../escape.txt', 'a').write('x')", "fs_violation", "write"),
        ("import os\nos.remove('/tmp/anything')", "fs_violation", "os.remove"),
        ("print(open('/etc/hostname').read())", "fs_violation", "read /etc/hostname"),
        ("open('big.bin', 'wb').write(bytes(32 << 20))", "fs_violation", "file-size limit"),
        ("import subprocess\nsubprocess.run(['true'])", "forbidden", "subprocess.Popen"),
        ("import os\nos.system('true')", "forbidden", "os.system"),
        ("import ctypes", "forbidden", "import ctypes"),
        ("raise ValueError('boom')", "error", "ValueError: boom"),
    ],
)
def test_each_violation_is_stopped_and_reported(source: str, status: str, detail: str) -> None:
    result = run_script(source, TRAJECTORY, FAST)
    assert result.status == status, (result.detail, result.stderr)
    assert detail in result.detail
    assert "connected" not in result.stdout and "went on" not in result.stdout
    assert not Path("/tmp/memrl-sandbox-escape.txt").exists()
    again = run_script("print('next')", TRAJECTORY, FAST)  # the caller goes on
    assert again.status == "ok" and again.stdout == "next\n"


def test_the_audit_hook_alone_stops_the_network() -> None:
    bare = SandboxConfig(time_limit_s=3.0, isolate_network=False, drop_privileges=False)
    result = run_script("import socket\nsocket.socket().connect(('127.0.0.1', 9))", TRAJECTORY, bare)
    assert result.status == "network" and result.isolation == "audit-hook"


def test_isolation_layers_are_reported() -> None:
    result = run_script("print(1)", [], FAST)
    assert result.isolation.startswith("audit-hook")
    if os.geteuid() == 0:
        assert "+nobody" in result.isolation
