"""``memrl eval``: memory systems x memory models x datasets -> per-item results, breakdowns and a side-by-side report.

For every dataset, system and model the harness (:mod:`memrl.rollout.evaluation`) yields one record per item (a
question, or a task run); :mod:`memrl.rewards.scorers` scores it (exact match, token F1, BLEU-1, the AMA-Bench yes/no
judge with its F1 fallback, LoCoMo per-category scores and its CORRECT/WRONG judge, task success from the verifier) and
the record is appended to ``<run>/results.jsonl`` at once (fsynced). A rerun with ``--resume`` reads that file (a torn
last line from a killed process is cut off), skips every finished item by its key (dataset, episode, item, system,
model) and appends only the rest, so rows are never duplicated. ``report.md`` leads each dataset with the benchmark's
official metric (LoCoMo F1 by category, AMA-Bench judge accuracy by QA type, MemoryArena task success rate and progress
score), compares the methods side by side with tokens per question (reasoner and memory model), and breaks results down
by QA type, LoCoMo category and horizon (the generator's target length, else the conversation's length in tokens); every
mean carries its 95% bootstrap interval. ``summary.json`` holds the same numbers and ``per_question.tsv`` one sorted
line per question, to ``diff`` two runs. ``memrl eval --dry-run`` prints the files and endpoints a config needs and
stops.

Defaults run offline: the reasoner of QA datasets is the programmatic reader and the memory model is the extractive
scripted model (both in :mod:`memrl.rollout.evaluation`), the judge is the lexical stand-in
(:class:`memrl.rewards.scorers.LexicalJudge`); task datasets use their family's scripted agent and oracle expert. Any of
them can be an engine (vLLM / HF checkpoint, LoRA adapter, OpenAI-compatible endpoint).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from memrl.data.config import ConfigError, ConfigModel, RunConfig, config_hash
from memrl.data.errors import UserError
from memrl.data.io import append_jsonl, atomic_write_text, iter_jsonl
from memrl.data.run_dir import prepare_run_dir
from memrl.data.tasks import TaskSetConfig, load_tasks, make_ama_episode
from memrl.data.tracking import progress_bar
from memrl.rewards.scorers import (
    LOCOMO_CATEGORY_NAMES,
    JudgeItem,
    JudgeScorer,
    LexicalJudge,
    ama_exact_match,
    ama_f1,
    best_of,
    lexical_scores,
    locomo_category,
    locomo_option_answer,
    locomo_score,
    verifier_outcome,
)
from memrl.rollout.engines.base import Engine
from memrl.rollout.engines.config import EngineConfig
from memrl.rollout.engines.factory import build_engine
from memrl.rollout.evaluation.extractive import ExtractiveMemoryModel
from memrl.rollout.evaluation.qa import run_qa
from memrl.rollout.evaluation.reader import EvidenceReader, ReaderConfig
from memrl.rollout.evaluation.records import Scorer
from memrl.rollout.evaluation.stats import aggregate
from memrl.rollout.evaluation.tasks import run_tasks
from memrl.rollout.loop import EngineSet
from memrl.rollout.memory.registry import MemoryConfig
from memrl.rollout.memory.sam import make_token_counter

__all__ = ["DatasetSpec", "EvalConfig", "ModelSpec", "SystemSpec", "check_inputs", "dry_run_eval", "evaluate",
           "load_results", "run_eval", "write_per_question", "write_report"]

log = logging.getLogger(__name__)

QA_KINDS = ("ama_synthetic", "amabench", "locomo", "memoryarena", "generic")
TASK_SYSTEMS = {"sam": ("sam", "long_context", "bm25", "embedding"), "proactive": ("proactive",)}
READER_NOTE = (
    "The reasoner is the programmatic reader: it answers with the gold answer exactly when the question's evidence "
    "(the needle turns' evidence strings, else the needle observations, else a gold answer) is in its context, and "
    "otherwise says the answer is not mentioned. Its scores measure what each memory system surfaced to the reasoner, "
    "not language ability."
)


class DatasetSpec(ConfigModel):
    """One dataset: synthetic AMA-format episodes, a file in a public format, or a family of interactive tasks."""

    name: str = Field(min_length=1)  # label of the dataset in results
    kind: Literal["ama_synthetic", "amabench", "locomo", "memoryarena", "generic", "sam", "proactive"] = Field(
        description="synthetic AMA episodes, a file in a public format (path), or a task family (tasks)"
    )
    path: str | None = None  # the file of amabench / locomo / memoryarena / generic
    envs: list[str] = ["textworld"]  # ama_synthetic: environments
    target_tokens: list[int] = [1000]  # ama_synthetic: trajectory lengths (the horizon breakdown)
    episodes_per_setting: int = Field(2, ge=1)  # ama_synthetic: episodes per env and target length
    per_type: int = Field(2, ge=1, description="ama_synthetic: questions per type A-D")
    noise: float = Field(0.1, ge=0, le=1)  # ama_synthetic: action noise of the trajectory policy
    env_params: dict[str, Any] = {}  # ama_synthetic: environment parameters
    seed: int = 0  # seed of the first synthetic episode (or default task set)
    tasks: TaskSetConfig | None = None  # sam / proactive: the task set (default: the family's defaults)
    samples: int = Field(0, ge=0, description="tasks: sampled runs per task beside the greedy one")
    temperature: float | None = Field(None, ge=0, description="tasks: sampling temperature (None: the config's)")
    max_episodes: int | None = Field(None, ge=1)  # episodes (or tasks) used at most; None: all
    max_questions: int | None = Field(None, ge=1, description="questions per episode at most")

    @model_validator(mode="after")
    def _needs(self) -> DatasetSpec:
        if self.kind in ("amabench", "locomo", "memoryarena", "generic") and not self.path:
            raise ValueError(f"dataset kind {self.kind!r} needs 'path'")
        if self.tasks is not None and self.kind in ("sam", "proactive") and self.tasks.family != self.kind:
            raise ValueError(f"tasks.family must be {self.kind!r} for a {self.kind} dataset")
        return self


class SystemSpec(ConfigModel):
    """A memory system under a label (the same system with other settings needs another label)."""

    label: str | None = None  # name in results; None: the memory system's name
    memory: MemoryConfig

    @property
    def name(self) -> str:
        """The label, or the system's name."""
        return self.label or self.memory.name


