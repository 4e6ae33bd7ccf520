"""End-to-end tests of `scalesweep tensor`, `tensor --compare` and `demo`.

- The safetensors output layout, read back with the `safetensors` package and checked against
  a numpy re-implementation of NVFP4/MXFP4 dequantization (and, for absmax, of the scales).
- The --json schema.
- Bad input (issue 2 item 8): one test per case; each must exit non-zero, name the file /
  tensor / index, and leave no output file behind (nor clobber an existing one).
"""
import json
import os
import struct
import subprocess

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
safetensors = pytest.importorskip("safetensors")
from safetensors.numpy import load_file, save_file  # noqa: E402

# safetensors' numpy backend looks the FP8 dtype up on numpy itself.
if not hasattr(np, "float8_e4m3fn"):
    np.float8_e4m3fn = ml_dtypes.float8_e4m3fn

BIN = os.environ.get("SCALESWEEP_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="SCALESWEEP_BIN not set (run through ctest)")

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
METHODS = ["absmax", "4over6", "sweep-mse", "sweep-wmse", "exhaustive-mse", "exhaustive-wmse",
           "opt-fp8-mse", "opt-fp8-wmse", "opt-fp32"]


def run(*args, check=True):
    r = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r


def make_tensor(path, rows=48, cols=100, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    x[1, 3] = 9.0  # an outlier
    x[2, :] = 0.0  # an all-zero row
    x[min(5, rows - 1), :16] *= 1e-6  # tiny blocks next to a large tensor amax (FP8-subnormal scales)
    x = x.astype(dtype)
    np.save(path, x)
    return x.astype(np.float32)


def unpack_codes(packed, cols):
    lo = packed & 0x0F
    hi = packed >> 4
    codes = np.stack([lo, hi], axis=-1).reshape(packed.shape[0], -1)
    return codes[:, :cols]


def numpy_dequant(d, cols, block, fmt="nvfp4"):
    q = E2M1[unpack_codes(d["weight_packed"], cols)]
    if fmt == "nvfp4":
        s = d["weight_scale"].astype(np.float32)
        gs = d["weight_global_scale"][0]
    else:
        s = d["weight_scale"].view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
        gs = np.float32(1)
    s_full = np.repeat(s, block, axis=1)[:, :cols]
    return (q * s_full) / gs  # q*s is exact in float32; one rounding for the division


# ------------------------------------------------------------------------- output layout


@pytest.mark.parametrize("method", ["absmax", "sweep-mse", "exhaustive-wmse", "4over6"])
@pytest.mark.parametrize("block", [8, 16, 64])
def test_safetensors_layout_and_numpy_dequant(tmp_path, method, block):
    cols = 100  # not a multiple of any block size, and 100/2 packs evenly; see odd test below
    x = make_tensor(tmp_path / "x.npy", cols=cols)
    imp = np.random.default_rng(3).uniform(0.1, 5, cols).astype(np.float32)
    np.save(tmp_path / "imp.npy", imp)
    out = tmp_path / "o.safetensors"
    r = run("tensor", tmp_path / "x.npy", "--method", method, "--block", block,
            "--importance", tmp_path / "imp.npy", "-o", out, "--dequant", "--json")
    j = json.loads(r.stdout)
    d = load_file(str(out))
    rows = x.shape[0]
    nb = -(-cols // block)
    assert set(d) == {"weight_packed", "weight_scale", "weight_global_scale", "dequant"}
    assert d["weight_packed"].dtype == np.uint8 and d["weight_packed"].shape == (rows, cols // 2)
    assert d["weight_scale"].dtype == ml_dtypes.float8_e4m3fn
    assert d["weight_scale"].shape == (rows, nb)
    assert d["weight_global_scale"].dtype == np.float32 and d["weight_global_scale"].shape == (1,)
    assert d["dequant"].dtype == np.float32 and d["dequant"].shape == (rows, cols)
    # Encode direction: gs = 6 C / amax.
    c = 448.0 if method == "absmax" else 256.0
    gs = np.float32(np.float32(6 * c) / np.abs(x).max())
    assert d["weight_global_scale"][0] == gs
    assert j["global_scale"] == pytest.approx(float(gs), rel=1e-7)
    # Our numpy dequantization reproduces the stored dequant bit for bit.
    xh = numpy_dequant(d, cols, block)
    assert np.array_equal(xh.view(np.uint32), d["dequant"].view(np.uint32))
    # The all-zero row: codes 0, scale pattern 0.
    assert (d["weight_packed"][2] == 0).all() and (d["weight_scale"][2].view(np.uint8) == 0).all()
    # Metrics in --json match numpy's.
    nmse = np.sum((x.astype(np.float64) - xh) ** 2) / np.sum(x.astype(np.float64) ** 2)
    w = np.broadcast_to(imp, x.shape).astype(np.float64)
    nwmse = np.sum(w * (x - xh.astype(np.float64)) ** 2) / np.sum(w * x.astype(np.float64) ** 2)
    assert j["nmse"] == pytest.approx(nmse, rel=1e-9)
    assert j["nwmse"] == pytest.approx(nwmse, rel=1e-9)
    if method == "absmax":
        # Independent check of the AbsMax scale: rn_fp8(block amax * gs / 6), from ml_dtypes.
        y = x * gs
        pad = nb * block - cols
        a = np.abs(np.pad(y, ((0, 0), (0, pad)))).reshape(rows, nb, block).max(axis=2)
        ref = (a / np.float32(6)).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
        assert np.array_equal(ref.view(np.uint8), d["weight_scale"].view(np.uint8))
        # And the codes: RNE of y / s onto E2M1 (ml_dtypes), where s > 0.
        s = np.repeat(d["weight_scale"].astype(np.float32), block, axis=1)[:, :cols]
        q = unpack_codes(d["weight_packed"], cols)
        ok = s > 0
        ref_codes = (y[ok] / s[ok]).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
        # -0.0 results keep the sign bit in both
        assert np.array_equal(ref_codes, q[ok])


def test_odd_columns_pad_high_nibble(tmp_path):
    x = make_tensor(tmp_path / "x.npy", rows=4, cols=37)
    out = tmp_path / "o.safetensors"
    run("tensor", tmp_path / "x.npy", "--method", "sweep-mse", "-o", out, "--dequant")
    d = load_file(str(out))
    assert d["weight_packed"].shape == (4, 19)
    assert d["weight_scale"].shape == (4, 3)  # ceil(37/16)
    assert (d["weight_packed"][:, -1] >> 4 == 0).all()  # padding code 0
    assert np.array_equal(numpy_dequant(d, 37, 16), d["dequant"])
    assert np.abs(d["dequant"] - x).max() < np.abs(x).max() * 0.3


def test_mxfp4_layout(tmp_path):
    x = make_tensor(tmp_path / "x.npy", rows=8, cols=96)
    out = tmp_path / "o.safetensors"
    r = run("tensor", tmp_path / "x.npy", "--method", "sweep-mse", "--format", "mxfp4",
            "--block", "32", "-o", out, "--dequant", "--json")
    d = load_file(str(out))
    assert set(d) == {"weight_packed", "weight_scale", "dequant"}
    assert d["weight_scale"].dtype == np.uint8 and d["weight_scale"].shape == (8, 3)
    xh = numpy_dequant(d, 96, 32, fmt="mxfp4")
    assert np.array_equal(xh, d["dequant"])
    assert json.loads(r.stdout)["format"] == "mxfp4"


def test_safetensors_input_f16_and_metadata(tmp_path):
    rng = np.random.default_rng(5)
    w = rng.standard_normal((16, 64)).astype(np.float16)
    save_file({"model.w": w, "other": np.zeros(3, np.float32)}, str(tmp_path / "m.safetensors"))
    np.save(tmp_path / "w.npy", w)
    a = json.loads(run("tensor", f"{tmp_path}/m.safetensors:model.w", "--method", "sweep-mse",
                       "--json").stdout)
    b = json.loads(run("tensor", tmp_path / "w.npy", "--method", "sweep-mse", "--json").stdout)
    assert a["nmse"] == b["nmse"] and a["shape"] == [16, 64]
    out = tmp_path / "o.safetensors"
    run("tensor", f"{tmp_path}/m.safetensors:model.w", "--method", "absmax", "-o", out)
    with safetensors.safe_open(str(out), "np") as f:
        md = f.metadata()
    assert md["method"] == "absmax" and md["block"] == "16" and md["format"] == "nvfp4"


def write_bf16_safetensors(path, name, x):
    """A hand-made safetensors file with one BF16 tensor (numpy cannot save bfloat16)."""
    b = x.astype(ml_dtypes.bfloat16).tobytes()
    hdr = json.dumps({name: {"dtype": "BF16", "shape": list(x.shape),
                             "data_offsets": [0, len(b)]}}).encode()
    hdr += b" " * (-len(hdr) % 8)
    path.write_bytes(struct.pack("<Q", len(hdr)) + hdr + b)


def test_bf16_safetensors_input_equals_float32_of_same_values(tmp_path):
    x = np.random.default_rng(11).standard_normal((8, 48)).astype(ml_dtypes.bfloat16)
    write_bf16_safetensors(tmp_path / "b.safetensors", "w", x)
    np.save(tmp_path / "f.npy", x.astype(np.float32))
    outs = []
    for src in [f"{tmp_path}/b.safetensors:w", tmp_path / "f.npy"]:
        out = tmp_path / f"o{len(outs)}.safetensors"
        run("tensor", src, "--method", "exhaustive-mse", "-o", out, "--dequant")
        outs.append(out.read_bytes())
    d0, d1 = load_file(str(tmp_path / "o0.safetensors")), load_file(str(tmp_path / "o1.safetensors"))
    for k in d0:
        assert np.array_equal(d0[k].view(np.uint8), d1[k].view(np.uint8)), k


def test_dequant_needs_output(tmp_path):
    make_tensor(tmp_path / "x.npy")
    r = run("tensor", tmp_path / "x.npy", "--method", "absmax", "--dequant", check=False)
    assert r.returncode != 0 and "--dequant: needs an output file" in r.stderr


def test_json_schema(tmp_path):
    make_tensor(tmp_path / "x.npy")
    j = json.loads(run("tensor", tmp_path / "x.npy", "--method", "sweep-mse", "--json").stdout)
    for k, t in [("method", str), ("block", int), ("nmse", float), ("nwmse", float),
                 ("gap_vs_opt_fp32_pct", float), ("seconds", float), ("global_scale", float),
                 ("gap_nmse_pct", float), ("gap_nwmse_pct", float), ("shape", list)]:
        assert isinstance(j[k], t), k
    assert j["method"] == "sweep-mse" and j["block"] == 16
    assert 0 < j["nmse"] < 0.05
    assert j["gap_vs_opt_fp32_pct"] > 0 and j["output"] is None


def test_weighted_methods_use_importance(tmp_path):
    make_tensor(tmp_path / "x.npy", rows=64, cols=128)
    rng = np.random.default_rng(9)
    for shape in [(128,), (64, 128)]:
        np.save(tmp_path / "imp.npy", np.exp(2 * rng.standard_normal(shape)).astype(np.float32))
        res = {}
        for m in ["exhaustive-mse", "exhaustive-wmse", "sweep-wmse"]:
            res[m] = json.loads(run("tensor", tmp_path / "x.npy", "--method", m, "--importance",
                                    tmp_path / "imp.npy", "--json").stdout)
        # The exhaustive weighted search minimizes NWMSE block by block.
        assert res["exhaustive-wmse"]["nwmse"] <= res["exhaustive-mse"]["nwmse"] * (1 + 1e-6)
        assert res["exhaustive-wmse"]["nwmse"] < res["exhaustive-mse"]["nwmse"]
        assert res["exhaustive-mse"]["nmse"] <= res["exhaustive-wmse"]["nmse"] * (1 + 1e-6)
        assert res["sweep-wmse"]["gap_vs_opt_fp32_pct"] == res["sweep-wmse"]["gap_nwmse_pct"]


def test_custom_window_sweep(tmp_path):
    make_tensor(tmp_path / "x.npy")
    wide = json.loads(run("tensor", tmp_path / "x.npy", "--method", "sweep", "--window=-3,7",
                          "--json").stdout)
    ref = json.loads(run("tensor", tmp_path / "x.npy", "--method", "sweep-mse", "--json").stdout)
    narrow = json.loads(run("tensor", tmp_path / "x.npy", "--method", "sweep", "--window", "0,0",
                            "--json").stdout)
    assert wide["nmse"] == pytest.approx(ref["nmse"], rel=1e-6)
    assert narrow["nmse"] >= wide["nmse"]


def test_compare_table_and_json(tmp_path):
    make_tensor(tmp_path / "x.npy")
    np.save(tmp_path / "imp.npy", np.linspace(0.5, 3, 100).astype(np.float32))
    r = run("tensor", tmp_path / "x.npy", "--compare", "--importance", tmp_path / "imp.npy")
    lines = r.stdout.splitlines()
    assert any(l.split()[:1] == ["method"] and "NMSE" in l and "NWMSE" in l for l in lines)
    for m in METHODS:
        assert sum(1 for l in lines if l.split()[:1] == [m]) == 1, (m, r.stdout)
    j = json.loads(run("tensor", tmp_path / "x.npy", "--compare", "--json").stdout)
    got = {row["method"]: row for row in j["results"]}
    assert set(got) == set(METHODS)
    assert got["sweep-mse"]["nmse"] == got["exhaustive-mse"]["nmse"]
    assert got["opt-fp32"]["gap_nmse_pct"] == 0
    assert got["absmax"]["nmse"] > got["sweep-mse"]["nmse"]


def test_demo_small_json():
    r = run("demo", "--rows", "32", "--cols", "256", "--json")
    j = json.loads(r.stdout)
    res = j["results"]
    assert {x["distribution"] for x in res} == {"Gaussian", "Laplace", "Student-t(3)"}
    assert {x["block"] for x in res} == {8, 16, 32, 64}
    for x in res:
        assert x["gap_nmse_pct"] >= -1e-9 or x["method"].startswith("opt-fp32")
    for e in j["sweep_mse_equals_exhaustive_mse"]:
        assert e["equal_blocks"] == e["blocks"]


# ----------------------------------------------------------------------------- bad input


def expect_fail(tmp_path, args, *fragments, out=None):
    """Runs the CLI, expects failure with every fragment in stderr and no output file."""
    out = out or tmp_path / "out.safetensors"
    r = run(*args, "-o", out, check=False) if "-o" not in map(str, args) else run(*args, check=False)
    assert r.returncode != 0, f"expected failure\n{r.stdout}\n{r.stderr}"
    for f in fragments:
        assert f in r.stderr, f"{f!r} not in stderr:\n{r.stderr}"
    assert "Traceback" not in r.stderr and "terminate called" not in r.stderr
    assert not out.exists(), "output file left behind"
    leftovers = [p.name for p in tmp_path.iterdir() if ".tmp." in p.name]
    assert not leftovers, leftovers
    return r


def test_nan_names_tensor_and_index(tmp_path):
    x = make_tensor(tmp_path / "x.npy")
    x[3, 17] = np.nan
    np.save(tmp_path / "x.npy", x)
    expect_fail(tmp_path, ["tensor", tmp_path / "x.npy", "--method", "sweep-mse"],
                "x.npy", "[3, 17]", "NaN")


def test_inf_names_index(tmp_path):
    x = make_tensor(tmp_path / "x.npy")
    x[7, 0] = -np.inf
    np.save(tmp_path / "x.npy", x)
    expect_fail(tmp_path, ["tensor", tmp_path / "x.npy", "--method", "absmax"],
                "x.npy", "[7, 0]", "infinite")


def test_empty_array(tmp_path):
    np.save(tmp_path / "e.npy", np.zeros((0, 16), np.float32))
    expect_fail(tmp_path, ["tensor", tmp_path / "e.npy", "--method", "absmax"], "e.npy", "empty")


@pytest.mark.parametrize("shape", [(64,), (2, 4, 16), ()])
def test_not_2d(tmp_path, shape):
    np.save(tmp_path / "v.npy", np.ones(shape, np.float32))
    expect_fail(tmp_path, ["tensor", tmp_path / "v.npy", "--method", "absmax"], "v.npy", "2-D")


@pytest.mark.parametrize("dtype", [np.int32, np.complex64, np.uint8])
def test_unsupported_npy_dtype(tmp_path, dtype):
    np.save(tmp_path / "i.npy", np.ones((4, 16), dtype))
    expect_fail(tmp_path, ["tensor", tmp_path / "i.npy", "--method", "absmax"], "i.npy")


def test_big_endian_npy(tmp_path):
    np.save(tmp_path / "b.npy", np.ones((4, 16), ">f4"))
    expect_fail(tmp_path, ["tensor", tmp_path / "b.npy", "--method", "absmax"], "b.npy",
                "big-endian")


def test_fortran_order_npy(tmp_path):
    np.save(tmp_path / "f.npy", np.asfortranarray(np.ones((4, 16), np.float32)))
    expect_fail(tmp_path, ["tensor", tmp_path / "f.npy", "--method", "absmax"], "f.npy",
                "fortran_order")


def test_truncated_npy(tmp_path):
    make_tensor(tmp_path / "x.npy")
    data = (tmp_path / "x.npy").read_bytes()
    (tmp_path / "t.npy").write_bytes(data[: len(data) - 100])
    expect_fail(tmp_path, ["tensor", tmp_path / "t.npy", "--method", "absmax"], "t.npy",
                "truncated")


def test_lying_npy_header(tmp_path):
    make_tensor(tmp_path / "x.npy", rows=4, cols=16)
    data = (tmp_path / "x.npy").read_bytes()
    lie = data.replace(b"(4, 16)", b"(9, 16)")
    assert lie != data
    (tmp_path / "l.npy").write_bytes(lie)
    expect_fail(tmp_path, ["tensor", tmp_path / "l.npy", "--method", "absmax"], "l.npy",
                "truncated")
    (tmp_path / "m.npy").write_bytes(b"NOTNUMPY" + data[8:])
    expect_fail(tmp_path, ["tensor", tmp_path / "m.npy", "--method", "absmax"], "m.npy", "magic")


def _st_with(tmp_path, name="m.safetensors"):
    save_file({"w": np.ones((4, 16), np.float32)}, str(tmp_path / name))
    return (tmp_path / name).read_bytes()


def test_truncated_safetensors(tmp_path):
    data = _st_with(tmp_path)
    (tmp_path / "t.safetensors").write_bytes(data[:-10])
    expect_fail(tmp_path, ["tensor", f"{tmp_path}/t.safetensors:w", "--method", "absmax"],
                "t.safetensors", "'w'", "beyond the data region")


def test_lying_safetensors_header_length(tmp_path):
    data = _st_with(tmp_path)
    n = struct.unpack("<Q", data[:8])[0]
    (tmp_path / "h.safetensors").write_bytes(struct.pack("<Q", n + 10_000) + data[8:])
    expect_fail(tmp_path, ["tensor", f"{tmp_path}/h.safetensors:w", "--method", "absmax"],
                "h.safetensors", "header length")
    (tmp_path / "g.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + data[8:])
    expect_fail(tmp_path, ["tensor", f"{tmp_path}/g.safetensors:w", "--method", "absmax"],
                "g.safetensors", "exceeds the limit")


def test_safetensors_bad_json(tmp_path):
    data = _st_with(tmp_path)
    n = struct.unpack("<Q", data[:8])[0]
    hdr = bytearray(data[8 : 8 + n])
    hdr[hdr.index(b":")] = ord(";")
    (tmp_path / "j.safetensors").write_bytes(data[:8] + bytes(hdr) + data[8 + n :])
    expect_fail(tmp_path, ["tensor", f"{tmp_path}/j.safetensors:w", "--method", "absmax"],
                "j.safetensors", "JSON")


def test_missing_tensor(tmp_path):
    _st_with(tmp_path)
    expect_fail(tmp_path, ["tensor", f"{tmp_path}/m.safetensors:nope", "--method", "absmax"],
                "m.safetensors", "'nope'", "w")


def test_safetensors_without_tensor_name(tmp_path):
    _st_with(tmp_path)
    expect_fail(tmp_path, ["tensor", f"{tmp_path}/m.safetensors", "--method", "absmax"],
                "m.safetensors:TENSOR")


def test_safetensors_integer_tensor(tmp_path):
    save_file({"ids": np.ones((4, 16), np.int32)}, str(tmp_path / "i.safetensors"))
    expect_fail(tmp_path, ["tensor", f"{tmp_path}/i.safetensors:ids", "--method", "absmax"],
                "i.safetensors", "'ids'", "I32")


def test_missing_input_file(tmp_path):
    expect_fail(tmp_path, ["tensor", tmp_path / "absent.npy", "--method", "absmax"],
                "absent.npy", "cannot open")


@pytest.mark.parametrize("shape", [(99,), (48, 99), (100, 48), (48, 100, 1)])
def test_importance_shape_mismatch(tmp_path, shape):
    make_tensor(tmp_path / "x.npy")
    np.save(tmp_path / "imp.npy", np.ones(shape, np.float32))
    expect_fail(tmp_path, ["tensor", tmp_path / "x.npy", "--method", "sweep-wmse",
                           "--importance", tmp_path / "imp.npy"],
                "imp.npy", "importance shape", "[100]", "[48, 100]")


@pytest.mark.parametrize("bad,what", [(np.nan, "NaN"), (-1.0, "negative"), (np.inf, "infinite")])
def test_importance_bad_values(tmp_path, bad, what):
    make_tensor(tmp_path / "x.npy")
    imp = np.ones(100, np.float32)
    imp[42] = bad
    np.save(tmp_path / "imp.npy", imp)
    expect_fail(tmp_path, ["tensor", tmp_path / "x.npy", "--method", "sweep-wmse",
                           "--importance", tmp_path / "imp.npy"], "imp.npy", "[42]", what)


def test_unknown_method(tmp_path):
    make_tensor(tmp_path / "x.npy")
    expect_fail(tmp_path, ["tensor", tmp_path / "x.npy", "--method", "bogus"],
                "unknown method 'bogus'", "sweep-mse")


def test_no_method(tmp_path):
    make_tensor(tmp_path / "x.npy")
    expect_fail(tmp_path, ["tensor", tmp_path / "x.npy"], "--method")


@pytest.mark.parametrize("args,fragment", [
    (["--method", "absmax", "--block", "12"], "12"),
    (["--method", "absmax", "--block", "0"], "block"),
    (["--method", "sweep", "--window", "5,2"], "5,2"),
    (["--method", "sweep", "--window", "a,b"], "L,R"),
    (["--method", "sweep"], "--window"),
    (["--method", "absmax", "--window=-3,7"], "--window"),
    (["--method", "sweep-mse", "--format", "mxfp4", "--block", "16"], "MXFP4 requires block 32"),
    (["--method", "sweep-mse", "--format", "mxfp4", "--block", "32", "--max-block-scale", "256"],
     "MXFP4"),
    (["--method", "sweep-mse", "--format", "nvfp8"], "nvfp8"),
    (["--method", "sweep-mse", "--max-block-scale", "0"], "max-block-scale"),
    (["--method", "sweep-mse", "--max-block-scale", "-5"], "max-block-scale"),
    (["--method", "sweep-mse", "--max-block-scale", "500"],
     "--max-block-scale: C must satisfy 0 < C <= 448 (the largest FP8 E4M3 value)"),
    (["--method", "sweep-mse", "--global-scale", "0"], "--global-scale"),
    (["--method", "sweep-mse", "--global-scale", "10", "--max-block-scale", "256"], "give one"),
    (["--method", "opt-fp32"], "--dequant"),
    (["--method", "sweep-mse", "--threads", "-1"], "threads"),
    (["--compare", "--method", "absmax"], "--method: a comparison runs every method"),
])
def test_impossible_options(tmp_path, args, fragment):
    make_tensor(tmp_path / "x.npy")
    expect_fail(tmp_path, ["tensor", tmp_path / "x.npy", *args], fragment)


def test_global_scale_overflow(tmp_path):
    make_tensor(tmp_path / "x.npy")
    expect_fail(tmp_path, ["tensor", tmp_path / "x.npy", "--method", "absmax",
                           "--global-scale", "1e38"], "x.npy", "overflow")


def test_output_directory_missing(tmp_path):
    make_tensor(tmp_path / "x.npy")
    out = tmp_path / "no" / "such" / "o.safetensors"
    expect_fail(tmp_path, ["tensor", tmp_path / "x.npy", "--method", "absmax", "-o", out],
                "does not exist", out=out)


def test_failed_run_keeps_existing_output(tmp_path):
    x = make_tensor(tmp_path / "x.npy")
    out = tmp_path / "o.safetensors"
    run("tensor", tmp_path / "x.npy", "--method", "absmax", "-o", out)
    before = out.read_bytes()
    x[0, 0] = np.nan
    np.save(tmp_path / "x.npy", x)
    r = run("tensor", tmp_path / "x.npy", "--method", "absmax", "-o", out, "--force", check=False)
    assert r.returncode != 0 and "NaN" in r.stderr
    assert out.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if ".tmp." in p.name]


def _raw_safetensors(path, entries, data):
    """Header JSON by hand (dtypes numpy cannot represent) + data bytes."""
    h = json.dumps(entries).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return path


def test_newer_safetensors_dtypes_beside_f32(tmp_path):
    """A file holding the reference implementation's newer dtypes (F4, F6_E2M3, C64,
    F8_E5M2FNUZ) next to an F32 tensor: both readers accept it, the F32 tensor is usable, the
    others are refused naming file, tensor and dtype (was: the whole file was rejected)."""
    x = np.random.default_rng(3).standard_normal((4, 32)).astype(np.float32)
    n = x.nbytes
    f = _raw_safetensors(tmp_path / "mixed.safetensors", {
        "w": {"dtype": "F32", "shape": [4, 32], "data_offsets": [0, n]},
        "q": {"dtype": "F4", "shape": [4, 32], "data_offsets": [n, n + 64]},
        "s": {"dtype": "F6_E2M3", "shape": [4, 32], "data_offsets": [n + 64, n + 160]},
        "c": {"dtype": "C64", "shape": [2], "data_offsets": [n + 160, n + 176]},
        "u": {"dtype": "F8_E5M2FNUZ", "shape": [4], "data_offsets": [n + 176, n + 180]},
    }, x.tobytes() + bytes(range(180)))
    with safetensors.safe_open(str(f), framework="numpy") as r:  # the reference agrees
        assert set(r.keys()) == {"w", "q", "s", "c", "u"}
    np.save(tmp_path / "x.npy", x)
    a = json.loads(run("tensor", f"{f}:w", "--method", "absmax", "--json").stdout)
    b = json.loads(run("tensor", tmp_path / "x.npy", "--method", "absmax", "--json").stdout)
    assert a["nmse"] == b["nmse"] and a["global_scale"] == b["global_scale"]
    for name, dt in (("q", "F4"), ("s", "F6_E2M3"), ("c", "C64"), ("u", "F8_E5M2FNUZ")):
        expect_fail(tmp_path, ["tensor", f"{f}:{name}", "--method", "absmax"], str(f),
                    f"'{name}'", dt)
    # Sizes stay strict, as in the reference: 3 F4 elements are not a whole number of bytes.
    g = _raw_safetensors(tmp_path / "odd.safetensors",
                         {"q": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, b"\0\0")
    with pytest.raises(Exception):
        with safetensors.safe_open(str(g), framework="numpy") as r:
            r.keys()
    expect_fail(tmp_path, ["tensor", f"{g}:q", "--method", "absmax"], str(g), "'q'",
                "not a whole number of bytes")
