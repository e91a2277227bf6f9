"""A user's own code that fails, blocks or lies (data/user_code.py, the boundary around it): each case ends in a memrl
error naming the component, the call and the episode, or fails that episode alone (counted per kind), never a raw
traceback, a hang or a run "done" on nothing. Classes: a module that does not import (an exception at import, a
syntax error, a missing dependency, ``sys.exit``), a constructor that raises or params it does not take, a ``step()``
that blocks, a reward term that raises or returns NaN, an HTTP agent process that dies, memory calls under a role
nothing trains, a ``restore()`` that does not restore, every episode failing, a memory system that raises; an
OpenAI-compatible reasoner that answers 10 MB to a request of 8 tokens; and the messages: an HTTP agent's score out of
range, a committee judge nothing uses, a LoCoMo turn named as the file names it, ``--resume`` with nothing saved,
SIGHUP, a benchmark's ``--reuse`` of a damaged folder."""

from __future__ import annotations

import copy
import logging
import math
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Literal

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "gym_env"))

from components import NotesConfig, NotesMemory  # noqa: E402
from vault_game import VaultGame  # noqa: E402

from memrl.api import register_memory  # noqa: E402
from memrl.data.envs.gym import ReplayMismatchError  # noqa: E402
from memrl.data.errors import UserCodeError  # noqa: E402
from memrl.data.schemas import MemoryCall, MemoryCallTree, TreeNode  # noqa: E402
from memrl.data.tasks import TaskSetConfig, load_tasks  # noqa: E402
from memrl.launch.cli import main  # noqa: E402
from memrl.rewards.credit import CreditConfig, assign_credit  # noqa: E402
from memrl.rollout.agents import task_rollout  # noqa: E402
from memrl.rollout.tree import TreeConfig, build_trees  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_episode_shapes import MEMORY as EXTERNAL  # noqa: E402
from test_episode_shapes import trees as episode_trees  # noqa: E402
from test_gym_env import MEMORY, engines  # noqa: E402


def trees_of(entry: str, reentry: str = "auto", count: int = 3, timeout: float = 300.0) -> list[Any]:
    """Memory-call trees of a Gym class (test_gym_env's scripted engines), with ``episode_timeout_s``."""
    tasks = TaskSetConfig(entry=entry, params={"corridor": 3}, count=count, reentry=reentry, episode_timeout_s=timeout)
    cfg = TreeConfig(branch_roles=["note"], branch_factor=2, max_leaves=8, max_branch_depth=3)
    built, _ = build_trees(
        load_tasks(tasks, "t"), lambda task, rid: task_rollout(task, MEMORY, seed=1, rollout_id=rid), engines(), cfg
    )
    return built


# ---------------------------------------------------------------------------------------------------- importing
def _config(folder: Path, entry: str) -> Path:
    path = folder / "config.yaml"
    path.write_text(f'command: train oat-grpo\npolicy: {{base: m}}\ntrain_tasks: {{entry: "{entry}"}}\n')
    return path


@pytest.mark.parametrize(
    ("source", "raised", "frame"),
    [
        (
            "import os\n\ndef home():\n    return os.environ['NO_SUCH_GAME_HOME']\n\nHOME = home()\n",
            "KeyError",
            "line 4",
        ),
        ("def step(self:\n    pass\n", "SyntaxError", "line 1"),
        ("import no_such_dependency_of_the_game\n", "ModuleNotFoundError: No module named", "line 1"),
        ("import sys\nsys.exit('the game needs a display')\n", "SystemExit: the game needs a display", "line 2"),
    ],
    ids=["exception", "syntax", "dependency", "exit"],
)
def test_a_module_that_does_not_import_is_named_with_its_own_frames(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str, raised: str, frame: str
) -> None:
    name = f"game_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(source)
    code = main(["train", "oat-grpo", "--config", str(_config(tmp_path, f"{name}:Game"))])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "config error" not in err and "Traceback" not in err and "unexpected error" not in err
    first = err.strip().splitlines()[0]
    assert first.startswith(f"memrl: error: task family '{name}:Game': importing module '{name}' failed: {raised}")
    assert f'{name}.py", {frame}' in err  # the user's own frame, on the console
    log = Path(err.strip().splitlines()[-1].split("the whole traceback is in ")[1])
    assert "Traceback" in log.read_text() and f"{name}.py" in log.read_text()


