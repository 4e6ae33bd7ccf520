"""Simulated NVFP4 / MXFP4 on a transformers model, with the native runtime's definitions
(include/scalesweep/model/simquant.h, `scalesweep ppl --quant`):

  W   every Linear weight of the decoder layers (not the embeddings, not lm_head), quantized
      once; q/k/v share one global scale, gate/up too (as fused projections do in vLLM);
      weighted methods weigh column j by the diagonal of the input's sum of x x^T.
  A   every Linear input, per token, with the static global scale of the calibration amax
      (q/k/v read one quantized input, gate/up too); weighted methods weigh input channel j by
      the squared norm of column j of the FP weights reading it.
  KV  keys (after q/k norm and RoPE) and values as they enter the attention.
  Q   query states (after RoPE) before the scores.
      Q is weighted by K's channel norms, K by Q's (summed over the query heads of a KV head),
      V by W_O's input-channel norms (summed likewise).

NVFP4 global scales are gs = 6C/amax (C = scalesweep.default_max_block_scale(method)); MXFP4
has none. The quantize-dequantize runs in float32 through scalesweep.fake_quantize (CPU kernels
for CPU tensors, CUDA kernels for CUDA tensors) and its result is cast back to the tensor's
dtype.
"""
import torch

import scalesweep as ss

from ._arch import INPUTS, Arch
from .stats import Stats, load_stats

_SETTINGS = {  # name -> (weights, acts, kv, query)
    "none": (False, False, False, False), "fp": (False, False, False, False),
    "w": (True, False, False, False), "wa": (True, True, False, False),
    "wakv": (True, True, True, False), "wakvq": (True, True, True, True),
}
_WEIGHTED = ("sweep-wmse", "exhaustive-wmse", "opt-fp8-wmse")


class SimHandle:
    """What simulate() changed; remove() (or leaving a `with` block) restores the model: the
    original weights, the forward hooks and the attention implementation."""

    def __init__(self, setting, method):
        self.setting, self.method = setting, method
        self._undo = []

    def remove(self):
        while self._undo:
            self._undo.pop()()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False

    def __repr__(self):
        state = "active" if self._undo else "removed"
        return f"SimHandle({self.setting}, {self.method}, {state})"


def _col_sqnorms(linears):
    acc = None
    for lin in linears:
        s = lin.weight.detach().to(torch.float64).square().sum(0)
        acc = s if acc is None else acc + s
    return acc.to(torch.float32)


def check_settings(setting, method, format="nvfp4"):
    """The one check of simulate()'s setting, method and format (callers that load a model first,
    such as the lm-eval model, run it before loading): returns (the setting's lower-case key,
    its (weights, acts, kv, query) flags, the lower-case format); ValueError naming what is
    refused."""
    key = "none" if setting is None else str(setting).lower()
    if key not in _SETTINGS:
        raise ValueError(f"unknown quantization setting {setting!r} (accepted: W, WA, WAKV, "
                         "WAKVQ, none)")
    if method not in ss.METHODS:
        raise ValueError(f"unknown method {method!r} (accepted: {', '.join(ss.METHODS)})")
    if method == "sweep":
        raise ValueError("method 'sweep' needs an explicit offset window, which simulated "
                         "quantization does not take; use sweep-mse or sweep-wmse")
    fmt = str(format).lower()
    if fmt not in ("nvfp4", "mxfp4"):
        raise ValueError(f"unknown format {format!r} (accepted: nvfp4, mxfp4)")
    return key, _SETTINGS[key], fmt


