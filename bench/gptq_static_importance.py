#!/usr/bin/env python3
"""GPTQ's layer loss tr(D H D^T) of one Linear with static NVFP4 block scales chosen by different
block objectives: the question behind issue 25's comparison of static and dynamic scales.

For one Linear of a Hugging Face model (dense, float32) the script
  1. accumulates H = 2/n sum x x^T of its input over llm-compressor's calibration windows
     (`llmcompressor_blocks.calibration_ids`: the same tokens as `--calib-windows spread`), running
     the model only up to that layer (earlier layers dense, not quantized);
  2. chooses the static E4M3 block scales (global scale 256 * 6 / amax, scalesweep's rule) by the
     importance-weighted L^p block error of `lp_observer.lp_block_scales` (p = 2: sweep-wmse's
     objective) with three importances: none (mse), H_jj ("hdiag", what static GPTQ uses) and the
     OBS weight 1 / U_jj^2 of GPTQ's own loss (gptq.h's derivation: U = chol(H_p^-1)^T in the
     activation order), each for p = 2 and 2.4;
  3. runs GPTQ (damping 1 % of mean diag H, descending-diag order, lazy blocks of 128, codes by
     round to nearest at the fixed scales: llm-compressor's and scalesweep's static GPTQ) and
     prints tr(D H D^T) of its result and of round to nearest with the same scales;
  4. with --heldout TEXT, also tr(D H' D^T) with H' the input Hessian of windows of that text
     (the same count and length): whether a lower loss on the calibration Hessian is a lower
     loss on other text, or fits the calibration set.

Usage: .venv-llmc/bin/python bench/gptq_static_importance.py MODEL_DIR --calib TEXT
       --linear model.layers.26.mlp.down_proj [--nsamples 16] [--seqlen 512] [--heldout TEXT]
       [--below 8]
Vectorised torch on the CPU; GPTQ's column loop in Python (a minute per candidate for an
8,960-column down_proj on 2 cores).
"""
import argparse
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


class _Stop(Exception):
    pass


def load_cut(model_dir, linear):
    """The tokenizer, the model cut after `linear`'s decoder layer, and the Linear."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    m = re.search(r"\.layers\.(\d+)\.", linear)
    if not m:
        sys.exit(f"gptq_static_importance: --linear {linear} names no decoder layer")
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 num_hidden_layers=int(m.group(1)) + 1)
    try:
        mod = model.get_submodule(linear)
    except AttributeError:
        sys.exit(f"gptq_static_importance: {model_dir} has no module {linear}")
    return tok, model, mod


def input_hessian(tok, model, mod, text, nsamples, seqlen):
    """H = 2/n sum x x^T (float64) of the Linear `mod`'s input over the windows of `text`."""
    import torch
    import llmcompressor_blocks as blocks
    ids = blocks.calibration_ids(tok, text, nsamples, seqlen)
    acc = {"h": 0, "n": 0}

    def hook(_, args):
        x = args[0].reshape(-1, args[0].shape[-1]).double()
        acc["h"] = acc["h"] + x.T @ x
        acc["n"] += x.shape[0]
        raise _Stop()

    handle = mod.register_forward_pre_hook(hook)
    with torch.no_grad():
        for x in ids:
            try:
                model(torch.tensor([x]))
            except _Stop:
                pass
    handle.remove()
    return acc["h"] * (2.0 / acc["n"])


def factor(h, damp=0.01):
    """Activation order, dead columns, U = chol(H_p^-1)^T of the damped, permuted H."""
    import torch
    h = h.clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    perm = torch.argsort(torch.diag(h), descending=True, stable=True)
    hp = h[perm][:, perm]
    hp += damp * torch.mean(torch.diag(hp)) * torch.eye(hp.shape[0], dtype=hp.dtype)
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(hp)), upper=True)
    return perm, u, dead


def rtn(w, s):
    """Round to nearest at the decoded scales s (elementwise), lp_observer's E2M1 rounding."""
    import torch
    import lp_observer
    return lp_observer.e2m1_round(w / s) * torch.sign(w) * s


def gptq(w, perm, u, scales, block=128):
    """GPTQ with fixed decoded block scales [rows, cols/16]; returns the quantized weight."""
    import torch
    w = w.double()[:, perm].clone()
    sc = scales.repeat_interleave(16, 1)[:, perm].double()
    q = torch.zeros_like(w)
    cols = w.shape[1]
    for i1 in range(0, cols, block):
        i2 = min(i1 + block, cols)
        w1 = w[:, i1:i2].clone()
        err = torch.zeros_like(w1)
        ub = u[i1:i2, i1:i2]
        for i in range(i2 - i1):
            qi = rtn(w1[:, i], sc[:, i1 + i])
            q[:, i1 + i] = qi
            e = (w1[:, i] - qi) / ub[i, i]
            w1[:, i:] -= e.unsqueeze(1) * ub[i, i:].unsqueeze(0)
            err[:, i] = e
        w[:, i2:] -= err @ u[i1:i2, i2:]
    return q[:, torch.argsort(perm)]


def layer_loss(w, h, q):
    import torch
    d = w.double() - q
    return float(torch.einsum("ij,jk,ik->", d, h, d))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--calib", required=True)
    ap.add_argument("--linear", required=True, help="e.g. model.layers.26.mlp.down_proj")
    ap.add_argument("--nsamples", type=int, default=16)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--heldout", help="text whose windows give a second, held-out Hessian")
    ap.add_argument("--below", type=int, default=8,
                    help="candidates from this many E4M3 codes below the AbsMax scale (8: "
                    "sweep-wmse's window) to 8 above")
    a = ap.parse_args()
    import torch
    import lp_observer
    import scalesweep as ss
    tok, model, mod = load_cut(a.model_dir, a.linear)
    h = input_hessian(tok, model, mod, a.calib, a.nsamples, a.seqlen)
    hh = input_hessian(tok, model, mod, a.heldout, a.nsamples, a.seqlen) if a.heldout else None
    w = mod.weight.detach().float().clone()
    del model
    if w.shape[1] % 16:
        sys.exit(f"gptq_static_importance: {a.linear} has {w.shape[1]} inputs, not a multiple "
                 "of 16")
    d = torch.diag(h)
    print(f"{a.linear} [{w.shape[0]} x {w.shape[1]}]: diag H median {d.median():.3g}, max "
          f"{d.max():.3g} (input {int(d.argmax())})", flush=True)
    perm, u, dead = factor(h)
    w[:, dead] = 0
    obs = torch.empty(w.shape[1], dtype=torch.float64)
    obs[perm] = 1 / torch.diag(u) ** 2
    gs = ss.global_scale_for_amax(float(w.abs().max()), 256.0)
    head = f"{'importance':10s} {'p':>4s} {'GPTQ loss':>12s} {'RTN loss':>12s}"
    if hh is not None:
        head += f" {'GPTQ held-out':>14s} {'RTN held-out':>13s}"
    print(head, flush=True)
    for name, imp in (("mse", None), ("hdiag", d.float()), ("obs", obs.float())):
        for p in (2.0, 2.4):
            s = lp_observer.lp_block_scales(w, gs, imp, p, lo=a.below).double() / gs
            t = time.time()
            q = gptq(w, perm, u, s)
            lg = layer_loss(w, h, q)
            r = rtn(w.double(), s.repeat_interleave(16, 1))
            row = f"{name:10s} {p:4.1f} {lg:12.4g} {layer_loss(w, h, r):12.4g}"
            if hh is not None:
                row += f" {layer_loss(w, hh, q):14.4g} {layer_loss(w, hh, r):13.4g}"
            print(f"{row}   ({time.time() - t:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
