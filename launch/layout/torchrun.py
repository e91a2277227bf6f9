"""``launch/torchrun.sh``: one torchrun per node (:func:`plan_torchrun`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from memrl.data.config import (
    PolicyPlacement,
)
from memrl.launch.layout.common import (
    CommandKind,
    MemrlCommand,
    Plan,
    TrainLayout,
    add_device_argument,
    command_kind,
    help_plan,
    launch_view,
    launcher_args,
    launcher_parser,
    shell_command,
    train_layout,
    training_env,
)


def _torchrun_parser() -> argparse.ArgumentParser:
    parser = launcher_parser(
        "launch/torchrun.sh",
        "Run a memrl command under torchrun on this node. Unset values come from Slurm variables when inside an "
        "allocation, else a single node with every visible GPU (or 1 CPU process).",
    )
    parser.add_argument("--nnodes", type=int, help="number of nodes (default: SLURM nodes or 1)")
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        help="processes per node (default: GPUs minus the policy engine's own GPUs; 1 on CPU)",
    )
    parser.add_argument("--node-rank", type=int, help="this node's rank (default: its place in the Slurm node list)")
    parser.add_argument("--master-addr", help="rendezvous host (default: the first node)")
    parser.add_argument("--master-port", type=int, help="rendezvous port (default: MASTER_PORT, job id, 29500)")
    parser.add_argument(
        "--module", default="memrl.launch.cli", help="Python module to run (default: memrl.launch.cli = memrl)"
    )
    add_device_argument(parser)
    return parser


def policy_placement_of(kind: CommandKind, module: str, command: MemrlCommand) -> PolicyPlacement | None:
    """The policy engine's placement when the command builds one; reading the config also checks it exists."""
    view = launch_view(command) if module == "memrl.launch.cli" else None
    return view.placement.policy if view is not None and kind.policy_engine else None


def ignored_for_single(kind: CommandKind, **given: int | None) -> list[str]:
    """Notes for process counts asked of a command that runs in one process."""
    return [
        f"note: --{name.replace('_', '-')} {value} ignored: {kind.label} runs in one process"
        for name, value in given.items()
        if value is not None and value != 1
    ]


def plan_torchrun(argv: Sequence[str], env: Mapping[str, str]) -> Plan:
    """Plan ``launch/torchrun.sh [options] [--] COMMAND...`` for this node. A command that is not distributed runs
    as one plain process on node rank 0, and the other nodes start nothing."""
    parser = _torchrun_parser()
    args, command = launcher_args(parser, argv)
    if args.help:
        return help_plan(parser)
    memrl = MemrlCommand(command)
    kind = command_kind(args.module, memrl)
    layout = train_layout(
        nnodes=args.nnodes,
        nproc_per_node=args.nproc_per_node,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        device_choice=args.device,
        policy=policy_placement_of(kind, args.module, memrl),
        env=env,
        kind=kind,
    )
    launch_env = training_env(layout, env)
    if layout.single_process:
        cmd = [sys.executable, "-m", args.module, *command]
        notes = ignored_for_single(kind, nproc_per_node=args.nproc_per_node)
        runs_here = layout.node_rank == 0
        command_line = shell_command(launch_env, cmd)
        lines = [
            "memrl torchrun",
            *notes,
            *layout.describe(),
            f"command: {command_line}" if runs_here else f"command (on node rank 0 only): {command_line}",
        ]
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
        lines = ["memrl torchrun", *layout.describe(), f"command: {shell_command(launch_env, cmd)}"]
    info = {
        "launcher": "torchrun",
        "layout": layout_info(layout),
        "env": launch_env,
        "command": cmd,
        "runs_here": runs_here,
    }
    shell: dict[str, str | list[str]] = {
        "launch_env": [f"{k}={v}" for k, v in launch_env.items()],
        # An idle node of a single-process command gets no command: the script exits 0.
        "launch_cmd": cmd if runs_here else [],
    }
    return Plan(lines, shell, info, args.dry_run)


def layout_info(layout: TrainLayout) -> dict[str, Any]:
    """The layout as the JSON plan reports it."""
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
