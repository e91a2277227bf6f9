"""The open registries (memrl.data.registry and friends): built-ins register through the same decorators a user's
component does; names, import paths and protocols are checked before anything runs, each error naming the class and
what it lacks; the CLI exits 2 before any run folder exists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from memrl.data.config import ConfigError
from memrl.data.registry import REASONERS, TASK_FAMILIES, ComponentError, Registry
from memrl.data.schemas import Message
from memrl.data.tasks import DialogueTask, ProactiveTask, SamTask, TaskSetConfig
from memrl.data.tasks.proactive import ActionAgent
from memrl.data.tasks.sam import SamReasoner
from memrl.launch.cli import main
from memrl.rollout.engines import build_engine
from memrl.rollout.engines.base import (
    ENGINES,
    Completion,
    Engine,
    GenerationRequest,
    GenerationResult,
    Usage,
    register_engine,
)
from memrl.rollout.engines.config import EngineConfig, load_scripted_policy, scripted_policy_class
from memrl.rollout.engines.scripted import ScriptedEngine
from memrl.rollout.memory.base import MemorySystem, register_memory
from memrl.rollout.memory.registry import MEMORY_SYSTEMS, build_memory, parse_memory_config
from memrl.rollout.memory.sam import SamMemory
from memrl.train.oat_grpo import OATGRPOConfig, check_inputs


@pytest.fixture(autouse=True)
def _registries_as_they_were() -> Any:
    """What a test registers stays in that test: the config reference and other tests read the registries later."""
    saved = {r: dict(r._items) for r in (MEMORY_SYSTEMS, ENGINES, TASK_FAMILIES, REASONERS)}
    yield
    for registry, items in saved.items():
        registry._items.clear()
        registry._items.update(items)


def test_the_builtins_are_registered_by_their_decorators() -> None:
    families = {r.name: r.obj for r in TASK_FAMILIES.items()}
    assert families.items() >= {"sam": SamTask, "dialogue": DialogueTask, "proactive": ProactiveTask}.items()
    assert TASK_FAMILIES.get("sam").extra["reasoner"] == "sam" and TASK_FAMILIES.get("sam").extra["kind"] == "env"
    assert REASONERS.get("sam").obj is SamReasoner and REASONERS.get("action_agent").obj is ActionAgent
    assert MEMORY_SYSTEMS.get("sam").obj is SamMemory
    assert isinstance(load_scripted_policy("sam", {"max_pages": 3}), SamReasoner)
    assert scripted_policy_class("memrl.data.tasks.sam:SamReasoner") is SamReasoner


def test_unknown_names_list_what_is_registered() -> None:
    with pytest.raises(
        ValueError,
        match=r"unknown task family 'sma'; registered: dialogue, http_agent, ms_textworld, "
        r"proactive, sam",
    ):
        TaskSetConfig(family="sma")
    with pytest.raises(ConfigError, match="scripted_policy 'nobody': not a registered reasoner"):
        scripted_policy_class("nobody")
    with pytest.raises(
        ComponentError,
        match=r"cannot import module 'no_such_pkg\.memory' "
        r"\(No module named 'no_such_pkg'\)",
    ):
        parse_memory_config({"entry": "no_such_pkg.memory:Mine"})


def test_a_name_is_taken_once() -> None:
    registry: Registry[Any] = Registry("thing")
    registry.register("a", SamTask)
    registry.register("a", SamTask)  # the same object again (a module imported twice) is fine
    with pytest.raises(ComponentError, match=r"thing 'a' is already registered by memrl\.data\.tasks\.sam:SamTask"):
        registry.register("a", ProactiveTask)


def test_a_memory_system_missing_a_method_is_refused_when_it_registers() -> None:
    with pytest.raises(
        ComponentError,
        match=r"test_registries:.*Half does not implement the memory system protocol: "
        r"missing method 'reasoner_messages'",
    ):

        @register_memory("half")
        class Half(MemorySystem):
            def reset(self, task: str, metadata: dict[str, Any]) -> None: ...

            def on_turn(self, turn: Any) -> None: ...

    with pytest.raises(ComponentError, match=r"must subclass memrl\.api\.MemorySystem"):

        @register_memory("duck")
        class Duck:
            def reset(self) -> None: ...

            def on_turn(self) -> None: ...

            def reasoner_messages(self) -> None: ...


def test_a_user_memory_system_without_config_and_without_a_config_argument() -> None:
    @register_memory("test_plain")
    class Plain(MemorySystem):
        def __init__(self) -> None:
            super().__init__()

        def reset(self, task: str, metadata: dict[str, Any]) -> None: ...

        def on_turn(self, turn: Any) -> None: ...

        def reasoner_messages(self, system_prompt: str) -> list[Any]:
            return []

    assert isinstance(build_memory({"name": "test_plain"}), Plain)


def test_recipe_checks_name_what_a_user_family_lacks(tmp_path: Path) -> None:
    base = {"policy": {"base": "m"}, "train_tasks": {"entry": "vault_game:VaultGame"}}
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "gym_env"))
    cfg = OATGRPOConfig.model_validate({**base, "memory": {"name": "long_context"}, "credit": {"terms": []}})
    with pytest.raises(ConfigError, match="family 'gym' has no registered reasoner: set reasoner"):
        check_inputs(cfg)
    cfg = OATGRPOConfig.model_validate(
        {
            **base,
            "memory": {"name": "long_context"},
            "reasoner": {"backend": "scripted", "scripted_policy": "components:Nobody"},
        }
    )
    with pytest.raises(ConfigError, match="reasoner: reasoner 'components:Nobody': module 'components' has no"):
        check_inputs(cfg)
    player = {"backend": "scripted", "scripted_policy": "components:VaultPlayer"}
    cfg = OATGRPOConfig.model_validate({**base, "memory": {"name": "long_context"}, "reasoner": player})
    with pytest.raises(
        ConfigError, match="the committee term needs reference engines, and task family 'gym' has no oracle"
    ):
        check_inputs(cfg)
    assert cfg.eval_tasks.entry == "vault_game:VaultGame"  # the eval set takes the training family


def test_the_cli_exits_2_before_any_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "halfmem.py").write_text(
        "from memrl.api import MemorySystem, register_memory\n\n"
        "@register_memory('halfmem')\nclass HalfMem(MemorySystem):\n"
        "    def reset(self, task, metadata): ...\n    def on_turn(self, turn): ...\n"
    )
    config = tmp_path / "config.yaml"
    config.write_text(
        f"policy: {{base: x}}\nrun: {{output_dir: {tmp_path / 'runs'}}}\nmemory: {{entry: 'halfmem:HalfMem'}}\n"
    )
    assert main(["train", "oat-grpo", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "halfmem:HalfMem does not implement the memory system protocol: missing method 'reasoner_messages'" in err
    assert not (tmp_path / "runs").exists()


class EchoEngine(Engine):
    """A user's engine: replies with the last message, named by import path or registered name."""

    name = "echo"

    @classmethod
    def from_config(cls, cfg: EngineConfig) -> EchoEngine:
        engine = cls()
        engine.name = cfg.engine_name
        return engine

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return [
            GenerationResult([], [Completion([], [], req.messages[-1].content, "stop")], Usage(), self.name)
            for req in requests
        ]


