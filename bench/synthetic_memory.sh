#!/usr/bin/env bash
# Peak resident memory of ppl / generate / calibrate / quantize --gptq on a synthetic bf16 Llama
# (bench/synthetic_hf.py; default about 1.45 GB of bf16 weights), to extrapolate to 8B models.
# calibrate runs layer by layer: peak = weights + hidden states (nsamples*seqlen*dim*4 bytes)
# + one layer's float64 ΣxxT (8*(3*dim^2 + intermediate^2) bytes) + KV cache and scratch.
#
#   bench/synthetic_memory.sh [BIN] [DIR] [LAYERS]
#
# The vocabulary is 512 (the shared llama2.c tokenizer tok512.bin). Prints, per command, the peak RSS (/usr/bin/time -v) and the ratio to the weight bytes.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-$ROOT/build/scalesweep}
DIR=${2:-/tmp/scalesweep-synthetic-bf16}
LAYERS=${3:-16}
DATA=${SS_SHARED_DATA_DIR:-$ROOT/../shared/data}
TOK=$DATA/models/stories260K/tok512.bin
TEXT=$DATA/text/tinystories_val.txt
if [ ! -f "$DIR/model.safetensors" ]; then
  python3 "$ROOT/bench/synthetic_hf.py" "$DIR" --dim 2048 --hidden 5632 --layers "$LAYERS" \
    --heads 16 --kv-heads 4 --vocab 512 --dtype bf16
fi
WBYTES=$(stat -c %s "$DIR/model.safetensors")
PARAMS=$(( WBYTES / 2 ))
echo "weights: $WBYTES bytes (bf16, ~$PARAMS parameters)"
measure() {
  local name=$1
  shift
  local log
  log=$(mktemp)
  /usr/bin/time -v "$@" >/dev/null 2>"$log" || { cat "$log"; exit 1; }
  local kb wall
  kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$log")
  awk -v n="$name" -v kb="$kb" -v w="$WBYTES" -v p="$PARAMS" -v t="$wall" 'BEGIN {
    printf "%-22s peak RSS %7.0f MB = %.3f x weights = %.3f bytes/parameter (wall %s)\n",
           n, kb / 1024, kb * 1024 / w, kb * 1024 / p, t }'
  rm -f "$log"
}
measure "ppl (ctx 256)" "$BIN" ppl "$DIR" --text "$TEXT" --tokenizer "$TOK" --ctx 256 --max-tokens 512
measure "generate (16 tokens)" "$BIN" generate "$DIR" --tokenizer "$TOK" --prompt "Once upon a time" \
  --steps 16 --temperature 0
measure "calibrate (4x128)" "$BIN" calibrate "$DIR" --text "$TEXT" --tokenizer "$TOK" --nsamples 4 \
  --seqlen 128 -o /tmp/scalesweep-synthetic-stats.safetensors
# Simulated W4A4 from that file: loads amax and the diagonal, not ΣxxT.
measure "ppl --quant WA --stats" "$BIN" ppl "$DIR" --text "$TEXT" --tokenizer "$TOK" --ctx 256 \
  --max-tokens 512 --quant WA --method 4over6 --stats /tmp/scalesweep-synthetic-stats.safetensors
measure "quantize --gptq (4x128)" "$BIN" quantize "$DIR" --gptq --calib "$TEXT" --tokenizer "$TOK" \
  --nsamples 4 --seqlen 128 -o /tmp/scalesweep-synthetic-q --overwrite
rm -rf /tmp/scalesweep-synthetic-q /tmp/scalesweep-synthetic-stats.safetensors
