"""Core data types (docs/architecture.md#core-data-types): episodes, memory calls, memory-call trees and training
groups.

Token-in / token-out: a :class:`MemoryCall` keeps the engine's exact prompt ids, response ids and per-token log-probs
plus the policy version that produced them; training rows are built from these ids, never by re-tokenising text.
Every type round-trips losslessly through JSONL (:mod:`memrl.data.io`) and ``datasets`` Arrow.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializationInfo,
    ValidationInfo,
    WrapSerializer,
    field_validator,
    model_validator,
)

__all__ = [
    "EnvSpec",
    "Episode",
    "EpisodeTrace",
    "Group",
    "GroupSample",
    "JsonDict",
    "MemoryCall",
    "MemoryCallTree",
    "Message",
    "QAPair",
    "Record",
    "SFTExample",
    "ScriptedPolicy",
    "TokenUsage",
    "TraceEvent",
    "TreeNode",
    "Turn",
    "episode_won",
    "turn_steps",
]


def _json_blob_in(value: Any) -> Any:
    """Accept a JSON string (how Arrow stores free-form dicts) as well as a dict."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a JSON object: {exc.msg}") from None
    return value


def _json_blob_out(value: Any, handler: Any, info: SerializationInfo) -> Any:
    if info.context and info.context.get("arrow"):
        return json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)
    return handler(value)


JsonDict = Annotated[dict[str, Any], BeforeValidator(_json_blob_in), WrapSerializer(_json_blob_out, when_used="always")]
"""A free-form JSON object (metadata, extras). Stored as a JSON string column in Arrow, as an object in JSONL."""

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class Record(BaseModel):
    """Base of every persisted type: unknown fields are rejected, floats must be finite."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=(), ser_json_inf_nan="strings")


# ----------------------------------------------------------------------------------------------------------------
# Episodes


class Message(Record):
    """One chat message."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str


class Turn(Record):
    """One step of a trajectory, in AMA-Bench's shape."""

    turn_idx: int = Field(ge=0)
    action: str
    observation: str


def turn_steps(turns: list[Turn]) -> list[int]:
    """The memory step of each trajectory turn, in trajectory order: its ``turn_idx``, or one past the turn before
    it where the index does not increase (AMA-Bench turns without a ``turn_idx`` all read 0). Equal to the
    ``turn_idx`` wherever the indices increase; always distinct, since memory systems key turns by step."""
    steps: list[int] = []
    for turn in turns:
        steps.append(turn.turn_idx if not steps else max(turn.turn_idx, steps[-1] + 1))
    return steps


class QAPair(Record):
    """A question about an episode with its gold answer, capability type and the turns that hold the evidence."""

    question: str
    answer: str
    type: str = Field(min_length=1, description="A recall, B causal inference, C state updating, D abstraction, ...")
    needle_turns: list[int] = []
    qa_id: str | None = None
    metadata: JsonDict = {}


class EnvSpec(Record):
    """How to rebuild an executable environment: a registered name, its difficulty parameters and a seed."""

    name: str = Field(min_length=1)
    seed: int
    params: JsonDict = {}


class Episode(Record):
    """A task: AMA-Bench's fields plus our extras (environment spec, verifier, horizon)."""

    episode_id: str = Field(min_length=1)
    task: str
    task_type: str = ""
    domain: str = ""
    unnumbered_turns: list[int] = Field(
        default=[],
        description="positions of the turns their source gave no turn_idx (listed before ``trajectory``, whose check "
        "reads it): they read 0, as AMA-Bench's official loader reads them, keep their place by position and are "
        "exempt from the increasing-turn_idx check",
    )
    trajectory: list[Turn] = []
    qa_pairs: list[QAPair] = []
    env: EnvSpec | None = None
    horizon_tokens: int | None = None
    metadata: JsonDict = {}

    @field_validator("trajectory")
    @classmethod
    def _turns_in_order(cls, turns: list[Turn], info: ValidationInfo) -> list[Turn]:
        unnumbered = set(info.data.get("unnumbered_turns", []))
        for position in sorted(unnumbered):
            if not 0 <= position < len(turns):
                raise ValueError(f"unnumbered_turns names position {position}, past the {len(turns)}-turn trajectory")
            if turns[position].turn_idx != 0:
                raise ValueError(
                    f"turn {position} is listed in unnumbered_turns but has turn_idx "
                    f"{turns[position].turn_idx} (a turn without one reads 0)"
                )
        numbered = [t.turn_idx for i, t in enumerate(turns) if i not in unnumbered]
        for before, after in itertools.pairwise(numbered):
            if after <= before:
                raise ValueError(f"turn_idx must increase, got {before} then {after}")
        return turns


# ----------------------------------------------------------------------------------------------------------------
# Memory calls and trees


