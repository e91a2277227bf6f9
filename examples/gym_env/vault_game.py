"""The vault game: a small text game as a Gym-style environment (plain Python: nothing from memrl is imported).

A note in the hall gives the vault code; then a corridor of rooms with distractor posters; at the end the vault asks
for the code. ``reset(seed) -> observation``, ``step(action) -> (observation, reward, done, info)`` with
``info["admissible_actions"]`` and, on the last step, ``info["outcome"]`` / ``info["won"]``. Deterministic given the
seed, so memrl re-enters a state by replaying the logged actions (no snapshot/restore needed).
"""

from __future__ import annotations

import random
import re
from typing import Any

ROOMS = ["kitchen", "library", "cellar", "gallery", "study", "pantry", "attic", "garden"]


class VaultGame:
    """The vault game (module docstring). ``corridor`` rooms between the hall and the vault."""

    task = "Walk north to the vault and open it with its code."

    def __init__(self, corridor: int = 4) -> None:
        self.corridor = corridor

    def reset(self, seed: int) -> str:
        rng = random.Random(seed)
        self.code = f"{rng.randint(100, 999)}"
        self.rooms = [rng.choice(ROOMS) for _ in range(self.corridor)]
        self.decoys = [f"{rng.randint(100, 999)}" for _ in range(self.corridor)]
        self.pos = 0
        return f"You are in the hall. A note on the wall reads: the vault code is {self.code}. Exit: north."

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        info: dict[str, Any] = {}
        if self.pos <= self.corridor and action == "go north":
            self.pos += 1
            if self.pos <= self.corridor:
                room, decoy = self.rooms[self.pos - 1], self.decoys[self.pos - 1]
                obs = f"You are in the {room}. A poster says: the locker code is {decoy}. Exit: north."
            else:
                obs = "You stand before the vault. A keypad asks for the three-digit code."
            info["admissible_actions"] = ["go north"] if self.pos <= self.corridor else ["enter <code>"]
            return obs, 0.0, False, info
        if self.pos > self.corridor and (m := re.fullmatch(r"enter (\d{3})", action)):
            won = m.group(1) == self.code
            return (
                ("The vault opens!" if won else "Wrong code. The keypad locks."),
                float(won),
                True,
                {"outcome": float(won), "won": won},
            )
        return f"Nothing happens ({action!r}).", 0.0, False, info
