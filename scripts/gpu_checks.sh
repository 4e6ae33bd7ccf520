#!/usr/bin/env bash
# One command for a session that has a GPU (docs/CUDA.md "GPU session checklist"):
#
#   scripts/gpu_checks.sh [BUILD_DIR]          (default build-gpu; OUT=dir for the results)
#   scripts/gpu_checks.sh --bundle FILE [BUILD_DIR]
#                                             (a build made elsewhere, scripts/gpu_bundle.sh:
#                                              for a GPU machine without the build's deps)
#
# 1. configures a CUDA build for the device's native architecture only (nvidia-smi's compute
#    capability: 9.0 -> 90, 10.x -> 100a, 12.x -> 120a; 90 when no GPU is visible) and builds
#    only cuda_gpu_test, cuda_host_test and scalesweep;
# 2. stops with exit code 3 and "no GPU" when no device is visible (after the build, so the
#    build is checked everywhere);
# 3. runs ctest -L gpu and -L cuda_host, the native-vs-emulated conversion check (2^26
#    values), the bench-gpu pytest, scalesweep bench-gpu --k 8192 (JSON and table),
#    compute-sanitizer memcheck/racecheck/initcheck on small cases (if present) and the static
#    SASS table of the native arch;
# 4. writes everything under ${OUT:-gpu_out}/: one log per step, bench.json, bench.txt,
#    sass.md, README_table.md (paste-ready for docs/CUDA.md) and summary.log with a
#    PASS/FAIL/SKIP line per step. Exit code 0 only when every step passed.
#
# Budget: <= 10 minutes on a 16-core machine with an H100/H200 (fresh build ~3-4 min, GPU
# tests ~2-4 min, bench < 1 min). JOBS=n overrides the build parallelism (default nproc).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
BUNDLE=""
if [ "${1:-}" = "--bundle" ]; then
  BUNDLE=${2:?gpu_checks: --bundle needs a file (scripts/gpu_bundle.sh makes it)}
  [ -f "$BUNDLE" ] || { echo "gpu_checks: bundle $BUNDLE not found" >&2; exit 2; }
  BUNDLE=$(cd "$(dirname "$BUNDLE")" && pwd)/$(basename "$BUNDLE")
  shift 2
fi
BUILD=${1:-build-gpu}
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
JOBS=${JOBS:-$(nproc)}
SUMMARY="$OUT/summary.log"
: >"$SUMMARY"
FAILED=0

STEPS_NAME=gpu_checks
# shellcheck source=lib/steps.sh
. "$ROOT/scripts/lib/steps.sh"

# ---- device and architecture
export PATH="$PATH:/usr/local/cuda/bin"
GPU_CC=""
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
  GPU_CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' ')
  nvidia-smi --query-gpu=name,compute_cap,clocks.max.sm,clocks.max.mem,memory.total \
    --format=csv >>"$OUT/nvidia-smi.txt" 2>&1
fi
# Fallback where nvidia-smi lacks the compute_cap field: nvcc's device query ("90", "100", ...).
if [ -z "$GPU_CC" ] && [ -x /usr/local/cuda/bin/__nvcc_device_query ]; then
  Q=$(/usr/local/cuda/bin/__nvcc_device_query 2>/dev/null | tr -d ' ' | cut -d, -f1)
  case "$Q" in
    [0-9]*) GPU_CC="${Q%?}.${Q: -1}" ;;
  esac
fi
case "$GPU_CC" in
  9.0) ARCH=90 ;;
  10.*) ARCH=100a ;;
  12.*) ARCH=120a ;;
  "") ARCH=90 ;;
  *) ARCH=$(echo "$GPU_CC" | tr -d '.') ;;
esac
log "device compute capability '${GPU_CC:-none}' -> CUDA arch $ARCH; build dir $BUILD; jobs $JOBS"
if ! command -v nvcc >/dev/null 2>&1; then
  log "FAIL nvcc not found (PATH and /usr/local/cuda/bin); install the CUDA toolkit"
  exit 2
fi
nvcc --version >"$OUT/nvcc.txt" 2>&1

