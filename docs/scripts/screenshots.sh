#!/usr/bin/env bash
# Screenshots of pages of the built site: home, the OAT-GRPO concept page, the own-agent tutorial, the results index
# and two results pages, written to docs/figures/screenshots/. Builds the site first (launch/docs.sh), then renders each
# page's file:// URL in headless Chromium (Debian's `chromium`; `apt-get install -y chromium`), offline, at a fixed
# window size (a screenshot is the window, so the height is chosen to show the page's first sections).
#
#   bash docs/scripts/screenshots.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="$root/docs/figures/screenshots"
bash "$root/launch/docs.sh" build --quiet
mkdir -p "$out"
shoot() {  # PAGE NAME WIDTH,HEIGHT
  local profile
  profile="$(mktemp -d)"
  chromium --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update \
    --no-first-run --user-data-dir="$profile" --hide-scrollbars --window-size="$3" \
    --screenshot="$out/$2.png" "file://$root/site/$1.html" 2>/dev/null
  rm -rf "$profile"
}
shoot index home 1280,1800
shoot concepts/oat_grpo oat_grpo 1280,2400
shoot own_agent own_agent 1280,2300
shoot results/index results_index 1280,1500
shoot results/learning results_learning 1280,2000
shoot results/textworld results_textworld 1280,2000
ls -l "$out"
