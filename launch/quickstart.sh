#!/usr/bin/env bash
# The main job on a fresh machine: set up .venv (skipped when done), then `memrl quickstart` on its embedded default.
# Extra arguments go to `memrl quickstart` (e.g. --config FILE, dotted overrides).
set -euo pipefail
# shellcheck source=launch/setup.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/setup.sh"
cd "$MEMRL_ROOT"
exec memrl quickstart "$@"
