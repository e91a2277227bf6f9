"""The engines an evaluation calls (built once per run, closed at its end) and the scorer of its records."""

from __future__ import annotations

from typing import Any

from memrl.launch.evaluation.config import EvalConfig, ModelSpec
from memrl.rewards.scorers import (
    JudgeItem,
    JudgeScorer,
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
from memrl.rollout.evaluation.records import Scorer
from memrl.rollout.loop import EngineSet

__all__ = ["EvalEngines", "make_scorer", "task_engines"]


class EvalEngines:
    """Builds engines once per run and closes them at the end."""

    def __init__(self, cfg: EvalConfig) -> None:
        self.cfg = cfg
        self.tokenizer: Any = None
        self._tokenizer_loaded = False
        self.models: dict[str, Engine] = {}
        self.built: list[Engine] = []

    def get_tokenizer(self) -> Any:
        """The tokenizer that counts scripted engines' tokens (``cfg.tokenizer``), loaded once; None for none."""
        if not self._tokenizer_loaded:
            self._tokenizer_loaded = True
            name = self.cfg.tokenizer
            if name is not None:
                from memrl.rollout.models import TinyModelSpec, ensure_tiny_model, load_tokenizer

                path = ensure_tiny_model(self.cfg.model_cache, TinyModelSpec()) if name == "tiny" else name
                self.tokenizer = load_tokenizer(path)
        return self.tokenizer

    def build(self, cfg: EngineConfig) -> Engine:
        """Build an engine, closed with the others at the end."""
        engine = build_engine(cfg)
        self.built.append(engine)
        return engine

    def scripted(self, policy: Any, name: str) -> Engine:
        """A scripted engine over ``policy`` that counts tokens with the run's tokenizer."""
        from memrl.rollout.engines.scripted import ScriptedEngine

        return ScriptedEngine(policy, tokenizer=self.get_tokenizer(), name=name)

    def memory_model(self, spec: ModelSpec) -> Engine | None:
        """The engine of a memory model (with its adapter loaded), built once; None for the scripted default."""
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
        """Close every engine built."""
        for engine in self.built:
            engine.close()


def task_scores(record: dict[str, Any]) -> dict[str, float]:
    """A task record's scores: ``success`` (the episode was won), ``outcome`` (the verifier's, in [0, 1]),
    ``partial_outcome`` (with partial credit), ``truncated`` (cut by the step limit) and ``steps``."""
    outcome = verifier_outcome(record.get("outcome"))
    return {
        "success": float(record.get("won", outcome >= 1.0)),
        "outcome": outcome,
        "partial_outcome": verifier_outcome(record.get("partial_outcome", outcome)),
        "truncated": float(bool(record.get("truncated"))),
        "steps": float(record.get("steps", 0)),
    }


def make_scorer(ama_judge: JudgeScorer, locomo_judge: JudgeScorer | None) -> Scorer:
    """The scorer the harness calls per batch: lexical metrics, LoCoMo category scores and judges for QA records,
    the verifier's outcome for task records."""

    def score(records: list[dict[str, Any]]) -> list[dict[str, float]]:
        out: list[dict[str, float]] = []
        for r in records:
            if r["mode"] != "qa":
                out.append(task_scores(r))
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
        items = [
            JudgeItem(
                records[i]["question"],
                records[i]["gold"],
                records[i]["answer"] or "",
                records[i].get("task", ""),
                records[i].get("task_type", ""),
                str(records[i].get("episode_id", "")),
            )
            for i in qa
        ]
        for i, verdict in zip(qa, ama_judge.score(items), strict=True):
            out[i].update(
                judge=verdict.score,
                judge_acc=float(verdict.score == 1.0),
                judge_parsed=float(verdict.parsed),
                judge_failed=float(verdict.failed),
            )
        locomo = [i for i in qa if locomo_category(records[i].get("category")) is not None]
        if locomo_judge is not None and locomo:
            items = [JudgeItem(records[i]["question"], records[i]["gold"], records[i]["answer"] or "") for i in locomo]
            for i, verdict in zip(locomo, locomo_judge.score(items), strict=True):
                out[i].update(locomo_judge=verdict.score, locomo_judge_failed=float(verdict.failed))
        return out

    return score


def task_engines(spec: Any, tasks: list[Any], engines: EvalEngines, memory: Engine | None) -> EngineSet:
    """The engines of a task dataset: its family's scripted reasoner (action agent; ``spec.reasoner`` for a ``tasks``
    dataset when set) and the memory model, by default the family's oracle expert."""
    kind = spec.kind
    if kind == "tasks":
        from memrl.data.registry import ComponentError, import_entry
        from memrl.data.tasks import family_of
        from memrl.rollout.engines.config import load_scripted_policy

        reg = family_of(spec.tasks)
        if spec.reasoner is not None:
            reasoner = engines.build(spec.reasoner)
        else:
            reasoner = engines.scripted(
                load_scripted_policy(reg.extra.get("reasoner") or "memrl.rollout.episodes:NoReasoner"), "reasoner"
            )
        if memory is None:
            if not reg.extra.get("oracle") or reg.extra.get("memory") == "proactive":
                raise ComponentError(
                    f"dataset {spec.name!r}: family {spec.tasks.family!r} has no oracle expert to "
                    f"stand in for 'engine: null': give the model an engine"
                )
            memory = engines.scripted(import_entry(reg.extra["oracle"], "oracle expert")(), "oracle")
        return EngineSet(reasoner=reasoner, memory=memory)
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
