"""Reward terms: the weighted shaping terms of the OAT reward, as registered components.

``credit.terms: [{name: committee, weight: 0.5}, {entry: "mypkg.rewards:brevity", weight: 0.1}]`` is the list TRL's
``reward_funcs`` + ``reward_weights`` and verl's reward-manager registry give their users: every term scores each
memory action (tree node) of a sibling group, is centred within the group (``centre``: the sibling mean, or a
constant) and weighted; :mod:`memrl.rewards.credit` adds the sum to the outcome part V(n). The committee's
recoverability score (:mod:`memrl.rewards.committee`) is the first entry of the default list, not a special case;
``length`` (a length penalty) and ``prompt_overlap`` (a lexical proxy of what an action keeps) are built in too.

A term is a function (or a class whose instances are called) ``term(node, tree) -> float | None``: ``node`` is the
:class:`~memrl.data.schemas.TreeNode` of the memory action (its ``call`` holds the text, token ids and log-probs),
``tree`` the :class:`~memrl.data.schemas.MemoryCallTree`. None means "no score for this action": the term is then
dropped for its whole sibling group, so siblings are always compared on the same terms. A class is constructed with the
entry's ``params`` as keyword arguments.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable
from typing import Any, Literal, Protocol

from pydantic import Field, model_validator

from memrl.data.config import ConfigModel
from memrl.data.errors import UserCodeError
from memrl.data.registry import ComponentError, Registration, Registry, check_protocol, is_entry
from memrl.data.schemas import MemoryCallTree, TreeNode
from memrl.data.user_code import check_params, user_code_error

__all__ = [
    "REWARD_TERMS",
    "RewardTerm",
    "RewardTermConfig",
    "build_term",
    "register_reward",
    "score_term",
    "term_registration",
]


class RewardTerm(Protocol):
    """A reward term (module docstring)."""

    def __call__(self, node: TreeNode, tree: MemoryCallTree) -> float | None:
        """The term's score of one memory action (None: no score)."""
        ...


def _check_term(obj: Any) -> None:
    if not callable(obj):
        raise ComponentError(
            f"reward term {obj!r} must be a function term(node, tree) -> float | None or a class whose instances are"
        )
    if isinstance(obj, type):
        check_protocol(obj, "reward term", methods=("__call__",))


REWARD_TERMS: Registry[Any] = Registry("reward term", _check_term)
"""Reward terms by name: ``committee``, ``length``, ``prompt_overlap`` and a user's."""


def register_reward(name: str) -> Callable[[Any], Any]:
    """Decorator: a reward term (function ``term(node, tree) -> float | None``, or a class of such callables)
    selectable by ``credit.terms: [{name: NAME, weight: W}]`` (or by its import path as ``entry``)."""
    return REWARD_TERMS.decorator(name)


@register_reward("committee")
def committee(node: TreeNode, tree: MemoryCallTree) -> float | None:
    """c(n): the oracle committee's recoverability score of the action (:mod:`memrl.rewards.committee`, filled in by
    the rollout workers' scorer), None when it was not scored."""
    return node.committee_score


def _calls(node: TreeNode) -> list[Any]:
    return [] if node.call is None else [node.call, *node.follow_up_calls]


_WORD = re.compile(r"[a-z0-9]+")


@register_reward("length")
class Length:
    """Minus the action's generated tokens (every model call of it) per ``per_tokens``: shorter is cheaper (a
    length penalty, as TRL's and verl's users weight one)."""

    def __init__(self, per_tokens: int = 100) -> None:
        if per_tokens < 1:
            raise ComponentError("reward term length: per_tokens must be at least 1")
        self.per_tokens = per_tokens

    def __call__(self, node: TreeNode, tree: MemoryCallTree) -> float | None:
        """-tokens / per_tokens (None for a node without a model call)."""
        calls = _calls(node)
        if not calls:
            return None
        return -sum(len(c.response_ids) or c.completion_tokens for c in calls) / self.per_tokens


