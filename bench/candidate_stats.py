#!/usr/bin/env python3
"""Candidate statistics that decide the GPU design of the sweep kernels (issue 28 item 3).

    python3 bench/candidate_stats.py [--quick] [--json FILE] [--md FILE] [--no-qwen]

For NVFP4 blocks of 16 (y = fl(x * gs), a = max |y|, P = floor_fp8(fl(a / 6))) it measures on
each data set:

1. the distribution of the optimal pattern's offset from P (exhaustive over 1..126, and the
   sweep window's optimum), for MSE and (weights, synthetic) WMSE, and how often they differ;
2. how many candidates a GPU thread evaluates in full per block and per warp (32 consecutive
   blocks of a row; a warp runs a loop step while any lane needs one) for: (a) the full window,
   (b) the existing walk of sweep_pruned (block_quant.h: c = clamp(P), ascending c+1..hi, then
   descending until the block-max term exceeds the best), (c) the walk plus a top-k partial
   loss bound (k = 1, 2, 4: the in-order float sum of the terms of the k largest |y|, a lower
   bound of the loss), and (d) the top-k bound with candidates in the order of descending prior
   probability of their offset, measured on another data set; with the cost in element terms;
3. windows narrowed to the offsets holding >= 99.9 % / 99.99 % of optima on one data set,
   applied to the others: fraction of blocks whose optimum falls outside, and the loss excess.

Losses: the contract loss of block_quant.h (levels by exact RNE onto the E2M1 grid, ties to the
even index; e = fl(|y| - q s), t = fl(e e) [* w], in-order float32 sum), taken from
scalesweep.quantize (method sweep-mse/sweep-wmse with window (o, o), losses=True); the bounds are
computed here with the same float32 arithmetic (python/tests/test_candidate_stats.py checks
this module's loss against the library's exhaustive-mse and sweep-mse choices).
"""
import argparse
import json
import math
import os
import platform
import sys
import time

