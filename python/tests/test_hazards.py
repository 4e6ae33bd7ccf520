"""Numeric hazards (issue 14, part 4): all-zero tensors, rows, blocks and activations; NaN/Inf in
weights, activations and statistics files; subnormal inputs; amax so large or so small that
6C/amax overflows or underflows float; bf16 inputs with Inf.

Every output: global scales finite and > 0, no E4M3 NaN pattern (0x7F/0xFF) among the block
scales, dequantized values finite. Bad input is refused naming the file, tensor and index.
Checked through the Python module and the CLI (`tensor`, `quantize`, `calibrate`, `ppl`)."""
import json
import math
import os
import subprocess

import numpy as np
import pytest

from cli_common import BIN, MODEL, TOK, VAL, need_bin, need_data

ml_dtypes = pytest.importorskip("ml_dtypes")
# safetensors' numpy backend looks the FP8 dtype up on numpy itself.
if not hasattr(np, "float8_e4m3fn"):
    np.float8_e4m3fn = ml_dtypes.float8_e4m3fn
F32 = np.finfo(np.float32)
METHODS = ["absmax", "4over6", "sweep-mse", "sweep-wmse", "exhaustive-mse", "opt-fp8-mse",
           "opt-fp8-wmse"]


def hazard(kind, rows=4, cols=64):
    x = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    if kind == "zeros":
        return np.zeros_like(x)
    if kind == "zero-row":
        x[1] = 0
    elif kind == "zero-block":
        x[2, 16:32] = 0
    elif kind == "amax-flt-max":  # 6C/amax underflows towards FLT_MIN
        x = (x / np.abs(x).max() * F32.max).astype(np.float32)
    elif kind == "one-flt-max":
        x[0, 0] = F32.max
    elif kind == "subnormal":  # every element subnormal: 6C/amax overflows float
        x = (x * np.float32(1e-42)).astype(np.float32)
    elif kind == "min-subnormal":
        x = np.zeros_like(x)
        x[3, 63] = np.float32(1e-45)
    elif kind == "subnormal-row":
        x[0] *= np.float32(1e-40)
    elif kind == "wide":  # 1e30 next to 1e-30
        x[0] *= np.float32(1e30)
        x[1] *= np.float32(1e-30)
    else:
        raise ValueError(kind)
    return x


KINDS = ["zeros", "zero-row", "zero-block", "amax-flt-max", "one-flt-max", "subnormal",
         "min-subnormal", "subnormal-row", "wide"]


def assert_sane(q):
    gs = q.global_scale
    assert math.isfinite(gs) and gs > 0, gs
    sc = np.asarray(q.scales)
    assert not ((sc & 0x7F) == 0x7F).any(), "an E4M3 NaN pattern among the block scales"
    d = np.asarray(q.dequantize())
    assert np.isfinite(d).all(), np.argwhere(~np.isfinite(d))[:4]
    return d


@pytest.fixture(scope="module")
def ss():
    return pytest.importorskip("scalesweep", reason="the scalesweep module is not built")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("method", METHODS)
def test_module_outputs_stay_finite(ss, kind, method):
    x = hazard(kind)
    imp = np.ones(x.shape[1], np.float32) if "wmse" in method else None
    ref = None
    for threads in (1, 0):  # one thread and all: the same bytes
        bmax = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)  # FLT_MAX rounds to Inf in bf16
        for xx in (x, np.clip(x, -bmax, bmax).astype(ml_dtypes.bfloat16)):
            q = ss.quantize(xx, method=method, importance=imp, threads=threads)
            d = assert_sane(q)
            if xx is x:
                if ref is None:
                    ref = (np.asarray(q.codes).copy(), np.asarray(q.scales).copy(), q.global_scale)
                else:
                    assert (np.asarray(q.codes) == ref[0]).all()
                    assert (np.asarray(q.scales) == ref[1]).all() and q.global_scale == ref[2]
            if kind in ("zeros",):
                assert (d == 0).all()
    fq = np.asarray(ss.fake_quantize(x, method=method, importance=imp))
    assert np.isfinite(fq).all()
    # MXFP4 (scales up to 2^127, no global scale) and the opt-fp32 reconstruction.
    mx = ss.quantize(x, method=method, importance=imp, format="mxfp4", block=32)
    assert np.isfinite(np.asarray(mx.dequantize())).all()
    assert np.isfinite(np.asarray(ss.fake_quantize(x, method="opt-fp32"))).all()
    ev = ss.evaluate(x, method=method, importance=imp)
    for k, v in ev.items():
        if isinstance(v, float):
            assert not math.isnan(v), (k, v)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("bad, word", [(np.nan, "NaN"), (np.inf, "infinite"),
                                       (-np.inf, "infinite")])
