"""The words the synthetic environments and tasks are written in (kept small so the tiny tokenizer learns them)."""

from __future__ import annotations

__all__ = ["COLORS", "CONTAINERS", "DIRECTIONS", "NOUNS", "OPPOSITE", "ROOMS"]

COLORS: tuple[str, ...] = (
    "red", "blue", "green", "yellow", "white", "black", "purple", "orange",
    "brown", "grey", "pink", "silver", "gold", "copper", "iron", "brass",
)
NOUNS: tuple[str, ...] = (
    "lamp", "book", "coin", "ball", "cup", "map", "note", "ring", "apple", "bottle", "candle", "hat", "knife",
    "shoe", "spoon", "watch", "bell", "brush", "comb", "fork", "glove", "mask", "pen", "plate", "rope", "sock",
    "towel", "vase", "whistle", "scarf",
)
CONTAINERS: tuple[str, ...] = (
    "drawer", "chest", "cabinet", "crate", "basket", "closet", "trunk", "case", "bin", "safe", "locker", "jar",
)
ROOMS: tuple[str, ...] = (
    "kitchen", "cellar", "attic", "garden", "hall", "study", "bedroom", "pantry", "library", "garage", "porch",
    "bathroom", "office", "studio", "workshop", "lounge",
)
DIRECTIONS: tuple[str, ...] = ("north", "south", "east", "west")
OPPOSITE: dict[str, str] = {"north": "south", "south": "north", "east": "west", "west": "east"}
