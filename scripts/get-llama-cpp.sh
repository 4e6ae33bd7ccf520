#!/usr/bin/env bash
# Installs llama.cpp as a judge for our GGUF files: llama-cpp-python 0.3.36 from PyPI, which
# builds the llama.cpp it vendors (ggml-org/llama.cpp@0c1e57098 per its CHANGELOG; the sdist has
# no .git, so llama.cpp's own build-info says commit "unknown") from source, CPU only.
# Idempotent: does nothing when that version imports. Minimal build: no multimodal library
# (LLAVA_BUILD=OFF), no llama.cpp tests/examples/tools/server, -march=native.
# python/tests/test_llama_cpp.py and bench/llama_cpp_compare.py skip visibly without it, so
# this script failing only costs those checks. Usage: scripts/get-llama-cpp.sh
set -euo pipefail
PY=${PYTHON:-python3}
VERSION=0.3.36
if $PY -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null; then
  echo "get-llama-cpp: llama-cpp-python $VERSION present"
  exit 0
fi
echo "get-llama-cpp: building llama-cpp-python==$VERSION from source ($(nproc) jobs)"
export CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
export CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
start=$(date +%s)
args=(--no-binary llama-cpp-python "llama-cpp-python==$VERSION")
$PY -m pip install -q "${args[@]}" 2>/dev/null || $PY -m pip install -q --break-system-packages "${args[@]}"
echo "get-llama-cpp: built and installed in $(( $(date +%s) - start )) s"
