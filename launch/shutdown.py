"""One shutdown path for every command: SIGINT, SIGTERM and SIGHUP (the terminal closed) end a run the same way.

:func:`handle_signals` turns SIGTERM and SIGHUP into :class:`Terminated` (a ``KeyboardInterrupt``, as Python turns
SIGINT), raised
in the main thread wherever it is: the current step is abandoned, and since checkpoints are written into a
temporary folder and renamed into place, the run folder keeps its newest complete checkpoint (``--resume`` continues
from it). :func:`stop_children` then stops the Ray fleet this process started (``ray.shutdown``) and every child
process left (vLLM engine processes, accelerate helpers), walking the process tree; the CLI prints one line and exits
130 (SIGINT), 143 (SIGTERM) or 129 (SIGHUP), decided by the signal received (Ray's ``ray.get`` re-raises the
interrupt as a plain ``KeyboardInterrupt``). A second signal during the shutdown skips what is left of it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["Terminated", "exit_code", "handle_signals", "stop_children"]

CHILD_GRACE_S = 5.0  # how long children get to exit after SIGTERM before SIGKILL


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM (raised like ``KeyboardInterrupt`` so every ``finally`` runs)."""

    signum = signal.SIGTERM


_received: list[int] = []  # the signals :func:`handle_signals` received in its latest block


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal number: 130 for SIGINT (Ctrl-C), 143 for SIGTERM. The signal received decides, not the
    exception's type: a library that catches the interrupt and raises its own ``KeyboardInterrupt`` (Ray's
    ``ray.get`` does, on the fleet path) must not turn a SIGTERM into 130."""
    if _received:  # the signal that started the shutdown; read once
        signum = _received[0]
        _received.clear()
        return 128 + signum
    return 128 + int(getattr(interrupt, "signum", signal.SIGINT))


@contextlib.contextmanager
def handle_signals() -> Iterator[None]:
    """Within the block SIGTERM and SIGHUP raise :class:`Terminated` and SIGINT ``KeyboardInterrupt``; the first
    signal starts the shutdown, a second one during it ends the process at once (children are still stopped)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = _received
    received.clear()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if received:  # impatient: skip the rest of the shutdown
            stop_children(grace_s=0.5)
            os._exit(128 + received[0])
        received.append(signum)
        raise Terminated() if signum in (signal.SIGTERM, signal.SIGHUP) else KeyboardInterrupt()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop_children(grace_s: float = CHILD_GRACE_S) -> None:
    """Stop the local Ray cluster this process started (its actors included) and every process still below this one:
    SIGTERM, then SIGKILL after ``grace_s``. Safe to call more than once."""
    ray = sys.modules.get("ray")
    if ray is not None:
        with contextlib.suppress(Exception):
            if ray.is_initialized():
                ray.shutdown()
    import psutil

    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=grace_s)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(alive, timeout=grace_s)
