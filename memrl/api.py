"""The names a user's own components import: the registration decorators, the bases of a memory system and its
config, an episode's :class:`Outcome`, and SAM's protocol (docs/own_agent.md walks through them).

A Gym-style environment and an HTTP agent need nothing from here (they are plain Python / any language); an episode
function may return an :class:`Outcome` or a number. Registering is needed to give a component a short name or a
config model; a component named by import path in YAML (``entry: "mypkg.env:MyTextGame"``) is found either way.

**SAM's protocol**, for a reasoner or an expert memory model of your own under ``memory: {name: sam}``:

- the reasoner reads its messages with :func:`read_sam_context` (the task, the cue bank ``pN: cue``, observations,
  its ``memory`` calls and their results: :class:`SamRecalled` or :class:`SamRecallFailed`, the admissible actions)
  and replies with one tool call of :data:`SAM_TOOLS` rendered by :func:`render_tool_call`
  (``<tool_call>{"name": "memory", "arguments": {"intent": "...", "page_ids": [3]}}</tool_call>``);
- an expert memory model answers two roles (``metadata["role"]``): ``consolidate`` (read the page with
  :func:`parse_sam_consolidate_prompt`, reply with a one-line cue) and ``recall`` (read the page and the extraction
  so far with :func:`parse_sam_recall_prompt`, reply with the updated extraction or :data:`NOTHING_RELEVANT`).
"""

from memrl.data.envs.gym import GymEnv, ReplayMismatchError
from memrl.data.formats import (
    NOTHING_RELEVANT,
    SAM_REASONER_SYSTEM,
    SAM_TOOLS,
    SamConsolidatePrompt,
    SamContext,
    SamRecalled,
    SamRecallFailed,
    SamRecallPrompt,
    ToolCall,
    parse_sam_consolidate_prompt,
    parse_sam_recall_prompt,
    parse_sam_tool_result,
    parse_tool_calls,
    read_sam_context,
    render_tool_call,
)
from memrl.data.registry import ComponentError, register_reasoner, register_task
from memrl.data.tasks.external import Outcome, TaskInfo
from memrl.rewards.terms import RewardTerm, register_reward
from memrl.rollout.engines.base import Engine, register_engine
from memrl.rollout.memory.base import (
    MemoryConfigBase,
    MemoryRequest,
    MemorySystem,
    RoleSampling,
    ToolResult,
    Turn,
    register_memory,
)

__all__ = [
    "NOTHING_RELEVANT",
    "SAM_REASONER_SYSTEM",
    "SAM_TOOLS",
    "ComponentError",
    "Engine",
    "GymEnv",
    "MemoryConfigBase",
    "MemoryRequest",
    "MemorySystem",
    "Outcome",
    "ReplayMismatchError",
    "RewardTerm",
    "RoleSampling",
    "SamConsolidatePrompt",
    "SamContext",
    "SamRecallFailed",
    "SamRecallPrompt",
    "SamRecalled",
    "TaskInfo",
    "ToolCall",
    "ToolResult",
    "Turn",
    "parse_sam_consolidate_prompt",
    "parse_sam_recall_prompt",
    "parse_sam_tool_result",
    "parse_tool_calls",
    "read_sam_context",
    "register_engine",
    "register_memory",
    "register_reasoner",
    "register_reward",
    "register_task",
    "render_tool_call",
]
