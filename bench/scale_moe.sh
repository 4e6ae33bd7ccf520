#!/usr/bin/env bash
# A mixture-of-experts model at Qwen3-30B-A3B's shapes, measured per layer: synthetic bf16
# models of the preset's shapes (bench/synthetic_hf.py --preset qwen3-30b-a3b: 128 experts of
# width 768, 8 routed per token, hidden 2048, random weights, 1.2 GB of bf16 a layer) with
# L1 and L2 layers (default 2 and 4) and a real tokenizer (SmolLM2's byte-level BPE, from
# `convert` of the fixture; its ids lie below the 151,936-row vocabulary). Each step runs once
# per model under /usr/bin/time -v:
#   ppl (512 tokens, ctx 512), calibrate (8 x 256, --calib-all-experts), quantize RTN
#   sweep-mse -> compressed-tensors, quantize --gptq (8 x 256, --calib-all-experts, streamed).
# The per-layer cost is the difference between the two models divided by L2 - L1, and the
# 48-layer figure is extrapolated from it (the report says so). Prints a table and writes
# WORK/scale_moe.json.
#   bench/scale_moe.sh [BIN] [WORK]     (WORK default /tmp/scalesweep-moe; ~12 GB of disk)
# SS_MOE_LAYERS="2 4" picks the two depths; SS_MOE_SHAPE="--experts 8" passes overrides to
# synthetic_hf.py (a quick run of the plumbing, not a measurement).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-$ROOT/build/scalesweep}
WORK=${2:-/tmp/scalesweep-moe}
DATA=${SS_SHARED_DATA_DIR:-$ROOT/../shared/data}
TEXT=$DATA/text/wikitext2_valid.txt
SMOL=$ROOT/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf
read -r L1 L2 <<<"${SS_MOE_LAYERS:-2 4}"
[ "$L2" -gt "$L1" ] || { echo "scale_moe: SS_MOE_LAYERS needs two depths, the second larger" >&2; exit 2; }
for f in "$BIN" "$TEXT" "$SMOL" /usr/bin/time; do
  [ -e "$f" ] || { echo "scale_moe: $f absent (build, ../shared/data, scripts/get-models.sh, GNU time)" >&2; exit 1; }
done
mkdir -p "$WORK"
[ -f "$WORK/tok/tokenizer.json" ] || "$BIN" convert "$SMOL" -o "$WORK/tok" >/dev/null
ROWS=$WORK/rows.tsv
: >"$ROWS"
measure() {  # layers, step, command...
  local layers=$1 step=$2 log kb wall
  shift 2
  log=$(mktemp)
  echo "scale_moe: $layers layers: $step ..." >&2
  if ! /usr/bin/time -v "$@" >"$log.out" 2>"$log"; then
    grep -v -e '^\s' -e '^Command' "$log" | tail -5 >&2
    echo "scale_moe: $step failed" >&2
    exit 1
  fi
  kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$log")
  printf '%s\t%s\t%s\t%s\n' "$layers" "$step" "$kb" "$wall" >>"$ROWS"
  rm -f "$log" "$log.out"
}
CAL=(--calib "$TEXT" --nsamples 8 --seqlen 256 --calib-all-experts)
for L in "$L1" "$L2"; do
  M=$WORK/moe-$L
  [ -f "$M/model.safetensors" ] ||
    python3 "$ROOT/bench/synthetic_hf.py" "$M" --preset qwen3-30b-a3b --layers "$L" \
      --tokenizer-from "$WORK/tok" ${SS_MOE_SHAPE:-} >&2
  rm -rf "$WORK/out-ct" "$WORK/out-gptq" "$WORK/stats.safetensors"
  measure "$L" "ppl (512 tokens, ctx 512)" "$BIN" ppl "$M" --text "$TEXT" --ctx 512 --max-tokens 512
  measure "$L" "calibrate (8 x 256, all experts)" "$BIN" calibrate "$M" "${CAL[@]}" \
    -o "$WORK/stats.safetensors"
  measure "$L" "quantize RTN sweep-mse -> compressed-tensors" "$BIN" quantize "$M" \
    -o "$WORK/out-ct" --method sweep-mse
  measure "$L" "quantize --gptq (8 x 256, all experts, streamed)" "$BIN" quantize "$M" --gptq \
    "${CAL[@]}" --method sweep-mse -o "$WORK/out-gptq"
  rm -rf "$WORK/out-ct" "$WORK/out-gptq" "$WORK/stats.safetensors"
done
python3 - "$ROWS" "$WORK/scale_moe.json" "$L1" "$L2" <<'PY'
import json, sys
rows, (l1, l2) = {}, (int(sys.argv[3]), int(sys.argv[4]))
for line in open(sys.argv[1]):
    layers, step, kb, wall = line.rstrip("\n").split("\t")
    secs = sum(float(p) * 60 ** i for i, p in enumerate(reversed(wall.split(":"))))
    rows.setdefault(step, {})[int(layers)] = {"peak_rss_gb": int(kb) * 1024 / 1e9, "wall_s": secs}
out = []
print(f"| step | RSS {l1} layers | RSS {l2} layers | wall {l1} | wall {l2} | per layer (wall) | "
      f"48 layers (extrapolated) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for step, r in rows.items():
    a, b = r[l1], r[l2]
    per = (b["wall_s"] - a["wall_s"]) / (l2 - l1)
    full = a["wall_s"] + (48 - l1) * per
    rss_per = (b["peak_rss_gb"] - a["peak_rss_gb"]) / (l2 - l1)
    full_rss = a["peak_rss_gb"] + (48 - l1) * rss_per
    out.append({"step": step, "layers": {str(l1): a, str(l2): b}, "per_layer_wall_s": per,
                "extrapolated_48_layers_wall_s": full, "per_layer_rss_gb": rss_per,
                "extrapolated_48_layers_rss_gb": full_rss})
    print(f"| {step} | {a['peak_rss_gb']:.2f} GB | {b['peak_rss_gb']:.2f} GB | {a['wall_s']:.0f} s | "
          f"{b['wall_s']:.0f} s | {per:.0f} s | {full / 60:.0f} min, {full_rss:.1f} GB |")
json.dump({"extrapolated": True, "preset": "qwen3-30b-a3b", "rows": out},
          open(sys.argv[2], "w"), indent=1)
print(f"(48-layer figures extrapolated linearly from the {l1}- and {l2}-layer runs)")
PY