class ModelSpec(ConfigModel):
    """A memory model: an engine (vLLM / HF checkpoint, OpenAI-compatible endpoint, scripted policy) and optionally a
    LoRA adapter on it; ``engine: null`` is the dataset's scripted memory model (extractive model for QA, the oracle
    expert for tasks)."""

    name: str = Field(min_length=1)  # label of the model in results
    engine: EngineConfig | None = None
    adapter: str | None = None  # LoRA adapter directory served on the (vllm / hf) engine

    @model_validator(mode="after")
    def _adapter_needs_engine(self) -> ModelSpec:
        if self.adapter and (self.engine is None or self.engine.backend not in ("vllm", "hf")):
            raise ValueError("an adapter needs a vllm or hf engine")
        return self


def _default_systems() -> list[SystemSpec]:
    names = ("sam", "long_context", "bm25", "embedding", "mage", "memma", "ama_agent", "proactive")
    return [SystemSpec.model_validate({"memory": {"name": n}}) for n in names]


class EvalConfig(ConfigModel):
    """Everything ``memrl eval`` needs."""

    command: Literal["eval"] = "eval"  # the command this config is for
    run: RunConfig = RunConfig()
    datasets: list[DatasetSpec] = [DatasetSpec(name="ama-synthetic", kind="ama_synthetic")]
    systems: list[SystemSpec] = Field(default_factory=_default_systems)
    models: list[ModelSpec] = [ModelSpec(name="scripted")]
    data_dir: str | None = None  # a dataset's relative path is read under this directory; None: the working dir
    reasoner: EngineConfig | None = None  # QA reasoner; None: the programmatic reader
    reader: ReaderConfig = ReaderConfig()
    judge: EngineConfig | None = None  # AMA-Bench yes/no judge; None: the offline lexical judge
    locomo_judge: bool = True  # also run the CORRECT/WRONG judge on LoCoMo questions
    judge_max_tokens: int = Field(64, ge=1)  # max tokens of a judge reply (twice this for LoCoMo)
    tokenizer: str | None = "tiny"  # token accounting of scripted engines ("tiny": the tiny model's; None: none)
    model_cache: str = ".cache/models"  # where the tiny model (tokenizer "tiny") is built and reused
    episodes_per_batch: int = Field(4, ge=1)  # QA episodes run and scored together
    slack_steps: int = Field(4, ge=1, description="reasoner calls allowed per question")

    @model_validator(mode="after")
    def _unique(self) -> EvalConfig:
        for what, names in (("dataset", [d.name for d in self.datasets]), ("system", [s.name for s in self.systems]),
                            ("model", [m.name for m in self.models])):
            dup = {n for n in names if names.count(n) > 1}
            if dup:
                raise ValueError(f"{what} names must be unique, repeated: {sorted(dup)}")
        return self


