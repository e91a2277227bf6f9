#!/usr/bin/env bash
# Run any memrl command with the DeepSpeed launcher over a hostfile (run it on the first node only).
#
#   launch/deepspeed.sh [--hostfile FILE | --hosts gpu[01-04]] [--num-nodes N] [--num-gpus G] [--master-addr HOST]
#                       [--master-port PORT] [--launcher pdsh|openmpi|slurm|...] [--device auto|gpu|cpu]
#                       [--module MOD] [--dry-run] [--] COMMAND --config FILE [key=value ...]
#
# Without --hostfile, one is written from --hosts, else from the Slurm node list, else "localhost". Multi-node runs
# need the launcher's way to reach the other nodes (pdsh: passwordless ssh; variables listed in ~/.deepspeed_env).
# Commands that are not distributed (memrl eval, data synth/distill, export, quickstart) run as one plain process on
# this node, without the DeepSpeed launcher. --dry-run prints the layout, the hostfile and the exact command without
# starting anything. See docs/cluster.md.
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"

# The plan's variables (launch/layout/deepspeed.py plan_deepspeed).
dry_run=0 layout_text='' launch_env=() launch_cmd=() write_hostfile=0 hostfile_path='' hostfile_text=''
plan="$(memrl_plan deepspeed "$@")"
eval "$plan"
printf '%s\n' "$layout_text"
if [ "$dry_run" = 1 ]; then
  exit 0
fi
if [ "$write_hostfile" = 1 ]; then
  mkdir -p "$(dirname "$hostfile_path")"
  printf '%s' "$hostfile_text" >"$hostfile_path"
fi
exec env "${launch_env[@]}" "${launch_cmd[@]}"
