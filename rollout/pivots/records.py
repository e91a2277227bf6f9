"""The records of labelled rollouts and pivots: every model call of a run in order, the memory-step index, alternatives
and pivot records (JSON-ready, durable and shareable).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from memrl.data.schemas import EnvSpec, FiniteFloat, JsonDict, Record, TokenUsage
from memrl.rollout.engines.base import (
    Completion,
    GenerationResult,
    Usage,
)
from memrl.rollout.episode_calls import request_digest
from memrl.rollout.loop import PendingCall

__all__ = [
    "DECISION_ROLE",
    "EDIT_ROLE",
    "Alternative",
    "LabelledRollout",
    "LabelledStep",
    "PivotRecord",
    "RecordedCall",
]


DECISION_ROLE = "intervene"


EDIT_ROLE = "bank_edit"


class RecordedCall(Record):
    """One model call of a labelled rollout, as the engine answered it (enough to replay it exactly)."""

    kind: Literal["memory", "reasoner"]
    role: str
    step: int = Field(ge=0)
    text: str
    response_ids: list[int] = []
    logprobs: list[FiniteFloat] = []
    finish_reason: str = "stop"
    prompt_ids: list[int] = []
    prompt_tokens: int = Field(0, ge=0)
    completion_tokens: int = Field(0, ge=0)
    cached_prompt_tokens: int = Field(0, ge=0)
    engine: str = ""
    policy_version: int = 0
    request: str = ""  # digest of the request (kind, role, messages): a replay must ask exactly this ("": unchecked)

    @classmethod
    def from_result(cls, call: PendingCall, result: GenerationResult, step: int, keep_prompt_ids: bool) -> RecordedCall:
        """Record sample 0 of ``result`` (rollouts take one sample per call)."""
        completion = result.completions[0]
        return cls(
            kind=call.kind,
            role=call.role,
            step=step,
            text=completion.text,
            response_ids=list(completion.response_ids),
            logprobs=list(completion.logprobs),
            finish_reason=completion.finish_reason,
            prompt_ids=list(result.prompt_ids) if keep_prompt_ids or call.kind == "memory" else [],
            prompt_tokens=result.usage.prompt_tokens,
            completion_tokens=result.usage.completion_tokens,
            cached_prompt_tokens=result.usage.cached_prompt_tokens,
            engine=result.engine,
            policy_version=result.policy_version,
            request=request_digest(call.kind, call.role, list(call.request.messages or [])),
        )

    def as_result(self) -> GenerationResult:
        """The engine answer this record replays."""
        return GenerationResult(
            prompt_ids=list(self.prompt_ids),
            completions=[Completion(list(self.response_ids), list(self.logprobs), self.text, self.finish_reason)],
            usage=Usage(
                prompt_tokens=self.prompt_tokens,
                completion_tokens=self.completion_tokens,
                cached_prompt_tokens=self.cached_prompt_tokens,
            ),
            engine=self.engine,
            policy_version=self.policy_version,
        )


class LabelledStep(Record):
    """One memory step of a labelled rollout: where its calls sit in the record and what happened there."""

    step: int = Field(ge=0)
    phase1_index: int | None = None  # index of the step's Phase 1 call in LabelledRollout.calls
    phase2_index: int  # index of the step's Phase 2 (decision) call
    decision: str  # the recorded Phase 2 output
    reminder: str | None = None
    filters: list[str] = []  # pre-filters that fired (empty: not a candidate)
    planted: JsonDict | None = None  # the task's ground-truth pivot at this point, if the task knows it


class LabelledRollout(Record):
    """One offline labelled rollout: the task spec, the memory configuration, every call in order, the steps, and the
    environment's observations (what a replay must reproduce, step by step)."""

    record_id: str = Field(min_length=1)
    task_id: str
    env: EnvSpec | None = None  # None: a task without a spec (a Gym-style environment), rebuilt from the run's tasks
    seed: int
    rollout_id: str
    memory: JsonDict  # the resolved ProactiveConfig
    reasoner: JsonDict = {}  # the action agent's RoleSampling
    policy_version: int = 0
    calls: list[RecordedCall]
    steps: list[LabelledStep]
    outcome: FiniteFloat
    reasoner_usage: TokenUsage = TokenUsage()
    stats: dict[str, int] = {}
    observations: list[str] = []  # the environment's observation after each action, in order ([]: unchecked)


class Alternative(Record):
    """One counterfactual Phase 2 decision at a candidate step and the outcome of its continuation."""

    source: Literal["recorded", "silence", "policy", "bank"]
    text: str
    reminder: str | None = None  # what reaches the action agent (a citation restated; None: silence)
    outcome: FiniteFloat


class PivotRecord(Record):
    """A candidate step with its label: the pivot dataset (negatives included)."""

    pivot_id: str = Field(min_length=1)
    record_id: str
    task_id: str
    step: int = Field(ge=0)
    phase1_index: int | None = None
    phase2_index: int
    filters: list[str] = []
    alternatives: list[Alternative]
    spread: FiniteFloat  # max - min outcome over the alternatives
    is_pivot: bool
    best_reminder: str | None = None  # the decision of the best alternative (None: silence)
    planted: JsonDict | None = None
    policy_version: int = 0