# ----------------------------------------------------------------------------------------------------------------
# data


def check_inputs(cfg: EvalConfig) -> None:
    """Before anything is created: every dataset file exists and holds at least one episode."""
    from memrl.data.checks import check_existing_file

    for key in ("datasets", "systems", "models"):
        if not getattr(cfg, key):
            raise ConfigError(f"{key}: the list is empty, so there is nothing to evaluate; name at least one")
    for i, spec in enumerate(cfg.datasets):
        key = f"datasets.{i}.path"
        if spec.kind in ("ama_synthetic", "sam", "proactive"):
            continue  # generated (counts are bounded) or a task set the generic checks read
        path = dataset_path(spec, cfg.data_dir)
        if path is None:
            raise ConfigError(f"{key}: dataset {spec.name!r} of kind {spec.kind} needs a file")
        check_existing_file(str(path), key, what=f"{spec.kind} dataset file")
        try:
            episodes = load_dataset(spec, cfg.data_dir)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, UserError):
                raise
            raise UserError(f"{key}: {path} is not a readable {spec.kind} dataset ({type(exc).__name__}: "
                            f"{exc})") from None
        if not episodes:
            raise UserError(f"{key}: {path} holds no episodes, so there is nothing to evaluate")


def dataset_path(spec: DatasetSpec, data_dir: str | None = None) -> Path | None:
    """The file of a dataset: its ``path``, under ``data_dir`` when relative (``~`` expanded)."""
    if spec.path is None:
        return None
    path = Path(spec.path).expanduser()
    return path if path.is_absolute() or data_dir is None else Path(data_dir).expanduser() / path


def load_dataset(spec: DatasetSpec, data_dir: str | None = None) -> list[Any]:
    """The episodes (QA kinds) or tasks (``sam`` / ``proactive``) of a dataset."""
    if spec.kind in ("sam", "proactive"):
        tasks_cfg = spec.tasks or TaskSetConfig(family=spec.kind, count=8, seed=spec.seed)
        tasks = load_tasks(tasks_cfg, prefix=spec.name)
        return tasks[: spec.max_episodes] if spec.max_episodes else tasks
    if spec.kind == "ama_synthetic":
        episodes = [
            make_ama_episode(env, dict(spec.env_params), spec.seed + i, target, noise=spec.noise,
                             per_type=spec.per_type)
            for env in spec.envs for target in spec.target_tokens for i in range(spec.episodes_per_setting)
        ]
    else:
        from memrl.data.loaders import LOADERS

        path = dataset_path(spec, data_dir)
        assert path is not None
        if not path.is_file():
            raise ConfigError(f"dataset {spec.name!r}: file not found: {path} (set its path, or data_dir=DIR)")
        episodes = LOADERS[spec.kind](path)
    return episodes[: spec.max_episodes] if spec.max_episodes else episodes


