"""Microsoft TextWorld (the ``textworld`` extra): games generated at test time into a keyed cache, the Gym-shaped
environment, replay determinism, bad inputs, and the reasoner + expert winning a generated game through SAM. One
small game (treasure_hunter level 3: five rooms, a three-step quest) is generated per session, in seconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fakes import branching_sam

from memrl.data.config import ConfigError, ConfigModel, load_config

pytest.importorskip("textworld", reason="the textworld extra is not installed")

from memrl.data.envs.ms_textworld import (
    GameCache,
    MsTextWorldEnv,
    MsTextWorldParams,
    clean_observation,
)
from memrl.data.tasks.ms_textworld import MsTextWorldTaskParams, parse_recipe, parse_tw_cue

SMALL = {"challenge": "treasure_hunter", "level": 3}


@pytest.fixture(scope="session")
def tw_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A game cache holding the small game of seed 0 (generated once per session)."""
    root = tmp_path_factory.mktemp("tw-cache")
    GameCache(root).ensure(MsTextWorldParams(**SMALL, cache_dir=str(root)), 0)
    return root


def test_cache_holds_complete_games_keyed_and_generates_each_once(tw_cache: Path) -> None:
    params = MsTextWorldParams(**SMALL, cache_dir=str(tw_cache))
    cache = GameCache(tw_cache)
    folder = cache.folder(params, 0)
    assert sorted(p.name for p in folder.iterdir()) == ["game.json", "game.meta.json", "game.z8"]
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left
    record = cache.record(params, 0)
    assert record.walkthrough and record.command == "tw-make tw-treasure_hunter --level 3 --seed 0"
    stamp = (folder / "game.z8").stat().st_mtime_ns
    assert cache.ensure(params, 0) == folder and (folder / "game.z8").stat().st_mtime_ns == stamp  # reused
    other = cache.folder(MsTextWorldParams(challenge="treasure_hunter", level=4), 0)
    assert other.name != folder.name and cache.folder(params, 1) != folder  # settings and seed are in the key


def test_a_failed_generation_leaves_nothing_in_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import textworld.generator

    def broken(game, options):  # the compiler dies half-way: a game.json is already written
        Path(options.path).with_suffix(".json").write_text("{}")
        raise RuntimeError("inform7 crashed")

    monkeypatch.setattr(textworld.generator, "compile_game", broken)
    params = MsTextWorldParams(**SMALL, cache_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match="inform7 crashed"):
        GameCache(tmp_path).ensure(params, 5)
    assert [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")] == ["treasure_hunter"]


def test_env_plays_the_walkthrough_to_a_win_and_replays_identically(tw_cache: Path) -> None:
    env = MsTextWorldEnv(**SMALL, cache_dir=str(tw_cache))
    first, info = env.reset(0)
    assert "-= " in first and "$$" not in first and info["admissible_actions"]  # banner stripped, commands shown
    walkthrough = env.privileged()["walkthrough"]
    log = [first]
    for i, command in enumerate(walkthrough):
        obs, reward, done, info = env.step(command)
        log.append(obs)
        assert done == (i == len(walkthrough) - 1)
    assert info["won"] and info["outcome"] == 1.0 and reward == 1.0 and "The End" in obs
    twin = MsTextWorldEnv(**SMALL, cache_dir=str(tw_cache))  # a new instance: reset + the same commands
    assert [twin.reset(0)[0]] + [twin.step(c)[0] for c in walkthrough] == log
    env.close()
    twin.close()


def test_env_ends_unwon_at_max_steps(tw_cache: Path) -> None:
    env = MsTextWorldEnv(**SMALL, cache_dir=str(tw_cache), max_steps=2)
    env.reset(0)
    assert env.step("look")[2] is False
    _, _, done, info = env.step("look")
    assert done and info["outcome"] == 0.0 and info["steps_limit"]
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("look")


def test_clean_observation_strips_banner_prompt_status_and_menu() -> None:
    raw = (
        "\n\n   ____  __\n  |    \\|  $$\n\nWelcome! Take the key.\n\n-= Hall =-\nA hall.\n\n\n\n>       "
        "                 -= Hall =-0/1"
    )
    assert clean_observation(raw) == "Welcome! Take the key.\n\n-= Hall =-\nA hall."
    end = "You take it.\n\n   *** The End ***\n\nYou scored 1.\n\n\nWould you like to RESTART, RESTORE or QUIT?\n> "
    assert clean_observation(end) == "You take it.\n\n*** The End ***\n\nYou scored 1."


class _Holder(ConfigModel):
    params: MsTextWorldTaskParams


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        (["params.challenge=zork"], "params.challenge", "tw-make generates coin_collector, cooking, simple"),
        (["params.challenge=zork"], "params.challenge", "game_files: [path/to/game.z8]"),
        (["params.rewards=dense"], "params.rewards", "sets the simple challenge, not treasure_hunter"),
        (["params.challenge=simple", "params.recipe=2"], "params.recipe", "sizes the cooking challenge"),
        (["params.challenge=cooking", "params.recipe=2", "params.take=3"], "params.take", "at most 'recipe' (2)"),
        (["params.challenge=cooking", "params.go=5"], "params.go", "1, 6, 9, 12 rooms"),
        (["params.level=31"], "params.level", "levels run from 1 to 30"),
        (["params.challenge=coin_collector", "params.level=160"], "params.level", "at most 100"),
        (["params.challenge=cooking", "params.level=3"], "params.level", "cooking takes recipe"),
        (["params.recipe=2"], "params.recipe", "sizes the cooking challenge"),
    ],
)
def test_impossible_settings_name_the_key(overrides: list[str], key: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_Holder, overrides=overrides)
    assert f"key '{key}'" in str(err.value) and says in str(err.value)


