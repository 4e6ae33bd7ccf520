"""NVFP4 GGUF of mixture-of-experts models (issue 26 item 4), judged by our reader, gguf-py and
llama.cpp (llama-cpp-python 0.3.36).

llama.cpp's layout (its qwen3moe and llama-with-experts, i.e. Mixtral, graphs; llama-model.cpp
loads `blk.N.ffn_{gate,up,down}_exps.scale` F32 {n_expert} and build_moe_ffn multiplies each
selected expert's output by its entry): every expert's Linear stacked in one NVFP4 tensor per
projection, one scale per expert = fl(1/gs) of that expert's compressed-tensors global scale,
the router `ffn_gate_inp` F32. Tiny random Qwen3-MoE and Mixtral built by transformers
(test_moe_runtime.build; experts 64 wide, as ggml's 64-element NVFP4 super-blocks need):
(a) `quantize -o X.gguf` (RTN sweep-mse, and GPTQ sweep-wmse) scores in our runtime as the
    compressed-tensors checkpoint of the same run (within CT_TOL: the GGUF multiplies by
    fl(1/gs) where the checkpoint divides by gs);
(b) each `.scale` holds exactly fl(1/gs) of the checkpoint's expert global scales (gguf-py);
(c) llama.cpp's NLL on the GGUF agrees with ours on the same windows (QUANT_NLL_TOL: llama.cpp
    rounds activations to 8 bits against NVFP4, and a router's near ties then pick other experts
    now and then), and with every expert scale set to 0 llama.cpp still agrees with our runtime
    on that file (so the scales are read, not ignored);
(d) a non-finite per-expert scale is refused by our reader, naming the tensor and expert;
(e) what llama.cpp's MoE graphs cannot run is refused by name before anything is written:
    experts whose rows are no whole number of 64-element super-blocks, dense layers between
    expert layers, norm_topk_prob = false.
Skips visibly without torch/transformers, gguf-py, llama_cpp (its checks only) or the shared data.
"""
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from cli_common import need_bin, need_files, MODEL, VAL

torch = pytest.importorskip("torch", reason="torch not installed (tiny reference models)")
pytest.importorskip("transformers", reason="transformers not installed (tiny reference models)")
gguf = pytest.importorskip("gguf", reason="gguf-py not installed")
from safetensors import safe_open  # noqa: E402

import test_moe_runtime as rt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import llama_cpp_judge as lj  # noqa: E402

pytestmark = [need_bin, need_files(MODEL, VAL)]
need_llama_cpp = pytest.mark.skipif(lj.import_llama_cpp() is None,
                                    reason="llama_cpp not installed (scripts/get-llama-cpp.sh)")
setup = rt.setup
WIDE = {"qwen3_moe": dict(moe_intermediate_size=64), "mixtral": dict(intermediate_size=64)}
CALIB = ["--calib-nsamples", "4", "--calib-seqlen", "64", "--calib-seed", "1"]
CT_TOL = 1e-4        # as for dense models (docs/GGUF.md)
# llama.cpp rounds activations to 8 bits against NVFP4 weights: on these random tiny models
# (NLL near 9) ours - llama.cpp measured +6.2e-3 (qwen3moe) and -2.34e-2 (Mixtral), where the
# dense ones of test_gguf_archs reach 1.7e-2 (its QUANT_NLL_TOL 2e-2); ignored expert scales
# would move llama.cpp's NLL by far more (the doubled-scale check below).
QUANT_NLL_TOL = 3e-2
RECIPES = {"rtn": ["--method", "sweep-mse"], "gptq": ["--method", "sweep-wmse", "--gptq"]}


def quantized(setup, name, recipe):
    """(GGUF path, compressed-tensors dir) of one run of `recipe` on the tiny model."""
    d, base, text, _ = setup
    _, path = rt.build(d, base, name, seed=7, **WIDE[name])
    args = [*RECIPES[recipe], *(["--calib", text, *CALIB] if recipe == "gptq" else []), "--force"]
    g, ct = str(d / f"{name}-{recipe}.gguf"), str(d / f"{name}-{recipe}-ct")
    rt.run("quantize", path, "-o", g, *args)
    rt.run("quantize", path, "-o", ct, *args)
    return g, ct