def _items_of(spec: DatasetSpec, data: list[Any]) -> int:
    if spec.kind in ("sam", "proactive"):
        return len(data) * (1 + spec.samples)
    per = spec.max_questions
    return sum(min(len(e.qa_pairs), per) if per else len(e.qa_pairs) for e in data)


# ----------------------------------------------------------------------------------------------------------------
# results file


def load_results(path: str | Path) -> list[dict[str, Any]]:
    """The records of a results file, first of each key; a torn last line (a killed writer) is cut off the file so
    appends continue on a clean line."""
    path = Path(path)
    if not path.is_file():
        return []
    raw = path.read_bytes()
    if raw and not raw.endswith(b"\n"):
        keep = raw.rfind(b"\n") + 1
        with open(path, "r+b") as fh:
            fh.truncate(keep)
    seen: dict[str, dict[str, Any]] = {}
    for record in iter_jsonl(path):
        assert isinstance(record, dict)
        seen.setdefault(str(record.get("key")), record)
    return list(seen.values())


# ----------------------------------------------------------------------------------------------------------------
# engines and scoring


class _Engines:
    """Builds engines once per run and closes them at the end."""

    def __init__(self, cfg: EvalConfig) -> None:
        self.cfg = cfg
        self.tokenizer: Any = None
        self._tokenizer_loaded = False
        self.models: dict[str, Engine] = {}
        self.built: list[Engine] = []

    def get_tokenizer(self) -> Any:
        if not self._tokenizer_loaded:
            self._tokenizer_loaded = True
            name = self.cfg.tokenizer
            if name is not None:
                from memrl.rollout.models import TinyModelSpec, ensure_tiny_model, load_tokenizer

                path = ensure_tiny_model(self.cfg.model_cache, TinyModelSpec()) if name == "tiny" else name
                self.tokenizer = load_tokenizer(path)
        return self.tokenizer

    def build(self, cfg: EngineConfig) -> Engine:
        engine = build_engine(cfg)
        self.built.append(engine)
        return engine

    def scripted(self, policy: Any, name: str) -> Engine:
        from memrl.rollout.engines.scripted import ScriptedEngine

        return ScriptedEngine(policy, tokenizer=self.get_tokenizer(), name=name)

    def memory_model(self, spec: ModelSpec) -> Engine | None:
        if spec.engine is None:
            return None
        if spec.name not in self.models:
            engine_cfg = spec.engine
            if spec.adapter and engine_cfg.backend == "vllm":
                engine_cfg = engine_cfg.model_copy(update={"enable_lora": True})
            engine = self.build(engine_cfg)
            if spec.adapter:
                engine.load_adapter(spec.adapter, version=1)  # type: ignore[attr-defined]
            self.models[spec.name] = engine
        return self.models[spec.name]

    def close(self) -> None:
        for engine in self.built:
            engine.close()


def make_scorer(ama_judge: JudgeScorer, locomo_judge: JudgeScorer | None) -> Scorer:
    """The scorer the harness calls per batch: lexical metrics, LoCoMo category scores and judges for QA records,
    the verifier's outcome for task records."""

    def score(records: list[dict[str, Any]]) -> list[dict[str, float]]:
        out: list[dict[str, float]] = []
        for r in records:
            if r["mode"] != "qa":
                out.append({"success": verifier_outcome(r.get("outcome"))})
                continue
            scores = lexical_scores(r["answer"], r["golds"])
            scores["ama_em"] = best_of(ama_exact_match, r["answer"], r["golds"])
            scores["ama_f1"] = best_of(ama_f1, r["answer"], r["golds"])
            category = locomo_category(r.get("category"))
            if category is not None:
                answer = r["answer"] or ""
                if category == 5 and isinstance(r.get("options"), dict):
                    answer = locomo_option_answer(answer, r["options"])
                scores["locomo"] = float(locomo_score(answer, r["gold"], category))
            out.append(scores)
        qa = [i for i, r in enumerate(records) if r["mode"] == "qa"]
        items = [JudgeItem(records[i]["question"], records[i]["gold"], records[i]["answer"] or "",
                           records[i].get("task", ""), records[i].get("task_type", ""),
                           str(records[i].get("episode_id", ""))) for i in qa]
        for i, verdict in zip(qa, ama_judge.score(items), strict=True):
            out[i].update(judge=verdict.score, judge_acc=float(verdict.score == 1.0),
                          judge_parsed=float(verdict.parsed))
        locomo = [i for i in qa if locomo_category(records[i].get("category")) is not None]
        if locomo_judge is not None and locomo:
            items = [JudgeItem(records[i]["question"], records[i]["gold"], records[i]["answer"] or "") for i in locomo]
            for i, verdict in zip(locomo, locomo_judge.score(items), strict=True):
                out[i]["locomo_judge"] = verdict.score
        return out

    return score


