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
(e) a W4A4 checkpoint run by the runtime is refused by name (GGUF outputs: test_moe_gguf.py).
Skips visibly without torch/transformers/compressed-tensors or the shared data.
"""
import json
import os

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
    # The runtime refuses the W4A4 checkpoint (its experts' inputs are not quantized).
    p = rt.run("ppl", str(d / f"{name}_WA"), "--text", text, "--max-tokens", "50", ok=False)
    assert p.returncode != 0 and "W4A4 (input_activations) mixture-of-experts" in p.stderr
    assert not os.path.exists(str(d / f"{name}.gguf"))


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
