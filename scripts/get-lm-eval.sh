#!/usr/bin/env bash
# Installs the task-accuracy judge: lm-evaluation-harness (lm-eval) 0.4.13 from PyPI, its wheel
# checked by sha256, into the python the project uses (PYTHON=... overrides). Its hf backend
# needs torch, transformers and accelerate: those come from scripts/get-references.sh (run it
# first; this script refuses to start without them) and are passed to pip again, pinned, so that
# lm-eval's requirements can neither upgrade nor downgrade them; they are checked afterwards.
# The hf extra's fourth package, peft, is left out: lm-eval imports it only for a LoRA adapter
# (--model_args peft=...), which bench/lmeval_compare.py never uses.
# Idempotent: does nothing when lm_eval 0.4.13 already imports. Tests that need it skip visibly
# where it is absent (python/tests/test_eval_lmeval.py).
set -euo pipefail
PY=${PYTHON:-python3}
VER=0.4.13
WHEEL_SHA=5daaa1973bf874005f64f28d3834b875f6886f0d6475878e6a6c821994a5286a
PINS="torch==2.15.0 transformers==5.23.0 accelerate==1.15.0"

check_pins() {
  $PY - <<'PYEOF'
import importlib.metadata as md, sys
want = {"torch": "2.15.0", "transformers": "5.23.0", "accelerate": "1.15.0"}
bad = {k: md.version(k) for k in want if md.version(k).split("+")[0] != want[k]}
if bad:
    sys.exit(f"get-lm-eval: pins broken: {bad} (expected {want})")
PYEOF
}

if [ "$($PY -c 'import importlib.metadata as m; print(m.version("lm_eval"))' 2>/dev/null)" = "$VER" ] \
   && $PY -c "import lm_eval, torch, transformers, accelerate" 2>/dev/null; then
  check_pins
  echo "get-lm-eval: lm_eval $VER present"
  exit 0
fi
if ! $PY -c "import torch, transformers, accelerate" 2>/dev/null; then
  echo "get-lm-eval: torch/transformers/accelerate missing: run scripts/get-references.sh first" >&2
  exit 1
fi
check_pins
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "get-lm-eval: downloading lm-eval==$VER (9 MB) from PyPI"
$PY -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "lm-eval==$VER"
whl=$(ls "$tmp"/lm_eval-$VER-*.whl)
got=$(sha256sum "$whl" | cut -d' ' -f1)
if [ "$got" != "$WHEEL_SHA" ]; then
  echo "get-lm-eval: $whl: sha256 $got, expected $WHEEL_SHA" >&2
  exit 1
fi
echo "get-lm-eval: installing $(basename "$whl") and its requirements (keeping $PINS)"
$PY -m pip install -q "$whl" $PINS 2>/dev/null \
  || $PY -m pip install -q --break-system-packages "$whl" $PINS
check_pins
$PY -c "import lm_eval, lm_eval.models.huggingface; import importlib.metadata as m; print('get-lm-eval: lm_eval', m.version('lm_eval'), 'installed')"