# ----------------------------------------------------------------------------------------------------------------
# the run


def run_eval(cfg: EvalConfig) -> int:
    """``memrl eval``: run (or resume) the evaluation into the run directory and print the report's main tables."""
    run_dir = prepare_run_dir(cfg, cfg.run, "eval")
    summary = evaluate(cfg, run_dir)
    log.info((run_dir / "report.md").read_text(encoding="utf-8"))
    log.info(f"[eval] {summary['items']} items in {run_dir / 'results.jsonl'}; report: {run_dir / 'report.md'}")
    return 0


def _engine_lines(role: str, engine: EngineConfig | None, default: str) -> list[str]:
    if engine is None:
        return [f"  {role}: {default} (offline, no endpoint)"]
    if engine.backend == "openai":
        lines = []
        for ep in engine.endpoints:
            key = ep.api_key_env
            state = "no key" if key is None else f"key from ${key} ({'set' if os.environ.get(key) else 'NOT SET'})"
            lines.append(f"  {role}: OpenAI-compatible endpoint {ep.url} model {ep.model or engine.model!r}, {state}")
        if engine.tokenizer is not None:
            found = Path(engine.tokenizer).expanduser().exists()
            lines.append(f"    tokenizer {engine.tokenizer} ({'found' if found else 'NOT FOUND locally (a hub id?)'})")
        return lines or [f"  {role}: openai backend WITHOUT endpoints"]
    if engine.backend in ("vllm", "hf"):
        model = engine.model or "?"
        where = "local directory" if Path(model).expanduser().exists() else "NOT FOUND locally (a hub id?)"
        return [f"  {role}: in-process {engine.backend} engine on {model} ({where})"]
    return [f"  {role}: scripted policy {engine.scripted_policy or '(default)'}"]


def dry_run_eval(cfg: EvalConfig) -> int:
    """``memrl eval --dry-run``: print the files and endpoints the evaluation needs (and whether they are there)
    without loading data or calling a model."""
    lines = [f"memrl eval (dry run): run directory {Path(cfg.run.output_dir) / (cfg.run.name or 'eval')}", "files:"]
    missing = 0
    for spec in cfg.datasets:
        path = dataset_path(spec, cfg.data_dir)
        if path is None:
            lines.append(f"  {spec.name} ({spec.kind}): generated, no file")
            continue
        found = path.is_file()
        missing += not found
        lines.append(f"  {spec.name} ({spec.kind}): {path} ({'found' if found else 'NOT FOUND'})")
    lines.append("models and endpoints:")
    for model in cfg.models:
        lines += _engine_lines(f"memory model {model.name!r}", model.engine, "scripted extractive model")
        if model.adapter:
            found = Path(model.adapter).expanduser().is_dir()
            missing += not found
            lines.append(f"    LoRA adapter {model.adapter} ({'found' if found else 'NOT FOUND'})")
    lines += _engine_lines("reasoner", cfg.reasoner, "programmatic reader")
    lines += _engine_lines("judge", cfg.judge, "lexical judge")
    lines.append("systems: " + ", ".join(s.name for s in cfg.systems))
    if missing:
        lines.append(f"{missing} file(s) missing")
    print("\n".join(lines))
    return 0