def test_a_module_that_is_not_there_stays_a_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "oat-grpo", "--config", str(_config(tmp_path, "no_such_game_module:Game"))]) == 2
    assert "memrl: config error:" in capsys.readouterr().err  # the config names what is not there


# ------------------------------------------------------------------------------------------------- constructing
class NeedsServer(VaultGame):
    def __init__(self, corridor: int = 3, server: str = "") -> None:
        super().__init__(corridor=corridor)
        if not server:
            raise ConnectionRefusedError("no game server at ''")


def test_constructor_params_are_checked_against_its_signature_when_the_config_loads() -> None:
    with pytest.raises(
        ValueError,
        match=r"params: the Gym-style environment vault_game:VaultGame cannot be constructed "
        r"with \{'corridr': 3\}: got an unexpected keyword argument 'corridr' \(its constructor takes: "
        r"corridor",
    ):
        TaskSetConfig(entry="vault_game:VaultGame", params={"corridr": 3})
    TaskSetConfig(entry="vault_game:VaultGame", params={"corridor": 3})  # the edge: exactly what it takes


def test_scripted_policy_kwargs_are_checked_against_its_constructor(tmp_path: Path) -> None:
    from memrl.data.config import ConfigError, load_config
    from memrl.train.oat_grpo import OATGRPOConfig, check_inputs

    path = tmp_path / "c.yaml"
    path.write_text(
        "policy: {base: m}\nreasoner: {backend: scripted, name: r, scripted_policy: sam, "
        "scripted_kwargs: {max_pages: 2, recall_budgett: 2}}\n"
    )
    with pytest.raises(
        ConfigError,
        match=r"reasoner.scripted_kwargs: the scripted policy .*SamReasoner cannot be "
        r"constructed with .*unexpected keyword argument 'recall_budgett'",
    ):
        check_inputs(load_config(OATGRPOConfig, path, []))
    check_inputs(load_config(OATGRPOConfig, path, ["reasoner.scripted_kwargs={max_pages: 2, recall_budget: 2}"]))


def test_a_constructor_that_raises_stops_the_run_naming_the_class() -> None:
    (task,) = load_tasks(TaskSetConfig(entry="test_user_code_faults:NeedsServer", count=1), "t")
    with pytest.raises(
        UserCodeError,
        match=r"test_user_code_faults:NeedsServer': its constructor NeedsServer\(\*\*\{\}\) "
        r"raised, so every episode would fail the same way: ConnectionRefusedError",
    ) as err:
        task.reset()
    assert "raise ConnectionRefusedError" in err.value.frames


# ---------------------------------------------------------------------------------------------------- blocking
class StuckVault(VaultGame):
    """step() never returns in the corridor of odd seeds (a game server that stopped answering)."""

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self.pos >= 1 and self.code and int(self.code) % 2:
            threading.Event().wait(3600)
        return super().step(action)


def test_a_blocking_step_fails_its_episode_after_episode_timeout_s() -> None:
    out: dict[str, Any] = {}

    def build() -> None:
        out["trees"] = trees_of("test_user_code_faults:StuckVault", count=2, timeout=0.5)  # seed 1 sticks

    started = time.monotonic()
    worker = threading.Thread(target=build, daemon=True)
    worker.start()
    worker.join(120)
    assert not worker.is_alive(), "a blocked step() hung the rollout"
    assert time.monotonic() - started < 60
    leaves = [n for t in out["trees"] for n in t.nodes if n.kind == "leaf"]
    stuck = [n for n in leaves if n.metadata["stats"].get("env_timeouts")]
    assert stuck and len(stuck) < len(leaves) and all(n.outcome == 0.0 for n in stuck)
    assert not any(n.metadata["stats"].get("env_errors") for n in stuck)  # counted as a timeout, not an error


# ------------------------------------------------------------------------------------------------ reward terms
def nan_term(node: TreeNode, tree: MemoryCallTree) -> float:
    return math.nan


def raising_term(node: TreeNode, tree: MemoryCallTree) -> float:
    return {"kept": 1.0}[node.call.text]


