#!/usr/bin/env bash
# Creates .venv-llmc (git-ignored): a virtual environment holding llm-compressor 0.14.0.1 and the
# versions it pins (torch 2.10..2.14, transformers 5.15..5.17, compressed-tensors ==0.19.0),
# which differ from the system python's reference packages (scripts/get-references.sh), so they
# live apart; pytest runs the observer tests with this venv's python. Our package (with the
# observers, python/scalesweep/llmcompressor.py) is put on the venv's path by a .pth file
# pointing at build/python, where the CMake build puts it (scalesweep/: _core and the
# python/scalesweep/*.py files; target ss_python); `pip install .` into the venv works too.
# Idempotent: a venv that already holds the pinned versions is left as it is. Tests that need
# it skip visibly where it is absent (python/tests/test_llmcompressor_observer.py).
# Environment: PYTHON (the base interpreter, default python3), LLMC_WHEEL_DIR (a directory
# holding the llmcompressor wheel if it is not on the package index).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV="$ROOT/.venv-llmc"
PY=${PYTHON:-python3}
PKGS="llmcompressor==0.14.0.1 torch==2.14.0 transformers==5.17.0 compressed-tensors==0.19.0 pytest"
FIND_LINKS=()
for d in "${LLMC_WHEEL_DIR:-}"; do
  if [ -n "$d" ] && [ -d "$d" ]; then FIND_LINKS+=(--find-links "$d"); fi
done
# shellcheck source=lib/venv.sh
. "$ROOT/scripts/lib/venv.sh"
pinned_venv get-llmcompressor "$VENV" "$PKGS" "${FIND_LINKS[@]}"
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf '%s\n' "$ROOT/build/python" > "$SITE/scalesweep-dev.pth"
"$VENV/bin/python" -c 'import llmcompressor, torch, transformers, compressed_tensors as ct; print("get-llmcompressor: llmcompressor", llmcompressor.__version__, "torch", torch.__version__, "transformers", transformers.__version__, "compressed-tensors", ct.__version__)'
