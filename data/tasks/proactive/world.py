"""What a proactive task is made of: the fact kinds it plants (:data:`FACTS`: how a value is read from text, its
canonical bank / reminder sentence), the plan's subtasks (what each needs and how it is done with and without its
fact), the ``next:`` line every observation ends with, the task's knobs (:class:`ProactiveParams`) and the terminal's
latent state (:class:`TermState`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import Field, field_validator, model_validator

from memrl.data.config import ConfigModel

__all__ = [
    "FACTS",
    "FACT_KINDS",
    "FILLERS",
    "PACKAGES",
    "READ_CONFIG",
    "REQUIREMENTS",
    "RUN_ANY",
    "USES",
    "Fact",
    "ProactiveParams",
    "Subtask",
    "TermState",
    "fact_value",
    "install_subtask",
    "parse_next",
    "subtask_by_name",
]

FACT_KINDS = ("interpreter", "output", "protected", "install_flag", "db_port")
REQUIREMENTS = ("interpreter", "output", "protected")
"""Fact kinds the task statement requires: acting without them violates the task (the verifier fails)."""


@dataclass(frozen=True)
class Fact:
    """A piece of execution state: how to find its value in text, and its canonical bank / reminder sentence."""

    kind: str
    pattern: re.Pattern[str]
    sentence: Callable[[str], str]
    memory: str  # "knowledge" or "procedural"


FACTS: dict[str, Fact] = {
    "interpreter": Fact(
        "interpreter", re.compile(r"use (python3\.\d+)"), lambda v: f"requirement: use {v}, not python", "knowledge"
    ),
    "output": Fact(
        "output",
        re.compile(r"write the result to (\S+)"),
        lambda v: f"requirement: write the result to {v}",
        "knowledge",
    ),
    "protected": Fact(
        "protected", re.compile(r"never touch (\S+)"), lambda v: f"requirement: never touch {v}", "knowledge"
    ),
    "install_flag": Fact(
        "install_flag",
        re.compile(r"pip install (--[a-z-]+)"),
        lambda v: f"pip install fails without {v}: use pip install {v} PKG",
        "procedural",
    ),
    "db_port": Fact(
        "db_port",
        re.compile(r"db_port: (\d+)"),
        lambda v: f"environment: db_port: {v} (from config.yaml)",
        "knowledge",
    ),
}
"""The fact kinds of the family: the pattern the agent and the oracle read values with, the bank sentence."""


def fact_value(kind: str, text: str) -> str | None:
    """The value of fact ``kind`` stated in ``text`` (the last statement wins), or None."""
    found = FACTS[kind].pattern.findall(text)
    return found[-1] if found else None


@dataclass(frozen=True)
class Subtask:
    """A plan step: its name, the fact it needs (if any), and how to act without / with that fact."""

    name: str
    fact: str | None
    default: str
    correct: str = ""  # with "{v}" for the fact's value
    discover: str | None = None  # a command that reveals the fact again (re-reading a file)


FILLERS = [
    Subtask("read the readme", None, "cat README.md"),
    Subtask("list the files", None, "ls"),
    Subtask("check git status", None, "git status"),
    Subtask("run the unit tests", None, "pytest -q"),
    Subtask("format the code", None, "black src"),
    Subtask("view the log", None, "tail log.txt"),
    Subtask("check disk space", None, "df -h"),
    Subtask("show the python version", None, "python3 --version"),
]
PACKAGES = ["numpy", "pandas", "scipy", "requests", "pyyaml", "rich"]


def install_subtask(pkg: str) -> Subtask:
    """The subtask that installs ``pkg`` (it needs the diagnosed install flag)."""
    return Subtask(f"install {pkg}", "install_flag", f"pip install {pkg}", f"pip install {{v}} {pkg}")


USES = {
    "interpreter": Subtask("run the pipeline", "interpreter", "python run.py", "{v} run.py"),
    "output": Subtask("save the result", "output", "cp build/result.txt result.txt", "cp build/result.txt {v}"),
    "protected": Subtask("clean temporary files", "protected", "rm -rf build/tmp data/*/tmp", "rm -rf build/tmp"),
    "db_port": Subtask("load the data", "db_port", "load --port 5432", "load --port {v}", "cat config.yaml"),
}
RUN_ANY = Subtask("run the pipeline", None, "python run.py")  # when no interpreter is required
READ_CONFIG = Subtask("read the config", None, "cat config.yaml")  # the source of db_port
_NEXT = re.compile(r"^next: (.+) \(subtask (\d+) of (\d+)\)$", re.MULTILINE)


def parse_next(text: str) -> tuple[str, int, int] | None:
    """(subtask name, its 1-based index, plan length) from the last ``next:`` line of ``text``."""
    found = _NEXT.findall(text)
    if not found:
        return None
    name, i, n = found[-1]
    return name, int(i), int(n)


def subtask_by_name(name: str) -> Subtask | None:
    """The plan subtask called ``name`` (as a ``next:`` line names it), or None for a name no plan uses."""
    if name.startswith("install "):
        return install_subtask(name.split(" ", 1)[1])
    for sub in [*FILLERS, *USES.values(), READ_CONFIG]:
        if sub.name == name:
            return sub
    return None


class ProactiveParams(ConfigModel):
    """Knobs of a proactive task."""

    n_subtasks: int = Field(16, ge=6, le=500)  # subtasks the task is made of
    facts: list[str] = Field(list(FACT_KINDS), description=f"fact kinds to plant, from {FACT_KINDS}")
    window: int = Field(4, ge=1, description="the action agent's window k (pivots are computed for it)")
    slack: int = Field(2, ge=0, description="steps allowed beyond the perfect-memory run")
    extra_installs: int = Field(1, ge=0, le=4, description="later installs that need the diagnosed flag")
    fatal_pivots: int | None = Field(
        None,
        ge=1,
        le=len(REQUIREMENTS),
        description="requirements planted per task, each a fatal pivot (drawn by the "
        "task's seed from the requirement kinds in facts); None: every requirement kind in facts",
    )

    @field_validator("facts")
    @classmethod
    def _known_kinds(cls, facts: list[str]) -> list[str]:
        unknown = sorted(set(facts) - set(FACT_KINDS))
        if unknown:
            raise ValueError(f"unknown kinds {unknown}; one of {FACT_KINDS}")
        return facts

    @model_validator(mode="after")
    def _enough_requirements(self) -> ProactiveParams:
        listed = [k for k in self.facts if k in REQUIREMENTS]
        if self.fatal_pivots is not None and self.fatal_pivots > len(listed):
            raise ValueError(
                f"fatal_pivots: {self.fatal_pivots} requirements asked, facts lists {len(listed)} ({listed})"
            )
        return self


@dataclass
class TermState:
    """The terminal's latent state."""

    files: set[str] = field(default_factory=set)
    installed: set[str] = field(default_factory=set)
    done: int = 0  # subtasks completed
    steps: int = 0
    violations: list[str] = field(default_factory=list)