def simulate(model, setting, method="sweep-mse", stats=None, block=None, format="nvfp4",
             threads=0, keep_original=True):
    """Turns `model` (a transformers Llama, Qwen2 or Qwen3 causal LM) into its simulated
    `setting` version (W, WA, WAKV, WAKVQ; none/fp change nothing) and returns a SimHandle
    whose remove() restores it.

    method: a scalesweep block-scale selector (absmax, 4over6, sweep-mse, sweep-wmse,
    exhaustive-mse, ...; `sweep` needs a window and is refused as in the native runtime).
    stats: a statistics file of `scalesweep calibrate` (or scalesweep.torch.calibrate), a path
    or a Stats; needed for A, KV, Q and for weighted methods. block: 16 (NVFP4) / 32 (MXFP4)
    when None. keep_original: keep a CPU copy of the FP weights so that remove() restores them
    (False: remove() restores hooks only and says so).
    """
    key, (do_w, do_a, do_kv, do_q), fmt = check_settings(setting, method, format)
    arch = Arch(model)
    block = block or (32 if fmt == "mxfp4" else 16)
    weighted = method in _WEIGHTED
    needs_stats = do_a or do_kv or do_q or (do_w and weighted)
    handle = SimHandle(key.upper() if key not in ("none", "fp") else "FP", method)
    if not (do_w or do_a or do_kv or do_q):
        return handle
    if needs_stats and stats is None:
        raise ValueError(f"setting {handle.setting} with method {method} needs calibration "
                         "statistics (stats=FILE from scalesweep calibrate)")
    if stats is not None and not isinstance(stats, Stats):
        stats = load_stats(stats)
    if stats is not None:
        stats.check(arch.dims(), arch.n_layers, type(model).__name__)
    nv = fmt == "nvfp4"
    C = ss.default_max_block_scale(method)

    def gs_for(amax):
        return ss.global_scale_for_amax(float(amax), C) if nv else None

    def fq(x2d, gs, imp, name):
        """Quantize-dequantize of a 2-D tensor (rows: tokens or output channels)."""
        x32 = x2d.detach().to(torch.float32).contiguous()
        if imp is not None:
            imp = imp.to(device=x32.device)
        if x32.is_cuda and not ss.CUDA:
            raise RuntimeError(f"{name}: a CUDA tensor, but this scalesweep was built without "
                               "CUDA; move the model to the CPU or install a CUDA build")
        y = ss.fake_quantize(x32, method=method, block=block, format=fmt, global_scale=gs,
                             importance=imp if weighted else None, threads=threads, name=name)
        return y.to(dtype=x2d.dtype)

    # Importance of the run-time inputs comes from the FP weights: computed before W.
    input_imp = {}
    state_imp = {}
    if weighted and (do_a or do_kv or do_q):
        hd, group = arch.head_dim, arch.n_heads // arch.n_kv_heads
        for li in range(arch.n_layers):
            for nm in INPUTS:
                input_imp[li, nm] = _col_sqnorms([m for _, m in arch.linears(li, nm)])
            L = stats.layers[li]
            qs = torch.as_tensor(L["q"]["sqnorm"], dtype=torch.float64).view(arch.n_heads, hd)
            ks = torch.as_tensor(L["k"]["sqnorm"], dtype=torch.float64).view(arch.n_kv_heads, hd)
            # Built on the host (the statistics are host arrays), then moved once to the
            # device of the layer's states: not per forward call.
            wo = input_imp[li, "attn_out"].to("cpu", torch.float64).view(arch.n_heads, hd)
            kv_of = torch.arange(arch.n_heads) // group
            dev = arch.linears(li, "attn_in")[0][1].weight.device
            state_imp[li, "q"] = ks[kv_of].reshape(-1).to(dev, torch.float32)
            state_imp[li, "k"] = torch.zeros(arch.n_kv_heads, hd, dtype=torch.float64).index_add_(
                0, kv_of, qs).reshape(-1).to(dev, torch.float32)
            state_imp[li, "v"] = torch.zeros(arch.n_kv_heads, hd, dtype=torch.float64).index_add_(
                0, kv_of, wo).reshape(-1).to(dev, torch.float32)

    try:
        if do_w:
            _quantize_weights(arch, stats, weighted, gs_for, fq, handle, keep_original)
        if do_a:
            _hook_inputs(arch, stats, input_imp, gs_for, fq, handle)
        if do_kv or do_q:
            _hook_states(arch, stats, state_imp, gs_for, fq, handle, block, do_kv, do_q)
    except BaseException:
        handle.remove()
        raise
    return handle


def _quantize_weights(arch, stats, weighted, gs_for, fq, handle, keep_original):
    for li in range(arch.n_layers):
        for nm in INPUTS:
            lins = arch.linears(li, nm)
            amax = max(float(m.weight.detach().abs().max().to(torch.float32)) for _, m in lins)
            gs = gs_for(amax)
            imp = None
            if weighted:
                imp = torch.as_tensor(stats.layers[li][nm]["diag"]).to(torch.float32)
            for name, lin in lins:
                w = lin.weight
                orig = w.detach().to("cpu", copy=True) if keep_original else None
                with torch.no_grad():
                    w.copy_(fq(w, gs, imp, name + ".weight"))
                if orig is not None:
                    def undo(w=w, orig=orig):
                        with torch.no_grad():
                            w.copy_(orig.to(w.device))
                    handle._undo.append(undo)
    if not keep_original:
        def note():
            import warnings
            warnings.warn("scalesweep.torch: simulate(keep_original=False): the weights stay "
                          "quantized after remove()", stacklevel=3)
        handle._undo.insert(0, note)


def _hook_inputs(arch, stats, input_imp, gs_for, fq, handle):
    for li in range(arch.n_layers):
        for nm in INPUTS:
            gs = gs_for(stats.layers[li][nm]["amax"])
            imp = input_imp.get((li, nm))
            cache = {"src": None, "out": None}  # q/k/v (gate/up) read one quantized input
            name = f"model.layers.{li}.{nm}"

            def pre(module, args, kwargs, gs=gs, imp=imp, cache=cache, name=name):
                x = args[0] if args else kwargs["input"]
                if cache["src"] is not x:
                    y = fq(x.reshape(-1, x.shape[-1]), gs, imp, name).view(x.shape)
                    cache["src"], cache["out"] = x, y
                y = cache["out"]
                if args:
                    return (y,) + tuple(args[1:]), kwargs
                kwargs = dict(kwargs)
                kwargs["input"] = y
                return args, kwargs

            for _, lin in arch.linears(li, nm):
                h = lin.register_forward_pre_hook(pre, with_kwargs=True)
                handle._undo.append(h.remove)
            handle._undo.append(lambda cache=cache: cache.update(src=None, out=None))


def _hook_states(arch, stats, state_imp, gs_for, fq, handle, block, do_kv, do_q):
    hd = arch.head_dim
    per_head = not (hd < block or hd % block == 0)  # blocks would straddle heads: per head
    gss = [{nm: gs_for(stats.layers[li][nm]["amax"]) for nm in ("q", "k", "v")}
           for li in range(arch.n_layers)]

    def quant(x, li, nm):
        b, h, s, d = x.shape
        rows = x.transpose(1, 2).reshape(b * s, h * d)
        imp = state_imp.get((li, nm))
        name = f"model.layers.{li}.{nm}"
        if per_head:
            parts = [fq(rows[:, i * d:(i + 1) * d], gss[li][nm],
                        None if imp is None else imp[i * d:(i + 1) * d], f"{name}.head{i}")
                     for i in range(h)]
            y = torch.cat(parts, dim=1)
        else:
            y = fq(rows, gss[li][nm], imp, name)
        return y.view(b, s, h, d).transpose(1, 2)

    def fn(li, q, k, v):
        if do_kv:
            k, v = quant(k, li, "k"), quant(v, li, "v")
        if do_q:
            q = quant(q, li, "q")
        return q, k, v

    handle._undo.append(arch.hook_attention(fn))
