"""AMA-Agent ("AMA-Bench: Evaluating Long-Horizon Memory for Agentic Applications" (arXiv 2602.22769), section 5): a
causality graph of the trajectory and tool-augmented retrieval.

Construction. Every environment turn becomes a state node keyed by its turn id (the raw action and observation are
kept: objective information is never summarised away). The memory model reads the adjacent turn pair and the recent
states (``ama_graph_build``) and writes the state after the turn, the earlier turns that caused it (directed causal
edges) and the objects it involves; nodes that share an object are joined by undirected association edges (to the
last ``assoc_links`` earlier nodes with that object). Each node is embedded for similarity retrieval.

Retrieval (for a question, or the reasoner's ``retrieve(query)`` tool): the ``top_k`` nodes most similar to the query;
then the sufficiency self-check (``ama_sufficiency``) says SUFFICIENT, or INSUFFICIENT with a route: ``graph`` runs a
neighbourhood traversal over causal (both directions) and association edges up to ``traversal_depth`` hops (at most
``max_traversal_nodes`` nodes); ``keyword`` asks the memory model (``ama_keyword_script``) for a Python script over
the trajectory, run in :mod:`memrl.rollout.memory.sandbox` (time/memory limits, no network, only ``trajectory.json`` as
input), or for keywords matched in-process. The check runs again after each tool, at most ``max_tool_rounds`` tools.
The evidence (nodes in turn order with their states and causes, plus script output) goes to the reasoner, which
synthesises the answer: the memory system never answers itself.

Ablations (:class:`AMAConfig`): ``graph=False`` (w/o Causality Graph: raw turn nodes, no build calls, no edges, the
keyword route only), ``tool_retrieval=False`` (w/o Tool-Augmented Retrieval: similarity top-k only).

In an interactive task the reasoner sees the task, the last ``recent_turns`` raw turns and its last retrieval's
evidence. Question-answering mode follows :mod:`memrl.rollout.memory.workflow`: replayed turns are built into the graph
as they arrive; the question runs retrieval and the reasoner's message ends with the evidence and ``question: ...``.
Node ids are turn steps, which :func:`~memrl.rollout.memory.workflow.feed_episode` sets to AMA-Bench's ``turn_idx``.

Deviations from the paper: the start observation (step 0 of an interactive task) is context, not a node; a build
answer that names no causes links the turn to its predecessor; sandboxed scripts run synchronously inside the
rollout's memory step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from memrl.data.config import ConfigModel
from memrl.data.formats import ToolCall
from memrl.data.schemas import Message
from memrl.rollout.memory.base import MemoryRequest, RoleSampling, ToolResult, Turn, register_memory
from memrl.rollout.memory.embedders import EmbedderName, top_k
from memrl.rollout.memory.prompts_ama import (
    AMA_REASONER_SYSTEM,
    parse_ama_record,
    parse_ama_search,
    parse_ama_sufficiency,
    render_ama_build,
    render_ama_search,
    render_ama_sufficiency,
)
from memrl.rollout.memory.sandbox import SandboxConfig, run_script
from memrl.rollout.memory.workflow import EmbeddingJobQueueMemory, Inbound, Job, action_of, truncate

__all__ = ["AMAConfig", "AMAMemory", "StateNode"]


@dataclass
class StateNode:
    """A state node of the causality graph."""

    turn: int
    action: str
    observation: str
    state: str = ""
    objects: list[str] = field(default_factory=list)
    causes: list[int] = field(default_factory=list)  # directed edges cause -> this node
    effects: list[int] = field(default_factory=list)  # directed edges this node -> effect
    associations: list[int] = field(default_factory=list)  # undirected edges


class AMAConfig(ConfigModel):
    """AMA-Agent's switches (the paper's ablations), retrieval limits and sandbox limits."""

    name: Literal["ama_agent"] = "ama_agent"  # selects this memory system
    graph: bool = True  # build the causality graph; false: w/o Causality Graph
    tool_retrieval: bool = True  # sufficiency check + tools; false: similarity top-k only
    top_k: int = 5  # nodes retrieved by similarity per query
    traversal_depth: int = 2  # hops of the graph-neighbourhood traversal
    max_traversal_nodes: int = 12  # nodes one traversal adds at most
    max_tool_rounds: int = 2  # tool calls per retrieval at most
    assoc_links: int = 3  # association edges to the last N nodes sharing an object
    context_states: int = 4  # recent states shown to the graph builder
    keyword_hits: int = 8  # turns one keyword search returns at most
    allow_scripts: bool = True  # the keyword route may run model-written scripts (sandboxed)
    script_output_chars: int = 2000  # script output cut to this length
    recent_turns: int = 4  # raw recent turns shown to the reasoner
    observation_chars: int = 400  # observations cut to this length in prompts (0: whole)
    embedder: EmbedderName = "minilm"  # minilm (all-MiniLM-L6-v2) or hashing (bag of words, no model)
    sandbox: SandboxConfig = SandboxConfig()
    sampling: dict[str, RoleSampling] = {
        "ama_graph_build": RoleSampling(temperature=0.0, max_tokens=192),
        "ama_sufficiency": RoleSampling(temperature=0.0, max_tokens=96),
        "ama_keyword_script": RoleSampling(temperature=0.0, max_tokens=512),
    }


@register_memory("ama_agent", config=AMAConfig)
class AMAMemory(EmbeddingJobQueueMemory):
    """AMA-Agent behind the memory-system interface (see the module docstring)."""

    name = "ama"
    tools = ("retrieve",)

    config: AMAConfig
    config_model = AMAConfig

    def _clear(self) -> None:
        super()._clear()
        self.nodes: dict[int, StateNode] = {}
        self._vectors: dict[int, np.ndarray] = {}
        self._objects: dict[str, list[int]] = {}
        self.recent: list[int] = []
        self.support = ""

    # ---------------------------------------------------------------------------------------------------------
    # The causality graph

    def _raw(self, node: StateNode) -> str:
        return f"{node.action or '(start)'} -> {truncate(node.observation, self.config.observation_chars)}"

    def _embed(self, node: StateNode) -> None:
        text = f"{node.action} -> {node.observation}" + (f" | {node.state}" if node.state else "")
        self._vectors[node.turn] = self.embedder.embed([text])[0]

    def link(self, turn: int, state: str, causes: list[int], objects: list[str]) -> None:
        """Record a built node: its state, causal edges from ``causes`` and association edges via ``objects``."""
        node = self.nodes[turn]
        node.state = state
        for cause in sorted(set(causes)):
            if cause in self.nodes and cause < turn and cause not in node.causes:
                node.causes.append(cause)
                self.nodes[cause].effects.append(turn)
        node.objects = list(dict.fromkeys(objects))
        for obj in node.objects:
            earlier = self._objects.setdefault(obj, [])
            for other in earlier[-self.config.assoc_links :] if self.config.assoc_links > 0 else []:
                if other not in node.associations:
                    node.associations.append(other)
                    self.nodes[other].associations.append(turn)
            earlier.append(turn)
        self._embed(node)

    def similar(self, query: str, k: int) -> list[int]:
        """The ``k`` embedded nodes most similar to ``query`` (turn ids, best first)."""
        turns = [t for t in self.nodes if t in self._vectors]
        if not turns:
            return []
        matrix = np.stack([self._vectors[t] for t in turns])
        return [turns[row] for row, _ in top_k(matrix, self.embedder.embed([query])[0], k)]

    def neighbourhood(self, seeds: list[int], depth: int, limit: int) -> list[int]:
        """Nodes within ``depth`` hops of ``seeds`` over causal (both directions) and association edges, nearest
        first, at most ``limit`` beyond the seeds."""
        seen = set(seeds)
        frontier = list(seeds)
        found: list[int] = []
        for _ in range(depth):
            layer: list[int] = []
            for turn in frontier:
                node = self.nodes[turn]
                for other in sorted(set(node.causes) | set(node.effects) | set(node.associations)):
                    if other not in seen:
                        seen.add(other)
                        layer.append(other)
            layer.sort()
            found += layer[: max(limit - len(found), 0)]
            if len(found) >= limit:
                break
            frontier = layer
        return found

    def trajectory(self) -> list[dict[str, Any]]:
        """The raw trajectory so far, in AMA-Bench's turn shape (the sandbox's only input)."""
        return [
            {"turn_idx": t, "action": n.action, "observation": n.observation} for t, n in sorted(self.nodes.items())
        ]

    def _evidence_text(self, turns: list[int], extra: list[str]) -> str:
        lines = []
        for turn in sorted(set(turns)):
            node = self.nodes[turn]
            line = f"[turn {turn}] {self._raw(node)}"
            if node.state:
                line += f" | state: {node.state}"
            if node.causes:
                line += f" | caused by: {', '.join(str(c) for c in node.causes)}"
            lines.append(line)
        lines += extra
        return "\n".join(lines) if lines else "(nothing found)"

    # ---------------------------------------------------------------------------------------------------------
    # Turns and jobs

    def _on_question(self, turn: Turn) -> None:
        self._enqueue(self._new_job("retrieve", query=turn.observation, origin="question", phase="search"))

    def _ingest(self, item: Inbound) -> None:
        turn = item.turn
        if turn.step in self.nodes:
            self.count("ama_duplicate_turn")
            return
        node = StateNode(turn.step, action_of(turn.action_text), turn.observation)
        previous = max(self.nodes) if self.nodes else None
        self.nodes[node.turn] = node
        self.recent = [*self.recent, node.turn][-max(self.config.recent_turns, 1) :]
        if self.config.graph:
            self._enqueue(self._new_job("build", turn=node.turn, previous=previous, phase="build"))
        else:
            self._embed(node)

    def _request(self, job: Job) -> MemoryRequest | None:
        if job.kind == "build":
            if job.data["phase"] == "done":
                return None
            node = self.nodes[job.data["turn"]]
            prev = self.nodes.get(job.data["previous"]) if job.data["previous"] is not None else None
            previous = f"{prev.turn}: {self._raw(prev)}" if prev else "(none)"
            built = [t for t in sorted(self.nodes) if t < node.turn and self.nodes[t].state]
            states = "\n".join(f"[turn {t}] {self.nodes[t].state}" for t in built[-self.config.context_states :])
            messages = render_ama_build(self.task, previous, f"{node.turn}: {self._raw(node)}", states or "(none)")
            return self._call(job, "ama_graph_build", messages, turn=node.turn)
        return self._retrieve_request(job)

    def _consume(self, job: Job, text: str) -> None:
        if job.kind == "build":
            state, causes, objects, readable = parse_ama_record(text)
            if not readable:
                self.count("ama_build_unparsed")
            if causes is None:
                causes = [job.data["previous"]] if job.data["previous"] is not None else []
            self.link(job.data["turn"], state, causes, objects)
            job.data["phase"] = "done"
            return
        self._retrieve_consume(job, text)

    # retrieval: search -> (check -> graph | keyword)* -> done
    def _retrieve_request(self, job: Job) -> MemoryRequest | None:
        data = job.data
        while True:
            phase = data["phase"]
            if phase == "search":
                data.update(
                    turns=self.similar(data["query"], self.config.top_k),
                    extra=[],
                    rounds=0,
                    phase="check" if self.config.tool_retrieval else "done",
                )
                continue
            if phase == "check":
                if data["rounds"] >= self.config.max_tool_rounds:
                    data["phase"] = "done"
                    continue
                evidence = self._evidence_text(data["turns"], data["extra"])
                return self._call(job, "ama_sufficiency", render_ama_sufficiency(data["query"], evidence))
            if phase == "graph":
                added = self.neighbourhood(data["turns"], self.config.traversal_depth, self.config.max_traversal_nodes)
                data["turns"] = data["turns"] + added
                self.count("ama_graph_traversals")
                data.update(rounds=data["rounds"] + 1, phase="check")
                continue
            if phase == "keyword":
                example = json.dumps(self.trajectory()[0], ensure_ascii=False) if self.nodes else "{}"
                messages = render_ama_search(data["query"], data["missing"], truncate(example, 300))
                return self._call(job, "ama_keyword_script", messages)
            if phase == "done":
                self.support = f"evidence:\n{self._evidence_text(data['turns'], data['extra'])}"
                data["phase"] = "finished"
                if data["origin"] == "tool":
                    self._finish_tool(ToolResult(content=self.support))
            return None

    def _retrieve_consume(self, job: Job, text: str) -> None:
        data = job.data
        if data["phase"] == "check":
            sufficient, route, missing = parse_ama_sufficiency(text)
            if sufficient is None:
                self.count("ama_sufficiency_unparsed")
                sufficient = True
            if sufficient:
                data["phase"] = "done"
                return
            if route is None or (route == "graph" and not self.config.graph):
                route = "graph" if self.config.graph else "keyword"
            data.update(phase=route, missing=missing or data["query"])
            return
        kind, payload = parse_ama_search(text)
        if kind == "script" and not self.config.allow_scripts:
            kind = None
        if kind == "script":
            self._run_script(data, str(payload))
        elif kind == "keywords":
            hits = self.keyword_hits(list(payload))
            data["turns"] = data["turns"] + [t for t in hits if t not in data["turns"]]
            self.count("ama_keyword_searches")
        else:
            self.count("ama_search_unparsed")
        data.update(rounds=data["rounds"] + 1, phase="check")

    def keyword_hits(self, keywords: list[str]) -> list[int]:
        """Turns whose action, observation or state contains any keyword (case-insensitive), in turn order."""
        words = [w.lower() for w in keywords if w.strip()]
        hits = [
            t
            for t, n in sorted(self.nodes.items())
            if any(w in f"{n.action}\n{n.observation}\n{n.state}".lower() for w in words)
        ]
        return hits[: self.config.keyword_hits]

    def _run_script(self, data: dict[str, Any], code: str) -> None:
        result = run_script(code, self.trajectory(), self.config.sandbox)
        self.count(f"ama_script_{result.status}")
        if result.ok:
            output = truncate(result.stdout.strip(), self.config.script_output_chars) or "(no output)"
            data["extra"] = [*data["extra"], f"script output:\n{output}"]
        else:
            data["extra"] = [*data["extra"], f"script stopped ({result.status}): {truncate(result.detail, 200)}"]

    def _start_tool(self, call: ToolCall, step: int) -> ToolResult | Job:
        query = call.arguments.get("query", call.arguments.get("intent"))
        if call.name != "retrieve" or not isinstance(query, str) or not query.strip():
            self.count("ama_tool_errors")
            return ToolResult(content="", error="retrieve needs a non-empty query")
        return self._new_job("retrieve", query=query.strip(), origin="tool", phase="search")

    # ---------------------------------------------------------------------------------------------------------
    # The reasoner's view

    def reasoner_messages(self, system_prompt: str) -> list[Message]:
        """System prompt, then the task, recent raw turns, the last retrieval's evidence, and the question."""
        parts = [f"task: {self.task}"]
        if self.start_observation:
            parts.append(f"start: {self.start_observation}")
        if self.config.recent_turns > 0 and self.recent:
            lines = [f"[turn {t}] {self._raw(self.nodes[t])}" for t in self.recent[-self.config.recent_turns :]]
            parts.append("recent steps:\n" + "\n".join(lines))
        if self.support:
            parts.append(("memory " if self.question is not None else "last retrieval ") + self.support)
        parts += [f"memory: {n}" for n in self._transient]
        if self.question is not None:
            parts.append(f"question: {self.question}")
        return [
            self._system_message(system_prompt, AMA_REASONER_SYSTEM),
            Message(role="user", content="\n".join(parts)),
        ]