def _memrl(*args: str, hide_textworld: bool = False, cwd: Path | None = None) -> subprocess.CompletedProcess:
    hide = "import sys; sys.modules['textworld'] = None\n" if hide_textworld else "import sys\n"
    code = hide + "from memrl.launch.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd or Path(__file__).resolve().parents[1],
    )


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("task_params.challenge=zork", ["key 'task_params'", "unknown TextWorld challenge 'zork'", "game_files"]),
        (
            "task_params={challenge: cooking, recipe: 2, take: 3}",
            ["key 'task_params'", "take:", "at most 'recipe' (2)"],
        ),
        ("task_params={challenge: cooking, go: 5}", ["key 'task_params'", "go:", "1, 6, 9, 12 rooms"]),
        ("task_family=zork", ["key 'task_family'", "unknown task family 'zork'"]),
    ],
)
def test_the_recipe_refuses_bad_settings_with_exit_2_naming_the_key(
    tmp_path: Path, override: str, says: list[str]
) -> None:
    out = _memrl("quickstart", "--config", "configs/textworld_tiny.yaml", override, f"run.output_dir={tmp_path}")
    assert out.returncode == 2, out.stderr[-2000:]
    assert all(s in out.stderr for s in says), out.stderr[-2000:]
    assert not list(tmp_path.iterdir())  # no run folder


def test_the_recipe_without_textworld_is_one_paragraph_naming_the_extra(tmp_path: Path) -> None:
    out = _memrl(
        "quickstart", "--config", "configs/textworld_tiny.yaml", f"run.output_dir={tmp_path}", hide_textworld=True
    )
    assert out.returncode == 2, out.stderr[-2000:]
    message = [line for line in out.stderr.splitlines() if "textworld" in line]
    assert len(message) == 1 and "'textworld' extra" in message[0] and "MEMRL_EXTRAS=textworld" in message[0]
    assert not list(tmp_path.iterdir())


