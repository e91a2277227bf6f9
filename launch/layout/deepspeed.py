"""``launch/deepspeed.sh``: the DeepSpeed launcher over a hostfile (:func:`plan_deepspeed`)."""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from memrl.launch.layout.common import (
    MemrlCommand,
    Plan,
    TrainLayout,
    add_device_argument,
    command_kind,
    help_plan,
    launcher_args,
    launcher_parser,
    shell_command,
    training_env,
)
from memrl.launch.layout.hosts import (
    LaunchError,
    SlurmEnv,
    expand_hostlist,
    gpus_on_node,
    rendezvous_port,
    resolve_device,
)
from memrl.launch.layout.torchrun import ignored_for_single, layout_info, policy_placement_of


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
    parser = launcher_parser(
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
    parser.add_argument(
        "--launcher",
        default="pdsh",
        choices=["pdsh", "openmpi", "mvapich", "slurm", "mpich", "impi"],
        help="how DeepSpeed reaches the other nodes (default pdsh)",
    )
    parser.add_argument(
        "--module", default="memrl.launch.cli", help="Python module to run (default: memrl.launch.cli = memrl)"
    )
    add_device_argument(parser)
    return parser


def plan_deepspeed(argv: Sequence[str], env: Mapping[str, str]) -> Plan:
    """Plan ``launch/deepspeed.sh [options] [--] COMMAND...``."""
    parser = _deepspeed_parser()
    args, command = launcher_args(parser, argv)
    if args.help:
        return help_plan(parser)
    if args.hostfile and args.hosts:
        raise LaunchError("give --hostfile or --hosts, not both")
    slurm = SlurmEnv.from_env(env)
    gpus = gpus_on_node(env)
    device = resolve_device(args.device, gpus)
    memrl = MemrlCommand(command)
    kind = command_kind(args.module, memrl)
    single = not kind.distributed
    policy = policy_placement_of(kind, args.module, memrl)
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
        master_port=rendezvous_port(args.master_port, env, slurm),
        device=device,
        gpus_per_node=gpus,
        policy=policy,
        single_process=single,
        label=kind.label,
    )
    launch_env = training_env(layout, env)
    hostfile_text = "".join(f"{host} slots={slots}\n" for host, slots in entries)
    if single:
        # Not distributed: one plain process on this node, without the DeepSpeed launcher or a hostfile.
        cmd = [sys.executable, "-m", args.module, *command]
        lines = ["memrl deepspeed", *ignored_for_single(kind, num_gpus=args.num_gpus),
                 *layout.describe(this_node=False),
                 "it runs here, on the node that runs this script: no DeepSpeed launcher, no hostfile",
                 f"command: {shell_command(launch_env, cmd)}"]  # fmt: skip
        info = {"launcher": "deepspeed", "layout": layout_info(layout), "hostfile": None,
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
    lines.append(f"command: {shell_command(launch_env, cmd)}")
    info = {
        "launcher": "deepspeed",
        "layout": layout_info(layout),
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
