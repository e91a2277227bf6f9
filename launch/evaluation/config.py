"""The ``memrl eval`` config: datasets, memory systems and memory models, and the engines around them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from memrl.data.config import ConfigModel, RunConfig
from memrl.data.tasks import TaskSetConfig
from memrl.rollout.engines.config import EngineConfig
from memrl.rollout.evaluation.reader import ReaderConfig
from memrl.rollout.memory.registry import MemoryConfig

__all__ = ["QA_KINDS", "TASK_SYSTEMS", "DatasetSpec", "EvalConfig", "ModelSpec", "SystemSpec"]


QA_KINDS = ("ama_synthetic", "amabench", "locomo", "memoryarena", "generic")
TASK_SYSTEMS = {"sam": ("sam", "long_context", "bm25", "embedding"), "proactive": ("proactive",), "tasks": ()}
"""Task dataset kinds and the memory systems they run (``tasks``: whatever its family runs, see ``incompatible``)."""


class DatasetSpec(ConfigModel):
    """One dataset: synthetic AMA-format episodes, a file in a public format, or a family of interactive tasks."""

    name: str = Field(min_length=1)  # label of the dataset in results
    kind: Literal["ama_synthetic", "amabench", "locomo", "memoryarena", "generic", "sam", "proactive", "tasks"] = Field(
        description="synthetic AMA episodes, a file in a public format (path), a built-in task family (sam, "
        "proactive), or tasks of any registered family (tasks, e.g. a Gym env by entry)"
    )
    path: str | None = None  # the file of amabench / locomo / memoryarena / generic
    envs: list[str] = ["textworld"]  # ama_synthetic: environments
    target_tokens: list[int] = [1000]  # ama_synthetic: trajectory lengths (the horizon breakdown)
    episodes_per_setting: int = Field(2, ge=1)  # ama_synthetic: episodes per env and target length
    per_type: int = Field(2, ge=1, description="ama_synthetic: questions per type A-D")
    noise: float = Field(0.1, ge=0, le=1)  # ama_synthetic: action noise of the trajectory policy
    env_params: dict[str, Any] = {}  # ama_synthetic: environment parameters
    seed: int = 0  # seed of the first synthetic episode (or default task set)
    tasks: TaskSetConfig | None = None  # sam / proactive / tasks: the task set (sam, proactive: default the family's)
    reasoner: EngineConfig | None = None  # tasks: the frozen reasoner (default: the family's registered scripted one)
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
        if self.kind == "tasks" and self.tasks is None:
            raise ValueError("dataset kind 'tasks' needs 'tasks' (the task set: family or entry, count, seed)")
        if self.reasoner is not None and self.kind != "tasks":
            raise ValueError("'reasoner' applies to a dataset of kind 'tasks' (the built-in families use their own)")
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
    # the reasoner must answer with a tool call, e.g. <tool_call>{"name": "answer", "arguments": {"answer": "..."}}
    # </tool_call>; true: a question it never answered so takes its first plain-text reply as the answer
    free_text_answers: bool = False

    @model_validator(mode="after")
    def _unique(self) -> EvalConfig:
        for what, names in (
            ("dataset", [d.name for d in self.datasets]),
            ("system", [s.name for s in self.systems]),
            ("model", [m.name for m in self.models]),
        ):
            dup = {n for n in names if names.count(n) > 1}
            if dup:
                raise ValueError(f"{what} names must be unique, repeated: {sorted(dup)}")
        return self
