"""Small fakes shared by the tests: a counting task, a two-call memory tool, scripted engines for the loop and tree
tests, and :class:`RecordingEngine`, the one engine of the memory-system tests."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.data.formats import ToolCall, render_tool_call
from memrl.data.schemas import Episode, MemoryCall, MemoryCallTree, Message, QAPair, TreeNode
from memrl.data.schemas import Turn as TrajectoryTurn
from memrl.data.tasks.common import content_of
from memrl.rollout.engines.base import Completion, Engine, GenerationRequest, GenerationResult, Usage
from memrl.rollout.engines.scripted import ScriptedEngine
from memrl.rollout.memory.base import MemoryRequest, MemorySystem, RoleSampling, ToolResult, Turn

# GroupTrainerConfig fields of one optimizer step per batch: the trainer's default before issue 39 (now 2 x 2), for the
# tests of one step's update mechanics
ONE_STEP = {"update_epochs": 1, "optimizer_steps_per_epoch": 1}


class TextEnv:
    """An environment of fixed text: ``first`` at reset, ``observe(n, action)`` after the n-th step (never done); the
    episode succeeds when the answer is ``answer``."""

    def __init__(
        self, task_id: str, task: str, first: str, observe: Callable[[int, str], str], answer: str, max_steps: int = 8
    ) -> None:
        self.task_id, self.task, self.max_steps = task_id, task, max_steps
        self.first, self.observe, self.answer, self.steps = first, observe, answer, 0

    def reset(self) -> str:
        return self.first

    def step(self, action: str) -> tuple[str, bool]:
        self.steps += 1
        return self.observe(self.steps, action), False

    def finish(self, answer: str | None) -> float:
        return float(answer == self.answer)


class CountEnv:
    """Say `act(tick)` until the counter reaches 3, then answer with the number of recalls seen."""

    def __init__(self, task_id: str) -> None:
        self.task_id, self.task, self.max_steps = task_id, "tick three times, then recall, then answer", 10
        self.ticks = 0

    def reset(self) -> str:
        return "start"

    def step(self, action: str) -> tuple[str, bool]:
        self.ticks += action == "tick"
        return f"ticks={self.ticks}", False

    def finish(self, answer: str | None) -> float:
        return float(answer == "ok")


class TwoCallMemory(MemorySystem):
    """Keeps every turn; its `memory` tool needs two sequential memory-model calls."""

    name = "two-call"
    tools = ("memory",)

    def reset(self, task: str, metadata: dict[str, Any]) -> None:
        self.task, self.turns, self.queue, self.result, self.parts = task, [], [], None, []

    def on_turn(self, turn: Turn) -> None:
        self.turns.append(turn)

    def reasoner_messages(self, system_prompt: str) -> list[Message]:
        body = "\n".join(t.observation for t in self.turns)
        return [Message(role="system", content=system_prompt), Message(role="user", content=body)]

    def next_memory_request(self) -> MemoryRequest | None:
        if not self.queue:
            return None
        return MemoryRequest(
            role="recall", messages=[Message(role="user", content=self.queue[0])], sampling=RoleSampling()
        )

    def on_memory_result(self, request: MemoryRequest, call: MemoryCall) -> None:
        self.queue.pop(0)
        self.parts.append(call.text)
        if not self.queue:
            self.result = ToolResult(content="+".join(self.parts))

    def on_tool_call(self, call: ToolCall, step: int) -> None:
        self.queue, self.parts = ["part a", "part b"], []

    def tool_result(self) -> ToolResult | None:
        result, self.result = self.result, None
        return result


class FakeEngine(Engine):
    """Reasoner: tick until ticks=3, then call memory, then answer. Memory: echo the request with a sample tag."""

    def __init__(self, name: str, good_marker: str | None = None) -> None:
        self.name, self.calls, self.batch_sizes, self.good_marker = name, 0, [], good_marker

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        self.calls += 1
        self.batch_sizes.append(len(requests))
        out = []
        for req in requests:
            text_in = req.messages[-1].content
            completions = []
            for k in range(req.sampling.n):
                if self.name == "memory":
                    text = f"{text_in}#{k}"
                elif "recalled:" in text_in:
                    good = self.good_marker is None or self.good_marker in text_in
                    text = render_tool_call("answer", {"answer": "ok" if good else "bad"})
                elif "ticks=3" in text_in:
                    text = render_tool_call("memory", {"intent": "x"})
                else:
                    text = render_tool_call("act", {"action": "tick"})
                completions.append(
                    Completion(response_ids=[1, 2 + k], logprobs=[-0.5, -0.25], text=text, finish_reason="stop")
                )
            out.append(
                GenerationResult(
                    prompt_ids=[7, 8, 9], completions=completions, usage=Usage(3, 2 * req.sampling.n), engine=self.name
                )
            )
        return out


class RecallAwareMemory(TwoCallMemory):
    def on_turn(self, turn: Turn) -> None:
        if turn.role == "user" and turn.step > 0:
            turn = Turn(step=turn.step, action_text=turn.action_text, observation="recalled: " + turn.observation)
        super().on_turn(turn)


Reply = Callable[[str, dict[str, Any]], str]
"""A reply function: (the request's last message text, its metadata: ``role``, ``phase``, ...) -> the reply text."""


class _ReplyPolicy:
    """A scripted policy from a :data:`Reply` function."""

    def __init__(self, reply: Reply, name: str) -> None:
        self.reply, self.name = reply, name

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        return self.reply(content_of(messages[-1]), metadata)


def _fixed_reply(text: str) -> Reply:
    return lambda last, metadata: text


def by_role(memory_replies: dict[str, str], reasoner: Callable[[str], str]) -> Reply:
    """A :data:`Reply` that plays both engines: the memory model answers ``memory_replies[role]``, the reasoner
    ``reasoner(last message)``."""

    def reply(last: str, metadata: dict[str, Any]) -> str:
        role = metadata["role"]
        return memory_replies[role] if role in memory_replies else reasoner(last)

    return reply


class RecordingEngine(ScriptedEngine):
    """The tests' recording engine: a :class:`ScriptedEngine` (token ids and usage when given a ``tokenizer``)
    answering with ``reply``: a scripted policy (``respond(messages, rng, metadata)``), a :data:`Reply` function or a
    fixed text.
    It keeps every request it answered, the last message of each (``prompts``), every result it gave and how many
    batches it was called with (``calls``)."""

    def __init__(self, reply: Any, name: str | None = None, **kwargs: Any) -> None:
        if isinstance(reply, str):  # a fixed text
            reply = _fixed_reply(reply)
        policy = reply if hasattr(reply, "respond") else _ReplyPolicy(reply, name or "reply")
        super().__init__(policy, name=name, **kwargs)
        self.requests: list[GenerationRequest] = []
        self.prompts: list[str] = []
        self.results: list[GenerationResult] = []
        self.calls = 0  # generate() calls: batches, not requests

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        self.calls += 1
        results = super().generate(requests)
        self.requests += requests
        self.prompts += [content_of(r.messages[-1]) for r in requests]
        self.results += results
        return results


DOOR_CODE_TURNS = [
    {"turn_idx": 0, "action": "look", "observation": "a hall with a locked door"},
    {"turn_idx": 1, "action": "read the note", "observation": "the note says the door code is 4172"},
    *({"turn_idx": i, "action": f"walk {i}", "observation": f"corridor {i}"} for i in range(2, 8)),
]
"""A recorded trajectory whose one fact (the door code, 4172) is at turn 1, followed by six turns of noise."""


@dataclass(frozen=True)
class QACase:
    """A memory system answering a question about a trajectory it was fed, in the evaluation harness's
    question-answering mode (:func:`memrl.rollout.evaluation.qa.run_qa`), with :class:`RecordingEngine` s on ``script``
    as reasoner and memory model: what the answer, the memory-model calls and the reasoner's last prompt must be."""

    memory: dict[str, Any]  # the system's config (its name and settings); the harness builds the system from it
    script: Any  # a Reply function or a scripted policy (respond(messages, rng, metadata)); plays both engines
    task: str
    turns: list[dict[str, Any]]
    question: str
    answer: str
    roles: list[str]  # the memory-model calls, in order
    prompt_has: tuple[str, ...] = ()  # also in the reasoner's last prompt

    def episode(self) -> Episode:
        """The recorded episode: the trajectory and the one question."""
        return Episode(
            episode_id="qa-case",
            task=self.task,
            trajectory=[TrajectoryTurn.model_validate(t) for t in self.turns],
            qa_pairs=[QAPair(question=self.question, answer=self.answer, type="A")],
        )


def random_lora(model_dir: Path, out: Path, targets: list[str], *, std: float, rank: int = 8, seed: int = 0) -> Path:
    """A PEFT LoRA adapter (alpha = 2 x rank) on ``model_dir`` saved in ``out``, with random A and B ~ N(0, std): a
    fresh LoRA's B is zero, this one changes the model's outputs."""
    import torch
    from peft import LoraConfig, get_peft_model

    from memrl.rollout.models import load_causal_lm

    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, init_lora_weights=False)
    peft_model = get_peft_model(load_causal_lm(model_dir, dtype="float32"), config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, std)
    peft_model.save_pretrained(out)
    return out


