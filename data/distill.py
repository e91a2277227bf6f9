"""Expert-trace distillation into chat-format SFT datasets, one per memory role ("SAM: State-Adaptive Memory for
Long-Horizon Reasoning Agent" (arXiv 2605.24468), section 2.3; "Remember When It Matters: Proactive Memory Agent for
Long-Horizon Agents", section 3.5).

An expert memory model (a programmatic oracle or a frontier model) runs inside a memory system and leaves
:class:`~memrl.data.schemas.EpisodeTrace` records. Rejection sampling keeps the traces whose final outcome passes the
keep rule (by default ``outcome >= 1.0``: correct); every memory call of a kept trace becomes one
:class:`~memrl.data.schemas.SFTExample`: the exact messages the memory model saw plus the expert's output as the final
assistant message, filed under the call's role (``consolidate``, ``recall``, ``bank_edit``, ``intervene``, or any
other role string).

:class:`DistillWriter` is resumable. For each trace it appends the rows to ``<out>/<role>.jsonl`` and then one line to
``<out>/progress.jsonl``; reopening the directory drops a torn last line and the rows of a trace that has no progress
line yet (a kill between the two), so a resumed run ends with exactly the rows of an uninterrupted one.
:meth:`DistillWriter.finish` writes ``<role>.arrow`` copies and ``stats.json`` (kept / rejected counts per role and
overall) and prints the counts. One process writes a directory at a time.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import Field

from memrl.data.config import ConfigError, ConfigModel
from memrl.data.io import append_jsonl, atomic_write_text, iter_jsonl, read_arrow, read_jsonl, write_arrow, write_jsonl
from memrl.data.schemas import EpisodeTrace, Message, SFTExample

__all__ = [
    "PROGRESS_FILE",
    "STATS_FILE",
    "DistillWriter",
    "KeepRule",
    "RejectionConfig",
    "distill_traces",
    "format_stats",
    "load_sft_examples",
    "role_file",
    "trace_rows",
]

log = logging.getLogger(__name__)

KeepRule = Callable[[EpisodeTrace], bool]
"""Decides whether a trace is kept (its memory calls become SFT rows)."""

PROGRESS_FILE = "progress.jsonl"
STATS_FILE = "stats.json"
_RESERVED = {"progress", "stats"}
_SAFE_ROLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class RejectionConfig(ConfigModel):
    """Rejection sampling: which traces are kept and which of their memory calls become rows."""

    min_outcome: float = Field(1.0, description="keep a trace when its outcome is at least this (1.0: correct)")
    predicate: str | None = Field(
        None, description="'module:function' taking an EpisodeTrace and returning bool; replaces min_outcome"
    )
    roles: list[str] | None = Field(None, description="only these memory roles become rows (None: every role)")
    drop_failed_calls: bool = Field(True, description="skip calls with an error or a truncated output")

    def keep_rule(self) -> KeepRule:
        """The configured keep rule."""
        if self.predicate is None:
            threshold = self.min_outcome
            return lambda trace: trace.outcome is not None and trace.outcome >= threshold
        module, _, name = self.predicate.partition(":")
        if not module or not name:
            raise ConfigError(f"predicate {self.predicate!r}: expected 'package.module:function'")
        try:
            rule = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"predicate {self.predicate!r} cannot be imported: {exc}") from None
        if not callable(rule):
            raise ConfigError(f"predicate {self.predicate!r} is not callable")
        return rule

    def describe(self) -> str:
        """The keep rule in words (recorded in stats.json)."""
        return f"predicate {self.predicate}" if self.predicate else f"outcome >= {self.min_outcome:g}"


def role_file(out_dir: str | Path, role: str, suffix: str = ".jsonl") -> Path:
    """Where the rows of ``role`` live: ``<out_dir>/<role>.jsonl`` (``.arrow`` for the Arrow copy)."""
    if not _SAFE_ROLE.fullmatch(role) or role in _RESERVED:
        raise ValueError(f"role {role!r} cannot name a dataset file (letters, digits, '_', '.', '-'; not {_RESERVED})")
    return Path(out_dir) / f"{role}{suffix}"


def trace_rows(
    trace: EpisodeTrace, *, roles: Iterable[str] | None = None, drop_failed_calls: bool = True
) -> tuple[list[SFTExample], dict[str, int]]:
    """(rows, skipped calls per role) of one trace: every memory call becomes a row of its role.

    A call is skipped when it has no messages, when its role is not wanted, or (``drop_failed_calls``) when it
    carries an error or its output was cut by the length limit (a truncated target teaches truncation).
    """
    wanted = set(roles) if roles is not None else None
    rows: list[SFTExample] = []
    skipped: dict[str, int] = {}
    for index, call in enumerate(trace.memory_calls):
        if wanted is not None and call.role not in wanted:
            continue
        failed = call.error is not None or call.finish_reason == "length"
        if not call.messages or (drop_failed_calls and failed):
            skipped[call.role] = skipped.get(call.role, 0) + 1
            continue
        metadata: dict[str, Any] = {
            "call_id": call.call_id,
            "memory_system": trace.memory_system,
            "outcome": trace.outcome,
            "engine": call.engine,
            "step": call.step,
        }
        if call.metadata:
            metadata["call_metadata"] = call.metadata
        rows.append(
            SFTExample(
                row_id=f"{trace.trace_id}#{index}",
                role=call.role,
                messages=[*call.messages, Message(role="assistant", content=call.text)],
                task_id=trace.task_id,
                trace_id=trace.trace_id,
                metadata=metadata,
            )
        )
    return rows, skipped


def _torn(path: Path) -> bool:
    raw = path.read_bytes()
    return bool(raw) and not raw.endswith(b"\n")


class DistillWriter:
    """Resumable per-role SFT dataset writer over ``out_dir`` (see the module docstring)."""

    def __init__(self, out_dir: str | Path, rejection: RejectionConfig | None = None, *, keep: KeepRule | None = None):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.rejection = rejection or RejectionConfig()
        self.keep = keep or self.rejection.keep_rule()
        self.rule_text = "custom predicate" if keep is not None else self.rejection.describe()
        self._progress: dict[str, dict[str, Any]] = {}
        self.resumed = self._recover()

    # ------------------------------------------------------------------------------------------------------------
    @property
    def finished(self) -> set[str]:
        """Trace ids already written (a resumed run skips them)."""
        return set(self._progress)

    def is_done(self, trace_id: str) -> bool:
        """True when ``trace_id`` was already written (before or after a resume)."""
        return trace_id in self._progress

    def _recover(self) -> int:
        """Load the progress file and drop rows of unfinished traces; returns the number of finished traces."""
        progress = self.out_dir / PROGRESS_FILE
        if progress.exists():
            entries = list(iter_jsonl(progress, tolerate_torn_tail=True))
            self._progress = {str(e["trace_id"]): e for e in entries}
            if _torn(progress):
                write_jsonl(progress, entries)
        for path in sorted(self.out_dir.glob("*.jsonl")):
            if path.name == PROGRESS_FILE:
                continue
            rows = read_jsonl(path, SFTExample, tolerate_torn_tail=True)
            kept = [r for r in rows if r.trace_id in self._progress]
            if len(kept) != len(rows) or _torn(path):
                write_jsonl(path, kept)
        return len(self._progress)

    def add(self, trace: EpisodeTrace) -> bool:
        """Apply the keep rule to ``trace`` and write its rows; False when the trace was already written."""
        if trace.trace_id in self._progress:
            return False
        rows, skipped = trace_rows(
            trace, roles=self.rejection.roles, drop_failed_calls=self.rejection.drop_failed_calls
        )
        kept = bool(self.keep(trace))
        counts: dict[str, int] = {}
        for row in rows:
            counts[row.role] = counts.get(row.role, 0) + 1
        paths = [role_file(self.out_dir, row.role) for row in rows]  # a bad role name fails before any write
        if kept:
            for path, row in zip(paths, rows, strict=True):
                append_jsonl(path, row)
        entry = {
            "trace_id": trace.trace_id,
            "task_id": trace.task_id,
            "memory_system": trace.memory_system,
            "outcome": trace.outcome,
            "kept": kept,
            "rows": counts,
            "skipped": skipped,
        }
        append_jsonl(self.out_dir / PROGRESS_FILE, entry)
        self._progress[trace.trace_id] = entry
        return True

    # ------------------------------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Kept / rejected counts of traces and rows, overall and per role (rows of a rejected trace count as
        rejected rows of their roles)."""
        roles: dict[str, dict[str, int]] = {}

        def bucket(role: str) -> dict[str, int]:
            return roles.setdefault(
                role, {"kept": 0, "rejected": 0, "skipped": 0, "traces_kept": 0, "traces_rejected": 0}
            )

        kept_traces = 0
        for entry in self._progress.values():
            kept = bool(entry["kept"])
            kept_traces += kept
            for role, n in entry["rows"].items():
                b = bucket(role)
                b["kept" if kept else "rejected"] += n
                b["traces_kept" if kept else "traces_rejected"] += 1
            for role, n in entry.get("skipped", {}).items():
                bucket(role)["skipped"] += n
        total = len(self._progress)
        rows_kept = sum(b["kept"] for b in roles.values())
        rows_rejected = sum(b["rejected"] for b in roles.values())
        return {
            "keep_rule": self.rule_text,
            "traces": {
                "total": total,
                "kept": kept_traces,
                "rejected": total - kept_traces,
                "keep_rate": round(kept_traces / total, 4) if total else 0.0,
            },
            "rows": {
                "kept": rows_kept,
                "rejected": rows_rejected,
                "skipped": sum(b["skipped"] for b in roles.values()),
            },
            "roles": dict(sorted(roles.items())),
        }

    def finish(self, *, arrow: bool = True, echo: bool = True) -> dict[str, Any]:
        """Write the Arrow copies and ``stats.json``; print the counts when ``echo``; return the stats."""
        stats = self.stats()
        if arrow:
            for role, counts in stats["roles"].items():
                path = role_file(self.out_dir, role)
                rows = read_jsonl(path, SFTExample) if counts["kept"] and path.exists() else []
                write_arrow(role_file(self.out_dir, role, ".arrow"), rows)
        atomic_write_text(self.out_dir / STATS_FILE, json.dumps(stats, indent=2, sort_keys=True) + "\n")
        if echo:
            log.info(format_stats(stats))
        return stats


