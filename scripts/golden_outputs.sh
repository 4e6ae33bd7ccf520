#!/usr/bin/env bash
# Runs a fixed set of commands whose output files must not change across a refactor and prints
# "sha256  name" per output file: `tensor -o` (NVFP4 and MXFP4, every method of --compare's
# default), `quantize` RTN and GPTQ (stories260K from ../shared, in-memory and streamed; the
# SmolLM2 fixture RTN and streamed GPTQ when present) and `demo` stdout, with wall-clock fields
# removed. Compare two runs with diff.
#   scripts/golden_outputs.sh [BIN] > before.txt ... scripts/golden_outputs.sh [BIN] > after.txt
set -euo pipefail
exec 2>/dev/null  # progress and notes; a failing command still stops the script (set -e)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-$ROOT/build/scalesweep}
DATA=$ROOT/../shared/data
M=$DATA/models/stories260K/stories260K.bin
TXT=$DATA/text/tinystories_val.txt
SMOL=$ROOT/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf
# A fixed path: outputs record their input paths.
W=${GOLDEN_DIR:-/tmp/scalesweep-golden}
rm -rf "$W" && mkdir -p "$W"

python3 - "$W/x.npy" "$W/imp.npy" <<'PY'
import sys, numpy as np
r = np.random.default_rng(7)
x = (r.standard_normal((64, 200)) * np.exp(r.standard_normal((64, 1)))).astype(np.float32)
x[3, 17] = 40.0
np.save(sys.argv[1], x)
np.save(sys.argv[2], r.random(200).astype(np.float32))
PY
for m in absmax 4over6 sweep-mse sweep-wmse exhaustive-mse opt-fp8-wmse; do
  for f in nvfp4 mxfp4; do
    b=16; [ $f = mxfp4 ] && b=32
    "$BIN" tensor "$W/x.npy" --method $m --format $f --block $b --importance "$W/imp.npy" \
      -o "$W/t-$m-$f.safetensors" --dequant --json > "$W/t-$m-$f.json"
  done
done
"$BIN" tensor "$W/x.npy" --compare --importance "$W/imp.npy" --json > "$W/tensor-compare.json"
"$BIN" quantize "$M" -o "$W/q-rtn" --method sweep-wmse --calib "$TXT" --nsamples 8 --seqlen 64 --threads 2 >/dev/null
"$BIN" quantize "$M" -o "$W/q-gptq" --method sweep-mse --gptq --calib "$TXT" --nsamples 8 --seqlen 64 --threads 2 >/dev/null
"$BIN" quantize "$M" -o "$W/q-wa" --method absmax --quant WA --calib "$TXT" --nsamples 8 --seqlen 64 --threads 2 >/dev/null
if [ -f "$SMOL" ]; then
  "$BIN" convert "$SMOL" -o "$W/smol-hf" >/dev/null
  "$BIN" quantize "$W/smol-hf" -o "$W/smol-rtn" --method sweep-mse --threads 2 >/dev/null
  "$BIN" quantize "$W/smol-hf" -o "$W/smol-gptq-stream" --method sweep-mse --gptq --calib "$TXT" --nsamples 4 --seqlen 64 --threads 2 >/dev/null
  rm -rf "$W/smol-hf"
fi
# Wall-clock figures are not outputs: "seconds" fields and the demo's "runs in" line go.
"$BIN" demo | grep -v ' runs in ' > "$W/demo.txt"
for j in "$W"/*.json; do
  python3 -c 'import json,sys
def strip(o):
    if isinstance(o, dict): return {k: strip(v) for k, v in o.items() if k != "seconds"}
    if isinstance(o, list): return [strip(v) for v in o]
    return o
p = sys.argv[1]; o = strip(json.load(open(p))); open(p, "w").write(json.dumps(o, sort_keys=True))' "$j"
done
cd "$W" && find . -type f ! -name '*.npy' | sort | xargs sha256sum
