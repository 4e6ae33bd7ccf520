#!/usr/bin/env bash
# Installs what scalesweep needs (Debian packages, PyPI packages) and builds it into build/.
# Idempotent; safe to run again. Usage: scripts/setup.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."
APT_PKGS="cmake ninja-build g++ libgtest-dev libgmock-dev libbenchmark-dev libhwy-dev libcli11-dev
  nlohmann-json3-dev libopenblas-dev liblapacke-dev libfmt-dev pybind11-dev python3-dev
  libdnnl-dev"
missing=""
for p in $APT_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing Debian packages:$missing"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi
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
# ccache (when installed) lets the package build below reuse the objects of this one.
if command -v ccache >/dev/null; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
echo "setup: built build/scalesweep"
# The Python package (pyproject.toml) into $PY: `import scalesweep` and the `scalesweep` CLI
# without PYTHONPATH. Built without build isolation (scikit-build-core and pybind11 installed
# into $PY first): an isolated build gets a new temporary scikit-build-core path each time,
# and scikit-build-core then starts its build directory (build/pip/) over. ccache (above)
# makes even that rebuild cheap. SS_SKIP_PIP=1 skips this step (the tests need only build/).
if [ "${SS_SKIP_PIP:-0}" != 1 ]; then
  $PY -c "import scikit_build_core, pybind11" 2>/dev/null || pip_install scikit-build-core pybind11
  log=build/pip-install.log
  if $PY -m pip install -v --no-build-isolation . >"$log" 2>&1 ||
     $PY -m pip install -v --no-build-isolation --break-system-packages . >"$log" 2>&1; then
    echo "setup: installed the Python package scalesweep into $($PY -c 'import sys; print(sys.prefix)')"
  else
    tail -n 30 "$log" >&2
    echo "setup: pip install . failed (log: $log)" >&2
    exit 1
  fi
fi
