#!/usr/bin/env python3
"""Ledoit-Wolf shrinkage intensity of the GPTQ Hessians of a Hugging Face model: is the
calibration's Hessian estimate noisy enough to want more damping than GPTQ's 1 %?

For each Linear input of the chosen layers (q/k/v's, o's, gate/up's, down's), over the
calibration windows of bench/llmcompressor_blocks.py's calibration_ids (= scalesweep's
`--calib-windows spread` without BOS), with S = (1/n) sum x x^T of the n token rows:
  mu = tr(S)/d,  delta^2 = ||S - mu I||_F^2 / d,
  beta^2 = min(delta^2, (sum_t ||x_t||^4 - n ||S||_F^2) / (n^2 d)),  alpha = beta^2 / delta^2.
Ledoit and Wolf's estimator alpha mu I + (1 - alpha) S is, up to a scale GPTQ ignores, S damped
by alpha / (1 - alpha) times its mean diagonal: the same form as GPTQ's relative damping
(`--damp`, 0.01). Prints alpha, that equivalent damping, the smallest eigenvalue of S
relative to mu and the number of eigenvalues below 1e-3 mu (how rank-deficient the estimate
is). Tokens of one window are not independent,
so alpha is a lower bound of what an i.i.d. sample of the same size would give.

  .venv-llmc/bin/python bench/hessian_shrinkage.py MODEL_DIR --calib TEXT --nsamples 16 \
      --seqlen 512 --layers 0,13,27
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llmcompressor_blocks as blocks  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--calib", required=True)
    ap.add_argument("--nsamples", type=int, default=16)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--layers", default="0", help="comma-separated decoder layer indices")
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(a.model_dir)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32)
    ids = blocks.calibration_ids(tok, a.calib, a.nsamples, a.seqlen)
    acc = {}

    def hook(name):
        def f(mod, inp):
            x = inp[0].reshape(-1, inp[0].shape[-1]).double()
            rec = acc.setdefault(name, [0, 0.0, None])
            rec[0] += x.shape[0]
            rec[1] += float((x.pow(2).sum(1) ** 2).sum())
            rec[2] = x.T @ x if rec[2] is None else rec[2] + x.T @ x
        return f

    for li in (int(v) for v in a.layers.split(",")):
        L = model.model.layers[li]
        for nm, m in [("qkv", L.self_attn.q_proj), ("o", L.self_attn.o_proj),
                      ("gate_up", L.mlp.gate_proj), ("down", L.mlp.down_proj)]:
            m.register_forward_pre_hook(hook(f"layer {li} {nm}"))
    with torch.no_grad():
        for s in ids:
            model(torch.tensor([s]))
    print(f"{'input':18s} {'n':>6s} {'d':>6s} {'alpha':>8s} {'damp':>8s} {'eig_min/mu':>11s} "
          f"{'eig<1e-3mu':>10s}")
    for k, (n, s4, xx) in acc.items():
        d = xx.shape[0]
        S = xx / n
        mu = float(torch.trace(S)) / d
        fro2 = float((S * S).sum())
        delta2 = (fro2 - 2 * mu * float(torch.trace(S)) + mu * mu * d) / d
        beta2 = min((s4 - n * fro2) / (n * n * d), delta2)
        alpha = beta2 / delta2
        ev = torch.linalg.eigvalsh(S)
        small = int((ev < 1e-3 * mu).sum())
        print(f"{k:18s} {n:6d} {d:6d} {alpha:8.4f} {alpha / (1 - alpha):8.4f} "
              f"{float(ev[0]) / mu:11.2e} {small:10d}")


if __name__ == "__main__":
    main()
