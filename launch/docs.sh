#!/usr/bin/env bash
# The documentation site: set up .venv (skipped when done), then build docs/ into site/ with MkDocs (mkdocs.yml).
#
#   bash launch/docs.sh [--dry-run] [build|serve] [MKDOCS ARGS ...]
#
# build (the default) is strict: any warning, broken internal link or missing anchor fails it. It needs no network,
# and the pages load nothing from it (no web fonts, no CDN): site/index.html opens from the file system; the search
# box works when the site is served. serve rebuilds on every change at http://127.0.0.1:8000. Other arguments go to mkdocs. --dry-run prints the venv,
# the extra, whether the install would run and the command, and creates, installs and runs nothing.
set -euo pipefail

# shellcheck source=launch/setup.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/setup.sh"  # takes out --dry-run
action=build
if [ "${#MEMRL_ARGS[@]}" -gt 0 ] && { [ "${MEMRL_ARGS[0]}" = build ] || [ "${MEMRL_ARGS[0]}" = serve ]; }; then
  action="${MEMRL_ARGS[0]}"
  MEMRL_ARGS=("${MEMRL_ARGS[@]:1}")
fi
cmd=("$VENV/bin/python" -m mkdocs "$action" --strict --config-file "$MEMRL_ROOT/mkdocs.yml" "${MEMRL_ARGS[@]}")
if [ "$MEMRL_DRY_RUN" = 1 ]; then
  echo "[memrl docs] would run, in $MEMRL_ROOT:"
  memrl_show_cmd "${cmd[@]}"
  exit 0
fi
cd "$MEMRL_ROOT"
# MkDocs 1.6 prints a notice about MkDocs 2.0 on every build; the site pins its versions (pyproject.toml, docs extra).
export NO_MKDOCS_2_WARNING=1
exec "${cmd[@]}"
