#!/usr/bin/env bash
# Shared by the launch scripts (sourced, not run): the repository root, the Python that runs memrl, the plan of a
# launch computed by launch/layout/, and stopping processes by id.
# A plan is a list of bash assignments (dry_run, layout_text and script-specific arrays) that the caller evals.

MEMRL_ROOT="${MEMRL_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
export MEMRL_ROOT

# The interpreter with memrl installed: $MEMRL_PYTHON, else the repository's .venv, else python3.
memrl_python() {
  if [ -n "${MEMRL_PYTHON:-}" ]; then
    printf '%s\n' "$MEMRL_PYTHON"
  elif [ -x "$MEMRL_ROOT/.venv/bin/python" ]; then
    printf '%s\n' "$MEMRL_ROOT/.venv/bin/python"
  else
    command -v python3
  fi
}

# memrl_plan KIND ARGS...: print the plan of a launch as bash assignments (exits 2 with a message on a bad launch).
memrl_plan() {
  local kind="$1"
  shift
  "$(memrl_python)" -m memrl.launch.layout "$kind" --format shell "$@"
}

# memrl_stop_pids GRACE_SECONDS PID...: SIGTERM the processes, wait up to GRACE_SECONDS, then SIGKILL what is left.
memrl_stop_pids() {
  local grace="$1" pid waited=0
  shift
  [ "$#" -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  while [ "$waited" -lt "$grace" ]; do
    local alive=0
    for pid in "$@"; do
      if kill -0 "$pid" 2>/dev/null; then alive=1; fi
    done
    [ "$alive" = 1 ] || return 0
    sleep 1
    waited=$((waited + 1))
  done
  kill -KILL "$@" 2>/dev/null || true
}