class MemoryCall(Record):
    """One call of the memory model, token-in / token-out.

    ``logprobs[i]`` is the sampling engine's log-probability of ``response_ids[i]`` (empty for engines without
    log-probs, e.g. scripted experts). ``policy_version`` is the trainer version whose weights produced the call.
    """

    call_id: str = Field(min_length=1)
    role: str = Field(min_length=1, description="consolidate, recall, bank_edit, intervene, ...")
    messages: list[Message] = []
    prompt_ids: list[int] = []
    response_ids: list[int] = []
    logprobs: list[FiniteFloat] = []
    text: str = ""
    finish_reason: str = "stop"
    policy_version: int = 0
    engine: str = ""
    step: int = 0
    prompt_tokens: int = Field(0, ge=0)
    completion_tokens: int = Field(0, ge=0)
    error: str | None = None
    metadata: JsonDict = {}

    @model_validator(mode="after")
    def _consistent_tokens(self) -> MemoryCall:
        if self.logprobs and len(self.logprobs) != len(self.response_ids):
            raise ValueError(f"logprobs has {len(self.logprobs)} entries but response_ids has {len(self.response_ids)}")
        return self


class TokenUsage(Record):
    """Token accounting of a model: prompt tokens (of which ``cached_prompt_tokens`` came from a prefix cache) and
    generated tokens, over ``calls`` calls."""

    prompt_tokens: int = Field(0, ge=0)
    cached_prompt_tokens: int = Field(0, ge=0)
    completion_tokens: int = Field(0, ge=0)
    calls: int = Field(0, ge=0)

    @property
    def spent(self) -> int:
        """Tokens that cost compute: prefill not served from cache plus generated tokens."""
        return self.prompt_tokens - self.cached_prompt_tokens + self.completion_tokens

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens + other.cached_prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            calls=self.calls + other.calls,
        )

    def __sub__(self, other: TokenUsage) -> TokenUsage:
        """What was spent between ``other`` and ``self`` (a fork's usage minus the usage at its branch point)."""
        return TokenUsage(
            prompt_tokens=self.prompt_tokens - other.prompt_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens - other.cached_prompt_tokens,
            completion_tokens=self.completion_tokens - other.completion_tokens,
            calls=self.calls - other.calls,
        )


class TreeNode(Record):
    """A node of a memory-call tree: a memory call (or the root / a leaf) and the scores filled in later."""

    node_id: str = Field(min_length=1)
    parent_id: str | None = None
    depth: int = Field(0, ge=0)
    kind: Literal["root", "memory", "leaf"] = "memory"
    call: MemoryCall | None = None
    follow_up_calls: list[MemoryCall] = []  # later model calls of the same memory action (a recall's later pages)
    children: list[str] = []
    group_id: str | None = None
    reasoner_usage: TokenUsage = TokenUsage()
    memory_usage: TokenUsage = TokenUsage()
    answer: str | None = None
    outcome: FiniteFloat | None = None
    value: FiniteFloat | None = None
    committee_score: FiniteFloat | None = None
    reward: FiniteFloat | None = None
    advantage: FiniteFloat | None = None
    metadata: JsonDict = {}


class MemoryCallTree(Record):
    """One task instance rolled out as a tree of memory calls; siblings share a parent context."""

    tree_id: str = Field(min_length=1)
    task_id: str
    root_id: str
    nodes: list[TreeNode]
    reasoner_usage: TokenUsage = TokenUsage()
    config_hash: str = ""
    metadata: JsonDict = {}

    @model_validator(mode="after")
    def _well_formed(self) -> MemoryCallTree:
        ids = [n.node_id for n in self.nodes]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise ValueError(f"duplicate node_id {dup!r}")
        by_id = {n.node_id: n for n in self.nodes}
        if self.root_id not in by_id:
            raise ValueError(f"root_id {self.root_id!r} is not a node")
        for node in self.nodes:
            if node.node_id == self.root_id:
                if node.parent_id is not None:
                    raise ValueError(f"root {node.node_id!r} has a parent")
                continue
            if node.parent_id not in by_id:
                raise ValueError(f"node {node.node_id!r}: parent {node.parent_id!r} is not a node")
            if node.node_id not in by_id[node.parent_id].children:
                raise ValueError(f"node {node.node_id!r} is missing from its parent's children")
        for node in self.nodes:
            for child in node.children:
                if child not in by_id or by_id[child].parent_id != node.node_id:
                    raise ValueError(f"node {node.node_id!r}: child {child!r} does not point back to it")
        return self

    def node(self, node_id: str) -> TreeNode:
        """The node with this id."""
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(node_id)

    def leaves_below(self, node_id: str) -> list[TreeNode]:
        """The leaves in the subtree rooted at ``node_id`` (the node itself if it is a leaf)."""
        by_id = {n.node_id: n for n in self.nodes}
        out, stack = [], [node_id]
        while stack:
            current = by_id[stack.pop()]
            if current.children:
                stack.extend(reversed(current.children))
            else:
                out.append(current)
        return out