@register_reward("prompt_overlap")
def prompt_overlap(node: TreeNode, tree: MemoryCallTree) -> float | None:
    """The share of the words of the action's last prompt message that its output repeats (lower-cased letters and
    digits): a cheap lexical proxy of how much of what it read a memory action keeps, in [0, 1]."""
    calls = _calls(node)
    if not calls or not calls[0].messages:
        return None
    seen = set(_WORD.findall(calls[0].messages[-1].content.lower()))
    kept = set(_WORD.findall(" ".join(c.text for c in calls).lower()))
    return len(seen & kept) / len(seen) if seen else 0.0


class RewardTermConfig(ConfigModel):
    """One weighted reward term of ``credit.terms``."""

    name: str | None = None  # a registered term: committee, or one a user registered
    entry: str | None = None  # "package.module:name" of a user's term (function or class)
    weight: float = Field(1.0, ge=-1e3, le=1e3)  # w_t: the term's weight in r(n) = V(n) + sum_t w_t (term_t - centre_t)
    centre: Literal["siblings"] | float = "siblings"  # centre_t: the sibling mean of the term, or a constant
    params: dict[str, Any] = {}  # keyword arguments of a term class

    @model_validator(mode="before")
    @classmethod
    def _path_as_entry(cls, data: Any) -> Any:
        """``name: "pkg.mod:term"`` is an import path: it goes to ``entry``."""
        if (
            isinstance(data, dict)
            and isinstance(data.get("name"), str)
            and is_entry(data["name"])
            and data.get("entry") is None
        ):
            data = {**{k: v for k, v in data.items() if k != "name"}, "entry": data["name"]}
        return data

    @model_validator(mode="after")
    def _named(self) -> RewardTermConfig:
        if (self.name is None) == (self.entry is None):
            raise ValueError("a reward term needs exactly one of 'name' (registered) and 'entry' (import path)")
        obj = term_registration(self).obj  # an unknown name or an unimportable entry is an error now, not mid-run
        if inspect.isclass(obj):  # a term class's constructor takes params: checked now too
            check_params(obj, self.params, "the reward term", "params")
        return self

    @property
    def label(self) -> str:
        """The term's name in metrics."""
        if self.name is not None:
            return self.name
        assert self.entry is not None
        return self.entry.rsplit(":", 1)[-1]


def term_registration(cfg: RewardTermConfig) -> Registration[Any]:
    """The registered (or imported) term a config names."""
    reg = REWARD_TERMS.get(cfg.entry or cfg.name or "")
    if not reg.name:
        _check_term(reg.obj)
    return reg


def build_term(cfg: RewardTermConfig) -> Callable[[TreeNode, MemoryCallTree], float | None]:
    """The callable of a term config (a class is constructed with ``params``)."""
    obj = term_registration(cfg).obj
    if inspect.isclass(obj):
        try:
            return obj(**cfg.params)
        except Exception as exc:
            raise user_code_error(
                f"reward term {cfg.label}: its constructor {obj.__qualname__}(**{cfg.params}) raised", exc
            ) from None

    if cfg.params:
        raise ComponentError(
            f"reward term {cfg.label}: params are given but it is a function (params go to a term class's constructor)"
        )
    return obj


def score_term(
    cfg: RewardTermConfig, term: Callable[[TreeNode, MemoryCallTree], Any], node: TreeNode, tree: MemoryCallTree
) -> float | None:
    """``term(node, tree)`` checked: a finite number or None. A term that raises or returns anything else stops the
    run with a :class:`~memrl.data.errors.UserCodeError` naming the term, the memory action and the task (it would
    score every action the same broken way; a NaN would poison every advantage of the batch)."""
    where = (
        f"reward term {cfg.label} ({cfg.entry or cfg.name}) on memory action {node.node_id!r} of task {tree.task_id!r}"
    )
    try:
        value = term(node, tree)
    except Exception as exc:
        raise user_code_error(f"{where} raised", exc) from None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserCodeError(
            f"{where} returned {value!r}; a term returns a finite number (or None: no score for this action)"
        )
    return float(value)
