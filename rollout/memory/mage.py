"""Mage ("Memory as Execution State Management" (arXiv 2606.06090), section 3 and Algorithm 1): memory as
execution-state management.

The agent's history is a two-layer tree. The bottom layer holds action-observation nodes (root: the start
observation); the top layer holds summary nodes with ``cover_nodes`` (the bottom nodes they compress, in execution
order), a ``boundary`` (the bottom node the covered segment starts after: the ``@step`` the reasoner sees and revises
to) and a diagnostic ``note``. Pointers ``p_b``/``p_t`` track the current position in each layer; ``step`` (the
paper's global step) gives every new node a monotonically increasing id.

The reasoner's context is the execution state S = (C, R, H): C the summaries on the root-to-``p_t`` path, R the bottom
nodes since the last compression, H the children of ``p_b`` and ``p_t`` (alternatives explored before) plus
diagnostic notes. Operations, as in Algorithm 1:

- **Grow** (automatic, on every environment turn): merge into an identical child of ``p_b`` or add a new node.
- **Compress**: the reasoner's ``compress(summary)`` tool at a subgoal boundary, or automatically (fallback) once R
  holds ``max_raw_turns`` turns or ``max_raw_chars`` characters; a child of ``p_t`` covering the same nodes is reused.
  The summary is the reasoner's when it gives one (``agent_summaries``), else a ``mage_compress`` memory-model call.
- **Maintain**: a ``mage_maintain`` memory-model call validates the new summary against the task and the covered
  trace; a failure records the diagnosis in the summary's ``note`` and triggers Revise.
- **Revise**: restore both pointers to the target boundary, skip the failed summary, R = {}, and H = children of
  ``p_t`` and ``p_b`` plus the diagnosis. The reasoner's ``revise(step, reason)`` tool revises to any boundary in C.

Ablations (:class:`MageConfig`): ``compress=False`` (w/o Compress: R grows without bound, no Maintain either),
``maintain=False`` (w/o Maintain), ``revise=False`` (w/o Revise: failures are only noted).

Question-answering mode follows :mod:`memrl.rollout.memory.workflow`: replayed trajectory turns Grow the tree and are
compressed (fallback) and maintained as they arrive; the question turn adds ``question: ...`` as the last line of the
reasoner's message, under S. A Maintain failure on replayed turns is noted (shown beside the summary in C and in H)
but does not Revise: a recorded log cannot be re-executed from the boundary.

Deviations from the paper: summary nodes get their own ids from the global step and carry the paper's id (the
boundary ``b.id``) as ``boundary``, so sibling summaries that start at the same boundary stay distinct; the
environment itself is not rolled back by Revise (as in the paper, the agent re-executes from the restored state).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from memrl.data.config import ConfigModel
from memrl.data.formats import ToolCall
from memrl.data.schemas import Message
from memrl.rollout.memory.base import MemoryRequest, RoleSampling, ToolResult, Turn, register_memory
from memrl.rollout.memory.prompts_mage import (
    mage_reasoner_system,
    parse_mage_summary,
    parse_mage_verdict,
    render_mage_compress,
    render_mage_maintain,
    render_mage_state,
    render_mage_steps,
)
from memrl.rollout.memory.workflow import Inbound, Job, JobQueueMemory, action_of, truncate

__all__ = ["BottomNode", "ExecutionState", "Hints", "MageConfig", "MageMemory", "TopNode"]


@dataclass
class BottomNode:
    """An action-observation node of the bottom layer."""

    node_id: int
    action: str
    observation: str
    parent: int | None
    children: list[int] = field(default_factory=list)


@dataclass
class TopNode:
    """A summary node of the top layer."""

    node_id: int
    content: str
    boundary: int | None  # the bottom node the covered segment starts after (None for the root)
    cover_nodes: list[int]
    parent: int | None
    children: list[int] = field(default_factory=list)
    note: str = ""


@dataclass
class Hints:
    """H: alternatives explored before (children of p_b and p_t) and diagnostic notes."""

    bottom: list[int] = field(default_factory=list)
    top: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class ExecutionState:
    """S = (C, R, H) as plain values: C as (boundary, summary) pairs, R as (action, observation) pairs."""

    C: list[tuple[int, str]]
    R: list[tuple[str, str]]
    H: Hints


class MageConfig(ConfigModel):
    """Mage's switches (the paper's ablations) and limits."""

    name: Literal["mage"] = "mage"  # selects this memory system
    compress: bool = True  # Compress on; false: w/o Compress (no Maintain, no Revise either)
    maintain: bool = True  # Maintain validates each new summary; false: w/o Maintain
    revise: bool = True  # Revise on a Maintain failure and the revise tool; false: only noted
    agent_summaries: bool = True  # use the summary the reasoner passes to compress(); else the memory model writes it
    max_raw_turns: int = 12  # fallback Compress once R holds this many turns
    max_raw_chars: int = 8000  # ... or this many characters
    max_notes: int = 4  # diagnostic notes kept in H
    hint_chars: int = 200  # each hint line is cut to this length
    observation_chars: int = 0  # observations in R cut to this length (0: whole)
    sampling: dict[str, RoleSampling] = {
        "mage_compress": RoleSampling(temperature=0.0, max_tokens=256),
        "mage_maintain": RoleSampling(temperature=0.0, max_tokens=128),
    }


@register_memory("mage", config=MageConfig)
class MageMemory(JobQueueMemory):
    """Mage behind the memory-system interface (see the module docstring)."""

    name = "mage"

    config: MageConfig
    config_model = MageConfig

    def __init__(self, config: MageConfig | None = None) -> None:
        super().__init__(config)
        revise = self.config.revise and self.config.compress  # without Compress there is no boundary to revise to
        self.tools = tuple(t for t, on in (("compress", self.config.compress), ("revise", revise)) if on)

    def _clear(self) -> None:
        super()._clear()
        self.bottom: dict[int, BottomNode] = {0: BottomNode(0, "", "", None)}
        self.top: dict[int, TopNode] = {0: TopNode(0, "", None, [0], None)}
        self.p_b = 0
        self.p_t = 0
        self.step = 1  # the global step: the id of the next new node (0 is both roots)
        self.C: list[int] = []
        self.R: list[int] = []
        self.H = Hints()
        self._fallback_queued = False

    # ---------------------------------------------------------------------------------------------------------
    # Algorithm 1

    def grow(self, action: str, observation: str) -> int:
        """Grow: move ``p_b`` into an identical child, or add a new node; returns ``p_b``."""
        for child in self.bottom[self.p_b].children:
            node = self.bottom[child]
            if node.action == action and node.observation == observation:
                self.p_b = child
                self.R.append(child)
                self.H.bottom = list(node.children)
                return child
        node = BottomNode(self.step, action, observation, self.p_b)
        self.step += 1
        self.bottom[node.node_id] = node
        self.bottom[self.p_b].children.append(node.node_id)
        self.p_b = node.node_id
        self.R.append(node.node_id)
        self.H.bottom = []
        return node.node_id

    def trace(self, boundary: int, end: int) -> list[int]:
        """Bottom nodes after ``boundary`` up to ``end``, in execution order."""
        path: list[int] = []
        current: int | None = end
        while current is not None and current != boundary:
            path.append(current)
            current = self.bottom[current].parent
        if current is None:
            raise ValueError(f"node {end} does not descend from boundary {boundary}")
        return path[::-1]

    def compress(self, summary: str) -> int | None:
        """Compress R into a summary node under ``p_t`` (reusing a child that covers the same nodes); returns the new
        ``p_t``, or None when there is nothing to compress."""
        boundary = self.top[self.p_t].cover_nodes[-1]
        covered = self.trace(boundary, self.p_b)
        if not covered:
            return None
        for child in self.top[self.p_t].children:
            node = self.top[child]
            if node.cover_nodes == covered:
                node.content = summary
                self._enter_summary(child)
                return child
        node = TopNode(self.step, summary, boundary, covered, self.p_t)
        self.step += 1
        self.top[node.node_id] = node
        self.top[self.p_t].children.append(node.node_id)
        self._enter_summary(node.node_id)
        return node.node_id

    def _enter_summary(self, top_id: int) -> None:
        self.p_t = top_id
        self.R = []
        self.C.append(top_id)
        self.H.top = list(self.top[top_id].children)

    def revise(self, feedback: str, boundary: int) -> str | None:
        """Revise to the summary in C whose boundary is ``boundary``: drop it and everything after it from C, restore
        ``p_t`` to its parent and ``p_b`` to the boundary node. Returns an error message, or None on success."""
        targets = {self.top[t].boundary: t for t in self.C}
        if boundary not in targets:
            valid = ", ".join(f"@{b}" for b in targets) or "none"
            return f"no compressed boundary @{boundary} (valid: {valid})"
        while self.top[self.p_t].boundary != boundary:
            self.C.remove(self.p_t)
            self.p_t = self._top_parent(self.p_t)
        failed = self.top[self.p_t]
        if not failed.note:
            failed.note = feedback
        self.C.remove(self.p_t)
        self.p_t = self._top_parent(self.p_t)  # skip the failed summary
        self.p_b = self.top[self.p_t].cover_nodes[-1]
        self.R = []
        self.H.top = list(self.top[self.p_t].children)
        self.H.bottom = list(self.bottom[self.p_b].children)
        self._note(feedback)
        return None

    def _top_parent(self, top_id: int) -> int:
        parent = self.top[top_id].parent
        assert parent is not None, "the top root is never in C"
        return parent

    def _note(self, feedback: str) -> None:
        if feedback:
            self.H.notes = [*self.H.notes, feedback][-self.config.max_notes :]

    def state(self) -> ExecutionState:
        """S = (C, R, H) as plain values."""
        return ExecutionState(
            C=[(self.top[t].boundary or 0, self.top[t].content) for t in self.C],
            R=[(self.bottom[n].action, self.bottom[n].observation) for n in self.R],
            H=Hints(list(self.H.bottom), list(self.H.top), list(self.H.notes)),
        )

    # ---------------------------------------------------------------------------------------------------------
    # Turns and jobs

    def _raw_too_long(self) -> bool:
        chars = sum(len(self.bottom[n].action) + len(self.bottom[n].observation) for n in self.R)
        return len(self.R) >= self.config.max_raw_turns or chars >= self.config.max_raw_chars

    def _on_start(self, turn: Turn) -> None:
        self.bottom[0].observation = turn.observation

    def _ingest(self, item: Inbound) -> None:
        self.grow(action_of(item.turn.action_text), item.turn.observation)
        if self.config.compress and not self._fallback_queued and self._raw_too_long():
            self._fallback_queued = True
            self._enqueue(
                self._new_job("compress", origin="fallback", summary=None, phase="summarize", replayed=item.replayed)
            )

    def _steps_text(self, nodes: list[int]) -> str:
        return render_mage_steps([(n, self.bottom[n].action, self.bottom[n].observation) for n in nodes])

    def _compressed_pairs(self) -> list[tuple[int, str]]:
        return [(self.top[t].boundary or 0, self.top[t].content) for t in self.C]

    def _request(self, job: Job) -> MemoryRequest | None:
        data = job.data
        if data["phase"] == "summarize":
            if not self.R:
                self._end_compress(job, error="nothing to compress: no steps since the last boundary")
                return None
            if data["summary"] is None:
                messages = render_mage_compress(self.task, self._compressed_pairs(), self._steps_text(self.R))
                return self._call(job, "mage_compress", messages, phase="compress", origin=data["origin"])
            self._apply_compress(job, data["summary"])
        if data["phase"] == "maintain":
            node = self.top[data["top"]]
            messages = render_mage_maintain(self.task, self._steps_text(node.cover_nodes), node.content)
            return self._call(job, "mage_maintain", messages, phase="maintain", origin=data["origin"], top=node.node_id)
        return None

    def _consume(self, job: Job, text: str) -> None:
        data = job.data
        if data["phase"] == "summarize":
            summary = parse_mage_summary(text)
            if not summary:
                self.count("mage_compress_empty")
                last = self.bottom[self.R[-1]]
                summary = f"steps {self.R[0]}-{self.R[-1]}; last: {last.action} -> {truncate(last.observation, 200)}"
            self._apply_compress(job, summary)
        elif data["phase"] == "maintain":
            passed, diagnosis = parse_mage_verdict(text)
            if passed is None:
                self.count("mage_maintain_unparsed")
                passed = True  # an unreadable judge must not destroy progress
            self.count("mage_maintain_pass" if passed else "mage_maintain_fail")
            if passed:
                self.top[data["top"]].note = ""  # a reused summary node passes now: its old diagnosis is stale
                self._end_compress(job, message=f"compressed into @{data['boundary']}; check passed")
                return
            self._on_maintain_failure(job, diagnosis or "the summary failed its check")

    def _apply_compress(self, job: Job, summary: str) -> None:
        top_id = self.compress(summary)
        if top_id is None:
            self._end_compress(job, error="nothing to compress: no steps since the last boundary")
            return
        self.count("mage_compress")
        job.data.update(top=top_id, boundary=self.top[top_id].boundary)
        if self.config.maintain:
            job.data["phase"] = "maintain"
        else:
            self._end_compress(job, message=f"compressed into @{self.top[top_id].boundary}")

    def _on_maintain_failure(self, job: Job, diagnosis: str) -> None:
        node = self.top[job.data["top"]]
        node.note = diagnosis
        if self.config.revise and not job.data["replayed"] and node.node_id in self.C:
            self.revise(diagnosis, node.boundary or 0)
            self.count("mage_revise_auto")
            message = (
                f"summary @{node.boundary} failed its check ({diagnosis}); returned to @{node.boundary}, "
                "continue on a new branch"
            )
        else:
            self._note(diagnosis)
            message = f"summary @{node.boundary} failed its check ({diagnosis})"
        self._end_compress(job, message=message)

    def _end_compress(self, job: Job, message: str = "", error: str | None = None) -> None:
        job.data["phase"] = "done"
        if job.data["origin"] == "fallback":
            self._fallback_queued = False
            if message and not job.data["replayed"]:
                self._transient.append(message)
            if error:
                self.count("mage_compress_nothing")
            return
        result = ToolResult(content=message, error=error)
        self._transient.append(f"error: {error}" if error else message)
        self._finish_tool(result)

    def _start_tool(self, call: ToolCall, step: int) -> ToolResult | Job:
        if call.name == "compress" and self.config.compress:
            summary = call.arguments.get("summary")
            given = summary.strip() if isinstance(summary, str) and self.config.agent_summaries else ""
            return self._new_job("compress", origin="agent", summary=given or None, phase="summarize", replayed=False)
        if call.name == "revise" and "revise" in self.tools:
            raw = call.arguments.get("step", call.arguments.get("boundary"))
            try:
                boundary = int(str(raw).strip().lstrip("@"))
            except ValueError:
                return self._tool_error(f"revise needs a step id like 3 or @3, got {raw!r}")
            reason = str(call.arguments.get("reason", "") or "revised by the agent")
            error = self.revise(reason, boundary)
            if error:
                return self._tool_error(error)
            self.count("mage_revise_agent")
            message = f"returned to @{boundary}; continue on a new branch"
            self._transient.append(message)
            return ToolResult(content=message)
        return self._tool_error(f"unknown or disabled tool {call.name!r}")

    def _tool_error(self, error: str) -> ToolResult:
        self.count("mage_tool_errors")
        self._transient.append(f"error: {error}")
        return ToolResult(content="", error=error)

    # ---------------------------------------------------------------------------------------------------------
    # The reasoner's view

    def _hint_lines(self) -> list[str]:
        limit = self.config.hint_chars
        lines = []
        for child in self.H.bottom:
            node = self.bottom[child]
            lines.append(truncate(f"tried before from here: {node.action} -> {node.observation}", limit))
        for child in self.H.top:
            node = self.top[child]
            failed = f" (failed check: {node.note})" if node.note else ""
            lines.append(truncate(f"earlier attempt from @{node.boundary}: {node.content}{failed}", limit))
        lines += [truncate(f"diagnosis: {note}", limit) for note in self.H.notes]
        return lines

    def reasoner_messages(self, system_prompt: str) -> list[Message]:
        """System prompt, then one user message with the task and S = (C, R, H) (and the question in QA mode)."""
        compressed = []
        for t in self.C:
            node = self.top[t]
            failed = f" (failed check: {node.note})" if node.note else ""
            compressed.append(f"[@{node.boundary}] {node.content}{failed}")
        recent = render_mage_steps(
            [(n, self.bottom[n].action, self.bottom[n].observation) for n in self.R], self.config.observation_chars
        )
        user = render_mage_state(
            self.task, self.start_observation, compressed, self._hint_lines(), recent, self._transient, self.question
        )
        default = mage_reasoner_system("compress" in self.tools, "revise" in self.tools)
        return [self._system_message(system_prompt, default), Message(role="user", content=user)]
