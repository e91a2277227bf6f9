"""World layout of memrl launches: which node runs what, with which ranks, and the exact commands.

The launch scripts (``launch/torchrun.sh``, ``launch/deepspeed.sh``, ``launch/serve_endpoints.sh``,
``launch/slurm/memrl.sbatch``) are thin: they ask this module for a *plan* (``--format shell`` prints bash
assignments they ``eval``) and run it. ``--dry-run`` prints the same plan as text without starting anything, and
``--format json`` gives it to tests and tools. Everything is computed from arguments, Slurm variables
(``SLURM_JOB_NODELIST`` through ``scontrol show hostnames`` when installed, ``SLURM_NODEID``, ``SLURM_GPUS_ON_NODE``
...) and the ``run`` / ``placement`` sections of the run's config, so a plan can be checked anywhere. Only the
distributed memrl commands (``memrl.launch.jobs.JOBS`` with ``distributed=True``) get many processes; the others run as
one plain process on node rank 0.

    python -m memrl.launch.layout torchrun --nproc-per-node 8 --dry-run -- sft --config configs/sft.yaml
    python -m memrl.launch.layout slurm --nodes 4 --dry-run -- train oat-grpo --config configs/oat.yaml

One module per launcher: :mod:`memrl.launch.layout.torchrun`, :mod:`memrl.launch.layout.deepspeed`,
:mod:`memrl.launch.layout.serve`
(vLLM servers), :mod:`memrl.launch.layout.slurm` (served models, the Ray rollout fleet and training on a Slurm
allocation); :mod:`memrl.launch.layout.common` holds what they share (the command, the training layout) and
:mod:`memrl.launch.layout.hosts` the hosts and devices.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence

from memrl.launch.layout.common import (
    LaunchView,
    MemrlCommand,
    Plan,
    TrainLayout,
)
from memrl.launch.layout.deepspeed import plan_deepspeed
from memrl.launch.layout.hosts import (
    LaunchError,
    SlurmEnv,
    expand_hostlist,
    gpus_on_node,
    slurm_hostnames,
)
from memrl.launch.layout.serve import ServeSpec, plan_serve
from memrl.launch.layout.slurm import SETUPS, plan_slurm
from memrl.launch.layout.torchrun import plan_torchrun

__all__ = [
    "PLANNERS",
    "SETUPS",
    "LaunchError",
    "LaunchView",
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

PLANNERS: dict[str, Callable[[Sequence[str], Mapping[str, str]], Plan]] = {
    "torchrun": plan_torchrun,
    "deepspeed": plan_deepspeed,
    "serve": plan_serve,
    "slurm": plan_slurm,
}


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """``python -m memrl.launch.layout {torchrun,deepspeed,serve,slurm} [--format text|json|shell] ARGS...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ if env is None else env)
    if not argv or argv[0] not in PLANNERS:
        planners = ",".join(PLANNERS)
        print(
            f"usage: python -m memrl.launch.layout {{{planners}}} [--dry-run] [--format text|json|shell] ...",
            file=sys.stderr,
        )
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
