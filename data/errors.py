"""The one exception type for expected failures: something the user gave (a config value, a data record, a model
path, an output folder) cannot be used. The CLI prints its message, which says what to fix, as one paragraph and
exits with code 2; anything else is a bug and gets a traceback (in the run's log file)."""

from __future__ import annotations

__all__ = ["UserError"]


class UserError(Exception):
    """A problem with the user's input; the message names the file/line/key/path and the fix."""
