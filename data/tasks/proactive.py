"""Proactive task family: behavioural state decay in a terminal-like environment with executable state.

The task statement (the first observation) lists requirements (the interpreter to use, where the result goes, a
directory never to touch); some commands fail with a diagnostic until a flag is used (``pip install`` needs
``--user``); the environment has stable facts (``db_port`` in ``config.yaml``). Every observation ends with
``next: SUBTASK (subtask i of n)``. The scripted :class:`ActionAgent` sees only what its context holds (the last
``k`` steps; the statement only while it is inside that window) plus an optional reminder (a transient
``memory context:`` message). When the fact a subtask needs is out of sight it falls back to a default command: it
violates a requirement (fatal), repeats a command that failed before (a wasted step), or has to re-read a file (a
wasted step). A reminder that does not name the next subtask's fact distracts the agent with probability
``distraction`` (default 0.3; a real model mostly ignores an irrelevant reminder): it stops to double-check, a wasted
step (``pwd``; never twice in a row). Over-intervention is a graded cost: the step budget forgives ``slack`` wasted
steps (default 2), so a few needless reminders are harmless and many are fatal.

Pivots (steps where a reminder changes the agent's action, :func:`find_pivot`) are computed by a reference run and
stored in the episode metadata: the ground truth for pivot detection. A pivot whose fact is a requirement
(``requirement: true``: interpreter, output location, protected directory) is fatal to miss; the others cost wasted
steps. :func:`simulate_proactive` is the reference loop with a memory behaviour (the oracle of
:mod:`memrl.data.experts.proactive`) or without memory.
"""

from __future__ import annotations

import copy
import fnmatch
import hashlib
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, field_validator, model_validator

from memrl.data.config import ConfigModel
from memrl.data.envs.base import turn_tokens
from memrl.data.formats import (
    ACTION_AGENT_SYSTEM,
    parse_intervention,
    parse_memory_context,
    parse_phase_prompt,
    parse_tool_calls,
    parse_window,
    render_bank,
    render_memory_context,
    render_phase1_prompt,
    render_phase2_prompt,
    render_tool_call,
    render_window,
)
from memrl.data.schemas import EnvSpec, Episode, Message, QAPair, ScriptedPolicy, Turn
from memrl.data.tasks.common import as_messages, content_of, role_of

