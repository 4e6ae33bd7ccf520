#!/usr/bin/env bash
# Installs the reference implementations our interoperability tests are judged by (PyPI):
# torch + transformers (+ accelerate, which transformers needs to read a GGUF) and
# compressed-tensors (which reads our checkpoints as vLLM does), pinned to the
# versions the tests were measured with. Idempotent. Tests that need them skip visibly where
# they are absent (this script failing only costs those checks). gguf (gguf-py), needed by the
# always-run GGUF tests, is installed by scripts/setup.sh.
set -euo pipefail
PY=${PYTHON:-python3}
PKGS="torch==2.15.0 transformers==5.23.0 accelerate==1.15.0 compressed-tensors==0.20.0"
if $PY -c "import torch, transformers, accelerate, compressed_tensors" 2>/dev/null; then
  echo "get-references: torch $($PY -c 'import torch; print(torch.__version__)'), transformers $($PY -c 'import transformers; print(transformers.__version__)') present"
  exit 0
fi
echo "get-references: installing $PKGS (about 3 GB with torch's CUDA wheels)"
$PY -m pip install -q $PKGS 2>/dev/null || $PY -m pip install -q --break-system-packages $PKGS
