"""The boundary around a user's own code: every import, construction and call of a component a config names (a Gym
environment, an episode function, an HTTP agent, a memory system, a reward term) goes through here, so whatever that
code does (raises, blocks, returns garbage) becomes a memrl error that names the component, the call and the episode.

Two consequences, as Ray and TRL users know them: a failure that depends on the episode (an exception in ``step``, a
call that outlives its time limit) fails that episode only and is counted per kind in the iteration's metrics; a
failure every episode would meet the same way (an import error, a constructor that raises, a reward term that raises
or returns NaN, an agent process that exited) stops the run with :class:`~memrl.data.errors.UserCodeError` (exit 2):
its message names the component, the CLI shows the last frames of the user's traceback below it and writes the whole
traceback to the run's log.

:class:`UserThread` runs every call into one instance of a component on one daemon thread of its own, so a call can
be bounded by a timeout (a blocked ``step()`` is given up on, never waited for), and an object the component created
in one call (a socket, an SQLite connection) is used from the same thread in the next.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import inspect
import logging
import os
import queue
import sys
import sysconfig
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from memrl.data.config import ConfigError
from memrl.data.errors import UserCodeError

__all__ = [
    "USER_PATHS",
    "CallTimeout",
    "UserThread",
    "add_user_module",
    "check_params",
    "describe",
    "in_episode",
    "log_user_traceback",
    "user_code_error",
    "user_fault",
    "user_frames",
]

log = logging.getLogger(__name__)

_OWN = Path(__file__).resolve().parents[1]  # memrl's checkout (its layers are top-level folders), or installed package
_OWN_DIRS = tuple(
    str(_OWN / d) for d in ("data", "rollout", "rewards", "train", "launch", "memrl", "api.py", "__init__.py")
)
_STDLIB = sysconfig.get_paths().get("stdlib", "\0")


USER_PATHS: set[str] = set()
"""Where the user's modules live: the file of each module a config named by import path, or its top-level package's
folder (:func:`~memrl.data.registry.import_entry` adds them); a traceback through one of them is the user's code."""


def add_user_module(module: Any) -> None:
    """Record where ``module`` (imported from a config's import path) lives, unless it is memrl's own."""
    top = sys.modules.get(module.__name__.partition(".")[0], module)
    where = getattr(top, "__file__", None)
    if not where:
        return
    for file in (Path(where), Path(where).resolve()):  # as tracebacks name it, and without links
        path = str(file.parent) + os.sep if file.name == "__init__.py" else str(file)
        if not path.startswith((*_OWN_DIRS, _STDLIB)):
            USER_PATHS.add(path)


def user_fault(exc: BaseException) -> UserCodeError | None:
    """A :class:`UserCodeError` for an exception memrl did not expect whose traceback runs through the user's modules
    (:data:`USER_PATHS`): it names the user's innermost function and line; None when the traceback never enters them
    (a bug of memrl's)."""
    paths = tuple(USER_PATHS)
    theirs = [
        (f, n) for f, n in traceback.walk_tb(exc.__traceback__) if paths and f.f_code.co_filename.startswith(paths)
    ]
    if not theirs:
        return None
    frame, line = theirs[-1]
    code = frame.f_code
    where = f"{frame.f_globals.get('__name__', '?')}:{code.co_qualname}"
    episode = next((f" {n}" for n in getattr(exc, "__notes__", ()) if n.startswith(_EPISODE_NOTE)), "")
    return user_code_error(f"your code raised in {where} ({code.co_filename}, line {line}){episode}", exc)


@contextlib.contextmanager
def in_episode(task_id: str, rollout_id: str) -> Iterator[None]:
    """Mark an exception raised within the block with the episode it happened in (a note :func:`user_fault` names)."""
    try:
        yield
    except Exception as exc:
        if not any(note.startswith(_EPISODE_NOTE) for note in getattr(exc, "__notes__", ())):
            exc.add_note(f"{_EPISODE_NOTE}{task_id!r} (rollout {rollout_id})")
        raise


