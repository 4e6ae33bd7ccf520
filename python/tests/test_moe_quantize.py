"""Quantization and compressed-tensors export of mixture-of-experts models (issue 26 items 3-4).

Tiny random Qwen3-MoE and Mixtral (test_moe_runtime.build) with layer 1's router zeroed, so
that transformers' topk ties send every token to the same two experts there and the others never
see a calibration token. `scalesweep quantize` writes compressed-tensors checkpoints:
(a) per-expert names as vLLM's MoE loader reads them (model.layers.L.mlp.experts.E.{gate,up,
    down}_proj / block_sparse_moe.experts.E.{w1,w3,w2} . weight_packed, weight_scale,
    weight_global_scale, input_global_scale with W4A4), each expert's gate and up sharing one
    weight_global_scale, the router dense and in quantization_config.ignore;
(b) experts without enough routed tokens are named as quantized data-free (RTN sweep-mse for
    sweep-wmse), with --gptq too; the others are not;
(c) W4A4: every expert's input_global_scale is finite and positive; an expert without tokens
    takes its layer's largest calibrated input amax (the smallest input global scale among the
    layer's calibrated experts, for gate/up and for down);
(d) the compressed-tensors library decompresses every NVFP4 Linear to our dequantized weight
    (fl(q * s) / gs from the codes) within one rounding of its output dtype (bf16), and its
    dequantization carried out in float32 within 2^-22 relative per weight (q * fl(s / gs) vs
    fl(q * s) / gs); transformers' NLL of the model with those float32 weights agrees with
    `scalesweep ppl` on our W4A16 checkpoint within 1e-4 nats/token (measured figures printed);
(e) a W4A4 checkpoint runs in our runtime with every expert quantizing the rows routed to it
    with its own input_global_scale (the router on the unquantized states, as vLLM's NVFP4 MoE
    method loads [E, 2] and [E] input scales), and scores transformers' NLL of the weights
    the compressed-tensors library decompresses (W4A4 scheme) with the same activation
    quantization (an independent numpy NVFP4 absmax, hooked
    into every Linear input and every expert's gathered rows) within W4A4_TOL; a missing,
    zero or NaN expert input_global_scale is refused by name (GGUF outputs: test_moe_gguf.py).
Skips visibly without torch/transformers/compressed-tensors or the shared data.
"""
import copy
import json
import os
import types

import numpy as np
import pytest

from cli_common import need_bin, need_files, MODEL, VAL

torch = pytest.importorskip("torch", reason="torch not installed (tiny reference models)")
pytest.importorskip("transformers", reason="transformers not installed (tiny reference models)")
from safetensors.torch import load_file as tload, save_file as tsave  # noqa: E402

import test_moe_runtime as rt  # noqa: E402

pytestmark = [need_bin, need_files(MODEL, VAL)]
setup = rt.setup
CALIB = ["--calib-nsamples", "4", "--calib-seqlen", "64", "--calib-seed", "1"]
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)
NLL_TOL = 1e-5
W4A4_TOL = 1e-5  # measured: |diff| <= 1.1e-7 (qwen3_moe RTN, mixtral GPTQ, qwen3_moe_sparse)


def zero_router(model, path, layer=1):
    f = os.path.join(path, "model.safetensors")
    sd = tload(f)
    key = [k for k in sd if k.startswith(f"model.layers.{layer}.") and k.endswith("gate.weight")
           and "experts" not in k]
    assert len(key) == 1, key
    sd[key[0]].zero_()
    tsave(sd, f, metadata={"format": "pt"})
    blk = model.model.layers[layer].mlp
    with torch.no_grad():
        blk.gate.weight.zero_()
    n = blk.gate.weight.shape[0]
    k = model.config.num_experts_per_tok
    return sorted(torch.topk(torch.full((n,), 1.0 / n), k).indices.tolist()), n


def names(cfg_name, l, e):
    if cfg_name == "mixtral":
        b = f"model.layers.{l}.block_sparse_moe."
        return b + "gate", [b + f"experts.{e}.{w}" for w in ("w1", "w3", "w2")]
    b = f"model.layers.{l}.mlp."
    return b + "gate", [b + f"experts.{e}.{w}" for w in ("gate_proj", "up_proj", "down_proj")]


