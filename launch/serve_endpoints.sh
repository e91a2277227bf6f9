#!/usr/bin/env bash
# vLLM OpenAI-compatible servers for a frozen model (reasoner, committee member, judge) on this node.
#
#   launch/serve_endpoints.sh run   --model M [--tp T] [--replicas R] [--port P] [--gpus 0,1,..] [--device auto|gpu|cpu]
#                                   [--served-model-name S] [--max-model-len L|none] [--log-dir D] [--dry-run] [-- VLLM ARGS]
#       start the servers (REPLICAS x TP GPUs, ports P, P+1, ...) and stay in the foreground; SIGTERM stops them all,
#       and if one server dies the others are stopped and the exit code is non-zero (how the Slurm script uses it).
#   launch/serve_endpoints.sh start --pid-file F [run options]   the same in the background; prints the endpoints.
#   launch/serve_endpoints.sh wait  [--timeout S] [--watch-pid PID ...] URL...
#       wait until every server answers GET URL/health (URL = http://host:port or .../v1); fail on timeout or when a
#       watched process exits first.
#   launch/serve_endpoints.sh stop  --pid-file F                 stop what `start` started.
#
# --dry-run prints the servers, their GPUs, ports, endpoints and exact commands without starting anything.
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"
SCRIPT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/serve_endpoints.sh"

usage() {
  sed -n '2,15p' "$SCRIPT" | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

# http_ok URL: true when GET URL answers 2xx.
http_ok() {
  if command -v curl >/dev/null 2>&1; then
    curl --silent --fail --output /dev/null --max-time 5 "$1"
  else
    "$(memrl_python)" - "$1" <<'PY'
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
        sys.exit(0 if 200 <= r.status < 300 else 1)
except Exception:
    sys.exit(1)
PY
  fi
}

cmd_run() {
  # The plan's variables (launch/layout/serve.py plan_serve); replica_0.. are arrays named by index.
  local dry_run=0 layout_text='' log_dir='' replica_count=0 plan i rc=0
  local -a replica_logs=() endpoints=() pids=()
  plan="$(memrl_plan serve "$@")"
  eval "$plan"
  printf '%s\n' "$layout_text"
  if [ "$dry_run" = 1 ]; then
    return 0
  fi
  mkdir -p "$log_dir"
  # shellcheck disable=SC2317,SC2329  # reached through the trap
  stop_all() {
    trap - TERM INT
    memrl_stop_pids 60 "${pids[@]}"
  }
  trap 'stop_all; exit 143' TERM INT
  for ((i = 0; i < replica_count; i++)); do
    local -n replica="replica_$i"
    "${replica[@]}" >"${replica_logs[$i]}" 2>&1 &
    pids+=("$!")
    unset -n replica
  done
  echo "[memrl serve] started ${#pids[@]} server(s): ${endpoints[*]} (logs in $log_dir)"
  wait -n || rc=$?
  echo "[memrl serve] a server exited (code $rc); stopping the others" >&2
  stop_all
  exit $((rc == 0 ? 1 : rc))
}

cmd_start() {
  # The plan's variables (launch/layout/serve.py plan_serve) that `start` reports.
  local pid_file='' args=() dry_run=0 layout_text='' plan
  local -a endpoints=() health_urls=()
  while [ "$#" -gt 0 ]; do
    case "$1" in
      --pid-file) pid_file="$2"; shift 2 ;;
      --pid-file=*) pid_file="${1#*=}"; shift ;;
      --) args+=("$@"); break ;;
      *) args+=("$1"); shift ;;
    esac
  done
  plan="$(memrl_plan serve "${args[@]}")"
  eval "$plan"
  printf '%s\n' "$layout_text"
  if [ "$dry_run" = 1 ]; then
    return 0
  fi
  [ -n "$pid_file" ] || { echo "start: --pid-file is required" >&2; exit 2; }
  mkdir -p "$(dirname "$pid_file")"
  # Own session: `stop` can end the whole process group even if the runner was killed.
  setsid bash "$SCRIPT" run "${args[@]}" </dev/null >"$pid_file.out" 2>&1 &
  echo "$!" >"$pid_file"
  echo "[memrl serve] runner pid $!, output in $pid_file.out; endpoints: ${endpoints[*]}"
  echo "[memrl serve] wait:  $SCRIPT wait ${health_urls[*]}"
  echo "[memrl serve] stop:  $SCRIPT stop --pid-file $pid_file"
}

cmd_wait() {
  local timeout=1800 interval=5 urls=() watch=() start pid url pending
  while [ "$#" -gt 0 ]; do
    case "$1" in
      --timeout) timeout="$2"; shift 2 ;;
      --interval) interval="$2"; shift 2 ;;
      --watch-pid) watch+=("$2"); shift 2 ;;
      --dry-run) echo "would wait up to ${timeout} s for: $*"; return 0 ;;
      -*) echo "wait: unknown option $1" >&2; usage 2 ;;
      *) urls+=("$1"); shift ;;
    esac
  done
  [ "${#urls[@]}" -gt 0 ] || { echo "wait: give at least one server URL" >&2; exit 2; }
  start=$SECONDS
  while :; do
    pending=()
    for url in "${urls[@]}"; do
      url="${url%/}"
      url="${url%/v1}"
      url="${url%/health}"
      http_ok "$url/health" || pending+=("$url")
    done
    if [ "${#pending[@]}" -eq 0 ]; then
      echo "[memrl serve] healthy: ${urls[*]} (after $((SECONDS - start)) s)"
      return 0
    fi
    for pid in ${watch[@]+"${watch[@]}"}; do
      if ! kill -0 "$pid" 2>/dev/null; then
        echo "[memrl serve] process $pid exited before every server was healthy; not ready: ${pending[*]}" >&2
        exit 1
      fi
    done
    if [ $((SECONDS - start)) -ge "$timeout" ]; then
      echo "[memrl serve] timed out after ${timeout} s; not healthy: ${pending[*]}" >&2
      exit 1
    fi
    sleep "$interval"
  done
}

cmd_stop() {
  local pid_file='' pid
  while [ "$#" -gt 0 ]; do
    case "$1" in
      --pid-file) pid_file="$2"; shift 2 ;;
      --dry-run) echo "would stop the servers started with pid file ${pid_file:-?}"; return 0 ;;
      *) echo "stop: unknown argument $1" >&2; usage 2 ;;
    esac
  done
  [ -f "$pid_file" ] || { echo "stop: no pid file ${pid_file:-(give --pid-file)}" >&2; exit 2; }
  pid="$(cat "$pid_file")"
  if kill -0 "$pid" 2>/dev/null; then
    memrl_stop_pids 90 "$pid"
    # The runner stops its servers on SIGTERM; anything left in its process group goes now.
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$pid_file"
  echo "[memrl serve] stopped (runner pid $pid)"
}

[ "$#" -gt 0 ] || usage 2
sub="$1"
shift
case "$sub" in
  run) cmd_run "$@" ;;
  start) cmd_start "$@" ;;
  wait) cmd_wait "$@" ;;
  stop) cmd_stop "$@" ;;
  -h | --help) usage 0 ;;
  *) echo "unknown subcommand: $sub" >&2; usage 2 ;;
esac
