#!/usr/bin/env bash
# The short GPU check of the sweeps' numerics (exact, fast, half2) for a session with little
# device time (docs/CUDA.md "half2 numerics"); scripts/gpu_checks.sh is the whole checklist.
#
#   scripts/gpu_numerics.sh BUNDLE [BUILD_DIR]     (BUNDLE: scripts/gpu_bundle.sh's file;
#                                                   BUILD_DIR default build-gpu-run, replaced)
#
# In this order, each step logged to ${OUT:-gpu_out}/<step>.log, summary.log one line per step:
#   1. bench-gpu K = 8192, M = 4096 and 32768, absmax / sweep-mse / sweep-wmse with every
#      numerics (bench.json, bench.txt);
#   2. cuda_gpu_test CudaGpuFast.*: the fast and half2 kernels equal to the CPU emulation, and
#      their selections within their contracts on >= 10^8 blocks per method and numerics;
#   3. the rest of the GPU suite (ctest -L gpu) in parallel, as far as ${REST_S:-240} s allow.
# Exit code 0 only when every step passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
BUNDLE=${1:?gpu_numerics: BUNDLE (scripts/gpu_bundle.sh makes it)}
BUILD=${2:-build-gpu-run}
OUT=${OUT:-gpu_out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
SUMMARY="$OUT/summary.log"
: >"$SUMMARY"
FAILED=0
STEPS_NAME=gpu_numerics
# shellcheck source=lib/steps.sh
. "$ROOT/scripts/lib/steps.sh"
nvidia-smi --query-gpu=name,compute_cap,clocks.max.sm,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
log "device: $(tail -n1 "$OUT/gpu.txt")"
if [ -e "$BUILD" ] && [ ! -f "$BUILD/.bundle-origin" ]; then  # never a developer's own build
  log "FAIL $BUILD exists and is not an unpacked bundle; name another build directory"
  exit 2
fi
rm -rf "$BUILD" && mkdir -p "$BUILD" && tar -xJf "$BUNDLE" -C "$BUILD" || exit 1
BUILD=$(cd "$BUILD" && pwd)
{ read -r FROM_ROOT; read -r FROM_BUILD; } <"$BUILD/.bundle-origin"
find "$BUILD" -name '*.cmake' -exec sed -i -e "s#$FROM_BUILD#$BUILD#g" -e "s#$FROM_ROOT#$ROOT#g" {} +
export LD_LIBRARY_PATH="$BUILD/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BIN="$BUILD/scalesweep"
TEST="$BUILD/src/kernels/cuda/cuda_gpu_test"

step bench 200 sh -c "'$BIN' bench-gpu --k 8192 --m 4096 32768 --methods absmax,sweep-mse,sweep-wmse \
  --numerics all --runs 50 --warmup 5 --json >'$OUT/bench.json' && \
  '$BIN' bench-gpu --k 8192 --m 4096 32768 --methods absmax,sweep-mse,sweep-wmse \
  --numerics all --runs 50 --warmup 5 >'$OUT/bench.txt'"
cat "$OUT/bench.txt" 2>/dev/null
step fast_half2 240 "$TEST" --gtest_filter='*CudaGpuFast.*'
grep -E "^(fast|half2) |OK|FAILED" "$OUT/fast_half2.log" | tee -a "$SUMMARY"
step rest "${REST_S:-240}" ctest --test-dir "$BUILD" -L gpu -E 'CudaGpuFast' -j 12 \
  --output-on-failure --no-tests=error --timeout "${REST_S:-240}"
grep -E "tests passed|Failed|\*\*\*" "$OUT/rest.log" | tail -n 15 | tee -a "$SUMMARY"
log "done: $([ $FAILED -eq 0 ] && echo all passed || echo some failed)"
exit $FAILED