def fp8_e4m3(u8):
    return torch.from_numpy(u8.view(np.uint8).copy()).view(torch.float8_e4m3fn).float().numpy()


def our_dequant(t, prefix):
    p = t[prefix + ".weight_packed"]
    rows, half = p.shape
    codes = np.empty((rows, half * 2), dtype=np.uint8)
    codes[:, 0::2] = p & 15
    codes[:, 1::2] = p >> 4
    q = np.where(codes & 8, -E2M1[codes & 7], E2M1[codes & 7]).astype(np.float32)
    s = np.repeat(fp8_e4m3(t[prefix + ".weight_scale"]), 16, axis=1)[:, :q.shape[1]]
    gs = np.float32(t[prefix + ".weight_global_scale"][0])
    return (q * s).astype(np.float32) / gs


def library_f32(tt, prefix, scheme):
    """The library's NVFP4 dequantization (its unpack, scale decoding and `dequantize`) carried
    out in float32: its registry's decompress returns bfloat16, whose rounding alone moves a
    tiny random model's NLL by ~1e-2 nats."""
    try:
        from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
        from compressed_tensors.quantization.lifecycle.forward import dequantize
        comp = ctl_module().nvfp4_compressor()
        dec_scale = comp._decompress_scale
    except (ImportError, AttributeError) as e:
        pytest.skip(f"compressed-tensors {e}: no float32 path to its NVFP4 dequantization")
    packed = tt[prefix + ".weight_packed"]
    m, n = packed.shape
    q = unpack_fp4_from_uint8(packed, m, n * 2, dtype=torch.float32)
    scale = dec_scale(tt[prefix + ".weight_scale"], torch.float32)
    return dequantize(x_q=q, scale=scale, args=scheme.weights,
                      global_scale=tt[prefix + ".weight_global_scale"], dtype=torch.float32)


def ctl_module():
    import test_compressed_tensors_lib as ctl
    return ctl


def quantize(path, out, text, *extra):
    p = rt.run("quantize", path, "-o", out, "--calib", text, *CALIB, "--json", *extra)
    return json.loads(p.stdout)


def tensors_of(out):
    """Every tensor as numpy (E4M3 scales as their bytes)."""
    t = {}
    for f in os.listdir(out):
        if f.endswith(".safetensors"):
            for k, v in tload(os.path.join(out, f)).items():
                t[k] = v.view(torch.uint8).numpy() if v.dtype == torch.float8_e4m3fn else v.numpy()
    return t


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_checkpoint_layout_fallback_and_input_scales(setup, name):
    d, base, text, ids = setup
    model, path = rt.build(d, base, name, seed=5)
    picked, E = zero_router(model, path)
    L = model.config.num_hidden_layers
    for quant, extra in (("W", ["--method", "sweep-wmse"]),
                         ("WA", ["--method", "sweep-wmse", "--gptq", "--quant", "WA"])):
        out = str(d / f"{name}_{quant}")
        j = quantize(path, out, text, *extra)
        cfg = json.load(open(os.path.join(out, "config.json")))
        qc = cfg["quantization_config"]
        t = tensors_of(out)
        by_name = {x["name"]: x for x in j["linears"]}
        for l in range(L):
            router, _ = names(name, l, 0)
            assert router in qc["ignore"]
            assert t[router + ".weight"].shape == (E, 64)
            gs_own = {0: [], 1: []}
            for e in range(E):
                _, lin = names(name, l, e)
                g, u, dn = lin
                for p in lin:
                    for k in ("weight_packed", "weight_scale", "weight_global_scale"):
                        assert p + "." + k in t, p + "." + k
                    assert (p + ".input_global_scale" in t) == (quant == "WA"), p
                    assert p + ".weight" not in t
                # gate and up share one global scale (the fused w13 group)
                assert t[g + ".weight_global_scale"][0] == t[u + ".weight_global_scale"][0]
                r = by_name[g]
                assert r["expert"] == e
                if l == 1:
                    assert r["data_free"] == (e not in picked), (g, r)
                    assert r["routed_tokens"] == (256 if e in picked else 0)
                if quant == "WA":
                    for grp, p in ((0, g), (0, u), (1, dn)):
                        v = float(t[p + ".input_global_scale"][0])
                        assert np.isfinite(v) and v > 0, p
                        assert by_name[p]["input_global_scale"] == pytest.approx(v, rel=0, abs=0)
                        if by_name[p]["input_scale_source"] == "own":
                            gs_own[grp].append(v)
            if quant == "WA" and l == 1:
                for e in range(E):
                    if e in picked:
                        continue
                    g, u, dn = names(name, l, e)[1]
                    assert by_name[g]["input_scale_source"] == "layer-max"
                    assert float(t[g + ".input_global_scale"][0]) == min(gs_own[0])
                    assert float(t[dn + ".input_global_scale"][0]) == min(gs_own[1])
        fb = j.get("data_free_experts", "")
        for e in range(E):
            assert (f"layer 1 expert {e} (0 tokens)" in fb) == (e not in picked), fb
    # The runtime runs the W4A4 checkpoint as declared (test_w4a4_moe_checkpoint_... below
    # judges its NLL).
    j = json.loads(rt.run("ppl", str(d / f"{name}_WA"), "--text", text, "--max-tokens", "50",
                          "--json").stdout)
    assert (j["quant"], j["source"]) == ("WA", "checkpoint")
    assert not os.path.exists(str(d / f"{name}.gguf"))


