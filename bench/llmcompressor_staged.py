#!/usr/bin/env python3
"""llm-compressor's oneshot (W4A16 or W4A4) one range of decoder layers at a time, for a run
that outlasts one sitting: GPTQ + nvfp4_expanded_imatrix on the 1.5B Qwen2 takes about 8 minutes
a layer on 2 cores (its observer's grid search, in Python, dominates), 3.7 hours for 28 layers.

Stage [A, B): the dense model is loaded and the Linears of layers < A are replaced by the
values the previous stage's checkpoint (--base) holds for them, decoded in float32 by
compressed-tensors' own unpacking and dequantization: the weights llm-compressor's sequential
pipeline propagates through once it has quantized them. Then oneshot runs as
bench/llmcompressor_compare.py runs it (same calibration windows, recipe and observer) with
every Linear outside [A, B) ignored, and the checkpoint written holds layers < B quantized: this
stage's own tensors for [A, B) and the base's tensors, byte for byte, for layers < A (the config's
ignore list no longer names them). Quantizing layer i depends only on its weights and its
calibrated inputs, which depend only on layers < i, so the last stage (B = the number of layers)
gives the checkpoint of a single run, up to float rounding in the propagated activations. Each
stage's oneshot time is kept in stages.json beside the checkpoint. W4A4 (--scheme NVFP4) stages
the same way: llm-compressor keeps quantization disabled in the forward passes of its
sequential pipeline (the activations' global scales are observed, not applied), and the base's
input global scales are carried over with its weights.

Usage: .venv-llmc/bin/python bench/llmcompressor_staged.py MODEL_DIR --calib TEXT --layers A:B
       --out DIR [--base DIR] [--algo gptq] [--observer nvfp4_expanded_imatrix]
       (observers: llm-compressor's, scalesweep_mse / scalesweep_wmse, and the experimental
       ss_lp2 / ss_lp24 / ss_lp3 of bench/lp_observer.py)
       [--nsamples 16] [--seqlen 512] [--scheme NVFP4A16|NVFP4]
Then: build/scalesweep ppl DIR --text EVAL ... (or llmcompressor_compare.py --eval-only).
"""
import argparse
import glob
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

LAYER = re.compile(r"\.layers\.(\d+)\.")


def layer_of(name):
    m = LAYER.search(name)
    return int(m.group(1)) if m else None


def read_tensors(ckpt):
    """Every tensor of a safetensors checkpoint (one file or shards) as a dict."""
    from safetensors.torch import load_file
    files = sorted(glob.glob(os.path.join(ckpt, "*.safetensors")))
    if not files:
        sys.exit(f"llmcompressor_staged: no .safetensors file in {ckpt}")
    out = {}
    for f in files:
        out.update(load_file(f))
    return out


def quantized_modules(tensors):
    return sorted(k[:-len(".weight_packed")] for k in tensors if k.endswith(".weight_packed"))