@pytest.mark.parametrize("threads", [1, 0])
def test_module_refuses_non_finite_with_the_index(ss, dtype, bad, word, threads):
    x = hazard("zero-row")
    x[2, 5] = bad
    xx = x if dtype == "f32" else x.astype(ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match=rf"tensor 'w': element \[2, 5\] is {word}"):
        ss.quantize(xx, threads=threads, name="w")


def test_module_global_scale_for_amax(ss):
    assert ss.global_scale_for_amax(0.0, 448.0) == 1.0  # all-zero: 1, not Inf
    assert ss.global_scale_for_amax(1e-45, 448.0) == F32.max  # 6C/amax overflows: clamped
    g = ss.global_scale_for_amax(float(F32.max), 448.0)
    assert g >= F32.tiny and math.isfinite(1.0 / g)
    for bad in (math.inf, math.nan, -1.0):
        with pytest.raises(ValueError, match="is not a finite value >= 0"):
            ss.global_scale_for_amax(bad, 448.0)


# ---------------------------------------------------------------------------------------- CLI

def run(*args, check=True):
    r = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, f"{args}: exit {r.returncode}\n{r.stderr}"
    return r


def one_error(r, *must):
    assert r.returncode == 1, (r.returncode, r.stderr)
    errs = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert len(errs) == 1, r.stderr
    for m in must:
        assert m in errs[0], (m, r.stderr)