def test_missing_textworld_is_one_paragraph_naming_the_extra(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['textworld'] = None\n"
        "from memrl.data.envs.ms_textworld import MsTextWorldEnv, TextWorldMissing\n"
        "try:\n    MsTextWorldEnv(cache_dir=sys.argv[1]).reset(0)\n"
        "except TextWorldMissing as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    message = out.stdout.strip()
    assert out.returncode == 0 and "\n" not in message, out.stderr
    assert "'textworld' extra" in message and "pip install -e '.[textworld]'" in message
    assert "MEMRL_EXTRAS=textworld" in message and not list(tmp_path.iterdir())  # nothing generated


def test_recipe_and_cue_grammar_round_trip() -> None:
    text = (
        "Recipe #1\n---------\nIngredients:\nred potato\n  carrot\n\nDirections:\nslice the red potato\n"
        "  fry the carrot\n  prepare meal"
    )
    recipe = parse_recipe(text)
    assert recipe is not None and recipe.ingredients == ["red potato", "carrot"]
    assert recipe.steps() == [("slice", "red potato"), ("fry", "carrot")]
    one_line = parse_recipe("Ingredients: red potato, carrot Directions: slice red potato, fry carrot, prepare meal")
    assert one_line is not None and one_line.steps() == recipe.steps()
    cue = parse_tw_cue("go east -> bar; exits north south; goal; seen worm, brass key")
    assert (cue.action, cue.room, cue.exits, cue.goal, cue.seen) == (
        "go east",
        "bar",
        ["north", "south"],
        True,
        ["worm", "brass key"],
    )
    assert parse_tw_cue("memory: goal: take the worm").content == "take the worm"


def test_reasoner_and_expert_win_through_sam_and_a_fork_replays(tw_cache: Path) -> None:
    """The family end to end with the privileged expert as SAM's memory model: the game is won; a fork mid-episode
    re-enters the state by replay (a new game, reset, the logged commands, digests compared) and goes on with
    the same observations."""
    import copy

    from memrl.data.experts.ms_textworld import TwOracle
    from memrl.data.tasks import TaskSetConfig, load_tasks
    from memrl.data.tasks.ms_textworld import TwReasoner
    from memrl.rollout.agents import task_rollout
    from memrl.rollout.engines.scripted import ScriptedEngine
    from memrl.rollout.loop import EngineSet, run_rollouts

    params = {**SMALL, "max_steps": 30, "cache_dir": str(tw_cache)}
    (task,) = load_tasks(TaskSetConfig(family="ms_textworld", params=params, count=1, seed=0), "t")
    engines = EngineSet(reasoner=ScriptedEngine(TwReasoner()), memory=ScriptedEngine(TwOracle()))
    (trace,) = run_rollouts([task_rollout(task, {"name": "sam"})], engines)
    assert trace.outcome == 1.0 and trace.stats["env_won"] == 1
    rollout = task_rollout(task, {"name": "sam"})
    while len(rollout.env.log) < 1:
        call = rollout.pending()
        rollout.advance(engines.for_call(call).generate([call.request])[0])
    twin = rollout.fork("twin")
    assert twin.env.reentries["replay"] == 1 and twin.env.log == rollout.env.log
    assert twin.env.step("look") == rollout.env.step("look")
    rollout.env.log.append(("look", "a planted observation the game never gives"))
    from memrl.data.envs.gym import ReplayMismatchError

    with pytest.raises(ReplayMismatchError, match="diverged at step 3"):
        copy.deepcopy(rollout.env)


# protects: a real generated TextWorld game: played, re-entered by replay and trained one OAT-GRPO iteration
@pytest.mark.slow
def test_acceptance_generated_game_played_replayed_and_one_oat_grpo_iteration(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Issue 38, acceptance 1: a game generated now (seconds), played through the adapter, a state re-entered by
    replay with the same observations, and one OAT-GRPO iteration of the tiny model on it (trees branching at the
    cue of the first page, every sibling a replayed copy of the game)."""
    import json
    import time

    from memrl.data.config import RunConfig
    from memrl.data.run_dir import prepare_run_dir
    from memrl.data.tasks import TaskSetConfig, load_tasks
    from memrl.rollout.engines.config import EngineConfig
    from memrl.rollout.tree import TreeConfig
    from memrl.train.oat_grpo import OATGRPOConfig, train_oat_grpo
    from memrl.train.online import LoopConfig
    from memrl.train.policy import PolicySpec

    params = {"challenge": "treasure_hunter", "level": 4, "max_steps": 6, "cache_dir": str(tmp_path / "games")}
    tasks = TaskSetConfig(family="ms_textworld", params=params, count=1, seed=11)
    t0 = time.perf_counter()
    (task,) = load_tasks(tasks, "a1")
    record = task.record()  # generated now, into the test's own cache
    assert time.perf_counter() - t0 < 120 and record.walkthrough
    first = task.reset()
    observations = [first] + [task.step(c)[0] for c in record.walkthrough]
    assert task.finish(None) == 1.0
    twin = load_tasks(tasks, "a1")[0]
    twin.reset()
    twin.log = list(task.log)  # the logged episode, re-entered by a replayed copy
    replayed = __import__("copy").deepcopy(twin)
    assert replayed.reentries["replay"] == 1 and [o for _, o in replayed.log] == observations[1:]

    memory = branching_sam(live=2, keep=1, consolidate_tokens=16, recall_tokens=16)  # a page (and its cue) every step
    cfg = OATGRPOConfig(
        run=RunConfig(output_dir=str(tmp_path / "runs"), name="oat", seed=0),
        policy=PolicySpec(base=str(tiny_model_dir)),
        engine=EngineConfig(backend="hf", name="policy", model=str(tiny_model_dir), dtype="float32", batch_size=8),
        memory=memory,
        train_tasks=tasks,
        eval_tasks=TaskSetConfig(family="ms_textworld", params=params, count=0),
        tasks_per_iteration=1,
        tree=TreeConfig(branch_roles=["consolidate"], branch_factor=2, max_branch_depth=1, max_leaves=2),
        loop=LoopConfig(iterations=1, eval_every=0, checkpoint_every=1),
        eval_samples=0,
    )
    run_dir = prepare_run_dir(cfg, cfg.run, "train-oat-grpo")
    result = train_oat_grpo(cfg, run_dir)
    assert result["iterations_run"] == 1
    trees = [json.loads(line) for line in (run_dir / "trees_last.jsonl").read_text().splitlines()]
    assert len(trees) == 1
    nodes = trees[0]["nodes"]
    leaves = [n for n in (nodes.values() if isinstance(nodes, dict) else nodes) if n.get("outcome") is not None]
    assert len(leaves) == 2  # K = 2 siblings at the first cue, each played to the end on its own copy of the game
    replays = [leaf["metadata"]["stats"].get("env_reentry_replay", 0) for leaf in leaves]
    assert sorted(replays) == [0, 1]  # the branch's copy of the game was re-entered by replay, and ran to its end
    assert all(leaf["metadata"]["stats"]["env_steps"] >= 1 for leaf in leaves)
    history = result["history"][0]
    assert history["committee_scored_groups"] == 1 and history["memory_calls_trained"] >= 2


def test_any_tw_make_challenge_and_games_of_your_own(tw_cache: Path, tmp_path: Path) -> None:
    """tw-simple (an errand told step by step) is generated and won by the family's reasoner with full context and
    through SAM with its expert; a game file of your own is played as it is, its walkthrough read from the game."""
    from memrl.data.experts.ms_textworld import TwOracle
    from memrl.data.tasks import TaskSetConfig, load_tasks
    from memrl.data.tasks.ms_textworld import TwReasoner
    from memrl.rollout.agents import task_rollout
    from memrl.rollout.engines.scripted import ScriptedEngine
    from memrl.rollout.loop import EngineSet, run_rollouts

    simple = MsTextWorldParams(challenge="tw-simple", rewards="dense", goal="detailed")
    assert simple.tw_make_command(3) == "tw-make tw-simple --rewards dense --goal detailed --seed 3"
    engines = EngineSet(reasoner=ScriptedEngine(TwReasoner()), memory=ScriptedEngine(TwOracle()))
    params = {"challenge": "simple", "rewards": "dense", "goal": "detailed", "cache_dir": str(tw_cache)}
    (task,) = load_tasks(TaskSetConfig(family="ms_textworld", params=params, count=1, seed=400_000))
    for memory in ({"name": "long_context", "window_tokens": 100_000}, {"name": "sam"}):
        (trace,) = run_rollouts([task_rollout(task, memory)], engines)
        assert trace.stats["env_won"] == 1 and trace.outcome == 1.0, memory
    own = tmp_path / "games"
    own.mkdir()
    folder = GameCache(tw_cache).folder(MsTextWorldParams(**SMALL), 0)
    (own / "mine.z8").write_bytes((folder / "game.z8").read_bytes())  # as tw-make writes it: the game and its
    (own / "mine.json").write_bytes((folder / "game.json").read_bytes())  # metadata (the walkthrough) beside it
    files = {"game_files": [str(own / "*.z8")], "cache_dir": str(tw_cache)}
    (mine,) = load_tasks(TaskSetConfig(family="ms_textworld", params=files, count=1, seed=7))
    assert mine.record().walkthrough == GameCache(tw_cache).record(MsTextWorldParams(**SMALL), 0).walkthrough
    assert mine.horizon_label == "files/files"
    (trace,) = run_rollouts([task_rollout(mine, {"name": "long_context", "window_tokens": 100_000})], engines)
    assert trace.stats["env_won"] == 1
    with pytest.raises(ConfigError, match=r"game_files: '.*nothing\*\.ulx' names no game file"):
        load_config(_Holder, overrides=[f"params.game_files=['{own}/nothing*.ulx']"])
    with pytest.raises(ConfigError, match="game_files plays your own games: set no challenge"):
        load_config(_Holder, overrides=[f"params.game_files=['{own}/*.z8']", "params.challenge=cooking"])
