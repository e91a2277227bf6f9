"""The CLI's logging set-up: what a job shows on the console and what goes to its ``run.log``.

The console shows memrl's records (banners, per-step metrics lines, results: the ``memrl`` logger) and memrl's
progress bars. ``run.log`` gets every log record, memrl's and third-party ones, Python warnings, and, unless
``--verbose``, everything written to file descriptors 1 and 2: third-party prints and progress bars, and the output of
C++ code and child processes (vLLM, Ray). With ``--verbose`` file descriptors 1 and 2 stay on the console, and
third-party log records of level WARNING and above are shown there too.

The console streams are duplicates of the terminal's descriptors taken before they are redirected. Nothing here
replaces ``sys.stdout`` or ``sys.stderr``, and the console streams forward to them once the command is over, so a
library that kept a reference to either (an ``atexit`` hook, a logging handler) never writes to a closed file.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from memrl.data.tracking import ConsoleHandler, RunLog

__all__ = ["console"]


class _ConsoleStream(io.TextIOBase):
    """A text stream on what ``stream`` shows now (a duplicate of its file descriptor, unaffected by the redirection
    of descriptors 1 and 2), which forwards to ``stream`` itself after :meth:`detach`."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.own: TextIO | None = None
        self.gone = False
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, io.UnsupportedOperation):  # an in-memory stream (pytest's capsys)
            return
        self.own = os.fdopen(
            os.dup(fd), "w", buffering=1, encoding=getattr(stream, "encoding", None) or "utf-8", errors="replace"
        )

    @property
    def target(self) -> TextIO:
        """The stream writes go to now."""
        return self.own if self.own is not None else self.stream

    def write(self, text: str) -> int:
        """Write to the console; a console that went away (a closed pipe: ``memrl ... | head``, a terminal that
        closed) is dropped, not an error: the run goes on, its ``run.log`` has every line."""
        if self.gone:
            return len(text)
        try:
            return self.target.write(text)
        except (OSError, ValueError, AttributeError):  # EPIPE, EBADF, a closed file, no stream at all
            self._drop()
            return len(text)

    def flush(self) -> None:
        """Flush the console."""
        if self.gone:
            return
        try:
            self.target.flush()
        except (OSError, ValueError, AttributeError):
            self._drop()

    def _drop(self) -> None:
        self.gone = True
        own, self.own = self.own, None
        if own is not None:
            with contextlib.suppress(OSError, ValueError):
                os.close(own.fileno())  # close without flushing what can no longer be written

    def isatty(self) -> bool:
        """Whether the console is a terminal (tqdm draws in place only there)."""
        try:
            return not self.gone and self.stream.isatty()
        except (OSError, ValueError, AttributeError):
            return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        """The console's encoding."""
        return getattr(self.stream, "encoding", None) or "utf-8"

    def detach(self) -> None:
        """Close the duplicate; later writes go to the original stream."""
        own, self.own = self.own, None
        if own is not None:
            with contextlib.suppress(OSError, ValueError):
                own.flush()
            with contextlib.suppress(OSError, ValueError):
                own.close()


class _ThirdParty(logging.Filter):
    """Records of loggers outside memrl (memrl's own are on the console already)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether the record comes from outside memrl."""
        return not record.name.startswith("memrl")


@contextlib.contextmanager
def console(verbose: bool = False) -> Iterator[None]:
    """Set up memrl's console and the run log for one command (see the module docstring); undone on exit."""
    root, memrl = logging.getLogger(), logging.getLogger("memrl")
    out, err = _ConsoleStream(sys.stdout), _ConsoleStream(sys.stderr)
    shown = ConsoleHandler(out, err)
    shown.setFormatter(logging.Formatter("%(message)s"))
    installed: list[tuple[logging.Logger, logging.Handler]] = [(memrl, shown)]
    if verbose:
        third_party = logging.StreamHandler(err)
        third_party.setLevel(logging.WARNING)
        third_party.addFilter(_ThirdParty())
        installed.append((root, third_party))
    run_log = RunLog(capture_fds=not verbose)
    installed.append((root, run_log))
    levels: dict[logging.Logger, Any] = {root: root.level, memrl: memrl.level}
    root.setLevel(logging.INFO)
    memrl.setLevel(logging.INFO)
    logging.captureWarnings(True)
    for logger, handler in installed:
        logger.addHandler(handler)
    try:
        yield
    finally:
        for logger, handler in installed:
            logger.removeHandler(handler)
        run_log.finish()
        logging.captureWarnings(False)
        for logger, level in levels.items():
            logger.setLevel(level)
        out.detach()
        err.detach()