def evaluate(cfg: EvalConfig, run_dir: str | Path) -> dict[str, Any]:
    """Evaluate into ``run_dir`` (resuming from its ``results.jsonl``), write ``report.md`` and ``summary.json``, and
    return the summary (in-process entry point)."""
    run_dir = Path(run_dir)
    results = run_dir / "results.jsonl"
    start = time.perf_counter()
    existing = load_results(results)
    done = {r["key"] for r in existing}
    engines = _Engines(cfg)
    skipped: list[str] = []
    written = 0
    try:
        judge_engine = engines.build(cfg.judge) if cfg.judge is not None else engines.scripted(LexicalJudge(), "judge")
        ama_judge = JudgeScorer(judge_engine, "ama", cfg.judge_max_tokens)
        locomo_judge = JudgeScorer(judge_engine, "locomo", cfg.judge_max_tokens * 2) if cfg.locomo_judge else None
        scorer = make_scorer(ama_judge, locomo_judge)
        reader = EvidenceReader(cfg.reader) if cfg.reasoner is None else None
        qa_reasoner = engines.build(cfg.reasoner) if cfg.reasoner is not None else None
        tokenizer = engines.get_tokenizer()
        count_tokens = make_token_counter(tokenizer) if tokenizer is not None else None
        for spec in cfg.datasets:
            data = load_dataset(spec, cfg.data_dir)
            for system in cfg.systems:
                if spec.kind in TASK_SYSTEMS and system.memory.name not in TASK_SYSTEMS[spec.kind]:
                    skipped.append(f"{spec.name} x {system.name}: {spec.kind} tasks run "
                                   f"{', '.join(TASK_SYSTEMS[spec.kind])} only")
                    continue
                for model in cfg.models:
                    bar = progress_bar(total=_items_of(spec, data), desc=f"{spec.name} {system.name} {model.name}",
                               leave=False)
                    if spec.kind in QA_KINDS:
                        memory = engines.memory_model(model) or engines.scripted(ExtractiveMemoryModel(), "extractive")
                        reasoner = qa_reasoner or engines.scripted(reader, "reader")
                        records = run_qa(
                            data, system.memory, EngineSet(reasoner=reasoner, memory=memory), dataset=spec.name,
                            system=system.name, model=model.name, reader=reader, skip=done, scorer=scorer,
                            count_tokens=count_tokens, episodes_per_batch=cfg.episodes_per_batch,
                            slack_steps=cfg.slack_steps, seed=cfg.run.seed, max_questions=spec.max_questions,
                            on_progress=bar.update,
                        )
                    else:
                        task_engines = _task_engines(spec.kind, data, engines, engines.memory_model(model))
                        records = run_tasks(
                            data, system.memory, task_engines, dataset=spec.name, system=system.name,
                            model=model.name, samples=spec.samples, temperature=spec.temperature, skip=done,
                            scorer=scorer, count_tokens=count_tokens, seed=cfg.run.seed, on_progress=bar.update,
                        )
                    for record in records:
                        if record["key"] in done:
                            continue
                        append_jsonl(results, record)
                        done.add(record["key"])
                        written += 1
                    bar.close()
    finally:
        engines.close()
    records = load_results(results)
    summary = summarize(cfg, records, skipped)
    summary.update(items=len(records), written_this_run=written, resumed_items=len(existing),
                   wall_s=round(time.perf_counter() - start, 2), config_hash=config_hash(cfg))
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")
    write_report(cfg, summary, run_dir / "report.md")
    write_per_question(cfg, records, run_dir / "per_question.tsv")
    return summary