class TraceEvent(Record):
    """One step of an agent-loop run: the reasoner's reply, how it was read, and what came back."""

    step: int = Field(ge=0)
    kind: Literal["act", "memory_tool", "answer", "error", "limit"]
    reply: str = ""
    observation: str = ""
    error: str | None = None
    reasoner_prompt_tokens: int = Field(0, ge=0)
    reasoner_cached_tokens: int = Field(0, ge=0)
    reasoner_completion_tokens: int = Field(0, ge=0)
    memory_call_ids: list[str] = []


class EpisodeTrace(Record):
    """The record of one agent-loop run (the harness and the tree builder read these)."""

    trace_id: str = Field(min_length=1)
    task_id: str
    memory_system: str
    answer: str | None = None
    outcome: FiniteFloat | None = None
    events: list[TraceEvent] = []
    memory_calls: list[MemoryCall] = []
    reasoner_usage: TokenUsage = TokenUsage()
    memory_usage: TokenUsage = TokenUsage()
    peak_context_tokens: int = Field(0, ge=0)
    stats: dict[str, int] = {}
    metadata: JsonDict = {}


def episode_won(outcome: float | None, stats: dict[str, int]) -> bool:
    """Whether an episode was won: the environment's word when it gave one (``env_won`` in the run's stats, a
    Gym-style environment's ``info["won"]``), else an outcome of 1 (a verifier's exact answer)."""
    if "env_won" in stats:
        return bool(stats["env_won"])
    return outcome is not None and outcome >= 1.0


# Roles whose empty reply is itself a decision the model learns (the end-of-sequence token): the proactive agent's
# Phase 1 answers a window that needs no bank edit with no tool call.
EMPTY_REPLY_ROLES = frozenset({"bank_edit"})


class SFTExample(Record):
    """One chat-format SFT row of a memory role: the exact messages the memory model saw, then the expert's output as
    the final assistant message (the only span the loss is taken on)."""

    row_id: str = Field(min_length=1)
    role: str = Field(min_length=1, description="consolidate, recall, bank_edit, intervene, ...")
    messages: list[Message] = Field(min_length=2)
    task_id: str = ""
    trace_id: str = ""
    metadata: JsonDict = {}

    @field_validator("messages")
    @classmethod
    def _ends_with_target(cls, messages: list[Message]) -> list[Message]:
        if messages[-1].role != "assistant":
            raise ValueError(f"the last message must be the assistant target, got role {messages[-1].role!r}")
        return messages

    @model_validator(mode="after")
    def _target_is_not_empty(self) -> SFTExample:
        if not self.messages[-1].content.strip() and self.role not in EMPTY_REPLY_ROLES:
            raise ValueError(
                f"the assistant target (the last message) of role {self.role!r} is empty: nothing to learn"
            )
        return self


# ----------------------------------------------------------------------------------------------------------------
# Training groups


class GroupSample(Record):
    """One candidate response of a group: token ids, the rollout engine's log-probs, reward and advantage."""

    response_ids: list[int]
    rollout_logprobs: list[FiniteFloat] = []
    text: str = ""
    finish_reason: str = "stop"
    policy_version: int = 0
    reward: FiniteFloat = 0.0
    advantage: FiniteFloat = 0.0
    node_id: str | None = None
    metadata: JsonDict = {}

    @model_validator(mode="after")
    def _consistent(self) -> GroupSample:
        if self.rollout_logprobs and len(self.rollout_logprobs) != len(self.response_ids):
            raise ValueError("rollout_logprobs and response_ids differ in length")
        return self


class Group(Record):
    """Siblings that share one parent context: the unit the group policy trainer consumes."""

    group_id: str = Field(min_length=1)
    task_id: str = ""
    role: str = ""
    prompt_ids: list[int]
    messages: list[Message] = []
    samples: list[GroupSample] = Field(min_length=1)
    source: Literal["oat", "flat", "pivot", "other"] = "other"
    metadata: JsonDict = {}

    @property
    def zero_variance(self) -> bool:
        """True when every sample has the same reward (the group carries no learning signal)."""
        rewards = [s.reward for s in self.samples]
        return max(rewards) - min(rewards) <= 1e-12 or len(rewards) < 2

    @property
    def reward_std(self) -> float:
        """Population standard deviation of the sample rewards."""
        rewards = [s.reward for s in self.samples]
        mean = sum(rewards) / len(rewards)
        return math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))


# ----------------------------------------------------------------------------------------------------------------
# Programmatic agents


@runtime_checkable
class ScriptedPolicy(Protocol):
    """A programmatic agent (frozen reasoner, action agent, oracle expert) behind the ``scripted`` engine.

    ``respond`` returns the text answer to ``messages``; ``rng`` is the request's seeded random generator (for
    noise knobs), ``metadata`` the request's metadata (e.g. the task id an oracle looks its ground truth up by).
    A policy that takes real time per answer (one that sleeps or calls out) sets ``answers_inline = False``: the tree
    scheduler then answers it in a thread, like a model engine, instead of at once (``Engine.answers_inline``).
    """

    name: str

    def respond(self, messages: list[Message], rng: random.Random, metadata: dict[str, Any]) -> str:
        """Return the agent's reply."""
        ...
