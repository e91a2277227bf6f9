"""The human-readable outputs of an evaluation: ``report.md`` and ``per_question.tsv``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memrl.data.io import atomic_write_text
from memrl.launch.evaluation.config import QA_KINDS, TASK_SYSTEMS, EvalConfig
from memrl.launch.evaluation.summary import NEEDS_MODEL_NOTE, OFFICIAL
from memrl.rewards.scorers import LOCOMO_CATEGORY_NAMES

__all__ = ["READER_NOTE", "write_per_question", "write_report"]


READER_NOTE = (
    "The reasoner is the programmatic reader: it answers with the gold answer exactly when the question's evidence "
    "(the needle turns' evidence strings, else the needle observations, else a gold answer) is in its context, and "
    "otherwise says the answer is not mentioned. Its scores measure what each memory system surfaced to the reasoner, "
    "not language ability."
)




def write_per_question(cfg: EvalConfig, records: list[dict[str, Any]], path: str | Path) -> Path:
    """``per_question.tsv``: one line per question (task run) sorted by dataset, episode, item, system and model, with
    the official score, the judge's, the answer and the gold answer, so two runs can be compared with ``diff``."""
    kinds = {d.name: d.kind for d in cfg.datasets}
    header = ["dataset", "episode", "item", "system", "model", "type", "official", "judge", "answer", "gold"]
    lines = ["\t".join(header)]

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.4f}"
        return " ".join(str(value).split())

    for r in sorted(records, key=lambda r: (r["dataset"], r["episode_id"], r["item_id"], r["system"], r["model"])):
        scores = r.get("scores") or {}
        metric = OFFICIAL.get(kinds.get(r["dataset"], ""), ("success",))[0]
        lines.append("\t".join(cell(v) for v in (
            r["dataset"], r["episode_id"], r["item_id"], r["system"], r["model"], r.get("qa_type") or r.get("mode"),
            scores.get(metric), scores.get("judge"), r.get("answer"), r.get("gold"))))
    return atomic_write_text(path, "\n".join(lines) + "\n")


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def _ci(row: dict[str, Any], metric: str) -> str:
    """``mean [low, high]`` of a metric (its 95% bootstrap interval), or ``-``."""
    value = row.get(metric)
    if value is None:
        return "-"
    low, high = row.get(f"{metric}_ci") or (None, None)
    return f"{value:.3f} [{low:.2f}, {high:.2f}]" if low is not None else _fmt(value)


def _tokens(value: float | None) -> int | None:
    return None if value is None else round(value)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return lines


def _horizon_key(value: str) -> tuple[float, str]:
    digits = "".join(ch for ch in value if ch.isdigit())
    scale = 1024 if "K" in value else 1
    return (int(digits) * scale if digits else float("inf"), value)


def _pivot(rows: list[dict[str, Any]], column: str, metric: str, order: list[str] | None = None,
           overall: list[dict[str, Any]] | None = None) -> tuple[list[str], list[list[Any]]]:
    values = order or sorted({str(r[column]) for r in rows}, key=_horizon_key if column == "horizon" else None)
    values = [v for v in values if any(str(r[column]) == v for r in rows)]
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        cells.setdefault((r["system"], r["model"]), {})[str(r[column])] = _ci(r, metric)
    totals = {(r["system"], r["model"]): _ci(r, metric) for r in overall or []}
    head = (["all"] if overall is not None else []) + values
    body = [[s, m, *([totals.get((s, m), "-")] if overall is not None else []), *[cell.get(v, "-") for v in values]]
            for (s, m), cell in cells.items()]
    return head, body


