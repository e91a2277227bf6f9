"""Tasks whose agent loop runs outside memrl's :class:`~memrl.rollout.loop.Rollout`: an ``async def run(task, memory,
reasoner)`` episode function (:mod:`memrl.rollout.episodes`) or a black-box agent in its own process reached over
HTTP (:mod:`memrl.rollout.http_agent`). A task here is plain data (what to run, its parameters, its seed); the
rollout layer runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, model_validator

from memrl.data.config import ConfigModel, EndpointURL
from memrl.data.registry import register_task

__all__ = ["ExternalTask", "HttpAgentParams", "HttpAgentTask", "Outcome", "TaskInfo"]


@dataclass
class Outcome:
    """What an episode ends with: ``score`` in [0, 1] (the verifier's outcome), optionally the agent's ``answer`` and
    free-form ``info``. An episode function may also return a bare number (the score)."""

    score: float
    answer: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskInfo:
    """What an episode function receives as ``task``: its id, seed and the family's parameters (``params``)."""

    task_id: str
    seed: int
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class ExternalTask:
    """One task of an episode-function (``kind: episode``, ``entry``: the function's import path) or HTTP-agent
    (``kind: http``) family."""

    kind: Literal["episode", "http"]
    family: str
    params: dict[str, Any]
    seed: int
    task_id: str
    max_steps: int = 64  # memory + reasoner calls an episode may make before it is stopped (counted as failed)
    entry: str | None = None
    timeout_s: float = 300.0  # an episode that takes longer is stopped and counted as failed
    task: str = ""  # the instruction, for records (the agent owns its own prompts)

    @property
    def info(self) -> TaskInfo:
        """The ``task`` argument of an episode function."""
        return TaskInfo(self.task_id, self.seed, dict(self.params))


class HttpAgentParams(ConfigModel):
    """A black-box agent served over HTTP (:mod:`memrl.rollout.http_agent`): where it listens, or the command that
    starts it, and what each episode is sent."""

    url: EndpointURL | None = None  # the agent's base URL (POST {url}/episodes); None: start `command`
    command: list[str] | None = None  # starts the agent (its own process); it gets its port in MEMRL_AGENT_PORT
    cwd: str | None = None  # working directory of `command` (default: the current one)
    start_timeout_s: float = Field(60.0, gt=0, le=3600)  # how long the started agent may take to answer GET /health
    episode_timeout_s: float = Field(300.0, gt=0, le=86_400)  # an episode that takes longer is failed
    max_calls: int = Field(256, ge=1, le=100_000)  # model calls per episode at most (beyond: the episode fails)
    task: dict[str, Any] = {}  # sent to the agent as the `task` field of every POST /episodes
    serve_host: str = "127.0.0.1"  # where memrl's model endpoint listens (elsewhere needs MEMRL_ENDPOINT_TOKEN)
    token_env: str = "MEMRL_ENDPOINT_TOKEN"  # env var holding the bearer token the endpoint requires off-loopback

    @model_validator(mode="after")
    def _one_way_in(self) -> HttpAgentParams:
        if (self.url is None) == (self.command is None):
            raise ValueError("set exactly one of url (an agent already running) and command (memrl starts it)")
        return self


@register_task("http_agent", params=HttpAgentParams, kind="http")
class HttpAgentTask(ExternalTask):
    """A task of the ``http_agent`` family: an episode run by a black-box agent (see :class:`HttpAgentParams`)."""

    def __init__(self, params: HttpAgentParams | dict[str, Any], seed: int = 0, task_id: str = "") -> None:
        p = params if isinstance(params, HttpAgentParams) else HttpAgentParams.model_validate(params)
        super().__init__(
            kind="http",
            family="http_agent",
            params=p.model_dump(mode="json"),
            seed=seed,
            task_id=task_id or f"http-{seed}",
            max_steps=p.max_calls,
            timeout_s=p.episode_timeout_s,
        )