def sibling_group_tree(
    task_id: str,
    outcomes: list[list[float]],
    calls: Callable[[str, int], tuple[MemoryCall, list[MemoryCall]]],
    *,
    merge: bool,
) -> MemoryCallTree:
    """root -> one sibling group of memory nodes ``r.k:1``, node k with the call and follow-up calls
    ``calls(node_id, k)`` and one leaf per outcome in ``outcomes[k]`` below it (``merge``: identical siblings merged,
    as the tree builder does)."""
    from memrl.rollout.tree import merge_identical_siblings

    nodes = {"root": TreeNode(node_id="root", kind="root")}
    for k, leaf_outcomes in enumerate(outcomes):
        sid = f"r.{k}:1"
        nodes["root"].children.append(sid)
        call, follow = calls(sid, k)
        leaves = [f"r.{k}.{j}:leaf" for j in range(len(leaf_outcomes))]
        nodes[sid] = TreeNode(
            node_id=sid,
            parent_id="root",
            depth=1,
            kind="memory",
            group_id="g:r:1",
            call=call,
            follow_up_calls=follow,
            children=leaves,
            metadata={"sample": k, "samples": len(outcomes)},
        )
        for leaf, outcome in zip(leaves, leaf_outcomes, strict=True):
            nodes[leaf] = TreeNode(node_id=leaf, parent_id=sid, depth=2, kind="leaf", outcome=outcome)
    merged = merge_identical_siblings(nodes) if merge else 0
    return MemoryCallTree(
        tree_id=f"{task_id}/tree",
        task_id=task_id,
        root_id="root",
        nodes=list(nodes.values()),
        metadata={"branched_nodes": len(outcomes), "merged_siblings": merged},
    )


def branching_sam(live: int, keep: int, consolidate_tokens: int, recall_tokens: int) -> Any:
    """A SAM config over one-turn pages with both roles sampled at temperature 1, so that trees branch at cue writing
    and at recall: ``live`` turns in the live window, ``keep`` of them kept, the roles' answers capped as given."""
    from memrl.rollout.memory.sam import SamConfig

    return SamConfig(
        page_turns=1,
        live_capacity_turns=live,
        keep_recent_turns=keep,
        sampling={
            "consolidate": RoleSampling(temperature=1.0, max_tokens=consolidate_tokens),
            "recall": RoleSampling(temperature=1.0, max_tokens=recall_tokens),
        },
    )


def vllm_lora_config(model: Path, *, max_model_len: int, max_lora_rank: int, **fields: Any) -> Any:
    """A float32 vLLM engine config of ``model`` that serves LoRA adapters of rank up to ``max_lora_rank``."""
    from memrl.rollout.engines import EngineConfig

    return EngineConfig(
        backend="vllm",
        model=str(model),
        dtype="float32",
        max_model_len=max_model_len,
        enable_lora=True,
        max_lora_rank=max_lora_rank,
        **fields,
    )
