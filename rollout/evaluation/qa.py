"""Question answering (AMA-Bench episodes, synthetic or loaded; LoCoMo; MemoryArena).

The memory system ingests the recorded trajectory once per (episode, system, model), following
:mod:`memrl.rollout.memory.workflow`'s protocol: a :class:`~memrl.rollout.loop.Rollout` over a :class:`ReplayEnv` is
given every trajectory turn (step = ``turn_idx``, made distinct by :func:`~memrl.data.schemas.turn_steps`) and runs
the memory-model calls that ingestion needs. Each question is then answered from a fork of that state: the question
arrives as a ``user`` turn one step after the last one (worded as the benchmark's own prompt asks it,
:func:`~memrl.rollout.evaluation.records.asked_as`), and the frozen reasoner answers through the system (calling its
retrieval tool if it has one) with ``answer(answer)``. Memory tokens of the ingestion are shared by the episode's
questions (``memory_tokens_ingest_share``); memory tokens of the answer phase are the fork's own.
``evidence_in_context`` is the share of the question's evidence strings present in the reasoner's last prompt: what
the memory surfaced, whatever the reasoner made of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from memrl.data.formats import parse_tool_calls
from memrl.data.schemas import Episode, EpisodeTrace, QAPair, turn_steps
from memrl.rollout.engines.base import Engine, GenerationResult
from memrl.rollout.evaluation.reader import Evidence, EvidenceReader, ReaderQuestion, golds_of, question_evidence
from memrl.rollout.evaluation.records import (
    Scorer,
    asked_as,
    chunks,
    conversation_tokens,
    episode_horizon,
    item_key,
    scored,
    usage_dict,
)
from memrl.rollout.loop import EngineSet, PendingCall, Rollout, run_rollouts
from memrl.rollout.memory.base import MemorySystem, RoleSampling, Turn
from memrl.rollout.memory.embedders import Embedder
from memrl.rollout.memory.proactive import ProactiveMemory
from memrl.rollout.memory.registry import MemoryConfig, build_memory
from memrl.rollout.memory.sam import TokenCounter
from memrl.rollout.memory.workflow import JobQueueMemory

__all__ = ["QA_REASONER_SYSTEM", "ReplayEnv", "drive_memory", "free_text_answer", "run_qa"]


QA_REASONER_SYSTEM = (
    "You answer a question about an agent's recorded trajectory from your context. Tools: answer(answer) gives the "
    "answer. Reply with one tool call."
)
"""The reasoner's system prompt in QA mode for systems whose own prompt has no way to answer (the proactive agent)."""


class ReplayEnv:
    """A recorded trajectory as the agent loop's task environment: nothing can be executed (``act`` is answered
    with a notice), the reasoner ends the episode with ``answer``; the outcome is left to the scorer (0.0 here)."""

    def __init__(self, episode: Episode, slack_steps: int = 4) -> None:
        self.episode = episode
        self.task_id = episode.episode_id
        self.task = episode.task
        last = turn_steps(episode.trajectory)[-1] if episode.trajectory else 0
        self.max_steps = last + 2 + slack_steps

    def reset(self) -> str:
        """The start observation: a notice that a recorded trajectory follows."""
        return f"recorded trajectory of {len(self.episode.trajectory)} turns follows."

    def step(self, action: str) -> tuple[str, bool]:
        """Refuse to act: the trajectory is a record."""
        return "error: this is a recorded trajectory; no action can be taken. Answer with answer(answer).", False

    def finish(self, answer: str | None) -> float:
        """The scorer decides the outcome."""
        return 0.0


