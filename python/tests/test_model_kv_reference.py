"""Independent numpy reference of simulated NVFP4 (absmax) in the stories260K forward pass.

Re-implements the model straight from the llama2.c checkpoint (interleaved RoPE pairs, no
weight permutation, dense causal softmax) and the NVFP4 absmax rules of docs/NUMERICS.md with
ml_dtypes' E4M3, then checks that `scalesweep ppl --quant FP|WA|WAKV --method absmax` gives
the same NLL on the first 1024 tokens. Placement as in model/simquant.h: K after RoPE and V
as they enter the cache, static global scale 6*448/amax from the calibration amax of the same
tensor, 16-blocks along the flattened kv_heads*head_dim axis of each token.
It also pins down where the KV hit comes from on this model: quantizing K alone costs far
more than quantizing V alone (8-dim heads, attention logits with std ~10-30).
"""
import json
import os
import struct
import subprocess

import numpy as np
import pytest

from cli_common import BIN, DATA, MODEL, TOK, VAL, need_bin, need_files  # noqa: F401
NTOK = 1024
CTX = 512

pytestmark = [need_bin, need_files(MODEL, TOK, VAL)]
ml_dtypes = pytest.importorskip("ml_dtypes")
safetensors_numpy = pytest.importorskip("safetensors.numpy")


def run(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{args} failed ({p.returncode}): {p.stderr}"
    return p.stdout


# ---- NVFP4 absmax fake quantization (docs/NUMERICS.md) ----
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float64)


def rne_e2m1(v):
    """|y|/s >= 0 to the nearest E2M1 magnitude, ties to the even code, saturating at 6."""
    v = np.minimum(v, 6.0)
    idx = np.clip(np.searchsorted(E2M1, v), 1, 7)
    lo, hi = E2M1[idx - 1], E2M1[idx]
    pick_hi = (hi - v < v - lo) | ((hi - v == v - lo) & (idx % 2 == 0))
    return np.where(pick_hi, hi, lo)


def fake_quant(x, gs, block=16):
    x = np.asarray(x, np.float32)
    gs = np.float32(gs)
    y = (x * gs).astype(np.float32)
    out = np.empty_like(x)
    for b0 in range(0, x.shape[1], block):
        yb = y[:, b0:b0 + block]
        a = np.abs(yb).max(1)
        s = (np.minimum(a / np.float32(6), 448).astype(ml_dtypes.float8_e4m3fn)
             .astype(np.float64)[:, None])
        safe = np.where(s > 0, s, 1.0)
        q = np.where(s > 0, rne_e2m1(np.abs(yb.astype(np.float64)) / safe), 0.0) * np.sign(yb)
        out[:, b0:b0 + block] = ((q * s).astype(np.float32) / gs).astype(np.float32)
    return out


def gs_for(amax, c=448.0):
    return np.float32(np.float32(6 * c) / np.float32(amax))