def check_checkpoint_tensors(path):
    from safetensors.numpy import load_file
    files = [path] if str(path).endswith(".safetensors") else sorted(
        os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
    n = 0
    for f in files:
        for name, t in load_file(f).items():
            if "global_scale" in name:
                assert np.isfinite(t).all() and (t > 0).all(), (f, name, t)
                n += 1
            elif name.endswith("weight_scale") and t.dtype == np.uint8:
                assert not ((t & 0x7F) == 0x7F).any(), (f, name)
            elif t.dtype.kind == "f":
                assert np.isfinite(t.astype(np.float32)).all(), (f, name)
    return n


@need_bin
@pytest.mark.parametrize("kind", ["zeros", "amax-flt-max", "subnormal", "wide"])
def test_tensor_cli_hazards(tmp_path, kind):
    pytest.importorskip("safetensors")
    x = hazard(kind, rows=8, cols=96)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "q.safetensors"
    run("tensor", tmp_path / "x.npy", "--method", "sweep-mse", "-o", out, "--dequant")
    assert check_checkpoint_tensors(out) >= 1


@need_bin
@pytest.mark.parametrize("bad, word", [(np.nan, "NaN"), (np.inf, "infinite")])
def test_tensor_cli_refuses_non_finite(tmp_path, bad, word):
    from safetensors.numpy import save_file
    x = hazard("zero-row", rows=8, cols=96)
    x[6, 40] = bad
    save_file({"w": x.astype(ml_dtypes.bfloat16)}, str(tmp_path / "x.safetensors"))
    out = tmp_path / "q.safetensors"
    r = run("tensor", f"{tmp_path / 'x.safetensors'}:w", "--method", "sweep-mse", "-o", out,
            check=False)
    one_error(r, "x.safetensors:w'", "[6, 40]", word)
    assert not out.exists()


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    if not BIN:
        pytest.skip("SCALESWEEP_BIN not set (run through ctest)")
    if not (os.path.exists(MODEL) and os.path.exists(VAL)):
        pytest.skip(f"shared data absent ({MODEL})")
    pytest.importorskip("safetensors")
    out = tmp_path_factory.mktemp("hz") / "stories"
    run("convert", MODEL, "--tokenizer", TOK, "-o", out, "--dtype", "bf16")
    return out


def edit_model(src, dst, edit):
    """Copies an HF directory, applying edit(name, array) -> array to its tensors."""
    import shutil
    from safetensors.numpy import load_file, save_file
    shutil.copytree(src, dst)
    f = os.path.join(dst, "model.safetensors")
    t = {k: v.astype(np.float32) for k, v in load_file(f).items()}
    save_file({k: edit(k, v).astype(ml_dtypes.bfloat16) for k, v in t.items()}, f)
    return dst


CAL = ["--calib", VAL, "--nsamples", "4", "--seqlen", "64", "--seed", "1"]


@need_data
def test_all_zero_activations_give_finite_input_scales(hf, tmp_path):
    """The first layer's attention input is all zero (its RMSNorm weight is zero): the W4A4
    input global scale from activation amax 0 is 1, not Inf; ppl with simulated activation
    quantization stays finite."""
    m = edit_model(hf, tmp_path / "m", lambda k, v: np.zeros_like(v)
                   if k == "model.layers.0.input_layernorm.weight" else v)
    out = tmp_path / "q"
    r = json.loads(run("quantize", m, "-o", out, "--method", "sweep-mse", "--quant", "WA", *CAL,
                       "--json").stdout)
    q0 = [x for x in r["linears"] if x["name"].startswith("model.layers.0.self_attn.q_proj")]
    assert q0 and q0[0]["input_global_scale"] == 1.0, q0
    assert check_checkpoint_tensors(out) > 0
    # No global-scale slot left out: every NVFP4 Linear carries both of its global scales.
    from safetensors.numpy import load_file
    t = load_file(str(out / "model.safetensors"))
    packed = [k[:-len("weight_packed")] for k in t if k.endswith("weight_packed")]
    assert packed
    for p in packed:
        for g in ("weight_global_scale", "input_global_scale"):
            assert p + g in t, p + g
            assert np.isfinite(t[p + g]).all() and (t[p + g] > 0).all(), (p + g, t[p + g])
    sim = ["--quant", "WA", "--calib", VAL, "--calib-nsamples", "4", "--calib-seqlen", "64"]
    for args in ([m, *sim], [out]):  # simulated W4A4; the checkpoint runs as declared (W4A4)
        p = json.loads(run("ppl", *args, "--text", VAL, "--max-tokens", "256", "--json").stdout)
        assert math.isfinite(p["ppl"]) and p["ppl"] > 1, p


@need_data
def test_overflowing_activations_refused_by_calibrate(hf, tmp_path):
    """Finite weights whose product overflows float32 in the forward pass: calibrate names the
    layer, the input and the element instead of writing NaN statistics."""
    big = {"model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight"}
    m = edit_model(hf, tmp_path / "m", lambda k, v: v * np.float32(1e30) if k in big else v)
    out = tmp_path / "s.safetensors"
    r = run("calibrate", m, *CAL, "-o", out, check=False)
    one_error(r, "layer 1 input mlp_out: activation [", "overflowed")
    assert not out.exists()


@need_data
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_statistics_file_with_non_finite_values_is_refused(hf, tmp_path, bad):
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file
    stats = tmp_path / "s.safetensors"
    run("calibrate", hf, *CAL, "-o", stats)
    t = load_file(str(stats))
    with safe_open(str(stats), framework="np") as f:
        meta = f.metadata()
    name = sorted(k for k in t if t[k].dtype.kind == "f" and t[k].size > 3)[0]
    t[name] = t[name].copy()
    t[name].reshape(-1)[3] = bad
    broken = tmp_path / "broken.safetensors"
    save_file(t, str(broken), metadata=meta)
    out = tmp_path / "q"
    r = run("quantize", hf, "-o", out, "--method", "sweep-wmse", "--stats", broken, check=False)
    one_error(r, str(broken), name)
    assert not out.exists()