def format_stats(stats: dict[str, Any]) -> str:
    """A small table of the distillation counts."""
    t = stats["traces"]
    lines = [
        f"distill ({stats['keep_rule']}): traces kept {t['kept']} / rejected {t['rejected']} of {t['total']} "
        f"(keep rate {t['keep_rate']:.1%})",
        f"{'role':<16}{'rows kept':>10}{'rejected':>10}{'skipped':>9}",
    ]
    for role, b in stats["roles"].items():
        lines.append(f"{role:<16}{b['kept']:>10}{b['rejected']:>10}{b['skipped']:>9}")
    r = stats["rows"]
    lines.append(f"{'all':<16}{r['kept']:>10}{r['rejected']:>10}{r['skipped']:>9}")
    return "\n".join(lines)


def distill_traces(
    traces: Iterable[EpisodeTrace],
    out_dir: str | Path,
    rejection: RejectionConfig | None = None,
    *,
    keep: KeepRule | None = None,
    arrow: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Write the SFT datasets of ``traces`` into ``out_dir`` (resuming what is there) and return the stats."""
    from memrl.data.tracking import progress_bar

    writer = DistillWriter(out_dir, rejection, keep=keep)
    for trace in progress_bar(traces, desc="distill", disable=not progress, leave=False):
        writer.add(trace)
    return writer.finish(arrow=arrow)


def load_sft_examples(path: str | Path) -> list[SFTExample]:
    """The validated rows of a per-role dataset: a ``.jsonl`` file or an Arrow directory."""
    path = Path(path)
    return read_arrow(path, SFTExample) if path.is_dir() else read_jsonl(path, SFTExample)
