"""AMA-Bench-style QA episodes from the synthetic environments: a trajectory grown to a target token length by the
optimal policy (with action noise) plus rule-based QA of types A-D with needle turns."""

from __future__ import annotations

from typing import Any

from memrl.data.envs.base import generate_trajectory, make_env
from memrl.data.qa import generate_qa
from memrl.data.schemas import EnvSpec, Episode

__all__ = ["make_ama_episode"]

_TASKS = {
    "textworld": "move items between containers as each goal says; goals follow one another.",
    "gridworld": "reach rooms, pick up and place objects as each goal says; goals follow one another.",
}


def make_ama_episode(
    env_name: str,
    params: dict[str, Any],
    seed: int,
    target_tokens: int,
    *,
    noise: float = 0.1,
    per_type: int = 3,
    episode_id: str | None = None,
) -> Episode:
    """One episode in AMA-Bench's shape (``episode_id, task, task_type, domain, trajectory, qa_pairs``) plus our
    extras (``env`` spec to replay it, ``horizon_tokens``, and ``metadata`` with the noise and target)."""
    spec = EnvSpec(name=env_name, seed=seed, params=params)
    env = make_env(spec)
    traj = generate_trajectory(env, target_tokens, noise=noise, seed=seed)
    eid = episode_id or f"{env_name}-{seed}-{target_tokens}"
    qa = generate_qa(traj.turns, traj.events, per_type=per_type, seed=seed, id_prefix=f"{eid}/q")
    return Episode(
        episode_id=eid,
        task=_TASKS.get(env_name, "act in the environment."),
        task_type=f"synthetic-{env_name}",
        domain=env_name,
        trajectory=traj.turns,
        qa_pairs=qa,
        env=env.spec,
        horizon_tokens=traj.tokens,
        metadata={"family": "ama", "noise": noise, "target_tokens": target_tokens, "trajectory_seed": seed},
    )
