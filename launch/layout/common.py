"""Shared pieces of the launch plans: the memrl command being launched and the run-config sections the launchers
read, the plan object, and the training world layout every launcher starts from (hosts and devices: hosts.py)."""

from __future__ import annotations

import argparse
import json
import shlex
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from memrl.data.config import (
    ConfigError,
    ConfigModel,
    PlacementConfig,
    PolicyPlacement,
    RunConfig,
    apply_overrides,
)
from memrl.launch.layout.hosts import (
    Device,
    LaunchError,
    SlurmEnv,
    cpu_count,
    gpus_on_node,
    rendezvous_port,
    resolve_device,
)
from memrl.rollout.fleet import FleetConfig

LAUNCH_DIR = Path(__file__).resolve().parents[1]
"""The launch scripts' folder: ``launch/`` of a checkout, ``memrl/launch/`` of an installed wheel."""
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


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
    """The parts of a run's config the launchers read: where the run writes, how rollouts are placed and how many
    rollout workers the fleet has."""

    run: RunConfig = RunConfig()
    placement: PlacementConfig = PlacementConfig()
    fleet: FleetConfig = FleetConfig()


def launch_view(command: MemrlCommand) -> LaunchView:
    """Read ``run``, ``placement`` and ``fleet`` from the command's config file and overrides (other sections are
    not read)."""
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
        data = {key: loaded[key] for key in LaunchView.model_fields if key in loaded}
    wanted = [o for o in command.overrides if o.split("=", 1)[0].split(".")[0] in LaunchView.model_fields]
    try:
        return LaunchView.model_validate(apply_overrides(LaunchView, data, wanted))
    except (ConfigError, ValidationError) as exc:
        raise LaunchError(f"{source}: {exc}") from None


def is_resumable(stage: str) -> bool:
    """Whether the job ``stage`` (``train oat-grpo``) takes ``--resume``."""
    from memrl.launch.jobs import JOBS

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
    if module != "memrl.launch.cli":
        # Another module (a benchmark, a probe) is started as asked, once per process of the layout.
        return CommandKind(f"python -m {module}", distributed=True, policy_engine=False)
    from memrl.launch.jobs import JOBS

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


def index_range(lo: int, hi: int) -> str:
    """``lo-hi`` (``lo`` alone when they are equal): a range of ranks or GPU indices as the plans print it."""
    return str(lo) if lo == hi else f"{lo}-{hi}"


def text_table(header: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "  ") -> list[str]:
    """``rows`` under ``header`` as left-aligned text columns, one line each."""
    cells = [list(map(str, header)), *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]


def shell_command(env: Mapping[str, str], cmd: Sequence[str]) -> str:
    """``cmd`` as one shell-quoted line, prefixed with ``env K=V ...`` when ``env`` is not empty."""
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
    fleet_engines: int = 0  # policy engines of the Ray rollout fleet (0: the main process's own engine)

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
            return index_range(self.nproc_per_node, self.nproc_per_node + self.policy.gpus_per_node - 1)
        return "shared"

    def _train_gpus(self, node: int) -> str:
        if self.device == "cpu" or not self.global_ranks(node):
            return "-"
        if self.single_process:
            return index_range(0, self.gpus_per_node - 1)  # the one process sees every GPU of its node
        return index_range(0, self.nproc_per_node - 1)

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
        if self.fleet_engines:
            return (
                f"policy vLLM engines: the rollout fleet's {self.fleet_engines} Ray worker(s) (above), driven by "
                f"the main process"
            )
        if self.single_process:
            where = "its CPU" if self.device == "cpu" else "its node's GPUs"
            return f"policy vLLM engine: built inside that one process, on {where}"
        if self.device == "cpu":
            return "policy vLLM engine: colocated with training on CPU (no sleep mode on CPU)"
        if policy.mode == "colocate":
            sleep = f"sleep level {policy.sleep_level} during updates" if policy.sleep_level else "never sleeps"
            return (
                f"policy vLLM engine: on the main process, colocated on node 0's training GPU(s) "
                f"{index_range(0, policy.tensor_parallel_size - 1)} (TP {policy.tensor_parallel_size}, "
                f"{policy.gpu_memory_utilization:g} of GPU memory, {sleep})"
            )
        first = self.nproc_per_node
        tp = policy.tensor_parallel_size
        idle = policy.gpus_per_node * self.nnodes - tp
        return (
            f"policy vLLM engine: on the main process, GPU(s) {index_range(first, first + tp - 1)} of node 0 "
            f"(TP {tp}); GPU(s) {self._engine_gpus()} kept from training on every node, {idle} of them idle"
        )

    def _describe_single(self, this_node: bool) -> list[str]:
        where = "CPU" if self.device == "cpu" else f"all {self.gpus_per_node} GPU(s) of its node visible to it"
        lines = [f"{self.label} runs in one process (it is not distributed): node rank 0 ({self.hosts[0]}), {where}"]
        if self.nnodes > 1:
            lines.append(f"node rank(s) {index_range(1, self.nnodes - 1)} start nothing")
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
            lines.append(
                f"this node: node rank {self.node_rank} ({self.hosts[self.node_rank]}), global ranks "
                f"{index_range(ranks[0], ranks[-1])}, local ranks {index_range(0, self.nproc_per_node - 1)}"
            )
        engine = self._engine_line()
        if engine:
            lines.append(engine)
        header = ["node", "host", "global ranks", "local ranks", "training GPUs"]
        rows = [[n["node"], n["host"], index_range(*n["global_ranks"]), index_range(*n["local_ranks"]), n["train_gpus"]]
                for n in self.nodes()]  # fmt: skip
        if self.policy is not None:
            header.append("policy-engine GPUs")
            rows = [[*row, n["engine_gpus"]] for row, n in zip(rows, self.nodes(), strict=True)]
        lines += text_table(header, rows)
        return lines


