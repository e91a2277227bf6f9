"""The SFT stage on the tiny model: the loss mask TRL trains with, the loss going down, resume, the saved outputs,
mixtures and configs. The 2-process DeepSpeed runs are the slow tests at the end; the adapter it saves is served by
vLLM in tests/test_engines_vllm.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from benchmarks.sft_tiny import traces
from memrl.data.config import ConfigError, load_config
from memrl.data.distill import distill_traces
from memrl.data.formats import (
    render_intervention,
    render_phase1_prompt,
    render_phase2_prompt,
    render_sam_consolidate_prompt,
    render_sam_recall_prompt,
    render_tool_call,
)
from memrl.data.io import write_jsonl
from memrl.data.schemas import EpisodeTrace, Message, SFTExample
from memrl.train.sft import SFTRunConfig, build_sft_trainer, latest_checkpoint, run_sft, sft_args
from memrl.train.sft_data import mix_rows
from tests.commands import cpu_torchrun

ROOT = Path(__file__).resolve().parents[1]
COLORS = ["red", "blue", "green", "brass", "silver", "golden", "black", "white"]
ITEMS = ["key", "gem", "coin", "book", "lamp", "map"]
PLACES = ["drawer", "chest", "box", "shelf", "cabinet"]


def _m(raw: list[dict[str, str]]) -> list[Message]:
    return [Message(**m) for m in raw]


def sam_traces(n: int, seed: int = 0) -> list[EpisodeTrace]:
    """The SFT benchmark's correct expert traces, over a smaller vocabulary and turns up to 60."""
    return traces(n, seed, colors=COLORS, items=ITEMS, places=PLACES, last_turn=60)


def every_role_rows() -> list[SFTExample]:
    """Rows of every memory role, plus an unnamed role, an empty Phase 1 output and a prompt that already holds an
    assistant turn (which must stay out of the loss)."""
    bank = "status: fixing the build\nknowledge:\nk1: tests live in tests/\nprocedural: none"
    window = "[step 3] action: make test\nerror: missing module yaml"
    raw = [
        (
            "consolidate",
            render_sam_consolidate_prompt(4, "t4> open chest 7\nthe brass key is in chest 7"),
            "brass key, chest 7",
        ),
        (
            "recall",
            render_sam_recall_prompt("where is the brass key?", 4, "t4> open chest 7\nthe brass key is in chest 7", ""),
            "the brass key is in chest 7",
        ),
        (
            "bank_edit",
            render_phase1_prompt("fix the build", window, bank),
            render_tool_call("memory_save_knowledge", {"content": "yaml is missing: pip install pyyaml"})
            + render_tool_call("memory_delete", {"id": "k1"}, style="xml"),
        ),
        ("bank_edit", render_phase1_prompt("fix the build", "", bank), ""),
        (
            "intervene",
            render_phase2_prompt("fix the build", window, bank),
            render_intervention("install pyyaml before rerunning the tests"),
        ),
        ("intervene", render_phase2_prompt("fix the build", "", bank), render_intervention(None)),
        (
            "summarize",
            [
                {"role": "user", "content": "summarize: a b c"},
                {"role": "assistant", "content": "old reply"},
                {"role": "user", "content": "again, shorter"},
            ],
            "a-c",
        ),
    ]
    return [
        SFTExample(row_id=f"x{i}", role=role, messages=[*_m(msgs), Message(role="assistant", content=target)])
        for i, (role, msgs, target) in enumerate(raw)
    ]


def make_cfg(model_dir: Path, out: Path, name: str, **sections: Any) -> SFTRunConfig:
    data = {"roles": ["consolidate", "recall"], **sections.pop("data", {})}
    train = {
        "max_steps": 6,
        "batch_size": 8,
        "lr": 2e-3,
        "warmup": 0.1,
        "logging_steps": 1,
        "save_steps": 0,
        "max_length": 256,
        "progress": False,
        **sections.pop("train", {}),
    }
    return SFTRunConfig.model_validate(
        {
            "run": {"output_dir": str(out), "name": name, **sections.pop("run", {})},
            "model": {"base": str(model_dir)},
            "lora": sections.pop("lora", {"enabled": False}),
            "data": data,
            "train": train,
            **sections,
        }
    )


