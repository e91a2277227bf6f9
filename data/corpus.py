"""The project's synthetic text corpus: what the offline tokenizer of the tiny models is trained on.

The corpus is deterministic for a given seed, so the tokenizer (and therefore every tiny model) is byte-identical
across machines. It holds the vocabulary of the synthetic environments and the scaffolding of the prompts, so that
the words the tiny models read and write are single tokens.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

__all__ = ["BASE_WORDS", "environment_samples", "environment_words", "synthetic_corpus"]

_BASE_TEXT = """
the a an of to in on at by for from with without into onto over under is are was were be been has have had do does
did not no yes and or but if then else when while after before because so than as it its this that these those there
here you your we our they their he she his her i me my what which who whom where why how all any each every some none
one two three four five six seven eight nine ten first second third last next previous step turn page cue intent
recall memory tool call result error ok fail failed success passed open closed locked unlocked key door room box
chest drawer crate shelf table lamp coin book map note north south east west up down left right go take drop put use
look examine inventory carry holding found see saw contains inside empty task question answer true false unknown
status knowledge procedural reminder requirement command output file path run test install build check verify done
established ruled out unresolved may matter later relevant nothing information page_ids pages evidence fact facts
"""
BASE_WORDS: tuple[str, ...] = tuple(_BASE_TEXT.split())
_ENV_TEXT = """
you are see exits goal done carry cannot floor holds opens with locked unlocked already closed empty there here wall
way pick drop unlock go move bump question next explore house answer task requirements subtask pipeline install pip
python run save result clean temporary files load data config readme list git status unit tests format code view log
check disk space version error hint connection refused port requirement environment use never touch write
successfully installed wrote rows passed reformatted
"""


def synthetic_corpus(seed: int = 0, repeats: int = 50, samples: int = 4) -> Iterator[str]:
    """Yield the corpus texts: the base vocabulary in random sentences, numbers, and ``samples`` rendered episodes
    of each environment and task family (observations, tool calls, memory prompts and replies)."""
    rng = random.Random(seed)
    words = list(BASE_WORDS)
    for _ in range(repeats):
        rng.shuffle(words)
        yield " ".join(words)
    yield " ".join(str(i) for i in range(0, 1000))
    yield "\n".join(f"t{i}: step {i}" for i in range(0, 512))
    yield from environment_samples(seed, samples)


def environment_words() -> list[str]:
    """Every word the environments and task families write (repeated in the corpus so each is one token)."""
    from memrl.data.envs.vocab import COLORS, CONTAINERS, DIRECTIONS, NOUNS, ROOMS

    extra = _ENV_TEXT.split()
    return sorted({*COLORS, *CONTAINERS, *DIRECTIONS, *NOUNS, *ROOMS, *extra})


def environment_samples(seed: int = 0, samples: int = 4) -> Iterator[str]:
    """Rendered text of the synthetic environments and task families, deterministic for ``seed``: their vocabulary
    in shuffled lines, trajectories of
    both worlds at every verbosity, SAM episodes with the oracle's cue and recall prompts and the reasoner's tool
    calls, proactive runs with the Phase 1 / Phase 2 prompts and replies."""
    from memrl.data.envs import generate_trajectory, make_env
    from memrl.data.experts import ProactiveOracle, SamOracle
    from memrl.data.schemas import EnvSpec
    from memrl.data.tasks import ActionAgent, ProactiveTask, SamReasoner, SamTask, simulate_proactive
    from memrl.data.tasks.sam import render_page

    rng = random.Random(seed)

    def render(messages: list[Any], reply: str) -> str:
        return "\n".join(m.content if hasattr(m, "content") else m["content"] for m in messages) + "\n" + reply

    words = environment_words()
    for _ in range(40):
        rng.shuffle(words)
        yield " ".join(words)
    for i in range(samples):
        s = seed * 1000 + i
        for name in ("textworld", "gridworld"):
            env = make_env(EnvSpec(name=name, seed=s, params={"verbosity": i % 3}))
            traj = generate_trajectory(env, 1000, noise=0.2, seed=s)
            yield "\n".join(f"> {t.action}\n{t.observation}" for t in traj.turns)
        task = SamTask({"horizon_steps": 16, "n_evidence": 1 + i % 2}, seed=s)
        episode = task.episode()
        oracle, reasoner, r = SamOracle({"paraphrase": 0.3, "verbatim": 0.7}), SamReasoner(), random.Random(s)
        turns = [(t.action if t.turn_idx else "", t.observation) for t in episode.trajectory]
        for start in range(0, len(turns), 4):
            page = render_page(turns[start : start + 4])
            yield render(*(lambda m: (m, oracle.respond(m, r, {})))(_sam_prompt("consolidate", start // 4, page)))
            intent = f"where is the {task.gold_entities[0]}"
            yield render(*(lambda m: (m, oracle.respond(m, r, {})))(_sam_prompt("recall", start // 4, page, intent)))
        yield "\n".join(reasoner.respond(_reasoner_view(t.observation), r, {}) for t in episode.trajectory)
        # the task family's original budget and always-distracted agent, pinned so the corpus (and with it the
        # tokenizer of every tiny model) stays what it was
        ptask = ProactiveTask({"n_subtasks": 12, "slack": 1}, seed=s)
        noisy = ProactiveOracle({"false_alarm_rate": 0.2})
        run = simulate_proactive(ptask, ActionAgent(distraction=1.0), noisy, seed=s)
        yield "\n".join(f"> {t.action}\n{t.observation}" for t in run.turns)
        for _, messages, reply in run.memory_calls[:8]:
            yield render(messages, reply)


def _sam_prompt(role: str, page_id: int, page: str, intent: str = "") -> list[dict[str, str]]:
    from memrl.data.formats import render_sam_consolidate_prompt, render_sam_recall_prompt

    if role == "consolidate":
        return render_sam_consolidate_prompt(page_id, page)
    return render_sam_recall_prompt(intent, page_id, page, "")


def _reasoner_view(observation: str) -> list[dict[str, str]]:
    from memrl.data.formats import SAM_REASONER_SYSTEM

    return [{"role": "system", "content": SAM_REASONER_SYSTEM}, {"role": "tool", "content": observation}]
