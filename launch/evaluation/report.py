"""The human-readable outputs of an evaluation: ``report.md`` and ``per_question.tsv``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memrl.data.io import atomic_write_text
from memrl.launch.evaluation.config import QA_KINDS, TASK_SYSTEMS, EvalConfig
from memrl.launch.evaluation.summary import NEEDS_MODEL_NOTE, OFFICIAL, RESTS_ON_SHARE
from memrl.rewards.scorers import LOCOMO_CATEGORY_NAMES
from memrl.rollout.evaluation.reader import NOT_IN_CONTEXT

__all__ = ["READER_NOTE", "write_per_question", "write_report"]


READER_NOTE = (
    "The reasoner is the programmatic reader: it answers with the gold answer exactly when the question's evidence "
    "(the needle turns' evidence strings, else the needle observations, else a gold answer) is in its context, and "
    "otherwise says the answer is not mentioned. Its scores measure what each memory system surfaced to the reasoner, "
    "not language ability."
)
TASK_COLUMNS = (
    "An episode ends by the environment: success is the share won (the environment's word, else an outcome of 1); "
    "outcome is the verifier's score in [0, 1] as configured, and with partial credit the rewards so far for an "
    "episode cut by the step limit (truncated: the share cut); steps and tokens are per episode."
)
TOKENS_NOT_COUNTED = (
    "Token columns are left out: no tokenizer counted the scripted engines' tokens (`tokenizer: null`); set "
    "`tokenizer: tiny` or use model engines to count them."
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
        lines.append(
            "\t".join(
                cell(v)
                for v in (
                    r["dataset"],
                    r["episode_id"],
                    r["item_id"],
                    r["system"],
                    r["model"],
                    r.get("qa_type") or r.get("mode"),
                    scores.get(metric),
                    scores.get("judge"),
                    r.get("answer"),
                    r.get("gold"),
                )
            )
        )
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


def _pivot(
    rows: list[dict[str, Any]],
    column: str,
    metric: str,
    order: list[str] | None = None,
    overall: list[dict[str, Any]] | None = None,
) -> tuple[list[str], list[list[Any]]]:
    values = order or sorted({str(r[column]) for r in rows}, key=_horizon_key if column == "horizon" else None)
    values = [v for v in values if any(str(r[column]) == v for r in rows)]
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        cells.setdefault((r["system"], r["model"]), {})[str(r[column])] = _ci(r, metric)
    totals = {(r["system"], r["model"]): _ci(r, metric) for r in overall or []}
    head = (["all"] if overall is not None else []) + values
    body = [
        [s, m, *([totals.get((s, m), "-")] if overall is not None else []), *[cell.get(v, "-") for v in values]]
        for (s, m), cell in cells.items()
    ]
    return head, body


def _health_lines(cfg: EvalConfig, entry: dict[str, Any]) -> list[str]:
    """What the scores stand on, per system x model: unanswered items, malformed replies, failed requests and
    unparsed judge / memory-model outputs, and a flag on a score that rests on them."""
    rows = entry.get("health") or []
    if not rows:
        return []
    header = ["system", "model", "items", "no answer", "malformed reasoner replies (items)"]
    header += ["free-text answers"] if cfg.free_text_answers else []
    header += ["failed requests (items)", "judge unparsed", "memory-model unparsed", "score rests on them"]
    body = []
    for h in rows:
        row = [
            h["system"],
            h["model"],
            h["items"],
            h["no_answer"],
            f"{h['malformed_replies']} ({h['malformed_items']})",
        ]
        row += [h["free_text_answers"]] if cfg.free_text_answers else []
        row += [
            f"{h['failed_requests']} ({h['failed_items']})",
            h["judge_unparsed"],
            h["memory_unparsed"],
            "**yes**" if h["rests_on_failures"] else "no",
        ]
        body.append(row)
    lines = [
        "",
        "What the scores stand on (an unanswered item scores as a wrong answer; a judge request that failed "
        "or a judge reply that did not parse is scored by token F1):",
        "",
        *_table(header, body),
    ]
    for h in rows:
        if h["rests_on_failures"]:
            why = [f"{h['no_answer']} of {h['items']} items got no answer"]
            if h["malformed_items"]:
                why.append(f"{h['malformed_items']} had reasoner replies without the `answer` tool call")
            if h["failed_items"]:
                why.append(f"{h['failed_items']} met a request that failed after its retries")
            lines += [
                "",
                f"**{h['system']} x {h['model']}: the score rests on failures** ({'; '.join(why)}; at "
                f"least {RESTS_ON_SHARE:.0%} of the items): it says more about the reply format or the "
                "endpoints than about the memory system.",
            ]
    return lines


def _task_health_lines(entry: dict[str, Any]) -> list[str]:
    """What a task dataset's scores stand on: episodes that failed for a reason (an environment or agent error, a
    memory-model output the system could not use, a malformed reasoner reply), and a flag on a score resting on
    them."""
    rows = entry.get("health") or []
    if not rows:
        return []
    header = ["system", "model", "episodes", "env/agent errors", "memory-output errors", "malformed reasoner replies"]
    header += ["failed for a reason", "score rests on them"]
    body = [
        [
            h["system"],
            h["model"],
            h["items"],
            h["env_failures"],
            h["memory_errors"],
            h["malformed_items"],
            h["failed"],
            "**yes**" if h["rests_on_failures"] else "no",
        ]
        for h in rows
    ]
    lines = [
        "",
        "What the scores stand on (episodes with each kind of error; an episode failed for a reason when it was "
        "not won and met one):",
        "",
        *_table(header, body),
    ]
    for h in rows:
        if h["rests_on_failures"]:
            lines += [
                "",
                f"**{h['system']} x {h['model']}: the score rests on failures** ({h['failed']} of {h['items']} "
                f"episodes failed for a reason; at least {RESTS_ON_SHARE:.0%}): it says more about the environment, "
                "the reasoner's reply format or the memory model's output format than about the memory system.",
            ]
    return lines


def _adversarial_note(cfg: EvalConfig, entry: dict[str, Any]) -> list[str]:
    """LoCoMo's adversarial category rewards 'not mentioned': say how many of its answers said so, and that the
    programmatic reader says so for every adversarial question."""
    rows = [r for r in entry.get("adversarial_fallback") or [] if r["n"]]
    if not any(r["fallback"] for r in rows):
        return []
    shares = "; ".join(f"{r['system']} x {r['model']} {r['fallback']} of {r['n']}" for r in rows)
    if cfg.reasoner is None:
        why = (
            "The programmatic reader says so for every adversarial question whatever the memory kept: with the "
            "evidence in its context it answers the gold, 'Not mentioned in the conversation', and without it "
            f"its fallback '{NOT_IN_CONTEXT}'. The adversarial column measures that fallback, not memory."
        )
    else:
        why = (
            "A reasoner that says so whenever it lacks the evidence earns these points without any memory: read "
            "the adversarial column beside the other categories, not alone."
        )
    return [
        "",
        "**Note: adversarial is scored by a fallback.** LoCoMo scores an adversarial question 1 when the "
        f"answer says the information is not mentioned (or not available). Answers that say so: {shares}. {why}",
    ]


def _drop_tokens(header: list[str], rows: list[list[Any]], counted: bool) -> tuple[list[str], list[list[Any]]]:
    """The table without its two token columns (the last two) when no tokens were counted."""
    if counted:
        return header, rows
    return header[:-2], [row[:-2] for row in rows]


def write_report(cfg: EvalConfig, summary: dict[str, Any], path: str | Path) -> Path:
    """The markdown report: per dataset the benchmark's official metric, the side-by-side table with tokens per
    item, then the breakdowns; every mean carries its 95% bootstrap interval ``[low, high]``."""
    lines = [f"# memrl eval: {cfg.run.name or 'run'}", ""]
    probe = summary.get("reasoner_format") or {}
    if probe.get("follows") is False:
        lines += [
            f"**Warning: the reasoner does not answer in the harness's format.** Asked one easy question "
            f"before the run, it replied `{probe['reply']}` instead of the `answer` tool call "
            '(`<tool_call>{"name": "answer", "arguments": {"answer": ...}}</tool_call>`). '
            + (
                "Its plain-text replies are taken as answers (`free_text_answers: true`)."
                if cfg.free_text_answers
                else "Replies without the tool call count as malformed and their questions as unanswered; "
                "`free_text_answers: true` takes plain-text replies as answers."
            ),
            "",
        ]
    if cfg.reasoner is None and any(s.kind in QA_KINDS for s in cfg.datasets):
        lines += [f"**Reader.** {READER_NOTE}", ""]
    lines += [
        f"Judge: {summary['judge']}. Memory models: "
        + ", ".join(f"`{m.name}` ({m.engine.engine_name if m.engine else 'scripted'})" for m in cfg.models)
        + ". Tokens are per question (per task run for task datasets): reasoner tokens spent (prefill not "
        "served from cache plus generated), memory-model prompt + completion tokens (answer phase plus the "
        "question's share of ingesting the trajectory). Every score is the mean with its 95% bootstrap "
        "confidence interval [low, high] (1000 resamples of the questions, or tasks).",
        "",
    ]
    for name, entry in summary["datasets"].items():
        lines += [f"## {name} ({entry['kind']}, {entry['episodes']} episodes)", ""]
        if entry["kind"] in TASK_SYSTEMS:
            sampled = {(r["system"], r["model"]): r for r in entry["sampled"]}
            rows = [
                [
                    r["system"],
                    r["model"],
                    r["n"],
                    _ci(r, "success"),
                    _ci(sampled.get((r["system"], r["model"]), {}), "success"),
                    _ci(r, "outcome"),
                    _ci(r, "partial_outcome"),
                    _fmt(r.get("truncated")),
                    _fmt(r.get("steps"), 1),
                    _tokens(r["reasoner_tokens"]),
                    _tokens(r["memory_tokens"]),
                ]
                for r in entry["greedy"]
            ]
            header, rows = _drop_tokens(
                [
                    "system",
                    "model",
                    "episodes",
                    "success (greedy)",
                    "success (sampled)",
                    "outcome",
                    "outcome (partial credit)",
                    "truncated",
                    "steps/episode",
                    "reasoner tok/episode",
                    "memory tok/episode",
                ],
                rows,
                entry.get("tokens_counted", True),
            )
            lines += [TASK_COLUMNS, "", *_table(header, rows)]
            if not entry.get("tokens_counted", True):
                lines += ["", TOKENS_NOT_COUNTED]
            values, pivot = _pivot(entry["by_horizon"], "horizon", "success")
            lines += ["", "Success (greedy) by horizon:", "", *_table(["system", "model", *values], pivot)]
            lines += [*_task_health_lines(entry), ""]
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
            row = [
                r["system"],
                r["model"],
                r["n"],
                _ci(r, "judge_acc"),
                _ci(r, "judge"),
                _ci(r, em),
                _ci(r, f1),
                _ci(r, "bleu1"),
            ]
            row += [_ci(r, "locomo"), _ci(r, "locomo_judge")] if has_locomo else []
            row += [_ci(r, "evidence_in_context"), _tokens(r["reasoner_tokens"]), _tokens(r["memory_tokens"])]
            rows.append(row)
        header, rows = _drop_tokens(header, rows, entry.get("tokens_counted", True))
        lines += ["All metrics:", "", *_table(header, rows)]
        if not entry.get("tokens_counted", True):
            lines += ["", TOKENS_NOT_COUNTED]
        if column != "qa_type":
            values, pivot = _pivot(entry["by_qa_type"], "qa_type", "judge_acc")
            lines += ["", "Judge accuracy by QA type:", "", *_table(["system", "model", *values], pivot)]
        values, pivot = _pivot(entry["by_horizon"], "horizon", metric)
        label = "LoCoMo F1" if metric == "locomo" else "Judge accuracy"
        lines += [
            "",
            f"{label} by horizon (conversation length in tokens, or the generator's target length):",
            "",
            *_table(["system", "model", *values], pivot),
        ]
        lines += _adversarial_note(cfg, entry)
        lines += _health_lines(cfg, entry)
        if "loader_defaults" in entry:
            d = entry["loader_defaults"]
            lines += [
                "",
                f"Loader defaults (as the benchmark's own loader takes them): {d['questions']} questions, "
                "e.g. " + "; ".join(f"`{x}`" for x in d["examples"]) + ".",
            ]
        lines.append("")
    if summary["skipped"]:
        lines += ["Not applicable (skipped): " + "; ".join(summary["skipped"]) + ".", ""]
    lines += [
        "Per-question results (sorted, for `diff` between runs): `per_question.tsv`; every record: `results.jsonl`.",
        "",
    ]
    return atomic_write_text(path, "\n".join(lines) + "\n")
