#!/usr/bin/env bash
# The trainer on a bare GPU machine: install the carried wheels and memrl, run the GPU suite and/or the GPU trainer
# benchmark, and write logs and results under $OUT (or ./gpu-results). Build the wheels first, on a machine with the
# package registries: `bash tests/gpu/build_carry.sh` (.whl/, git-ignored; name it in the device call's carry).
#
#   bash tests/gpu/run.sh [suite|bench|all] [BENCHMARK ARGS ...]
#
#   suite   pytest tests/gpu (the CUDA tests and their CPU twins): junit XML + log          (~3 min on an H100)
#   bench   python benchmarks/gpu_trainer.py ARGS: per-case lines + the last JSON line      (see its --help)
#   all     suite, then bench with ARGS (default)
#
# One stage per call keeps each under a 10-minute command limit, e.g. (README, "Multi-GPU and clusters"):
#   bash tests/gpu/run.sh suite
#   bash tests/gpu/run.sh bench --shapes qwen3.5-9b --modes lora --time-budget-s 400
#   bash tests/gpu/run.sh bench --shapes qwen3-4b --time-budget-s 400
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
stage="${1:-all}"
[ $# -gt 0 ] && shift
case "$stage" in suite | bench | all) ;; *) echo "usage: bash tests/gpu/run.sh [suite|bench|all] [ARGS...]" >&2; exit 2 ;; esac
python="${PYTHON:-python3}"
out="${OUT:-$PWD/gpu-results}"
site="${MEMRL_GPU_SITE:-/tmp/memrl-gpu-site}"
mkdir -p "$out"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1
# The image holds JAX, which some import on the way pulls in: by default it would take 75% of the GPU at import, in
# every process (the first H200 run ran out of memory loading a 4B model beside it).
export JAX_PLATFORMS=cpu XLA_PYTHON_CLIENT_PREALLOCATE=false
# Deterministic cuBLAS (the trainer test compares two runs bit for bit); set before any CUDA context exists.
export CUBLAS_WORKSPACE_CONFIG=:4096:8

shopt -s nullglob
wheels=(.whl/*.whl)
if [ "${#wheels[@]}" -eq 0 ]; then
  echo "[gpu] no .whl/*.whl here: build them with 'bash tests/gpu/build_carry.sh' and carry .whl" >&2
  exit 2
fi
echo "[gpu] installing ${#wheels[@]} carried wheels into $site"
"$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "${wheels[@]}"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
# memrl itself, editable (its folders install as memrl.data, memrl.train, ...), built with the carried setuptools
"$python" -m pip install -q --no-index --no-deps --no-build-isolation -e . >/tmp/memrl-gpu-install.log 2>&1 \
  || { cat /tmp/memrl-gpu-install.log >&2; exit 1; }
"$python" - <<'PY' 2>&1 | tee "$out/environment.txt"
import platform, torch, transformers, peft, accelerate, trl, pydantic
import memrl.train.group_trainer  # noqa: F401  the trainer imports here, or nothing below will
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| transformers", transformers.__version__, "| peft", peft.__version__, "| accelerate", accelerate.__version__,
      "| trl", trl.__version__, "| pydantic", pydantic.__version__)
print("device:", torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device")
PY
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >>"$out/environment.txt"

rc=0
if [ "$stage" = suite ] || [ "$stage" = all ]; then
  echo "[gpu] suite: pytest tests/gpu"
  set +e
  "$python" -m pytest tests/gpu -q -rfEsxX -p no:cacheprovider --junitxml="$out/gpu-suite.xml" 2>&1 \
    | tee "$out/gpu-suite.log"
  suite_rc=${PIPESTATUS[0]}
  set -e
  [ "$suite_rc" -eq 0 ] || rc=$suite_rc
fi
if [ "$stage" = bench ] || [ "$stage" = all ]; then
  echo "[gpu] bench: python benchmarks/gpu_trainer.py $*"
  # Models are built under /tmp (a 9B one is 16 GiB: nothing that large comes back); per-case lines go to $OUT.
  set +e
  "$python" benchmarks/gpu_trainer.py --out /tmp/memrl-gpu-bench "$@" 2>"$out/gpu-bench.stderr" \
    | tee "$out/gpu-bench.log"
  bench_rc=${PIPESTATUS[0]}
  set -e
  cp /tmp/memrl-gpu-bench/gpu_trainer.jsonl "$out/" 2>/dev/null || true
  tail -n 1 "$out/gpu-bench.log" >"$out/gpu-bench-summary.json"
  [ "$bench_rc" -eq 0 ] || { tail -n 40 "$out/gpu-bench.stderr"; rc=$bench_rc; }
fi
exit "$rc"
