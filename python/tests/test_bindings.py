"""Tests of the Python extension module `scalesweep` (src/python/).

- The codecs against ml_dtypes: every pattern of every format decoded, and every finite
  value, midpoint and neighbour (plus random values) encoded.
- Bit identity with the CLI (`scalesweep tensor` on the same .npy / .safetensors) for every
  method, dtype and option, and the same metrics as `tensor --json`.
- The swizzled scale layout equals the documented permutation of the row layout.
- Bad input raises TypeError / ValueError with a clear message (the index of a NaN).
- The README `python` section's example runs (extracted from README.md).

The whole file skips (visibly) when the module is not built; the CLI comparisons skip when
SCALESWEEP_BIN is unset (run through ctest, which sets both PYTHONPATH and SCALESWEEP_BIN).
"""
import itertools
import json
import os
import pathlib
import re
import struct
import subprocess
import threading
import time

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
try:
    import scalesweep as ss
except ImportError as e:  # pragma: no cover - depends on the build
    pytest.skip(f"Python module scalesweep not built or not on PYTHONPATH ({e}); it needs "
                "pybind11-dev and python3-dev at configure time (scripts/setup.sh installs "
                "them) and <build>/python on PYTHONPATH (ctest sets it)",
                allow_module_level=True)

BIN = os.environ.get("SCALESWEEP_BIN")
needs_cli = pytest.mark.skipif(not BIN, reason="SCALESWEEP_BIN not set (run through ctest)")
REPO = pathlib.Path(__file__).resolve().parents[2]

ML_TYPES = {
    "e2m1": ml_dtypes.float4_e2m1fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "ue8m0": ml_dtypes.float8_e8m0fnu,
    "f16": np.float16,
    "bf16": ml_dtypes.bfloat16,
}
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def pattern_dtype(fmt):
    return np.uint16 if ss.format_info(fmt)["bits"] > 8 else np.uint8


def all_patterns(fmt):
    return np.arange(1 << ss.format_info(fmt)["bits"]).astype(pattern_dtype(fmt))


def ml_encode(x, fmt):
    return np.asarray(x, np.float32).astype(ML_TYPES[fmt]).view(pattern_dtype(fmt))


# ------------------------------------------------------------------------------- codecs


