"""Calibration statistics files (`scalesweep calibrate`'s format, src/io/calib_stats.cc):

    layers.{l}.{attn_in|attn_out|mlp_in|mlp_out}.xtx     F64 [dim, dim]  sum of x x^T
    layers.{l}.{...}.tokens                              I64 [1]
    layers.{l}.{...}.amax                                F32 [1]
    layers.{l}.{q|k|v}.amax                              F32 [1]
    layers.{l}.{q|k|v}.sqnorm                            F64 [channels]
    metadata: format = "scalesweep-calib-v1", n_layers, nsamples, seqlen, seed (and windows
    when not random)

load_stats reads what simulation needs (amax, tokens, the diagonal of each xtx, q/k/v) without
loading the xtx matrices (the file is memory-mapped and only the diagonal is touched);
save_stats writes a file the native loader accepts.
"""
import json
import os
import struct

import numpy as np

from ._arch import INPUTS

# How calibration windows are placed (model::kCalibWindowNames), in its order.
WINDOWS = ("random", "spread")
FORMAT = "scalesweep-calib-v1"
_DT = {"F64": np.float64, "F32": np.float32, "I64": np.int64}


class Stats:
    """layers[l] = {"attn_in": {"amax", "tokens", "diag"}, ..., "q": {"amax", "sqnorm"}, ...}"""

    def __init__(self, layers, nsamples=0, seqlen=0, seed=0, path=None):
        self.layers, self.nsamples, self.seqlen, self.seed, self.path = (
            layers, nsamples, seqlen, seed, path)

    def check(self, dims, n_layers, model_name="the model"):
        """Raises ValueError naming the file and tensor where these statistics do not fit a
        model with n_layers layers and the input/state widths `dims` (_arch.Arch.dims())."""
        where = self.path or "statistics"
        if len(self.layers) != n_layers:
            raise ValueError(f"{where}: {len(self.layers)} layers, {model_name} has {n_layers}: "
                             "statistics of another model")
        for li, L in enumerate(self.layers):
            for nm in INPUTS:
                d = len(L[nm]["diag"])
                if d != dims[nm]:
                    raise ValueError(f"{where}: tensor 'layers.{li}.{nm}.xtx' is [{d}, {d}], "
                                     f"{model_name} has {dims[nm]} inputs there: statistics of "
                                     "another model")
            for nm in ("q", "k", "v"):
                d = len(L[nm]["sqnorm"])
                if d != dims[nm]:
                    raise ValueError(f"{where}: tensor 'layers.{li}.{nm}.sqnorm' has {d} "
                                     f"channels, {model_name} has {dims[nm]}: statistics of "
                                     "another model")


def _header(path):
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", raw)
        if n > 100 << 20:
            raise ValueError(f"{path}: not a safetensors file (header length {n})")
        try:
            hdr = json.loads(f.read(n))
        except ValueError as e:
            raise ValueError(f"{path}: not a safetensors file ({e})") from None
    return hdr, 8 + n