import numpy as np
import scalesweep as ss

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN = "/work/main" if os.path.isdir("/work/main/models") else ROOT
SMOL = os.path.join(MAIN, "models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf")
QWEN = os.path.join(MAIN, "models/qwen2.5-coder-1.5b/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
TEXT = os.path.join(os.path.dirname(ROOT), "shared/data/text/wikitext2_valid.txt")

E4 = ss.decode(np.arange(127, dtype=np.uint8), "e4m3").astype(np.float32)
BLOCK = 16
WARP = 32
OFF_LO, OFF_HI = -12, 15  # offsets whose losses are computed for every block
KS = (1, 2, 4)


# ----------------------------------------------------------------------------------------------
# numerics (float32 as the C++ kernels)

def base_pattern(a):
    """P = I(floor_fp8(fl(a / 6))), patterns 0..126 (a > 0)."""
    a6 = (np.asarray(a, np.float32) / np.float32(6)).astype(np.float32)
    return np.clip(np.searchsorted(E4, a6, side="right") - 1, 0, 126)


def levels(ay, s):
    """E2M1 level of |y| / s by exact RNE (ties to the even grid index), saturating at 6."""
    r = ay.astype(np.float64)
    s = np.asarray(s, np.float64)
    return (0.5 * (r > 0.25 * s) + 0.5 * (r >= 0.75 * s) + 0.5 * (r > 1.25 * s)
            + 0.5 * (r >= 1.75 * s) + 1.0 * (r > 2.5 * s) + 1.0 * (r >= 3.5 * s)
            + 2.0 * (r > 5.0 * s)).astype(np.float32)


def terms(ay, s, w=None):
    """Per-element loss terms fl(fl(|y| - q s)^2) [* w] in float32; ay [n, m], s [n, 1]."""
    s = np.asarray(s, np.float32)
    qs = (levels(ay, s) * s).astype(np.float32)  # exact: <= 6 significant bits
    e = (ay - qs).astype(np.float32)
    t = (e * e).astype(np.float32)
    if w is not None:
        t = (t * w).astype(np.float32)
    return t


def inorder_sum(t):
    """In-order float32 sum over axis 1 (not numpy's pairwise sum)."""
    acc = np.zeros(t.shape[0], np.float32)
    for i in range(t.shape[1]):
        acc = (acc + t[:, i]).astype(np.float32)
    return acc


def block_loss(ay, s, w=None):
    return inorder_sum(terms(ay, s, w))


def exhaustive_choice(ay, w=None):
    """First minimum over patterns 1..126 (smallest pattern among equal losses)."""
    n = ay.shape[0]
    best = np.full(n, np.inf, np.float32)
    bp = np.zeros(n, np.int64)
    for p in range(1, 127):
        l = block_loss(ay, np.full((n, 1), E4[p], np.float32), w)
        upd = l < best
        best[upd] = l[upd]
        bp[upd] = p
    bp[ay.max(1) == 0] = 0
    return bp, best


def window_table(wmse):
    """(lo, hi) absolute inclusive patterns per base P, as sweep_window in block_quant.h."""
    lo = np.zeros(127, np.int64)
    hi = np.zeros(127, np.int64)
    for P in range(127):
        pw = None if wmse else ss.proven_window(P)
        if pw is not None:
            l, h = P + pw[0], P + pw[1]
        else:
            normal = P >= 16
            h = P + 7 if normal else max(P + 7, 15)
            if not wmse:
                paper = normal and (11.0 / 7.0) * float(E4[P]) <= 448.0
                l = P - 3 if paper else (P - 7 if normal else 1)
            else:
                l = P - 8 if normal else 1
        l = min(max(l, 1), 126)
        h = min(max(h, 1), 126)
        lo[P], hi[P] = l, max(h, l)
    return lo, hi


WIN = {False: window_table(False), True: window_table(True)}


# ----------------------------------------------------------------------------------------------
# per-tensor measurement

def quant(x, gs, method, imp=None, window=None):
    kw = dict(method=method, global_scale=float(gs), scale_layout="row", losses=True)
    if imp is not None:
        kw["importance"] = imp
    if window is not None:
        kw["window"] = window
    q = ss.quantize(x, **kw)
    return (np.asarray(q.scales).reshape(-1).astype(np.int64),
            np.asarray(q.losses).reshape(-1).astype(np.float64))


def prep(x, gs, imp):
    """Per-block quantities of a 2-D tensor x [R, K] (K % 16 == 0)."""
    R, K = x.shape
    y = (x.astype(np.float32) * np.float32(gs)).astype(np.float32)
    ay = np.abs(y).reshape(-1, BLOCK)
    a = ay.max(1)
    P = base_pattern(a)
    d = dict(R=R, nbr=K // BLOCK, ay=ay, a=a, P=P, active=a > 0)
    if imp is not None:
        d["w"] = np.broadcast_to(np.asarray(imp, np.float32).reshape(1, K), (R, K)).reshape(-1, BLOCK)
    return d


def pass1(x, gs, imp):
    """Optimum patterns (exhaustive and window) from the library, MSE and WMSE."""
    out = {}
    for obj in (("mse",) if imp is None else ("mse", "wmse")):
        ex, exl = quant(x, gs, "exhaustive-" + obj, imp if obj == "wmse" else None)
        sw, swl = quant(x, gs, "sweep-" + obj, imp if obj == "wmse" else None)
        out[obj] = (ex, exl, sw, swl)
    return out


def offset_losses(x, gs, imp, d, wmse):
    """L[n, OFF_HI - OFF_LO + 1]: the loss of pattern P + o (inf where outside 1..126)."""
    n = d["P"].shape[0]
    offs = np.arange(OFF_LO, OFF_HI + 1)
    L = np.full((n, len(offs)), np.inf, np.float32)
    for j, o in enumerate(offs):
        pat, l = quant(x, gs, "sweep-wmse" if wmse else "sweep-mse", imp if wmse else None,
                       window=(int(o), int(o)))
        ok = (d["P"] + o >= 1) & (d["P"] + o <= 126)
        L[ok, j] = l[ok]
    return L


def topk_bounds(d, wmse):
    """B[k][n, offsets]: in-order float32 sum of the terms of the k largest |y|."""
    ay, P = d["ay"], d["P"]
    w = d.get("w") if wmse else None
    order = np.argsort(-ay, axis=1, kind="stable")[:, :max(KS)]
    offs = np.arange(OFF_LO, OFF_HI + 1)
    B = {}
    for k in KS:
        idx = np.sort(order[:, :k], axis=1)  # same order as the full in-order sum
        ayk = np.take_along_axis(ay, idx, 1)
        wk = np.take_along_axis(w, idx, 1) if w is not None else None
        Bk = np.full((ay.shape[0], len(offs)), np.inf, np.float32)
        for j, o in enumerate(offs):
            p = P + o
            ok = (p >= 1) & (p <= 126)
            s = E4[np.clip(p, 1, 126)][:, None]
            Bk[ok, j] = inorder_sum(terms(ayk, s, wk))[ok]
        B[k] = Bk
    return B


def amax_terms(d, wmse):
    """The block-max bound of sweep_pruned per offset: fl(fl(a - 6 s)^2) [* w_a]."""
    a, P = d["a"], d["P"]
    offs = np.arange(OFF_LO, OFF_HI + 1)
    wa = None
    if wmse:
        ay, w = d["ay"], d["w"]
        last = BLOCK - 1 - np.argmax((ay == a[:, None])[:, ::-1], axis=1)  # last i with ay == a
        wa = np.take_along_axis(w, last[:, None], 1)[:, 0]
    T = np.full((a.shape[0], len(offs)), np.inf, np.float32)
    for j, o in enumerate(offs):
        s = E4[np.clip(P + o, 1, 126)]
        e = (a - (s * np.float32(6)).astype(np.float32)).astype(np.float32)
        t = (e * e).astype(np.float32)
        if wa is not None:
            t = (t * wa).astype(np.float32)
        T[:, j] = t
    return T


def col(o):
    return o - OFF_LO


def simulate(d, L, B, T, wmse, prior_order):
    """Per block: full evaluations and element-term cost per scheme; per step flags for SIMT.

    Returns {scheme: (full [n], cost [n], steps [n, S] full flags, active [n, S], kterm)} and the
    window optimum (pattern) of each block (the same for every scheme; checked)."""
    P = d["P"]
    n = P.shape[0]
    lo_t, hi_t = WIN[wmse]
    lo, hi = lo_t[P], hi_t[P]
    c = np.clip(P, lo, hi)
    rows = np.arange(n)
    res = {}

    def Lp(p):  # loss of absolute pattern p (vector); inf where p outside the computed range
        j = p - P - OFF_LO
        ok = (j >= 0) & (j < L.shape[1])
        v = np.full(n, np.inf, np.float32)
        v[ok] = L[rows[ok], j[ok]]
        return v

    def Xp(M, p):
        j = p - P - OFF_LO
        ok = (j >= 0) & (j < M.shape[1])
        v = np.full(n, np.inf, np.float32)
        v[ok] = M[rows[ok], j[ok]]
        return v

    if ((lo - P) < OFF_LO).any() or ((hi - P) > OFF_HI).any():
        raise SystemExit("window outside the computed offsets")
    W = int((hi - lo + 1).max())

    # (a) full window: plain ascending scan lo..hi
    best = Lp(lo)
    bp = lo.copy()
    fullflags = np.zeros((n, W), bool)
    fullflags[:, 0] = True
    for j in range(1, W):
        p = lo + j
        act = p <= hi
        l = Lp(p)
        upd = act & (l < best)
        best[upd] = l[upd]
        bp[upd] = p[upd]
        fullflags[:, j] = act
    win_opt, win_loss = bp.copy(), best.copy()
    nfull = fullflags.sum(1)
    res["a: full window"] = dict(full=nfull, cost=16 * nfull, loops=[fullflags], bflags=None, k=0)

    # the walk of sweep_pruned, optionally with a top-k bound (k = 0: none)
    def walk(k):
        Bk = B[k] if k else None
        best = Lp(c)
        bp = c.copy()
        A = W
        up_full = np.zeros((n, A), bool)
        up_act = np.zeros((n, A), bool)
        for j in range(1, A):
            p = c + j
            act = p <= hi
            if not act.any():
                break
            l = Lp(p)
            need = act if k == 0 else act & (Xp(Bk, p) < best)
            upd = need & (l < best)
            best[upd] = l[upd]
            bp[upd] = p[upd]
            up_full[:, j] = need
            up_act[:, j] = act
        dn_full = np.zeros((n, A), bool)
        dn_act = np.zeros((n, A), bool)
        alive = np.ones(n, bool)
        for j in range(1, A):
            p = c - j
            alive &= p >= lo
            if not alive.any():
                break
            dn_act[:, j] = alive  # the block-max test runs
            alive &= ~(Xp(T, p) > best)
            l = Lp(p)
            need = alive if k == 0 else alive & (Xp(Bk, p) <= best)
            upd = need & (l <= best)
            best[upd] = l[upd]
            bp[upd] = p[upd]
            dn_full[:, j] = need
        full = 1 + up_full.sum(1) + dn_full.sum(1)
        # cost: 16 per full evaluation, 1 per block-max test, k per top-k bound test
        cost = 16 * full + dn_act.sum(1) + k * (up_act.sum(1) + dn_act.sum(1))
        return bp, best, dict(full=full, cost=cost, loops=[up_full, dn_full],
                              bloops=[up_act, dn_act], k=k)

    for k in (0,) + KS:
        bp, best, r = walk(k)
        if not np.array_equal(bp, win_opt):
            raise SystemExit(f"walk k={k} differs from the window scan on {int((bp != win_opt).sum())} blocks")
        res["b: walk (block-max)" if k == 0 else f"c: walk + top-{k}"] = r

    # (d) top-k bound in prior order (offsets by descending prior probability)
    for k in KS:
        Bk = B[k]
        best = np.full(n, np.inf, np.float32)
        bp = np.zeros(n, np.int64)
        S = len(prior_order)
        full = np.zeros((n, S), bool)
        act = np.zeros((n, S), bool)
        for j, o in enumerate(prior_order):
            p = P + o
            a_ = (p >= lo) & (p <= hi)
            l = Lp(p)
            b = Xp(Bk, p)
            need = a_ & ((b < best) | ((b == best) & (p < bp)))
            upd = need & ((l < best) | ((l == best) & (p < bp)))
            best[upd] = l[upd]
            bp[upd] = p[upd]
            full[:, j] = need
            act[:, j] = a_
        if not np.array_equal(bp, win_opt):
            raise SystemExit(f"prior order k={k} differs from the window scan on {int((bp != win_opt).sum())} blocks")
        nf = full.sum(1)
        # the first visited candidate needs no bound (best = inf); count k for the others
        cost = 16 * nf + k * np.maximum(act.sum(1) - 1, 0)
        res[f"d: prior order + top-{k}"] = dict(full=nf, cost=cost, loops=[full], bloops=[act], k=k)
    return res, win_opt, win_loss


def warp_reduce(d, res, active):
    """Per warp (32 consecutive blocks of a row): max over lanes of full evaluations, SIMT full
    steps (a loop step with a full evaluation in any lane) and SIMT element-term cost."""
    R, nbr = d["R"], d["nbr"]
    nw = -(-nbr // WARP)
    pad = nw * WARP - nbr

    def shape(v):  # [n, ...] -> [R, nw, 32, ...] with inactive padding
        v = v.reshape((R, nbr) + v.shape[1:])
        if pad:
            z = np.zeros((R, pad) + v.shape[2:], v.dtype)
            v = np.concatenate([v, z], axis=1)
        return v.reshape((R * nw, WARP) + v.shape[2:])

    out = {}
    for name, r in res.items():
        full = np.where(active, r["full"], 0)
        fmax = shape(full).max(1)
        steps = np.zeros(R * nw, np.int64)
        cost = np.zeros(R * nw, np.int64)
        k = r["k"]
        for li, loop in enumerate(r["loops"]):
            f = shape(loop & active[:, None]).any(1)  # [warps, S]
            steps += f.sum(1)
            cost += 16 * f.sum(1)
            if r.get("bloops") is not None:
                b = shape(r["bloops"][li] & active[:, None]).any(1)
                if name.startswith("b") or name.startswith("c"):
                    if li == 1:  # descending: block-max test (1 term) + k-term bound
                        cost += (1 + k) * b.sum(1)
                    else:
                        cost += k * b.sum(1)
                else:
                    cost += k * np.maximum(b.sum(1) - 1, 0)
        if name.startswith("b") or name.startswith("c"):
            steps += 1  # the first candidate c (its loop column 0 is never flagged)
            cost += 16
        out[name] = (fmax, steps, cost)
    return out


# ----------------------------------------------------------------------------------------------
# data sets

def synthetic(quick):
    import torch
    rng = np.random.default_rng(0)
    R, K = (16 if quick else 256), 8192
    x = rng.uniform(-.5, .5, (4, R, K)).sum(0)
    x[:, 3::97] *= 20
    x = torch.from_numpy(x.astype(np.float32)).bfloat16().float().numpy()
    imp = np.exp2(rng.uniform(-.5, .5, K) * 16).astype(np.float32)
    gs = ss.global_scale_for_amax(float(np.abs(x).max()), 448.0)
    return [("synthetic", x, gs, imp)]


def stride_rows(x, cap_elems):
    r = max(1, math.ceil(x.size / cap_elems))
    return x[::r], r


def load_model(path):
    import torch
    import transformers
    d, name = os.path.split(path)
    tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=name)
    m = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=name,
                                                          dtype=torch.float32).eval()
    return tok, m


def model_sets(path, tag, nseq, seqlen, layer_step, cap_blocks, log):
    """Weights (per Linear, per-tensor gs, importance from the activations) and the Linear
    inputs (one row per token, gs from the amax over the captured tokens)."""
    import torch
    t0 = time.time()
    tok, m = load_model(path)
    log(f"  {tag}: loaded in {time.time() - t0:.0f}s")
    nl = m.config.num_hidden_layers
    keep = set(range(0, nl, layer_step))
    lin = []
    for name, mod in m.named_modules():
        if isinstance(mod, torch.nn.Linear):
            parts = name.split(".")
            layer = int(parts[2]) if len(parts) > 2 and parts[1] == "layers" else None
            if layer is None or layer in keep:
                lin.append((name, mod))
    # shared inputs: q/k/v read the same tensor, gate/up too
    def key(name):
        for a, b in (("k_proj", "q_proj"), ("v_proj", "q_proj"), ("up_proj", "gate_proj")):
            if name.endswith(a):
                return name[: -len(a)] + b
        return name
    ids = tok(open(TEXT, encoding="utf-8").read()[: 400000], add_special_tokens=False)["input_ids"]
    ids = ids[: nseq * seqlen]
    stats, rows = {}, {}
    total_in = sum(mod.in_features for n_, mod in lin if key(n_) == n_) * nseq * seqlen
    tstride = max(1, math.ceil(total_in / (cap_blocks * BLOCK)))
    hooks = []
    for name, mod in lin:
        if key(name) != name:
            continue
        def pre(mod_, args, name=name):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
            st = stats.setdefault(name, [0.0, torch.zeros(x.shape[1], dtype=torch.float64), 0])
            st[0] = max(st[0], float(x.abs().max()))
            st[1] += (x.double() ** 2).sum(0)
            st[2] += x.shape[0]
            rows.setdefault(name, []).append(x[::tstride].numpy().copy())
        hooks.append(mod.register_forward_pre_hook(pre))
    t0 = time.time()
    with torch.no_grad():
        for s in range(nseq):
            m(torch.tensor([ids[s * seqlen:(s + 1) * seqlen]]))
    for h in hooks:
        h.remove()
    log(f"  {tag}: {nseq} x {seqlen} tokens through {len(lin)} Linears in {time.time() - t0:.0f}s")
    acts, weights = [], []
    for name, mod in lin:
        st = stats[key(name)]
        imp = (st[1] / st[2]).float().numpy()
        if key(name) == name:
            xa = np.concatenate(rows[name], 0)
            gs = ss.global_scale_for_amax(st[0], 448.0)
            acts.append((name, xa, gs, None))
        w = mod.weight.detach().float().numpy()
        gs = ss.global_scale_for_amax(float(np.abs(w).max()), 448.0)
        weights.append((name, w, gs, imp))
    # row sampling of the weights to the cap
    tot = sum(w.size for _, w, _, _ in weights)
    r = max(1, math.ceil(tot / (cap_blocks * BLOCK)))
    weights = [(n_, np.ascontiguousarray(w[::r]), gs, imp) for n_, w, gs, imp in weights]
    del m
    return acts, weights, tstride, r


# ----------------------------------------------------------------------------------------------

def interval(hist, frac):
    """Smallest offset interval [lo, hi] holding >= frac of the counts (ties: more counts)."""
    offs = sorted(hist)
    tot = sum(hist.values())
    best = None
    for i, lo in enumerate(offs):
        acc = 0
        for hi in offs[i:]:
            acc += hist[hi]
            if acc >= frac * tot:
                cand = (hi - lo, -acc, lo, hi)
                if best is None or cand < best:
                    best = cand
                break
    return best[2], best[3]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small samples (smoke run)")
    ap.add_argument("--json", help="write the results as JSON")
    ap.add_argument("--md", help="write the tables as markdown")
    ap.add_argument("--no-qwen", action="store_true", help="skip the 1.5B Qwen2 sets")
    ap.add_argument("--cap-blocks", type=int, default=None,
                    help="blocks sampled per data set (default 1M, --quick 40k)")
    args = ap.parse_args()
    cap = args.cap_blocks or (40_000 if args.quick else 1_000_000)
    T0 = time.time()
    log = lambda s: print(s, file=sys.stderr, flush=True)
    notes = []

    sets = {}
    sets["synthetic"] = synthetic(args.quick)
    notes.append("synthetic: %d x 8192 bf16 rows, sum of 4 U(-.5,.5), every 97th column (from 3) "
                 "x20; WMSE importance per column 2^(16 U(-.5,.5))" % sets["synthetic"][0][1].shape[0])
    if os.path.exists(SMOL):
        a, w, ts, wr = model_sets(SMOL, "smollm2", 2 if args.quick else 8, 512, 1, cap, log)
        sets["smol-W"], sets["smol-A"] = w, a
        notes.append(f"smol-W: SmolLM2-135M-Instruct Q4_1 GGUF dequantized by transformers, every "
                     f"nn.Linear weight (lm_head = tied embedding), every {wr}th row; "
                     f"smol-A: the inputs of every nn.Linear (q/k/v and gate/up share theirs) on "
                     f"{2 if args.quick else 8} x 512 wikitext2 tokens, every {ts}th token kept")
    else:
        notes.append(f"SmolLM2 skipped: {SMOL} absent")
    if not args.no_qwen and os.path.exists(QWEN):
        nseq = 1 if args.quick else 2
        a, w, ts, wr = model_sets(QWEN, "qwen2-1.5b", nseq, 512, 4, cap, log)
        sets["qwen-W"], sets["qwen-A"] = w, a
        notes.append(f"qwen-W / qwen-A: Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF dequantized, layers "
                     f"0, 4, ..., 24 (every 4th) plus lm_head; weights every {wr}th row; inputs on "
                     f"{nseq} x 512 wikitext2 tokens, every {ts}th token kept")
    else:
        notes.append("Qwen2 1.5B skipped (--no-qwen or fixture absent)")
    for k_, v in sets.items():
        log(f"{k_}: {len(v)} tensors, {sum(x.size for _, x, _, _ in v) // BLOCK} blocks")

    objs = {name: (("mse", "wmse") if v[0][3] is not None else ("mse",)) for name, v in sets.items()}
    # pass 1: optimum offsets
    hist, hist_win, differ, nblk = {}, {}, {}, {}
    for name, tensors in sets.items():
        for x, gs, imp in ((x, gs, imp) for _, x, gs, imp in tensors):
            p1 = pass1(x, gs, imp)
            d = prep(x, gs, None)
            act = d["active"]
            for obj, (ex, exl, sw, swl) in p1.items():
                key = (name, obj)
                h = hist.setdefault(key, {})
                hw = hist_win.setdefault(key, {})
                for o, c_ in zip(*np.unique(ex[act] - d["P"][act], return_counts=True)):
                    h[int(o)] = h.get(int(o), 0) + int(c_)
                for o, c_ in zip(*np.unique(sw[act] - d["P"][act], return_counts=True)):
                    hw[int(o)] = hw.get(int(o), 0) + int(c_)
                differ[key] = differ.get(key, 0) + int((ex[act] != sw[act]).sum())
                nblk[key] = nblk.get(key, 0) + int(act.sum())
        log(f"pass 1 {name}: {time.time() - T0:.0f}s")

    partner = {"synthetic": "smol-A", "smol-W": "qwen-W", "qwen-W": "smol-W",
               "smol-A": "qwen-A", "qwen-A": "smol-A"}
    def prior(name, obj):
        p = partner.get(name)
        if (p, obj) not in hist:
            p = next(n for n in sets if n != name and (n, obj) in hist) if any(
                n != name and (n, obj) in hist for n in sets) else name
        h = hist[(p, obj)]
        offs = sorted(range(OFF_LO, OFF_HI + 1), key=lambda o: (-h.get(o, 0), abs(o), o))
        return p, offs

    narrow = {}
    for (name, obj), h in hist.items():
        narrow[(name, obj)] = {f: interval(h, f) for f in (0.999, 0.9999)}

    # pass 2: candidate counts and narrowing
    counts, excess = {}, {}
    for name, tensors in sets.items():
        for obj in objs[name]:
            wm = obj == "wmse"
            pname, porder = prior(name, obj)
            acc = {}
            ex_acc = {}
            for _, x, gs, imp in tensors:
                d = prep(x, gs, imp if wm else None)
                act = d["active"]
                L = offset_losses(x, gs, imp, d, wm)
                B = topk_bounds(d, wm)
                T = amax_terms(d, wm)
                res, wopt, wloss = simulate(d, L, B, T, wm, porder)
                wr_ = warp_reduce(d, res, act)
                for s_, r in res.items():
                    e = acc.setdefault(s_, dict(full=[], cost=[], wmax=[], wsteps=[], wcost=[]))
                    e["full"].append(r["full"][act])
                    e["cost"].append(r["cost"][act])
                    fmax, steps, cost = wr_[s_]
                    nz = fmax > 0
                    e["wmax"].append(fmax[nz])
                    e["wsteps"].append(steps[nz])
                    e["wcost"].append(cost[nz])
                # narrowing from every other set's intervals (and its own)
                ex, exl = quant(x, gs, "exhaustive-" + obj, imp if wm else None)
                for (src, o2), iv in narrow.items():
                    if o2 != obj:
                        continue
                    for f, (nlo, nhi) in iv.items():
                        _, Ln = quant(x, gs, "sweep-" + obj, imp if wm else None,
                                      window=(int(nlo), int(nhi)))
                        off = ex - d["P"]
                        out = act & ((off < nlo) | (off > nhi))
                        e = ex_acc.setdefault((src, f), dict(n=0, out=0, rel=[], sumn=0.0, sume=0.0))
                        e["n"] += int(act.sum())
                        e["out"] += int(out.sum())
                        with np.errstate(divide="ignore", invalid="ignore"):
                            rel = np.where(exl[out] > 0, (Ln[out] - exl[out]) / exl[out], np.inf)
                        e["rel"].append(rel)
                        e["sumn"] += float(Ln[act].sum())
                        e["sume"] += float(exl[act].sum())
            counts[(name, obj)] = (pname, {s_: {k_: np.concatenate(v) for k_, v in e.items()}
                                           for s_, e in acc.items()})
            excess[(name, obj)] = ex_acc
            log(f"pass 2 {name} {obj}: {time.time() - T0:.0f}s")

    # ------------------------------------------------------------------------------------------
    md = []
    J = dict(notes=notes, hist={}, counts={}, narrow={}, excess={})
    md.append("### 1. Optimum offset from P (% of blocks; exhaustive over 1..126)\n")
    allo = sorted({o for h in hist.values() for o in h})
    lo_show = [o for o in allo if -8 <= o <= 8]
    md.append("| set | obj | blocks | " + " | ".join(f"{o:+d}" for o in lo_show)
              + " | other | window opt != exhaustive |")
    md.append("|---|---|---:|" + "---:|" * len(lo_show) + "---:|---:|")
    for (name, obj), h in hist.items():
        n = nblk[(name, obj)]
        other = sum(c_ for o, c_ in h.items() if o not in lo_show)
        cells = [f"{100 * h.get(o, 0) / n:.3f}" if h.get(o, 0) else "0" for o in lo_show]
        md.append(f"| {name} | {obj} | {n} | " + " | ".join(cells)
                  + f" | {100 * other / n:.4f} | {differ[(name, obj)]} ({100 * differ[(name, obj)] / n:.4f} %) |")
        J["hist"][f"{name}/{obj}"] = dict(blocks=n, exhaustive=h, window=hist_win[(name, obj)],
                                          differ=differ[(name, obj)])
    md.append("")
    for (name, obj), h in hist.items():
        ext = {o: c_ for o, c_ in h.items() if o not in lo_show}
        if ext:
            md.append(f"- {name} {obj}, optima outside -8..+8: " + ", ".join(
                f"{o:+d}: {c_}" for o, c_ in sorted(ext.items())))
    md.append("\n### 2. Candidates fully evaluated (window of sweep-mse / sweep-wmse)\n")
    md.append("Per warp = 32 consecutive blocks of a row. *max* = the most of any lane; *SIMT* = "
              "loop steps in which some lane evaluates a candidate in full (what the warp pays); "
              "terms = element terms (16 per full evaluation, 1 per block-max test, k per top-k "
              "bound test).\n")
    md.append("| set | obj | scheme | per block | warp max | warp SIMT mean | warp SIMT p99 | "
              "terms/block | terms/warp SIMT |")
    md.append("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for (name, obj), (pname, c_) in counts.items():
        for s_, e in c_.items():
            lab = s_ + (f" (prior: {pname})" if s_.startswith("d") else "")
            row = dict(block=float(e["full"].mean()), warp_max=float(e["wmax"].mean()),
                       warp_simt=float(e["wsteps"].mean()),
                       warp_simt_p99=float(np.percentile(e["wsteps"], 99)),
                       terms_block=float(e["cost"].mean()), terms_warp=float(e["wcost"].mean()))
            J["counts"][f"{name}/{obj}/{s_}"] = dict(row, prior=pname if s_.startswith("d") else None)
            md.append(f"| {name} | {obj} | {lab} | {row['block']:.2f} | {row['warp_max']:.2f} | "
                      f"{row['warp_simt']:.2f} | {row['warp_simt_p99']:.0f} | "
                      f"{row['terms_block']:.1f} | {row['terms_warp']:.1f} |")
    md.append("\n### 3. Narrowed windows (offsets holding >= 99.9 % / 99.99 % of the optima of the "
              "source set) on every set\n")
    md.append("rel. excess = (loss in the narrowed window - exhaustive loss) / exhaustive loss, over "
              "the blocks whose optimum falls outside; total = relative increase of the summed loss.\n")
    md.append("| obj | source | frac | window | target | blocks outside | mean rel. excess | "
              "max rel. excess | total |")
    md.append("|---|---|---|---|---|---:|---:|---:|---:|")
    for (src, obj), iv in narrow.items():
        for f, (nlo, nhi) in iv.items():
            J["narrow"][f"{src}/{obj}/{f}"] = [nlo, nhi]
            for (tgt, o2), ex_acc in excess.items():
                if o2 != obj:
                    continue
                e = ex_acc[(src, f)]
                rel = np.concatenate(e["rel"]) if e["rel"] else np.zeros(0)
                fin = rel[np.isfinite(rel)]
                mean = float(fin.mean()) if fin.size else 0.0
                mx = float(fin.max()) if fin.size else 0.0
                tot = e["sumn"] / e["sume"] - 1 if e["sume"] > 0 else 0.0
                J["excess"][f"{src}/{obj}/{f}/{tgt}"] = dict(window=[nlo, nhi], blocks=e["n"],
                                                             outside=e["out"], mean_rel=mean,
                                                             max_rel=mx, total_rel=tot,
                                                             zero_loss_outside=int((~np.isfinite(rel)).sum()))
                self_ = " (self)" if tgt == src else ""
                md.append(f"| {obj} | {src} | {100 * f:g} % | [{nlo:+d}, {nhi:+d}] | {tgt}{self_} | "
                          f"{e['out']} / {e['n']} ({100 * e['out'] / max(e['n'], 1):.4f} %) | "
                          f"{100 * mean:.2f} % | {100 * mx:.1f} % | {100 * tot:.5f} % |")
    text = "\n".join(md) + "\n"
    hdr = ("Command: `" + " ".join(["python3", "bench/candidate_stats.py"] + sys.argv[1:]) + "`, "
           f"{time.time() - T0:.0f} s.\n\nData:\n\n" + "".join(f"- {n_}\n" for n_ in notes) + "\n")
    print(hdr + text)
    J["seconds"] = time.time() - T0
    if args.md:
        open(args.md, "w").write(hdr + text)
    if args.json:
        json.dump(J, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
