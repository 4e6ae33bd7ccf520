#!/usr/bin/env bash
# The real-model table of docs/PERF.md section 7: SmolLM2-135M-Instruct (Q4_1 GGUF fixture, scripts/get-models.sh)
# calibrated on the first half of WikiText-2 validation and evaluated on the disjoint second
# half (split at the first article heading past the middle line), FP and
# {RTN, GPTQ} x {absmax, 4over6, sweep-mse, sweep-wmse} x {W, WA, WAKV, WAKVQ}.
# Usage: bench/real_model_results.sh [extra experiment args]   (about 25 min on 2 idle cores)
# Writes build/real_model/{calib,eval}.txt, results.json and prints a markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
G=${MODEL:-models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf}
W=../shared/data/text/wikitext2_valid.txt
OUT=build/real_model
[ -f "$G" ] || { echo "real_model_results: $G absent (run scripts/get-models.sh)" >&2; exit 1; }
[ -f "$W" ] || { echo "real_model_results: $W absent (../shared/data)" >&2; exit 1; }
mkdir -p "$OUT"
python3 "$(dirname "$0")/split_wikitext.py" "$W" "$OUT"
build/scalesweep experiment "$G" --calib "$OUT/calib.txt" --eval "$OUT/eval.txt" --nsamples 32 \
  --seqlen 512 --max-tokens 8192 --ctx 1024 --settings W,WA,WAKV,WAKVQ --no-errors --json "$@" \
  > "$OUT/results.json.tmp"
mv "$OUT/results.json.tmp" "$OUT/results.json"
python3 - "$OUT/results.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
meths = ["absmax", "4over6", "sweep-mse", "sweep-wmse"]
print(f"FP NLL {d['fp']['nll_per_token']:.4f} nats/token over {d['eval_tokens']} tokens")
print("| algo | setting | " + " | ".join(meths) + " |")
print("|---|---|" + "---|" * len(meths))
for algo in ("RTN", "GPTQ"):
    for s in ("W", "WA", "WAKV", "WAKVQ"):
        cell = {c["method"]: c for c in d["cells"] if c["algo"] == algo and c["setting"] == s}
        if not cell:
            continue
        best = min(cell[m]["nll_per_token"] for m in meths if m in cell)
        row = []
        for m in meths:
            c = cell.get(m)
            if c is None:
                row.append("-")
                continue
            t = f"{c['nll_per_token']:.4f} ({c['recovery']:.2f}%)"
            row.append(f"**{t}**" if c["nll_per_token"] == best else t)
        print(f"| {algo} | {s} | " + " | ".join(row) + " |")
PYEOF
