"""The proactive task (:class:`ProactiveTask`): behavioural state decay in a terminal-like environment with executable
state (see :mod:`memrl.data.tasks.proactive`). Its constructor plans the task from its seed and runs the reference loop
with ideal reminders, which fixes its pivots and its step budget.
"""

from __future__ import annotations

import copy
import fnmatch
import random
import re
from typing import Any

from memrl.data.formats import ACTION_AGENT_SYSTEM
from memrl.data.registry import register_task
from memrl.data.schemas import Episode, QAPair
from memrl.data.tasks.common import SpecTask
from memrl.data.tasks.proactive.agents import ActionAgent
from memrl.data.tasks.proactive.reference import simulate_proactive
from memrl.data.tasks.proactive.world import (
    FILLERS,
    PACKAGES,
    READ_CONFIG,
    REQUIREMENTS,
    RUN_ANY,
    USES,
    ProactiveParams,
    Subtask,
    TermState,
    install_subtask,
)

__all__ = ["ProactiveTask"]


@register_task(
    "proactive",
    params=ProactiveParams,
    section="proactive",
    reasoner="action_agent",
    memory="proactive",
    oracle="memrl.data.experts.proactive:ProactiveOracle",
)
class ProactiveTask(SpecTask):
    """One proactive episode (see :mod:`memrl.data.tasks.proactive`); implements the agent loop's task interface."""

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
            sources.append(install_subtask(packages[0]))
            uses += [install_subtask(pkg) for pkg in packages[1:]]
        if "db_port" in self.facts:
            sources.append(READ_CONFIG)
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
        self.s = TermState(
            files={
                "README.md",
                "config.yaml",
                "run.py",
                "log.txt",
                "src/app.py",
                "build/tmp",
                f"{self.values['protected']}/tmp",
                f"{self.values['protected']}/part1.csv",
            }
        )
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

    reasoner_system = ACTION_AGENT_SYSTEM  # the scripted action agent's prompt (not the memory system's)

    @property
    def horizon_label(self) -> str:
        """The horizon in per-horizon breakdowns (``6 subtasks``)."""
        return f"{self.params.n_subtasks} subtasks"

    def memory_defaults(self, config: Any) -> dict[str, Any]:
        """The memory window and the action agent's window: the task's agent window unless the config sets them."""
        return {"window": self.params.window, "action_window": self.params.window}

    def rollout_metadata(self, system: Any, config: Any) -> dict[str, Any]:
        """The episode metadata of a rollout: the pivots and the step budget (ground truth for pivot analysis)."""
        variant = getattr(config if config is not None else system.config, "variant", None)
        return {"family": "proactive", "variant": variant, "pivots": list(self.pivots), "budget": self.max_steps}

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
        return self._episode(
            self.reference.turns,
            qas,
            task_type="proactive",
            domain="terminal",
            metadata={
                "family": "proactive",
                "pivots": self.pivots,
                "budget": self.max_steps,
                "truth": self.truth(),
            },
        )