def w4a4_reference_nll(model, name, out, ids, acts=True, weights=None):
    """transformers' NLL of the checkpoint `out` run as W4A4: every NVFP4 Linear's weight
    dequantized from its codes (our_dequant), and the input of every NVFP4 Linear through
    NVFP4 absmax with its stored input_global_scale (the largest of the Linears reading it):
    q/k/v and o_proj by forward pre-hooks, each expert on the rows routed to it (its gate/up
    input and its down input) by a copy of transformers' eager expert loop. Dense Linears
    (quantization_config.ignore) and the router see full precision. acts=False: the weights
    alone. `weights`: {prefix: float32 tensor} to use instead of our_dequant (the library's)."""
    from test_model_kv_reference import fake_quant
    t = tensors_of(out)

    def gs_of(*prefixes):
        v = [float(t[p + ".input_global_scale"][0]) for p in prefixes
             if p + ".input_global_scale" in t]
        return max(v) if v else None

    def fq(x, gs):
        if gs is None or not acts:
            return x
        y = fake_quant(x.detach().reshape(-1, x.shape[-1]).numpy(), gs)
        return torch.from_numpy(y).reshape(x.shape)

    def hook(gs):
        return lambda mod, args: (fq(args[0], gs),) + tuple(args[1:])

    def set_weight(param, prefix):
        if weights is not None and prefix in weights:
            param.copy_(weights[prefix])
        elif prefix + ".weight_packed" in t:
            param.copy_(torch.from_numpy(our_dequant(t, prefix)))

    m = copy.deepcopy(model)
    handles = []
    with torch.no_grad():
        for l, layer in enumerate(m.model.layers):
            att = f"model.layers.{l}.self_attn."
            gs_in = gs_of(*(att + p for p in ("q_proj", "k_proj", "v_proj")))
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                mod = getattr(layer.self_attn, proj)
                set_weight(mod.weight, att + proj)
                gs = gs_of(att + "o_proj") if proj == "o_proj" else gs_in
                handles.append(mod.register_forward_pre_hook(hook(gs)))
            block = layer.mlp if hasattr(layer, "mlp") else layer.block_sparse_moe
            if not hasattr(block, "experts"):  # a dense layer
                mlp = f"model.layers.{l}.mlp."
                gs_up = gs_of(mlp + "gate_proj", mlp + "up_proj")
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    mod = getattr(block, proj)
                    set_weight(mod.weight, mlp + proj)
                    gs = gs_of(mlp + "down_proj") if proj == "down_proj" else gs_up
                    handles.append(mod.register_forward_pre_hook(hook(gs)))
                continue
            ex = block.experts
            E, inter = ex.down_proj.shape[0], ex.down_proj.shape[2]
            gs_e = []
            for e in range(E):
                g, u, dn = names(name, l, e)[1]
                set_weight(ex.gate_up_proj[e, :inter], g)
                set_weight(ex.gate_up_proj[e, inter:], u)
                set_weight(ex.down_proj[e], dn)
                gs_e.append((gs_of(g, u), gs_of(dn)))

            def forward(self, h, top_k_index, top_k_weights, gs_e=gs_e):
                out = torch.zeros_like(h)
                for e in range(self.num_experts):
                    tok, pos = torch.where(top_k_index == e)
                    if tok.numel() == 0:
                        continue
                    x = fq(h[tok], gs_e[e][0])
                    gate, up = torch.nn.functional.linear(x, self.gate_up_proj[e]).chunk(2, -1)
                    y = fq(self.act_fn(gate) * up, gs_e[e][1])
                    y = torch.nn.functional.linear(y, self.down_proj[e])
                    out.index_add_(0, tok, y * top_k_weights[tok, pos, None])
                return out
            ex.forward = types.MethodType(forward, ex)
    nll = rt.hf_nll(m, ids)
    for h in handles:
        h.remove()
    return nll


