#!/usr/bin/env python3
"""Tests the hypothesis "ScaleSweep-MSE does not beat AbsMax on SmolLM2-135M because its weights
lie on llama.cpp's Q4_1 grid".

The fixture's Linear weights are Q4_1: in each 32-element block of a row they take at most 16
values d*q + m (q = 0..15). A 16-element NVFP4 block of such a row then holds a uniform grid of
values, which may favour AbsMax's scale. The test removes the grid and changes nothing else:

  1. `scalesweep convert` dequantizes the GGUF into an fp32 Hugging Face directory (on-grid);
  2. a copy gets uniform dither U(-a*d, a*d) added to every Linear weight, d being the Q4_1
     step of its 32-block ((max - min) / 15): a = 0.5 (--dither) moves each value anywhere
     within its grid cell, a smaller a keeps the model closer to the original while no value
     stays on the grid (off-grid); norms and embeddings are untouched;
  3. for both: weight-level relative MSE of absmax / 4over6 / sweep-mse over all
     Linears (python module), and `scalesweep experiment --settings W --no-gptq` NLL for
     absmax, 4over6, sweep-mse, sweep-wmse on the same calibration and evaluation text.

If sweep-mse beats absmax in NLL off-grid but not on-grid, the grid is the cause; if the
ranking is the same on both, it is not. Prints a table (and --json).

Usage: bench/q41_grid_hypothesis.py [--gguf G] [--calib C] [--eval E] [--max-tokens N]
       [--workdir DIR] [--json]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "build", "python"))

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def run(*args):
    p = subprocess.run(list(args), capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({p.returncode}):\n{p.stderr}")
    return p.stdout


def dither(w, rng, amp):
    """U(-amp*d, amp*d) per 32-block of each row, d = (max - min) / 15 of the block."""
    n, k = w.shape
    assert k % 32 == 0
    b = w.reshape(n, k // 32, 32).astype(np.float64)
    d = (b.max(-1, keepdims=True) - b.min(-1, keepdims=True)) / 15.0
    noise = rng.uniform(-amp, amp, size=b.shape) * d
    return (b + noise).reshape(n, k).astype(np.float32)


def grid_fraction(w):
    """Fraction of 32-blocks whose values all lie on a 16-level uniform grid (Q4_1)."""
    n, k = w.shape
    b = w.reshape(n, k // 32, 32).astype(np.float64)
    lo, hi = b.min(-1, keepdims=True), b.max(-1, keepdims=True)
    d = np.where(hi > lo, (hi - lo) / 15.0, 1.0)
    q = (b - lo) / d
    return float(np.mean(np.all(np.abs(q - np.round(q)) < 1e-3, axis=-1)))


def weight_mse(tensors, ss):
    out = {}
    num = {m: 0.0 for m in ("absmax", "4over6", "sweep-mse")}
    den = 0.0
    for name, w in tensors.items():
        if not name.endswith(".weight") or not any(s in name for s in LINEARS):
            continue
        den += float(np.sum(w.astype(np.float64) ** 2))
        for m in num:
            xh = ss.fake_quantize(np.ascontiguousarray(w), method=m)
            num[m] += float(np.sum((xh.astype(np.float64) - w) ** 2))
    for m in num:
        out[m] = num[m] / den
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=os.path.join(
        ROOT, "models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--calib", required=True, help="calibration text")
    ap.add_argument("--eval", required=True, help="held-out evaluation text")
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--nsamples", type=int, default=32)
    ap.add_argument("--workdir", default=os.path.join(ROOT, "build", "q41_grid"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "scalesweep"))
    ap.add_argument("--dither", type=float, default=0.5,
                    help="dither amplitude in Q4_1 steps (0.5: anywhere in the grid cell)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    import scalesweep as ss
    from safetensors.numpy import load_file, save_file

    os.makedirs(a.workdir, exist_ok=True)
    on = os.path.join(a.workdir, "on-grid")
    off = os.path.join(a.workdir, "off-grid")
    for d in (on, off):
        shutil.rmtree(d, ignore_errors=True)
    run(a.bin, "convert", a.gguf, "-o", on)
    t_on = load_file(os.path.join(on, "model.safetensors"))
    rng = np.random.default_rng(0)
    t_off = {k: (dither(v, rng, a.dither) if k.endswith(".weight") and any(s in k for s in LINEARS) else v)
             for k, v in t_on.items()}
    shutil.copytree(on, off)
    save_file(t_off, os.path.join(off, "model.safetensors"))

    res = {}
    for label, d, t in (("on-grid", on, t_on), ("off-grid", off, t_off)):
        lin = [v for k, v in t.items() if k.endswith(".weight") and any(s in k for s in LINEARS)]
        t0 = time.time()
        out = json.loads(run(a.bin, "experiment", d, "--calib", a.calib, "--eval", a.eval,
                             "--nsamples", str(a.nsamples), "--seqlen", "512",
                             "--max-tokens", str(a.max_tokens), "--ctx", "1024",
                             "--settings", "W", "--no-gptq", "--no-errors", "--json"))
        res[label] = {
            "q41_grid_blocks": float(np.mean([grid_fraction(w) for w in lin])),
            "weight_rel_mse": weight_mse(t, ss),
            "fp_nll": out["fp"]["nll_per_token"],
            "nll": {c["method"]: c["nll_per_token"] for c in out["cells"]},
            "seconds": time.time() - t0,
        }
    if a.json:
        print(json.dumps(res, indent=1))
        return
    meths = list(res["on-grid"]["nll"])
    print("| weights | on Q4_1 grid | FP NLL | " + " | ".join(f"RTN W {m}" for m in meths)
          + " | sweep-mse - absmax | rel. weight MSE absmax / sweep-mse |")
    print("|---" * (5 + len(meths)) + "|")
    for label, r in res.items():
        n = r["nll"]
        wm = r["weight_rel_mse"]
        print(f"| {label} | {100 * r['q41_grid_blocks']:.1f}% | {r['fp_nll']:.4f} | "
              + " | ".join(f"{n[m]:.4f}" for m in meths)
              + f" | {n['sweep-mse'] - n['absmax']:+.4f} | "
              f"{wm['absmax']:.3e} / {wm['sweep-mse']:.3e} |")


if __name__ == "__main__":
    main()