def _group() -> MemoryCallTree:
    nodes = [TreeNode(node_id="root", kind="root", children=["m0", "m1"])]
    for i in range(2):
        call = MemoryCall(call_id=f"c{i}", role="note", text=f"note {i}", response_ids=[1], logprobs=[0.0])
        nodes.append(
            TreeNode(
                node_id=f"m{i}", parent_id="root", depth=1, kind="memory", call=call, group_id="g", children=[f"l{i}"]
            )
        )
        nodes.append(TreeNode(node_id=f"l{i}", parent_id=f"m{i}", depth=2, kind="leaf", outcome=float(i)))
    return MemoryCallTree(tree_id="t", task_id="task-7", root_id="root", nodes=nodes)


@pytest.mark.parametrize(
    ("term", "message"),
    [
        ("nan_term", r"returned nan; a term returns a finite number \(or None"),
        ("raising_term", r"raised: KeyError: 'note 0'"),
    ],
)
def test_a_reward_term_that_raises_or_returns_nan_stops_the_run_naming_it(term: str, message: str) -> None:
    cfg = CreditConfig(terms=[{"entry": f"test_user_code_faults:{term}", "weight": 0.1}])
    with pytest.raises(UserCodeError) as err:
        assign_credit(_group(), cfg)
    assert err.match(
        f"reward term {term} \\(test_user_code_faults:{term}\\) on memory action 'm0' of task 'task-7' " + message
    )
    if term == "raising_term":
        assert "node.call.text" in err.value.frames  # the user's own line


# ---------------------------------------------------------------------------------------------------- HTTP agent
AGENT = textwrap.dedent(
    """
    import json, os
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self):
            print("out of memory in the agent", flush=True)
            os._exit(3)

    ThreadingHTTPServer(("127.0.0.1", int(os.environ["MEMRL_AGENT_PORT"])), Handler).serve_forever()
    """
)


def agent_trees(folder: Path, script: str) -> list[Any]:
    """The trees of two tasks played by the agent ``script`` (started by memrl, stopped after)."""
    from memrl.rollout.episodes import close_drivers

    (folder / "agent.py").write_text(script)
    command = [sys.executable, "-S", str(folder / "agent.py")]
    try:
        return episode_trees(TaskSetConfig(family="http_agent", count=2, params={"command": command}))
    finally:
        close_drivers()


def test_an_agent_process_that_dies_stops_the_run_saying_so(tmp_path: Path) -> None:
    with pytest.raises(
        UserCodeError,
        match=r"the HTTP agent \(.*agent.py, pid \d+\) exited with code 3 during "
        r"episode t-0--r--\w+; its output ends with:\nout of memory in the agent",
    ):
        agent_trees(tmp_path, AGENT)


SCORER = textwrap.dedent(
    """
    import json, os
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, body):
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send({})

        def do_POST(self):
            seed = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["seed"]
            self._send({"outcome": 1.5 if seed == 0 else 1.0})

    ThreadingHTTPServer(("127.0.0.1", int(os.environ["MEMRL_AGENT_PORT"])), Handler).serve_forever()
    """
)


def test_an_http_agent_score_out_of_range_fails_that_episode_only(tmp_path: Path) -> None:
    built = agent_trees(tmp_path, SCORER)
    leaves = {t.task_id: [n for n in t.nodes if n.kind == "leaf"] for t in built}
    assert [n.metadata["stats"].get("episode_bad_outcomes") for n in leaves["t-0"]] == [1]
    assert [n.outcome for n in leaves["t-1"]] == [1.0] and not leaves["t-1"][0].metadata["stats"]


# ------------------------------------------------------------------------------------------------ memory systems
class BadNotesConfig(NotesConfig):
    name: Literal["bad_notes"] = "bad_notes"


@register_memory("bad_notes", config=BadNotesConfig)
class BadNotes(NotesMemory):
    """Raises on the second turn (a parser of the user's that meets an observation it did not expect)."""

    def on_turn(self, turn: Any) -> None:
        if turn.step == 2:
            raise ValueError(f"cannot parse {turn.observation[:12]!r}")
        super().on_turn(turn)


def test_a_memory_system_that_raises_is_named_with_its_function_and_episode() -> None:
    from memrl.data.user_code import user_fault
    from memrl.rollout.loop import run_rollouts

    (task,) = load_tasks(TaskSetConfig(entry="vault_game:VaultGame", params={"corridor": 3}, count=1), "t")
    rollout = task_rollout(task, {"entry": "test_user_code_faults:BadNotes"}, seed=0)
    with pytest.raises(ValueError) as err:
        run_rollouts([rollout], engines())
    fault = user_fault(err.value)
    assert fault is not None
    assert str(fault).startswith(
        "your code raised in test_user_code_faults:BadNotes.on_turn (" + __file__ + ", line "
    ) and str(fault).endswith(") in episode 't-0' (rollout r): ValueError: cannot parse 'You are in t'")
    assert "raise ValueError" in fault.frames and "Traceback" in fault.details


