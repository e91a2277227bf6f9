#!/usr/bin/env bash
# The trainer on a bare GPU machine: install the carried wheels and memrl, run the GPU suite and/or the GPU trainer
# benchmark, and write logs and results under $OUT (or ./gpu-results). Build the wheels first, on a machine with the
# package registries: `bash tests/gpu/build_carry.sh` (.whl/, git-ignored; name it in the device call's carry).
#
#   bash tests/gpu/run.sh [suite|bench|all|check] [BENCHMARK ARGS ...]
#
#   suite   pytest tests/gpu (the CUDA tests and their CPU twins): junit XML + log          (~3 min on an H100)
#   bench   python benchmarks/gpu_trainer.py ARGS: per-case lines + the last JSON line      (see its --help)
#   all     suite, then bench with ARGS (default)
#   check   the GPU check, one device call of at most 9 minutes (MEMRL_GPU_CHECK_S seconds of work, default 460):
#           the suite (cut at MEMRL_GPU_SUITE_S, default 200), then the benchmark at the Qwen3-4B shape, LoRA and
#           full weights, on the length mix and equal 16K rows, the padded reference beside each (gpu-check-4b.*),
#           then the 9B shape with LoRA at 32K if time is left (gpu-check-9b.*); --time-budget-s keeps each inside,
#           ARGS go to both. `check --device cpu --quick` is its dry run on CPU: the suite only collected (CI runs
#           it), the tiny shape in both benchmark runs (LoRA with the mix, then full weights).
#
# One stage per call keeps each under a 10-minute command limit, e.g. (README, "Multi-GPU and clusters"):
#   bash tests/gpu/run.sh suite
#   bash tests/gpu/run.sh bench --shapes qwen3.5-9b --modes lora --time-budget-s 400
#   bash tests/gpu/run.sh bench --shapes qwen3-4b --time-budget-s 400
#   bash tests/gpu/run.sh check                 # everything in one 9-minute call (timeout_s 540)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
stage="${1:-all}"
[ $# -gt 0 ] && shift
case "$stage" in suite | bench | all | check) ;; *) echo "usage: bash tests/gpu/run.sh [suite|bench|all|check] [ARGS...]" >&2; exit 2 ;; esac
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
if [ "${#wheels[@]}" -gt 0 ]; then
  echo "[gpu] installing ${#wheels[@]} carried wheels into $site"
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "${wheels[@]}"
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  # memrl itself, editable (its folders install as memrl.data, memrl.train, ...), built with the carried setuptools
  "$python" -m pip install -q --no-index --no-deps --no-build-isolation -e . >/tmp/memrl-gpu-install.log 2>&1 \
    || { cat /tmp/memrl-gpu-install.log >&2; exit 1; }
elif "$python" -c "import pydantic, trl, bm25s, memrl.train.group_trainer" 2>/dev/null; then
  echo "[gpu] no carried wheels: this environment has what the check needs"
else
  echo "[gpu] no .whl/*.whl here: build them with 'bash tests/gpu/build_carry.sh' and carry .whl" >&2
  exit 2
fi
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
if [ "$stage" = check ]; then
  check_s="${MEMRL_GPU_CHECK_S:-460}"
  quick=0
  for arg in "$@"; do [ "$arg" = --quick ] && quick=1; done
  if [ "$quick" = 1 ]; then
    suite_args=(--collect-only -q)
    first=(--shapes tiny --modes lora --contexts 256 --warmup 0)
    second=(--shapes tiny --modes full --contexts 512 --no-mix --warmup 0)
    margin_first=0 margin_second=0 least_second=0
  else
    suite_args=(-q -rfEsxX)
    first=(--shapes qwen3-4b --modes lora full --contexts 16384)
    second=(--shapes qwen3.5-9b --modes lora --contexts 32768 --no-mix)
    # a started case runs to its end: the budgets leave room for the last one (a 4B step is seconds, its load ~20 s)
    margin_first=120 margin_second=150 least_second=300
  fi
  echo "[gpu] check: suite (at most ${MEMRL_GPU_SUITE_S:-200} s)"
  set +e
  timeout "${MEMRL_GPU_SUITE_S:-200}" "$python" -m pytest tests/gpu "${suite_args[@]}" -p no:cacheprovider \
    --junitxml="$out/gpu-suite.xml" 2>&1 | tee "$out/gpu-suite.log"
  suite_rc=${PIPESTATUS[0]}
  set -e
  [ "$suite_rc" -eq 0 ] || { echo "[gpu] suite exited $suite_rc (124: cut at its time limit)"; rc=$suite_rc; }
  run_check_bench() {  # NAME SECONDS ARGS...: one benchmark run, its lines and last JSON line under $out
    local name="$1" seconds="$2"
    shift 2
    echo "[gpu] check: python benchmarks/gpu_trainer.py $* --time-budget-s $seconds"
    set +e
    "$python" benchmarks/gpu_trainer.py --out "/tmp/memrl-gpu-$name" --time-budget-s "$seconds" "$@" \
      2>"$out/gpu-check-$name.stderr" | tee "$out/gpu-check-$name.log"
    local bench_rc=${PIPESTATUS[0]}
    set -e
    cp "/tmp/memrl-gpu-$name/gpu_trainer.jsonl" "$out/gpu-check-$name.jsonl" 2>/dev/null || true
    tail -n 1 "$out/gpu-check-$name.log" >"$out/gpu-check-$name-summary.json"
    [ "$bench_rc" -eq 0 ] || { tail -n 40 "$out/gpu-check-$name.stderr"; rc=$bench_rc; }
  }
  left=$((check_s - SECONDS))
  run_check_bench 4b "$((left > margin_first ? left - margin_first : 0))" "${first[@]}" "$@"
  left=$((check_s - SECONDS))
  if [ "$left" -ge "$least_second" ]; then
    run_check_bench 9b "$((left - margin_second))" "${second[@]}" "$@"
  else
    echo "[gpu] check: ${left} s left of ${check_s}: the 9B LoRA run is left out" | tee "$out/gpu-check-9b.log"
  fi
  echo "[gpu] check: done in ${SECONDS} s"
fi
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
