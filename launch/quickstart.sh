#!/usr/bin/env bash
# The main job on a fresh machine: set up .venv (skipped when done), then `memrl quickstart` on its embedded default.
#
#   bash launch/quickstart.sh [--dry-run] [--config FILE] [key=value ...]
#
# Other arguments go to `memrl quickstart`. --dry-run prints the venv, the extra, whether the install would run and
# the command, and creates, installs and runs nothing. The console shows memrl's stage banners, progress bars and
# results; third-party warnings and engine logs go to <run dir>/run.log (--verbose shows them on the console too).
set -euo pipefail

# shellcheck source=launch/setup.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/setup.sh"  # takes out --dry-run
cmd=("$VENV/bin/memrl" quickstart "${MEMRL_ARGS[@]}")
if [ "$MEMRL_DRY_RUN" = 1 ]; then
  echo "[memrl quickstart] would run, in $MEMRL_ROOT:"
  memrl_show_cmd "${cmd[@]}"
  exit 0
fi
cd "$MEMRL_ROOT"
exec "${cmd[@]}"
