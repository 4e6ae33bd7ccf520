#!/usr/bin/env python3
"""Block by block, at the same global scale: scalesweep's observers against llm-compressor's
own NVFP4 searches (run with .venv-llmc/bin/python; scripts/get-llmcompressor.sh makes it).

For every Linear of a Hugging Face model (lm_head and Linears whose K is not a multiple of 16
excepted: NVFP4 cannot hold them) the weight W goes through

  - llm-compressor's `nvfp4_expanded_mse` observer (112 range factors 1.8x..0.8x of each
    group's AbsMax; the scale it keeps is that range / 6 * gs rounded to FP8 E4M3) and our
    `scalesweep_mse` at the global scale gs that theirs returned;
  - `nvfp4_expanded_imatrix` (the same range search weighted by the imatrix E[x^2]) and our
    `scalesweep_wmse` with the same importance, at its global scale.

The importance is llm-compressor's own: each Linear's imatrix hook (IMatrixMSEObserver.attach)
accumulates E[x^2] over a calibration pass of the dense model (--calib text, never the
evaluation text); both weighted observers read the same sums.

Losses are recomputed here in float64 from the chosen scales, the same way for both: codes =
E2M1 nearest of w * gs / s (ties cannot change a loss), loss = sum (w - code * s / gs)^2
(weighted: each column times its importance). Ours is optimal over FP8 scales for these
losses, so "above" must be 0 (a block above by less than 1e-6 relative, a float32 near-tie in
our kernel, is counted apart as "tie"); "lower" counts the blocks where ours is strictly
lower. Their search minimises |err|^2.4 (their default norm), not the squared error reported
here. Observer times (d): each observer's call on W plus get_qparams, per Linear, summed.

Usage: .venv-llmc/bin/python bench/llmcompressor_blocks.py MODEL_DIR --calib TEXT
       [--nsamples 16] [--seqlen 256] [--layers 0,15,29] [--json]
"""
import argparse
import contextlib
import copy
import json
import os
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def import_observers():
    """scalesweep.llmcompressor (registers the observers): from the package when it is
    installed, otherwise from this checkout's python/scalesweep/llmcompressor.py."""
    try:
        import scalesweep.llmcompressor as m  # noqa: F401
        return m
    except ImportError:
        import importlib.util
        name = "scalesweep_llmcompressor"  # once per process: it registers the observers
        if name in sys.modules:
            return sys.modules[name]
        path = os.path.join(ROOT, "python", "scalesweep", "llmcompressor.py")
        spec = importlib.util.spec_from_file_location(name, path)
        m = importlib.util.module_from_spec(spec)
        sys.modules[name] = m
        spec.loader.exec_module(m)
        return m


def nvfp4_weight_args():
    from compressed_tensors.quantization import preset_name_to_scheme
    return preset_name_to_scheme("NVFP4A16", ["Linear"]).weights


