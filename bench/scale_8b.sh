#!/usr/bin/env bash
# An 8B model measured, not extrapolated: a synthetic bf16 model with Llama-3.1-8B's shapes and
# RoPE (bench/synthetic_hf.py --preset llama-3.1-8b: random weights, 16 GB) and a real
# tokenizer (SmolLM2's byte-level BPE, taken from `convert` of the fixture; its ids lie below
# the 128,256-row vocabulary). Each step runs once under /usr/bin/time -v; prints peak RSS and
# wall time per step as a table (and WORK/scale_8b.json):
#   ppl (2,048 tokens, ctx 2,048), calibrate (32 x 512), quantize RTN (compressed-tensors),
#   quantize -o X.gguf (NVFP4 GGUF), quantize --gptq (streamed, 32 x 512).
# GPTQ on the whole model takes hours on 2 cores: by default it runs on a 4-layer model of the
# same shapes and the per-layer time is extrapolated to 32 layers (the report says so);
# SS_FULL_GPTQ=1 runs it on the whole model. calibrate writes every layer's float64 ΣxxT
# (8 x (3 x 4096^2 + 14336^2) bytes = 2.05 GB a layer, 65.6 GB for 32 layers), which a disk
# beside the 16 GB model rarely holds: it runs on the 4-layer model (8.2 GB of statistics) and
# is extrapolated the same way unless SS_FULL_CALIBRATE=1 (its peak RSS is the weights, the
# hidden states and one layer's statistics, whatever the depth, plus the mapped weights' pages).
# SS_8B_STEPS="ppl calibrate rtn gguf gptq" (the default) selects steps.
#   bench/scale_8b.sh [BIN] [WORK]      (WORK default /tmp/scalesweep-8b; needs ~40 GB of disk)
# SS_8B_SHAPE="--dim 256 --hidden 512 ..." passes shape overrides to synthetic_hf.py (a quick
# run of the script's plumbing on a small model; not a measurement).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-$ROOT/build/scalesweep}
WORK=${2:-/tmp/scalesweep-8b}
DATA=${SS_SHARED_DATA_DIR:-$ROOT/../shared/data}
TEXT=$DATA/text/wikitext2_valid.txt
SMOL=$ROOT/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf
for f in "$BIN" "$TEXT" "$SMOL"; do
  [ -e "$f" ] || { echo "scale_8b: $f absent (build, ../shared/data, scripts/get-models.sh)" >&2; exit 1; }
done
mkdir -p "$WORK"
[ -f "$WORK/tok/tokenizer.json" ] || "$BIN" convert "$SMOL" -o "$WORK/tok" >/dev/null
M=$WORK/llama8b
M4=$WORK/llama8b-4layers
[ -f "$M/model.safetensors" ] ||
  python3 "$ROOT/bench/synthetic_hf.py" "$M" --preset llama-3.1-8b --tokenizer-from "$WORK/tok" \
    ${SS_8B_SHAPE:-}
[ -f "$M4/model.safetensors" ] ||
  python3 "$ROOT/bench/synthetic_hf.py" "$M4" --preset llama-3.1-8b --tokenizer-from "$WORK/tok" \
    ${SS_8B_SHAPE:-} --layers 4
ROWS=$WORK/rows.tsv
: > "$ROWS"
measure() {  # name, command...
  local name=$1 log
  shift
  log=$(mktemp)
  echo "scale_8b: $name ..." >&2
  if ! /usr/bin/time -v "$@" >"$log.out" 2>"$log"; then
    tail -5 "$log" >&2
    echo "scale_8b: $name failed" >&2
    exit 1
  fi
  local kb wall
  kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$log")
  printf '%s\t%s\t%s\n' "$name" "$kb" "$wall" >>"$ROWS"
  rm -f "$log" "$log.out"
}
rm -rf "$WORK/out-ct" "$WORK/out.gguf" "$WORK/out-gptq" "$WORK/stats.safetensors"
STEPS=" ${SS_8B_STEPS:-ppl calibrate rtn gguf gptq} "
step() { [[ "$STEPS" == *" $1 "* ]]; }
step ppl &&
  measure "ppl (2048 tokens, ctx 2048)" "$BIN" ppl "$M" --text "$TEXT" --ctx 2048 --max-tokens 2048
if step calibrate; then
  if [ "${SS_FULL_CALIBRATE:-0}" = 1 ]; then
    measure "calibrate (32 x 512, 32 layers)" "$BIN" calibrate "$M" --text "$TEXT" \
      --nsamples 32 --seqlen 512 -o "$WORK/stats.safetensors"
  else
    measure "calibrate (32 x 512, 4 layers)" "$BIN" calibrate "$M4" --text "$TEXT" \
      --nsamples 32 --seqlen 512 -o "$WORK/stats.safetensors"
  fi
  rm -f "$WORK/stats.safetensors"
fi
if step rtn; then
  measure "quantize RTN sweep-mse -> compressed-tensors" "$BIN" quantize "$M" -o "$WORK/out-ct" \
    --method sweep-mse
  rm -rf "$WORK/out-ct"
fi
if step gguf; then
  measure "quantize RTN sweep-mse -> NVFP4 GGUF" "$BIN" quantize "$M" -o "$WORK/out.gguf" \
    --method sweep-mse
  rm -f "$WORK/out.gguf"
fi
if step gptq; then
  if [ "${SS_FULL_GPTQ:-0}" = 1 ]; then
    measure "quantize --gptq (32 x 512, streamed, 32 layers)" "$BIN" quantize "$M" --gptq \
      --calib "$TEXT" --nsamples 32 --seqlen 512 --method sweep-mse -o "$WORK/out-gptq"
  else
    measure "quantize --gptq (32 x 512, streamed, 4 layers)" "$BIN" quantize "$M4" --gptq \
      --calib "$TEXT" --nsamples 32 --seqlen 512 --method sweep-mse -o "$WORK/out-gptq"
  fi
  rm -rf "$WORK/out-gptq"
fi
python3 - "$ROWS" "$WORK/scale_8b.json" "${SS_FULL_GPTQ:-0}" <<'PY'
import json, sys
rows = []
for line in open(sys.argv[1]):
    name, kb, wall = line.rstrip("\n").split("\t")
    parts = [float(x) for x in wall.split(":")]
    secs = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
    rows.append({"step": name, "peak_rss_gb": int(kb) * 1024 / 1e9, "wall_s": secs})
for g in rows:
    if g["step"].endswith("4 layers)"):
        # Calibration forward and solves are per layer: the 4-layer wall time times 8 bounds
        # the whole model's from above (the fixed costs, tokenizing, embeddings, head and
        # writing, are counted 8 times).
        g["extrapolated_32_layers_wall_s"] = g["wall_s"] / 4 * 32
print(f"{'step':<50} {'peak RSS GB':>12} {'wall':>10}")
for r in rows:
    extra = (f"  (x8 for 32 layers: at most {r['extrapolated_32_layers_wall_s'] / 3600:.1f} h, extrapolated)"
             if "extrapolated_32_layers_wall_s" in r else "")
    print(f"{r['step']:<50} {r['peak_rss_gb']:>12.2f} {r['wall_s']:>9.0f}s{extra}")
json.dump({"rows": rows}, open(sys.argv[2], "w"), indent=1)
PY
