#!/usr/bin/env bash
# The test suite on a fresh machine: set up .venv (skipped when done), then ruff (lint, and `ruff format --check`:
# run `ruff format .` before committing), the import-layer contract (import-linter), the documentation site's strict
# build (launch/docs.sh), the fast suite and the slow suite (each on two pytest-xdist workers; tests/conftest.py keeps
# tests that share a start on one and hands out the longest first). Each step prints its wall time and each suite its
# 25 slowest tests.
#
#   bash launch/test.sh [--dry-run] [PYTEST ARGS ...]
#
# With pytest arguments (e.g. -k config) only that pytest run happens. pytest's "no tests collected" (exit 5) counts
# as success. --dry-run prints the venv, the extra, whether the install would run and the commands, and creates,
# installs and runs nothing.
set -euo pipefail

# shellcheck source=launch/setup.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/setup.sh"  # takes out --dry-run
setup_seconds=$SECONDS
offline=(HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false)
pytest=("$VENV/bin/python" -m pytest)

# step CMD...: run it, or print it in a dry run.
step() {
  if [ "$MEMRL_DRY_RUN" = 1 ]; then
    memrl_show_cmd "$@"
  else
    "$@"
  fi
}

run_pytest() {
  local rc=0
  step "${pytest[@]}" "$@" || rc=$?
  if [ "$rc" -eq 5 ]; then
    echo "[memrl test] no tests collected for: $*"
    rc=0
  fi
  return "$rc"
}

if [ "$MEMRL_DRY_RUN" = 1 ]; then
  echo "[memrl test] would run, in $MEMRL_ROOT with ${offline[*]}:"
else
  cd "$MEMRL_ROOT"
  export "${offline[@]}"
fi
if [ "${#MEMRL_ARGS[@]}" -gt 0 ]; then
  run_pytest "${MEMRL_ARGS[@]}"
  exit $?
fi
# timed NAME CMD...: run a step under its name, then print its wall time (a dry run prints the command only).
timed() {
  local name=$1 start=$SECONDS rc=0
  shift
  [ "$MEMRL_DRY_RUN" = 1 ] || echo "[memrl test] $name"
  "$@" || rc=$?
  [ "$MEMRL_DRY_RUN" = 1 ] || echo "[memrl test] $name: $((SECONDS - start)) s"
  return "$rc"
}

[ "$MEMRL_DRY_RUN" = 1 ] || echo "[memrl test] set-up: ${setup_seconds} s"
timed "ruff (lint)" step "$VENV/bin/ruff" check .
timed "ruff (format)" step "$VENV/bin/ruff" format --check .
timed "import layers (import-linter)" step "$VENV/bin/python" tests/lint_imports.py
timed "duplicate code (pylint symilar against tests/duplicate_code_baseline.txt)" step "$VENV/bin/python" tests/lint_duplicates.py
timed "documentation site (mkdocs build --strict)" step bash "$MEMRL_ROOT/launch/docs.sh" build --quiet
timed "fast suite" run_pytest -m "not slow" -q --durations=25 -n 2 --dist loadgroup
timed "slow suite" run_pytest -m "slow" -q --durations=25 -n 2 --dist loadgroup
[ "$MEMRL_DRY_RUN" = 1 ] || echo "[memrl test] all steps: ${SECONDS} s"
