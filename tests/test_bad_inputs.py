"""The bad-input corpus: every command against every class of bad input (config values, data records, model and
adapter paths, output folders, resume targets). Each case must exit 2 with one paragraph naming the file, key or path,
print no traceback, and leave the file system as it was.

The cases run the real CLI in-process (``memrl.launch.cli.main``) with the commands' runners replaced by a sentinel, so
a case that got past the checks fails loudly instead of starting a run: the checks must come before anything is created.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from memrl.launch import jobs
from memrl.launch.cli import main
from memrl.launch.jobs import JOBS

COMMANDS = [" ".join(j.path) for j in JOBS]


class RunnerReached(RuntimeError):
    """A bad input got past every check."""


def _snapshot(*roots: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                path = Path(dirpath) / name
                st = path.lstat()
                out[str(path)] = (st.st_size, st.st_mtime_ns if path.is_file() else 0)
    return out


def _temp_logs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("memrl-*.log")}


# ----------------------------------------------------------------------------------------------------------------
# workspace: valid inputs and broken copies


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict[str, Path]:
    from memrl.data.config import load_config
    from memrl.data.synth import SynthConfig, run_synth

    root = tmp_path_factory.mktemp("bad-inputs")
    files: dict[str, Path] = {"root": root, "tiny": tiny_model_dir}
    for family, params in (("sam", "{horizon_steps: 12}"), ("proactive", "{n_subtasks: 10}")):
        cfg = load_config(
            SynthConfig,
            None,
            [
                f"sources=[{{family: {family}, count: 8, params: {params}}}]",
                "eval_fraction=0.25",
                "arrow=false",
                f"run.output_dir={root}",
                f"run.name=synth-{family}",
            ],
        )
        assert run_synth(cfg) == 0
        files[family] = root / f"synth-{family}" / "train.jsonl"
    good = files["sam"].read_text().splitlines()
    assert len(good) >= 6

    def write(name: str, text: str) -> Path:
        path = root / "inputs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    files["truncated"] = write("truncated.jsonl", "\n".join([*good[:5], good[5][: len(good[5]) // 2]]) + "\n")
    files["not_json"] = write("not_json.jsonl", good[0] + "\nthis is not json\n")
    bad_field = json.loads(good[1])
    bad_field["episode_id"] = 17
    files["bad_field"] = write("bad_field.jsonl", good[0] + "\n" + json.dumps(bad_field) + "\n")
    files["not_object"] = write("not_object.jsonl", "[1, 2, 3]\n")
    files["empty"] = write("empty.jsonl", "")
    files["garbage"] = write("garbage.json", "{{{ nope")
    files["sft_role"] = write(
        "sft/recall.jsonl",
        json.dumps(
            {
                "row_id": "r1",
                "role": "recall",
                "messages": [
                    {"role": "user", "content": "where is the key?"},
                    {"role": "assistant", "content": "drawer 5"},
                ],
            }
        )
        + "\n",
    )
    files["sft_bad"] = write(
        "sft_bad/recall.jsonl",
        files["sft_role"].read_text() + json.dumps({"row_id": "r2", "role": "recall", "messages": []}) + "\n",
    )
    files["sft_empty"] = write("sft_empty/recall.jsonl", "")
    files["afile"] = write("afile.txt", "a file, not a folder\n")
    files["yaml_error"] = write("broken.yaml", "run:\n  name: x\n  seed: [1, 2\nloop: {iterations: 1}\n")
    files["yaml_list"] = write("list.yaml", "- 1\n- 2\n")
    files["results"] = write("results.json", json.dumps({"success": 0.5}))
    files["yaml_duplicate"] = write("duplicate.yaml", "run:\n  seed: 1\n  seed: 2\n")
    files["yaml_tag"] = write("tag.yaml", "run:\n  name: !!python/object/apply:os.system ['touch pwned']\n")
    files["yaml_bomb"] = write(
        "bomb.yaml",
        "a: &a [x, x, x, x, x, x, x, x, x]\n"
        + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)),
    )
    (root / "nomodel").mkdir()
    (root / "inputs" / "nomodel.txt").write_text("x")
    lora = root / "lora_no_weights"
    lora.mkdir()
    (lora / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    files["lora_no_weights"] = lora
    (root / "lora_no_config").mkdir()
    (root / "lora_no_config" / "adapter_model.safetensors").write_bytes(b"")
    files["lora_no_config"] = root / "lora_no_config"

    # model folders that are not what they claim (copies of the tiny model, one thing broken in each)
    def model_copy(name: str) -> Path:
        folder = root / "models" / name
        shutil.copytree(tiny_model_dir, folder)
        return folder

    weights = model_copy("truncated-weights") / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    files["truncated_weights"] = weights.parent
    (model_copy("empty-weights") / "model.safetensors").write_bytes(b"")
    files["empty_weights"] = root / "models" / "empty-weights"
    (model_copy("garbage-config") / "config.json").write_text("{not json")
    files["garbage_config"] = root / "models" / "garbage-config"
    no_tok = model_copy("no-tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (no_tok / name).unlink()
    files["no_tokenizer"] = no_tok
    import torch
    from safetensors.torch import save_file

    other = root / "lora_other_base"  # a LoRA adapter trained on a base with another hidden size
    other.mkdir()
    (other / "adapter_config.json").write_text(
        json.dumps({"r": 4, "peft_type": "LORA", "base_model_name_or_path": "/elsewhere/other-base"})
    )
    save_file(
        {
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 96),
            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(96, 4),
        },
        str(other / "adapter_model.safetensors"),
    )
    files["lora_other_base"] = other
    garbage_lora = root / "lora_garbage_weights"
    garbage_lora.mkdir()
    (garbage_lora / "adapter_config.json").write_text(json.dumps({"r": 4, "peft_type": "LORA"}))
    (garbage_lora / "adapter_model.safetensors").write_bytes(b"\xff" * 64)
    files["lora_garbage_weights"] = garbage_lora
    sft_line = json.loads(files["sft_role"].read_text())
    sft_line["messages"][-1]["content"] = "  "
    files["sft_empty_target"] = write(
        "sft_empty_target/recall.jsonl", files["sft_role"].read_text() + json.dumps(sft_line) + "\n"
    )
    stray = json.loads(files["sft_role"].read_text())
    stray["role"] = "consolidate"
    files["sft_stray_role"] = write(
        "sft_stray_role/recall.jsonl", files["sft_role"].read_text() + json.dumps(stray) + "\n"
    )
    episode = json.loads(good[0])
    files["no_turns"] = write("no_turns.jsonl", good[1] + "\n" + json.dumps({**episode, "trajectory": []}) + "\n")
    files["no_questions"] = write("no_questions.jsonl", good[1] + "\n" + json.dumps({**episode, "qa_pairs": []}) + "\n")
    existing = root / "runs" / "taken"
    existing.mkdir(parents=True)
    (existing / "config.yaml").write_text("command: x\n")
    files["runs"] = root / "runs"
    # runs to resume, saved as each resumable command saves its config: one finished, one whose checkpoints are gone
    from memrl.data.config import write_resolved_config

    for job in JOBS:
        if not job.resumable:
            continue
        command = " ".join(job.path)
        for state in ("finished", "gone"):
            name = f"{command.replace(' ', '-')}-{state}"
            cfg = load_config(
                job.load("config"), None, [*_base(command, {**files, "runs": root / "runs"}), f"run.name={name}"]
            )
            (root / "runs" / name).mkdir(parents=True)
            write_resolved_config(cfg, root / "runs" / name)
            if state == "finished":
                (root / "runs" / name / "summary.json").write_text("{}\n")
            else:  # the journal of saved checkpoints lists two; the checkpoints folder is gone
                (root / "runs" / name / "checkpoints.log").write_text("checkpoint-2\ncheckpoint-4\n")
    export_out = root / "export-out"
    export_out.mkdir()
    (export_out / "model.safetensors").write_text("old")
    files["export_out"] = export_out
    return files


def _base(command: str, ws: dict[str, Path]) -> list[str]:
    """A valid config for each command (as overrides) that a case then breaks in one place."""
    tiny, runs = ws["tiny"], ws["runs"]
    engine = f"engine={{backend: hf, model: {tiny}}}"
    return {
        "quickstart": [f"run.output_dir={runs}", f"model_cache={ws['root']}/cache", "distill_tasks=4"],
        "data synth": [f"run.output_dir={runs}", "sources=[{family: sam, count: 2}]"],
        "data distill": [f"run.output_dir={runs}", "tasks.count=4", f"tokenizer={tiny}"],
        "train oat-grpo": [
            f"run.output_dir={runs}",
            f"policy.base={tiny}",
            engine,
            "train_tasks.count=4",
            "eval_tasks.count=2",
            "tasks_per_iteration=2",
            "loop.iterations=1",
        ],
        "sft": [
            f"run.output_dir={runs}",
            f"model.base={tiny}",
            f"data.dir={ws['sft_role'].parent}",
            "data.roles=[recall]",
            "train.max_steps=1",
        ],
        "train pivot-grpo": [
            f"run.output_dir={runs}",
            f"policy.base={tiny}",
            engine,
            "train_tasks.count=2",
            "eval_tasks.count=2",
            "loop.iterations=1",
        ],
        "eval": [f"run.output_dir={runs}", "datasets=[{name: d, kind: ama_synthetic}]"],
        "export": [f"run.output_dir={runs}", f"policy.base={tiny}", "verify.vllm=false"],
    }[command]


def _cases(ws: dict[str, Path]) -> Iterator[tuple[str, list[str], list[str]]]:
    """(case id, argv, substrings the message must hold)."""
    root, tiny = ws["root"], ws["tiny"]
    missing = root / "no" / "such" / "model"
    for command in COMMANDS:
        job = next(j for j in JOBS if " ".join(j.path) == command)
        argv = [*job.path]
        base = _base(command, ws)
        yield f"{command}/unknown-key", [*argv, *base, "run.nmae=x"], ["run.nmae", "run.name"]
        yield f"{command}/wrong-type", [*argv, *base, "run.seed=abc"], ["run.seed"]
        yield f"{command}/missing-config", [*argv, "--config", str(root / "nope.yaml")], ["nope.yaml"]
        yield f"{command}/yaml-syntax", [*argv, "--config", str(ws["yaml_error"])], ["broken.yaml:"]
        yield f"{command}/yaml-not-mapping", [*argv, "--config", str(ws["yaml_list"])], ["list.yaml", "mapping"]
        yield f"{command}/config-is-folder", [*argv, "--config", str(root)], [str(root)]
        yield f"{command}/output-under-file", [*argv, *base, f"run.output_dir={ws['afile']}/runs"], ["afile.txt"]
        yield f"{command}/output-is-file", [*argv, *base, f"run.output_dir={ws['afile']}"], ["afile.txt"]
        yield f"{command}/run-exists", [*argv, *base, "run.name=taken"], ["taken", "--resume"]
        if job.resumable:
            yield f"{command}/resume-missing", [*argv, *base, "run.name=takne", "--resume"], ["takne", "taken"]
            yield f"{command}/resume-unnamed", [*argv, *base, "--resume"], ["run.name", "taken"]
            # resume that guesses: a finished run, a changed config, every checkpoint gone
            slug = command.replace(" ", "-")
            yield (
                f"{command}/resume-finished",
                [*argv, *base, f"run.name={slug}-finished", "--resume"],
                ["is finished", "summary.json"],
            )
            yield (
                f"{command}/resume-changed",
                [*argv, *base, f"run.name={slug}-gone", "run.seed=777", "--resume"],
                ["run.seed", "--allow-config-change run.seed"],
            )
            yield (
                f"{command}/resume-checkpoints-gone",
                [*argv, *base, f"run.name={slug}-gone", "--resume"],
                ["every checkpoint of run", "checkpoint-2, checkpoint-4", "checkpoints.log"],
            )
        # numbers that are not numbers, YAML that is not data, paths that leave the output folder
        yield f"{command}/seed-bool", [*argv, *base, "run.seed=true"], ["run.seed", "boolean"]
        yield f"{command}/seed-huge", [*argv, *base, f"run.seed={2**70}"], ["run.seed"]
        yield f"{command}/seed-inf", [*argv, *base, "run.seed=.inf"], ["run.seed"]
        yield (
            f"{command}/yaml-duplicate-key",
            [*argv, "--config", str(ws["yaml_duplicate"])],
            ["duplicate.yaml:3", "duplicate key 'seed'"],
        )
        yield f"{command}/yaml-python-tag", [*argv, "--config", str(ws["yaml_tag"])], ["tag.yaml:2", "refused"]
        yield f"{command}/yaml-alias-bomb", [*argv, "--config", str(ws["yaml_bomb"])], ["bomb.yaml", "alias"]
        yield f"{command}/override-tag", [*argv, *base, "run.name=!!python/name:os.system"], ["refused"]
        yield f"{command}/name-escapes", [*argv, *base, "run.name=../escape"], ["run.name", "single folder name"]
        yield f"{command}/name-nested", [*argv, *base, "run.name=a/b"], ["run.name"]
        yield f"{command}/name-dot", [*argv, *base, "run.name=."], ["run.name"]
    yield "config show/yaml-syntax", ["config", "show", "--config", str(ws["yaml_error"])], ["broken.yaml:4"]
    yield "config show/missing", ["config", "show", "--config", str(root / "nope.yaml")], ["nope.yaml"]
    yield "model tiny/out-under-file", ["model", "tiny", "--out", f"{ws['afile']}/m"], ["--out", "afile.txt"]
    yield "model tiny/zero-layers", ["model", "tiny", "--out", f"{root}/m", "--layers", "0"], ["layers"]

    # counts and sizes without their lower bound
    bounds = {
        "quickstart": [
            "distill_tasks=0",
            "rl_tasks=-1",
            "tasks_per_iteration=0",
            "loop.iterations=0",
            "tree.branch_factor=0",
            "eval_tasks_per_horizon=0",
            "sft.max_steps=0",
            "tree.max_leaves=0",
        ],
        "data synth": ["sources=[{family: sam, count: -1}]", "eval_fraction=-0.1", "histogram_bins=[-5]"],
        "data distill": [
            "tasks.count=-1",
            "tasks.count=0",
            "batch_size=0",
            "batch_size=-3",
            "reasoner_recall_budget=-1",
        ],
        "train oat-grpo": [
            "tasks_per_iteration=-1",
            "tasks_per_iteration=0",
            "tree.branch_factor=0",
            "tree.flat_group_size=0",
            "tree.max_leaves=0",
            "loop.iterations=0",
            "loop.iterations=-2",
            "train_tasks.count=0",
            "eval_tasks.count=-1",
            "committee.settings.judge_max_tokens=0",
            "loop.keep_checkpoints=0",
            "eval_samples=-1",
        ],
        "sft": ["train.max_steps=0", "train.batch_size=0", "data.max_eval_rows=0", "train.save_steps=-1"],
        "train pivot-grpo": ["loop.iterations=0", "train_tasks.count=0", "groups.group_size=0", "pivots.every=0"],
        "eval": [
            "datasets=[{name: d, kind: ama_synthetic, episodes_per_setting: 0}]",
            "episodes_per_batch=0",
            "judge_max_tokens=-1",
        ],
        "export": ["verify.max_new_tokens=0"],
    }
    # non-finite, out-of-range and absurd numbers
    numbers = {
        "train oat-grpo": [
            "trainer.lr=.inf",
            "trainer.lr=.nan",
            "trainer.lr=1e308",
            "trainer.lr=-1e-5",
            "trainer.clip_low=-5",
            "trainer.clip_high=.inf",
            "trainer.max_grad_norm=.nan",
            "credit.committee_weight=.nan",
            "credit.committee_weight=7",
            "loop.iterations=true",
            "tree.branch_factor=1000000",
            "tasks_per_iteration=1000000",
            "train_tasks.count=1000000000",
            "tree.max_leaves=100000000",
            "trainer.micro_batches=true",
            "trainer.kl_coef=-1",
            "trainer.tis_cap=0",
            "memory.sampling.recall.top_p=2",
        ],
        "sft": [
            "train.lr=.inf",
            "train.lr=1e308",
            "train.batch_size=1000000",
            "train.max_grad_norm=.nan",
            "train.max_steps=true",
            "train.epochs=.inf",
        ],
        "data distill": ["batch_size=true", "batch_size=10000000", "tasks.count=1000000000"],
        "data synth": ["sources=[{family: sam, count: 1000000000}]", "eval_fraction=.nan"],
        "train pivot-grpo": ["loop.iterations=true", "trainer.lr=.inf", "train_tasks.count=1000000000"],
    }
    for command, overrides in numbers.items():
        for override in overrides:
            key = override.split("=", 1)[0].split("[")[0].split(".")[-1]
            yield f"{command}/number:{override}", [*command.split(), *_base(command, ws), override], [key]

    # endpoints and keys
    oat = ["train", "oat-grpo", *_base("train oat-grpo", ws)]
    for url in ("htp:/nope", "http://", "gpu01:8000/v1", "http://host:99999/v1"):
        yield (
            f"train oat-grpo/endpoint:{url}",
            [*oat, f"placement.judge={{model: j, endpoints: ['{url}']}}"],
            ["placement.judge.endpoints", url],
        )

    for command, overrides in bounds.items():
        for override in overrides:
            key = override.split("=", 1)[0].split("[")[0]
            yield f"{command}/bound:{override}", [*command.split(), *_base(command, ws), override], [key]

    # data files
    for name, tasks_key in (
        ("train oat-grpo", "train_tasks"),
        ("data distill", "tasks"),
        ("train pivot-grpo", "train_tasks"),
    ):
        base = _base(name, ws)
        yield f"{name}/episodes-missing", [*name.split(), *base, f"{tasks_key}.episodes={root}/no.jsonl"], ["no.jsonl"]
        yield (
            f"{name}/episodes-truncated",
            [*name.split(), *base, f"{tasks_key}.episodes={ws['truncated']}"],
            ["truncated.jsonl:6"],
        )
        yield (
            f"{name}/episodes-not-json",
            [*name.split(), *base, f"{tasks_key}.episodes={ws['not_json']}"],
            ["not_json.jsonl:2"],
        )
        yield (
            f"{name}/episodes-not-object",
            [*name.split(), *base, f"{tasks_key}.episodes={ws['not_object']}"],
            ["not_object.jsonl:1"],
        )
        yield f"{name}/episodes-empty", [*name.split(), *base, f"{tasks_key}.episodes={ws['empty']}"], ["empty.jsonl"]
        yield f"{name}/episodes-folder", [*name.split(), *base, f"{tasks_key}.episodes={root}"], [str(root)]
    yield (
        "train oat-grpo/episodes-bad-field",
        ["train", "oat-grpo", *_base("train oat-grpo", ws), f"train_tasks.episodes={ws['bad_field']}"],
        ["bad_field.jsonl:2", "episode_id"],
    )
    yield (
        "train oat-grpo/episodes-wrong-family",
        ["train", "oat-grpo", *_base("train oat-grpo", ws), f"train_tasks.episodes={ws['proactive']}"],
        ["no sam episodes"],
    )
    yield (
        "train oat-grpo/eval-episodes-truncated",
        ["train", "oat-grpo", *_base("train oat-grpo", ws), f"eval_tasks.episodes={ws['truncated']}"],
        ["truncated.jsonl:6"],
    )
    sft = ["sft", *_base("sft", ws)]
    yield "sft/data-dir-missing", [*sft, f"data.dir={root}/nodata"], ["nodata"]
    yield "sft/role-missing", [*sft, "data.roles=[consolidate]"], ["consolidate"]
    yield "sft/row-bad", [*sft, f"data.dir={ws['sft_bad'].parent}"], ["recall.jsonl:2", "messages"]
    yield "sft/role-empty", [*sft, f"data.dir={ws['sft_empty'].parent}"], ["recall.jsonl"]
    yield "sft/role-file-missing", [*sft, f"data.files={{recall: {root}/none.jsonl}}"], ["none.jsonl"]
    yield "sft/deepspeed-missing", [*sft, "train.deepspeed=zero9"], ["zero9"]
    ev = ["eval", *_base("eval", ws)]
    for kind in ("generic", "locomo", "amabench"):
        yield (
            f"eval/{kind}-missing",
            [*ev, f"datasets=[{{name: d, kind: {kind}, path: {root}/none.json}}]"],
            ["none.json"],
        )
        yield f"eval/{kind}-empty", [*ev, f"datasets=[{{name: d, kind: {kind}, path: {ws['empty']}}}]"], ["empty.jsonl"]
        yield f"eval/{kind}-folder", [*ev, f"datasets=[{{name: d, kind: {kind}, path: {root}}}]"], [str(root)]
    for key in ("datasets", "systems", "models"):
        yield f"eval/{key}-empty-list", [*ev, f"{key}=[]"], [key, "empty"]
    yield "eval/generic-no-path", [*ev, "datasets=[{name: d, kind: generic}]"], ["datasets.0", "path"]
    yield (
        "eval/generic-garbage",
        [*ev, f"datasets=[{{name: d, kind: generic, path: {ws['garbage']}}}]"],
        ["garbage.json"],
    )
    yield (
        "eval/sam-episodes-truncated",
        [*ev, f"datasets=[{{name: d, kind: sam, tasks: {{episodes: {ws['truncated']}}}}}]"],
        ["truncated.jsonl:6"],
    )
    yield "eval/model-cache-under-file", [*ev, f"model_cache={ws['afile']}/models"], ["model_cache"]
    yield (
        "eval/adapter-missing",
        [*ev, f"models=[{{name: m, engine: {{backend: hf, model: {tiny}}}, adapter: {missing}}}]"],
        ["models.0.adapter", str(missing)],
    )

    # model and adapter paths
    model_keys = {
        "train oat-grpo": ["policy.base", "engine.model", "reasoner.tokenizer"],
        "train pivot-grpo": ["policy.base", "engine.model", "reasoner.tokenizer"],
        "sft": ["model.base"],
        "export": ["policy.base", "reference_base"],
        "data distill": ["tokenizer"],
        "eval": ["reasoner.tokenizer"],
    }
    engines = {
        "reasoner.tokenizer": "reasoner={backend: scripted, scripted_policy: memrl.data.tasks.sam:SamReasoner, "
        "tokenizer: VALUE}"
    }
    for command, keys in model_keys.items():
        for key in keys:
            for label, value, expect in (
                ("missing", str(missing), str(missing)),
                ("file", ws["afile"], "a file"),
                ("no-config", root / "nomodel", "nomodel"),
                ("hub-offline", "nosuchorg/nosuchmodel", "HF_HUB_OFFLINE"),
            ):
                override = engines[key].replace("VALUE", str(value)) if key in engines else f"{key}={value}"
                yield (
                    f"{command}/{key}-{label}",
                    [*command.split(), *_base(command, ws), override],
                    [key.split(".")[-1], expect],
                )
    for command, key in (
        ("train oat-grpo", "policy.adapter"),
        ("train pivot-grpo", "policy.adapter"),
        ("sft", "model.adapter"),
        ("export", "policy.adapter"),
    ):
        for label, value, expect in (
            ("missing", missing, str(missing)),
            ("no-weights", ws["lora_no_weights"], "adapter_model.safetensors"),
            ("no-config", ws["lora_no_config"], "adapter_config.json"),
            ("file", ws["afile"], "a file"),
        ):
            yield f"{command}/{key}-{label}", [*command.split(), *_base(command, ws), f"{key}={value}"], [key, expect]

    # model and adapter files that are not what they claim
    for command, key in (("train oat-grpo", "policy.base"), ("sft", "model.base"), ("train pivot-grpo", "policy.base")):
        for label, folder, expect in (
            ("truncated-weights", ws["truncated_weights"], "truncated"),
            ("empty-weights", ws["empty_weights"], "too short"),
            ("garbage-config", ws["garbage_config"], "does not parse"),
            ("no-tokenizer", ws["no_tokenizer"], "no tokenizer files"),
        ):
            yield (
                f"{command}/{key}-{label}",
                [*command.split(), *_base(command, ws), f"{key}={folder}"],
                [key, str(folder), expect],
            )
    for command, key in (("train oat-grpo", "policy.adapter"), ("sft", "model.adapter")):
        yield (
            f"{command}/{key}-other-base",
            [*command.split(), *_base(command, ws), f"{key}={ws['lora_other_base']}"],
            [key, "does not fit base", "q_proj", "/elsewhere/other-base"],
        )
        yield (
            f"{command}/{key}-garbage-weights",
            [*command.split(), *_base(command, ws), f"{key}={ws['lora_garbage_weights']}"],
            [key, "safetensors"],
        )
    yield (
        "train oat-grpo/engine.model-truncated",
        [
            "train",
            "oat-grpo",
            *_base("train oat-grpo", ws),
            f"engine={{backend: hf, model: {ws['truncated_weights']}}}",
        ],
        ["engine.model", "truncated"],
    )

    # empty records
    yield "sft/empty-target", [*sft, f"data.dir={ws['sft_empty_target'].parent}"], ["recall.jsonl:2", "empty"]
    yield "sft/stray-role", [*sft, f"data.dir={ws['sft_stray_role'].parent}"], ["recall.jsonl:2", "field 'role'"]
    for name, tasks_key in (("train oat-grpo", "train_tasks"), ("data distill", "tasks")):
        for label, expect in (
            ("no_turns", "no_turns.jsonl:2: field 'trajectory'"),
            ("no_questions", "no_questions.jsonl:2: field 'qa_pairs'"),
        ):
            yield (
                f"{name}/episode-{label}",
                [*name.split(), *_base(name, ws), f"{tasks_key}.episodes={ws[label]}"],
                [expect],
            )

    # API keys from the environment
    yield (
        "train oat-grpo/api-key-unset",
        [*oat, "placement.judge={model: j, endpoints: ['http://h:8000/v1'], api_key_env: MEMRL_TEST_UNSET_KEY}"],
        ["MEMRL_TEST_UNSET_KEY"],
    )
    yield (
        "train oat-grpo/endpoint-key-unset",
        [
            *oat,
            "reasoner={backend: openai, model: m, endpoints: [{url: "
            "'http://h:8000/v1', api_key_env: MEMRL_TEST_UNSET_KEY}]}",
        ],
        ["MEMRL_TEST_UNSET_KEY"],
    )

    # export inputs
    ex = ["export", *_base("export", ws)]
    yield "export/results-missing", [*ex, f"results={root}/none.json"], ["results", "none.json"]
    yield "export/results-not-json", [*ex, f"results={ws['garbage']}"], ["results", "garbage.json"]
    yield "export/recipe-missing", [*ex, f"recipe={root}/none.yaml"], ["recipe", "none.yaml"]
    yield "export/recipe-not-yaml", [*ex, f"recipe={ws['yaml_error']}"], ["recipe", "broken.yaml"]
    yield "export/output-not-empty", [*ex, f"output={ws['export_out']}"], ["output", "export-out"]
    yield "export/export-dir-under-file", [*ex, f"output={ws['afile']}/model"], ["output", "afile.txt"]
    yield (
        "quickstart/model-cache-under-file",
        ["quickstart", *_base("quickstart", ws), f"model_cache={ws['afile']}/m"],
        ["model_cache"],
    )
    yield (
        "data distill/out-under-file",
        ["data", "distill", *_base("data distill", ws), f"out={ws['afile']}/x"],
        ["out", "afile.txt"],
    )


def _replace_runner(monkeypatch: pytest.MonkeyPatch, runner: Callable[[Any], Any]) -> None:
    """Every command runs ``runner(cfg)`` in place of its own runner (all else it loads stays real)."""
    real_load = jobs.Job.load

    def load(self: jobs.Job, attr: str):
        return runner if attr == "runner" else real_load(self, attr)

    monkeypatch.setattr(jobs.Job, "load", load)


def _all_cases(ws: dict[str, Path]) -> list[tuple[str, list[str], list[str]]]:
    cases = list(_cases(ws))
    ids = [c[0] for c in cases]
    assert len(ids) == len(set(ids)), "duplicate case ids"
    return cases


def test_bad_input_corpus(
    ws: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Every case: exit 2, one paragraph naming the file/key/path, no traceback, nothing written anywhere."""

    def reached(cfg):
        raise RunnerReached("the bad input got past every check")

    _replace_runner(monkeypatch, reached)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # this process's temporary files in a folder of their own: tests running beside it write theirs meanwhile
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.chdir(ws["root"])
    cases = _all_cases(ws)
    commands = {c[0].split("/")[0] for c in cases}
    assert len(cases) >= 100 and set(COMMANDS) <= commands, (len(cases), sorted(set(COMMANDS) - commands))
    before, logs = _snapshot(ws["root"]), _temp_logs()
    failures = []
    for case_id, argv, expected in cases:
        code = main(argv)
        out = capsys.readouterr()
        message = out.err.strip()
        problems = []
        if code != 2:
            problems.append(f"exit {code}")
        if "Traceback" in out.err or "Traceback" in out.out:
            problems.append("traceback")
        if not message.startswith("memrl:") or "\n\n" in message:
            problems.append("not one paragraph starting with 'memrl:'")
        problems += [f"message lacks {e!r}" for e in expected if e not in message]
        after = _snapshot(ws["root"])
        if after != before:
            changed = sorted(set(after.items()) ^ set(before.items()))[:3]
            problems.append(f"file system changed: {changed}")
            shutil.rmtree(ws["runs"] / "none", ignore_errors=True)
            before = after
        if problems:
            failures.append(f"{case_id}: {'; '.join(problems)}\n    {message[:400]}")
    assert not failures, f"{len(failures)} of {len(cases)} cases failed:\n" + "\n".join(failures)
    assert _temp_logs() <= logs, "a temporary log file was left behind"


