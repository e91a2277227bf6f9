"""World layout of memrl launches: which node runs what, with which ranks, and the exact commands.

The launch scripts (``launch/torchrun.sh``, ``launch/deepspeed.sh``, ``launch/serve_endpoints.sh``,
``launch/slurm/memrl.sbatch``) are thin: they ask this module for a *plan* (``--format shell`` prints bash
assignments they ``eval``) and run it. ``--dry-run`` prints the same plan as text without starting anything, and
``--format json`` gives it to tests and tools. Everything is computed from arguments, Slurm variables
(``SLURM_JOB_NODELIST`` through ``scontrol show hostnames`` when installed, ``SLURM_NODEID``, ``SLURM_GPUS_ON_NODE``
...) and the ``run`` / ``placement`` sections of the run's config, so a plan can be checked anywhere. Only the
distributed memrl commands (``launch.cli.JOBS`` with ``distributed=True``) get many processes; the others run as one
plain process on node rank 0.

    python -m launch.layout torchrun --nproc-per-node 8 --dry-run -- sft --config configs/sft.yaml
    python -m launch.layout slurm --nodes 4 --dry-run -- train oat-grpo --config configs/oat.yaml
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError

from data.config import (
    ConfigError,
    ConfigModel,
    PlacementConfig,
    PolicyPlacement,
    RunConfig,
    ServedModel,
    apply_overrides,
)

__all__ = [
    "SETUPS",
    "LaunchError",
    "MemrlCommand",
    "Plan",
    "ServeSpec",
    "SlurmEnv",
    "TrainLayout",
    "expand_hostlist",
    "gpus_on_node",
    "main",
    "plan_deepspeed",
    "plan_serve",
    "plan_slurm",
    "plan_torchrun",
    "slurm_hostnames",
]

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MASTER_PORT = 29500
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
Device = Literal["gpu", "cpu"]


class LaunchError(ValueError):
    """A launch that cannot be laid out (bad arguments, too few nodes, unreadable config...)."""


# ----------------------------------------------------------------------------------------------------------------
# Hosts and devices


def _split_top_level(expr: str) -> list[str]:
    """Split a Slurm hostlist at the commas that are not inside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise LaunchError(f"malformed host list {expr!r}: unbalanced ']'")
        elif ch == "," and depth == 0:
            items.append(expr[start:i])
            start = i + 1
    if depth:
        raise LaunchError(f"malformed host list {expr!r}: unbalanced '['")
    items.append(expr[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_item(item: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", item)
    if match is None:
        return [item]
    prefix, body, rest = item[: match.start()], match.group(1), item[match.end() :]
    values: list[str] = []
    for part in body.split(","):
        part = part.strip()
        if re.fullmatch(r"\d+-\d+", part):
            lo, hi = part.split("-")
            if int(hi) < int(lo):
                raise LaunchError(f"malformed host range {part!r} in {item!r}")
            values.extend(f"{n:0{len(lo)}d}" for n in range(int(lo), int(hi) + 1))
        elif re.fullmatch(r"\d+", part):
            values.append(part)
        else:
            raise LaunchError(f"malformed host range {part!r} in {item!r}")
    return [prefix + value + tail for value in values for tail in _expand_item(rest)]


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm host list (``gpu[01-03,07],login1``) in Python, exactly like ``scontrol show hostnames``."""
    hosts: list[str] = []
    for item in _split_top_level(expr):
        hosts.extend(_expand_item(item))
    return hosts


def slurm_hostnames(nodelist: str, env: Mapping[str, str]) -> list[str]:
    """Host names of a Slurm node list: ``scontrol show hostnames`` when installed, else :func:`expand_hostlist`."""
    scontrol = shutil.which("scontrol", path=env.get("PATH"))
    if scontrol:
        out = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, check=False)
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()
    return expand_hostlist(nodelist)


def _gpu_count(value: str) -> int:
    """GPUs in a Slurm GPU count: ``8``, ``a100:8`` or ``a100:4,v100:2``."""
    total = 0
    for part in value.split(","):
        last = part.strip().split(":")[-1].split("(")[0]
        if not last.isdigit():
            raise LaunchError(f"cannot read a GPU count from {value!r}")
        total += int(last)
    return total


def gpus_on_node(env: Mapping[str, str]) -> int:
    """GPUs this process may use: Slurm's count, else ``CUDA_VISIBLE_DEVICES``, else ``nvidia-smi -L``, else 0."""
    for key in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        if env.get(key):
            return _gpu_count(env[key])
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip()]
        return 0 if ids in ([], ["-1"], ["NoDevFiles"]) else len(ids)
    smi = shutil.which("nvidia-smi", path=env.get("PATH"))
    if smi:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
        if out.returncode == 0:
            return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    return 0


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass(frozen=True)
class SlurmEnv:
    """What the Slurm variables say about this process (``None`` fields when not set)."""

    job_id: str | None
    job_name: str | None
    hosts: list[str]  # the step's nodes inside ``srun``, else the job's nodes
    job_hosts: list[str]  # the job's nodes
    node_name: str | None
    node_id: int | None
    restart_count: int
    cpus_on_node: int | None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SlurmEnv | None:
        """Read the Slurm variables; ``None`` outside Slurm."""
        job_list = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not env.get("SLURM_JOB_ID") and not job_list:
            return None
        job_hosts = slurm_hostnames(job_list, env) if job_list else []
        step_list = env.get("SLURM_STEP_NODELIST")
        hosts = slurm_hostnames(step_list, env) if step_list else job_hosts
        node_id = env.get("SLURM_NODEID")
        cpus = env.get("SLURM_CPUS_ON_NODE")
        return cls(
            job_id=env.get("SLURM_JOB_ID"),
            job_name=env.get("SLURM_JOB_NAME"),
            hosts=hosts,
            job_hosts=job_hosts,
            node_name=env.get("SLURMD_NODENAME"),
            node_id=int(node_id) if node_id and node_id.isdigit() else None,
            restart_count=int(env.get("SLURM_RESTART_COUNT") or 0),
            cpus_on_node=int(cpus) if cpus and cpus.isdigit() else None,
        )

    def rank_of_this_node(self) -> int | None:
        """This node's position in :attr:`hosts` (by ``SLURMD_NODENAME``), else ``SLURM_NODEID``."""
        if self.node_name and self.node_name in self.hosts:
            return self.hosts.index(self.node_name)
        return self.node_id


def _master_port(explicit: int | None, env: Mapping[str, str], slurm: SlurmEnv | None) -> int:
    """The rendezvous port: argument, ``MASTER_PORT``, a port derived from the Slurm job id, or 29500."""
    if explicit is not None:
        return explicit
    if env.get("MASTER_PORT", "").isdigit():
        return int(env["MASTER_PORT"])
    if slurm is not None and slurm.job_id and slurm.job_id.isdigit():
        # Jobs sharing a node must not collide on one port.
        return 20000 + int(slurm.job_id) % 20000
    return DEFAULT_MASTER_PORT


def _resolve_device(choice: str, gpus: int) -> Device:
    if choice == "auto":
        return "gpu" if gpus > 0 else "cpu"
    if choice == "gpu" and gpus == 0:
        raise LaunchError("--device gpu but no GPU is visible (no Slurm GPU count, CUDA_VISIBLE_DEVICES or nvidia-smi)")
    return "gpu" if choice == "gpu" else "cpu"


# ----------------------------------------------------------------------------------------------------------------
# The memrl command being launched and the run config sections the launcher reads


@dataclass(frozen=True)
class MemrlCommand:
    """The arguments given to ``memrl`` (``train oat-grpo --config FILE key=value ...``)."""

    argv: list[str]

    @property
    def stage(self) -> str:
        """The command words before the first option or override, e.g. ``train oat-grpo``."""
        words = []
        for arg in self.argv:
            if arg.startswith("-") or "=" in arg:
                break
            words.append(arg)
        return " ".join(words)

    @property
    def config_path(self) -> str | None:
        """The ``--config`` file, if any."""
        for i, arg in enumerate(self.argv):
            if arg == "--config" and i + 1 < len(self.argv):
                return self.argv[i + 1]
            if arg.startswith("--config="):
                return arg.split("=", 1)[1]
        return None

    @property
    def overrides(self) -> list[str]:
        """The dotted ``key=value`` overrides."""
        out = []
        skip = False
        for arg in self.argv:
            if skip:
                skip = False
            elif arg == "--config":
                skip = True
            elif not arg.startswith("-") and "=" in arg:
                out.append(arg)
        return out

    @property
    def has_resume(self) -> bool:
        """Whether ``--resume`` or ``run.resume=true`` is already given."""
        return "--resume" in self.argv or any(o.replace(" ", "") == "run.resume=true" for o in self.overrides)


class LaunchView(ConfigModel):
    """The parts of a run's config the launchers read: where the run writes and how rollouts are placed."""

    run: RunConfig = RunConfig()
    placement: PlacementConfig = PlacementConfig()


def launch_view(command: MemrlCommand) -> LaunchView:
    """Read ``run`` and ``placement`` from the command's config file and overrides (other sections are not read)."""
    data: dict[str, Any] = {}
    source = command.config_path or "<defaults>"
    if command.config_path:
        path = Path(command.config_path)
        if not path.is_file():
            raise LaunchError(f"config file not found: {path}")
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise LaunchError(f"{path}: invalid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise LaunchError(f"{path}: the top level must be a mapping of keys")
        data = {key: loaded[key] for key in ("run", "placement") if key in loaded}
    wanted = [o for o in command.overrides if o.split("=", 1)[0].split(".")[0] in LaunchView.model_fields]
    try:
        return LaunchView.model_validate(apply_overrides(LaunchView, data, wanted))
    except (ConfigError, ValidationError) as exc:
        raise LaunchError(f"{source}: {exc}") from None


def _resumable(stage: str) -> bool:
    from launch.cli import JOBS

    return any(" ".join(job.path) == stage and job.resumable for job in JOBS)


# memrl commands that are not config-driven jobs; they run in one process.
UTILITY_COMMANDS = ("config show", "model tiny")


@dataclass(frozen=True)
class CommandKind:
    """How a launch runs its command: across processes or in one, and whether it builds the policy's vLLM engine."""

    label: str  # "memrl eval", or "python -m MOD" for --module
    distributed: bool
    policy_engine: bool


def command_kind(module: str, command: MemrlCommand) -> CommandKind:
    """What the launched command is; raises :class:`LaunchError` for a memrl command that does not exist."""
    if module != "launch.cli":
        # Another module (a benchmark, a probe) is started as asked, once per process of the layout.
        return CommandKind(f"python -m {module}", distributed=True, policy_engine=False)
    from launch.cli import JOBS

    stage = command.stage
    for job in JOBS:
        if " ".join(job.path) == stage:
            return CommandKind(f"memrl {stage}", job.distributed, job.policy_engine)
    if stage in UTILITY_COMMANDS:
        return CommandKind(f"memrl {stage}", distributed=False, policy_engine=False)
    known = sorted([" ".join(job.path) for job in JOBS] + list(UTILITY_COMMANDS))
    raise LaunchError(f"unknown memrl command {stage!r}; one of {known}")


# ----------------------------------------------------------------------------------------------------------------
# Plans


@dataclass
class Plan:
    """What a launch script will do: text for people, bash assignments for the script, a dict for tests."""

    lines: list[str]
    shell: dict[str, str | list[str]]
    info: dict[str, Any]
    dry_run: bool

    @property
    def text(self) -> str:
        """The plan as printed by ``--dry-run`` (and at the start of a real launch)."""
        return "\n".join(self.lines)

    def render(self, fmt: str) -> str:
        """``text``, ``json`` or ``shell`` (bash assignments, every value quoted)."""
        if fmt == "json":
            return json.dumps({**self.info, "dry_run": self.dry_run, "text": self.text}, indent=2)
        if fmt == "shell":
            out = [f"dry_run={int(self.dry_run)}", f"layout_text={shlex.quote(self.text)}"]
            for name, value in self.shell.items():
                if isinstance(value, list):
                    out.append(f"{name}=({' '.join(shlex.quote(v) for v in value)})")
                else:
                    out.append(f"{name}={shlex.quote(value)}")
            return "\n".join(out)
        return self.text


def _ranges(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "  ") -> list[str]:
    cells = [list(map(str, header)), *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]


def _command_line(env: Mapping[str, str], cmd: Sequence[str]) -> str:
    return shlex.join([*(["env", *(f"{k}={v}" for k, v in env.items())] if env else []), *cmd])


@dataclass
class TrainLayout:
    """The world of a launch: nodes in node-rank order, processes per node, rendezvous, and the policy engine's GPUs.

    ``policy`` is ``None`` when the command builds no policy vLLM engine. A command that is not distributed
    (``single_process``) runs as one process on node 0; the other nodes start nothing.
    """

    hosts: list[str]
    nproc_per_node: int
    node_rank: int
    master_addr: str
    master_port: int
    device: Device
    gpus_per_node: int
    policy: PolicyPlacement | None = None
    single_process: bool = False
    label: str = "the command"

    @property
    def nnodes(self) -> int:
        """Number of nodes in the layout."""
        return len(self.hosts)

    @property
    def world_size(self) -> int:
        """Number of processes started."""
        return 1 if self.single_process else self.nnodes * self.nproc_per_node

    def global_ranks(self, node: int) -> range:
        """The global ranks of one node (empty for the idle nodes of a single-process command)."""
        if self.single_process:
            return range(0, 1 if node == 0 else 0)
        return range(node * self.nproc_per_node, (node + 1) * self.nproc_per_node)

    def _engine_gpus(self) -> str:
        if self.policy is None or self.device == "cpu":
            return "-"
        if self.policy.mode == "separate":
            return _ranges(self.nproc_per_node, self.nproc_per_node + self.policy.gpus_per_node - 1)
        return "shared"

    def _train_gpus(self, node: int) -> str:
        if self.device == "cpu" or not self.global_ranks(node):
            return "-"
        if self.single_process:
            return _ranges(0, self.gpus_per_node - 1)  # the one process sees every GPU of its node
        return _ranges(0, self.nproc_per_node - 1)

    def nodes(self) -> list[dict[str, Any]]:
        """One dict per node: host, global and local ranks (``None`` on an idle node), GPUs, policy-engine GPUs."""
        out = []
        for node, host in enumerate(self.hosts):
            ranks = self.global_ranks(node)
            out.append(
                {
                    "node": node,
                    "host": host,
                    "global_ranks": [ranks[0], ranks[-1]] if ranks else None,
                    "local_ranks": [0, len(ranks) - 1] if ranks else None,
                    "train_gpus": self._train_gpus(node),
                    "engine_gpus": self._engine_gpus(),
                }
            )
        return out

    def _engine_line(self) -> str | None:
        policy = self.policy
        if policy is None:
            return None
        if self.single_process:
            where = "its CPU" if self.device == "cpu" else "its node's GPUs"
            return f"policy vLLM engine: built inside that one process, on {where}"
        if self.device == "cpu":
            return "policy vLLM engine: colocated with training on CPU (no sleep mode on CPU)"
        if policy.mode == "colocate":
            sleep = f"sleep level {policy.sleep_level} during updates" if policy.sleep_level else "never sleeps"
            return (
                f"policy vLLM engine: on the main process, colocated on node 0's training GPU(s) "
                f"{_ranges(0, policy.tensor_parallel_size - 1)} (TP {policy.tensor_parallel_size}, "
                f"{policy.gpu_memory_utilization:g} of GPU memory, {sleep})"
            )
        first = self.nproc_per_node
        tp = policy.tensor_parallel_size
        idle = policy.gpus_per_node * self.nnodes - tp
        return (
            f"policy vLLM engine: on the main process, GPU(s) {_ranges(first, first + tp - 1)} of node 0 "
            f"(TP {tp}); GPU(s) {self._engine_gpus()} kept from training on every node, {idle} of them idle"
        )

    def _describe_single(self, this_node: bool) -> list[str]:
        where = "CPU" if self.device == "cpu" else f"all {self.gpus_per_node} GPU(s) of its node visible to it"
        lines = [f"{self.label} runs in one process (it is not distributed): node rank 0 ({self.hosts[0]}), {where}"]
        if self.nnodes > 1:
            lines.append(f"node rank(s) {_ranges(1, self.nnodes - 1)} start nothing")
        if this_node:
            here = "runs it" if self.node_rank == 0 else "nothing to start here"
            lines.append(f"this node: node rank {self.node_rank} ({self.hosts[self.node_rank]}): {here}")
        engine = self._engine_line()
        if engine:
            lines.append(engine)
        return lines

    def describe(self, this_node: bool = True) -> list[str]:
        """Human-readable lines: the world, this node (unless ``this_node`` is false: launchers that run on one host
        for all nodes), the policy engine (when built), and a per-node table."""
        if self.single_process:
            return self._describe_single(this_node)
        backend = "NCCL" if self.device == "gpu" else "gloo, DeepSpeed CPU accelerator"
        ranks = self.global_ranks(self.node_rank)
        lines = [
            f"world: {self.nnodes} node(s) x {self.nproc_per_node} process(es) = {self.world_size} ranks on "
            f"{self.device.upper()} ({backend}); rendezvous {self.master_addr}:{self.master_port}",
        ]
        if this_node:
            lines.append(f"this node: node rank {self.node_rank} ({self.hosts[self.node_rank]}), global ranks "
                         f"{_ranges(ranks[0], ranks[-1])}, local ranks {_ranges(0, self.nproc_per_node - 1)}")
        engine = self._engine_line()
        if engine:
            lines.append(engine)
        header = ["node", "host", "global ranks", "local ranks", "training GPUs"]
        rows = [[n["node"], n["host"], _ranges(*n["global_ranks"]), _ranges(*n["local_ranks"]), n["train_gpus"]]
                for n in self.nodes()]  # fmt: skip
        if self.policy is not None:
            header.append("policy-engine GPUs")
            rows = [[*row, n["engine_gpus"]] for row, n in zip(rows, self.nodes(), strict=True)]
        lines += _table(header, rows)
        return lines


def _train_layout(
    *,
    nnodes: int | None,
    nproc_per_node: int | None,
    node_rank: int | None,
    master_addr: str | None,
    master_port: int | None,
    device_choice: str,
    policy: PolicyPlacement | None,
    env: Mapping[str, str],
    hosts: list[str] | None = None,
    kind: CommandKind | None = None,
) -> TrainLayout:
    """Resolve the world from explicit values, then Slurm variables, then single-node defaults. ``policy`` is the
    policy engine's placement when the command builds one; ``kind`` says whether it is distributed."""
    single = kind is not None and not kind.distributed
    slurm = SlurmEnv.from_env(env)
    slurm_hosts = list(hosts) if hosts is not None else (slurm.hosts if slurm else [])
    if nnodes is None:
        nnodes = len(slurm_hosts) or 1
    if nnodes < 1:
        raise LaunchError(f"--nnodes must be >= 1, got {nnodes}")
    known_hosts = slurm_hosts if len(slurm_hosts) == nnodes else []
    if node_rank is None:
        from_slurm = slurm.rank_of_this_node() if slurm and known_hosts else (slurm.node_id if slurm else None)
        node_rank = from_slurm if from_slurm is not None else 0
    if not 0 <= node_rank < nnodes:
        raise LaunchError(f"node rank {node_rank} is outside 0..{nnodes - 1}")
    if master_addr is None:
        master_addr = env.get("MASTER_ADDR") or (known_hosts[0] if known_hosts else "127.0.0.1")
    if known_hosts:
        names = known_hosts
    elif nnodes == 1:
        names = [master_addr if master_addr not in ("127.0.0.1", "localhost") else socket.gethostname()]
    else:
        names = [master_addr if i == 0 else f"node{i}" for i in range(nnodes)]
    gpus = gpus_on_node(env)
    device = _resolve_device(device_choice, gpus)
    if single:
        # One process, whatever was asked: its engines see every GPU of the node, so none is kept aside.
        nproc_per_node = 1
        if policy is not None:
            policy = policy.model_copy(update={"mode": "colocate", "gpus_per_node": 0})
    elif policy is not None and device == "cpu":
        policy = policy.model_copy(update={"mode": "colocate", "gpus_per_node": 0})
    kept = policy.gpus_per_node if policy is not None else 0
    if nproc_per_node is None:
        nproc_per_node = gpus - kept if device == "gpu" else 1
    if nproc_per_node < 1:
        raise LaunchError(f"no GPU left for training: {gpus} GPU(s) per node, {kept} kept for the policy engine")
    if device == "gpu" and not single:
        if nproc_per_node + kept > gpus:
            raise LaunchError(
                f"{nproc_per_node} training process(es) + {kept} policy-engine GPU(s) need more than "
                f"the {gpus} GPU(s) of a node"
            )
        if policy is not None and policy.mode == "colocate" and nproc_per_node % policy.tensor_parallel_size:
            raise LaunchError(
                f"colocated policy engine with TP {policy.tensor_parallel_size} needs a multiple of it as processes "
                f"per node, got {nproc_per_node}"
            )
    return TrainLayout(
        hosts=names,
        nproc_per_node=nproc_per_node,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=_master_port(master_port, env, slurm),
        device=device,
        gpus_per_node=gpus,
        policy=policy,
        single_process=single,
        label=kind.label if kind is not None else "the command",
    )


def _launch_env(layout: TrainLayout, env: Mapping[str, str]) -> dict[str, str]:
    """Environment of the training processes (only what the launcher adds)."""
    path = [str(ROOT), *(p for p in env.get("PYTHONPATH", "").split(":") if p and p != str(ROOT))]
    out = {"PYTHONUNBUFFERED": "1", "PYTHONPATH": ":".join(path)}
    if "OMP_NUM_THREADS" not in env:
        # torchrun would otherwise pin every process to 1 thread.
        out["OMP_NUM_THREADS"] = str(max(1, _cpu_count() // layout.nproc_per_node))
    if layout.device == "cpu":
        out["DS_ACCELERATOR"] = "cpu"
    return out


# ----------------------------------------------------------------------------------------------------------------
# Argument handling shared by the subcommands


_FLAGS = {"--dry-run", "-h", "--help"}


def _split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split ``[launcher options] [--] command...``: the command starts at ``--`` or at the first bare word."""
    argv = list(argv)
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return argv[:i], argv[i + 1 :]
        if not arg.startswith("-"):
            return argv[:i], argv[i:]
        i += 1 if (arg in _FLAGS or "=" in arg) else 2
    return argv, []


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description, add_help=False)
    parser.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    parser.add_argument("--dry-run", action="store_true", help="print the layout and commands, start nothing")
    parser.add_argument("--format", choices=["text", "json", "shell"], default="text", help=argparse.SUPPRESS)
    return parser


def _help_plan(parser: argparse.ArgumentParser) -> Plan:
    return Plan(parser.format_help().rstrip().splitlines(), {}, {"help": True}, dry_run=True)


def _device_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=["auto", "gpu", "cpu"], default="auto",
                        help="gpu (NCCL) or cpu (gloo, DS_ACCELERATOR=cpu); auto = gpu when one is visible")


# ----------------------------------------------------------------------------------------------------------------
# torchrun


def _torchrun_parser() -> argparse.ArgumentParser:
    parser = _parser(
        "launch/torchrun.sh",
        "Run a memrl command under torchrun on this node. Unset values come from Slurm variables when inside an "
        "allocation, else a single node with every visible GPU (or 1 CPU process).",
    )
    parser.add_argument("--nnodes", type=int, help="number of nodes (default: SLURM nodes or 1)")
    parser.add_argument("--nproc-per-node", type=int,
                        help="processes per node (default: GPUs minus the policy engine's own GPUs; 1 on CPU)")
    parser.add_argument("--node-rank", type=int, help="this node's rank (default: its place in the Slurm node list)")
    parser.add_argument("--master-addr", help="rendezvous host (default: the first node)")
    parser.add_argument("--master-port", type=int, help="rendezvous port (default: MASTER_PORT, job id, 29500)")
    parser.add_argument("--module", default="launch.cli", help="Python module to run (default: launch.cli = memrl)")
    _device_argument(parser)
    return parser


def _policy_of(kind: CommandKind, module: str, command: MemrlCommand) -> PolicyPlacement | None:
    """The policy engine's placement when the command builds one; reading the config also checks it exists."""
    view = launch_view(command) if module == "launch.cli" else None
    return view.placement.policy if view is not None and kind.policy_engine else None


def _ignored_for_single(kind: CommandKind, **given: int | None) -> list[str]:
    """Notes for process counts asked of a command that runs in one process."""
    return [f"note: --{name.replace('_', '-')} {value} ignored: {kind.label} runs in one process"
            for name, value in given.items() if value is not None and value != 1]


def plan_torchrun(argv: Sequence[str], env: Mapping[str, str]) -> Plan:
    """Plan ``launch/torchrun.sh [options] [--] COMMAND...`` for this node. A command that is not distributed runs
    as one plain process on node rank 0, and the other nodes start nothing."""
    parser = _torchrun_parser()
    own, command = _split_command(argv)
    args = parser.parse_args(own)
    if args.help:
        return _help_plan(parser)
    if not command and args.module == "launch.cli":
        raise LaunchError("give the memrl command to run after the options, e.g. -- sft --config FILE")
    memrl = MemrlCommand(command)
    kind = command_kind(args.module, memrl)
    layout = _train_layout(
        nnodes=args.nnodes,
        nproc_per_node=args.nproc_per_node,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        device_choice=args.device,
        policy=_policy_of(kind, args.module, memrl),
        env=env,
        kind=kind,
    )
    launch_env = _launch_env(layout, env)
    if layout.single_process:
        cmd = [sys.executable, "-m", args.module, *command]
        notes = _ignored_for_single(kind, nproc_per_node=args.nproc_per_node)
        runs_here = layout.node_rank == 0
        command_line = _command_line(launch_env, cmd)
        lines = ["memrl torchrun", *notes, *layout.describe(),
                 f"command: {command_line}" if runs_here else f"command (on node rank 0 only): {command_line}"]
    else:
        runs_here = True
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(layout.nnodes),
            "--nproc-per-node", str(layout.nproc_per_node),
            "--node-rank", str(layout.node_rank),
            "--master-addr", layout.master_addr,
            "--master-port", str(layout.master_port),
            "-m", args.module, *command,
        ]  # fmt: skip
        lines = ["memrl torchrun", *layout.describe(), f"command: {_command_line(launch_env, cmd)}"]
    info = {"launcher": "torchrun", "layout": _layout_info(layout), "env": launch_env, "command": cmd,
            "runs_here": runs_here}
    shell: dict[str, str | list[str]] = {
        "launch_env": [f"{k}={v}" for k, v in launch_env.items()],
        # An idle node of a single-process command gets no command: the script exits 0.
        "launch_cmd": cmd if runs_here else [],
    }
    return Plan(lines, shell, info, args.dry_run)


def _layout_info(layout: TrainLayout) -> dict[str, Any]:
    return {
        "nnodes": layout.nnodes,
        "nproc_per_node": layout.nproc_per_node,
        "world_size": layout.world_size,
        "single_process": layout.single_process,
        "node_rank": layout.node_rank,
        "master_addr": layout.master_addr,
        "master_port": layout.master_port,
        "device": layout.device,
        "policy": layout.policy.model_dump() if layout.policy is not None else None,
        "nodes": layout.nodes(),
    }


# ----------------------------------------------------------------------------------------------------------------
# deepspeed


def _read_hostfile(path: Path) -> list[tuple[str, int]]:
    """``host slots=N`` lines of a DeepSpeed hostfile (comments and blank lines skipped)."""
    if not path.is_file():
        raise LaunchError(f"hostfile not found: {path}")
    hosts = []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"(\S+)\s+slots\s*=\s*(\d+)", line)
        if match is None:
            raise LaunchError(f"{path}:{number}: expected 'HOST slots=N', got {raw!r}")
        hosts.append((match.group(1), int(match.group(2))))
    if not hosts:
        raise LaunchError(f"{path}: no hosts")
    return hosts


def _deepspeed_parser() -> argparse.ArgumentParser:
    parser = _parser(
        "launch/deepspeed.sh",
        "Run a memrl command with the DeepSpeed launcher over a hostfile (written from --hosts or the Slurm node "
        "list when not given). Multi-node runs reach the other nodes with --launcher (pdsh needs passwordless ssh).",
    )
    parser.add_argument("--hostfile", help="existing DeepSpeed hostfile ('HOST slots=N' lines)")
    parser.add_argument("--hosts", help="comma-separated hosts or a Slurm host list (gpu[01-04]) to write a hostfile")
    parser.add_argument("--hostfile-out", help="where to write the generated hostfile (default: $TMPDIR)")
    parser.add_argument("--num-nodes", type=int, help="use the first N hosts (default: all)")
    parser.add_argument("--num-gpus", type=int, help="processes per node (default: slots, or the visible GPUs)")
    parser.add_argument("--master-addr", help="rendezvous host (default: the first host)")
    parser.add_argument("--master-port", type=int, help="rendezvous port (default: MASTER_PORT, job id, 29500)")
    parser.add_argument("--launcher", default="pdsh", choices=["pdsh", "openmpi", "mvapich", "slurm", "mpich", "impi"],
                        help="how DeepSpeed reaches the other nodes (default pdsh)")
    parser.add_argument("--module", default="launch.cli", help="Python module to run (default: launch.cli = memrl)")
    _device_argument(parser)
    return parser


def plan_deepspeed(argv: Sequence[str], env: Mapping[str, str]) -> Plan:
    """Plan ``launch/deepspeed.sh [options] [--] COMMAND...``."""
    parser = _deepspeed_parser()
    own, command = _split_command(argv)
    args = parser.parse_args(own)
    if args.help:
        return _help_plan(parser)
    if not command and args.module == "launch.cli":
        raise LaunchError("give the memrl command to run after the options, e.g. -- sft --config FILE")
    if args.hostfile and args.hosts:
        raise LaunchError("give --hostfile or --hosts, not both")
    slurm = SlurmEnv.from_env(env)
    gpus = gpus_on_node(env)
    device = _resolve_device(args.device, gpus)
    memrl = MemrlCommand(command)
    kind = command_kind(args.module, memrl)
    single = not kind.distributed
    policy = _policy_of(kind, args.module, memrl)
    if policy is not None and (device == "cpu" or single):
        policy = policy.model_copy(update={"mode": "colocate", "gpus_per_node": 0})
    kept = policy.gpus_per_node if policy is not None else 0
    default_slots = gpus - kept if device == "gpu" else 1
    if args.hostfile:
        entries = _read_hostfile(Path(args.hostfile))
        hostfile_path, write = args.hostfile, False
    else:
        if args.hosts:
            names = expand_hostlist(args.hosts)
        elif slurm is not None and slurm.hosts:
            names = slurm.hosts
        else:
            names = ["localhost"]
        entries = [(name, default_slots) for name in names]
        tag = (slurm.job_id if slurm and slurm.job_id else None) or str(os.getpid())
        hostfile_path = args.hostfile_out or str(Path(env.get("TMPDIR") or "/tmp") / f"memrl-hostfile-{tag}")
        write = True
    if args.num_nodes is not None:
        if not 1 <= args.num_nodes <= len(entries):
            raise LaunchError(f"--num-nodes {args.num_nodes}: the hostfile lists {len(entries)} host(s)")
        entries = entries[: args.num_nodes]
    nproc = 1 if single else args.num_gpus if args.num_gpus is not None else min(slots for _, slots in entries)
    if nproc < 1:
        raise LaunchError(f"no process to start per node (slots / GPUs = {nproc})")
    master = args.master_addr or ("127.0.0.1" if entries[0][0] == "localhost" else entries[0][0])
    layout = TrainLayout(
        hosts=[h for h, _ in entries],
        nproc_per_node=nproc,
        node_rank=0,
        master_addr=master,
        master_port=_master_port(args.master_port, env, slurm),
        device=device,
        gpus_per_node=gpus,
        policy=policy,
        single_process=single,
        label=kind.label,
    )
    launch_env = _launch_env(layout, env)
    hostfile_text = "".join(f"{host} slots={slots}\n" for host, slots in entries)
    if single:
        # Not distributed: one plain process on this node, without the DeepSpeed launcher or a hostfile.
        cmd = [sys.executable, "-m", args.module, *command]
        lines = ["memrl deepspeed", *_ignored_for_single(kind, num_gpus=args.num_gpus),
                 *layout.describe(this_node=False),
                 "it runs here, on the node that runs this script: no DeepSpeed launcher, no hostfile",
                 f"command: {_command_line(launch_env, cmd)}"]  # fmt: skip
        info = {"launcher": "deepspeed", "layout": _layout_info(layout), "hostfile": None,
                "hostfile_text": "", "env": launch_env, "command": cmd}  # fmt: skip
        shell_single: dict[str, str | list[str]] = {
            "launch_env": [f"{k}={v}" for k, v in launch_env.items()], "launch_cmd": cmd,
            "hostfile_path": hostfile_path, "hostfile_text": "", "write_hostfile": "0",
        }  # fmt: skip
        return Plan(lines, shell_single, info, args.dry_run)
    # DeepSpeed ssh-checks every host of a hostfile, this one included: a single local node runs without one.
    local = layout.nnodes == 1 and entries[0][0] in ("localhost", "127.0.0.1", socket.gethostname())
    if local:
        write = False
        placement_args = ["--num_gpus", str(nproc), "--master_port", str(layout.master_port)]
    else:
        placement_args = [
            "--hostfile", hostfile_path,
            "--num_nodes", str(layout.nnodes),
            "--num_gpus", str(nproc),
            "--master_addr", layout.master_addr,
            "--master_port", str(layout.master_port),
            "--launcher", args.launcher,
        ]  # fmt: skip
    cmd = [
        sys.executable, "-m", "deepspeed.launcher.runner", *placement_args,
        "--no_local_rank", "--module", args.module, *command,
    ]  # fmt: skip
    lines = ["memrl deepspeed", *layout.describe(this_node=False)]
    if local:
        lines.append("single local node: no hostfile (DeepSpeed would ssh to every host it lists)")
    else:
        lines.append(f"hostfile {hostfile_path}{' (written at launch)' if write else ''}:")
        lines += ["  " + ln for ln in hostfile_text.splitlines()]
        lines.append(f"the launcher reaches the other nodes with {args.launcher}; run this on the first node only")
    lines.append(f"command: {_command_line(launch_env, cmd)}")
    info = {
        "launcher": "deepspeed",
        "layout": _layout_info(layout),
        "hostfile": None if local else hostfile_path,
        "hostfile_text": hostfile_text,
        "env": launch_env,
        "command": cmd,
    }
    shell: dict[str, str | list[str]] = {
        "launch_env": [f"{k}={v}" for k, v in launch_env.items()],
        "launch_cmd": cmd,
        "hostfile_path": hostfile_path,
        "hostfile_text": hostfile_text,
        "write_hostfile": str(int(write)),
    }
    return Plan(lines, shell, info, args.dry_run)


# ----------------------------------------------------------------------------------------------------------------
# vLLM OpenAI-compatible servers


class ServeSpec(ConfigModel):
    """A served frozen model, parsed from ``MODEL[,key=value...]`` (keys: the fields below but ``model``).

    Every node runs ``replicas`` servers (default: as many as fit, GPUs // tp) on consecutive ports.
    """

    model: str
    name: str | None = None
    nodes: int = Field(1, ge=1)
    tp: int = Field(1, ge=1)
    replicas: int | None = Field(None, ge=1)
    max_model_len: int | None = Field(32768, ge=1)
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)

    @classmethod
    def parse(cls, text: str) -> ServeSpec:
        """Parse the comma-separated spec string."""
        model, *pairs = [p.strip() for p in text.split(",")]
        if not model or "=" in model:
            raise LaunchError(f"serve spec {text!r}: it starts with the model id, e.g. Qwen/Qwen3.5-35B-A3B,tp=2")
        fields: dict[str, Any] = {"model": model}
        for pair in pairs:
            if "=" not in pair:
                raise LaunchError(f"serve spec {text!r}: expected key=value, got {pair!r}")
            key, value = pair.split("=", 1)
            if key not in cls.model_fields or key == "model":
                keys = ", ".join(list(cls.model_fields)[1:])
                raise LaunchError(f"serve spec {text!r}: unknown key {key!r}; keys: {keys}")
            fields[key] = None if value.lower() == "none" else value
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            raise LaunchError(f"serve spec {text!r}: {exc}") from None

    @property
    def served_name(self) -> str:
        """The model name clients send (``--served-model-name``)."""
        return self.name or self.model

    def replicas_per_node(self, gpus: int, device: Device) -> int:
        """Servers per node: as configured, else as many as fit."""
        if device == "cpu":
            return self.replicas or 1
        fit = gpus // self.tp
        if fit < 1:
            raise LaunchError(f"{self.model}: TP {self.tp} needs {self.tp} GPUs per node, a node has {gpus}")
        if self.replicas is not None and self.replicas > fit:
            raise LaunchError(f"{self.model}: {self.replicas} replicas x TP {self.tp} need more than {gpus} GPUs")
        return self.replicas or fit


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def _vllm_replicas(
    spec: ServeSpec, *, gpu_ids: list[str], device: Device, port: int, bind: str, extra: Sequence[str]
) -> list[tuple[dict[str, str], list[str], int]]:
    """(environment, command, port) of every server replica on one node."""
    count = spec.replicas_per_node(len(gpu_ids), device)
    out = []
    for i in range(count):
        cmd = [
            sys.executable, "-m", VLLM_SERVER_MODULE,
            "--model", spec.model,
            "--served-model-name", spec.served_name,
            "--host", bind,
            "--port", str(port + i),
            "--tensor-parallel-size", str(spec.tp if device == "gpu" else 1),
            "--gpu-memory-utilization", f"{spec.gpu_memory_utilization:g}",
        ]  # fmt: skip
        if spec.max_model_len is not None:
            cmd += ["--max-model-len", str(spec.max_model_len)]
        if device == "cpu":
            cmd += ["--dtype", "float32", "--enforce-eager"]
        cmd += list(extra)
        env = {"CUDA_VISIBLE_DEVICES": ",".join(gpu_ids[i * spec.tp : (i + 1) * spec.tp])} if device == "gpu" else {}
        out.append((env, cmd, port + i))
    return out


def _serve_parser() -> argparse.ArgumentParser:
    parser = _parser(
        "launch/serve_endpoints.sh run|start",
        "Start vLLM OpenAI-compatible servers for one frozen model on this node: REPLICAS servers of TP GPUs each on "
        "consecutive ports. Arguments after -- go to every vLLM server.",
    )
    parser.add_argument("--model", help="model id or directory (required)")
    parser.add_argument("--served-model-name", help="name clients send (default: the model)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per server (default 1)")
    parser.add_argument("--replicas", type=int, help="servers on this node (default: as many as fit)")
    parser.add_argument("--port", type=int, default=8000, help="port of the first server (default 8000)")
    parser.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    parser.add_argument("--advertise-host", help="host name clients use (default: this host's name)")
    parser.add_argument("--gpus", help="GPU ids to use (default: CUDA_VISIBLE_DEVICES or all visible GPUs)")
    parser.add_argument("--max-model-len", help="context length per server, or 'none' for the model's own (default: "
                        "32768 on GPU, the model's own on CPU)")
    parser.add_argument("--gpu-memory-utilization", type=float,
                        help="fraction of memory vLLM reserves (default 0.9 on GPU, 0.15 of host memory on CPU)")
    parser.add_argument("--log-dir", default="logs/serve", help="one log file per server (default logs/serve)")
    _device_argument(parser)
    return parser


def plan_serve(argv: Sequence[str], env: Mapping[str, str]) -> Plan:
    """Plan ``launch/serve_endpoints.sh run [options] [-- vLLM args]`` on this node."""
    parser = _serve_parser()
    argv = list(argv)
    own, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = parser.parse_args(own)
    if args.help:
        return _help_plan(parser)
    if not args.model:
        raise LaunchError("--model is required")
    gpus = gpus_on_node(env)
    device = _resolve_device(args.device, gpus)
    if args.gpus:
        gpu_ids = [g.strip() for g in args.gpus.split(",") if g.strip()]
    elif env.get("CUDA_VISIBLE_DEVICES") and device == "gpu":
        gpu_ids = [g.strip() for g in env["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    else:
        gpu_ids = [str(i) for i in range(gpus)]
    if args.max_model_len is None:
        max_len = 32768 if device == "gpu" else None
    else:
        max_len = None if args.max_model_len.lower() == "none" else int(args.max_model_len)
    util = args.gpu_memory_utilization or (0.9 if device == "gpu" else 0.15)
    try:
        spec = ServeSpec(model=args.model, name=args.served_model_name, tp=args.tp, replicas=args.replicas,
                         max_model_len=max_len, gpu_memory_utilization=util)
    except ValidationError as exc:
        raise LaunchError(str(exc)) from None
    replicas = _vllm_replicas(spec, gpu_ids=gpu_ids, device=device, port=args.port, bind=args.host, extra=extra)
    host = socket.gethostname()
    advertise = args.advertise_host or ("127.0.0.1" if args.host in ("127.0.0.1", "localhost") else host)
    log_dir = Path(args.log_dir)
    logs = [str(log_dir / f"{_safe(spec.served_name)}-{_safe(host)}-{port}.log") for _, _, port in replicas]
    endpoints = [f"http://{advertise}:{port}/v1" for _, _, port in replicas]
    health = [f"http://127.0.0.1:{port}/health" for _, _, port in replicas]
    lines = [
        f"memrl serve: {spec.served_name} on {host}: {len(replicas)} server(s) x TP {spec.tp if device == 'gpu' else 1}"
        f" on {device.upper()}",
        *_table(
            ["server", "GPUs", "port", "endpoint", "log"],
            [[i, env_.get("CUDA_VISIBLE_DEVICES", "-"), port, endpoints[i], logs[i]]
             for i, (env_, _, port) in enumerate(replicas)],
        ),
        "commands:",
        *[f"  {_command_line(env_, cmd)}" for env_, cmd, _ in replicas],
    ]
    shell: dict[str, str | list[str]] = {
        "log_dir": str(log_dir),
        "replica_count": str(len(replicas)),
        "replica_logs": logs,
        "health_urls": health,
        "endpoints": endpoints,
    }
    for i, (env_, cmd, _) in enumerate(replicas):
        shell[f"replica_{i}"] = ["env", *(f"{k}={v}" for k, v in env_.items()), *cmd]
    info = {
        "model": spec.model,
        "served_model_name": spec.served_name,
        "device": device,
        "replicas": [{"env": e, "command": c, "port": p} for e, c, p in replicas],
        "endpoints": endpoints,
        "health_urls": health,
        "logs": logs,
    }
    return Plan(lines, shell, info, args.dry_run)


# ----------------------------------------------------------------------------------------------------------------
# Slurm: served reasoner / committee on dedicated nodes, training on the rest

SETUPS: dict[str, dict[str, Any]] = {
    # SAM memory model (Qwen3.5-9B, trained): a frozen 35B-class reasoner (MoE, 4 x TP-2 servers per node) and an
    # open-weight committee member; the paper's frontier committee can be listed as API endpoints instead.
    "sam-9b": {
        "reasoner": "Qwen/Qwen3.5-35B-A3B,nodes=1,tp=2",
        "committee": ["Qwen/Qwen3.5-122B-A10B,nodes=1,tp=8"],
    },
    # Proactive intervention agent (Qwen3.5-27B, trained) beside a frozen 122B-class action agent; pivot-turn GRPO
    # scores continuations with verifiers, so no committee.
    "proactive-27b": {
        "reasoner": "Qwen/Qwen3.5-122B-A10B,nodes=2,tp=8",
        "committee": [],
    },
    "none": {"reasoner": None, "committee": []},
}
AUTO_SETUP = {"train oat-grpo": "sam-9b", "train pivot-grpo": "proactive-27b"}


@dataclass
class _Service:
    label: str  # reasoner, committee0, judge
    role: str
    spec: ServeSpec
    hosts: list[str]
    replicas: int
    ports: list[int]

    @property
    def endpoints(self) -> list[str]:
        return [f"http://{h}:{p}/v1" for h in self.hosts for p in self.ports]

    def served(self) -> ServedModel:
        return ServedModel(model=self.spec.served_name, endpoints=self.endpoints)


def _slurm_parser() -> argparse.ArgumentParser:
    parser = _parser(
        "launch/slurm/memrl.sbatch",
        "Inside a Slurm job: start vLLM servers for the frozen reasoner / committee / judge on dedicated nodes, "
        "wait for their health checks, pass their endpoints to the run as placement.* overrides, train on the "
        "remaining nodes with launch/torchrun.sh, and stop the servers when training ends.",
    )
    parser.add_argument("--setup", default="auto", choices=["auto", *SETUPS],
                        help="served models of a paper setup (auto: sam-9b for 'train oat-grpo', proactive-27b for "
                        "'train pivot-grpo', none otherwise)")
    parser.add_argument("--reasoner", help="frozen reasoner / action agent spec, or 'none' (overrides the setup)")
    parser.add_argument("--committee", action="append",
                        help="committee member spec (repeat for several; 'none' for no committee)")
    parser.add_argument("--judge", help="judge spec, or 'none' (default: none served)")
    parser.add_argument("--nodes", type=int, default=4, help="nodes to plan for outside an allocation (dry run)")
    parser.add_argument("--hosts", help="host list to plan for instead of SLURM_JOB_NODELIST (dry run)")
    parser.add_argument("--gpus-per-node", type=int, help="default: SLURM_GPUS_ON_NODE (8 in a dry run outside Slurm)")
    parser.add_argument("--port", type=int, default=8000, help="port of the first server on every serving node")
    parser.add_argument("--master-port", type=int, help="training rendezvous port (default: from the job id)")
    parser.add_argument("--health-timeout", type=int, default=1800, help="seconds to wait for the servers (1800)")
    parser.add_argument("--max-restarts", type=int, default=20,
                        help="requeue at most this many times when the time limit nears (SIGUSR1); 0 disables")
    parser.add_argument("--log-dir", help="server logs and endpoints.yaml (default: RUN_DIR/slurm)")
    return parser


def _services(args: argparse.Namespace, stage: str) -> tuple[str, list[tuple[str, str, ServeSpec]]]:
    setup = AUTO_SETUP.get(stage, "none") if args.setup == "auto" else args.setup
    chosen = SETUPS[setup]
    reasoner = args.reasoner if args.reasoner is not None else chosen["reasoner"]
    committee = chosen["committee"] if args.committee is None else [c for c in args.committee if c.lower() != "none"]
    out = []
    if reasoner and reasoner.lower() != "none":
        out.append(("reasoner", "reasoner", ServeSpec.parse(reasoner)))
    out += [(f"committee{i}", "committee", ServeSpec.parse(c)) for i, c in enumerate(committee)]
    if args.judge and args.judge.lower() != "none":
        out.append(("judge", "judge", ServeSpec.parse(args.judge)))
    return setup, out


def plan_slurm(argv: Sequence[str], env: Mapping[str, str]) -> Plan:
    """Plan ``launch/slurm/memrl.sbatch [options] [--] COMMAND...`` for the whole allocation."""
    parser = _slurm_parser()
    own, command = _split_command(argv)
    args = parser.parse_args(own)
    if args.help:
        return _help_plan(parser)
    if not command:
        raise LaunchError("give the memrl command to run after the options, e.g. -- train oat-grpo --config FILE")
    slurm = SlurmEnv.from_env(env)
    if slurm is None and not args.dry_run:
        raise LaunchError("not inside a Slurm allocation: submit with sbatch, or plan with --dry-run")
    notes = []
    if args.hosts:
        hosts = expand_hostlist(args.hosts)
    elif slurm is not None and slurm.job_hosts:
        hosts = slurm.job_hosts
    else:
        hosts = [f"node{i + 1}" for i in range(args.nodes)]
        notes.append(f"no allocation: placeholder hosts {hosts[0]}..{hosts[-1]}")
    if args.gpus_per_node is not None:
        gpus = args.gpus_per_node
    elif slurm is not None:
        gpus = gpus_on_node(env)
    else:
        gpus = 8
        notes.append("no allocation: assuming 8 GPUs per node")
    device: Device = "gpu" if gpus > 0 else "cpu"
    job_id = slurm.job_id if slurm and slurm.job_id else "dryrun"
    memrl = MemrlCommand(command)
    stage = memrl.stage
    kind = command_kind("launch.cli", memrl)
    view = launch_view(memrl)
    setup, wanted = _services(args, stage)

    # Dedicated nodes for every served model, in order; training gets the rest.
    services: list[_Service] = []
    free = list(hosts)
    for label, role, spec in wanted:
        if len(free) < spec.nodes + 1:
            need = sum(s.nodes for _, _, s in wanted) + 1
            raise LaunchError(
                f"{len(hosts)} node(s) cannot hold the served models and training: {label} ({spec.model}) needs "
                f"{spec.nodes} node(s); the plan needs at least {need} (use more nodes, fewer servers, or --setup none)"
            )
        mine, free = free[: spec.nodes], free[spec.nodes :]
        count = spec.replicas_per_node(gpus, device)
        services.append(_Service(label, role, spec, mine, count, [args.port + i for i in range(count)]))
    train_hosts = free
    if not train_hosts:
        raise LaunchError("no node left for training")
    idle_hosts: list[str] = []
    if not kind.distributed:
        # One process: the first remaining node runs it, the others stay idle.
        train_hosts, idle_hosts = train_hosts[:1], train_hosts[1:]

    extra_overrides: list[str] = []
    run_name = view.run.name
    if run_name is None:
        # A fixed name lets a requeued job find its run directory and resume it.
        run_name = f"{(slurm.job_name if slurm and slurm.job_name else 'memrl')}-{job_id}"
        extra_overrides.append(f"run.name={run_name}")
    run_dir = Path(view.run.output_dir) / run_name
    log_dir = Path(args.log_dir) if args.log_dir else run_dir / "slurm"
    placement: dict[str, Any] = {}
    for role in ("reasoner", "judge"):
        chosen = [s for s in services if s.role == role]
        if chosen:
            placement[role] = chosen[0].served().model_dump(exclude_none=True)
            extra_overrides.append(f"placement.{role}={json.dumps(placement[role])}")
    committee = [s.served().model_dump(exclude_none=True) for s in services if s.role == "committee"]
    if committee:
        placement["committee"] = committee
        extra_overrides.append(f"placement.committee={json.dumps(committee)}")
    restarts = slurm.restart_count if slurm else 0
    resumable = _resumable(stage)
    resume = restarts > 0 and resumable and not memrl.has_resume
    train_argv = [*command, *extra_overrides, *(["--resume"] if resume else [])]

    policy = view.placement.policy if kind.policy_engine else None
    master_port = _master_port(args.master_port, env, slurm)
    layout = _train_layout(
        nnodes=len(train_hosts), nproc_per_node=None if device == "gpu" else 1, node_rank=0,
        master_addr=train_hosts[0], master_port=master_port, device_choice=device, policy=policy,
        env={**env, "SLURM_GPUS_ON_NODE": str(gpus)}, hosts=train_hosts, kind=kind,
    )  # fmt: skip
    step_resources = ["--exclusive", "--kill-on-bad-exit=1"]
    if device == "gpu":
        step_resources += [f"--gpus-per-node={gpus}"]
    if slurm is not None and slurm.cpus_on_node:
        step_resources += [f"--cpus-per-task={slurm.cpus_on_node}"]

    def srun(nodes: list[str]) -> list[str]:
        return ["srun", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1",
                f"--nodelist={','.join(nodes)}", *step_resources]  # fmt: skip

    shell: dict[str, str | list[str]] = {"serve_count": str(len(services))}
    serve_logs, serve_info = [], []
    lines = [
        f"memrl slurm: job {job_id}, {len(hosts)} node(s) x {gpus} GPU(s), setup {setup}"
        + (f" (auto for '{stage}')" if args.setup == "auto" else ""),
        *[f"note: {n}" for n in notes],
        f"run directory: {run_dir} (server logs and endpoints.yaml in {log_dir})",
    ]
    rows = []
    for s in services:
        for h in s.hosts:
            rows.append([h, s.label, f"{s.spec.served_name}: {s.replicas} server(s) x TP {s.spec.tp}, ports "
                         f"{_ranges(s.ports[0], s.ports[-1])}"])
    for n in layout.nodes():
        if layout.single_process:
            rows.append([n["host"], "run", f"{kind.label}, one process"])
        else:
            rows.append([n["host"], "train", f"node rank {n['node']}, global ranks {_ranges(*n['global_ranks'])}"])
    rows += [[h, "idle", f"nothing ({kind.label} runs in one process)"] for h in idle_hosts]
    lines += ["nodes:", *_table(["host", "role", "runs"], rows)]
    for i, s in enumerate(services):
        replicas = _vllm_replicas(
            s.spec, gpu_ids=[str(g) for g in range(gpus)], device=device, port=args.port, bind="0.0.0.0", extra=[]
        )
        serve_cmd = [
            *srun(s.hosts), "bash", str(ROOT / "launch" / "serve_endpoints.sh"), "run",
            "--model", s.spec.model, "--served-model-name", s.spec.served_name,
            "--tp", str(s.spec.tp), "--replicas", str(s.replicas), "--port", str(args.port),
            "--max-model-len", str(s.spec.max_model_len).lower(),
            "--gpu-memory-utilization", f"{s.spec.gpu_memory_utilization:g}",
            "--device", device, "--log-dir", str(log_dir / s.label),
        ]  # fmt: skip
        shell[f"serve_{i}"] = serve_cmd
        serve_logs.append(str(log_dir / f"serve-{s.label}.log"))
        serve_info.append({"label": s.label, "role": s.role, "model": s.spec.model, "hosts": s.hosts,
                           "replicas_per_node": s.replicas, "ports": s.ports, "endpoints": s.endpoints,
                           "command": serve_cmd})  # fmt: skip
        lines += [
            f"[serve {s.label}] {shlex.join(serve_cmd)}",
            "  which starts on each of its nodes:",
            *[f"    {_command_line(e, c)}" for e, c, _ in replicas],
        ]
    health = [u.replace("/v1", "/health") for s in services for u in s.endpoints]
    if services:
        lines.append(f"[wait] up to {args.health_timeout} s for: {' '.join(health)}")
        lines.append("endpoints (as placement.* overrides of the run):")
        lines += [f"  {o}" for o in extra_overrides if o.startswith("placement.")]
    train_cmd = [
        *srun(train_hosts), "bash", str(ROOT / "launch" / "torchrun.sh"),
        "--nnodes", str(layout.nnodes), "--nproc-per-node", str(layout.nproc_per_node),
        "--master-addr", layout.master_addr, "--master-port", str(master_port),
        "--device", device, "--", *train_argv,
    ]  # fmt: skip
    if layout.single_process:
        lines += [*layout.describe(this_node=False),
                  f"[run] {shlex.join(train_cmd)}"]  # fmt: skip
    else:
        lines += [*layout.describe(), f"[train] {shlex.join(train_cmd)}"]
    if services:
        lines.append("[stop] when training ends (or the job is cancelled / preempted): SIGTERM to the server steps")
    if resume:
        lines.append(f"restart {restarts} of this job: resuming the run with --resume")
    auto_requeue = resumable and args.max_restarts > 0
    lines.append(
        f"on SIGUSR1 (time limit near): requeue the job (restart {restarts + 1} of at most {args.max_restarts}); "
        "it resumes from the newest checkpoint"
        if auto_requeue
        else f"on SIGUSR1 (time limit near): nothing ('{stage}' cannot --resume or --max-restarts is 0)"
    )
    endpoints_text = yaml.safe_dump({"placement": placement}, sort_keys=False) if placement else ""
    shell.update(
        {
            "log_dir": str(log_dir),
            "serve_logs": serve_logs,
            "health_urls": health,
            "health_timeout": str(args.health_timeout),
            "endpoints_file": str(log_dir / "endpoints.yaml"),
            "endpoints_text": endpoints_text,
            "train_cmd": train_cmd,
            "auto_requeue": str(int(auto_requeue)),
            "max_restarts": str(args.max_restarts),
        }
    )
    info = {
        "launcher": "slurm",
        "job_id": job_id,
        "setup": setup,
        "hosts": hosts,
        "gpus_per_node": gpus,
        "services": serve_info,
        "train_hosts": train_hosts,
        "idle_hosts": idle_hosts,
        "layout": _layout_info(layout),
        "overrides": extra_overrides,
        "resume": resume,
        "run_dir": str(run_dir),
        "log_dir": str(log_dir),
        "placement": placement,
        "train_command": train_cmd,
        "health_urls": health,
    }
    return Plan(lines, shell, info, args.dry_run)


# ----------------------------------------------------------------------------------------------------------------
# Command line

PLANNERS: dict[str, Callable[[Sequence[str], Mapping[str, str]], Plan]] = {
    "torchrun": plan_torchrun,
    "deepspeed": plan_deepspeed,
    "serve": plan_serve,
    "slurm": plan_slurm,
}


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """``python -m launch.layout {torchrun,deepspeed,serve,slurm} [--format text|json|shell] ARGS...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ if env is None else env)
    if not argv or argv[0] not in PLANNERS:
        print(f"usage: python -m launch.layout {{{','.join(PLANNERS)}}} [--dry-run] [--format text|json|shell] ...",
              file=sys.stderr)
        return 2
    kind, rest = argv[0], argv[1:]
    fmt = "text"
    for i, arg in enumerate(rest):
        if arg == "--":
            break
        if arg == "--format" and i + 1 < len(rest):
            fmt = rest[i + 1]
        elif arg.startswith("--format="):
            fmt = arg.split("=", 1)[1]
    try:
        plan = PLANNERS[kind](rest, env)
    except LaunchError as exc:
        print(f"memrl launch ({kind}): error: {exc}", file=sys.stderr)
        return 2
    print(plan.render(fmt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