def write_report(cfg: EvalConfig, summary: dict[str, Any], path: str | Path) -> Path:
    """The markdown report: per dataset the benchmark's official metric, the side-by-side table with tokens per
    item, then the breakdowns; every mean carries its 95% bootstrap interval ``[low, high]``."""
    lines = [f"# memrl eval: {cfg.run.name or 'run'}", ""]
    if cfg.reasoner is None and any(s.kind in QA_KINDS for s in cfg.datasets):
        lines += [f"**Reader.** {READER_NOTE}", ""]
    lines += [f"Judge: {summary['judge']}. Memory models: "
              + ", ".join(f"`{m.name}` ({m.engine.engine_name if m.engine else 'scripted'})" for m in cfg.models)
              + ". Tokens are per question (per task run for task datasets): reasoner tokens spent (prefill not "
              "served from cache plus generated), memory-model prompt + completion tokens (answer phase plus the "
              "question's share of ingesting the trajectory). Every score is the mean with its 95% bootstrap "
              "confidence interval [low, high] (1000 resamples of the questions, or tasks).", ""]
    for name, entry in summary["datasets"].items():
        lines += [f"## {name} ({entry['kind']}, {entry['episodes']} episodes)", ""]
        if entry["kind"] in TASK_SYSTEMS:
            sampled = {(r["system"], r["model"]): r for r in entry["sampled"]}
            rows = [[r["system"], r["model"], r["n"], _ci(r, "success"),
                     _ci(sampled.get((r["system"], r["model"]), {}), "success"), _tokens(r["reasoner_tokens"]),
                     _tokens(r["memory_tokens"])] for r in entry["greedy"]]
            lines += _table(["system", "model", "tasks", "success (greedy)", "success (sampled)", "reasoner tok/task",
                             "memory tok/task"], rows)
            values, pivot = _pivot(entry["by_horizon"], "horizon", "success")
            lines += ["", "Success (greedy) by horizon:", "", *_table(["system", "model", *values], pivot), ""]
            continue
        metric, column, what = OFFICIAL[entry["kind"]]
        lines += [f"**Official metric: {what}.**", ""]
        if entry["kind"] == "memoryarena":
            rows = [[r["system"], r["model"], r["n"], _ci(r, "success"), _ci(r, "progress")] for r in entry["tasks"]]
            lines += _table(["system", "model", "tasks", "success rate", "progress score"], rows)
        else:
            breakdown = entry["by_category"] if column == "category" else entry["by_qa_type"]
            order = [LOCOMO_CATEGORY_NAMES[k] for k in sorted(LOCOMO_CATEGORY_NAMES)] if column == "category" else None
            values, pivot = _pivot(breakdown, column, metric, order, entry["overall"])
            lines += _table(["system", "model", *values], pivot)
        lines.append("")
        for system, model in entry.get("needs_model", []):
            lines += [f"**{system} x {model}:** {NEEDS_MODEL_NOTE}.", ""]
        has_locomo = "by_category" in entry
        header = ["system", "model", "questions", "judge acc", "judge score", "EM", "F1", "BLEU-1"]
        header += ["LoCoMo", "LoCoMo judge"] if has_locomo else []
        header += ["evidence in ctx", "reasoner tok/q", "memory tok/q"]
        # AMA-Bench's own normalisation for its EM / F1 (punctuation becomes a space), SQuAD's elsewhere
        em, f1 = ("ama_em", "ama_f1") if entry["kind"] in ("amabench", "ama_synthetic") else ("exact_match", "f1")
        rows = []
        for r in entry["overall"]:
            row = [r["system"], r["model"], r["n"], _ci(r, "judge_acc"), _ci(r, "judge"), _ci(r, em), _ci(r, f1),
                   _ci(r, "bleu1")]
            row += [_ci(r, "locomo"), _ci(r, "locomo_judge")] if has_locomo else []
            row += [_ci(r, "evidence_in_context"), _tokens(r["reasoner_tokens"]), _tokens(r["memory_tokens"])]
            rows.append(row)
        lines += ["All metrics:", "", *_table(header, rows)]
        if column != "qa_type":
            values, pivot = _pivot(entry["by_qa_type"], "qa_type", "judge_acc")
            lines += ["", "Judge accuracy by QA type:", "", *_table(["system", "model", *values], pivot)]
        values, pivot = _pivot(entry["by_horizon"], "horizon", metric)
        label = "LoCoMo F1" if metric == "locomo" else "Judge accuracy"
        lines += ["", f"{label} by horizon (conversation length in tokens, or the generator's target length):", "",
                  *_table(["system", "model", *values], pivot)]
        if "loader_defaults" in entry:
            d = entry["loader_defaults"]
            lines += ["", f"Loader defaults (as the benchmark's own loader takes them): {d['questions']} questions, "
                      "e.g. " + "; ".join(f"`{x}`" for x in d["examples"]) + "."]
        lines.append("")
    if summary["skipped"]:
        lines += ["Not applicable (skipped): " + "; ".join(summary["skipped"]) + ".", ""]
    lines += ["Per-question results (sorted, for `diff` between runs): `per_question.tsv`; every record: "
              "`results.jsonl`.", ""]
    return atomic_write_text(path, "\n".join(lines) + "\n")