def test_engines_are_registered_components() -> None:
    assert build_engine(EngineConfig(backend="scripted", scripted_policy="sam")).__class__.__name__ == "ScriptedEngine"
    assert ENGINES.get("scripted").obj is ScriptedEngine
    with pytest.raises(ValidationError, match=r"unknown engine backend 'vlm'; registered: hf, openai, scripted, vllm"):
        EngineConfig(backend="vlm", model="m")
    by_path = build_engine(EngineConfig(backend="test_registries:EchoEngine", name="mine"))
    assert isinstance(by_path, EchoEngine) and by_path.name == "mine"
    register_engine("test_echo")(EchoEngine)
    reply = build_engine(EngineConfig(backend="test_echo")).generate(
        [GenerationRequest([Message(role="user", content="hi")])]
    )
    assert reply[0].completions[0].text == "hi"
    with pytest.raises(ValueError, match="a policy object only applies to the scripted backend, not 'test_echo'"):
        build_engine(EngineConfig(backend="test_echo"), policy=SamReasoner())
    with pytest.raises(ComponentError, match=r"engine .*Duck must subclass Engine"):

        @register_engine("duck")
        class Duck:
            @classmethod
            def from_config(cls, cfg: Any) -> None: ...

            def generate(self, requests: Any) -> None: ...
