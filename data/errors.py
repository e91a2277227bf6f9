"""The one exception type for expected failures: something the user gave (a config value, a data record, a model
path, an output folder) cannot be used. The CLI prints its message, which says what to fix, as one paragraph and
exits with code 2; anything else is a bug and gets a traceback (in the run's log file)."""

from __future__ import annotations

__all__ = ["RunFault", "UserCodeError", "UserError"]


class UserError(Exception):
    """A problem with the user's input; the message names the file/line/key/path and the fix."""


class RunFault(UserError):
    """A fault of what the run stands on, met while it runs (a full disk, an endpoint that keeps failing after its
    retries, a working folder deleted under it): one message and exit 2 as for bad input, but what the run already
    saved is kept (a failed start's folder is removed; a run that met a fault later is continued with --resume)."""


class UserCodeError(UserError):
    """The user's own code (a component a config names: an environment, an episode function, an HTTP agent's process,
    a memory system, a reward term) failed where every episode would fail the same way: at import, in its constructor,
    a reward term that raised or returned a non-number, an agent process that exited, a result of the wrong type. The
    message names the component (its import path), the call and the episode; ``frames`` holds the last frames of the
    user's traceback (the CLI shows them below the message) and ``details`` the whole traceback (written to the run's
    log). Exit code 2, as for bad input."""

    def __init__(self, message: str, *, frames: str = "", details: str = "") -> None:
        super().__init__(message)
        self.frames, self.details = frames, details
