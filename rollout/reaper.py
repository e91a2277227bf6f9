"""The fleet's reaper: a small process that outlives its driver by a moment and stops every process the driver left.

A local Ray cluster started by the driver (``ray.init`` without an address) runs its rollout workers in their own
process groups, below the raylet; Ray's agents survive a ``kill -9`` of the driver, and a SIGTERM to the driver's
process group misses the workers. :func:`start_reaper` starts ``python -m memrl.rollout.reaper`` in its own session
(a signal to the driver's group does not reach it) with a pipe from the driver: it records the driver's process tree
every ``interval_s`` and, when the pipe closes (the driver exited, however it ended), sends SIGTERM and then SIGKILL to
every recorded process still alive (matched by pid and start time, so a recycled pid is never hit) and to what they
started since. The fleet starts it before ``ray.init``, so a kill during Ray's start-up leaves nothing either.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

__all__ = ["start_reaper"]

INTERVAL_S = 0.5
GRACE_S = 3.0


def start_reaper(driver_pid: int | None = None) -> subprocess.Popen[bytes]:
    """Start the reaper of ``driver_pid`` (default: this process); it lives until this process's end."""
    pid = os.getpid() if driver_pid is None else driver_pid
    return subprocess.Popen(
        [sys.executable, "-m", "memrl.rollout.reaper", str(pid)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _tree(driver: int) -> dict[int, float]:
    import psutil

    try:
        children = psutil.Process(driver).children(recursive=True)
    except psutil.Error:
        return {}
    out = {}
    for child in children:
        try:
            out[child.pid] = child.create_time()
        except psutil.Error:
            continue
    out.pop(os.getpid(), None)
    return out


def _reap(recorded: dict[int, float]) -> None:
    import psutil

    procs = {}
    for pid, started in recorded.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == started:
                procs[pid] = proc
                # what a recorded process started after the last record (a raylet's new worker) goes with it
                procs.update({child.pid: child for child in proc.children(recursive=True)})
        except psutil.Error:
            continue
    procs.pop(os.getpid(), None)
    for proc in procs.values():
        try:
            proc.terminate()
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(list(procs.values()), timeout=GRACE_S)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            continue


def main(driver: int) -> None:
    """Record ``driver``'s process tree until stdin closes, then stop what it recorded."""
    recorded: dict[int, float] = {}
    stdin = sys.stdin.buffer
    while True:
        ready, _, _ = select.select([stdin], [], [], INTERVAL_S)
        if ready and not os.read(stdin.fileno(), 4096):
            break  # the driver is gone
        # keep processes that left the tree (reparented to init when their parent died) until the end
        recorded.update(_tree(driver))
    time.sleep(0.2)  # the processes that notice the driver's end by themselves go first
    _reap(recorded)


if __name__ == "__main__":
    main(int(sys.argv[1]))
