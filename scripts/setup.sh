#!/usr/bin/env bash
# Installs what scalesweep needs (Debian packages, PyPI packages) and builds it into build/.
# Idempotent; safe to run again. Usage: scripts/setup.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/debs.sh
. scripts/lib/debs.sh
need_debs setup cmake ninja-build g++ libgtest-dev libgmock-dev libbenchmark-dev libhwy-dev \
  libcli11-dev nlohmann-json3-dev libopenblas-dev liblapacke-dev libfmt-dev pybind11-dev \
  python3-dev libdnnl-dev
PY=${PYTHON:-python3}
# pip into $PY; a Debian system Python (PEP 668 "externally managed")
# refuses plain installs, so retry there with --break-system-packages (user site not needed).
pip_install() { $PY -m pip install -q "$@" 2>/dev/null || $PY -m pip install -q --break-system-packages "$@"; }
if ! $PY -c "import numpy, ml_dtypes, safetensors, pytest, gguf" 2>/dev/null; then
  echo "setup: installing Python packages (numpy ml_dtypes safetensors pytest gguf)"
  pip_install numpy ml_dtypes safetensors pytest gguf==0.19.0
fi
# Optional reference tokenizer for python/tests/test_convert.py (its checks skip without it).
$PY -c "import tokenizers" 2>/dev/null || pip_install tokenizers || echo "setup: tokenizers not installed"
# One build, one compile of each translation unit: build/ is both the tree the tests use and
# the package's build directory. pip (scikit-build-core, without build isolation so that the
# same CMake and Python are found every time) configures and builds build/ with the tests and
# benchmarks on, installs the package from it, and a later run (scripts/test.sh calls this
# script again) finds everything up to date. SS_WERROR=ON by default: the supported compiler is
# Debian 12's g++, installed above, and the tree is kept free of warnings; pass -DSS_WERROR=OFF
# for another compiler. Extra arguments are CMake options, applied to both paths.
CMAKE_OPTS="-DSS_WERROR=ON -DSS_BUILD_TESTS=ON -DSS_BUILD_BENCH=ON"
# pyarrow's C++ libraries (Parquet/Arrow eval data, src/io/layer.cmake) are probed only outside
# pip by default; this build is also the test tree, so probe them here as well.
$PY -c "import pyarrow" 2>/dev/null && CMAKE_OPTS="$CMAKE_OPTS -DSS_ARROW=ON"
CMAKE_OPTS="$CMAKE_OPTS $*"
if [ "${SS_SKIP_PIP:-0}" = 1 ]; then
  # SS_SKIP_PIP=1: the same build without installing the package (the tests need only build/).
  # shellcheck disable=SC2086
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$($PY -c 'import sys; print(sys.executable)')" $CMAKE_OPTS >/dev/null
  cmake --build build -j"$(nproc)"
  echo "setup: built build/scalesweep"
  exit 0
fi
$PY -c "import scikit_build_core, pybind11" 2>/dev/null || pip_install scikit-build-core pybind11
log=build/pip-install.log
mkdir -p build
# build.targets=all: the CLI and the module as in a wheel, plus the tests and benchmarks.
pip_args=(install -v --no-build-isolation -C build-dir=build -C build.targets=all)
# A Debian system Python (PEP 668 "externally managed") refuses plain installs.
$PY -c "import os, sysconfig; raise SystemExit(not os.path.exists(os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')))" &&
  pip_args+=(--break-system-packages)
echo "setup: building build/ and installing the package (a line per compile step; log: $log)"
# The compile steps ([n/N] lines) pass through; everything goes to the log.
if CMAKE_GENERATOR=Ninja CMAKE_ARGS="$CMAKE_OPTS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
     $PY -m pip "${pip_args[@]}" . 2>&1 | tee "$log" |
     { grep --line-buffered -E '^ *\[[0-9]+/[0-9]+\]' || true; }; then
  echo "setup: built build/scalesweep and installed the Python package scalesweep into $($PY -c 'import sys; print(sys.prefix)')"
else
  tail -n 30 "$log" >&2
  echo "setup: build or pip install failed (log: $log)" >&2
  exit 1
fi
