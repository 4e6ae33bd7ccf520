#!/usr/bin/env python3
"""Throughput of scalesweep.torch.simulate on a GPU (issue 27 item 5), on models of real shapes
with random weights (no full-precision model can be installed here; speed does not depend on the
weights): tokens/s of a prefill forward, dense and under each setting, and the one-time costs
(calibrate with xtx=False, the W quantization).

    python3 bench/torch_sim_gpu.py [--shapes qwen2-1.5b,llama-3.1-8b] [--batch 8] [--seqlen 512]
                                   [--methods absmax,sweep-mse] [--numerics exact]
                                   [--device cuda] [--json FILE]

On the CPU (--device cpu --shapes tiny) it runs the same steps on a small model (a dry run).
"""
import argparse
import json
import time

import torch
import transformers

import scalesweep as ss
import scalesweep.torch as sst

SHAPES = {
    "tiny": ("qwen2", dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)),
    "qwen2-1.5b": ("qwen2", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                 num_attention_heads=12, num_key_value_heads=2,
                                 vocab_size=151936)),
    "llama-3.1-8b": ("llama", dict(hidden_size=4096, intermediate_size=14336,
                                   num_hidden_layers=32, num_attention_heads=32,
                                   num_key_value_heads=8, vocab_size=128256)),
}


def build(shape, device, dtype):
    kind, kw = SHAPES[shape]
    cfg = (transformers.Qwen2Config if kind == "qwen2" else transformers.LlamaConfig)(
        max_position_embeddings=4096, **kw)
    cls = transformers.Qwen2ForCausalLM if kind == "qwen2" else transformers.LlamaForCausalLM
    torch.manual_seed(0)
    with torch.device(device):
        m = cls(cfg)
    return m.to(dtype).eval()


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, reps):
    fn()  # warm-up
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="qwen2-1.5b,llama-3.1-8b")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--methods", default="absmax,sweep-mse")
    ap.add_argument("--settings", default="W,WA,WAKV,WAKVQ")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json")
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    out = {"device": torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu",
           "scalesweep_cuda": bool(ss.CUDA), "torch": torch.__version__,
           "transformers": transformers.__version__, "batch": a.batch, "seqlen": a.seqlen,
           "rows": []}
    for shape in a.shapes.split(","):
        t0 = time.perf_counter()
        m = build(shape, a.device, dtype)
        sync(a.device)
        build_s = time.perf_counter() - t0
        vocab = m.config.vocab_size
        g = torch.Generator(device="cpu").manual_seed(1)
        x = torch.randint(0, vocab, (a.batch, a.seqlen), generator=g).to(a.device)
        calib = [torch.randint(0, vocab, (1, a.seqlen), generator=g).to(a.device)
                 for _ in range(4)]
        t0 = time.perf_counter()
        stats = sst.calibrate(m, calib, xtx=False)
        sync(a.device)
        calib_s = time.perf_counter() - t0

        def fwd():
            with torch.no_grad():
                m(x, use_cache=False)

        dense = timed(fwd, a.device, a.reps)
        toks = a.batch * a.seqlen
        print(f"{shape}: built in {build_s:.1f} s, calibrate (4 x {a.seqlen}, diagonals) "
              f"{calib_s:.2f} s; dense {toks / dense:,.0f} tok/s")
        out["rows"].append({"shape": shape, "setting": "FP", "method": None,
                            "tok_per_s": toks / dense, "calibrate_s": calib_s})
        for meth in a.methods.split(","):
            for s in a.settings.split(","):
                t0 = time.perf_counter()
                h = sst.simulate(m, s, meth, stats=stats, keep_original=True)
                sync(a.device)
                setup = time.perf_counter() - t0
                try:
                    t = timed(fwd, a.device, a.reps)
                finally:
                    h.remove()
                print(f"  {s:6s} {meth:10s} {toks / t:10,.0f} tok/s  x{t / dense:5.2f} of dense"
                      f"  (setup {setup:.2f} s)")
                out["rows"].append({"shape": shape, "setting": s, "method": meth,
                                    "tok_per_s": toks / t, "rel_dense_time": t / dense,
                                    "setup_s": setup})
        del m
        if a.device == "cuda":
            torch.cuda.empty_cache()
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
