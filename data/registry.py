"""Open registries of components: task families, memory systems, reasoners, reward terms.

A component is registered by a decorator where it is defined (``@register_task("sam", params=SamTaskParams)``,
``@register_memory("sam", config=SamConfig)``, ``@register_reasoner("sam")``, ``@register_reward("committee")``); the
built-in ones register the same way a user's do. A config names a component by its registered name or by import path
(``"mypkg.env:MyTextGame"``: the module is imported, which runs its decorators, and the object is taken from it), so a
user's component needs no edit to memrl. A resolved config keeps the import path (``entry``) so every process of a
run (a Ray rollout worker, a torchrun rank) imports the same module and sees the same registrations.

:func:`check_protocol` is how every registry refuses a component that does not satisfy its protocol: one
:class:`ComponentError` (a :class:`~memrl.data.config.ConfigError`: the CLI exits 2 before any run folder exists) that
names the class and the missing method or field.

The registries of this layer live here: :data:`TASK_FAMILIES` (data), :data:`REASONERS` (scripted frozen agents).
Memory systems register in :mod:`memrl.rollout.memory.base`, engine backends in :mod:`memrl.rollout.engines.base`,
reward terms in :mod:`memrl.rewards.terms`; the user-facing decorators are gathered in :mod:`memrl.api`.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from memrl.data.config import ConfigError
from memrl.data.user_code import add_user_module, user_code_error

__all__ = [
    "REASONERS",
    "TASK_FAMILIES",
    "ComponentError",
    "Registration",
    "Registry",
    "add_search_path",
    "check_protocol",
    "import_entry",
    "is_entry",
    "register_reasoner",
    "register_task",
]

T = TypeVar("T")
_ENTRY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class ComponentError(ConfigError):
    """A component named in a config cannot be used: not importable, not registered, or missing part of its
    protocol (the message names the class and what is missing)."""


def add_search_path(*folders: str | os.PathLike[str]) -> None:
    """Let import paths in a config resolve against ``folders`` (the CLI passes the config file's folder and the
    working directory): appended to ``sys.path`` (never shadowing an installed package) and to ``PYTHONPATH`` so the
    processes a run starts (torchrun ranks, Ray rollout workers, an HTTP agent) resolve them the same way."""
    for folder in folders:
        path = str(Path(folder).resolve())
        if path not in sys.path:
            sys.path.append(path)
        parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if path not in parts:
            os.environ["PYTHONPATH"] = os.pathsep.join([*parts, path])


def is_entry(name: str) -> bool:
    """Whether ``name`` is an import path (``package.module:Name``) rather than a registered name."""
    return ":" in name


def import_entry(path: str, what: str = "component") -> Any:
    """The object an import path ``package.module:Name`` (or ``...:Outer.Inner``) names; a :class:`ComponentError`
    saying what is wrong otherwise (the module's own import error is quoted)."""
    if not _ENTRY.match(path):
        raise ComponentError(f"{what} {path!r}: expected an import path 'package.module:Name'")
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if not _names_the_module(exc, module_name):  # the module exists; something it imports does not
            raise _import_failed(what, path, module_name, exc) from None
        raise ComponentError(
            f"{what} {path!r}: cannot import module {module_name!r} ({exc}); is its package "
            f"installed or on PYTHONPATH (sys.path[0] = {sys.path[0]!r})?"
        ) from None
    except (Exception, SystemExit) as exc:  # the user's module raised while it ran: a syntax error, any exception
        raise _import_failed(what, path, module_name, exc) from None
    add_user_module(obj)  # a traceback through it later is the user's code (memrl.data.user_code.user_fault)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ComponentError(f"{what} {path!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _names_the_module(exc: ModuleNotFoundError, module_name: str) -> bool:
    """Whether ``exc`` says ``module_name`` itself (or a package above it) is missing."""
    return exc.name is None or module_name == exc.name or module_name.startswith(f"{exc.name}.")


def _import_failed(what: str, path: str, module_name: str, exc: BaseException) -> Exception:
    return user_code_error(f"{what} {path!r}: importing module {module_name!r} failed", exc)


def entry_of(obj: Any) -> str:
    """The import path of a class or function (``module:qualname``)."""
    return f"{obj.__module__}:{obj.__qualname__}"


def check_protocol(
    obj: Any, what: str, *, methods: Iterable[str] = (), fields: Iterable[str] = (), coroutine: bool = False
) -> None:
    """Refuse ``obj`` (a class or function) unless it has every method in ``methods`` (callable attributes) and every
    attribute in ``fields``; ``coroutine``: it must be an ``async def`` function. The error names the object and what
    it lacks."""
    name = getattr(obj, "__qualname__", type(obj).__name__)
    label = f"{what} {getattr(obj, '__module__', '?')}:{name}"
    if coroutine:
        if not inspect.iscoroutinefunction(obj):
            raise ComponentError(
                f"{label} must be an 'async def' function (async def run(task, memory, reasoner) "
                f"-> Outcome); got {type(obj).__name__}"
            )
        return
    missing = [m for m in methods if not callable(getattr(obj, m, None))]
    if missing:
        raise ComponentError(
            f"{label} does not implement the {what} protocol: missing method"
            f"{'s' if len(missing) > 1 else ''} {', '.join(repr(m) for m in missing)}"
        )
    absent = [f for f in fields if not hasattr(obj, f)]
    if absent:
        raise ComponentError(
            f"{label} does not implement the {what} protocol: missing field"
            f"{'s' if len(absent) > 1 else ''} {', '.join(repr(f) for f in absent)}"
        )


@dataclass
class Registration(Generic[T]):
    """One registered component: its name, the object (class or function), its config model (None: none), its import
    path, and what else its registry records about it (``extra``)."""

    name: str
    obj: T
    config: type | None = None
    entry: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Registry(Generic[T]):
    """Components of one kind by name. ``check`` validates an object before it is registered (the protocol)."""

    def __init__(self, what: str, check: Callable[[Any], None] | None = None) -> None:
        self.what = what
        self.check = check
        self._items: dict[str, Registration[T]] = {}

    def register(self, name: str, obj: T, *, config: type | None = None, **extra: Any) -> Registration[T]:
        """Register ``obj`` under ``name`` (re-registering the same object, e.g. a module imported twice, is fine; a
        different object under a taken name is an error)."""
        if not name or is_entry(name):
            raise ComponentError(f"{self.what} name {name!r}: a name is a plain word (no ':')")
        if self.check is not None:
            self.check(obj)
        old = self._items.get(name)
        if old is not None and entry_of(old.obj) != entry_of(obj):
            raise ComponentError(
                f"{self.what} {name!r} is already registered by {old.entry}; {entry_of(obj)} must use another name"
            )
        reg = Registration(name, obj, config, entry_of(obj), dict(extra))
        self._items[name] = reg
        return reg

    def decorator(self, name: str, **kwargs: Any) -> Callable[[T], T]:
        """``@registry.decorator(name, ...)``: register the decorated object and return it unchanged."""

        def wrap(obj: T) -> T:
            self.register(name, obj, **kwargs)
            return obj

        return wrap

    def get(self, name: str) -> Registration[T]:
        """The registration under ``name``, or of the object an import path names (imported, so its decorator runs;
        an undecorated object is returned unregistered, for the caller to adapt). Unknown names list the known."""
        if is_entry(name):
            obj = import_entry(name, self.what)
            for reg in self._items.values():
                if reg.obj is obj:
                    return reg
            return Registration(name="", obj=obj, entry=name)
        if name not in self._items:
            raise ComponentError(
                f"unknown {self.what} {name!r}; registered: {', '.join(sorted(self._items))} "
                f"(or name your own by import path, 'package.module:Name')"
            )
        return self._items[name]

    def find(self, obj: Any) -> Registration[T] | None:
        """The registration of ``obj`` (None when it is not registered)."""
        return next((r for r in self._items.values() if r.obj is obj), None)

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def items(self) -> list[Registration[T]]:
        """Every registration, in registration order."""
        return list(self._items.values())


# ------------------------------------------------------------------------------------------------------------------
# reasoners: scripted frozen agents (memrl.data.schemas.ScriptedPolicy) a ``scripted`` engine runs


def _check_reasoner(obj: Any) -> None:
    check_protocol(obj, "reasoner", methods=("respond",))


REASONERS: Registry[Any] = Registry("reasoner", _check_reasoner)
"""Scripted frozen reasoners (``respond(messages, rng, metadata) -> str``), by name: ``EngineConfig.scripted_policy``
takes a name here or an import path."""


def register_reasoner(name: str) -> Callable[[T], T]:
    """Class decorator: a scripted reasoner (``respond(messages, rng, metadata) -> str``) selectable by ``name``."""
    return REASONERS.decorator(name)


# ------------------------------------------------------------------------------------------------------------------
# task families


TASK_KINDS = ("env", "gym", "episode", "http")
"""How a family's tasks run: ``env`` memrl's task interface (``reset() -> str``, ``step(action) -> (observation,
done)``, ``finish(answer) -> outcome``: the built-in families); ``gym`` a Gym-style environment
(:mod:`memrl.data.envs.gym`); ``episode`` an ``async def run(task, memory, reasoner)`` episode function; ``http`` a
black-box agent in its own process (:mod:`memrl.rollout.http_agent`)."""


def task_kind(obj: Any) -> str:
    """The kind of a task-family object (see :data:`TASK_KINDS`), or a :class:`ComponentError` naming the class and
    what it lacks."""
    if inspect.iscoroutinefunction(obj):
        return "episode"
    if inspect.isfunction(obj):
        raise ComponentError(
            f"task {entry_of(obj)} is a plain function: an episode function must be 'async def "
            f"run(task, memory, reasoner) -> Outcome'"
        )
    if callable(getattr(obj, "finish", None)):
        check_protocol(
            obj, "task family", methods=("reset", "step", "finish"), fields=("family",) if isinstance(obj, type) else ()
        )
        return "env"
    check_protocol(obj, "Gym-style environment", methods=("reset", "step"))
    return "gym"


TASK_FAMILIES: Registry[Any] = Registry("task family")
"""Task families by name (``TaskSetConfig.family``): ``sam``, ``dialogue``, ``proactive``, the shapes' adapters and
whatever a user registers."""


def register_task(
    name: str,
    *,
    params: type | None = None,
    section: str | None = None,
    reasoner: str | None = None,
    memory: str | None = None,
    oracle: str | None = None,
    max_steps: int | None = None,
    kind: str | None = None,
) -> Callable[[T], T]:
    """Decorator: a task family selectable by ``name``. The object is a built-in-style task class, a Gym-style
    environment class or an ``async def`` episode function (its kind is read from it). ``params``: the config model of
    its parameters (a Gym class gets them as constructor keyword arguments); ``section``: the ``TaskSetConfig`` key
    holding them (built-ins: ``sam``, ...; default ``params``); ``reasoner``: the registered scripted reasoner that
    plays it by default; ``memory``: its default memory system; ``oracle``: the scripted expert (import path) the
    committee and distillation use by default; ``max_steps``: the reasoner step limit of a Gym/episode family."""

    def wrap(obj: T) -> T:
        TASK_FAMILIES.register(
            name,
            obj,
            config=params,
            kind=kind or task_kind(obj),
            section=section or "params",
            reasoner=reasoner,
            memory=memory,
            oracle=oracle,
            max_steps=max_steps,
        )
        return obj

    return wrap