def calibration_ids(tokenizer, text_path, nsamples, seqlen):
    """nsamples windows of seqlen tokens spread evenly over the text (deterministic)."""
    with open(text_path, encoding="utf-8") as f:
        ids = tokenizer(f.read(), add_special_tokens=False)["input_ids"]
    if len(ids) < seqlen:
        raise ValueError(f"{text_path}: {len(ids)} tokens, fewer than --seqlen {seqlen}")
    step = max(1, (len(ids) - seqlen) // max(1, nsamples - 1))
    return [ids[i * step:i * step + seqlen] for i in range(nsamples)
            if i * step + seqlen <= len(ids)]


def quantizable_linears(model):
    out = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and not name.endswith("lm_head") \
                and mod.in_features % 16 == 0:
            out.append((name, mod))
    return out


def block_losses(w, scale, gs, imp=None):
    """float64 per-block squared error of W [N, K] quantized with block scales scale [N, K/16]
    at global scale gs (codes: nearest E2M1 magnitude, clipped at 6)."""
    w = w.astype(np.float64)
    n, k = w.shape
    s = np.repeat(scale.astype(np.float64), 16, axis=1) / float(gs)  # decode-direction
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(s > 0, np.abs(w) / s, 0.0)
    idx = np.abs(x[..., None] - E2M1).argmin(axis=-1)
    deq = np.sign(w) * E2M1[idx] * s
    e = (w - deq) ** 2
    if imp is not None:
        e = e * imp.astype(np.float64)[None, :]
    return e.reshape(n, k // 16, 16).sum(axis=-1).ravel()


def compare(model_dir, calib, nsamples=16, seqlen=256, layer_ids=None, log=None):
    from llmcompressor.observers import Observer
    from transformers import AutoModelForCausalLM, AutoTokenizer
    ours = import_observers()
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    linears = quantizable_linears(model)
    if layer_ids is not None:  # decoder layer indices (model.layers.<i>.)
        linears = [(n, m) for n, m in linears
                   if any(f".layers.{i}." in f".{n}." for i in layer_ids)]
        if not linears:
            raise ValueError(f"--layers {layer_ids}: no quantizable Linear in these layers")
    args = nvfp4_weight_args()

    # llm-compressor's imatrix hook on every Linear, one calibration pass of the dense model
    collectors = {}
    for name, mod in linears:
        obs = Observer.load_from_registry("nvfp4_expanded_imatrix", base_name="weight",
                                          args=copy.deepcopy(args))
        obs.attach(mod)
        collectors[name] = obs
    with torch.no_grad():
        for ids in calibration_ids(tok, calib, nsamples, seqlen):
            model(torch.tensor([ids]))
    for name, mod in linears:
        collectors[name].detach(mod)

    layers = []
    tot = {"blocks": 0, "t_theirs_mse": 0.0, "t_ours_mse": 0.0, "t_theirs_imatrix": 0.0,
           "t_ours_wmse": 0.0}
    for key in ("mse", "wmse"):
        for what in ("lower", "equal", "tie", "above"):
            tot[f"{key}_{what}"] = 0
        tot[f"{key}_loss_ours"] = tot[f"{key}_loss_theirs"] = 0.0
    for name, mod in linears:
        w = mod.weight.detach()
        wn = w.float().numpy()
        imp_sum = collectors[name]._imatrix_sum.clone()
        imp_cnt = collectors[name]._imatrix_count.clone()
        imp = (imp_sum / imp_cnt.float()).numpy()
        row = {"name": name, "shape": list(wn.shape), "blocks": wn.size // 16}

        def run(obs_name, with_imatrix):
            obs = Observer.load_from_registry(obs_name, base_name="weight",
                                              args=copy.deepcopy(args))
            if with_imatrix:
                obs._imatrix_sum = imp_sum.clone()
                obs._imatrix_count = imp_cnt.clone()
            t0 = time.perf_counter()
            obs(w)
            qp = obs.get_qparams()
            return qp, time.perf_counter() - t0

        for key, theirs_name, ours_name, weighted in (
                ("mse", "nvfp4_expanded_mse", "scalesweep_mse", False),
                ("wmse", "nvfp4_expanded_imatrix", "scalesweep_wmse", True)):
            qt, tt = run(theirs_name, weighted)
            gs = float(qt["global_scale"].item())
            t0 = time.perf_counter()
            mod_imp = imp if weighted else None
            so = ours.block_scales(w, gs, "sweep-wmse" if weighted else "sweep-mse",
                                   importance=mod_imp.astype(np.float32) if weighted else None,
                                   name=name).numpy()
            to = time.perf_counter() - t0
            # our observer end to end as well (its own global scale: absmax convention)
            qo, to_obs = run(ours_name, weighted)
            st = qt["scale"].float().numpy().reshape(so.shape)
            lt = block_losses(wn, st, gs, mod_imp)
            lo = block_losses(wn, so, gs, mod_imp)
            rel = (lo - lt) / np.maximum(lt, 1e-300)
            row[f"{key}_global_scale"] = gs
            row[f"{key}_lower"] = int((lo < lt).sum())
            row[f"{key}_equal"] = int((lo == lt).sum())
            row[f"{key}_tie"] = int(((lo > lt) & (rel <= 1e-6)).sum())
            row[f"{key}_above"] = int(((lo > lt) & (rel > 1e-6)).sum())
            row[f"{key}_loss_ours"] = float(lo.sum())
            row[f"{key}_loss_theirs"] = float(lt.sum())
            row[f"t_{'theirs_mse' if not weighted else 'theirs_imatrix'}"] = tt
            row[f"t_{'ours_mse' if not weighted else 'ours_wmse'}"] = to_obs
            row[f"{key}_kernel_s"] = to
            del qo
        layers.append(row)
        tot["blocks"] += row["blocks"]
        for k in tot:
            if k != "blocks" and k in row:
                tot[k] += row[k]
        if log:
            log(row)
    return {"model": model_dir, "calib": calib, "nsamples": nsamples, "seqlen": seqlen,
            "layer_ids": layer_ids, "layers": layers, "total": tot}


def print_table(res):
    hdr = (f"{'linear':44s} {'blocks':>7s} | {'MSE lower':>9s} {'equal':>6s} {'above':>5s} "
           f"{'ours/theirs':>11s} | {'wMSE lower':>10s} {'equal':>6s} {'above':>5s} "
           f"{'ours/theirs':>11s}")
    print(hdr)
    print("-" * len(hdr))

    def line(r):
        print(f"{r.get('name', 'TOTAL'):44s} {r['blocks']:7d} | {r['mse_lower']:9d} "
              f"{r['mse_equal']:6d} {r['mse_above']:5d} "
              f"{r['mse_loss_ours'] / r['mse_loss_theirs']:11.4f} | {r['wmse_lower']:10d} "
              f"{r['wmse_equal']:6d} {r['wmse_above']:5d} "
              f"{r['wmse_loss_ours'] / r['wmse_loss_theirs']:11.4f}")
    for r in res["layers"]:
        line(r)
    t = res["total"]
    print("-" * len(hdr))
    line(t)
    print(f"ties (ours above by <= 1e-6 relative): mse {t['mse_tie']}, wmse {t['wmse_tie']}")
    print(f"observer time (call + get_qparams, all Linears): nvfp4_expanded_mse "
          f"{t['t_theirs_mse']:.2f} s, scalesweep_mse {t['t_ours_mse']:.2f} s; "
          f"nvfp4_expanded_imatrix {t['t_theirs_imatrix']:.2f} s, scalesweep_wmse "
          f"{t['t_ours_wmse']:.2f} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--calib", required=True, help="calibration text (not the eval text)")
    ap.add_argument("--nsamples", type=int, default=16)
    ap.add_argument("--seqlen", type=int, default=256)
    ap.add_argument("--layers", default="",
                    help="comma-separated decoder layer indices to compare (empty: all)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    try:
        layers = [int(x) for x in a.layers.split(",") if x] or None
    except ValueError:
        sys.exit(f"llmcompressor_blocks: --layers '{a.layers}': expected integers, e.g. 0,15,29")
    for p, what in ((a.model_dir, "model directory"), (a.calib, "--calib")):
        if not os.path.exists(p):
            sys.exit(f"llmcompressor_blocks: {what} {p} does not exist")
    # llm-compressor logs (loguru) to stdout: keep stdout for the table / the JSON object
    with contextlib.redirect_stdout(sys.stderr):
        res = compare(a.model_dir, a.calib, a.nsamples, a.seqlen, layers)
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        print_table(res)


if __name__ == "__main__":
    main()