def expert_global_scales(ct, layer, proj, n):
    """The compressed-tensors weight_global_scale of each expert's `proj` in `layer`."""
    with safe_open(os.path.join(ct, "model.safetensors"), framework="pt") as f:
        keys = list(f.keys())
        out = []
        for e in range(n):
            k = [k for k in keys if k.startswith(f"model.layers.{layer}.")
                 and (f"experts.{e}.{proj}." in k) and k.endswith("weight_global_scale")]
            assert len(k) == 1, (layer, e, proj, k)
            out.append(np.float32(f.get_tensor(k[0]).float().reshape(-1)[0].item()))
    return np.array(out, dtype=np.float32)


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_moe_gguf_scores_as_the_checkpoint(setup, name, recipe):
    _, base, text, _ = setup
    g, ct = quantized(setup, name, recipe)
    tok = os.path.join(base, "tokenizer.json")
    ours_ct, ours_g = rt.our_nll(ct, text), rt.our_nll(g, text, "--tokenizer", tok)
    print(f"{name} {recipe}: checkpoint {ours_ct:.8f} GGUF {ours_g:.8f} "
          f"diff {ours_g - ours_ct:+.2e}")
    assert abs(ours_g - ours_ct) < CT_TOL
    r = gguf.GGUFReader(g)
    tensors = {t.name: t for t in r.tensors}
    cfg = json.load(open(os.path.join(ct, "config.json")))
    E = cfg.get("num_experts") or cfg["num_local_experts"]
    hf = {"gate": ("gate_proj", "w1"), "up": ("up_proj", "w3"), "down": ("down_proj", "w2")}
    for l in range(cfg["num_hidden_layers"]):
        assert tensors[f"blk.{l}.ffn_gate_inp.weight"].tensor_type == gguf.GGMLQuantizationType.F32
        for proj, names in hf.items():
            w = tensors[f"blk.{l}.ffn_{proj}_exps.weight"]
            assert w.tensor_type == gguf.GGMLQuantizationType.NVFP4
            s = np.asarray(tensors[f"blk.{l}.ffn_{proj}_exps.scale"].data, dtype=np.float32)
            hf_name = names[1] if name == "mixtral" else names[0]
            gs = expert_global_scales(ct, l, hf_name, E)
            np.testing.assert_array_equal(s.reshape(-1), np.float32(1) / gs)


@need_llama_cpp
@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_llama_cpp_runs_our_moe_gguf(setup, name):
    from test_llama_cpp import judged_nll
    d, _, text, _ = setup
    g, _ = quantized(setup, name, "rtn")
    wiki = Path(text)
    ours, theirs = judged_nll(g, wiki, ctx=64, max_tokens=256)
    assert abs(ours - theirs) <= QUANT_NLL_TOL
    # The scales are read: with every expert scale 0 (the experts add nothing) llama.cpp
    # still agrees with our runtime on that file, which differs from the model by far more than
    # the tolerance; had llama.cpp ignored the scales, it would use the raw NVFP4 values, gs
    # (~10^3..10^4) times too large.
    bad = str(d / f"{name}-zero-scales.gguf")
    with open(g, "rb") as f:
        data = bytearray(f.read())
    r = gguf.GGUFReader(g)
    for t in r.tensors:
        if t.name.endswith("_exps.scale"):
            off = t.data_offset
            v = np.frombuffer(data, dtype=np.float32, count=t.n_elements, offset=off) * 0
            data[off:off + 4 * t.n_elements] = v.astype(np.float32).tobytes()
    with open(bad, "wb") as f:
        f.write(data)
    ours_bad, theirs_bad = judged_nll(bad, wiki, ctx=64, max_tokens=256)
    print(f"{name}: expert scales 0: ours {ours_bad:.6f} ({ours_bad - ours:+.4f}), llama.cpp "
          f"{theirs_bad:.6f}")
    assert abs(ours_bad - ours) > 3 * QUANT_NLL_TOL  # measured 0.11 (qwen3moe), 0.36 (Mixtral)
    assert abs(theirs_bad - ours_bad) <= QUANT_NLL_TOL


@pytest.mark.parametrize("name,extra,want", [
    ("qwen3_moe", dict(moe_intermediate_size=32), "expert down row length 32"),
    ("qwen3_moe_sparse", dict(moe_intermediate_size=64), "has a dense MLP between expert layers"),
    ("qwen3_moe_unnormed", dict(moe_intermediate_size=64), "norm_topk_prob = false"),
])
def test_moe_gguf_refusals(setup, name, extra, want):
    d, base, _, _ = setup
    _, path = rt.build(d, base, name, seed=8, **extra)
    out = d / f"{name}-refused.gguf"
    p = rt.run("quantize", path, "-o", str(out), "--method", "absmax", ok=False)
    assert p.returncode != 0 and want in p.stderr, p.stderr
    assert not out.exists()


def test_bad_expert_scale_is_named(setup):
    """Our reader refuses a non-finite per-expert scale, naming the tensor and the expert."""
    d, base, text, _ = setup
    g, _ = quantized(setup, "qwen3_moe", "rtn")
    with open(g, "rb") as f:
        data = bytearray(f.read())
    t = next(t for t in gguf.GGUFReader(g).tensors if t.name == "blk.1.ffn_down_exps.scale")
    off = t.data_offset + 4 * 2  # expert 2
    data[off:off + 4] = np.array([np.nan], dtype=np.float32).tobytes()
    bad = str(d / "nan-scale.gguf")
    with open(bad, "wb") as f:
        f.write(data)
    p = rt.run("ppl", bad, "--text", text, "--max-tokens", "50", "--tokenizer",
               os.path.join(base, "tokenizer.json"), ok=False)
    assert p.returncode != 0
    assert "tensor 'blk.1.ffn_down_exps.scale' [2] = nan is not finite" in p.stderr, p.stderr