# ------------------------------------------------------------------------------------------------- roles, restore
async def summarising(task: Any, memory: Any, reasoner: Any) -> float:
    await memory.generate([{"role": "user", "content": f"summarise {task.seed}"}], role="summary")
    return 1.0


def test_memory_calls_under_a_role_memory_sampling_does_not_name_are_warned(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memrl.rollout import episodes

    monkeypatch.setattr(episodes, "_WARNED_ROLES", set(), raising=False)  # warned once per process
    with caplog.at_level(logging.WARNING, logger="memrl.rollout.episodes"):
        built = episode_trees(TaskSetConfig(entry="test_user_code_faults:summarising", count=2))
    warned = [r.getMessage() for r in caplog.records if "'summary'" in r.getMessage()]
    assert len(warned) == 1  # once, not once per call
    assert "which memory.sampling does not name (it names: note): those calls are not trained" in warned[0]
    assert not any(n.kind == "memory" for t in built for n in t.nodes)  # nothing to train, as the warning says
    from memrl.train.oat_grpo import untrained_cause

    cause = untrained_cause(built, TreeConfig(branch_roles=["note"]), EXTERNAL_CFG)
    assert cause.startswith("no memory call was made under a trained role (tree.branch_roles: note)")


class ForgetfulVault(VaultGame):
    """snapshot()/restore() that do not round-trip: restore() forgets the position."""

    def snapshot(self) -> Any:
        return copy.deepcopy(self.__dict__)

    def restore(self, state: Any) -> None:
        self.__dict__.update({k: copy.deepcopy(v) for k, v in state.items() if k != "pos"})


def test_a_restore_that_does_not_restore_is_one_clear_error() -> None:
    with pytest.raises(
        ReplayMismatchError,
        match=r"snapshot/restore of episode 't-0' \(seed 0, "
        r"test_user_code_faults:ForgetfulVault\) at step \d+: after restore\(state\) on a new instance "
        r"its snapshot\(\) is .* not the state restored",
    ):
        trees_of("test_user_code_faults:ForgetfulVault", reentry="snapshot", count=1)


# -------------------------------------------------------------------------------------------- failures in metrics
async def always_raising(task: Any, memory: Any, reasoner: Any) -> float:
    if task.seed % 2:  # one fails after a memory call, the other before any call: each is a failed leaf
        await memory.generate([{"role": "user", "content": "hello"}], role="note")
    raise RuntimeError("the episode's own bug")


def test_every_episode_failing_stops_the_run_and_the_kinds_are_counted() -> None:
    from memrl.train.oat_grpo import check_collection, collection_metrics

    built = episode_trees(TaskSetConfig(entry="test_user_code_faults:always_raising", count=2))
    assert all(any(n.kind == "leaf" for n in t.nodes) for t in built)
    with pytest.raises(UserCodeError, match=r"every episode of iteration 3 failed \((\d+) of \1: episode_errors \1\)"):
        check_collection(built, 3)

    class Result:
        trees, reruns, metrics = built, 0, {}

    metrics = collection_metrics([], [Result()])
    assert metrics["episode_errors"] == metrics["leaves"] > 0
    assert metrics["env_errors"] == metrics["env_timeouts"] == metrics["episode_timeouts"] == 0  # always there


async def overscoring(task: Any, memory: Any, reasoner: Any) -> float:
    await memory.generate([{"role": "user", "content": "hello"}], role="note")
    return 1.5 if task.seed == 0 else 1.0


def test_an_out_of_range_score_fails_that_episode_only() -> None:
    built = episode_trees(TaskSetConfig(entry="test_user_code_faults:overscoring", count=2))
    leaves = {t.task_id: [n for n in t.nodes if n.kind == "leaf"] for t in built}
    assert all(n.metadata["stats"].get("episode_bad_outcomes") == 1 and n.outcome == 0 for n in leaves["t-0"])
    assert all(n.outcome == 1.0 for n in leaves["t-1"])


EXTERNAL_CFG: Any = None


def setup_module() -> None:
    global EXTERNAL_CFG
    from memrl.rollout.memory.registry import parse_memory_config

    EXTERNAL_CFG = parse_memory_config(EXTERNAL)


# --------------------------------------------------------------------------------------------- endpoint answers
def test_a_10_mb_answer_is_cut_to_max_tokens_before_anything_tokenises_it(caplog: pytest.LogCaptureFixture) -> None:
    from memrl.data.schemas import Message
    from memrl.rollout.engines import EndpointConfig, GenerationRequest, SamplingParams
    from memrl.rollout.engines.openai_engine import OpenAIEngine
    from tests.fault_server import PlanServer

    server = PlanServer()
    engine = OpenAIEngine([EndpointConfig(url=server.url("big", "huge"), model="m")], api="chat", max_retries=0)
    try:
        request = GenerationRequest(
            messages=[Message(role="user", content="where?")], sampling=SamplingParams(max_tokens=8)
        )
        with caplog.at_level(logging.WARNING, logger="memrl.rollout.engines.openai_engine"):
            (result,) = engine.generate([request, request])[:1]
    finally:
        engine.close()
        server.close()
    completion = result.completions[0]
    assert len(completion.text) == 8 * 64 and completion.finish_reason == "length"  # 64 characters a token at most
    warned = [r.getMessage() for r in caplog.records if "ignores max_tokens" in r.getMessage()]
    assert (
        len(warned) == 1
        and "answered 10,080,000 characters (0 token ids) to a request of at most 8 tokens" in warned[0]
    )


def test_a_committee_judge_no_term_weights_is_refused(tmp_path: Path) -> None:
    from memrl.data.config import ConfigError, load_config
    from memrl.train.oat_grpo import OATGRPOConfig, check_inputs

    judge = '{backend: scripted, name: judge, scripted_policy: "memrl.data.tasks.sam:SamReasoner"}'
    path = tmp_path / "c.yaml"
    path.write_text(f"policy: {{base: m}}\ncommittee: {{references: [], judge: {judge}}}\n")
    check_inputs(load_config(OATGRPOConfig, path, []))  # the default terms weight the committee: the judge is used
    cfg = load_config(OATGRPOConfig, path, ["credit.terms=[{name: length, weight: 0.1}]"])
    with pytest.raises(
        ConfigError,
        match=r"committee.judge is set but no reward term weights the committee "
        r"\(credit.terms: length\), so it would never be called",
    ):
        check_inputs(cfg)


# ---------------------------------------------------------------------------------------------------- messages
def test_a_locomo_turn_too_large_is_named_as_the_file_names_it(tmp_path: Path) -> None:
    import json

    from memrl.data.loaders.common import MAX_TURN_CHARS
    from memrl.data.loaders.formats import load_locomo

    def sample(size: int) -> dict[str, Any]:
        turns = [
            {"speaker": "A", "dia_id": "D1:1", "text": "hi"},
            {"speaker": "B", "dia_id": "D1:2", "text": "x" * size},
        ]
        conversation = {"speaker_a": "A", "speaker_b": "B", "session_1": turns}
        return {"sample_id": "s1", "conversation": conversation, "qa": []}

    path = tmp_path / "locomo.json"
    path.write_text(json.dumps([sample(MAX_TURN_CHARS - 1)]))  # the edge: speaker + text = MAX_TURN_CHARS
    load_locomo(path)
    path.write_text(json.dumps([sample(MAX_TURN_CHARS)]))
    with pytest.raises(ValueError, match=r"locomo.json:1: field 'conversation.session_1\[1\].text': a turn of "):
        load_locomo(path)


def test_resume_with_nothing_saved_yet_says_so(
    tmp_path: Path, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from memrl.data.tracking import MetricsLogger
    from memrl.train.group_trainer import GroupTrainer, GroupTrainerConfig
    from memrl.train.online import LoopConfig, OnlineLoop
    from memrl.train.policy import LoraSettings, PolicySpec

    trainer = GroupTrainer(PolicySpec(base=str(tiny_model_dir)), GroupTrainerConfig(lora=LoraSettings(r=4, alpha=8)))
    logger = MetricsLogger(tmp_path, None, {}, name="r", console=False)
    loop = OnlineLoop(
        trainer=trainer, engine=None, cfg=LoopConfig(iterations=1), run_dir=tmp_path, resume=True, logger=logger
    )
    with caplog.at_level(logging.WARNING, logger="memrl.train.online"):
        assert list(loop.start(lambda i: None, None)) == [0]
    logger.close()
    assert any(
        "--resume: no complete checkpoint was saved yet in" in r.getMessage()
        and "starting from iteration 0" in r.getMessage()
        for r in caplog.records
    )


HANGUP = """
import os, signal, sys, time
from memrl.launch import cli, shutdown

def hung_up(args):
    os.kill(os.getpid(), signal.SIGHUP)
    time.sleep(5)
    return 0

shutdown.stop_children = lambda grace_s=0: None
cli._config_show = hung_up
sys.exit(cli.main(["config", "show", "--command", "sft"]))
"""


def test_sighup_ends_a_command_like_sigterm() -> None:
    import subprocess

    done = subprocess.run([sys.executable, "-c", HANGUP], capture_output=True, text=True, timeout=120)
    assert done.returncode == 129, done.stderr[-2000:]
    assert done.stderr.strip() == "memrl: hung up (SIGHUP): stopped"


def test_a_benchmark_reuse_checks_what_it_reads_back(tmp_path: Path) -> None:
    import argparse

    from benchmarks.pivot_learning import choose_start

    folder = tmp_path / "starts" / "weak"
    folder.mkdir(parents=True)
    (folder / "dev.json").write_text('{"weights": "0123456789abcdef", "dev": {')  # cut short by a kill
    args = argparse.Namespace(reuse=True, starts=["weak"])
    with pytest.raises(SystemExit, match=r"--reuse: .*dev.json is damaged \(JSONDecodeError: .*\); delete it"):
        choose_start(None, args, tmp_path, tmp_path, [])
    (folder / "dev.json").write_text('{"weights": "0123456789abcdef", "dev": {}}')
    with pytest.raises(SystemExit, match=r"records SFT weights '0123456789abcdef' but .*final holds 'no weights'"):
        choose_start(None, args, tmp_path, tmp_path, [])


def test_a_run_stopped_by_a_reward_term_exits_2_and_leaves_no_run_folder(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """End to end through the CLI: the reward term's NaN stops the run at its first credit (exit 2, one message, not
    "unexpected error"), the run folder it created is removed and its log kept where the message says."""
    terms = '[{entry: "test_user_code_faults:nan_term", weight: 0.3}]'
    code = main(
        [
            "train", "oat-grpo", "--config", str(ROOT / "examples" / "gym_env" / "config.yaml"),
            f"policy.base={tiny_model_dir}", f"engine.model={tiny_model_dir}", f"run.output_dir={tmp_path / 'runs'}",
            "loop.iterations=1", "eval_tasks.count=1", "tasks_per_iteration=1", f"credit.terms={terms}",
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("memrl:")]
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith("memrl: error: reward term nan_term (test_user_code_faults:nan_term) on memory action")
    assert not (tmp_path / "runs").exists()
    kept = Path(err.strip().splitlines()[-1].split("the run's log is in ")[1])
    assert kept.is_file() and "weight sync check" in kept.read_text()  # the run's own log, moved out of the folder


def test_a_run_that_trains_no_memory_call_says_why_and_its_metrics_say_so(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The memory system calls the model under role 'note', the tree trains 'summary' only: the run ends, but one
    warning names the cause, and every metrics row has memory_calls_trained and the failure counts."""
    import json

    code = main(
        [
            "train", "oat-grpo", "--config", str(ROOT / "examples" / "gym_env" / "config.yaml"),
            f"policy.base={tiny_model_dir}", f"engine.model={tiny_model_dir}", f"run.output_dir={tmp_path}",
            "run.name=r", "loop.iterations=2", "eval_tasks.count=1", "tasks_per_iteration=1",
            "tree.branch_roles=[summary]",
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    warned = [line for line in err.splitlines() if "trained no memory call" in line]
    assert len(warned) == 1, err[-3000:]  # once per run
    assert (
        "iteration 0 trained no memory call (memory_calls_trained 0): no memory call was made under a trained "
        "role (tree.branch_roles: summary)"
        in warned[0]
        and "memory.sampling names note" in warned[0]
    )
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 0]
    assert len(steps) == 2
    for row in steps:
        assert row["memory_calls_trained"] == 0
        assert row["env_errors"] == row["env_timeouts"] == row["episode_errors"] == 0