__all__ = [
    "FACTS",
    "ActionAgent",
    "BankWriter",
    "ProactiveParams",
    "ProactiveRun",
    "ProactiveTask",
    "fact_value",
    "find_pivot",
    "simulate_proactive",
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
        "output", re.compile(r"write the result to (\S+)"), lambda v: f"requirement: write the result to {v}",
        "knowledge",
    ),
    "protected": Fact(
        "protected", re.compile(r"never touch (\S+)"), lambda v: f"requirement: never touch {v}", "knowledge"
    ),
    "install_flag": Fact(
        "install_flag", re.compile(r"pip install (--[a-z-]+)"),
        lambda v: f"pip install fails without {v}: use pip install {v} PKG", "procedural",
    ),
    "db_port": Fact(
        "db_port", re.compile(r"db_port: (\d+)"), lambda v: f"environment: db_port: {v} (from config.yaml)",
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


def _install(pkg: str) -> Subtask:
    return Subtask(f"install {pkg}", "install_flag", f"pip install {pkg}", f"pip install {{v}} {pkg}")


USES = {
    "interpreter": Subtask("run the pipeline", "interpreter", "python run.py", "{v} run.py"),
    "output": Subtask("save the result", "output", "cp build/result.txt result.txt", "cp build/result.txt {v}"),
    "protected": Subtask("clean temporary files", "protected", "rm -rf build/tmp data/*/tmp", "rm -rf build/tmp"),
    "db_port": Subtask("load the data", "db_port", "load --port 5432", "load --port {v}", "cat config.yaml"),
}
RUN_ANY = Subtask("run the pipeline", None, "python run.py")  # when no interpreter is required
_NEXT = re.compile(r"^next: (.+) \(subtask (\d+) of (\d+)\)$", re.MULTILINE)


def parse_next(text: str) -> tuple[str, int, int] | None:
    """(subtask name, its 1-based index, plan length) from the last ``next:`` line of ``text``."""
    found = _NEXT.findall(text)
    if not found:
        return None
    name, i, n = found[-1]
    return name, int(i), int(n)


class ProactiveParams(ConfigModel):
    """Knobs of a proactive task."""

    n_subtasks: int = Field(16, ge=6, le=500)  # subtasks the task is made of
    facts: list[str] = Field(list(FACT_KINDS), description=f"fact kinds to plant, from {FACT_KINDS}")
    window: int = Field(4, ge=1, description="the action agent's window k (pivots are computed for it)")
    slack: int = Field(2, ge=0, description="steps allowed beyond the perfect-memory run")
    extra_installs: int = Field(1, ge=0, le=4, description="later installs that need the diagnosed flag")
    fatal_pivots: int | None = Field(
        None, ge=1, le=len(REQUIREMENTS), description="requirements planted per task, each a fatal pivot (drawn by the "
        "task's seed from the requirement kinds in facts); None: every requirement kind in facts")

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
            raise ValueError(f"fatal_pivots: {self.fatal_pivots} requirements asked, facts lists {len(listed)} "
                             f"({listed})")
        return self


@dataclass
class TermState:
    """The terminal's latent state."""

    files: set[str] = field(default_factory=set)
    installed: set[str] = field(default_factory=set)
    done: int = 0  # subtasks completed
    steps: int = 0
    violations: list[str] = field(default_factory=list)


class ProactiveTask:
    """One proactive episode (see the module docstring); implements the agent loop's task interface."""

    family = "proactive"

    def __init__(
        self, params: ProactiveParams | dict[str, Any] | None = None, seed: int = 0, task_id: str = ""
    ) -> None:
        self.params = params if isinstance(params, ProactiveParams) else ProactiveParams.model_validate(params or {})
        self.seed = seed
        self.task_id = task_id or f"proactive-{seed}"
        rng = random.Random(seed)
        self.values = {
            "interpreter": f"python3.{rng.choice([9, 10, 11, 12])}",
            "output": f"/out/{rng.choice(['result', 'final', 'report', 'answer'])}.txt",
            "protected": f"data/{rng.choice(['raw', 'gold', 'frozen', 'source'])}",
            "install_flag": rng.choice(["--user", "--break-system-packages"]),
            "db_port": str(rng.randint(5433, 5499)),
        }
        self.facts = self._planted_facts()
        self.plan = self._make_plan(rng)
        self.task = self._statement()
        self.s = TermState()
        self.max_steps = 10**6
        reference = simulate_proactive(self, ActionAgent(), None, k=self.params.window, ideal_reminders=True)
        self.reference = reference
        self.pivots = reference.pivots
        self.max_steps = reference.steps + self.params.slack
        self.reset()

    @classmethod
    def from_spec(cls, spec: EnvSpec, task_id: str = "") -> ProactiveTask:
        """Rebuild from an :class:`EnvSpec` named ``proactive``."""
        return cls(spec.params, spec.seed, task_id)

    @property
    def spec(self) -> EnvSpec:
        """The spec that rebuilds this task."""
        return EnvSpec(name="proactive", seed=self.seed, params=self.params.model_dump(mode="json"))

    # ------------------------------------------------------------------------------------------------ building
    def _planted_facts(self) -> list[str]:
        """The fact kinds this task plants: ``params.facts``, with only ``fatal_pivots`` of its requirement kinds
        (drawn from a generator of its own, so the other draws of the seed are those of a task with all of them)."""
        fatal = self.params.fatal_pivots
        listed = [k for k in self.params.facts if k in REQUIREMENTS]
        if fatal is None or fatal == len(listed):
            return list(self.params.facts)
        kept = set(random.Random(f"{self.seed}/fatal").sample(listed, fatal))
        return [k for k in self.params.facts if k not in REQUIREMENTS or k in kept]

    def _make_plan(self, rng: random.Random) -> list[Subtask]:
        p = self.params
        packages = rng.sample(PACKAGES, 1 + p.extra_installs)
        sources: list[Subtask] = []
        uses: list[Subtask] = []
        if "install_flag" in self.facts:
            sources.append(_install(packages[0]))
            uses += [_install(pkg) for pkg in packages[1:]]
        if "db_port" in self.facts:
            sources.append(Subtask("read the config", None, "cat config.yaml"))
        uses += [USES[k] for k in ("interpreter", "output", "protected", "db_port") if k in self.facts]
        if "output" in self.facts and "interpreter" not in self.facts:  # the result still needs a run (any python)
            uses.append(RUN_ANY)
        rng.shuffle(uses)
        run = USES["interpreter"] if "interpreter" in self.facts else RUN_ANY
        if run in uses and USES["output"] in uses:  # the result exists only after a run
            a, b = uses.index(run), uses.index(USES["output"])
            if a > b:
                uses[a], uses[b] = uses[b], uses[a]
        n_fill = max(0, p.n_subtasks - len(sources) - len(uses))
        fillers = [FILLERS[i % len(FILLERS)] for i in rng.sample(range(n_fill * 2 + len(FILLERS)), n_fill)]
        early = p.window + 1  # uses come after the sources have left the window
        head = sources + fillers[: max(0, early - len(sources))]
        rng.shuffle(head)
        rest = fillers[len(head) - len(sources) :]
        tail: list[Subtask] = []
        slots = sorted(rng.sample(range(len(rest) + len(uses)), len(uses)))
        u = iter(uses)
        r = iter(rest)
        for i in range(len(rest) + len(uses)):
            tail.append(next(u) if i in slots else next(r))
        return head + tail

    def _statement(self) -> str:
        reqs = []
        if "interpreter" in self.facts:
            reqs.append(f"- use {self.values['interpreter']}, not python")
        if "output" in self.facts:
            reqs.append(f"- write the result to {self.values['output']}")
        if "protected" in self.facts:
            reqs.append(f"- never touch {self.values['protected']}")
        return "\n".join(["task: finish the data pipeline, one subtask at a time.", "requirements:", *reqs])

    # ------------------------------------------------------------------------------------------------ running
    def _next_line(self) -> str:
        if self.s.done >= len(self.plan):
            return "all subtasks done"
        return f"next: {self.plan[self.s.done].name} (subtask {self.s.done + 1} of {len(self.plan)})"

    def reset(self) -> str:
        """Start the episode; the first observation is the task statement."""
        self.s = TermState(files={"README.md", "config.yaml", "run.py", "log.txt", "src/app.py", "build/tmp",
                                  f"{self.values['protected']}/tmp", f"{self.values['protected']}/part1.csv"})
        return f"{self.task}\n{self._next_line()}"

    def step(self, action: str) -> tuple[str, bool]:
        """Execute a shell command; the observation ends with the next subtask."""
        s = self.s
        s.steps += 1
        out, completes = self._execute(action.strip())
        if completes and s.done < len(self.plan):
            s.done += 1
        over = s.done >= len(self.plan)
        return f"{out}\n{self._next_line()}", over

    def _execute(self, cmd: str) -> tuple[str, bool]:
        s, v = self.s, self.values
        current = self.plan[s.done] if s.done < len(self.plan) else None
        name = current.name if current else ""
        if m := re.fullmatch(r"pip install(?: (--[a-z-]+))? ([\w-]+)", cmd):
            flag, pkg = m.group(1), m.group(2)
            if flag != v["install_flag"]:
                return f"error: externally-managed-environment\nhint: pip install {v['install_flag']} {pkg}", False
            s.installed.add(pkg)
            return f"Successfully installed {pkg}", name == f"install {pkg}"
        if m := re.fullmatch(r"(python[\d.]*) run\.py", cmd):
            if "interpreter" in self.facts and m.group(1) != v["interpreter"]:
                s.violations.append(f"ran {m.group(1)} instead of {v['interpreter']}")
            s.files.add("build/result.txt")
            return "wrote build/result.txt", name == "run the pipeline"
        if m := re.fullmatch(r"cp (\S+) (\S+)", cmd):
            if m.group(1) not in s.files:
                return f"cp: cannot stat '{m.group(1)}': No such file or directory", False
            s.files.add(m.group(2))
            return "", name == "save the result"
        if cmd.startswith("rm -rf "):
            targets = cmd.split()[2:]
            for t in targets:
                hit = {f for f in s.files if f == t or f.startswith(t + "/") or fnmatch.fnmatchcase(f, t)}
                if t == v["protected"] or any(f.startswith(v["protected"] + "/") for f in hit):
                    s.violations.append(f"touched {v['protected']}")
                s.files -= hit
            return "", name == "clean temporary files" and "build/tmp" in targets
        if m := re.fullmatch(r"load --port (\d+)", cmd):
            if m.group(1) != v["db_port"]:
                return f"error: connection refused on port {m.group(1)}", False
            return "loaded 1200 rows", name == "load the data"
        if cmd == "cat config.yaml":
            return f"db_host: localhost\ndb_port: {v['db_port']}\ncache: build/tmp", name == "read the config"
        if cmd == "cat README.md":
            return "# pipeline\nsee the task statement for the rules.", name == "read the readme"
        fixed = {
            "ls": "README.md config.yaml run.py log.txt src build data",
            "git status": "nothing to commit, working tree clean",
            "pytest -q": "12 passed",
            "black src": "1 file reformatted",
            "tail log.txt": "ok: nightly run finished",
            "df -h": "disk: 41% used",
            "python3 --version": "Python 3.8.10",
            "pwd": "/work/project",
        }
        if cmd in fixed:
            return fixed[cmd], current is not None and current.fact is None and current.default == cmd
        return f"bash: {cmd.split(' ')[0] if cmd else 'empty'}: command not found", False

    def finish(self, answer: str | None = None) -> float:
        """1.0 when every subtask is done within the budget, no requirement was violated and the result is where
        the task asks; else 0.0."""
        return float(self.verify())

    def verify(self) -> bool:
        """The end-state check behind :meth:`finish`."""
        s, v = self.s, self.values
        ok = s.done >= len(self.plan) and not s.violations and s.steps <= self.max_steps
        if "output" in self.facts:
            ok = ok and v["output"] in s.files
        return ok

    def __deepcopy__(self, memo: dict[int, Any]) -> ProactiveTask:
        """A copy with its own terminal state. The plan, facts, statement, reference run and pivots never change after
        construction, so copies share them (forking a rollout at every memory step stays cheap)."""
        twin = copy.copy(self)
        twin.s = copy.deepcopy(self.s, memo)
        return twin

    def snapshot(self) -> Any:
        """The terminal state."""
        return copy.deepcopy(self.s)

    def restore(self, snap: Any) -> None:
        """Return to a state taken by :meth:`snapshot`."""
        self.s = copy.deepcopy(snap)

    def truth(self) -> dict[str, Any]:
        """What an oracle may know: the plan (subtask name and needed fact) and the fact values."""
        return {
            "plan": [[t.name, t.fact] for t in self.plan],
            "values": dict(self.values),
            "facts": list(self.facts),
        }

    def episode(self) -> Episode:
        """The episode: the statement as the task, the perfect-memory reference run as the trajectory, the pivots
        and the truth in the metadata, and one QA pair per planted fact (type C: state the agent must keep)."""
        qas = [
            QAPair(
                question=f"what is the {kind.replace('_', ' ')} fact of this task?",
                answer=self.values[kind],
                type="C",
                needle_turns=sorted(t for t, k in self.reference.fact_turns if k == kind)[:1],
                qa_id=f"{self.task_id}/{kind}",
            )
            for kind in self.facts
        ]
        turns = self.reference.turns
        return Episode(
            episode_id=self.task_id,
            task=self.task,
            task_type="proactive",
            domain="terminal",
            trajectory=turns,
            qa_pairs=qas,
            env=self.spec,
            horizon_tokens=sum(turn_tokens(t.action, t.observation) for t in turns),
            metadata={
                "family": "proactive",
                "pivots": self.pivots,
                "budget": self.max_steps,
                "truth": self.truth(),
            },
        )


# ---------------------------------------------------------------------------------------------------- agent
class ActionAgent:
    """The scripted action agent (a :class:`~memrl.data.schemas.ScriptedPolicy`): follows the ``next:`` line, acts on
    the facts its context shows (window + reminder), else falls back to its default command.

    A reminder that does not name the next subtask's fact distracts it with probability ``distraction`` (a wasted
    ``pwd``). The draw is keyed by (``seed``, task id, step) when the request names them (the agent loop's and
    :func:`simulate_proactive`'s requests do), so counterfactual branches of one episode share their draws (common
    random numbers: a branch differs from its sibling by its memory decisions only); otherwise it comes from the
    request's seeded generator.
    """

    name = "action-agent"

    def __init__(self, distraction: float = 0.3, seed: int = 0) -> None:
        if not 0.0 <= distraction <= 1.0:
            raise ValueError(f"distraction must be in [0, 1], got {distraction}")
        self.distraction = distraction
        self.seed = seed

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        """Reply with one ``act`` tool call."""
        context, reminder, last_obs, last_action = [], None, "", None
        for m in messages:
            role, text = role_of(m), content_of(m)
            if role == "system":
                continue
            if role == "user" and (r := parse_memory_context(text)) is not None:
                reminder = r
                continue
            if role == "assistant":
                calls = parse_tool_calls(text).calls
                last_action = str(calls[0].arguments.get("action", "")) if calls else text
                context.append(last_action)
                continue
            context.append(text)
            last_obs = text
        distracted = reminder is not None and self.distracted(rng, metadata)
        return render_tool_call("act", {"action": self.decide(context, reminder, last_obs, last_action, distracted)})

    def distracted(self, rng: random.Random, metadata: dict[str, Any]) -> bool:
        """Whether an irrelevant reminder at this call costs a step (see the class docstring)."""
        if self.distraction in (0.0, 1.0):
            return self.distraction == 1.0
        if "task_id" in metadata and "step" in metadata:
            key = f"{self.seed}/{metadata['task_id']}/{metadata['step']}".encode()
            draw = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") / 2**64
        else:
            draw = rng.random()
        return draw < self.distraction

    @staticmethod
    def decide(
        context: list[str], reminder: str | None, last_obs: str, last_action: str | None, distracted: bool = True
    ) -> str:
        """The command for the next subtask given what is visible (``distracted``: an irrelevant reminder costs a
        double-check)."""
        nxt = parse_next(last_obs)
        if nxt is None:
            return "ls"
        sub = _subtask_by_name(nxt[0])
        if sub is None:
            return "ls"
        seen = "\n".join(context)
        if reminder is not None:
            if sub.fact is not None and fact_value(sub.fact, reminder) is not None:
                seen += "\n" + reminder
            elif distracted and last_action != "pwd":
                # an irrelevant reminder: the agent stops to double-check (a wasted step), but only once in a row,
                # so a standing memory context (full-bank exposure, forced reminders) slows it down, not livelocks it
                return "pwd"
        if sub.fact is None:
            return sub.default
        value = fact_value(sub.fact, seen)
        if value is not None:
            return sub.correct.format(v=value)
        if last_action == sub.default and sub.discover:
            return sub.discover
        return sub.default


# ---------------------------------------------------------------------------------------------------- Phase 1
_FAILURE = re.compile(r"(?im)^(error: .*|bash: .*command not found|cp: cannot stat .*)$")


class BankWriter:
    """A scripted, non-privileged Phase 1 (a :class:`~memrl.data.schemas.ScriptedPolicy` for the ``bank_edit`` role): it
    records what the agent has seen and nothing else. It reads only its prompt (task statement, recent window, bank),
    never the task's plan, its fact values or its pivots, so it cannot flag which entry the next subtask will need.

    Per memory step: the status notes the subtask the window ends on; every fact the statement or the window states
    (any kind of :data:`FACTS`) is saved once as its canonical sentence (a changed value rewrites its entry); every
    failed command in the window is saved once as a procedural ``failed: COMMAND -> ERROR`` entry. Nothing is ever
    deleted: the bank keeps what was observed, relevant later or not.
    """

    name = "bank-writer"

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        """Bank tool calls for a Phase 1 prompt; empty text for any other prompt."""
        parsed = parse_phase_prompt(messages)
        if parsed is None or parsed[0] != 1:
            return ""
        _, task, window, bank = parsed
        calls = []
        if (nxt := parse_next(window or task)) is not None:
            status = f"at subtask {nxt[1]} of {nxt[2]}: {nxt[0]}"
            if status != bank.status:
                calls.append(render_tool_call("memory_update_status", {"content": status}))
        known = [*bank.knowledge.items(), *bank.procedural.items()]
        saved = {content for _, content in known}
        steps = parse_window(window)
        for _, action, observation in steps:
            failure = _FAILURE.search(observation)
            content = f"failed: {action} -> {failure.group(1)}" if failure and action else None
            if content is not None and content not in saved:
                calls.append(render_tool_call("memory_save_procedural", {"content": content}))
                saved.add(content)
        visible = "\n".join([task, *(f"{a}\n{o}" for _, a, o in steps)])
        for kind, fact in FACTS.items():
            value = fact_value(kind, visible)
            if value is None or fact.sentence(value) in saved:
                continue
            stale = [i for i, content in known if _states(kind, content)]  # the same fact, another value
            tool = "memory_save_knowledge" if fact.memory == "knowledge" else "memory_save_procedural"
            args = {"content": fact.sentence(value), **({"id": stale[-1]} if stale else {})}
            calls.append(render_tool_call(tool, args))
            saved.add(fact.sentence(value))
        return "\n".join(calls)


def _states(kind: str, content: str) -> bool:
    """Whether a bank entry is the canonical sentence of a ``kind`` fact (any value)."""
    value = fact_value(kind, content)
    return value is not None and content == FACTS[kind].sentence(value)


def _subtask_by_name(name: str) -> Subtask | None:
    if name.startswith("install "):
        return _install(name.split(" ", 1)[1])
    for sub in [*FILLERS, *USES.values(), Subtask("read the config", None, "cat config.yaml")]:
        if sub.name == name:
            return sub
    return None


# ---------------------------------------------------------------------------------------------------- reference loop
@dataclass
class ProactiveRun:
    """The result of :func:`simulate_proactive`."""

    outcome: float
    steps: int
    turns: list[Turn]
    reminders: int = 0
    wasted: int = 0
    pivots: list[dict[str, Any]] = field(default_factory=list)
    fact_turns: list[tuple[int, str]] = field(default_factory=list)
    memory_calls: list[tuple[str, list[Message], str]] = field(default_factory=list)


@dataclass
class _Bank:
    status: str = ""
    knowledge: dict[str, str] = field(default_factory=dict)
    procedural: dict[str, str] = field(default_factory=dict)
    next_id: int = 1

    def apply(self, reply: str) -> None:
        for call in parse_tool_calls(reply).calls:
            content = str(call.arguments.get("content", ""))
            if call.name == "memory_update_status":
                self.status = content
            elif call.name in ("memory_save_knowledge", "memory_save_procedural"):
                prefix, store = ("k", self.knowledge) if call.name.endswith("knowledge") else ("p", self.procedural)
                store[f"{prefix}{self.next_id}"] = content
                self.next_id += 1
            elif call.name == "memory_delete":
                entry = str(call.arguments.get("id", ""))
                self.knowledge.pop(entry, None)
                self.procedural.pop(entry, None)

    def render(self) -> str:
        return render_bank(self.status, list(self.knowledge.items()), list(self.procedural.items()))


def window_messages(turns: list[tuple[str, str]], k: int, reminder: str | None) -> list[Message]:
    """The action agent's messages: system prompt, the last ``k`` turns (the statement is turn 0, a user message),
    then the transient reminder if any."""
    messages = [Message(role="system", content=ACTION_AGENT_SYSTEM)]
    start = max(0, len(turns) - k)
    for i in range(start, len(turns)):
        action, observation = turns[i]
        if i == 0:
            messages.append(Message(role="user", content=observation))
        else:
            messages.append(Message(role="assistant", content=render_tool_call("act", {"action": action})))
            messages.append(Message(role="tool", content=observation))
    if reminder:
        messages.append(Message(role="user", content=render_memory_context(reminder)))
    return messages


def find_pivot(turns: list[tuple[str, str]], k: int) -> dict[str, Any] | None:
    """The pivot at this point of an episode, or None. ``turns`` are the (action, observation) pairs so far (turn 0
    is ``("", task statement)``); the step is a pivot when the next subtask needs a fact that the episode has shown
    but the agent's last ``k`` turns do not: a reminder of it changes the agent's next action. Returns ``step``,
    ``subtask`` (1-based), ``name``, ``fact``, ``requirement`` (missing it violates the task) and ``reminder`` (the
    fact's canonical sentence)."""
    nxt = parse_next(turns[-1][1])
    sub = _subtask_by_name(nxt[0]) if nxt else None
    if nxt is None or sub is None or sub.fact is None:
        return None
    start = max(0, len(turns) - k)
    visible = "\n".join(o if i == 0 else f"{a}\n{o}" for i, (a, o) in enumerate(turns) if i >= start)
    value = fact_value(sub.fact, "\n".join(f"{a}\n{o}" for a, o in turns))
    if value is None or fact_value(sub.fact, visible) is not None:
        return None
    return {"step": len(turns) - 1, "subtask": nxt[1], "name": sub.name, "fact": sub.fact,
            "requirement": sub.fact in REQUIREMENTS, "reminder": FACTS[sub.fact].sentence(value)}


def simulate_proactive(
    task: ProactiveTask,
    agent: ScriptedPolicy,
    memory: ScriptedPolicy | None,
    *,
    k: int | None = None,
    trigger_every: int = 1,
    seed: int = 0,
    ideal_reminders: bool = False,
) -> ProactiveRun:
    """Run ``agent`` on ``task`` with a proactive memory agent: at the first step and every ``trigger_every`` steps
    ``memory`` answers the Phase 1 prompt (bank tool calls, applied in order) and then the Phase 2 prompt (a
    reminder, injected once into the next agent call). ``memory=None`` runs the agent on its window alone.
    ``ideal_reminders`` injects exactly the needed fact whenever it is out of sight (how pivots are found).

    This is the reference for the agent loop's proactive system (``rollout``): the same message shapes, in-process.
    """
    k = k or task.params.window
    rng = random.Random(seed)
    meta = {"task_id": task.task_id, "truth": task.truth()}
    turns: list[tuple[str, str]] = [("", task.reset())]
    bank = _Bank()
    run = ProactiveRun(outcome=0.0, steps=0, turns=[])
    over = False
    while not over and task.s.steps < task.max_steps:
        t = len(turns) - 1
        window = [(i, a, o) for i, (a, o) in enumerate(turns)][max(0, len(turns) - k) :]
        window_text = render_window(window)
        reminder: str | None = None
        if memory is not None and t % trigger_every == 0:
            prompt = as_messages(render_phase1_prompt(task.task, window_text, bank.render()))
            reply = memory.respond(prompt, rng, {**meta, "role": "bank_edit", "step": t})
            run.memory_calls.append(("bank_edit", prompt, reply))
            bank.apply(reply)
            prompt = as_messages(render_phase2_prompt(task.task, window_text, bank.render()))
            reply = memory.respond(prompt, rng, {**meta, "role": "intervene", "step": t})
            run.memory_calls.append(("intervene", prompt, reply))
            reminder = parse_intervention(reply)[0]
        pivot = find_pivot(turns, k)
        if pivot is not None:
            run.pivots.append(pivot)
            if ideal_reminders:
                reminder = pivot["reminder"]
        if reminder:
            run.reminders += 1
        reply = agent.respond(window_messages(turns, k, reminder), rng, {"task_id": task.task_id, "step": t})
        calls = parse_tool_calls(reply).calls
        action = str(calls[0].arguments.get("action", "")) if calls else reply
        if action == "pwd":
            run.wasted += 1
        observation, over = task.step(action)
        turns.append((action, observation))
        for kind in task.facts:
            if fact_value(kind, observation) is not None:
                run.fact_turns.append((len(turns) - 1, kind))
    run.fact_turns += [(0, kind) for kind in task.facts if fact_value(kind, turns[0][1])]
    run.steps = task.s.steps
    run.outcome = task.finish(None)
    run.turns = [Turn(turn_idx=i, action=a or "start", observation=o) for i, (a, o) in enumerate(turns)]
    return run