def decode_nvfp4(tensors, name, rows, cols):
    """Module `name`'s NVFP4 weight in float32, by compressed-tensors' unpacking and
    dequantization (the group-16 TENSOR_GROUP scheme of NVFP4A16)."""
    import torch
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    import llmcompressor_blocks as blocks
    codes = unpack_fp4_from_uint8(tensors[name + ".weight_packed"], rows, cols,
                                  dtype=torch.float32)
    scale = tensors[name + ".weight_scale"].to(torch.float32)
    gs = tensors[name + ".weight_global_scale"].to(torch.float32)
    w = dequantize(codes, scale, args=blocks.nvfp4_weight_args(), dtype=torch.float32,
                   global_scale=gs)
    # The same values by the format's formula, as a check of the call above.
    ref = (codes.reshape(rows, cols // 16, 16) * (scale / gs).unsqueeze(-1)).reshape(rows, cols)
    if not torch.allclose(w, ref, rtol=1e-6, atol=0):
        sys.exit(f"llmcompressor_staged: {name}: compressed-tensors' dequantization differs "
                 "from code * scale / global_scale")
    return w


def make_prepare(base, lo, hi):
    """The prepare hook of run_oneshot: base's quantized layers (exactly the layers < lo) loaded
    as float32, and every Linear outside [lo, hi) ignored."""
    def prepare(model):
        import torch
        linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
                   and layer_of(n) is not None}
        n_layers = model.config.num_hidden_layers
        if not 0 <= lo < hi <= n_layers:
            sys.exit(f"llmcompressor_staged: --layers {lo}:{hi} is not a range in "
                     f"[0, {n_layers}]")
        want = sorted(n for n, m in linears.items() if layer_of(n) < lo
                      and m.in_features % 16 == 0)
        if base:
            tensors = read_tensors(base)
            have = quantized_modules(tensors)
            if have != want:
                extra = sorted(set(have) ^ set(want))[:3]
                sys.exit(f"llmcompressor_staged: --base {base} quantizes {len(have)} Linears, "
                         f"layers < {lo} have {len(want)} (first difference: {extra})")
            with torch.no_grad():
                for n in have:
                    m = linears[n]
                    m.weight.copy_(decode_nvfp4(tensors, n, m.out_features, m.in_features))
            del tensors
        elif lo != 0:
            sys.exit(f"llmcompressor_staged: --layers {lo}:{hi} starts after layer 0; give the "
                     f"checkpoint of layers < {lo} as --base")
        return [n for n in linears if not lo <= layer_of(n) < hi]
    return prepare


def stitch(out, base):
    """Puts base's quantized tensors in place of the dense weights the stage wrote for them and
    drops their names from the config's ignore list."""
    from safetensors.torch import save_file
    tensors = read_tensors(out)
    moved = []
    if base:
        btensors = read_tensors(base)
        for n in quantized_modules(btensors):
            del tensors[n + ".weight"]
            for k, v in btensors.items():
                if k.startswith(n + "."):
                    tensors[k] = v
            moved.append(n)
    for f in glob.glob(os.path.join(out, "*.safetensors")) + \
            glob.glob(os.path.join(out, "*.safetensors.index.json")):
        os.remove(f)
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    cfg_path = os.path.join(out, "config.json")
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    qc = cfg["quantization_config"]
    qc["ignore"] = [n for n in qc.get("ignore", []) if n not in set(moved)]
    with open(cfg_path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
    return quantized_modules(tensors)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--calib", required=True)
    ap.add_argument("--layers", required=True, help="A:B, the decoder layers of this stage")
    ap.add_argument("--out", required=True)
    ap.add_argument("--base", help="the checkpoint of the stage that ended at layer A")
    ap.add_argument("--algo", default="gptq", choices=["rtn", "gptq"])
    ap.add_argument("--observer", default="nvfp4_expanded_imatrix")
    ap.add_argument("--nsamples", type=int, default=16)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--scheme", default="NVFP4A16", choices=["NVFP4A16", "NVFP4"])
    a = ap.parse_args()
    try:
        lo, hi = (int(x) for x in a.layers.split(":"))
    except ValueError:
        sys.exit(f"llmcompressor_staged: --layers '{a.layers}': expected A:B")
    if os.path.exists(a.out):
        sys.exit(f"llmcompressor_staged: --out {a.out} exists; give a new directory")
    stages = []
    if a.base:
        with open(os.path.join(a.base, "stages.json"), encoding="utf-8") as f:
            prev = json.load(f)
        # (stages.json without "scheme": written before W4A4 staging existed, all W4A16)
        if prev.get("scheme", "NVFP4A16") != a.scheme:
            sys.exit(f"llmcompressor_staged: --base {a.base} is not --scheme {a.scheme}")
        for k in ("calib", "algo", "observer", "nsamples", "seqlen"):
            if prev[k] != getattr(a, k):
                sys.exit(f"llmcompressor_staged: --base {a.base} was made with --{k} "
                         f"{prev[k]}, this stage has {getattr(a, k)}")
        stages = prev["stages"]
    from llmcompressor_compare import run_oneshot
    if a.observer.startswith("ss_lp"):
        import lp_observer  # noqa: F401  (registers the experimental L^p observers)
    t0 = time.time()
    res = run_oneshot(a.model_dir, a.algo, a.observer, a.out, a.calib, a.nsamples, a.seqlen,
                      a.scheme, prepare=make_prepare(a.base, lo, hi))
    done = stitch(a.out, a.base)
    stages.append({"layers": [lo, hi], "oneshot_s": res["oneshot_s"],
                   "process_s": time.time() - t0})
    summary = {"model": a.model_dir, "scheme": a.scheme, "calib": a.calib, "algo": a.algo,
               "observer": a.observer,
               "nsamples": a.nsamples, "seqlen": a.seqlen, "quantized_linears": len(done),
               "stages": stages, "oneshot_s": sum(s["oneshot_s"] for s in stages)}
    with open(os.path.join(a.out, "stages.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
