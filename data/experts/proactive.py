"""The proactive oracle expert: Phase 1 bank edits and Phase 2 reminder-or-silence, from the true task state.

It answers the prompts of :func:`~memrl.data.formats.render_phase1_prompt` (reply: bank tool calls rendered with
:func:`~memrl.data.formats.render_tool_call`, one per line) and :func:`~memrl.data.formats.render_phase2_prompt` (reply:
:func:`~memrl.data.formats.render_intervention`). It reads the task, the recent window and the bank from the prompt; the
plan (which fact each subtask needs) comes from request metadata ``truth`` (:meth:`ProactiveTask.truth`) or from a
``truths`` table by ``task_id``, and without either from the subtask names themselves.

Phase 1 saves every fact visible in the task or the window that the bank lacks (requirements and environment facts
as knowledge, diagnosed failures as procedural entries), updates the private status, and deletes entries no
remaining subtask needs. Phase 2 reminds right before a pivot (the next subtask needs a fact the window does not
show) with the bank entry that states it, or, when the bank lacks it, with the requirement as the task statement
gives it (the statement is part of the prompt, and all the injection-only ablation has), and stays silent otherwise.
Knobs: ``miss_rate`` (stay silent at a pivot), ``false_alarm_rate`` (remind needlessly at a non-pivot step),
``drop_rate`` (skip saving an entry), ``note_risk`` (Phase 1's status also names the open risk: the fact the next
subtask needs while the window does not show it, ``; risk: SENTENCE``; a Phase 2 model then reads the decision-relevant
state from one fixed place, which is how a small model can learn the when-to-intervene decision quickly),
``cite_ids`` (Phase 2 cites the bank entry as the bank shows it, ``<context_for_action>k2: SENTENCE
</context_for_action>``, for a memory agent with ``cite_entries``; the noted risk is written the same way).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from memrl.data.config import ConfigModel
from memrl.data.formats import BankView, parse_phase_prompt, parse_window, render_intervention, render_tool_call
from memrl.data.tasks.proactive import FACT_KINDS, FACTS, fact_value, parse_next, subtask_by_name

__all__ = ["ProactiveOracle", "ProactiveOracleConfig"]


class ProactiveOracleConfig(ConfigModel):
    """Noise knobs of the proactive oracle (defaults: a perfect expert)."""

    miss_rate: float = Field(0.0, ge=0, le=1)  # chance of staying silent at a pivot
    false_alarm_rate: float = Field(0.0, ge=0, le=1)  # chance of a needless reminder at a non-pivot step
    drop_rate: float = Field(0.0, ge=0, le=1)  # chance of skipping saving a bank entry
    note_risk: bool = False  # Phase 1 status also names the open risk
    cite_ids: bool = False  # Phase 2 reminders cite the bank entry's id (k2: ...)


class ProactiveOracle:
    """Programmatic expert for both proactive memory phases (a :class:`~memrl.data.schemas.ScriptedPolicy`)."""

    name = "proactive-oracle"

    def __init__(
        self,
        config: ProactiveOracleConfig | dict[str, Any] | None = None,
        truths: Mapping[str, dict[str, Any]] | None = None,
    ) -> None:
        self.config = (
            config if isinstance(config, ProactiveOracleConfig) else ProactiveOracleConfig.model_validate(config or {})
        )
        self.truths = dict(truths or {})

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        """Bank tool calls (Phase 1) or a reminder / silence (Phase 2); empty text for any other prompt."""
        parsed = parse_phase_prompt(messages)
        if parsed is None:
            return ""
        phase, task, window, bank = parsed
        truth = metadata.get("truth") or self.truths.get(str(metadata.get("task_id")), {})
        if phase == 1:
            return self.phase1(task, window, bank, truth, rng)
        return self.phase2(window, bank, truth, rng, task)

    @staticmethod
    def _needs(truth: dict[str, Any], name: str, index: int) -> str | None:
        plan = truth.get("plan")
        if plan and 0 < index <= len(plan):
            return plan[index - 1][1]
        sub = subtask_by_name(name)
        return sub.fact if sub else None

    @staticmethod
    def _entries(bank: BankView) -> list[tuple[str, str]]:
        return [*bank.knowledge.items(), *bank.procedural.items()]

    def _cite(self, entry_id: str, content: str) -> str:
        """A bank entry as a reminder: its line (``k2: SENTENCE``) with ``cite_ids``, else its content."""
        return f"{entry_id}: {content}" if self.config.cite_ids else content

    def phase1(self, task: str, window: str, bank: BankView, truth: dict[str, Any], rng: random.Random) -> str:
        """The bank edits for this memory step."""
        calls = []
        nxt = parse_next(window)
        visible = f"{task}\n{window}"
        entries = self._entries(bank)
        if nxt is not None:
            status = f"at subtask {nxt[1]} of {nxt[2]}: {nxt[0]}"
            if self.config.note_risk and (risk := self._risk(window, entries, truth, task)) is not None:
                status += f"; risk: {risk}"
            calls.append(render_tool_call("memory_update_status", {"content": status}))
        kinds = truth.get("facts") or list(FACT_KINDS)
        remaining = None
        if nxt is not None and truth.get("plan"):
            remaining = {fact for _, fact in truth["plan"][nxt[1] - 1 :] if fact}
        for kind in kinds:
            value = fact_value(kind, visible)
            stored = [i for i, c in entries if fact_value(kind, c) is not None]
            if remaining is not None and kind not in remaining:
                calls += [render_tool_call("memory_delete", {"id": i}) for i in stored]
                continue
            if value is None or any(fact_value(kind, c) == value for _, c in entries):
                continue
            if rng.random() < self.config.drop_rate:
                continue
            fact = FACTS[kind]
            tool = "memory_save_knowledge" if fact.memory == "knowledge" else "memory_save_procedural"
            calls.append(render_tool_call(tool, {"content": fact.sentence(value)}))
        return "\n".join(calls)

    def _risk(self, window: str, entries: list[tuple[str, str]], truth: dict[str, Any], task: str) -> str | None:
        """The sentence of the fact the next subtask needs while the window does not show it (the bank entry that
        states it, led by its id with ``cite_ids``; else the task statement's), or None: what :meth:`phase2` would
        remind of."""
        steps = parse_window(window)
        nxt = parse_next(steps[-1][2]) if steps else None
        need = self._needs(truth, nxt[0], nxt[1]) if nxt is not None else None
        if need is None or fact_value(need, "\n".join(f"{a}\n{o}" for _, a, o in steps)) is not None:
            return None
        stored = [(i, c) for i, c in entries if fact_value(need, c) is not None]
        if stored:
            return self._cite(*stored[-1])
        value = fact_value(need, task)
        return FACTS[need].sentence(value) if value is not None else None

    def phase2(self, window: str, bank: BankView, truth: dict[str, Any], rng: random.Random, task: str = "") -> str:
        """A reminder right before a pivot, silence otherwise (noisy per the config). The reminder is the bank entry
        that states the needed fact, else the fact's sentence when the task statement states it, else silence."""
        steps = parse_window(window)
        nxt = parse_next(steps[-1][2]) if steps else None
        if nxt is None:
            return render_intervention(None)
        need = self._needs(truth, nxt[0], nxt[1])
        seen = "\n".join(f"{a}\n{o}" for _, a, o in steps)
        entries = self._entries(bank)
        if need is not None and fact_value(need, seen) is None:
            if rng.random() < self.config.miss_rate:
                return render_intervention(None)
            match = [(i, c) for i, c in entries if fact_value(need, c) is not None]
            if match:
                return render_intervention(self._cite(*match[-1]))
            value = fact_value(need, task)
            return render_intervention(FACTS[need].sentence(value) if value is not None else None)
        if entries and rng.random() < self.config.false_alarm_rate:
            others = [(i, c) for i, c in entries if need is None or fact_value(need, c) is None]
            return render_intervention(self._cite(*rng.choice(others)) if others else None)
        return render_intervention(None)