def metrics_of(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def sam_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `memrl data distill`-style directory: consolidate.jsonl / recall.jsonl (+ Arrow) from expert traces."""
    out = tmp_path_factory.mktemp("distilled")
    distill_traces(sam_traces(200), out, progress=False)
    return out


# ----------------------------------------------------------------------------------------------------------------
# (a) the loss mask


def test_loss_mask_is_exactly_the_final_assistant_span(tiny_model_dir: Path, tmp_path: Path) -> None:
    rows = every_role_rows()
    files = {}
    for role in sorted({r.role for r in rows}):
        files[role] = str(write_jsonl(tmp_path / f"{role}.jsonl", [r for r in rows if r.role == role]))
    cfg = make_cfg(
        tiny_model_dir, tmp_path, "mask", data={"roles": sorted(files), "files": files}, train={"batch_size": 3}
    )
    trainer = build_sft_trainer(cfg, sft_args(cfg, tmp_path / "ckpt", False), rows)
    tok = trainer.processing_class
    im_start, im_end = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    seen: Counter[str] = Counter()
    for batch in trainer.get_train_dataloader():  # the collated batches TRL trains on
        for ids, labels, attn in zip(batch["input_ids"], batch["labels"], batch["attention_mask"], strict=True):
            ids, labels = ids.tolist(), labels.tolist()
            n = int(attn.sum())
            assert all(lbl == -100 for lbl in labels[n:])  # padding
            start_tag = max(i for i in range(n) if ids[i] == im_start)
            begin = next(p for p in range(start_tag + 1, n) if tok.decode(ids[start_tag + 1 : p]) == "assistant\n")
            end = max(i for i in range(n) if ids[i] == im_end)
            assert tok.decode(ids[end + 1 : n]).strip("\n") == ""  # only the template's newline follows
            expected = [ids[i] if begin <= i <= end else -100 for i in range(n)]
            assert labels[:n] == expected
            seen[tok.decode(ids[begin:end])] += 1
    assert seen == Counter(r.messages[-1].content for r in rows)
    assert Counter(r.role for r in rows).keys() == {"consolidate", "recall", "bank_edit", "intervene", "summarize"}


# ----------------------------------------------------------------------------------------------------------------
# (b) the loss goes down, and the saved model is a loadable checkpoint


def test_sft_lowers_the_loss_and_saves_full_weights(tiny_model_dir: Path, sam_dir: Path, tmp_path: Path) -> None:
    from memrl.rollout.models import load_causal_lm, load_tokenizer

    cfg = make_cfg(
        tiny_model_dir,
        tmp_path,
        "full",
        data={"dir": str(sam_dir), "eval_fraction": 0.05, "max_eval_rows": 8},
        train={"max_steps": 15, "batch_size": 8, "logging_steps": 5},
        run={"wandb": {"enabled": True, "mode": "offline"}},
    )
    assert run_sft(cfg) == 0
    run_dir = tmp_path / "full"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["global_step"] == 15
    assert summary["eval_loss_after"] < 0.75 * summary["eval_loss_before"]
    assert summary["last_logged_loss"] < 0.75 * summary["first_logged_loss"]
    final = run_dir / "final"
    info = json.loads((final / "memrl_sft.json").read_text())
    assert info["kind"] == "full" and info["base"] == str(tiny_model_dir) and info["global_step"] == 15
    assert (final / "model.safetensors").exists() and not list(final.glob("*.bin"))
    tok = load_tokenizer(final)
    assert "{% generation %}" in tok.chat_template.replace("{%-", "{%")
    trained, base = load_causal_lm(final).state_dict(), load_causal_lm(tiny_model_dir).state_dict()
    assert set(trained) == set(base)
    assert any(not torch.equal(trained[k], base[k]) for k in base)
    logged = metrics_of(run_dir)
    assert [m["step"] for m in logged if "loss" in m] == [1, 5, 10, 15]
    assert (run_dir / "config.yaml").exists()
    assert list((run_dir / "wandb").glob("offline-run-*"))  # wandb logged offline, no network needed


# ----------------------------------------------------------------------------------------------------------------
# (c) resume


class _Killed(Exception):
    pass


def _kill_at(step: int) -> Any:
    from transformers import TrainerCallback

    class Kill(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == step:
                raise _Killed

    return Kill()


def test_resume_continues_to_the_same_final_step(tiny_model_dir: Path, sam_dir: Path, tmp_path: Path) -> None:
    common = {
        "data": {"dir": str(sam_dir)},
        "lora": {"enabled": True, "r": 8, "alpha": 16},
        "train": {"max_steps": 6, "batch_size": 4, "save_steps": 2},
    }
    run_sft(make_cfg(tiny_model_dir, tmp_path, "straight", **common))

    with pytest.raises(_Killed):
        run_sft(make_cfg(tiny_model_dir, tmp_path, "killed", **common), callbacks=[_kill_at(5)])
    ckpts = tmp_path / "killed" / "checkpoints"
    assert latest_checkpoint(ckpts).name == "checkpoint-4"
    torn = ckpts / "checkpoint-6"  # a kill in the middle of saving: no trainer_state.json
    shutil.copytree(ckpts / "checkpoint-4", torn)
    (torn / "trainer_state.json").unlink()
    assert latest_checkpoint(ckpts).name == "checkpoint-4"
    with pytest.raises(ConfigError, match="--resume"):
        run_sft(make_cfg(tiny_model_dir, tmp_path, "killed", **common))

    run_sft(make_cfg(tiny_model_dir, tmp_path, "killed", run={"resume": True}, **common))
    summary = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert summary["global_step"] == 6 and summary["steps_this_run"] == 2
    assert summary["resumed_from"] == "checkpoint-4"
    state = json.loads((ckpts / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    # The same data order, optimizer and RNG state: the resumed run ends where the uninterrupted one does.
    straight = load_file(tmp_path / "straight" / "final" / "adapter_model.safetensors")
    resumed = load_file(tmp_path / "killed" / "final" / "adapter_model.safetensors")
    assert straight.keys() == resumed.keys()
    for key in straight:
        torch.testing.assert_close(resumed[key], straight[key], rtol=1e-4, atol=1e-6)
    losses = {m["step"]: m["loss"] for m in metrics_of(tmp_path / "killed") if "loss" in m}
    reference = {m["step"]: m["loss"] for m in metrics_of(tmp_path / "straight") if "loss" in m}
    assert sorted(losses) == list(range(1, 7))  # steps redone after the kill are logged once
    assert losses == pytest.approx(reference, rel=1e-4)
    info = json.loads((tmp_path / "killed" / "final" / "memrl_sft.json").read_text())
    assert info["kind"] == "lora" and info["base_dir"] == str(tiny_model_dir.resolve())


def test_a_run_in_sittings_stops_at_its_step_and_resumes_to_the_same_final_weights(
    tiny_model_dir: Path, sam_dir: Path, tmp_path: Path
) -> None:
    """``train.stop_at_step`` ends a sitting with a checkpoint of that step (off the save_steps grid), no final
    model and no summary (so ``--resume`` goes on, with another stop step); the last sitting ends where one
    uninterrupted run does."""
    common = {"data": {"dir": str(sam_dir)}, "lora": {"enabled": True, "r": 8, "alpha": 16}}
    train = {"max_steps": 6, "batch_size": 4, "save_steps": 0}
    run_sft(make_cfg(tiny_model_dir, tmp_path, "straight", train=train, **common))
    run_dir = tmp_path / "sittings"
    for sitting, stop in enumerate((3, 5, None)):
        cfg = make_cfg(
            tiny_model_dir,
            tmp_path,
            "sittings",
            run={"resume": sitting > 0},
            train={**train, "stop_at_step": stop},
            **common,
        )
        run_sft(cfg)
        if stop is not None:
            assert latest_checkpoint(run_dir / "checkpoints").name == f"checkpoint-{stop}"
            assert not (run_dir / "final").exists() and not (run_dir / "summary.json").exists()
    assert json.loads((run_dir / "summary.json").read_text())["resumed_from"] == "checkpoint-5"
    straight = load_file(tmp_path / "straight" / "final" / "adapter_model.safetensors")
    resumed = load_file(run_dir / "final" / "adapter_model.safetensors")
    for key in straight:
        torch.testing.assert_close(resumed[key], straight[key], rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# mixtures and configs


def test_role_mixtures(tmp_path: Path) -> None:
    def role_rows(role: str, answer: str, count: int) -> list[SFTExample]:
        chat = _m([{"role": "user", "content": "q"}, {"role": "assistant", "content": answer}])
        return [SFTExample(row_id=f"{role}{i}", role=role, messages=chat) for i in range(count)]

    rows = {"a": role_rows("a", "x", 10), "b": role_rows("b", "y", 40)}
    assert [r.row_id for r in mix_rows(rows, None, None, 0)] == [f"a{i}" for i in range(10)] + [
        f"b{i}" for i in range(40)
    ]
    mixed = mix_rows(rows, {"a": 3.0, "b": 1.0}, None, 0)
    counts = Counter(r.role for r in mixed)
    assert counts == {"a": round(50 * 0.75), "b": round(50 * 0.25)}
    assert Counter(r.row_id for r in mixed if r.role == "a").most_common(1)[0][1] <= 4  # repeats spread evenly
    assert len({r.row_id for r in mixed if r.role == "b"}) == counts["b"]  # a subsample has no duplicates
    assert mixed == mix_rows(rows, {"a": 3.0, "b": 1.0}, None, 0)
    assert len(mix_rows(rows, {"a": 1.0, "b": 1.0}, 8, 1)) == 8


def test_config_errors(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no dataset for roles"):
        make_cfg(tiny_model_dir, tmp_path, "x")
    with pytest.raises(ValueError, match="set from the memrl config"):
        make_cfg(tiny_model_dir, tmp_path, "x", data={"dir": "d"}, train={"sft_args": {"learning_rate": 1.0}})
    with pytest.raises(ValueError, match="positive"):
        make_cfg(tiny_model_dir, tmp_path, "x", data={"dir": "d", "roles": {"recall": 0.0}})
    cfg = make_cfg(tiny_model_dir, tmp_path, "x", data={"dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="not found"):
        run_sft(cfg)
    cfg = make_cfg(
        tiny_model_dir, tmp_path, "x", data={"dir": "d"}, train={"batch_size": 6, "per_device_batch_size": 4}
    )
    with pytest.raises(ConfigError, match="not a multiple"):
        sft_args(cfg, tmp_path, False)
    cfg = make_cfg(tiny_model_dir, tmp_path, "x", data={"dir": "d"}, train={"sft_args": {"no_such_field": 1}})
    with pytest.raises(ConfigError, match="no_such_field"):
        sft_args(cfg, tmp_path, False)


@pytest.mark.parametrize("name", ["sft_tiny.yaml", "sft_sam_qwen3.5-9b.yaml", "sft_proactive_qwen3.5-27b.yaml"])
def test_shipped_configs_load(name: str) -> None:
    cfg = load_config(SFTRunConfig, ROOT / "configs" / name)
    assert cfg.command == "sft"
    if cfg.train.deepspeed:
        assert (ROOT / cfg.train.deepspeed).is_file()


# ----------------------------------------------------------------------------------------------------------------
# (d) 2 processes under torchrun with DeepSpeed ZeRO-2 on CPU


def _cli(args: list[str], env: dict[str, str], nproc: int = 1) -> subprocess.CompletedProcess[str]:
    """``memrl sft`` in this process's interpreter: plainly for 1 process, through launch/torchrun.sh on CPU for more
    (the path the docs give for CPU runs: gloo, DS_ACCELERATOR=cpu)."""
    if nproc > 1:
        cmd = [*cpu_torchrun(nproc), "sft", *args]
    else:
        cmd = [sys.executable, "-m", "memrl.launch.cli", "sft", *args]
    proc = subprocess.run(
        cmd, cwd=ROOT, env={**env, "MEMRL_PYTHON": sys.executable}, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    if nproc > 1:
        # The launcher's plan, printed before it starts the processes.
        assert f"world: 1 node(s) x {nproc} process(es) = {nproc} ranks on CPU" in proc.stdout
    return proc


def _final_weights(final: Path) -> dict[str, torch.Tensor]:
    name = "adapter_model.safetensors" if (final / "adapter_config.json").exists() else "model.safetensors"
    return load_file(final / name)


# protects: sft (the HF Trainer under DeepSpeed) with 2 real processes equals 1 process: ZeRO-2 full weights and ZeRO-3
# LoRA
@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize(
    ("deepspeed", "lora"), [("zero2_cpu", "false"), ("zero3_cpu", "true")], ids=["zero2-full", "zero3-lora"]
)
def test_two_process_deepspeed_matches_one_process(
    tiny_model_dir: Path, sam_dir: Path, tmp_path: Path, deepspeed: str, lora: str
) -> None:
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
        "PYTHONPATH": str(ROOT),
    }
    common = [
        f"model.base={tiny_model_dir}",
        f"data.dir={sam_dir}",
        "data.roles=[consolidate, recall]",
        f"lora.enabled={lora}",
        "lora.r=8",
        "lora.alpha=16",
        "train.max_steps=2",
        "train.batch_size=8",
        "train.lr=2e-3",
        "train.warmup=0",
        "train.logging_steps=1",
        "train.save_steps=0",
        "train.progress=false",
        f"run.output_dir={tmp_path}",
    ]
    _cli([*common, "run.name=one"], env)
    _cli([*common, "run.name=two", f"train.deepspeed=configs/deepspeed/{deepspeed}.json"], env, nproc=2)
    one, two = metrics_of(tmp_path / "one"), metrics_of(tmp_path / "two")
    losses_one = {m["step"]: m["loss"] for m in one if "loss" in m}
    losses_two = {m["step"]: m["loss"] for m in two if "loss" in m}
    assert losses_two[1] == pytest.approx(losses_one[1], rel=1e-4)  # the first step sees the same 8 rows
    assert losses_two[2] == pytest.approx(losses_one[2], rel=1e-3)  # after one identical update
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_step"] == 2
    # The sharded run saves whole tensors (gathered), equal to the 1-process run's up to summation order (Adam
    # moves each weight by about lr = 2e-3 per step, whatever the gradient's size).
    saved_one, saved_two = _final_weights(tmp_path / "one" / "final"), _final_weights(tmp_path / "two" / "final")
    assert saved_one.keys() == saved_two.keys()
    for key in saved_one:
        torch.testing.assert_close(saved_two[key], saved_one[key], rtol=0, atol=2e-4)
