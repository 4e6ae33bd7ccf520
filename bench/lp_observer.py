#!/usr/bin/env python3
"""Experiment: llm-compressor weight observers that choose each NVFP4 block's FP8 E4M3 scale by
an exact search over E4M3 candidates (as scalesweep's selectors do) but for the imatrix-weighted
L^p error sum_j imp_j |w_j - q_j|^p that llm-compressor's ``nvfp4_expanded_imatrix`` minimises
(p = 2.4 there, over float32 range factors 0.8..1.8 rounded to E4M3 afterwards).

Registered names: ``ss_lp2`` (p = 2: scalesweep_wmse's objective, a check), ``ss_lp24``
(p = 2.4), ``ss_lp3`` (p = 3). Global scale: as scalesweep_wmse (448 * 6 / fused amax).
Candidates: the 15 E4M3 codes from 6 below to 8 above the code nearest the AbsMax scale (ratios
about 0.5x..2.6x), which hold llm-compressor's whole range.

Used by bench/llmcompressor_staged.py --observer ss_lp24 after ``import lp_observer`` (it imports
this module when the observer name starts with ss_lp). Vectorised torch, CPU, float32 losses.
"""
import torch
from llmcompressor.observers.base import Observer

from scalesweep.llmcompressor import ScaleSweepWMSEObserver

_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_MID = (_E2M1[1:] + _E2M1[:-1]) / 2
_E4M3 = torch.arange(1, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 126 > 0


def e2m1_round(y):
    """|y| rounded to the nearest E2M1 magnitude (saturating at 6; an exact midpoint goes down),
    in y's dtype."""
    mid = _MID.to(y.dtype)
    return _E2M1.to(y.dtype)[torch.bucketize(y.abs().clamp(max=6.0), mid)]


def lp_block_scales(w, gs, imp, p, lo=6, hi=8, chunk=512):
    """E4M3 block scales (float32 values, encode direction) minimising sum imp |e|^p per block."""
    rows, cols = w.shape
    g = cols // 16
    imp = torch.ones(cols) if imp is None else torch.as_tensor(imp, dtype=torch.float32)
    impb = imp.view(1, g, 16)
    out = torch.empty(rows, g)
    for r0 in range(0, rows, chunk):
        wb = w[r0:r0 + chunk].float().reshape(-1, g, 16)
        amax = wb.abs().amax(-1)
        s0 = amax / 6 * gs
        k0 = torch.searchsorted(_E4M3, s0.clamp_min(_E4M3[0]))
        k0 = torch.minimum(k0, torch.tensor(125))
        best = torch.full_like(amax, float("inf"))
        bestv = torch.full_like(amax, _E4M3[0].item())
        for d in range(-lo, hi + 1):
            k = (k0 + d).clamp(0, 125)
            v = _E4M3[k]
            s = (v / gs).unsqueeze(-1)
            q = e2m1_round(wb / s)
            e = (q * s * wb.sign() - wb).abs().pow(p)
            loss = (e * impb).sum(-1)
            better = loss < best
            best = torch.where(better, loss, best)
            bestv = torch.where(better, v, bestv)
        bestv = torch.where(amax == 0, torch.zeros_like(bestv), bestv)
        out[r0:r0 + chunk] = bestv
    return out


def _make(name, p):
    class _Lp(ScaleSweepWMSEObserver):
        _p = p

        def _block_scales(self, w, global_scale):
            return lp_block_scales(w.detach().cpu(), global_scale, self._importance(), self._p)

    _Lp.__name__ = name
    Observer.register(name)(_Lp)
    return _Lp


for _n, _p in (("ss_lp2", 2.0), ("ss_lp24", 2.4), ("ss_lp3", 3.0)):
    _make(_n, _p)
