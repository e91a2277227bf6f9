#!/usr/bin/env bash
# Run any memrl command under torchrun on this node (one call per node; Slurm variables fill in what is not given).
#
#   launch/torchrun.sh [--nnodes N] [--nproc-per-node P] [--node-rank R] [--master-addr HOST] [--master-port PORT]
#                      [--device auto|gpu|cpu] [--module MOD] [--dry-run] [--] COMMAND --config FILE [key=value ...]
#
#   launch/torchrun.sh --nproc-per-node 8 -- sft --config configs/sft.yaml          # 1 node x 8 GPUs
#   srun --ntasks-per-node=1 launch/torchrun.sh -- train oat-grpo --config X.yaml    # every node of a Slurm job
#   launch/torchrun.sh --device cpu --nproc-per-node 2 -- sft --config tiny.yaml     # 2 CPU processes (gloo)
#
# Commands that are not distributed (memrl eval, data synth/distill, export, quickstart) run as one plain process on
# node rank 0; the other nodes start nothing. --dry-run prints the world layout and the exact command without
# starting anything. See docs/cluster.md.
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"

# The plan's variables (launch/layout/torchrun.py plan_torchrun).
dry_run=0 layout_text='' launch_env=() launch_cmd=()
plan="$(memrl_plan torchrun "$@")"
eval "$plan"
printf '%s\n' "$layout_text"
# An empty command: a single-process command on a node other than node rank 0, which starts nothing.
if [ "$dry_run" = 1 ] || [ "${#launch_cmd[@]}" -eq 0 ]; then
  exit 0
fi
exec env "${launch_env[@]}" "${launch_cmd[@]}"
