"""``memrl data synth``: synthetic long-horizon episodes with programmatic ground truth, written as train / eval
splits (JSONL and Arrow) with a stats summary. The same config and seed give byte-identical JSONL and stats."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PositiveInt, ValidationError, model_validator

from memrl.data.config import ConfigModel, RunConfig
from memrl.data.io import atomic_write_text, describe_validation_error, write_arrow, write_jsonl
from memrl.data.run_dir import prepare_run_dir
from memrl.data.schemas import Episode
from memrl.data.tracking import progress_bar

__all__ = ["SynthConfig", "SynthSource", "build_episodes", "episode_stats", "run_synth"]

log = logging.getLogger(__name__)


_FAMILY_OPTIONS = {
    "ama": {"env", "count", "target_tokens", "params", "noise", "qa_per_type"},
    "sam": {"count", "target_tokens", "params"},
    "proactive": {"count", "params"},
}
"""The options each family reads (a proactive task's length is ``params.n_subtasks``, not a token target)."""


class SynthSource(ConfigModel):
    """One kind of episode to generate: ``count`` episodes per target-token bin. An option the family does not read
    (set to anything but its default) is an error, not silently ignored."""

    family: Literal["ama", "sam", "proactive"]  # task family to generate: ama (QA episodes), sam or proactive
    env: Literal["textworld", "gridworld"] = Field("textworld", description="environment of an ama source")
    count: int = Field(4, ge=1, le=10**6)  # episodes per target-token bin (or in all without bins)
    target_tokens: list[int] = Field(
        [], description="bins (ama: required; sam: grow tours to each; proactive: not read)"
    )
    params: dict[str, Any] = Field({}, description="environment / task parameters (difficulty vector, knobs)")
    noise: float = Field(0.1, ge=0, le=1, description="action noise of the optimal policy (ama)")
    qa_per_type: int = Field(3, ge=1, description="QA pairs per capability type A-D (ama)")

    @model_validator(mode="after")
    def _check(self) -> SynthSource:
        # An unread option left at its default is harmless, and every run's config.yaml spells all options out.
        unread = sorted(
            k
            for k in self.model_fields_set - _FAMILY_OPTIONS[self.family] - {"family"}
            if getattr(self, k) != type(self).model_fields[k].default
        )
        if unread:
            raise ValueError(
                f"option(s) {', '.join(unread)} not read by family {self.family!r} "
                f"(it reads: {', '.join(sorted(_FAMILY_OPTIONS[self.family]))})"
            )
        if self.family == "ama" and not self.target_tokens:
            raise ValueError("an ama source needs target_tokens (e.g. [4096, 8192])")
        if any(t < 64 for t in self.target_tokens):
            raise ValueError("target_tokens must be >= 64")
        self._check_params()
        return self

    def _check_params(self) -> None:
        """Validate ``params`` against the family's parameter model now, so a typo fails at load, not mid-run."""
        from memrl.data.envs import REGISTRY
        from memrl.data.tasks import ProactiveParams, SamTaskParams

        params = dict(self.params)
        if self.family == "ama":
            model: type[ConfigModel] = REGISTRY[self.env].params_model
        elif self.family == "sam":
            model = SamTaskParams
            if self.target_tokens:  # _one replaces the tour length by each bin
                params.update(horizon_steps=None, target_tokens=self.target_tokens[0])
        else:
            model = ProactiveParams
        try:
            model.model_validate(params)
        except ValidationError as exc:
            where = f"{self.env} " if self.family == "ama" else ""
            raise ValueError(f"params of a {where}{self.family} source: {describe_validation_error(exc)}") from None


def _default_sources() -> list[SynthSource]:
    return [
        SynthSource(family="ama", env="textworld", count=4, target_tokens=[4096, 8192]),
        SynthSource(family="ama", env="gridworld", count=4, target_tokens=[4096, 8192]),
        SynthSource(family="sam", count=8, params={"horizon_steps": 24}),
        SynthSource(family="proactive", count=8, params={"n_subtasks": 16}),
    ]


class SynthConfig(ConfigModel):
    """Config of ``memrl data synth``."""

    command: Literal["data synth"] = "data synth"  # the command this config is for
    run: RunConfig = RunConfig(output_dir="runs", name=None)
    sources: list[SynthSource] = Field(default_factory=_default_sources)
    eval_fraction: float = Field(0.25, ge=0, lt=1, description="share of each source and bin held out for eval")
    arrow: bool = True  # also write train.arrow/ and eval.arrow/ datasets next to the JSONL
    histogram_bins: list[PositiveInt] = [4096, 8192, 16384, 32768, 65536, 131072]  # token-length histogram edges


def _seed(*parts: Any) -> int:
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def _one(source: SynthSource, index: int, target: int | None, i: int, seed: int) -> Episode:
    from memrl.data.tasks import ProactiveTask, SamTask, make_ama_episode

    eid = f"{source.family}{index}-{target or 'p'}-{i}"
    if source.family == "ama":
        assert target is not None
        return make_ama_episode(
            source.env,
            dict(source.params),
            seed,
            target,
            noise=source.noise,
            per_type=source.qa_per_type,
            episode_id=eid,
        )
    if source.family == "sam":
        params = dict(source.params)
        if target is not None:
            params.update(horizon_steps=None, target_tokens=target)
        return SamTask(params, seed, eid).episode()
    return ProactiveTask(dict(source.params), seed, eid).episode()


def build_episodes(cfg: SynthConfig, progress: bool = False) -> tuple[list[Episode], list[Episode]]:
    """Generate every configured episode; returns (train, eval). Deterministic for the config and ``run.seed``."""
    jobs = []
    for index, source in enumerate(cfg.sources):
        bins: list[int | None] = list(source.target_tokens) or [None]
        for target in bins:
            n_eval = round(source.count * cfg.eval_fraction)
            for i in range(source.count):
                jobs.append((source, index, target, i, i >= source.count - n_eval))
    train: list[Episode] = []
    held: list[Episode] = []
    for source, index, target, i, is_eval in progress_bar(
        jobs, desc="synth", disable=not progress, leave=False, work=f"{len(jobs):,} episodes to generate"
    ):
        episode = _one(source, index, target, i, _seed(cfg.run.seed, index, target, i))
        (held if is_eval else train).append(episode)
    return train, held


def episode_stats(episodes: list[Episode], bins: list[int]) -> dict[str, Any]:
    """Counts per family, domain and QA type; a token-length histogram (``<=bin`` buckets); per-target accuracy."""
    edges = sorted(bins)
    hist: Counter[str] = Counter()
    for e in episodes:
        tokens = e.horizon_tokens or 0
        bucket = next((f"<={b}" for b in edges if tokens <= b), f">{edges[-1]}" if edges else "all")
        hist[bucket] += 1
    target_error: dict[str, float] = {}
    for e in episodes:
        target = e.metadata.get("target_tokens") or (e.env.params.get("target_tokens") if e.env else None)
        if target and e.horizon_tokens:
            err = abs(e.horizon_tokens - target) / target
            target_error[str(target)] = round(max(target_error.get(str(target), 0.0), err), 4)
    lengths = [e.horizon_tokens or 0 for e in episodes]
    return {
        "episodes": len(episodes),
        "qa_pairs": sum(len(e.qa_pairs) for e in episodes),
        "by_family": dict(sorted(Counter(str(e.metadata.get("family", "")) for e in episodes).items())),
        "by_domain": dict(sorted(Counter(e.domain for e in episodes).items())),
        "qa_by_type": dict(sorted(Counter(q.type for e in episodes for q in e.qa_pairs).items())),
        "token_histogram": {k: hist[k] for k in [*(f"<={b}" for b in edges), f">{edges[-1]}"] if hist[k]}
        if edges
        else dict(hist),
        "tokens": {
            "min": min(lengths, default=0),
            "max": max(lengths, default=0),
            "mean": round(sum(lengths) / len(lengths), 1) if lengths else 0.0,
        },
        "max_relative_target_error": dict(sorted(target_error.items(), key=lambda kv: int(kv[0]))),
        "pivots": sum(len(e.metadata.get("pivots", [])) for e in episodes),
    }


def run_synth(cfg: SynthConfig) -> int:
    """Generate the episodes and write ``train.jsonl``, ``eval.jsonl``, ``train.arrow/``, ``eval.arrow/`` and
    ``stats.json`` into the run directory."""
    run_dir = prepare_run_dir(cfg, cfg.run, "data synth")
    start = time.time()
    train, held = build_episodes(cfg, progress=True)
    out = Path(run_dir)
    write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "eval.jsonl", held)
    if cfg.arrow:
        write_arrow(out / "train.arrow", train)
        write_arrow(out / "eval.arrow", held)
    stats = {"train": episode_stats(train, cfg.histogram_bins), "eval": episode_stats(held, cfg.histogram_bins)}
    atomic_write_text(out / "stats.json", json.dumps(stats, indent=2, sort_keys=True) + "\n")
    log.info(f"[data synth] {len(train)} train / {len(held)} eval episodes in {time.time() - start:.1f}s -> {out}")
    log.info(f"{json.dumps(stats['train']['qa_by_type'])} {json.dumps(stats['train']['token_histogram'])}")
    return 0
