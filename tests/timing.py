"""Timeouts for tests that must pass on a loaded machine (a contributor's laptop, a shared CI runner): a test waits
on a condition, and the timeout it allows the condition grows with the load measured when it starts."""

from __future__ import annotations

import os


def load_factor() -> float:
    """How loaded this machine is: runnable processes per core over the last minute, at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1.0, os.getloadavg()[0] / cores)


def scaled(seconds: float, cap: float = 600.0) -> float:
    """A timeout that grows with the machine's load: ``seconds`` on a quiet machine, at most ``cap``."""
    return min(cap, seconds * load_factor())
