"""The vault game (examples/gym_env/vault_game.py) as an episode function: the agent loop is yours, memrl answers its
model calls (docs/own_agent.md, "Episode function").

``run(task, memory, reasoner)`` plays one episode: every second turn it asks the memory model (role ``note``, the role
OAT-GRPO trains) for one line worth remembering; the player sees only its notes and its last two observations. The
player here is a rule (your own LLM call, or ``await reasoner.generate(messages)`` for the frozen reasoner memrl runs,
would take its place). Branching re-runs this function with the earlier answers replayed, so it must depend only on
``task.seed`` and the answers it gets (it does: the game is deterministic).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gym_env"))  # the same game as the Gym example

from vault_game import VaultGame

from memrl.api import Outcome

NOTE_PROMPT = "Write one short line: what must be remembered?"


def player(context: list[str], admissible: list[str]) -> str:
    """Walk north; at the vault enter the vault code found in the context (else a wrong guess)."""
    if admissible != ["enter <code>"]:
        return "go north"
    found = re.findall(r"vault code is (\d{3})", "\n".join(context))
    return f"enter {found[-1] if found else '000'}"


async def run(task: Any, memory: Any, reasoner: Any) -> Outcome:
    """One episode of the vault game (module docstring)."""
    game = VaultGame(corridor=int(task.params.get("corridor", 3)))
    seen = [game.reset(task.seed)]
    notes: list[str] = []
    admissible = ["go north"]
    for turn in range(int(task.params.get("max_turns", 12))):
        if turn % 2 == 1:
            note = await memory.generate(
                [{"role": "system", "content": NOTE_PROMPT}, {"role": "user", "content": "\n".join(seen[-2:])}],
                role="note",
            )
            notes.append(note.strip().split("\n")[0][:120])
        action = player(notes + seen[-2:], admissible)
        observation, reward, done, info = game.step(action)
        seen.append(observation)
        admissible = info.get("admissible_actions", admissible)
        if done:
            return Outcome(score=float(info.get("outcome", reward)), answer=action)
    return Outcome(score=0.0)
