#!/usr/bin/env bash
# Build .whl/: the wheels a bare GPU machine lacks to run tests/gpu and benchmarks/gpu_trainer.py (tests/gpu/run.sh
# installs them there). The GPU image (the device README's KINDS.md) has Python 3.12, PyTorch, transformers, peft,
# accelerate, pytest, tokenizers, pandas, pyarrow, but not pydantic (memrl's configs), bm25s (imported by the recipes'
# config models), TRL (the benchmark's reference: selective_log_softmax) with its import-time needs, or a setuptools
# known to be new enough for memrl's editable install. Versions are the ones this checkout's .venv runs, so the
# machine runs what was tested here; pydantic-core is the one compiled wheel (cp312, manylinux x86-64).
#
#   bash tests/gpu/build_carry.sh [DEST]     # DEST defaults to .whl (git-ignored); prints its size, fails over 64 MiB
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
dest="${1:-.whl}"
python="${MEMRL_PYTHON:-.venv/bin/python}"
limit_mib=64
pure=(pydantic annotated-types typing-inspection typing-extensions bm25s trl datasets dill multiprocess setuptools)
compiled=(pydantic-core)

# NAME==VERSION of each package as this checkout's environment has it.
pinned() {
  "$python" - "$@" <<'PY'
import sys
from importlib.metadata import version
print(" ".join(f"{name}=={version(name)}" for name in sys.argv[1:]))
PY
}

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
pins="$(pinned "${pure[@]}")"
read -r -a pure_pins <<<"$pins"
pins="$(pinned "${compiled[@]}")"
read -r -a compiled_pins <<<"$pins"
pip=("$python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp")
echo "[build_carry] pure-Python wheels: ${pure_pins[*]}"
"${pip[@]}" "${pure_pins[@]}"
echo "[build_carry] compiled wheels (cp312, manylinux x86-64): ${compiled_pins[*]}"
"${pip[@]}" --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  "${compiled_pins[@]}"
# multiprocess ships one wheel per Python version: the machine's is 3.12.
rm -f "$tmp"/multiprocess-*.whl
"$python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" --python-version 3.12 \
  --implementation py --abi none --platform any "$(pinned multiprocess)"

size_kib="$(du -sk "$tmp" | cut -f1)"
if [ "$size_kib" -gt $((limit_mib * 1024)) ]; then
  echo "[build_carry] $((size_kib / 1024)) MiB of wheels is over the ${limit_mib} MiB a device call carries" >&2
  exit 1
fi
rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
ls -1 "$dest"
echo "[build_carry] $dest: $(find "$dest" -type f -name '*.whl' | wc -l) wheels, $((size_kib / 1024)).$(((size_kib % 1024) * 10 / 1024)) MiB"
