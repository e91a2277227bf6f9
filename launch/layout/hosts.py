"""Hosts and devices of a launch: Slurm hostlists and environment, GPUs on this node, the rendezvous port, the device
to run on."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DEFAULT_MASTER_PORT",
    "Device",
    "LaunchError",
    "SlurmEnv",
    "cpu_count",
    "expand_hostlist",
    "gpus_on_node",
    "rendezvous_port",
    "resolve_device",
    "slurm_hostnames",
]

DEFAULT_MASTER_PORT = 29500
Device = Literal["gpu", "cpu"]


class LaunchError(ValueError):
    """A launch that cannot be laid out (bad arguments, too few nodes, unreadable config...)."""


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


def cpu_count() -> int:
    """The CPUs this process may run on."""
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


def rendezvous_port(explicit: int | None, env: Mapping[str, str], slurm: SlurmEnv | None) -> int:
    """The rendezvous port: argument, ``MASTER_PORT``, a port derived from the Slurm job id, or 29500."""
    if explicit is not None:
        return explicit
    if env.get("MASTER_PORT", "").isdigit():
        return int(env["MASTER_PORT"])
    if slurm is not None and slurm.job_id and slurm.job_id.isdigit():
        # Jobs sharing a node must not collide on one port.
        return 20000 + int(slurm.job_id) % 20000
    return DEFAULT_MASTER_PORT


def resolve_device(choice: str, gpus: int) -> Device:
    """The device to run on: ``choice`` (auto, gpu, cpu) given the GPUs this node has."""
    if choice == "auto":
        return "gpu" if gpus > 0 else "cpu"
    if choice == "gpu" and gpus == 0:
        raise LaunchError("--device gpu but no GPU is visible (no Slurm GPU count, CUDA_VISIBLE_DEVICES or nvidia-smi)")
    return "gpu" if choice == "gpu" else "cpu"