def _task_engines(kind: str, tasks: list[Any], engines: _Engines, memory: Engine | None) -> EngineSet:
    if kind == "sam":
        from memrl.data.experts.sam import SamOracle
        from memrl.data.tasks.sam import SamReasoner

        reasoner = engines.scripted(SamReasoner(), "reasoner")
        return EngineSet(reasoner=reasoner, memory=memory or engines.scripted(SamOracle(), "sam-oracle"))
    from memrl.data.experts.proactive import ProactiveOracle
    from memrl.data.tasks.proactive import ActionAgent

    reasoner = engines.scripted(ActionAgent(), "action-agent")
    oracle = ProactiveOracle(truths={t.task_id: t.truth() for t in tasks})
    return EngineSet(reasoner=reasoner, memory=memory or engines.scripted(oracle, "proactive-oracle"))


# ----------------------------------------------------------------------------------------------------------------
# summary and report


OFFICIAL = {
    "locomo": ("locomo", "category", "LoCoMo F1 by category (its `task_eval/evaluation.py`: stemmed token F1, "
               "multi-hop over comma-separated parts, adversarial by 'not mentioned')"),
    "amabench": ("judge_acc", "qa_type", "AMA-Bench judge accuracy by QA type (its `compute_llm_as_judge` yes/no "
                 "prompt; an unparsable reply scores its token F1; accuracy counts scores of 1)"),
    "ama_synthetic": ("judge_acc", "qa_type", "AMA-Bench judge accuracy by QA type"),
    "generic": ("judge_acc", "qa_type", "judge accuracy by QA type"),
    "memoryarena": ("judge_acc", None, "MemoryArena task success rate (every subtask of a task correct) and progress "
                    "score (share of a task's subtasks correct); a subtask is correct when the judge accepts it"),
}
"""Per dataset kind: (the record score of the official metric, its breakdown field, what it is)."""
NEEDS_MODEL_NOTE = (
    "the scripted memory model surfaced none of the questions' evidence to the reasoner on this dataset; this "
    "system needs a real memory model here (`models[].engine`), and its score says nothing about the system"
)


def _task_rows(rows: list[dict[str, Any]], metric: str) -> list[dict[str, Any]]:
    """One row per (system, model, task) with MemoryArena's ``success`` (every subtask right) and ``progress``
    (share of subtasks right), each subtask judged by ``metric``."""
    tasks: dict[tuple[str, str, str], list[float]] = {}
    for r in rows:
        score = (r.get("scores") or {}).get(metric)
        tasks.setdefault((r["system"], r["model"], r["episode_id"]), []).append(float(score == 1.0))
    return [{"system": s, "model": m, "episode_id": e,
             "scores": {"success": float(all(v)), "progress": sum(v) / len(v)},
             "reasoner_tokens": {"spent": 0}, "memory_tokens_answer": {"prompt": 0, "completion": 0}}
            for (s, m, e), v in tasks.items()]


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
                    [dict(r, category=LOCOMO_CATEGORY_NAMES[locomo_category(r.get("category")) or 0])
                     for r in rows if locomo_category(r.get("category")) is not None], ("system", "model", "category"))
            if spec.kind == "memoryarena":
                entry["tasks"] = aggregate(_task_rows(rows, OFFICIAL["memoryarena"][0]))
            defaults = [r for r in rows if r.get("loader_defaults")]
            if defaults:
                notes = sorted({d for r in defaults for d in r["loader_defaults"]})
                entry["loader_defaults"] = {"questions": len({(r["episode_id"], r["item_id"]) for r in defaults}),
                                            "examples": notes[:5]}
            entry["needs_model"] = [
                [r["system"], r["model"]] for r in entry["overall"]
                if r.get("evidence_in_context") == 0.0 and _scripted(cfg, r["model"]) and r["memory_tokens"]
            ]
        datasets[spec.name] = entry
    return {"datasets": datasets, "skipped": skipped,
            "reader": "programmatic" if cfg.reasoner is None else cfg.reasoner.engine_name,
            "judge": "lexical (offline)" if cfg.judge is None else cfg.judge.engine_name}


def _scripted(cfg: EvalConfig, model: str) -> bool:
    return any(m.name == model and m.engine is None for m in cfg.models)


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