def train_layout(
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
    device = resolve_device(device_choice, gpus)
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
        master_port=rendezvous_port(master_port, env, slurm),
        device=device,
        gpus_per_node=gpus,
        policy=policy,
        single_process=single,
        label=kind.label if kind is not None else "the command",
    )


def training_env(layout: TrainLayout, env: Mapping[str, str]) -> dict[str, str]:
    """Environment of the training processes (only what the launcher adds; memrl is imported from the installed
    package, so no checkout goes on ``PYTHONPATH``)."""
    out = {"PYTHONUNBUFFERED": "1"}
    if "OMP_NUM_THREADS" not in env:
        # torchrun would otherwise pin every process to 1 thread.
        out["OMP_NUM_THREADS"] = str(max(1, cpu_count() // layout.nproc_per_node))
    if layout.device == "cpu":
        out["DS_ACCELERATOR"] = "cpu"
    return out


# ----------------------------------------------------------------------------------------------------------------
# Argument handling shared by the subcommands


_FLAGS = {"--dry-run", "-h", "--help"}


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
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


def launcher_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The argument parser every launcher subcommand starts from (``--help``, ``--dry-run``, ``--format``)."""
    parser = argparse.ArgumentParser(prog=prog, description=description, add_help=False)
    parser.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    parser.add_argument("--dry-run", action="store_true", help="print the layout and commands, start nothing")
    parser.add_argument("--format", choices=["text", "json", "shell"], default="text", help=argparse.SUPPRESS)
    return parser


def launcher_args(
    parser: argparse.ArgumentParser, argv: Sequence[str], example: str = "sft --config FILE"
) -> tuple[argparse.Namespace, list[str]]:
    """``[launcher options] [--] COMMAND...`` parsed: the options and the command. Without ``--help``, a launcher of
    the memrl CLI (``--module`` left at ``memrl.launch.cli``, or none) needs a command (the error shows ``example``)."""
    own, command = split_command(argv)
    args = parser.parse_args(own)
    if not args.help and not command and getattr(args, "module", "memrl.launch.cli") == "memrl.launch.cli":
        raise LaunchError(f"give the memrl command to run after the options, e.g. -- {example}")
    return args, command


def help_plan(parser: argparse.ArgumentParser) -> Plan:
    """The plan that prints ``parser``'s help and starts nothing."""
    return Plan(parser.format_help().rstrip().splitlines(), {}, {"help": True}, dry_run=True)


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--device auto|gpu|cpu`` to ``parser``."""
    parser.add_argument(
        "--device",
        choices=["auto", "gpu", "cpu"],
        default="auto",
        help="gpu (NCCL) or cpu (gloo, DS_ACCELERATOR=cpu); auto = gpu when one is visible",
    )
