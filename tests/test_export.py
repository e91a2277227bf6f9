"""``memrl export``: LoRA merge into the base, the Hugging Face folder and model card, verification in transformers
(fast) and vLLM (slow), and the Hub push refusing to start without a token or a network."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from memrl.data.config import ConfigError
from memrl.launch.cli import main
from memrl.train.export import ExportConfig, check_hub_access, export_model, run_export


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter on the tiny model whose B matrices are non-zero (a fresh LoRA merges to the base exactly)."""
    from peft import LoraConfig, get_peft_model

    from memrl.rollout.models import load_causal_lm

    model = get_peft_model(
        load_causal_lm(tiny_model_dir),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    out = tmp_path_factory.mktemp("adapter")
    model.save_pretrained(out, safe_serialization=True)
    return out


def _config(tmp_path: Path, base: Path, adapter: Path | None, **extra: object) -> ExportConfig:
    recipe = tmp_path / "config.yaml"
    recipe.write_text("command: train oat-grpo\ntrainer:\n  lr: 1.0e-05\n")
    results = tmp_path / "summary.json"
    results.write_text(json.dumps({"success_sft": 0.25, "success_rl": 0.5, "wall_s": 12.0}))
    data = {
        "run": {"output_dir": str(tmp_path / "runs"), "name": "exp"},
        "policy": {"base": str(base), "adapter": str(adapter) if adapter else None},
        "recipe": str(recipe),
        "results": str(results),
        "verify": {"vllm": False},
        **extra,
    }
    return ExportConfig.model_validate(data)


def test_merged_export_writes_a_complete_checkpoint_that_differs_from_the_base(
    tmp_path: Path, tiny_model_dir: Path, adapter_dir: Path
) -> None:
    out = tmp_path / "model"
    checks = export_model(_config(tmp_path, tiny_model_dir, adapter_dir), out)
    assert checks["ok"] and checks["merged_adapter"]
    names = {p.name for p in out.iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "README.md",
        "memrl_export.json",
    } <= names
    assert not any(n.endswith((".bin", ".pt", ".pkl")) for n in names)
    assert "adapter_config.json" not in names  # merged: plain weights, no PEFT wrapper
    diff = checks["differs_from_base"]
    assert diff["differs"] and diff["tensors_changed"] == 4 and diff["max_abs_diff"] > 0  # q/v of 2 layers
    assert checks["transformers"]["ok"] and len(checks["transformers"]["token_ids"]) > 0
    from memrl.rollout.models import load_tokenizer

    assert load_tokenizer(out).chat_template  # the chat template travels with the export
    card = (out / "README.md").read_text()
    assert f"base_model: {tiny_model_dir}" in card and "merged into the base" in card
    assert "lr: 1.0e-05" in card and "| success_rl | 0.5 |" in card
    assert "| loads and generates in vllm | skipped |" in card
    assert json.loads((out / "memrl_export.json").read_text())["ok"] is True


def test_full_weights_without_a_reference_are_not_compared(tmp_path: Path, tiny_model_dir: Path) -> None:
    checks = export_model(
        _config(tmp_path, tiny_model_dir, None, verify={"vllm": False, "transformers": False}), tmp_path / "model"
    )
    assert checks["differs_from_base"] is None and not checks["merged_adapter"] and checks["ok"]
    same = export_model(
        _config(
            tmp_path,
            tiny_model_dir,
            None,
            reference_base=str(tiny_model_dir),
            verify={"vllm": False, "transformers": False},
        ),
        tmp_path / "model2",
    )
    assert not same["ok"] and same["failures"] == ["differs_from_base"]  # an unchanged model is caught


def test_a_failed_export_leaves_no_folder_behind(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The export is assembled in a temporary sibling folder: a failure after the weights are written leaves
    neither the export folder nor the temporary one."""
    import memrl.train.export as export

    def broken(*args: object) -> dict:
        raise RuntimeError("verification crashed")

    monkeypatch.setattr(export, "_generate_transformers", broken)
    with pytest.raises(RuntimeError, match="verification crashed"):
        export_model(
            _config(tmp_path, tiny_model_dir, None, verify={"vllm": False, "transformers": True}),
            tmp_path / "out" / "model",
        )
    assert list((tmp_path / "out").iterdir()) == []
    with pytest.raises(ConfigError, match="not empty"):  # an export never writes into a folder holding files
        (tmp_path / "taken").mkdir()
        (tmp_path / "taken" / "x").write_text("x")
        export_model(_config(tmp_path, tiny_model_dir, None), tmp_path / "taken")


def test_push_to_hub_fails_before_any_work_without_token_or_network(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="no Hugging Face token: set HF_TOKEN"):
        run_export(_config(tmp_path, tiny_model_dir, None, push_to_hub="me/memory-model"))
    assert not (tmp_path / "runs").exists()  # nothing was done
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="cannot reach the Hugging Face Hub"):
        check_hub_access("me/memory-model")
    with pytest.raises(ConfigError, match="expected a repository id"):
        check_hub_access("no-slash")
    # the CLI flag sets the config key and reports the problem as a config error (exit code 2)
    config = tmp_path / "export.yaml"
    config.write_text(f"command: export\nrun: {{output_dir: {tmp_path / 'cli'}}}\npolicy: {{base: {tiny_model_dir}}}\n")
    assert main(["export", "--config", str(config), "--push-to-hub", "me/memory-model"]) == 2
    assert "cannot reach the Hugging Face Hub" in capsys.readouterr().err
    assert not (tmp_path / "cli").exists()


# protects: an export with a merged LoRA adapter loads and generates in vLLM, its first greedy token equal to
# transformers'
@pytest.mark.slow
@pytest.mark.vllm
def test_export_loads_and_generates_in_vllm(tmp_path: Path, tiny_model_dir: Path, adapter_dir: Path) -> None:
    checks = export_model(_config(tmp_path, tiny_model_dir, adapter_dir, verify={"vllm": True}), tmp_path / "model")
    assert checks["ok"], checks["failures"]
    assert checks["vllm"]["ok"] and len(checks["vllm"]["token_ids"]) > 0
    assert checks["transformers"]["ok"] and checks["differs_from_base"]["differs"]
    # greedy decoding of the same fp32 weights: both backends start with the same token
    assert checks["vllm"]["token_ids"][0] == checks["transformers"]["token_ids"][0]
