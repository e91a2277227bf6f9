#!/usr/bin/env bash
# The test suite on a fresh machine: set up .venv (skipped when done), then the fast suite and the slow suite.
# Extra arguments go to pytest (e.g. -k config). pytest's "no tests collected" (exit 5) counts as success.
set -euo pipefail
# shellcheck source=launch/setup.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/setup.sh"
cd "$MEMRL_ROOT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false

run_pytest() {
  local rc=0
  python -m pytest "$@" || rc=$?
  if [ "$rc" -eq 5 ]; then
    echo "[memrl test] no tests collected for: $*"
    rc=0
  fi
  return "$rc"
}

if [ "$#" -gt 0 ]; then
  run_pytest "$@"
  exit $?
fi
echo "[memrl test] ruff"
ruff check .
echo "[memrl test] fast suite"
run_pytest -m "not slow" -q
echo "[memrl test] slow suite"
run_pytest -m "slow" -q