def load_stats(path):
    """The statistics of `path` (see the module doc); ValueError naming the file and the tensor
    on a missing tensor, a wrong dtype or shape, or non-finite / negative values."""
    path = os.fspath(path)
    hdr, base = _header(path)
    md = hdr.get("__metadata__", {}) or {}
    if md.get("format") != FORMAT:
        raise ValueError(f"{path}: not a calibration statistics file (metadata format "
                         f"{md.get('format')!r}, expected {FORMAT!r})")
    try:
        n_layers = int(md["n_layers"])
    except (KeyError, ValueError):
        raise ValueError(f"{path}: metadata n_layers missing or not an integer") from None
    mm = np.memmap(path, dtype=np.uint8, mode="r")

    def tensor(name, dtype, rank):
        if name not in hdr:
            raise ValueError(f"{path}: tensor '{name}' missing")
        t = hdr[name]
        if t.get("dtype") != dtype:
            raise ValueError(f"{path}: tensor '{name}' has dtype {t.get('dtype')}, expected {dtype}")
        shape = t.get("shape", [])
        if len(shape) != rank:
            raise ValueError(f"{path}: tensor '{name}' has shape {shape}, expected rank {rank}")
        try:
            b0, b1 = (int(v) for v in t["data_offsets"])
            n = int(np.prod([int(d) for d in shape]))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: tensor '{name}' has a malformed shape or data_offsets "
                             f"({shape}, {t.get('data_offsets')})") from None
        if (min(shape, default=1) < 0 or not 0 <= b0 <= b1 or base + b1 > len(mm)
                or b1 - b0 != n * np.dtype(_DT[dtype]).itemsize):
            raise ValueError(f"{path}: tensor '{name}' data_offsets [{b0}, {b1}] do not hold "
                             f"{dtype} {shape} inside the file ({len(mm)} bytes): truncated or "
                             "corrupt")
        return mm[base + b0:base + b1].view(_DT[dtype]).reshape(shape)

    def finite_nonneg(name, v):
        bad = ~np.isfinite(v) | (v < 0)
        if bad.any():
            i = int(np.flatnonzero(bad.ravel())[0])
            raise ValueError(f"{path}: tensor '{name}' element {i} is {v.ravel()[i]} "
                             "(not finite or negative)")
        return v

    layers = []
    for li in range(n_layers):
        L = {}
        for nm in INPUTS:
            p = f"layers.{li}.{nm}"
            xtx = tensor(p + ".xtx", "F64", 2)
            if xtx.shape[0] != xtx.shape[1]:
                raise ValueError(f"{path}: tensor '{p}.xtx' is not square ({list(xtx.shape)})")
            diag = finite_nonneg(p + ".xtx", np.array(np.diagonal(xtx), dtype=np.float64))
            L[nm] = {"diag": diag,
                     "tokens": int(tensor(p + ".tokens", "I64", 1)[0]),
                     "amax": float(finite_nonneg(p + ".amax", tensor(p + ".amax", "F32", 1))[0])}
        for nm in ("q", "k", "v"):
            p = f"layers.{li}.{nm}"
            L[nm] = {"amax": float(finite_nonneg(p + ".amax", tensor(p + ".amax", "F32", 1))[0]),
                     "sqnorm": finite_nonneg(p + ".sqnorm",
                                             np.array(tensor(p + ".sqnorm", "F64", 1)))}
        layers.append(L)
    return Stats(layers, int(md.get("nsamples", 0)), int(md.get("seqlen", 0)),
                 int(md.get("seed", 0)), path)


def save_stats(path, layers, nsamples, seqlen, seed=0, windows="random"):
    """Writes statistics in the native format. layers[l][input] = {"xtx": [dim, dim] float64,
    "tokens": int, "amax": float}; layers[l]["q"|"k"|"v"] = {"amax": float, "sqnorm": [ch]}.
    windows: how the windows were placed ("random" or "spread"; recorded as the CLI records
    --calib-windows: a "windows" key only when not random).
    Written to a temporary file and renamed: no partial file on failure."""
    from safetensors.numpy import save_file
    out = {}
    for li, L in enumerate(layers):
        for nm in INPUTS:
            p = f"layers.{li}.{nm}"
            out[p + ".xtx"] = np.ascontiguousarray(L[nm]["xtx"], dtype=np.float64)
            out[p + ".tokens"] = np.array([L[nm]["tokens"]], dtype=np.int64)
            out[p + ".amax"] = np.array([L[nm]["amax"]], dtype=np.float32)
        for nm in ("q", "k", "v"):
            p = f"layers.{li}.{nm}"
            out[p + ".amax"] = np.array([L[nm]["amax"]], dtype=np.float32)
            out[p + ".sqnorm"] = np.ascontiguousarray(L[nm]["sqnorm"], dtype=np.float64)
    md = {"format": FORMAT, "n_layers": str(len(layers)), "nsamples": str(int(nsamples)),
          "seqlen": str(int(seqlen)), "seed": str(int(seed))}
    if windows not in WINDOWS:
        raise ValueError(f"save_stats: windows '{windows}' (accepted: {', '.join(WINDOWS)})")
    if windows != "random":
        md["windows"] = windows
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    try:
        save_file(out, tmp, metadata=md)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
