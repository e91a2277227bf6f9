"""The aggregates of an evaluation (``summary.json``): per dataset the official metric, the side-by-side rows and the
breakdowns, every mean with its 95% bootstrap interval."""

from __future__ import annotations

from typing import Any

from memrl.launch.evaluation.config import TASK_SYSTEMS, EvalConfig
from memrl.rewards.scorers import LOCOMO_CATEGORY_NAMES, locomo_category
from memrl.rollout.evaluation.reader import NOT_IN_CONTEXT
from memrl.rollout.evaluation.stats import aggregate
from memrl.rollout.evaluation.tasks import FAILURE_STATS

__all__ = [
    "MALFORMED_STATS",
    "NEEDS_MODEL_NOTE",
    "OFFICIAL",
    "RESTS_ON_SHARE",
    "health",
    "memory_output_errors",
    "summarize",
    "task_health",
]

MALFORMED_STATS = ("reasoner_malformed", "reasoner_unknown_tool")
"""Record stats that count reasoner replies the harness could not use (no parseable tool call, an unknown tool)."""
RESTS_ON_SHARE = 0.25
"""A score rests on failures when at least this share of its items got no answer or met a failed request."""


OFFICIAL = {
    "locomo": (
        "locomo",
        "category",
        "LoCoMo F1 by category (its `task_eval/evaluation.py`: stemmed token F1, "
        "multi-hop over comma-separated parts, adversarial by 'not mentioned')",
    ),
    "amabench": (
        "judge_acc",
        "qa_type",
        "AMA-Bench judge accuracy by QA type (its `compute_llm_as_judge` yes/no "
        "prompt; an unparsable reply scores its token F1; accuracy counts scores of 1)",
    ),
    "ama_synthetic": ("judge_acc", "qa_type", "AMA-Bench judge accuracy by QA type"),
    "generic": ("judge_acc", "qa_type", "judge accuracy by QA type"),
    "memoryarena": (
        "judge_acc",
        None,
        "MemoryArena task success rate (every subtask of a task correct) and progress "
        "score (share of a task's subtasks correct); a subtask is correct when the judge accepts it",
    ),
}
"""Per dataset kind: (the record score of the official metric, its breakdown field, what it is)."""
NEEDS_MODEL_NOTE = (
    "the scripted memory model surfaced none of the questions' evidence to the reasoner on this dataset; this "
    "system needs a real memory model here (`models[].engine`), and its score says nothing about the system"
)


def _by_system_model(rows: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["system"], r["model"]), []).append(r)
    return groups


