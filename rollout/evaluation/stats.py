"""Aggregation of evaluation records: means per group with bootstrap and Student-t intervals.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["aggregate", "bootstrap_ci", "mean_or_none", "t_interval"]


def mean_or_none(values: list[float]) -> float | None:
    """The mean of ``values``, None when there are none."""
    return sum(values) / len(values) if values else None


def bootstrap_ci(values: Sequence[float], level: float = 0.95, resamples: int = 1000, seed: int = 0) -> list[float]:
    """The percentile bootstrap confidence interval of the mean of ``values`` ([low, high]; a fixed seed, so a
    report is reproducible)."""
    import numpy as np

    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return [float("nan"), float("nan")]
    means = data[np.random.default_rng(seed).integers(0, data.size, (resamples, data.size))].mean(axis=1)
    tail = (1 - level) / 2
    return [float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))]


def t_interval(values: Sequence[float], level: float = 0.95) -> list[float] | None:
    """The Student-t confidence interval of the mean of ``values`` (one per seed: [low, high]); None for fewer than
    two values."""
    if len(values) < 2:
        return None
    from scipy import stats

    mean = statistics.fmean(values)
    half = float(stats.t.ppf((1 + level) / 2, len(values) - 1)) * statistics.stdev(values) / math.sqrt(len(values))
    return [mean - half, mean + half]


def aggregate(records: Iterable[dict[str, Any]], by: Sequence[str] = ("system", "model")) -> list[dict[str, Any]]:
    """Group records by the fields ``by`` and average every score (with its 95% bootstrap interval under
    ``<score>_ci``) plus the tokens per item: reasoner tokens spent, memory tokens (answer phase plus the share of
    ingestion), and ``evidence_in_context`` when present."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault(tuple(record.get(k) for k in by), []).append(record)
    out = []
    for key, items in groups.items():
        row: dict[str, Any] = dict(zip(by, key, strict=True))
        row["n"] = len(items)
        metrics: dict[str, list[float]] = {}
        for record in items:
            for name, value in (record.get("scores") or {}).items():
                if isinstance(value, (int, float)):
                    metrics.setdefault(name, []).append(float(value))
        for name, values in sorted(metrics.items()):
            row[name] = mean_or_none(values)
            row[f"{name}_ci"] = bootstrap_ci(values)
        row["reasoner_tokens"] = mean_or_none([r["reasoner_tokens"]["spent"] for r in items])
        row["memory_tokens"] = mean_or_none([
            r["memory_tokens_answer"]["prompt"] + r["memory_tokens_answer"]["completion"]
            + r.get("memory_tokens_ingest_share", {}).get("prompt", 0)
            + r.get("memory_tokens_ingest_share", {}).get("completion", 0) for r in items
        ])
        evidence = [r["evidence_in_context"] for r in items if "evidence_in_context" in r]
        if evidence:
            row["evidence_in_context"] = mean_or_none(evidence)
            row["evidence_in_context_ci"] = bootstrap_ci(evidence)
        out.append(row)
    return out
