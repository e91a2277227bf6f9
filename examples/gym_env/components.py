"""memrl's side of the vault game (examples/gym_env/vault_game.py): a memory system, a scripted frozen reasoner and a
reward term, registered so the config names them (by import path: this folder is on the path when memrl reads
config.yaml from it).

- ``NotesMemory``: every ``every`` turns the memory model (role ``note``, the trained role) writes one line kept in
  the player's context; raw turns are dropped after ``window``. Whether the vault code survives the corridor is up
  to the memory model: that is what OAT-GRPO trains.
- ``VaultPlayer``: walks north; at the vault enters the code found in its context (an LLM reasoner engine takes its
  place in a real run).
- ``NoteExpert``: a scripted expert memory model, for ``memrl data distill`` (distill.yaml).
- ``keeps_code``: a reward term (a note that repeats a code it saw), weighted in ``credit.terms``.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any, Literal

from memrl.api import (
    MemoryConfigBase,
    MemoryRequest,
    MemorySystem,
    RoleSampling,
    Turn,
    register_memory,
    register_reasoner,
    register_reward,
)


class NotesConfig(MemoryConfigBase):
    """NotesMemory's settings."""

    name: Literal["notes"] = "notes"
    every: int = 2  # a note every this many turns
    window: int = 2  # raw turns kept in the player's context
    sampling: dict[str, RoleSampling] = {"note": RoleSampling(temperature=1.0, max_tokens=24)}


@register_memory("notes", config=NotesConfig)
class NotesMemory(MemorySystem):
    """Turns -> one-line notes written by the memory model (role ``note``)."""

    name = "notes"
    reasoner_system = 'Act with <tool_call>{"name": "act", "arguments": {"action": "..."}}</tool_call>.'

    def __init__(self, config: NotesConfig) -> None:
        super().__init__()
        self.config = config

    def reset(self, task: str, metadata: dict[str, Any]) -> None:
        self.task, self.turns, self.notes, self.pending = task, [], [], None

    def on_turn(self, turn: Turn) -> None:
        self.turns.append(turn)
        if len(self.turns) % self.config.every == 0:
            seen = "\n".join(t.observation for t in self.turns[-self.config.every :])
            messages = [
                {"role": "system", "content": "Write one short line: what must be remembered?"},
                {"role": "user", "content": seen},
            ]
            self.pending = MemoryRequest("note", messages, self.config.sampling["note"])

    def next_memory_request(self) -> MemoryRequest | None:
        return self.pending

    def on_memory_result(self, request: MemoryRequest, call: Any) -> None:
        self.notes.append(call.text.strip().split("\n")[0][:120])
        self.pending = None

    def reasoner_messages(self, system_prompt: str) -> list[Any]:
        notes = "\n".join(f"- {n}" for n in self.notes) or "(none)"
        out = [
            {"role": "system", "content": system_prompt or self.reasoner_system},
            {"role": "user", "content": f"task: {self.task}\nnotes:\n{notes}"},
        ]
        for t in self.turns[-self.config.window :]:
            if t.action_text:
                out.append({"role": "assistant", "content": t.action_text})
            out.append({"role": "tool" if t.action_text else "user", "content": t.observation})
        return out


@register_reasoner("vault_player")
class VaultPlayer:
    """Walks north; at the vault enters the vault code found in its context (notes or recent turns), else a guess."""

    name = "vault-player"

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        text = "\n".join(m["content"] if isinstance(m, dict) else m.content for m in messages)
        if "keypad" not in text.split("\n")[-1] and "admissible actions:\nenter" not in text:
            action = "go north"
        else:
            found = re.findall(r"vault code is (\d{3})", text)
            action = f"enter {found[-1] if found else rng.randint(100, 999)}"
        return "<tool_call>" + json.dumps({"name": "act", "arguments": {"action": action}}) + "</tool_call>"


@register_reasoner("note_expert")
class NoteExpert:
    """A scripted expert memory model (``memrl data distill``'s expert): notes the vault code when it sees it."""

    name = "note-expert"

    def respond(self, messages: list[Any], rng: random.Random, metadata: dict[str, Any]) -> str:
        found = re.search(r"vault code is \d{3}", messages[-1].content)
        return found.group(0) if found else "nothing new"


@register_reward("keeps_code")
def keeps_code(node: Any, tree: Any) -> float | None:
    """1 when the note repeats a three-digit number its prompt showed (a code it may need later), else 0."""
    if node.call is None:
        return None
    shown = set(re.findall(r"\b\d{3}\b", node.call.messages[-1].content))
    return float(bool(shown & set(re.findall(r"\b\d{3}\b", node.call.text))))