# ---- stories260K from the llama2.c legacy checkpoint ----
class Model:
    def __init__(self, path):
        raw = open(path, "rb").read()
        self.dim, self.hid, self.L, self.nh, self.nkv, self.V, _ = struct.unpack("7i", raw[:28])
        a = np.frombuffer(raw[28:], dtype=np.float32)
        self.hd = self.dim // self.nh
        kvd = self.nkv * self.hd
        off = [0]

        def take(*shape):
            n = int(np.prod(shape))
            r = a[off[0]:off[0] + n].reshape(shape)
            off[0] += n
            return r

        d, h, L = self.dim, self.hid, self.L
        self.emb = take(self.V, d)
        self.rms_att = take(L, d)
        self.w = {"wq": take(L, d, d), "wk": take(L, kvd, d), "wv": take(L, kvd, d),
                  "wo": take(L, d, d)}
        self.rms_ffn = take(L, d)
        self.w["w1"] = take(L, h, d)
        self.w["w2"] = take(L, d, h)
        self.w["w3"] = take(L, h, d)
        self.rms_final = take(d)
        self.freqs = 1.0 / (10000.0 ** (np.arange(0, self.hd, 2, dtype=np.float32) / self.hd))

    def quantized_weights(self):
        out = {k: [] for k in self.w}
        for l in range(self.L):
            for grp in (("wq", "wk", "wv"), ("wo",), ("w1", "w3"), ("w2",)):
                gs = gs_for(max(np.abs(self.w[g][l]).max() for g in grp))
                for g in grp:
                    out[g].append(fake_quant(self.w[g][l], gs))
        return out

    def rope(self, x, heads):  # llama2.c: interleaved pairs (2i, 2i+1)
        n = x.shape[0]
        t = np.arange(n, dtype=np.float32)[:, None] * self.freqs[None]
        c, s = np.cos(t)[:, None], np.sin(t)[:, None]
        x = x.reshape(n, heads, self.hd // 2, 2)
        a0, a1 = x[..., 0], x[..., 1]
        return np.stack([a0 * c - a1 * s, a1 * c + a0 * s], -1).reshape(n, heads * self.hd)

    def logits(self, tok, W, A=None, K=None, V=None):
        """A/K/V: per-layer encode global scales (None = not quantized)."""
        def rms(x, w):
            return w * (x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5))

        def aq(x, l, i):
            return fake_quant(x, A[l][i]) if A else x

        n, hd, rep = len(tok), self.hd, self.nh // self.nkv
        x = self.emb[tok].copy()
        mask = np.triu(np.full((n, n), -np.inf, np.float32), 1)
        for l in range(self.L):
            h = aq(rms(x, self.rms_att[l]), l, 0)
            q = self.rope(h @ W["wq"][l].T, self.nh)
            k = self.rope(h @ W["wk"][l].T, self.nkv)
            v = h @ W["wv"][l].T
            if K:
                k = fake_quant(k, K[l])
            if V:
                v = fake_quant(v, V[l])
            qh = q.reshape(n, self.nh, hd).transpose(1, 0, 2)
            kh = np.repeat(k.reshape(n, self.nkv, hd).transpose(1, 0, 2), rep, 0)
            vh = np.repeat(v.reshape(n, self.nkv, hd).transpose(1, 0, 2), rep, 0)
            s = qh @ kh.transpose(0, 2, 1) / np.sqrt(hd) + mask
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            att = aq((p @ vh).transpose(1, 0, 2).reshape(n, self.dim), l, 1)
            x = x + att @ W["wo"][l].T
            h = aq(rms(x, self.rms_ffn[l]), l, 2)
            g = h @ W["w1"][l].T
            hb = aq(g / (1 + np.exp(-g)) * (h @ W["w3"][l].T), l, 3)
            x = x + hb @ W["w2"][l].T
        return rms(x, self.rms_final) @ self.emb.T

    def nll(self, tokens, W, **q):
        tot, cnt = 0.0, 0
        for b in range(0, len(tokens), CTX):  # stride = ctx: each window a fresh sequence
            w = np.array(tokens[b:b + CTX])
            lg = self.logits(w, W, **q).astype(np.float64)[:-1]
            m = lg.max(-1)
            lse = np.log(np.exp(lg - m[:, None]).sum(-1)) + m
            tot += float((lse - lg[np.arange(len(w) - 1), w[1:]]).sum())
            cnt += len(w) - 1
        return tot / cnt


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("kvref")
    ids = json.loads(run("tokenize", TOK, "--file", VAL, "--bos", "--json"))["ids"][:NTOK]
    stats = str(d / "stats.safetensors")
    run("calibrate", MODEL, "--text", VAL, "--nsamples", "8", "--seqlen", "512", "--seed", "0",
        "-o", stats)
    st = safetensors_numpy.load_file(stats)
    m = Model(MODEL)

    def amax(l, name):
        return float(st[f"layers.{l}.{name}.amax"].reshape(-1)[0])

    g = {"A": [[gs_for(amax(l, nm)) for nm in ("attn_in", "attn_out", "mlp_in", "mlp_out")]
               for l in range(m.L)],
         "K": [gs_for(amax(l, "k")) for l in range(m.L)],
         "V": [gs_for(amax(l, "v")) for l in range(m.L)]}
    return m, ids, stats, g


def cli_nll(stats, quant):
    method = [] if quant.upper() in ("FP", "NONE") else ["--method", "absmax"]  # FP: no --method
    out = run("ppl", MODEL, "--text", VAL, "--max-tokens", str(NTOK), "--ctx", str(CTX),
              "--quant", quant, *method, "--stats", stats, "--json")
    return json.loads(out)["nll_per_token"]


def test_cli_matches_independent_reference(setup):
    m, ids, stats, g = setup
    Wq = m.quantized_weights()
    ref = {"none": m.nll(ids, m.w),
           "WA": m.nll(ids, Wq, A=g["A"]),
           "WAKV": m.nll(ids, Wq, A=g["A"], K=g["K"], V=g["V"])}
    for quant, want in ref.items():
        got = cli_nll(stats, quant)
        # FP agrees to ~1e-7 everywhere. With activations quantized, ulp-level differences
        # of the matmuls flip FP4 roundings: on a Xeon (AVX-512) CLI and reference agreed to
        # ~1e-7, on an AMD EPYC (Zen 4) they differ by 0.9e-3 (WA) and 4.1e-3 (WAKV), and the
        # CLI alone moves by 1.6e-3 (WA) between OpenBLAS's Haswell and SkylakeX sgemm kernels
        # (OPENBLAS_CORETYPE). 1e-2 stays 30x below the > 0.3-nat KV effect checked below.
        tol = 1e-4 if quant == "none" else 1e-2
        assert abs(got - want) < tol, f"{quant}: CLI {got:.5f} vs reference {want:.5f}"
    assert ref["WAKV"] > ref["WA"] + 0.3  # the KV hit is reproduced, not an artefact


def test_kv_hit_comes_from_keys(setup):
    m, ids, _, g = setup
    fp = m.nll(ids, m.w)
    k_only = m.nll(ids, m.w, K=g["K"]) - fp
    v_only = m.nll(ids, m.w, V=g["V"]) - fp
    assert v_only < 0.05, v_only
    assert k_only > 10 * max(v_only, 0.01), (k_only, v_only)