@pytest.mark.parametrize("fmt", sorted(ML_TYPES))
def test_decode_every_pattern_matches_ml_dtypes(fmt):
    pat = all_patterns(fmt)  # all 16 FP4 codes, all 256 FP8 patterns, all 65536 of f16/bf16
    mine = ss.decode(pat, fmt)
    ref = pat.view(ML_TYPES[fmt]).astype(np.float32)
    assert mine.dtype == np.float32 and mine.shape == pat.shape
    assert np.array_equal(np.isnan(mine), np.isnan(ref))
    ok = ~np.isnan(ref)
    assert np.array_equal(mine[ok], ref[ok])
    assert np.array_equal(np.signbit(mine[ok]), np.signbit(ref[ok]))  # -0.0 kept
    # decode keeps any shape
    assert ss.decode(pat.reshape(-1, 4), fmt).shape == (len(pat) // 4, 4)


@pytest.mark.parametrize("fmt", sorted(ML_TYPES))
def test_encode_rne_matches_ml_dtypes_inside_the_finite_range(fmt):
    info = ss.format_info(fmt)
    vals = ss.decode(all_patterns(fmt), fmt).astype(np.float64)
    fin = np.unique(vals[np.isfinite(vals)])
    mids = (fin[:-1] + fin[1:]) / 2  # ties, exact in float32 for these formats
    x = np.concatenate([fin, mids]).astype(np.float32)
    x = np.concatenate([x, np.nextafter(x, np.float32(np.inf)),
                        np.nextafter(x, np.float32(-np.inf))])
    rng = np.random.default_rng(7)
    x = np.concatenate([x, (rng.uniform(-1, 1, 200_000) * info["max_value"]).astype(np.float32)])
    x = x[np.abs(x.astype(np.float64)) <= info["max_value"]]  # ml_dtypes does not saturate
    if fmt == "ue8m0":
        # unsigned, no zero; ml_dtypes maps float32 subnormals (2^-127 itself) to pattern 1:
        # those are covered by the round trip in test_encode_decode_round_trip
        x = x[x >= np.float32(2.0**-126)]
    assert x.size > 100
    got = ss.encode(x, fmt)
    ref = ml_encode(x, fmt)
    bad = np.flatnonzero(got != ref)
    assert bad.size == 0, f"{fmt}: {bad.size} differ, e.g. x={x[bad[:5]]} got {got[bad[:5]]} " \
                          f"ml_dtypes {ref[bad[:5]]}"
    assert got.dtype == pattern_dtype(fmt)


@pytest.mark.parametrize("fmt", sorted(ML_TYPES))
def test_encode_decode_round_trip(fmt):
    pat = all_patterns(fmt)
    v = ss.decode(pat, fmt)
    fin = np.isfinite(v)
    for rounding in ("rne", "floor", "ceil", "toward-zero"):
        assert np.array_equal(ss.encode(v[fin], fmt, rounding=rounding), pat[fin])


@pytest.mark.parametrize("fmt", ["e2m1", "e4m3", "e5m2", "e3m2"])
@pytest.mark.parametrize("rounding", ["floor", "ceil", "toward-zero"])
def test_encode_directed_rounding(fmt, rounding):
    info = ss.format_info(fmt)
    vals = ss.decode(all_patterns(fmt), fmt).astype(np.float64)
    fin = np.unique(vals[np.isfinite(vals)])  # sorted; -0.0 and 0.0 collapse
    rng = np.random.default_rng(3)
    x = (rng.uniform(-1, 1, 50_000) * info["max_value"]).astype(np.float32)
    x = np.concatenate([x, fin.astype(np.float32)])
    got = ss.decode(ss.encode(x, fmt, rounding=rounding), fmt).astype(np.float64)
    xd = x.astype(np.float64)
    lo = fin[np.searchsorted(fin, xd, side="right") - 1]  # largest <= x
    hi = fin[np.minimum(np.searchsorted(fin, xd, side="left"), fin.size - 1)]  # smallest >= x
    want = {"floor": lo, "ceil": hi, "toward-zero": np.where(xd < 0, hi, lo)}[rounding]
    assert np.array_equal(got, want)


def test_encode_saturation_nonfinite_and_dtypes():
    big = np.array([1e6, -1e6, 500.0, 464.0], np.float32)
    assert ss.encode(big, "e4m3").tolist() == [0x7E, 0xFE, 0x7E, 0x7E]  # satfinite to +-448
    assert ss.encode(np.array([7.0, -100.0], np.float32), "e2m1").tolist() == [7, 15]
    assert ss.encode(np.array([1e6], np.float32), "f16").tolist() == [0x7C00]  # IEEE: Inf
    x = np.zeros((2, 3), np.float32)
    x[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"element \[1, 2\] is NaN"):
        ss.encode(x, "e4m3")
    x[1, 2] = -np.inf
    with pytest.raises(ValueError, match=r"element \[1, 2\] is infinite"):
        ss.encode(x, "e2m1")
    x[0, 0] = np.nan
    e = ss.encode(x, "e4m3", allow_nonfinite=True)
    assert e[0, 0] & 0x7F == 0x7F and e[1, 2] == 0xFE and e.shape == (2, 3)
    # float16 / bfloat16 inputs are widened exactly: same patterns as their float32 values
    v = np.random.default_rng(1).standard_normal(10_000).astype(np.float32) * 30
    for t in (np.float16, ml_dtypes.bfloat16):
        w = v.astype(t)
        assert np.array_equal(ss.encode(w, "e4m3"), ss.encode(w.astype(np.float32), "e4m3"))
    with pytest.raises(TypeError, match="float64"):
        ss.encode(v.astype(np.float64), "e4m3")
    with pytest.raises(ValueError, match="format 'fp8'"):
        ss.encode(v, "fp8")
    with pytest.raises(ValueError, match="rounding 'up'"):
        ss.encode(v, "e4m3", rounding="up")
    with pytest.raises(ValueError, match=r"element \[3\] = 16 is not a e2m1 pattern"):
        ss.decode(np.array([0, 1, 2, 16], np.uint8), "e2m1")
    with pytest.raises(TypeError, match="uint8"):
        ss.decode(np.array([0, 1], np.int32), "e4m3")


def test_format_info():
    i = ss.format_info("e4m3")
    assert (i["bits"], i["exp_bits"], i["man_bits"], i["bias"], i["max_value"]) == (8, 4, 3, 7, 448)
    assert ss.format_info("e2m1")["max_value"] == 6
    assert ss.format_info("ue8m0")["signed"] is False
    assert set(ss.FORMATS) == set(ML_TYPES)


# ------------------------------------------------------------------------------- CLI identity


def make_tensor(rows=48, cols=100, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    x[1, 3] = 9.0  # an outlier
    x[2, :] = 0.0  # an all-zero row
    x[5, :16] *= 1e-6  # tiny blocks next to a large amax (FP8-subnormal scales)
    return x


def read_safetensors(path):
    """name -> (dtype, shape, raw bytes), parsed directly (no FP8 support needed)."""
    data = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], data[8 + n + a:8 + n + b])
    return out