def test_failed_start_removes_the_run_folder(
    ws: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A runner that fails on bad input after creating its run folder (and parents) leaves nothing behind, and the
    corrected command then starts (no "already holds a run")."""
    from memrl.data.errors import UserError
    from memrl.data.run_dir import prepare_run_dir

    calls = []

    def runner(cfg):
        run_dir = prepare_run_dir(cfg, cfg.run, "synth")
        calls.append(run_dir)
        if len(calls) == 1:
            raise UserError(f"{run_dir}: a problem found late")
        return 0

    _replace_runner(monkeypatch, runner)
    out_dir = tmp_path / "new" / "runs"
    argv = ["data", "synth", f"run.output_dir={out_dir}", "run.name=late"]
    assert main(argv) == 2
    assert "a problem found late" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    assert main(argv) == 0 and (out_dir / "late" / "config.yaml").is_file() and (out_dir / "late" / "run.log").is_file()


def test_bug_gets_traceback_file_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from memrl.data.run_dir import prepare_run_dir

    def runner(cfg):
        prepare_run_dir(cfg, cfg.run, "synth")
        return {}["missing"]

    _replace_runner(monkeypatch, runner)
    assert main(["data", "synth", f"run.output_dir={tmp_path}", "run.name=bug"]) == 1
    err = capsys.readouterr().err
    log = tmp_path / "bug" / "run.log"
    assert "a bug" in err and str(log) in err and "KeyError" in log.read_text()


_HOLDER = """
import os
import sys
import memrl.data.run_dir as run_dir
from memrl.launch.cli import main

real = run_dir.write_resolved_config
# the test's pipe, kept before the CLI sends file descriptors 1 and 2 to the run's log
signal_out = os.fdopen(os.dup(1), "w")

def held(cfg, folder, *args, **kwargs):
    signal_out.write("locked\\n")
    signal_out.flush()
    sys.stdin.readline()  # the test's second start happens now: the lock is taken, config.yaml not yet written
    return real(cfg, folder, *args, **kwargs)

run_dir.write_resolved_config = held
sys.exit(main(sys.argv[1:]))
"""


def test_concurrent_start_into_one_run_folder_exits_2_and_touches_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Acceptance 1: a second start into a run folder that another process holds exits 2 and leaves every file of
    the first run as it was; the first completes, and a later --resume of it passes the run-folder checks."""
    import subprocess
    import sys

    from memrl.data.config import load_config
    from memrl.data.run_dir import prepare_run_dir, unlock_run_dirs
    from memrl.data.synth import SynthConfig

    argv = [
        "data",
        "synth",
        f"run.output_dir={tmp_path}",
        "run.name=shared",
        "sources=[{family: sam, count: 2}]",
        "arrow=false",
    ]
    first = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout.readline().strip() == "locked"
        before = _snapshot(tmp_path)
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("memrl:") and "in use by a running memrl process" in err and "\n" not in err, err
        assert _snapshot(tmp_path) == before
        first.stdin.write("\n")
        first.stdin.flush()
        _, errors = first.communicate(timeout=300)
        assert first.returncode == 0, errors[-2000:]
    finally:
        if first.poll() is None:
            first.kill()
    run = tmp_path / "shared"
    assert (run / "config.yaml").is_file() and (run / "run.log").is_file() and (run / "train.jsonl").is_file()
    cfg = load_config(SynthConfig, None, [*argv[2:], "run.resume=true"])
    assert prepare_run_dir(cfg, cfg.run, "data synth") == run
    unlock_run_dirs()


def test_resume_refuses_a_changed_config_unless_the_keys_are_named(
    ws: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A changed key that alters the run is exit 2 naming it (nothing written); --allow-config-change KEY lets the
    resume go ahead and keeps the previous config beside the new one; a finished run says it is finished."""
    from memrl.data.run_dir import prepare_run_dir

    reached = []

    def runner(cfg):
        reached.append(prepare_run_dir(cfg, cfg.run, "train oat-grpo"))
        return 0

    _replace_runner(monkeypatch, runner)
    base = [
        "train",
        "oat-grpo",
        *[o for o in _base("train oat-grpo", ws) if not o.startswith("run.output_dir")],
        f"run.output_dir={tmp_path}",
        "run.name=r",
    ]
    assert main(base) == 0
    capsys.readouterr()
    before = _snapshot(tmp_path)
    assert main([*base, "trainer.lr=0.5", "loop.iterations=3", "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert "trainer.lr" in err and "loop.iterations" in err and "--allow-config-change" in err and "\n" not in err
    assert _snapshot(tmp_path) == before
    assert main([*base, "trainer.lr=0.5", "loop.iterations=3", "--resume", "--allow-config-change", "trainer.lr"]) == 2
    assert "trainer.lr" not in capsys.readouterr().err.split("differs")[-1].split(";")[0]
    assert (
        main(
            [
                *base,
                "trainer.lr=0.5",
                "loop.iterations=3",
                "fleet.workers=3",
                "--resume",
                "--allow-config-change",
                "trainer.lr",
                "loop",
            ]
        )
        == 0
    )  # where it runs (fleet.*) may change freely
    assert len(list((tmp_path / "r").glob("config.before-resume-*.yaml"))) == 1
    (tmp_path / "r" / "summary.json").write_text("{}")
    before = _snapshot(tmp_path)
    assert main([*base, "trainer.lr=0.5", "loop.iterations=3", "--resume"]) == 2
    assert "is finished" in capsys.readouterr().err
    assert _snapshot(tmp_path) == before
    (tmp_path / "r" / "summary.json").unlink()
    (tmp_path / "r" / "checkpoints.log").write_text("ckpt-000000\nckpt-000001\n")
    assert main([*base, "trainer.lr=0.5", "loop.iterations=3", "--resume"]) == 2
    assert "every checkpoint of run" in capsys.readouterr().err