# ---- configure + build (native arch only), or unpack a bundle built elsewhere
if [ -n "$BUNDLE" ]; then
  if [ -e "$BUILD" ] && [ ! -f "$BUILD/.bundle-origin" ]; then
    log "FAIL $BUILD exists and is not an unpacked bundle; name another build directory"
    exit 2
  fi
  rm -rf "$BUILD" && mkdir -p "$BUILD" && tar -xJf "$BUNDLE" -C "$BUILD" || exit 1
  BUILD=$(cd "$BUILD" && pwd)
  # The CTest files name the checkout and build directory it was built in; point them here.
  { read -r FROM_ROOT; read -r FROM_BUILD; } <"$BUILD/.bundle-origin"
  find "$BUILD" -name '*.cmake' -exec sed -i -e "s#$FROM_BUILD#$BUILD#g" \
    -e "s#$FROM_ROOT#$ROOT#g" {} +
  export LD_LIBRARY_PATH="$BUILD/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  BUILT_ARCH=$(sed -n 's/^SS_CUDA_ARCHS:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
  log "bundle $BUNDLE (built in $FROM_BUILD for CUDA archs '$BUILT_ARCH') unpacked into $BUILD"
  case ";$BUILT_ARCH;" in
    *";$ARCH;"*) ;;
    *) log "FAIL the bundle has no code for this device's arch $ARCH" && exit 1 ;;
  esac
  # The Python module, compiled here for this machine's python3 against the bundle's static
  # layers (the link line of src/python/CMakeLists.txt), if python3 has pybind11 and headers.
  if python3 -c "import pybind11, sysconfig, os; assert os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))" 2>/dev/null; then
    PYPKG="$BUILD/python/scalesweep"
    mkdir -p "$PYPKG" && cp "$ROOT"/python/scalesweep/*.py "$PYPKG/"
    EXT=$(python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
    VER=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$BUILD/CMakeCache.txt")
    export PYPKG EXT VER ROOT BUILD
    build_pymodule() {
      g++ -std=c++20 -O2 -fPIC -shared -fvisibility=hidden -DSS_HAVE_CUDA=1 \
        -DSS_VERSION="\"$VER\"" \
        -I"$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
        -I"$(python3 -c 'import pybind11; print(pybind11.get_include())')" \
        -I"$ROOT/include" -I"$ROOT/src" "$ROOT/src/python/module.cc" -o "$PYPKG/_core$EXT" \
        -Wl,--start-group "$BUILD"/.pylib/*.a -Wl,--end-group "$BUILD"/.libs/libhwy.so.* "$BUILD"/.libs/libcudart.so.* \
        -Wl,-rpath,"$BUILD/.libs" -lpthread
    }
    export -f build_pymodule
    step python_module 300 bash -c build_pymodule
  else
    log "SKIP python_module: python3 here lacks pybind11 or the Python headers"
  fi
else
  GEN=()
  command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
  step configure 120 cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DSS_CUDA=ON -DSS_CUDA_ARCHS="$ARCH" -DSS_BUILD_BENCH=OFF || exit 1
  step build 420 cmake --build "$BUILD" -j"$JOBS" --target cuda_gpu_test cuda_host_test scalesweep ||
    exit 1
  # The Python module (torch CUDA tensors go to the kernels); built only where CMake found the
  # Python headers and pybind11 (src/python/CMakeLists.txt says which is missing).
  if grep -q "ss_python" "$BUILD/build.ninja" "$BUILD/Makefile" 2>/dev/null; then
    step python_module 300 cmake --build "$BUILD" -j"$JOBS" --target ss_python
  fi
fi
BIN="$BUILD/scalesweep"

# ---- no GPU: the build is checked, the rest needs a device
if [ -z "$GPU_CC" ]; then
  log "SKIP every GPU step: no GPU visible (nvidia-smi missing or lists no device)"
  "$BIN" bench-gpu --k 256 --m 128 --runs 1 >"$OUT/no_gpu_bench.log" 2>&1
  log "bench-gpu without a GPU says: $(tail -n1 "$OUT/no_gpu_bench.log")"
  log "FAIL no GPU: run this script on the GPU machine"
  exit 3
fi

# ---- tests
step ctest_cuda_host 120 ctest --test-dir "$BUILD" -L cuda_host --output-on-failure --no-tests=error -j"$JOBS"
step conversions 60 "$BUILD/src/kernels/cuda/cuda_gpu_test" \
  --gtest_filter='CudaGpu.NativeConversionsMatchTheFormatCode'
grep -E "device|native" "$OUT/conversions.log" | head -n 3 | sed 's/^/    /' | tee -a "$SUMMARY"
# ---- benchmark (JSON for the record, the table for reading)
step bench_json 150 sh -c "'$BIN' bench-gpu --k 8192 --json >'$OUT/bench.json'"
if [ -s "$OUT/bench.json" ]; then
  if python3 - "$OUT/bench.json" "$ARCH" >"$OUT/README_table.md" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
rows = j["rows"]
ms = sorted({r["m"] for r in rows})
def label(r):  # "sweep-mse" (exact numerics) or "sweep-mse (fast)"
    return r["method"] + (" (fast)" if r.get("numerics") == "fast" else "")
meths = []
for r in rows:
    if label(r) not in meths:
        meths.append(label(r))
get = {(r["m"], label(r)): r for r in rows}
print(f"Measured with `scripts/gpu_checks.sh` on {j['device']} (sm_{sys.argv[2]}), "
      f"K = {j['k']}, {j['dtype']} input, median of {j['runs']} runs, L2 flushed:\n")
print("| method | metric | " + " | ".join(str(m) for m in ms) + " |")
print("|---|---|" + "---:|" * len(ms))
print("| d2d copy | latency (ms) | " + " | ".join(f"{get[(m, meths[0])]['copy_ms']:.4f}" for m in ms) + " |")
for me in meths:
    print(f"| {me} | latency (ms) | " + " | ".join(f"{get[(m, me)]['median_ms']:.4f}" for m in ms) + " |")
    if me != "absmax" and get[(ms[0], me)]["rel_absmax"] is not None:
        print(f"| {me} | x absmax | " + " | ".join(f"{get[(m, me)]['rel_absmax']:.2f}" for m in ms) + " |")
    print(f"| {me} | % of copy BW | " + " | ".join(f"{100 * get[(m, me)]['bw_fraction_of_copy']:.0f}%" for m in ms) + " |")
big = [m for m in ms if m >= 4096]
if big:
    print("\nTargets (issue 6, M >= 4096): absmax >= 80 % of copy bandwidth, sweep-mse <= 1.05x "
          "and sweep-wmse <= 1.15x absmax latency (exact and fast numerics):\n")
    for m in big:
        a = get.get((m, "absmax"))
        parts = []
        if a:
            f = a["bw_fraction_of_copy"]
            parts.append(f"absmax {100 * f:.0f}% ({'met' if f >= 0.8 else 'missed'})")
        for name, limit in (("sweep-mse", 1.05), ("sweep-mse (fast)", 1.05),
                            ("sweep-wmse", 1.15), ("sweep-wmse (fast)", 1.15)):
            s = get.get((m, name))
            if s and s["rel_absmax"] is not None:
                parts.append(f"{name} {s['rel_absmax']:.2f}x ({'met' if s['rel_absmax'] <= limit else 'missed'})")
        print(f"- M = {m}: " + ", ".join(parts))
EOF
  then
    log "README table written to README_table.md"
  else
    log "FAIL README table"
    FAILED=1
  fi
fi


# ---- the GPU test suite (bit identity on >= 10^7 blocks per method, adversarial kinds, ...)
step ctest_gpu 330 ctest --test-dir "$BUILD" -L gpu --output-on-failure --no-tests=error -j4 --timeout 320
grep -E "tests passed|Passed|Failed|Skipped|\*\*\*" "$OUT/ctest_gpu.log" | tail -n 40 >"$OUT/ctest_gpu_summary.txt"
# A skipped GPU test on a GPU machine is a failure of this check.
if grep -q "Skipped" "$OUT/ctest_gpu.log"; then
  log "FAIL ctest_gpu: tests were skipped although a GPU is visible (see ctest_gpu.log)"
  FAILED=1
fi

step bench_table 150 sh -c "'$BIN' bench-gpu --k 8192 >'$OUT/bench.txt'"
cat "$OUT/bench.txt" 2>/dev/null

if command -v python3 >/dev/null 2>&1 && python3 -c "import pytest" 2>/dev/null; then
  step pytest_bench_gpu 120 env SCALESWEEP_BIN="$BIN" python3 -m pytest -q \
    "$ROOT/python/tests/test_bench_gpu.py"
fi

# ---- torch CUDA tensors through the Python module (python/tests/test_torch_cuda.py)
if ls "$BUILD"/python/scalesweep/_core*.so >/dev/null 2>&1 && python3 -c "import torch" 2>/dev/null; then
  step pytest_torch_cuda 300 env PYTHONPATH="$BUILD/python" python3 -m pytest -q -rs \
    "$ROOT/python/tests/test_torch_cuda.py"
  if grep -q "SKIPPED" "$OUT/pytest_torch_cuda.log"; then
    log "FAIL pytest_torch_cuda: skipped although a GPU is visible (see pytest_torch_cuda.log)"
    FAILED=1
  fi
else
  log "SKIP pytest_torch_cuda: no Python module in $BUILD/python or no torch in python3"
fi

# ---- compute-sanitizer on small cases (all four methods, vec + generic kernels, swizzle padding)
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [ -n "$SAN" ]; then
  SMALL='CudaGpu.DeviceApiUnalignedInputAndSixteenBitDequant:CudaGpu.NonFiniteInputIsAnErrorNamingTheElement:*FusedQuantizeDequantizeMatchesCpu*'
  step sanitizer_memcheck 120 "$SAN" --tool memcheck --error-exitcode 9 \
    "$BUILD/src/kernels/cuda/cuda_gpu_test" --gtest_filter="$SMALL"
  step sanitizer_racecheck 120 "$SAN" --tool racecheck --error-exitcode 9 \
    "$BUILD/src/kernels/cuda/cuda_gpu_test" --gtest_filter='*FusedQuantizeDequantizeMatchesCpu/sweep_mse'
  step sanitizer_initcheck 120 "$SAN" --tool initcheck --error-exitcode 9 \
    "$BUILD/src/kernels/cuda/cuda_gpu_test" --gtest_filter='CudaGpu.DeviceApiUnalignedInputAndSixteenBitDequant'
  step sanitizer_bench 120 "$SAN" --tool memcheck --error-exitcode 9 \
    "$BIN" bench-gpu --k 4112 --m 130 --runs 1 --warmup 0
else
  log "SKIP compute-sanitizer: not found"
fi

# ---- static SASS of the native arch (cuobjdump from the toolkit)
step sass 120 sh -c "python3 '$ROOT/scripts/sass_count.py' --arch '$ARCH' --json '$OUT/sass.json' >'$OUT/sass.md'"

log "done: results in $OUT"
if [ $FAILED -ne 0 ]; then
  log "RESULT: FAIL (see the FAIL lines above)"
  exit 1
fi
log "RESULT: PASS"
exit 0