def health(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (system, model): what the score stands on. ``no_answer``: items the reasoner never answered (they score
    as a wrong or empty answer); ``malformed_replies``: reasoner replies without a usable tool call, and
    ``malformed_items`` the items with at least one; ``free_text_answers``: answers taken from such a reply by the
    free-text fallback; ``failed_requests``: requests that failed after their retries (a judge's: the item is scored
    by token F1 instead); ``judge_unparsed``: judge replies that did not parse (token-F1 fallback too);
    ``memory_unparsed``: memory-model outputs a system could not parse (its ``*_unparsed`` / ``*_malformed`` stats);
    ``rests_on_failures``: at least :data:`RESTS_ON_SHARE` of the items got no answer or met a failed request."""
    out = []
    for (system, model), items in _by_system_model(rows).items():
        stats = [r.get("stats") or {} for r in items]
        scores = [r.get("scores") or {} for r in items]
        malformed = [sum(int(s.get(k, 0)) for k in MALFORMED_STATS) for s in stats]
        memory_unparsed = sum(
            int(v)
            for s in stats
            for k, v in s.items()
            if k not in MALFORMED_STATS and k.endswith(("_unparsed", "_malformed"))
        )
        failed = [
            sum(
                int(v)
                for k, v in {**st, **sc}.items()
                if (k.endswith("_failed") or k.endswith("failed_requests")) and isinstance(v, (int, float))
            )
            for st, sc in zip(stats, scores, strict=True)
        ]
        no_answer = sum(1 for r in items if not str(r.get("answer") or "").strip())
        row = {
            "system": system,
            "model": model,
            "items": len(items),
            "no_answer": no_answer,
            "malformed_replies": sum(malformed),
            "malformed_items": sum(1 for m in malformed if m),
            "free_text_answers": sum(1 for r in items if r.get("answer_source") == "free_text"),
            "failed_requests": sum(failed),
            "failed_items": sum(1 for f in failed if f),
            "judge_unparsed": sum(1 for s in scores if s.get("judge_parsed") == 0.0),
            "memory_unparsed": memory_unparsed,
        }
        row["rests_on_failures"] = (no_answer + row["failed_items"]) >= RESTS_ON_SHARE * len(items)
        out.append(row)
    return out


def memory_output_errors(stats: dict[str, Any]) -> int:
    """Memory-model outputs a memory system could not use in one episode: its per-role errors (``sam_recall_errors``
    ...) and unparsed / malformed outputs; the reasoner's own malformed replies and tool-call errors are not counted."""
    return sum(
        int(v)
        for k, v in stats.items()
        if isinstance(v, (int, float))
        and k not in MALFORMED_STATS
        and k not in FAILURE_STATS
        and (k.endswith(("_unparsed", "_malformed")) or (k.endswith("_errors") and not k.endswith("tool_errors")))
    )


def task_health(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (system, model) of a task dataset: what the score stands on. Task episodes end by the environment, not by
    an answer, so only an episode that failed for a reason counts: ``env_failures`` (the environment or the agent
    raised or timed out), ``memory_errors`` (episodes with a memory-model output the system could not use),
    ``malformed_items`` (episodes with a reasoner reply without a usable tool call); ``failed``: episodes not won
    with one of those; ``rests_on_failures``: at least :data:`RESTS_ON_SHARE` of the episodes are ``failed``."""
    out = []
    for (system, model), items in _by_system_model(rows).items():
        stats = [r.get("stats") or {} for r in items]
        env = [any(s.get(k) for k in FAILURE_STATS) for s in stats]
        memory = [memory_output_errors(s) > 0 for s in stats]
        malformed = [sum(int(s.get(k, 0)) for k in MALFORMED_STATS) > 0 for s in stats]
        failed = sum(
            1 for r, e, m, b in zip(items, env, memory, malformed, strict=True) if not r.get("won") and (e or m or b)
        )
        out.append(
            {
                "system": system,
                "model": model,
                "items": len(items),
                "env_failures": sum(env),
                "memory_errors": sum(memory),
                "malformed_items": sum(malformed),
                "failed": failed,
                "rests_on_failures": failed >= RESTS_ON_SHARE * len(items),
            }
        )
    return out


def _fallback_phrase(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """LoCoMo's adversarial category scores 1 for an answer saying the information is not mentioned: per (system,
    model) the adversarial questions, how many answers say so (``fallback``) and how many of those are the
    programmatic reader's own fallback phrase (``reader_phrase``)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        if locomo_category(r.get("category")) != 5:
            continue
        row = out.setdefault(
            (r["system"], r["model"]),
            {"system": r["system"], "model": r["model"], "n": 0, "fallback": 0, "reader_phrase": 0},
        )
        answer = str(r.get("answer") or "").lower()
        row["n"] += 1
        row["fallback"] += int("not mentioned" in answer or "no information available" in answer)
        row["reader_phrase"] += int(NOT_IN_CONTEXT in answer)
    return list(out.values())


def _task_rows(rows: list[dict[str, Any]], metric: str) -> list[dict[str, Any]]:
    """One row per (system, model, task) with MemoryArena's ``success`` (every subtask right) and ``progress``
    (share of subtasks right), each subtask judged by ``metric``."""
    tasks: dict[tuple[str, str, str], list[float]] = {}
    for r in rows:
        score = (r.get("scores") or {}).get(metric)
        tasks.setdefault((r["system"], r["model"], r["episode_id"]), []).append(float(score == 1.0))
    return [
        {
            "system": s,
            "model": m,
            "episode_id": e,
            "scores": {"success": float(all(v)), "progress": sum(v) / len(v)},
            "reasoner_tokens": {"spent": 0},
            "memory_tokens_answer": {"prompt": 0, "completion": 0},
        }
        for (s, m, e), v in tasks.items()
    ]


def summarize(cfg: EvalConfig, records: list[dict[str, Any]], skipped: list[str]) -> dict[str, Any]:
    """Aggregates per dataset: the official metric first, the side-by-side rows (system x model) and breakdowns by QA
    type, LoCoMo category, horizon (the generator's target length, else the conversation's length in tokens), and
    greedy / sampled runs of tasks. Every mean carries its 95% bootstrap interval (``<metric>_ci``)."""
    datasets: dict[str, Any] = {}
    for spec in cfg.datasets:
        rows = [r for r in records if r["dataset"] == spec.name]
        if not rows:
            continue
        entry: dict[str, Any] = {"kind": spec.kind, "episodes": len({r["episode_id"] for r in rows})}
        if spec.kind in TASK_SYSTEMS:
            entry["greedy"] = aggregate([r for r in rows if not r.get("sampled")])
            entry["sampled"] = aggregate([r for r in rows if r.get("sampled")])
            entry["by_horizon"] = aggregate([r for r in rows if not r.get("sampled")], ("system", "model", "horizon"))
        else:
            entry["overall"] = aggregate(rows)
            entry["by_qa_type"] = aggregate(rows, ("system", "model", "qa_type"))
            entry["by_horizon"] = aggregate(rows, ("system", "model", "horizon"))
            if any(locomo_category(r.get("category")) is not None for r in rows):
                entry["by_category"] = aggregate(
                    [
                        dict(r, category=LOCOMO_CATEGORY_NAMES[locomo_category(r.get("category")) or 0])
                        for r in rows
                        if locomo_category(r.get("category")) is not None
                    ],
                    ("system", "model", "category"),
                )
                entry["adversarial_fallback"] = _fallback_phrase(rows)
            if spec.kind == "memoryarena":
                entry["tasks"] = aggregate(_task_rows(rows, OFFICIAL["memoryarena"][0]))
            defaults = [r for r in rows if r.get("loader_defaults")]
            if defaults:
                notes = sorted({d for r in defaults for d in r["loader_defaults"]})
                entry["loader_defaults"] = {
                    "questions": len({(r["episode_id"], r["item_id"]) for r in defaults}),
                    "examples": notes[:5],
                }
            entry["needs_model"] = [
                [r["system"], r["model"]]
                for r in entry["overall"]
                if r.get("evidence_in_context") == 0.0 and _scripted(cfg, r["model"]) and r["memory_tokens"]
            ]
        entry["health"] = task_health(rows) if spec.kind in TASK_SYSTEMS else health(rows)
        entry["tokens_counted"] = any(
            r.get("reasoner_tokens", {}).get("spent") or r.get("memory_tokens_answer", {}).get("prompt") for r in rows
        )
        datasets[spec.name] = entry
    return {
        "datasets": datasets,
        "skipped": skipped,
        "reader": "programmatic" if cfg.reasoner is None else cfg.reasoner.engine_name,
        "judge": "lexical (offline)" if cfg.judge is None else cfg.judge.engine_name,
    }


def _scripted(cfg: EvalConfig, model: str) -> bool:
    return any(m.name == model and m.engine is None for m in cfg.models)
