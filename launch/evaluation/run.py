"""The evaluation run: every dataset x system x model, one scored record per item appended to ``results.jsonl`` at
once, resumed by record key; then ``summary.json``, ``report.md`` and ``per_question.tsv``."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from memrl.data.config import config_hash
from memrl.data.formats import parse_tool_calls
from memrl.data.io import append_jsonl, atomic_write_text, iter_jsonl
from memrl.data.run_dir import prepare_run_dir
from memrl.data.schemas import Message
from memrl.data.tracking import progress_bar
from memrl.launch.evaluation.config import QA_KINDS, TASK_SYSTEMS, EvalConfig
from memrl.launch.evaluation.datasets import items_of, load_dataset
from memrl.launch.evaluation.engines import EvalEngines, make_scorer, task_engines
from memrl.launch.evaluation.report import write_per_question, write_report
from memrl.launch.evaluation.summary import summarize
from memrl.rewards.scorers import JudgeScorer, LexicalJudge
from memrl.rollout.engines.base import Engine, EngineError, GenerationRequest, SamplingParams
from memrl.rollout.evaluation.extractive import ExtractiveMemoryModel
from memrl.rollout.evaluation.qa import QA_REASONER_SYSTEM, run_qa
from memrl.rollout.evaluation.reader import EvidenceReader
from memrl.rollout.evaluation.tasks import run_tasks
from memrl.rollout.loop import EngineSet
from memrl.rollout.memory.sam import make_token_counter

__all__ = ["FORMAT_PROBE", "REPLY_FORMAT", "evaluate", "load_results", "probe_reasoner_format", "run_eval"]

log = logging.getLogger(__name__)


def incompatible(spec: Any, memory: str) -> str | None:
    """Why a dataset cannot run a memory system (None: it can)."""
    if spec.kind in ("sam", "proactive") and memory not in TASK_SYSTEMS[spec.kind]:
        return f"{spec.kind} tasks run {', '.join(TASK_SYSTEMS[spec.kind])} only"
    if spec.kind == "tasks":
        from memrl.data.tasks import family_of

        own_loop = family_of(spec.tasks).extra.get("kind") in ("episode", "http")
        if own_loop != (memory == "external"):
            return (
                "an episode function or an HTTP agent runs its own memory (memory: external)"
                if own_loop
                else "memory: external is for episode functions and HTTP agents"
            )
    return None


def run_eval(cfg: EvalConfig) -> int:
    """``memrl eval``: run (or resume) the evaluation into the run directory and print the report's main tables."""
    run_dir = prepare_run_dir(cfg, cfg.run, "eval")
    summary = evaluate(cfg, run_dir)
    log.info((run_dir / "report.md").read_text(encoding="utf-8"))
    log.info(f"[eval] {summary['items']} items in {run_dir / 'results.jsonl'}; report: {run_dir / 'report.md'}")
    return 0


REPLY_FORMAT = (
    '<tool_call>{"name": "answer", "arguments": {"answer": "..."}}</tool_call> (or the '
    "<tool_call><function=answer><parameter=answer>...</parameter></function></tool_call> form, or a bare "
    'JSON object with "name" and "arguments")'
)
"""The reply the harness reads as an answer (memrl.data.formats.parse_tool_calls); anything else is malformed."""
FORMAT_PROBE = (
    "context: the red key is in the kitchen drawer. The blue key is in the garage.\nquestion: where is the red key?"
)
"""The probe question sent to a model reasoner before an evaluation (with the QA reasoner's system prompt)."""


def probe_reasoner_format(reasoner: Engine, free_text: bool) -> dict[str, Any]:
    """Ask the reasoner one easy question as the harness asks (QA system prompt, greedy) and check that it answers
    with the ``answer`` tool call the harness parses; a clear warning when it does not. Returns what it saw."""
    request = GenerationRequest(
        messages=[Message(role="system", content=QA_REASONER_SYSTEM), Message(role="user", content=FORMAT_PROBE)],
        sampling=SamplingParams(temperature=0.0, max_tokens=128, seed=0),
    )
    try:
        reply = reasoner.generate([request])[0].completions[0].text
    except EngineError as exc:
        log.warning(f"[eval] the reasoner format probe failed ({exc}); the run goes on unchecked")
        return {"follows": None, "reply": "", "error": str(exc)}
    calls = parse_tool_calls(reply).calls
    follows = any(c.name == "answer" and "answer" in c.arguments for c in calls)
    excerpt = " ".join(reply.split())[:200]
    if not follows:
        then = (
            "its plain-text replies are taken as answers (free_text_answers: true)"
            if free_text
            else "every answer it gives so is dropped as malformed and scores as unanswered; set free_text_answers: "
            "true to take plain-text replies as answers"
        )
        log.warning(
            f"[eval] the reasoner {reasoner.name} did not answer the format probe with the tool call the "
            f"harness reads, {REPLY_FORMAT}; it replied {excerpt!r}: {then}"
        )
    return {"follows": follows, "reply": excerpt}