@pytest.mark.parametrize("name, extra", [
    ("qwen3_moe", []),
    ("mixtral", ["--gptq"]),
    ("qwen3_moe_sparse", ["--method", "absmax"]),  # dense layers between MoE layers
])
def test_w4a4_moe_checkpoint_runs_as_the_reference_quantizes(setup, name, extra):
    d, base, text, ids = setup
    model, path = rt.build(d, base, name, seed=9)
    zero_router(model, path)  # layer 1: most experts take the layer's largest input amax
    out = str(d / f"{name}_w4a4_{len(os.listdir(d))}")
    quantize(path, out, text, "--quant", "WA", *extra)
    ours = json.loads(rt.run("ppl", out, "--text", text, "--max-tokens", str(rt.N), "--ctx",
                             str(rt.N), "--bos", "--json").stdout)
    assert (ours["quant"], ours["source"], ours["method"]) == ("WA", "checkpoint", "absmax")
    # The compressed-tensors library reads the W4A4 scheme and decompresses every NVFP4 Linear
    # (in float32) to our weights within 2^-22; the reference then runs on its weights.
    lib_w, source = None, "our dequantization (compressed-tensors not installed)"
    try:
        from compressed_tensors.quantization import QuantizationConfig
    except ImportError:
        QuantizationConfig = None
    if QuantizationConfig is not None:
        qc = json.load(open(os.path.join(out, "config.json")))["quantization_config"]
        scheme = QuantizationConfig.model_validate(qc).config_groups["group_0"]
        assert scheme.input_activations is not None and scheme.input_activations.num_bits == 4
        tt, tn = {}, tensors_of(out)
        for f in os.listdir(out):
            if f.endswith(".safetensors"):
                tt.update(tload(os.path.join(out, f)))
        lib_w = {}
        for k in tt:
            if k.endswith(".weight_packed"):
                prefix = k[: -len(".weight_packed")]
                lib_w[prefix] = library_f32(tt, prefix, scheme)
                ours_w = our_dequant(tn, prefix)
                err = (np.abs(lib_w[prefix].numpy() - ours_w) /
                       np.maximum(np.abs(ours_w), 1e-30)).max()
                assert err <= 2 ** -22, (prefix, err)
        assert any(".experts." in p for p in lib_w)
        source = "the compressed-tensors library's weights"
    ref = w4a4_reference_nll(model, name, out, ids, weights=lib_w)
    print(f"{name} W4A4 {' '.join(extra)}: NLL ours {ours['nll_per_token']:.7f}, transformers "
          f"on {source} with the same NVFP4 activations {ref:.7f}, "
          f"diff {ours['nll_per_token'] - ref:+.2e}")
    assert abs(ours["nll_per_token"] - ref) <= W4A4_TOL
    # The check can fail: the same weights without the activation quantization score apart.
    weights_only = w4a4_reference_nll(model, name, out, ids, acts=False, weights=lib_w)
    assert abs(weights_only - ref) > 10 * W4A4_TOL, (weights_only, ref)