_EPISODE_NOTE = "in episode "


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception (the type alone when it has no message)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _theirs(filename: str) -> bool:
    return not (filename.startswith("<frozen") or filename.startswith(_OWN_DIRS) or filename.startswith(_STDLIB))


def user_frames(exc: BaseException, limit: int = 3) -> str:
    """The last ``limit`` frames of ``exc``'s traceback that are the user's (not memrl's, not the standard
    library's), formatted as Python does (file, line, function, source line); a syntax error's own location too."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _theirs(f.filename)]
    lines = traceback.format_list(frames[-limit:]) if frames else []
    if isinstance(exc, SyntaxError):  # where the parser stopped: not a frame of the traceback
        lines += [line for line in traceback.format_exception_only(type(exc), exc)[:-1]]
    return "".join(lines).rstrip("\n")


def user_code_error(message: str, exc: BaseException) -> UserCodeError:
    """A :class:`UserCodeError` with ``message`` (``: Type: text`` of ``exc`` appended), the user's last frames and
    the whole traceback."""
    details = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return UserCodeError(f"{message}: {describe(exc)}", frames=user_frames(exc), details=details)


def log_user_traceback(what: str, exc: BaseException) -> None:
    """Write the whole traceback of a user's exception that failed one episode to the run's log only (the console
    has the one-line warning)."""
    details = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    log.info(f"{what}:\n{details}", extra={"run_log_only": True})


def check_params(cls: type, params: dict[str, Any], what: str, key: str) -> None:
    """Refuse ``params`` its constructor does not take (a :class:`~memrl.data.config.ConfigError` naming ``key``, the
    class, the parameters it rejects or misses and the ones it takes): checked when the config is read, not at the
    first episode."""
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # a class whose signature Python cannot read (a C extension): not checked
        return
    try:
        signature.bind(**params)
    except TypeError as exc:
        taken = [
            name
            for name, p in signature.parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name != "self"
        ]
        raise ConfigError(
            f"{key}: {what} {cls.__module__}:{cls.__qualname__} cannot be constructed with {params}: {exc} "
            f"(its constructor takes: {', '.join(taken) or 'no parameters'})"
        ) from None


class CallTimeout(Exception):
    """A call into a user's component did not return within its time limit (it is left running on its thread)."""


class UserThread:
    """One daemon thread making every call into one instance of a user's component (module docstring). A call that
    outlives its ``timeout`` raises :class:`CallTimeout` and leaves the thread to it: the instance is not called again
    (later calls raise :class:`CallTimeout` at once). Pickles as a new, unstarted thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.blocked: str | None = None
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["name"])  # type: ignore[misc]

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[Any]) -> None:
        while (job := jobs.get()) is not None:
            fn, args, future = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # the user's failure goes back to the caller
                    future.set_exception(exc)

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float | None, what: str = "the call") -> Any:
        """``fn(*args)`` on this thread; its result or its exception, or :class:`CallTimeout` after ``timeout`` s."""
        if self.blocked is not None:
            raise CallTimeout(f"{what}: not called, {self.blocked} never returned")
        if timeout is not None and timeout <= 0:
            raise CallTimeout(f"{what}: no time left")
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._serve, args=(self._jobs,), name=f"memrl-user-{self.name}", daemon=True
            )
            self._thread.start()
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._jobs.put((fn, args, future))
        try:
            return future.result(timeout=timeout)
        except TimeoutError:
            if not future.done():  # not the user's own TimeoutError: the call is still running
                self.blocked = what
                raise CallTimeout(f"{what} did not return within {timeout:.3g} s") from None
            raise

    def close(self) -> None:
        """Let the thread end after its current call (nothing when it never started); a later call starts another."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread, self._jobs = None, queue.SimpleQueue()