def evaluate(cfg: EvalConfig, run_dir: str | Path) -> dict[str, Any]:
    """Evaluate into ``run_dir`` (resuming from its ``results.jsonl``), write ``report.md`` and ``summary.json``, and
    return the summary (in-process entry point)."""
    run_dir = Path(run_dir)
    results = run_dir / "results.jsonl"
    start = time.perf_counter()
    existing = load_results(results)
    done = {r["key"] for r in existing}
    engines = EvalEngines(cfg)
    skipped: list[str] = []
    reasoner_format: dict[str, Any] | None = None
    written = 0
    try:
        judge_engine = engines.build(cfg.judge) if cfg.judge is not None else engines.scripted(LexicalJudge(), "judge")
        ama_judge = JudgeScorer(judge_engine, "ama", cfg.judge_max_tokens)
        locomo_judge = JudgeScorer(judge_engine, "locomo", cfg.judge_max_tokens * 2) if cfg.locomo_judge else None
        scorer = make_scorer(ama_judge, locomo_judge)
        reader = EvidenceReader(cfg.reader) if cfg.reasoner is None else None
        qa_reasoner = engines.build(cfg.reasoner) if cfg.reasoner is not None else None
        if qa_reasoner is not None and any(spec.kind in QA_KINDS for spec in cfg.datasets):
            reasoner_format = probe_reasoner_format(qa_reasoner, cfg.free_text_answers)
        tokenizer = engines.get_tokenizer()
        count_tokens = make_token_counter(tokenizer) if tokenizer is not None else None
        for spec in cfg.datasets:
            data = load_dataset(spec, cfg.data_dir)
            for system in cfg.systems:
                if (why := incompatible(spec, system.memory.name)) is not None:
                    skipped.append(f"{spec.name} x {system.name}: {why}")
                    continue
                for model in cfg.models:
                    bar = progress_bar(
                        total=items_of(spec, data), desc=f"{spec.name} {system.name} {model.name}", leave=False
                    )
                    common: dict[str, Any] = {
                        "dataset": spec.name,
                        "system": system.name,
                        "model": model.name,
                        "skip": done,
                        "scorer": scorer,
                        "count_tokens": count_tokens,
                        "seed": cfg.run.seed,
                        "on_progress": bar.update,
                    }
                    if spec.kind in QA_KINDS:
                        memory = engines.memory_model(model) or engines.scripted(ExtractiveMemoryModel(), "extractive")
                        reasoner = qa_reasoner or engines.scripted(reader, "reader")
                        records = run_qa(
                            data,
                            system.memory,
                            EngineSet(reasoner=reasoner, memory=memory),
                            reader=reader,
                            episodes_per_batch=cfg.episodes_per_batch,
                            slack_steps=cfg.slack_steps,
                            max_questions=spec.max_questions,
                            free_text_answers=cfg.free_text_answers,
                            **common,
                        )
                    else:
                        engine_set = task_engines(spec, data, engines, engines.memory_model(model))
                        records = run_tasks(
                            data,
                            system.memory,
                            engine_set,
                            samples=spec.samples,
                            temperature=spec.temperature,
                            **common,
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
    summary["reasoner_format"] = reasoner_format
    summary.update(
        items=len(records),
        written_this_run=written,
        resumed_items=len(existing),
        wall_s=round(time.perf_counter() - start, 2),
        config_hash=config_hash(cfg),
    )
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")
    write_report(cfg, summary, run_dir / "report.md")
    write_per_question(cfg, records, run_dir / "per_question.tsv")
    return summary


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