def write_safetensors(path, name, array, dtype):
    raw = np.ascontiguousarray(array).tobytes()
    header = json.dumps({name: {"dtype": dtype, "shape": list(array.shape),
                                "data_offsets": [0, len(raw)]}}).encode()
    header += b" " * (-len(header) % 8)
    pathlib.Path(path).write_bytes(struct.pack("<Q", len(header)) + header + raw)


_OUT_IDS = itertools.count()


def cli(*args):
    r = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{args}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def cli_tensor(tmp_path, input_spec, method, extra=(), importance=None):
    out = tmp_path / f"{method}-{next(_OUT_IDS)}.safetensors"  # a fresh output every call
    args = ["tensor", input_spec, "--method", method, "-o", out, "--json", *extra]
    if importance is not None:
        args += ["--importance", importance]
    if method == "opt-fp32":
        args.append("--dequant")
    j = json.loads(cli(*args))
    return j, read_safetensors(out)


def assert_same_as_cli(q, st, x_shape):
    rows, cols = x_shape
    dt, shape, raw = st["weight_packed"]
    assert (dt, shape) == ("U8", list(q.codes.shape))
    assert np.array_equal(np.frombuffer(raw, np.uint8).reshape(shape), q.codes)
    dt, shape, raw = st["weight_scale"]
    assert shape == list(q.scales.shape) == [rows, -(-cols // q.block)]
    assert np.array_equal(np.frombuffer(raw, np.uint8).reshape(shape), q.scales)
    if q.format == "nvfp4":
        assert dt == "F8_E4M3"
        gs = np.frombuffer(st["weight_global_scale"][2], np.float32)[0]
        assert gs == np.float32(q.global_scale)
    else:
        assert dt == "U8" and "weight_global_scale" not in st and q.global_scale == 1.0


METRIC_KEYS = ["global_scale", "nmse", "nwmse", "opt_fp32_nmse", "opt_fp32_nwmse",
               "gap_nmse_pct", "gap_nwmse_pct", "gap_vs_opt_fp32_pct", "max_block_scale"]


HESSIAN_METHODS = ("sweep-hessian", "exhaustive-hessian")


@needs_cli
@pytest.mark.parametrize("method", [m for m in ss.METHODS if m not in HESSIAN_METHODS])
def test_every_method_bit_identical_to_cli(tmp_path, method):
    x = make_tensor()
    np.save(tmp_path / "x.npy", x)
    imp = np.random.default_rng(3).uniform(0.1, 5, x.shape[1]).astype(np.float32)
    np.save(tmp_path / "imp.npy", imp)
    extra = ["--window=-2,5"] if method == "sweep" else []
    window = (-2, 5) if method == "sweep" else None
    j, st = cli_tensor(tmp_path, tmp_path / "x.npy", method, extra, tmp_path / "imp.npy")
    if method == "opt-fp32":
        with pytest.raises(ValueError, match="no packed output"):
            ss.quantize(x, method=method, importance=imp)
        xh = ss.fake_quantize(x, method=method, importance=imp)
        dt, shape, raw = st["dequant"]
        assert np.array_equal(np.frombuffer(raw, np.float32).reshape(shape), xh)
    else:
        q = ss.quantize(x, method=method, importance=imp, window=window)
        assert q.method == method
        assert_same_as_cli(q, st, x.shape)
        assert np.array_equal(q.dequantize(), ss.fake_quantize(x, method=method, importance=imp,
                                                                window=window))
    e = ss.evaluate(x, method=method, importance=imp, window=window)
    for k in METRIC_KEYS:
        assert e[k] == j[k], f"{k}: python {e[k]!r} cli {j[k]!r}"
    xh = ss.fake_quantize(x, method=method, importance=imp, window=window)
    m = ss.error_metrics(x, xh, importance=imp)
    assert (m["nmse"], m["nwmse"]) == (j["nmse"], j["nwmse"])


@needs_cli
@pytest.mark.parametrize("case", [
    dict(method="absmax", block=8),
    dict(method="sweep-mse", block=64),
    dict(method="sweep-wmse", block=32, importance="element"),
    dict(method="exhaustive-mse", global_scale=1234.5),
    dict(method="4over6", max_block_scale=300.0),
    dict(method="sweep-mse", format="mxfp4", block=32),
    dict(method="absmax", format="mxfp4", block=32),
    dict(method="opt-fp8-wmse", format="mxfp4", block=32, importance="column"),
])
def test_options_bit_identical_to_cli(tmp_path, case):
    case = dict(case)
    x = make_tensor(rows=20, cols=99, seed=5)  # odd K: padded last nibble, partial block
    np.save(tmp_path / "x.npy", x)
    args, kw = [], {}
    for k in ("block", "global_scale", "max_block_scale", "format"):
        if k in case:
            args += ["--" + k.replace("_", "-"), case[k]]
            kw[k] = case[k]
    imp_path = None
    if case.get("importance"):
        rng = np.random.default_rng(9)
        shape = x.shape if case["importance"] == "element" else x.shape[1:]
        kw["importance"] = rng.exponential(1.0, shape).astype(np.float32)
        imp_path = tmp_path / "imp.npy"
        np.save(imp_path, kw["importance"])
    j, st = cli_tensor(tmp_path, tmp_path / "x.npy", case["method"], args, imp_path)
    q = ss.quantize(x, method=case["method"], **kw)
    assert_same_as_cli(q, st, x.shape)
    e = ss.evaluate(x, method=case["method"], **kw)
    for k in METRIC_KEYS:
        assert e.get(k) == j.get(k), k


@needs_cli
@pytest.mark.parametrize("method", ["sweep-mse", "absmax", "exhaustive-wmse"])
def test_float16_and_bfloat16_inputs_bit_identical_to_cli(tmp_path, method):
    x = make_tensor(rows=16, cols=80, seed=2)
    imp = np.random.default_rng(4).uniform(0.5, 2, 80).astype(np.float32)
    np.save(tmp_path / "imp.npy", imp)
    h = x.astype(np.float16)
    np.save(tmp_path / "h.npy", h)
    _, st = cli_tensor(tmp_path, tmp_path / "h.npy", method, importance=tmp_path / "imp.npy")
    assert_same_as_cli(ss.quantize(h, method=method, importance=imp), st, x.shape)
    b = x.astype(ml_dtypes.bfloat16)
    write_safetensors(tmp_path / "b.safetensors", "w", b.view(np.uint16), "BF16")
    _, st = cli_tensor(tmp_path, f"{tmp_path / 'b.safetensors'}:w", method,
                       importance=tmp_path / "imp.npy")
    qb = ss.quantize(b, method=method, importance=imp)
    assert_same_as_cli(qb, st, x.shape)
    # bf16 gives the bytes of the float32 tensor of the same values
    q32 = ss.quantize(b.astype(np.float32), method=method, importance=imp)
    assert np.array_equal(qb.codes, q32.codes) and np.array_equal(qb.scales, q32.scales)


@needs_cli
def test_bounds_match_cli():
    for block in (8, 16, 32):
        j = json.loads(cli("bounds", "--block", block, "--json"))
        b = ss.bounds(block)
        assert list(b["window"]) == j["window"]
        assert len(b["per_base"]) == len(j["per_base"])
        for mine, ref in zip(b["per_base"], j["per_base"]):
            assert mine["pattern"] == ref["pattern"]
            assert (None if mine["window"] is None else list(mine["window"])) == ref["window"]
            if mine["window"] is not None:
                assert ss.proven_window(mine["pattern"], block) == mine["window"]
    assert ss.sweep_windows() == {8: (-2, 7), 16: (-3, 7), 32: (-4, 7), 64: (-5, 7)}
    assert ss.sweep_windows([32], scale="ue8m0") == {32: (0, 1)}


# ------------------------------------------------------------------------------- layouts


def test_swizzled_layout_is_the_documented_permutation():
    rows, cols = 200, 16 * 10 + 7  # rows > 128 and not a multiple; nb = 11 not a multiple of 4
    x = make_tensor(rows=rows, cols=cols, seed=11)
    q = ss.quantize(x, method="sweep-mse")
    qs = ss.quantize(x, method="sweep-mse", scale_layout="swizzled")
    assert q.scale_layout == "row" and qs.scale_layout == "swizzled"
    nb = -(-cols // 16)
    pr, pb = -(-rows // 128) * 128, -(-nb // 4) * 4
    assert q.scales.shape == (rows, nb) and qs.scales.shape == (pr, pb)
    m, k = np.meshgrid(np.arange(rows), np.arange(nb), indexing="ij")
    nkt = -(-nb // 4)
    off = ((m >> 7) * nkt + (k >> 2)) * 512 + (m & 31) * 16 + ((m >> 5) & 3) * 4 + (k & 3)
    want = np.zeros(pr * pb, np.uint8)
    want[off.ravel()] = q.scales.ravel()
    assert np.unique(off).size == off.size  # a permutation into the padded buffer
    assert np.array_equal(qs.scales.ravel(), want)  # padding bytes are 0
    assert np.array_equal(qs.codes, q.codes) and qs.global_scale == q.global_scale
    assert np.array_equal(ss.swizzle_scales(q.scales), qs.scales)
    assert np.array_equal(ss.unswizzle_scales(qs.scales, rows, nb), q.scales)
    assert np.array_equal(ss.unswizzle_scales(qs.scales.ravel(), rows, nb), q.scales)
    with pytest.raises(TypeError, match="view an int32 buffer"):
        ss.unswizzle_scales(qs.scales.view(np.int32), rows, nb)
    # dequantize from either layout (and from ml_dtypes FP8 scales) is the same
    xh = q.dequantize()
    assert np.array_equal(ss.dequantize(qs), xh)
    assert np.array_equal(ss.dequantize(qs.codes, qs.scales, qs.global_scale, cols,
                                        scale_layout="swizzled"), xh)
    assert np.array_equal(ss.dequantize(q.codes, q.scales.view(ml_dtypes.float8_e4m3fn),
                                        q.global_scale, cols), xh)


def test_dequantize_matches_numpy_and_pack_roundtrip():
    x = make_tensor(rows=10, cols=45, seed=4)
    for fmt, block in (("nvfp4", 16), ("mxfp4", 32)):
        q = ss.quantize(x, method="4over6", format=fmt, block=block)
        codes = ss.unpack_fp4(q.codes, 45)
        assert codes.shape == (10, 45) and codes.max() < 16
        assert np.array_equal(ss.pack_fp4(codes), q.codes)
        sfmt = "e4m3" if fmt == "nvfp4" else "ue8m0"
        s = np.repeat(ss.decode(q.scales, sfmt), block, axis=1)[:, :45]
        want = E2M1[codes] * s  # exact in float32
        if fmt == "nvfp4":
            want = want / np.float32(q.global_scale)  # one rounding
        assert np.array_equal(q.dequantize(), want)


def test_threads_and_losses():
    x = make_tensor(rows=64, cols=160, seed=8)
    imp = np.random.default_rng(2).exponential(1.0, 160).astype(np.float32)
    q1 = ss.quantize(x, method="sweep-mse", threads=1, losses=True)
    for t in (2, 3, 0):
        qt = ss.quantize(x, method="sweep-mse", threads=t)
        assert np.array_equal(qt.codes, q1.codes) and np.array_equal(qt.scales, q1.scales)
    assert ss.quantize(x).losses is None
    qe = ss.quantize(x, method="exhaustive-mse", losses=True)
    qa = ss.quantize(x, method="absmax", losses=True, max_block_scale=256)
    # sweep-mse is exact (proven windows): same losses as exhaustive, never above absmax
    assert np.array_equal(q1.losses, qe.losses)
    assert np.all(q1.losses <= qa.losses)
    # losses are the contract loss (docs/NUMERICS.md): float32, in index order
    for q, w in ((q1, None), (ss.quantize(x, method="exhaustive-wmse", importance=imp,
                                          losses=True), imp)):
        gs = np.float32(q.global_scale)
        y = (x * gs).astype(np.float32).reshape(64, 10, 16)
        s = ss.decode(q.scales, "e4m3").reshape(64, 10, 1)
        qv = np.abs(E2M1[ss.unpack_fp4(q.codes, 160)]).reshape(64, 10, 16)
        e = (np.abs(y) - qv * s).astype(np.float32)
        t = (e * e).astype(np.float32)
        if w is not None:
            t = (t * w.reshape(1, 10, 16)).astype(np.float32)
        acc = np.zeros((64, 10), np.float32)
        for i in range(16):
            acc = (acc + t[:, :, i]).astype(np.float32)
        assert q.losses.dtype == np.float64
        assert np.array_equal(q.losses, acc.astype(np.float64))


def test_shared_global_scale():
    a, b = make_tensor(rows=8, cols=64, seed=1), make_tensor(rows=8, cols=64, seed=2) * 3
    for method in ("absmax", "sweep-mse"):
        c = ss.default_max_block_scale(method)
        assert c == (448 if method == "absmax" else 256)
        amax = float(max(np.abs(a).max(), np.abs(b).max()))
        gs = ss.global_scale_for_amax(amax, c)
        assert gs == ss.quantize(np.concatenate([a, b]), method=method).global_scale
        qa = ss.quantize(a, method=method, global_scale=gs)
        qab = ss.quantize(np.concatenate([a, b]), method=method)
        assert qa.global_scale == gs and np.array_equal(qa.codes, qab.codes[:8])
    assert ss.global_scale_for_amax(0.0) == 1.0
    with pytest.raises(ValueError, match="amax"):
        ss.global_scale_for_amax(float("nan"))


def test_gil_is_released_during_quantize():
    x = np.random.default_rng(0).standard_normal((512, 2048)).astype(np.float32)
    span = {}

    def work():
        span["t0"] = time.perf_counter()
        ss.quantize(x, method="opt-fp8-mse", threads=1)
        span["t1"] = time.perf_counter()

    th = threading.Thread(target=work)
    ticks = []
    th.start()
    while th.is_alive():
        ticks.append(time.perf_counter())
    th.join()
    inside = [t for t in ticks if span["t0"] + 0.05 < t < span["t1"] - 0.05]
    assert span["t1"] - span["t0"] > 0.15, "quantize too fast to observe"
    # with the GIL held, this thread could not run at all while quantize ran
    assert len(inside) > 100, f"{len(inside)} ticks while quantize ran"


# ------------------------------------------------------------------------------- bad input


def bad_cases():
    x = np.ones((4, 32), np.float32)
    nan = x.copy()
    nan[3, 17] = np.nan
    inf = x.copy()
    inf[0, 5] = -np.inf
    imp_neg = np.ones(32, np.float32)
    imp_neg[7] = -1
    q = ss.quantize(x)
    bad_scale = q.scales.copy()
    bad_scale[2, 1] = 0x7F
    return [
        (lambda: ss.quantize(x[0]), ValueError, r"2-D array \[N, K\], got shape \(32,\)"),
        (lambda: ss.quantize(x[None]), ValueError, r"got shape \(1, 4, 32\)"),
        (lambda: ss.quantize(np.ones((0, 16), np.float32)), ValueError, "empty"),
        (lambda: ss.quantize(x.astype(np.float64)), TypeError, "dtype float64"),
        (lambda: ss.quantize(x.astype(np.int32)), TypeError, "dtype int32"),
        (lambda: ss.quantize(x.tolist()), TypeError, "numpy.ndarray, got list"),
        (lambda: ss.quantize(x.astype(">f4")), TypeError, "byte order"),
        (lambda: ss.quantize(nan), ValueError, r"tensor 'x': element \[3, 17\] is NaN"),
        (lambda: ss.quantize(nan, name="w"), ValueError, r"tensor 'w': element \[3, 17\]"),
        (lambda: ss.fake_quantize(inf, method="opt-fp32"), ValueError,
         r"element \[0, 5\] is infinite"),
        (lambda: ss.evaluate(nan), ValueError, r"\[3, 17\] is NaN"),
        (lambda: ss.quantize(x, method="best"), ValueError, "unknown method 'best'"),
        (lambda: ss.quantize(x, block=12), ValueError, "block size 12"),
        (lambda: ss.quantize(x, format="nvfp8"), ValueError, "format 'nvfp8'"),
        (lambda: ss.quantize(x, format="mxfp4"), ValueError, "MXFP4 requires block 32"),
        (lambda: ss.quantize(x, format="mxfp4", block=32, global_scale=2.0), ValueError,
         "MXFP4 has no global scale"),
        (lambda: ss.quantize(x, global_scale=-1.0), ValueError,
         r"global_scale: must be a finite value > 0 \(got -1\)"),
        (lambda: ss.quantize(x, global_scale=float("nan")), ValueError, "global_scale"),
        (lambda: ss.quantize(x, global_scale=1e30), ValueError, "exceeds 2\\^48"),
        (lambda: ss.quantize(x, max_block_scale=500.0), ValueError,
         "max_block_scale: C must satisfy 0 < C <= 448"),
        (lambda: ss.quantize(x, global_scale=2.0, max_block_scale=100.0), ValueError,
         "give one"),
        (lambda: ss.quantize(x, method="sweep"), ValueError, "needs a window"),
        (lambda: ss.quantize(x, method="sweep", window=(3, -3)), ValueError, "lo \\(3\\) > hi"),
        (lambda: ss.quantize(x, method="absmax", window=(-3, 7)), ValueError,
         "window: applies only to sweep"),
        (lambda: ss.quantize(x, method="sweep", window=(-1000, 7)), ValueError, "-125, 125"),
        (lambda: ss.quantize(x, threads=-1), ValueError, "threads"),
        (lambda: ss.quantize(x, scale_layout="col"), ValueError, "scale_layout 'col'"),
        (lambda: ss.quantize(x, method="sweep-wmse", importance=np.ones(31, np.float32)),
         ValueError, r"importance: shape \(31,\) does not match"),
        (lambda: ss.quantize(x, method="sweep-wmse", importance=np.ones(32)), TypeError,
         "importance: dtype float64"),
        (lambda: ss.quantize(x, method="sweep-wmse", importance=imp_neg), ValueError,
         r"element \[7\] is negative"),
        (lambda: ss.error_metrics(x, x[:2]), ValueError, "xhat: shape"),
        (lambda: ss.error_metrics(x, x, importance=imp_neg), ValueError, r"\[7\] is negative"),
        (lambda: ss.error_metrics(nan, x), ValueError, r"tensor 'x': element \[3, 17\] is NaN"),
        (lambda: ss.error_metrics(x, inf), ValueError, r"tensor 'xhat': element \[0, 5\]"),
        (lambda: ss.dequantize(q.codes, q.scales, None, 32), ValueError, "global_scale"),
        (lambda: ss.dequantize(q.codes, q.scales, q.global_scale, 40), ValueError,
         "does not match cols = 40"),
        (lambda: ss.dequantize(q.codes, q.scales[:, :1], q.global_scale, 32), ValueError,
         "scales: shape"),
        (lambda: ss.dequantize(q.codes, bad_scale, q.global_scale, 32), ValueError,
         r"block \[2, 1\] = 0x7f is not a valid E4M3 block scale"),
        (lambda: ss.dequantize(q.codes, q.scales, q.global_scale, 32, scale_layout="swizzled"),
         ValueError, "swizzled"),
        (lambda: ss.dequantize(q.codes.astype(np.int16), q.scales, q.global_scale, 32),
         TypeError, "codes: dtype int16"),
        (lambda: ss.pack_fp4(np.full((2, 4), 16, np.uint8)), ValueError,
         r"\[0, 0\] = 16 is not a 4-bit"),
        (lambda: ss.unswizzle_scales(np.zeros(100, np.uint8), 4, 2), ValueError, "100 bytes"),
        # Padded size 2^64 wrapped to 0 and matched the empty buffer: was a segfault.
        (lambda: ss.unswizzle_scales(np.zeros(0, np.uint8), 2**33, 2**31), ValueError,
         "too large"),
        (lambda: ss.unswizzle_scales(np.zeros(512, np.uint8), 2**62, 4), ValueError,
         "too large"),
        (lambda: ss.bounds(16, elem="e9m9"), ValueError, "e9m9"),
        (lambda: ss.proven_window(127), ValueError, "base_pattern 127"),
    ]


@pytest.mark.parametrize("i", range(len(bad_cases())))
def test_bad_input_raises(i):
    fn, exc, pattern = bad_cases()[i]
    with pytest.raises(exc, match=pattern):
        fn()


def test_non_contiguous_and_readonly_inputs():
    x = make_tensor(rows=32, cols=64, seed=6)
    xt = np.asfortranarray(x)
    xs = make_tensor(rows=32, cols=128, seed=6)[:, ::2]
    ro = x.copy()
    ro.setflags(write=False)
    ref = ss.quantize(x)
    for v in (xt, ro):
        q = ss.quantize(v)
        assert np.array_equal(q.codes, ref.codes) and np.array_equal(q.scales, ref.scales)
    q = ss.quantize(xs)
    r = ss.quantize(np.ascontiguousarray(xs))
    assert np.array_equal(q.codes, r.codes)


# ------------------------------------------------------------------------------- README


def test_readme_python_example_runs():
    from cli_common import run_readme_section
    run_readme_section("python")


def block_hessians(x_cols, block, rng, rank=6):
    """Random positive semi-definite block Hessians, shape (ceil(K/b), b, b), float64."""
    nb = (x_cols + block - 1) // block
    a = rng.normal(size=(nb, rank, block))
    return np.einsum("nri,nrj->nij", a, a) + 0.05 * np.eye(block)


def hessian_loss_np(y, h, s):
    """e^T H e for the round-to-nearest FP4 codes of y at scale s (float64, independent)."""
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    q = grid[np.abs(np.abs(y)[:, None] / s - grid[None, :]).argmin(axis=1)]
    e = y - np.sign(y) * q * s
    return float(e @ h @ e)


def test_block_hessian_importance_selects_by_the_quadratic_form():
    rng = np.random.default_rng(4)
    x = rng.standard_t(3, size=(6, 40)).astype(np.float32)
    h = block_hessians(40, 16, rng)
    q = ss.quantize(x, method="exhaustive-hessian", importance=h)
    assert q.method == "exhaustive-hessian"
    scales = q.scales.reshape(6, 3)
    gs = q.global_scale
    values = np.asarray(ss.decode(np.arange(1, 127, dtype=np.uint8), "e4m3"), np.float64)
    for r in range(6):
        for b in range(3):
            y = (x[r, 16 * b:16 * b + 16].astype(np.float32) * np.float32(gs)).astype(np.float64)
            hb = h[b, :len(y), :len(y)]
            losses = [hessian_loss_np(y, hb, float(v)) for v in values]
            best = min(losses)
            got = losses[int(scales[r, b]) - 1]
            assert got <= best * (1 + 1e-9) + 1e-300, (r, b)
    # Against the diagonal-only selector the block-Hessian one wins on its own objective.
    w = np.ascontiguousarray(np.stack([np.diag(hb) for hb in h]).reshape(-1)[:40]).astype(np.float32)
    qw = ss.quantize(x, method="exhaustive-wmse", importance=w)
    assert not np.array_equal(q.scales, qw.scales)


def test_block_hessian_importance_errors():
    x = np.ones((2, 40), np.float32)
    h = np.tile(np.eye(16), (3, 1, 1))
    with pytest.raises(ValueError, match="needs the block Hessians"):
        ss.quantize(x, method="sweep-hessian")
    with pytest.raises(TypeError, match="block Hessians must be float64"):
        ss.quantize(x, method="sweep-hessian", importance=h.astype(np.float32))
    with pytest.raises(ValueError, match="does not match x of shape"):
        ss.quantize(x, method="sweep-hessian", importance=h[:2])
    with pytest.raises(ValueError, match="read by the \\*-hessian methods only"):
        ss.quantize(x, method="sweep-wmse", importance=h)
    bad = h.copy()
    bad[1, 2, 2] = -1
    with pytest.raises(ValueError, match="block \\[1\\] element \\[2, 2\\] is negative"):
        ss.quantize(x, method="sweep-hessian", importance=bad)