def drive_memory(rollouts: Sequence[Rollout], engines: EngineSet) -> None:
    """Run every pending memory-model call of ``rollouts`` (batched per engine, wavefront by wavefront) until each
    rollout waits for the reasoner or is done."""
    while True:
        pending: list[tuple[Rollout, PendingCall]] = []
        for rollout in rollouts:
            call = None if rollout.done else rollout.pending()
            if call is not None and call.kind == "memory":
                pending.append((rollout, call))
        if not pending:
            return
        batches: dict[int, tuple[Engine, list[tuple[Rollout, PendingCall]]]] = {}
        for rollout, call in pending:
            engine = engines.for_call(call)
            batches.setdefault(id(engine), (engine, []))[1].append((rollout, call))
        for engine, items in batches.values():
            results = engine.generate([call.request for _, call in items])
            for (rollout, _), result in zip(items, results, strict=True):
                rollout.advance(result)


def _reasoner_system(memory: MemorySystem) -> str:
    if isinstance(memory, ProactiveMemory):
        return QA_REASONER_SYSTEM
    return str(getattr(memory, "reasoner_system", ""))


def run_qa(
    episodes: Sequence[Episode],
    memory: MemoryConfig | dict[str, Any],
    engines: EngineSet,
    *,
    dataset: str,
    system: str,
    model: str,
    reader: EvidenceReader | None = None,
    skip: Iterable[str] = (),
    scorer: Scorer | None = None,
    count_tokens: TokenCounter | None = None,
    embedder: Embedder | None = None,
    reasoner_sampling: RoleSampling | None = None,
    episodes_per_batch: int = 4,
    slack_steps: int = 4,
    seed: int = 0,
    max_questions: int | None = None,
    on_progress: Callable[[int], None] | None = None,
    free_text_answers: bool = False,
) -> Iterator[dict[str, Any]]:
    """Answer every question of ``episodes`` through the memory system ``memory`` (see the module docstring) and
    yield one record per question not in ``skip``, scored by ``scorer`` one batch of episodes at a time.

    ``reader`` must be the policy behind ``engines.reasoner`` when that is the programmatic reader (the harness
    registers each question with it); leave it None for a model reasoner. ``on_progress(n)`` is told how many
    questions each batch finished. ``free_text_answers``: a question the reasoner never answered with
    ``answer(answer)`` takes its first reply that held no tool call as the answer (``answer_source: free_text``), for
    a reasoner that answers in prose (instruction models that ignore the tool-call format)."""
    done = set(skip)
    for chunk in chunks(list(episodes), episodes_per_batch):
        work: list[tuple[Episode, list[tuple[int, QAPair]]]] = []
        for episode in chunk:
            qas = list(enumerate(episode.qa_pairs))[: max_questions if max_questions is not None else None]
            todo = [
                (i, qa)
                for i, qa in qas
                if item_key(dataset, episode.episode_id, _qa_id(qa, i), system, model) not in done
            ]
            if todo:
                work.append((episode, todo))
        if not work:
            continue
        bases = []
        for episode, _ in work:
            mem = build_memory(memory, count_tokens=count_tokens, embedder=embedder)
            base = Rollout(
                ReplayEnv(episode, slack_steps),
                mem,
                reasoner_system=_reasoner_system(mem),
                reasoner_sampling=reasoner_sampling,
                seed=seed,
                rollout_id="ingest",
                metadata={"family": "qa", "dataset": dataset},
            )
            for step, turn in zip(turn_steps(episode.trajectory), episode.trajectory, strict=True):
                base.add_turn(Turn(step=step, action_text=turn.action, observation=turn.observation, role="tool"))
            bases.append(base)
        drive_memory(bases, engines)
        forks: list[tuple[Rollout, Rollout, Episode, int, QAPair, Evidence]] = []
        for base, (episode, todo) in zip(bases, work, strict=True):
            asked_at = (turn_steps(episode.trajectory)[-1] if episode.trajectory else 0) + 1
            for index, qa in todo:
                fork = base.fork(f"{dataset}|{system}|{model}|{_qa_id(qa, index)}")
                asked = asked_as(qa)
                text = asked if isinstance(fork.memory, JobQueueMemory) else f"question: {asked}"
                evidence = question_evidence(episode, qa)
                if reader is not None:
                    reader.register(
                        fork.env.task_id, fork.rollout_id, ReaderQuestion(asked, qa.answer, evidence, asked_at)
                    )
                fork.add_turn(Turn(step=asked_at, action_text="", observation=text, role="user"))
                forks.append((fork, base, episode, index, qa, evidence))
        lengths = {id(e): conversation_tokens(e, count_tokens) for e, _ in work}
        horizons = {id(e): episode_horizon(e, lengths[id(e)]) for e, _ in work}
        last_prompt: dict[int, str] = {}
        traces = run_rollouts([f[0] for f in forks], engines, on_result=_prompt_recorder(last_prompt))
        shares = {id(base): max(1, sum(1 for f in forks if f[1] is base)) for base in bases}
        records = []
        for (fork, base, episode, index, qa, evidence), trace in zip(forks, traces, strict=True):
            memory_answer = fork.memory_usage - base.memory_usage
            ingest = usage_dict(base.memory_usage)
            share = {k: v / shares[id(base)] for k, v in ingest.items()}
            context = last_prompt.get(id(fork), "").replace(asked_as(qa), " ")
            answer, source = trace.answer, "tool_call" if trace.answer is not None else None
            if answer is None and free_text_answers:
                answer = free_text_answer(trace)
                source = "free_text" if answer is not None else None
            records.append(
                {
                    "key": item_key(dataset, episode.episode_id, _qa_id(qa, index), system, model),
                    "dataset": dataset,
                    "mode": "qa",
                    "episode_id": episode.episode_id,
                    "item_id": _qa_id(qa, index),
                    "system": system,
                    "model": model,
                    "question": qa.question,
                    "gold": qa.answer,
                    "golds": golds_of(qa),
                    "answer": answer,
                    "answer_source": source,
                    "qa_type": qa.type,
                    "category": qa.metadata.get("category"),
                    "options": qa.metadata.get("options"),
                    "horizon": horizons[id(episode)],
                    "horizon_tokens": episode.horizon_tokens or lengths[id(episode)],
                    "task": episode.task,
                    "task_type": episode.task_type,
                    "loader_defaults": [
                        *episode.metadata.get("loader_defaults", []),
                        *qa.metadata.get("loader_defaults", []),
                    ],
                    "evidence_in_context": evidence.share(context),
                    "reasoner_tokens": usage_dict(fork.reasoner_usage),
                    "memory_tokens_answer": usage_dict(memory_answer),
                    "memory_tokens_ingest": ingest,
                    "memory_tokens_ingest_share": share,
                    "memory_calls_answer": len(fork.memory_calls) - len(base.memory_calls),
                    "reasoner_calls": fork.reasoner_usage.calls,
                    "stats": dict(trace.stats),
                }
            )
        yield from scored(records, scorer, on_progress)


def free_text_answer(trace: EpisodeTrace) -> str | None:
    """The reasoner's first reply that held no tool call, as a free-text answer (None when there is none)."""
    for event in trace.events:
        if (
            event.kind == "error"
            and event.reply.strip()
            and not parse_tool_calls(event.reply).calls
            and not parse_tool_calls(event.reply).errors
        ):
            return " ".join(event.reply.split())
    return None


def _prompt_recorder(store: dict[int, str]) -> Callable[[Rollout, PendingCall, GenerationResult], None]:
    """An ``on_result`` hook keeping each rollout's last reasoner prompt (non-system messages) in ``store``."""

    def record(rollout: Rollout, call: PendingCall, result: GenerationResult) -> None:
        if call.kind == "reasoner" and call.request.messages is not None:
            store[id(rollout)] = "\n".join(m.content for m in call.request.messages if m.role != "system")

    return record


def _qa_id(qa: QAPair, index: int) -> str:
    return qa.qa_id or f"q{index}"
