"""MemMA ("MemMA: Coordinating the Memory Cycle..." (arXiv 2603.18718), section 4): a planner-worker memory cycle with
in-situ self-evolution.

Forward path. The interaction arrives in chunks of ``chunk_turns`` turns; ``session_chunks`` chunks make a session.
For each chunk the Meta-Thinker writes construction guidance from the chunk and a bounded memory view (the
``view_size`` entries most similar to the chunk) (``memma_meta_think``, phase ``construct``), and the Memory Manager
applies atomic edits ADD / UPDATE / DELETE / NONE (``memma_manage``). A question runs the Query Reasoner loop: u0 = the
question, E0 = the ``top_k`` entries most similar to it; while the Meta-Thinker's critique (``memma_meta_think``, phase
``critique``) says *not answerable* and fewer than ``refine_budget`` (H) refinements were made, the Query Reasoner
writes the next query (``memma_query``) and its top-k results join E. The Answer Agent (``memma_answer``) answers from
the final E.

Backward path, after each session: J probe QA pairs grounded in the session (``memma_probe``); each probe is answered
from its top-k evidence by the Answer Agent and judged against its gold answer (``memma_verify``, or lexically);
every failed probe gets an evidence-grounded repair proposal (``memma_repair``); each proposed fact is consolidated
against the memory (``memma_consolidate``, or by similarity): SKIP if redundant, MERGE into the entry it complements,
INSERT if new. Consolidation is sequential, so later proposals see facts inserted by earlier ones.

Ablations (:class:`MemMAConfig`): ``construction_guidance=False`` (/C: the Manager edits without guidance),
``iterative_retrieval=False`` (/R: one-shot top-k retrieval), ``self_evolution=False`` (/E: no probe-and-repair).

In an interactive task the reasoner sees the task, the last ``recent_turns`` raw turns and the result of its last
``memory(query)`` call (query loop + Answer Agent: the proposed answer and the evidence). Question-answering mode
follows :mod:`memrl.rollout.memory.workflow`: the replayed turns are chunked and consolidated as they arrive; the
question flushes the last chunk and session, runs the query loop, and the reasoner's message ends with the evidence, the
Answer Agent's proposed answer and ``question: ...``.

Deviations from the paper: sessions are fixed-size groups of turns (agent trajectories have no session boundaries);
the Memory Manager may return several atomic edits per chunk; the probe judge and the consolidation are memory-model
calls by default with a lexical / similarity rule as the switchable alternative and as the fallback for unreadable
answers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from memrl.data.config import ConfigModel
from memrl.data.formats import ToolCall
from memrl.data.schemas import Message
from memrl.rollout.memory.base import MemoryRequest, RoleSampling, ToolResult, Turn, register_memory
from memrl.rollout.memory.embedders import EmbedderName, top_k
from memrl.rollout.memory.prompts_memma import (
    MEMMA_REASONER_SYSTEM,
    parse_memma_answer,
    parse_memma_consolidation,
    parse_memma_critique,
    parse_memma_edits,
    parse_memma_probes,
    parse_memma_query,
    parse_memma_repair,
    parse_yes_no,
    render_memma_answer,
    render_memma_consolidate,
    render_memma_critique,
    render_memma_entries,
    render_memma_guidance,
    render_memma_manage,
    render_memma_probe,
    render_memma_query,
    render_memma_repair,
    render_memma_verify,
)
from memrl.rollout.memory.workflow import EmbeddingJobQueueMemory, Inbound, Job, action_of, truncate

__all__ = ["Entry", "MemMAConfig", "MemMAMemory", "lexical_match"]


class MemMAConfig(ConfigModel):
    """MemMA's switches (the paper's /C, /R, /E ablations), budgets and chunking."""

    name: Literal["memma"] = "memma"  # selects this memory system
    construction_guidance: bool = True  # /C when False
    iterative_retrieval: bool = True  # /R when False
    self_evolution: bool = True  # /E when False
    top_k: int = 10  # entries retrieved per query (and as a probe's evidence)
    refine_budget: int = 3  # H
    probes_per_session: int = 5  # J
    chunk_turns: int = 4  # turns per chunk (one construction step)
    session_chunks: int = 2  # chunks per session (probe-and-repair after each)
    view_size: int = 8  # entries in the Meta-Thinker's memory view of a chunk
    max_edits_per_chunk: int = 8  # Memory Manager edits applied per chunk at most
    verify_judge: Literal["model", "lexical"] = "model"  # probe answers judged by the memory model or lexically
    consolidation: Literal["model", "similarity"] = "model"  # repairs consolidated by the memory model or by similarity
    skip_similarity: float = 0.9  # similarity rule: at least this close to an entry -> SKIP
    merge_similarity: float = 0.5  # ... at least this close -> MERGE into it, else INSERT
    recent_turns: int = 4  # raw recent turns shown to the reasoner
    observation_chars: int = 400  # observations cut to this length in prompts (0: whole)
    embedder: EmbedderName = "minilm"  # minilm (all-MiniLM-L6-v2) or hashing (bag of words, no model)
    sampling: dict[str, RoleSampling] = {
        role: RoleSampling(temperature=0.0, max_tokens=256)
        for role in (
            "memma_meta_think",
            "memma_manage",
            "memma_query",
            "memma_answer",
            "memma_probe",
            "memma_verify",
            "memma_repair",
            "memma_consolidate",
        )
    }


@dataclass
class Entry:
    """One memory-bank entry and the turns it came from."""

    entry_id: str
    text: str
    turns: list[int] = field(default_factory=list)


_TOKEN = re.compile(r"[a-z0-9]+")


def lexical_match(predicted: str, gold: str, threshold: float = 0.5) -> bool:
    """True when the normalised gold answer appears in the prediction or their token F1 reaches ``threshold``."""
    p, g = _TOKEN.findall(predicted.lower()), _TOKEN.findall(gold.lower())
    if not g or not p:
        return False
    if " ".join(g) in " ".join(p):
        return True
    common = sum(min(p.count(t), g.count(t)) for t in set(g))
    if common == 0:
        return False
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall) >= threshold


@register_memory("memma", config=MemMAConfig)
class MemMAMemory(EmbeddingJobQueueMemory):
    """MemMA behind the memory-system interface (see the module docstring)."""

    name = "memma"
    tools = ("memory",)

    config: MemMAConfig
    config_model = MemMAConfig

    def _clear(self) -> None:
        super()._clear()
        self.entries: dict[str, Entry] = {}
        self._vectors: dict[str, np.ndarray] = {}
        self._matrix: tuple[list[str], np.ndarray] | None = None  # stacked vectors, rebuilt after a write
        self._next_entry = 1
        self._chunk: list[tuple[int, str, str]] = []  # (turn, action, observation) not yet constructed
        self._session: list[tuple[int, str, str]] = []  # turns of the session not yet evolved
        self._session_chunks = 0
        self.recent: list[tuple[int, str, str]] = []
        self.support = ""  # the last query loop's result shown to the reasoner
        self.sessions_evolved = 0

    # ---------------------------------------------------------------------------------------------------------
    # The memory bank

    def add_entry(self, text: str, turns: list[int]) -> str:
        """ADD / INSERT: a new entry; returns its id."""
        entry_id = f"m{self._next_entry}"
        self._next_entry += 1
        self.entries[entry_id] = Entry(entry_id, text, sorted(set(turns)))
        self._vectors[entry_id] = self.embedder.embed([text])[0]
        self._matrix = None
        return entry_id

    def update_entry(self, entry_id: str, text: str, turns: list[int]) -> None:
        """UPDATE / MERGE: new text for an existing entry."""
        entry = self.entries[entry_id]
        entry.text = text
        entry.turns = sorted(set(entry.turns) | set(turns))
        self._vectors[entry_id] = self.embedder.embed([text])[0]
        self._matrix = None

    def delete_entry(self, entry_id: str) -> None:
        """DELETE."""
        del self.entries[entry_id]
        del self._vectors[entry_id]
        self._matrix = None

    def search(self, query: str, k: int) -> list[tuple[str, float]]:
        """The ``k`` entries most similar to ``query``: (id, cosine), best first."""
        if not self.entries or k <= 0:
            return []
        if self._matrix is None:
            ids = list(self.entries)
            self._matrix = (ids, np.stack([self._vectors[i] for i in ids]))
        ids, matrix = self._matrix
        return [(ids[row], score) for row, score in top_k(matrix, self.embedder.embed([query])[0], k)]

    def _view(self, text: str) -> str:
        ids = sorted((i for i, _ in self.search(text, self.config.view_size)), key=self._entry_order)
        return render_memma_entries([(i, self.entries[i].text) for i in ids])

    def _entry_order(self, entry_id: str) -> int:
        return int(entry_id[1:])

    def _evidence(self, ids: list[str]) -> str:
        return render_memma_entries([(i, self.entries[i].text) for i in ids if i in self.entries])

    def _turns_text(self, turns: list[tuple[int, str, str]]) -> str:
        return "\n".join(
            f"[turn {t}] {a or '(start)'} -> {truncate(o, self.config.observation_chars)}" for t, a, o in turns
        )

    # ---------------------------------------------------------------------------------------------------------
    # Turns

    def _on_question(self, turn: Turn) -> None:
        self._flush(session=True)
        self._enqueue(self._new_job("query", question=turn.observation, origin="question", phase="search"))

    def _ingest(self, item: Inbound) -> None:
        turn = item.turn
        record = (turn.step, action_of(turn.action_text), turn.observation)
        self.recent = [*self.recent, record][-max(self.config.recent_turns, 1) :]
        self._chunk.append(record)
        if len(self._chunk) >= self.config.chunk_turns:
            self._flush(session=False)

    def _flush(self, session: bool) -> None:
        """Queue construction of the buffered chunk, and self-evolution when the session is complete (or forced)."""
        if self._chunk:
            self._enqueue(self._new_job("construct", turns=list(self._chunk), phase="guide"))
            self._session += self._chunk
            self._chunk = []
            self._session_chunks += 1
        if self._session and (session or self._session_chunks >= self.config.session_chunks):
            if self.config.self_evolution:
                self._enqueue(self._new_job("evolve", turns=list(self._session), phase="probe"))
            self._session = []
            self._session_chunks = 0

    # ---------------------------------------------------------------------------------------------------------
    # Jobs

    def _request(self, job: Job) -> MemoryRequest | None:
        if job.kind == "construct":
            return self._construct_request(job)
        if job.kind == "evolve":
            return self._evolve_request(job)
        return self._query_request(job)

    def _consume(self, job: Job, text: str) -> None:
        if job.kind == "construct":
            self._construct_consume(job, text)
        elif job.kind == "evolve":
            self._evolve_consume(job, text)
        else:
            self._query_consume(job, text)

    # construction: guidance -> edits
    def _construct_request(self, job: Job) -> MemoryRequest | None:
        data = job.data
        if data["phase"] == "done":
            return None
        chunk = self._turns_text([tuple(t) for t in data["turns"]])
        if "view" not in data:  # the bank does not change between guidance and edits: one view for both
            data["view"] = self._view(chunk)
        if data["phase"] == "guide" and not self.config.construction_guidance:
            data.update(phase="manage", guidance=None)
        if data["phase"] == "guide":
            return self._call(
                job, "memma_meta_think", render_memma_guidance(self.task, data["view"], chunk), phase="construct"
            )
        if data["phase"] == "manage":
            messages = render_memma_manage(self.task, data["view"], data["guidance"], chunk)
            return self._call(job, "memma_manage", messages, phase="manage")
        return None

    def _construct_consume(self, job: Job, text: str) -> None:
        data = job.data
        if data["phase"] == "guide":
            guidance = text.strip()
            if not guidance:
                self.count("memma_guidance_empty")
            data.update(phase="manage", guidance=guidance or "none")
            return
        turns = [t[0] for t in data["turns"]]
        edits, errors = parse_memma_edits(text)
        if errors:
            self.count("memma_edit_errors", len(errors))
        for edit in edits[: self.config.max_edits_per_chunk]:
            self._apply_edit(edit.op, edit.entry_id, edit.text, turns)
        if not edits:
            self.count("memma_manage_unparsed")
            self.add_entry(self._turns_text([tuple(t) for t in data["turns"]]), turns)
        data["phase"] = "done"

    def _apply_edit(self, op: str, entry_id: str | None, text: str, turns: list[int]) -> None:
        self.count(f"memma_edit_{op.lower()}")
        if op == "NONE":
            return
        if entry_id is None or entry_id not in self.entries:
            if op == "DELETE" or entry_id is not None:
                self.count("memma_edit_unknown_id")
            if op != "DELETE":
                self.add_entry(text, turns)  # an UPDATE of an unknown entry keeps the fact rather than lose it
            return
        if op == "DELETE":
            self.delete_entry(entry_id)
        elif op == "UPDATE":
            self.update_entry(entry_id, text, turns)
        else:
            self.add_entry(text, turns)

    # self-evolution: probe -> (answer -> judge)* -> repair* -> consolidate*
    def _evolve_request(self, job: Job) -> MemoryRequest | None:
        data = job.data
        while True:
            phase = data["phase"]
            if phase == "probe":
                session = self._turns_text([tuple(t) for t in data["turns"]])
                messages = render_memma_probe(self.task, self._view(session), session, self.config.probes_per_session)
                return self._call(job, "memma_probe", messages, phase="probe")
            if phase == "answer":
                probe = data["probes"][data["index"]]
                if "evidence" not in probe:
                    probe["evidence"] = [i for i, _ in self.search(probe["question"], self.config.top_k)]
                messages = render_memma_answer(probe["question"], self._evidence(probe["evidence"]))
                return self._call(job, "memma_answer", messages, phase="verify_answer")
            if phase == "judge":
                probe = data["probes"][data["index"]]
                if self.config.verify_judge == "model":
                    messages = render_memma_verify(probe["question"], probe["answer"], probe["predicted"])
                    return self._call(job, "memma_verify", messages, phase="verify")
                self._judged(data, lexical_match(probe["predicted"], probe["answer"]))
                continue
            if phase == "repair":
                if data["index"] >= len(data["failed"]):
                    data.update(phase="consolidate", index=0)
                    continue
                probe = data["probes"][data["failed"][data["index"]]]
                view = self._view(probe["question"])
                messages = render_memma_repair(
                    probe["question"], probe["answer"], probe["predicted"], self._evidence(probe["evidence"]), view
                )
                return self._call(job, "memma_repair", messages, phase="repair")
            if phase == "consolidate":
                if data["index"] >= len(data["candidates"]):
                    data["phase"] = "done"
                    self.sessions_evolved += 1
                    self.count("memma_sessions_evolved")
                    continue
                candidate = data["candidates"][data["index"]]
                if self.config.consolidation == "model":
                    closest = [i for i, _ in self.search(candidate, 3)]
                    messages = render_memma_consolidate(candidate, self._evidence(closest))
                    return self._call(job, "memma_consolidate", messages, phase="consolidate")
                self.consolidate(candidate, self._turns_of(data), None)
                data["index"] += 1
                continue
            return None

    def _turns_of(self, data: dict[str, Any]) -> list[int]:
        return [t[0] for t in data["turns"]]

    def _judged(self, data: dict[str, Any], correct: bool) -> None:
        self.count("memma_probe_pass" if correct else "memma_probe_fail")
        if not correct:
            data["failed"].append(data["index"])
        data["index"] += 1
        if data["index"] >= len(data["probes"]):
            data.update(phase="repair", index=0)
        else:
            data["phase"] = "answer"

    def _evolve_consume(self, job: Job, text: str) -> None:
        data = job.data
        phase = data["phase"]
        if phase == "probe":
            pairs = parse_memma_probes(text, self.config.probes_per_session)
            if not pairs:
                self.count("memma_probe_unparsed")
                data["phase"] = "done"
                return
            data.update(
                probes=[{"question": q, "answer": a} for q, a in pairs],
                index=0,
                failed=[],
                candidates=[],
                phase="answer",
            )
        elif phase == "answer":
            data["probes"][data["index"]]["predicted"] = parse_memma_answer(text)
            data["phase"] = "judge"
        elif phase == "judge":
            probe = data["probes"][data["index"]]
            verdict = parse_yes_no(text)
            if verdict is None:
                self.count("memma_verify_unparsed")
                verdict = lexical_match(probe["predicted"], probe["answer"])
            self._judged(data, verdict)
        elif phase == "repair":
            _, fact = parse_memma_repair(text)
            if fact:
                data["candidates"].append(fact)
            else:
                self.count("memma_repair_unparsed")
            data["index"] += 1
        elif phase == "consolidate":
            candidate = data["candidates"][data["index"]]
            self.consolidate(candidate, self._turns_of(data), parse_memma_consolidation(text))
            data["index"] += 1

    def consolidate(self, candidate: str, turns: list[int], decision: tuple[str, str | None, str] | None) -> str:
        """Write one repair fact: SKIP, MERGE into an entry, or INSERT. ``decision`` is the memory model's (None: the
        similarity rule decides, also when the model's decision is unusable). Returns the action taken."""
        if decision is not None and decision[0] == "MERGE" and decision[1] not in self.entries:
            self.count("memma_consolidate_unknown_id")
            decision = None
        if decision is None:
            if self.config.consolidation == "model":
                self.count("memma_consolidate_unparsed")
            decision = self._similarity_decision(candidate)
        action, entry_id, merged = decision
        if action == "MERGE" and entry_id is not None:
            entry = self.entries[entry_id]
            self.update_entry(entry_id, merged or f"{entry.text}; {candidate}", turns)
        elif action == "INSERT":
            self.add_entry(candidate, turns)
        self.count(f"memma_consolidate_{action.lower()}")
        return action

    def _similarity_decision(self, candidate: str) -> tuple[str, str | None, str]:
        best = self.search(candidate, 1)
        if best and best[0][1] >= self.config.skip_similarity:
            return "SKIP", best[0][0], ""
        if best and best[0][1] >= self.config.merge_similarity:
            return "MERGE", best[0][0], ""
        return "INSERT", None, ""

    # the query loop: search -> (critique -> query -> search)* -> answer
    def _query_request(self, job: Job) -> MemoryRequest | None:
        data = job.data
        if data["phase"] == "search":
            data.update(
                queries=[data["question"]],
                h=0,
                diagnosis="",
                evidence=[i for i, _ in self.search(data["question"], self.config.top_k)],
            )
            refine = self.config.iterative_retrieval and self.config.refine_budget > 0
            data["phase"] = "critique" if refine else "answer"
        if data["phase"] == "critique" and data["h"] >= self.config.refine_budget:
            data["phase"] = "answer"
        evidence = self._evidence(data["evidence"])
        if data["phase"] == "critique":
            return self._call(
                job,
                "memma_meta_think",
                render_memma_critique(data["question"], data["queries"], evidence),
                phase="critique",
            )
        if data["phase"] == "query":
            messages = render_memma_query(data["question"], data["queries"], evidence, data["diagnosis"])
            return self._call(job, "memma_query", messages, phase="query")
        if data["phase"] == "answer":
            return self._call(job, "memma_answer", render_memma_answer(data["question"], evidence), phase="answer")
        return None

    def _query_consume(self, job: Job, text: str) -> None:
        data = job.data
        if data["phase"] == "critique":
            answerable, diagnosis = parse_memma_critique(text)
            if answerable is None:
                self.count("memma_critique_unparsed")
                answerable = True  # stop refining rather than spend the budget on an unreadable critique
            if answerable:
                data["phase"] = "answer"
            else:
                data.update(phase="query", diagnosis=diagnosis or "more evidence is needed")
            return
        if data["phase"] == "query":
            query = parse_memma_query(text)
            if not query:
                self.count("memma_query_empty")
                query = f"{data['question']} {data['diagnosis']}"
            data["queries"].append(query)
            found = [i for i, _ in self.search(query, self.config.top_k)]
            data["evidence"] += [i for i in found if i not in data["evidence"]]
            data.update(h=data["h"] + 1, phase="critique")
            self.count("memma_refinements")
            return
        answer = parse_memma_answer(text)
        if not answer:
            self.count("memma_answer_empty")
        data["phase"] = "done"
        self.support = f"evidence:\n{self._evidence(data['evidence'])}\nmemory's proposed answer: {answer or '(none)'}"
        if data["origin"] == "tool":
            self._finish_tool(ToolResult(content=self.support))

    def _start_tool(self, call: ToolCall, step: int) -> ToolResult | Job:
        query = call.arguments.get("query", call.arguments.get("intent"))
        if call.name != "memory" or not isinstance(query, str) or not query.strip():
            self.count("memma_tool_errors")
            return ToolResult(content="", error="memory needs a non-empty query")
        self._flush(session=False)
        return self._new_job("query", question=query.strip(), origin="tool", phase="search")

    # ---------------------------------------------------------------------------------------------------------
    # The reasoner's view

    def reasoner_messages(self, system_prompt: str) -> list[Message]:
        """System prompt, then the task, recent raw turns, the last memory result, and the question in QA mode."""
        parts = [f"task: {self.task}"]
        if self.start_observation:
            parts.append(f"start: {self.start_observation}")
        if self.config.recent_turns > 0 and self.recent:
            parts.append("recent steps:\n" + self._turns_text(self.recent[-self.config.recent_turns :]))
        if self.support:
            parts.append(("memory:\n" if self.question is not None else "last memory result:\n") + self.support)
        parts += [f"memory: {n}" for n in self._transient]
        if self.question is not None:
            parts.append(f"question: {self.question}")
        return [
            self._system_message(system_prompt, MEMMA_REASONER_SYSTEM),
            Message(role="user", content="\n".join(parts)),
        ]
