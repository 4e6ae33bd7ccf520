#!/usr/bin/env bash
# Peak resident memory and wall time of every command that reads a GGUF, on any GGUF (the issue
# "memory bounded for every source": a GGUF evaluated, converted and quantized within a few
# times its file size). Each command runs once under /usr/bin/time -v ("Maximum resident set
# size", "Elapsed (wall clock)"); prints a markdown table and writes WORKDIR/gguf_memory.json.
#
#   bench/gguf_memory.sh MODEL.gguf [BIN] [WORKDIR] [--only a,b,...]
#
# BIN default build/scalesweep, WORKDIR default /tmp/scalesweep-gguf-memory (outputs are removed
# once measured unless SS_MEM_KEEP=1; an 8B file needs ~20 GB there for the bf16 HF directory
# and one NVFP4 checkpoint at a time). Text: WikiText-2 validation split as
# bench/real_model_results.sh splits it (calibration: the first half, evaluation: the disjoint
# second half). The steps (names for --only), in the order they run:
#   generate       generate -n 16 --temperature 0 (greedy)
#   ppl            ppl, 2,048 tokens, ctx 512, fp32
#   ppl-bf16       the same with --compute bf16
#   quantize-ct    quantize RTN (sweep-mse) -> compressed-tensors directory
#   quantize-gguf  quantize RTN (sweep-mse) -> NVFP4 OUT.gguf
#   calibrate      calibrate, 16 x 512 tokens -> stats.safetensors
#   gptq           quantize --gptq, 16 x 512 calibration -> compressed-tensors directory
#   ppl-nvfp4      ppl (as `ppl`) on the GPTQ checkpoint (needs gptq)
#   convert        convert -> Hugging Face directory (--dtype bf16)
#   gptq-hf        quantize --gptq from that directory (streamed; needs convert)
# A failing command is reported as "failed (exit N)" (its log: WORKDIR/logs/STEP.log) and the
# next one runs; a step whose input is absent is "skipped". Overrides (a quick plumbing run on a
# small model: SS_MEM_TOKENS=128 SS_MEM_CTX=64 SS_MEM_NSAMPLES=2 SS_MEM_SEQLEN=64):
#   SS_MEM_TOKENS (2048), SS_MEM_CTX (512), SS_MEM_NSAMPLES (16), SS_MEM_SEQLEN (512),
#   SS_MEM_GEN_TOKENS (16), SS_MEM_METHOD (sweep-mse), SS_MEM_CONVERT_DTYPE (bf16),
#   SS_SHARED_DATA_DIR (../shared/data), SS_MEM_KEEP (0).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ONLY=""
POS=()
while [ $# -gt 0 ]; do
  case $1 in
    --only) ONLY=${2:?--only needs a list}; shift 2 ;;
    --only=*) ONLY=${1#--only=}; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) POS+=("$1"); shift ;;
  esac
done
[ ${#POS[@]} -ge 1 ] || {
  echo "usage: bench/gguf_memory.sh MODEL.gguf [BIN] [WORKDIR] [--only a,b]" >&2
  exit 2
}
MODEL=$(realpath "${POS[0]}")
BIN=${POS[1]:-$ROOT/build/scalesweep}
WORK=${POS[2]:-/tmp/scalesweep-gguf-memory}
DATA=${SS_SHARED_DATA_DIR:-$ROOT/../shared/data}
WIKI=$DATA/text/wikitext2_valid.txt
TOKENS=${SS_MEM_TOKENS:-2048}
CTX=${SS_MEM_CTX:-512}
NSAMPLES=${SS_MEM_NSAMPLES:-16}
SEQLEN=${SS_MEM_SEQLEN:-512}
GEN=${SS_MEM_GEN_TOKENS:-16}
METHOD=${SS_MEM_METHOD:-sweep-mse}
CDTYPE=${SS_MEM_CONVERT_DTYPE:-bf16}
STEPS="generate ppl ppl-bf16 quantize-ct quantize-gguf calibrate gptq ppl-nvfp4 convert gptq-hf"
for s in ${ONLY//,/ }; do
  case " $STEPS " in
    *" $s "*) ;;
    *) echo "gguf_memory: unknown step '$s' (steps: $STEPS)" >&2; exit 2 ;;
  esac
done
for f in "$MODEL" "$BIN" "$WIKI" /usr/bin/time; do
  [ -e "$f" ] ||
    { echo "gguf_memory: $f absent (the model, a built BIN, ../shared/data, GNU time)" >&2; exit 1; }
done
mkdir -p "$WORK/logs"
WORK=$(realpath "$WORK")
python3 "$ROOT/bench/split_wikitext.py" "$WIKI" "$WORK"
CALIB=$WORK/calib.txt
EVAL=$WORK/eval.txt
ROWS=$WORK/rows.tsv
: >"$ROWS"
FILE_BYTES=$(stat -L -c %s "$MODEL")
echo "gguf_memory: $MODEL ($FILE_BYTES bytes), $BIN, work $WORK" >&2

selected() { [ -z "$ONLY" ] || case ",$ONLY," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
keep() { [ "${SS_MEM_KEEP:-0}" = 1 ]; }
row() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$ROWS"; }  # step, status, kb, wall, command

measure() {  # step, command... ; runs it unless deselected
  local step=$1 log rc kb wall cmd
  shift
  selected "$step" || return 0
  log=$WORK/logs/$step.log
  cmd=$(printf '%q ' "$@")
  echo "gguf_memory: $step: $cmd" >&2
  /usr/bin/time -v "$@" >"$log.out" 2>"$log"
  rc=$?
  kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$log")
  if [ "$rc" -ne 0 ]; then
    echo "gguf_memory: $step failed (exit $rc); the end of $log:" >&2
    grep -v -e '^\s' -e '^Command' "$log" | tail -5 >&2
  fi
  row "$step" "$rc" "${kb:-0}" "${wall:-?}" "${cmd% }"
}
skip() { selected "$1" && row "$1" "skipped ($2)" 0 "-" ""; return 0; }

PPL=(--text "$EVAL" --ctx "$CTX" --max-tokens "$TOKENS")
CAL=(--calib "$CALIB" --nsamples "$NSAMPLES" --seqlen "$SEQLEN")
rm -rf "$WORK/q-ct" "$WORK/q.gguf" "$WORK/stats.safetensors" "$WORK/q-gptq" "$WORK/hf" "$WORK/q-gptq-hf"

measure generate "$BIN" generate "$MODEL" --prompt "The history of the city" -n "$GEN" --temperature 0
measure ppl "$BIN" ppl "$MODEL" "${PPL[@]}"
measure ppl-bf16 "$BIN" ppl "$MODEL" "${PPL[@]}" --compute bf16
measure quantize-ct "$BIN" quantize "$MODEL" -o "$WORK/q-ct" --method "$METHOD"
keep || rm -rf "$WORK/q-ct"
measure quantize-gguf "$BIN" quantize "$MODEL" -o "$WORK/q.gguf" --method "$METHOD"
keep || rm -f "$WORK/q.gguf"
measure calibrate "$BIN" calibrate "$MODEL" "${CAL[@]}" -o "$WORK/stats.safetensors"
keep || rm -f "$WORK/stats.safetensors"
measure gptq "$BIN" quantize "$MODEL" --gptq "${CAL[@]}" --method "$METHOD" -o "$WORK/q-gptq"
if [ -d "$WORK/q-gptq" ]; then
  measure ppl-nvfp4 "$BIN" ppl "$WORK/q-gptq" "${PPL[@]}"
else
  skip ppl-nvfp4 "no GPTQ checkpoint: gptq did not run or failed"
fi
keep || rm -rf "$WORK/q-gptq"
measure convert "$BIN" convert "$MODEL" -o "$WORK/hf" --dtype "$CDTYPE"
if [ -d "$WORK/hf" ]; then
  measure gptq-hf "$BIN" quantize "$WORK/hf" --gptq "${CAL[@]}" --method "$METHOD" \
    -o "$WORK/q-gptq-hf"
else
  skip gptq-hf "no HF directory: convert did not run or failed"
fi
keep || rm -rf "$WORK/hf" "$WORK/q-gptq-hf"

python3 - "$ROWS" "$WORK/gguf_memory.json" "$MODEL" "$FILE_BYTES" "$BIN" <<'PY'
import json, sys
rows_path, out, model, file_bytes, binary = sys.argv[1:]
file_bytes = int(file_bytes)
labels = {
    "generate": "generate", "ppl": "ppl (fp32)", "ppl-bf16": "ppl --compute bf16",
    "quantize-ct": "quantize RTN -> compressed-tensors",
    "quantize-gguf": "quantize RTN -> NVFP4 GGUF",
    "calibrate": "calibrate", "gptq": "quantize --gptq (GGUF source)",
    "ppl-nvfp4": "ppl on the NVFP4 GPTQ checkpoint", "convert": "convert -> HF directory",
    "gptq-hf": "quantize --gptq (converted HF directory)",
}
rows = []
for line in open(rows_path, encoding="utf-8"):
    step, status, kb, wall, cmd = line.rstrip("\n").split("\t")
    secs = None
    if wall not in ("?", "-"):
        secs = sum(float(p) * 60 ** i for i, p in enumerate(reversed(wall.split(":"))))
    ok = status == "0"
    rows.append({"step": step, "command": cmd, "ok": ok,
                 "status": "ok" if ok else (status if status.startswith("skipped")
                                            else f"failed (exit {status})"),
                 "peak_rss_mb": int(kb) / 1024 if kb != "0" else None,
                 "rss_over_file": int(kb) * 1024 / file_bytes if kb != "0" else None,
                 "wall": wall, "wall_s": secs})
json.dump({"model": model, "file_bytes": file_bytes, "bin": binary, "rows": rows},
          open(out, "w"), indent=1)
print(f"{model}: {file_bytes / 1e6:.0f} MB file")
print()
print("| command | peak RSS (MB) | wall |")
print("|---|---|---|")
for r in rows:
    rss = f"{r['peak_rss_mb']:.0f}" if r["ok"] else r["status"]
    print(f"| {labels.get(r['step'], r['step'])} | {rss} | {r['wall']} |")
print()
print(f"(JSON with the command lines and RSS / file size: {out})")
PY
