"""Aggregation of evaluation records: means per group with bootstrap and Student-t intervals, and the two-level
intervals of a paired comparison that was repeated over training seeds and scored on the same test tasks.

A benchmark that trains S runs (seeds) per variant and scores every run on the same T test tasks has two units of
variation: the tasks (another test set would give other figures) and the training runs (another seed would train
another policy). An interval over tasks alone, after averaging each task over the seeds, lets the spread between
runs cancel out; :func:`two_level_interval` covers both.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "aggregate",
    "bootstrap_ci",
    "mean_or_none",
    "seed_level_t",
    "t_interval",
    "task_level_interval",
    "two_level_bootstrap",
    "two_level_interval",
]


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


def _matrix(rows: Sequence[Sequence[float]]) -> Any:
    """``rows`` as an S x T float array (S seeds, T tasks), every row the same length; a clear error otherwise."""
    import numpy as np

    lengths = {len(r) for r in rows}
    if not rows or len(lengths) != 1 or 0 in lengths:
        raise ValueError(
            f"expected one row per seed, every row one value per task (the same tasks), got row lengths "
            f"{sorted(len(r) for r in rows)}"
        )
    return np.asarray(rows, dtype=float)


def seed_level_t(rows: Sequence[Sequence[float]], level: float = 0.95) -> list[float] | None:
    """The Student-t interval over training seeds: each seed's mean over the tasks is one sample (S - 1 degrees of
    freedom). The spread between runs is in it; the tasks' own spread (another test set) is not, since every seed
    is scored on the same tasks. None for fewer than two seeds."""
    m = _matrix(rows)
    return t_interval([float(x) for x in m.mean(axis=1)], level)


def task_level_interval(rows: Sequence[Sequence[float]], level: float = 0.95) -> list[float] | None:
    """The normal interval over tasks, each task averaged over the seeds first (tasks as the only unit): what the
    benchmarks reported before two-level intervals. The spread between seeds cancels out of it. None for fewer than
    two tasks."""
    from scipy import stats

    per_task = _matrix(rows).mean(axis=0)
    mean = float(per_task.mean())
    if per_task.size < 2:
        return None
    half = float(stats.norm.ppf((1 + level) / 2)) * float(per_task.std(ddof=1)) / math.sqrt(per_task.size)
    return [mean - half, mean + half]


def two_level_bootstrap(
    rows: Sequence[Sequence[float]], level: float = 0.95, resamples: int = 4000, seed: int = 0
) -> list[float]:
    """The percentile interval of the grand mean when seeds and tasks are resampled independently: the two factors
    are crossed (every seed is scored on every task), so each resample draws S seeds and T tasks with replacement
    and averages the S x T sub-matrix ("The pigeonhole bootstrap", Owen, Annals of Applied Statistics 2007;
    "Bootstrapping data arrays of arbitrary order", Owen and Eckles, arXiv 1106.2125: mildly conservative). A fixed
    seed, so a report is reproducible. One seed: a bootstrap over tasks only."""
    import numpy as np

    m = _matrix(rows)
    n_seeds, n_tasks = m.shape
    rng = np.random.default_rng(seed)
    # how often each seed and each task is drawn in each resample; the resample's mean is c_s' M c_t / (S T)
    seed_counts = np.apply_along_axis(np.bincount, 1, rng.integers(0, n_seeds, (resamples, n_seeds)), minlength=n_seeds)
    task_counts = np.apply_along_axis(np.bincount, 1, rng.integers(0, n_tasks, (resamples, n_tasks)), minlength=n_tasks)
    means = np.einsum("bs,st,bt->b", seed_counts, m, task_counts) / (n_seeds * n_tasks)
    tail = (1 - level) / 2
    return [float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))]


def two_level_interval(
    rows: Sequence[Sequence[float]], level: float = 0.95, resamples: int = 4000, seed: int = 0
) -> dict[str, Any]:
    """The interval of a mean over training seeds (``rows``, one per seed) and test tasks (one value per task, the
    same tasks in every row), e.g. of paired differences a - b. ``interval`` is the wider of the two-level bootstrap
    (:func:`two_level_bootstrap`) and the seed-level t (:func:`seed_level_t`): with few seeds (5) a bootstrap over
    them understates the spread between runs (it sees S values and uses normal quantiles), where the t-interval does
    not; the bootstrap adds the tasks' spread, which the t-interval cannot see. Both, and the task-level interval
    the benchmarks reported before, are returned beside it, with each seed's mean, so a reader can recompute."""
    m = _matrix(rows)
    boot = two_level_bootstrap(rows, level, resamples, seed)
    seed_t = seed_level_t(rows, level)
    lo, hi = boot if seed_t is None else [min(boot[0], seed_t[0]), max(boot[1], seed_t[1])]
    mean = float(m.mean())
    return {
        "mean": mean,
        "interval": [lo, hi],
        "half_width": max(mean - lo, hi - mean),
        "two_level_bootstrap": boot,
        "seed_level_t": seed_t,
        "task_level": task_level_interval(rows, level),
        "per_seed_mean": [float(x) for x in m.mean(axis=1)],
        "seeds": int(m.shape[0]),
        "tasks": int(m.shape[1]),
        "level": level,
        "rule": "the wider of the two-level bootstrap (seeds and tasks resampled independently) and the seed-level t",
    }


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
        row["memory_tokens"] = mean_or_none(
            [
                r["memory_tokens_answer"]["prompt"]
                + r["memory_tokens_answer"]["completion"]
                + r.get("memory_tokens_ingest_share", {}).get("prompt", 0)
                + r.get("memory_tokens_ingest_share", {}).get("completion", 0)
                for r in items
            ]
        )
        evidence = [r["evidence_in_context"] for r in items if "evidence_in_context" in r]
        if evidence:
            row["evidence_in_context"] = mean_or_none(evidence)
            row["evidence_in_context_ci"] = bootstrap_ci(evidence)
        out.append(row)
    return out
