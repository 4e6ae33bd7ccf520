#!/usr/bin/env bash
# Packs a CUDA build made on this machine for a GPU machine that has the CUDA driver but not
# this project's build dependencies (OpenBLAS, oneDNN, Highway, GoogleTest, ...):
#
#   scripts/gpu_bundle.sh [BUILD_DIR] [OUT_FILE]    (defaults build-gpu, gpu-bundle/bundle.tar.xz)
#
# BUILD_DIR must be configured as scripts/gpu_checks.sh configures it (-DSS_CUDA=ON
# -DSS_CUDA_ARCHS=<the GPU's arch> -DSS_BUILD_BENCH=OFF) and built for the targets
# cuda_gpu_test cuda_host_test scalesweep. The bundle holds those binaries, the CTest files and
# the shared libraries they load (ldd), minus the C runtime (glibc, libstdc++, libgcc_s: the
# target's own, which must be at least as new). On the GPU machine:
#
#   scripts/gpu_checks.sh --bundle gpu-bundle/bundle.tar.xz
#
# unpacks it into the build directory, points the CTest files at the checkout it runs in, skips
# the configure and build steps, and compiles the Python module there (its python's version).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${1:-build-gpu}
OUTF=${2:-gpu-bundle/bundle.tar.xz}
BIN=(scalesweep src/kernels/cuda/cuda_gpu_test src/kernels/cuda/cuda_host_test)
for b in "${BIN[@]}"; do
  [ -x "$BUILD/$b" ] || { echo "gpu_bundle: $BUILD/$b is missing; build it first" >&2; exit 2; }
done
grep -q '^SS_CUDA:STRING=ON' "$BUILD/CMakeCache.txt" ||
  { echo "gpu_bundle: $BUILD is not a -DSS_CUDA=ON build" >&2; exit 2; }
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/build/.libs"
# Binaries and every CTest file, at their paths in the build directory.
(cd "$BUILD" && find . -path ./CMakeFiles -prune -o \( -name 'CTestTestfile.cmake' -o \
  -name '*_include.cmake' -o -name '*_tests.cmake' \) -print0 | tar --null -T - -cf -) |
  tar -xf - -C "$STAGE/build"
for b in "${BIN[@]}"; do cp -p "$BUILD/$b" "$STAGE/build/$b"; done
cp -p "$BUILD/CMakeCache.txt" "$STAGE/build/"
# Shared libraries the binaries load, except the C runtime.
for b in "${BIN[@]}"; do ldd "$BUILD/$b"; done | awk '/=> \//{print $3}' | sort -u |
  while read -r lib; do
    case $(basename "$lib") in
      libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | libstdc++.so* | libgcc_s.so* | ld-linux*) ;;
      *) cp -L "$lib" "$STAGE/build/.libs/" ;;
    esac
  done
# The static layers the Python module links (src/python/CMakeLists.txt): gpu_checks.sh compiles
# src/python/module.cc against them with the GPU machine's own python, whose version may differ
# from this machine's.
mkdir -p "$STAGE/build/.pylib"
for a in libss_quant.a libss_scale.a libss_format.a libss_base.a src/kernels/cuda/libss_cuda.a \
  src/kernels/cuda/libss_cuda_host.a; do
  [ -f "$BUILD/$a" ] && cp -p "$BUILD/$a" "$STAGE/build/.pylib/"
done
# Where it was built: gpu_checks.sh rewrites these paths in the CTest files.
printf '%s\n%s\n' "$ROOT" "$(cd "$BUILD" && pwd)" >"$STAGE/build/.bundle-origin"
mkdir -p "$(dirname "$OUTF")"
tar -cJf "$OUTF.tmp" -C "$STAGE/build" . && mv "$OUTF.tmp" "$OUTF"
echo "gpu_bundle: $OUTF ($(du -h "$OUTF" | cut -f1)): ${BIN[*]}, $(ls "$STAGE/build/.libs" | wc -l) libraries"