@pytest.mark.parametrize("value, want", [
    (None, "input_global_scale' is missing"),
    (0.0, "is not a finite positive global scale"),
    (float("nan"), "is not a finite positive global scale"),
])
def test_w4a4_moe_bad_expert_input_scale_named(setup, value, want):
    d, base, text, ids = setup
    model, path = rt.build(d, base, "qwen3_moe", seed=9)
    out = str(d / f"w4a4_bad_{len(os.listdir(d))}")
    quantize(path, out, text, "--quant", "WA")
    victim = names("qwen3_moe", 1, 3)[1][2] + ".input_global_scale"  # expert 3's down_proj
    f = [os.path.join(out, x) for x in os.listdir(out) if x.endswith(".safetensors")]
    assert len(f) == 1
    sd = tload(f[0])
    assert victim in sd
    if value is None:
        del sd[victim]
    else:
        sd[victim] = torch.full_like(sd[victim], value)
    tsave(sd, f[0], metadata={"format": "pt"})
    p = rt.run("ppl", out, "--text", text, "--max-tokens", "50", ok=False)
    assert p.returncode != 0 and want in p.stderr and victim in p.stderr, p.stderr


@pytest.mark.parametrize("name, extra", [
    ("qwen3_moe", ["--method", "sweep-wmse"]),
    ("mixtral", ["--method", "sweep-wmse"]),
    ("qwen3_moe_sparse", ["--gptq", "--calib-all-experts"]),  # dense layers between MoE layers
    ("mixtral", ["--gptq", "--no-stream"]),
])
def test_library_decompresses_and_transformers_agrees(setup, name, extra):
    ct = pytest.importorskip("compressed_tensors", reason="compressed-tensors not installed")
    from compressed_tensors.quantization import QuantizationConfig
    import test_compressed_tensors_lib as ctl
    d, base, text, ids = setup
    model, path = rt.build(d, base, name, seed=6)
    zero_router(model, path)
    out = str(d / f"{name}_lib_{len(os.listdir(d))}")
    j = quantize(path, out, text, *extra)
    if "--calib-all-experts" in extra:  # every expert's statistics hold every token
        assert "data_free_experts" not in j
        assert not any(x.get("data_free") for x in j["linears"])
    qc = json.load(open(os.path.join(out, "config.json")))["quantization_config"]
    scheme = QuantizationConfig.model_validate(qc).config_groups["group_0"]
    tt = {}
    for f in os.listdir(out):
        if f.endswith(".safetensors"):
            tt.update(tload(os.path.join(out, f)))
    tn = tensors_of(out)
    worst = 0.0
    lib_w = {}
    for k in tt:
        if not k.endswith(".weight_packed"):
            continue
        prefix = k[: -len(".weight_packed")]
        lib = ctl.decompress_with_library(tt, prefix, scheme).float().numpy()
        ours = our_dequant(tn, prefix)
        err = np.abs(lib - ours).max() / np.abs(ours).max()
        assert err <= 2 ** -8, (prefix, err)  # one rounding of its output dtype (bf16) at most
        f32 = library_f32(tt, prefix, scheme)
        err32 = (np.abs(f32.numpy() - ours) / np.maximum(np.abs(ours), 1e-30)).max()
        worst = max(worst, err32)
        assert err32 <= 2 ** -22, (prefix, err32)  # q * fl(s / gs) vs fl(q * s) / gs
        lib_w[prefix] = f32
    assert any(".experts." in p for p in lib_w)
    # transformers on the library's weights (fused expert parameters filled per expert).
    L = model.config.num_hidden_layers
    with torch.no_grad():
        for l in range(L):
            layer = model.model.layers[l]
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(layer.self_attn, proj).weight.copy_(
                    lib_w[f"model.layers.{l}.self_attn.{proj}"])
            if not hasattr(layer.mlp, "experts"):  # a dense layer
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    getattr(layer.mlp, proj).weight.copy_(lib_w[f"model.layers.{l}.mlp.{proj}"])
                continue
            ex = layer.mlp.experts
            E = ex.down_proj.shape[0]
            inter = ex.down_proj.shape[2]
            for e in range(E):
                g, u, dn = names(name, l, e)[1]
                ex.gate_up_proj[e, :inter].copy_(lib_w[g])
                ex.gate_up_proj[e, inter:].copy_(lib_w[u])
                ex.down_proj[e].copy_(lib_w[dn])
    ref = rt.hf_nll(model, ids)
    ours = rt.our_nll(out, text)
    print(f"{name} {' '.join(extra)}: NLL ours {ours:.7f}, transformers on the decompressed "
          f"weights {ref:.7f}, diff {ours - ref:+.2e}; worst weight difference {worst:.2e}")
    assert abs(ours - ref) <= NLL_TOL
