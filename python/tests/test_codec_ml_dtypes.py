"""The generic minifloat codec (through `scalesweep cast`) against ml_dtypes.

- >= 1,000,000 random float32 values per format, rounded to nearest-even by scalesweep and by
  ml_dtypes (float8_e4m3fn, float4_e2m1fn), compared bit for bit inside the finite range.
- Saturation (SPEC: RNE saturates at the max finite value) is tested on its own, since
  ml_dtypes does not saturate (e4m3fn values >= 464 become NaN there).
- floor / ceil rounding against a numpy search over the decoded grid.
- Every bit pattern (256 for E4M3, 16 for E2M1, 256 for UE8M0) decodes identically, and
  UE8M0 rounding (incl. ties) matches float8_e8m0fnu.
"""
import os
import subprocess

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")

BIN = os.environ.get("SCALESWEEP_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="SCALESWEEP_BIN not set (run through ctest)")

N = 1_000_000
FORMATS = {
    # name: (ml_dtypes type, max finite, smallest positive subnormal)
    "e4m3": (ml_dtypes.float8_e4m3fn, 448.0, 2.0**-9),
    "e2m1": (ml_dtypes.float4_e2m1fn, 6.0, 0.5),
}


def cast(tmp_path, x, *args):
    src = tmp_path / "in.npy"
    dst = tmp_path / "out.npy"
    np.save(src, x)
    r = subprocess.run([BIN, "cast", str(src), *args, "-o", str(dst), "--force"],  # dst is reused
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return np.load(dst)


def random_in_range(rng, fmt, n):
    """Random float32 in [-max, max] with magnitudes spread over every binade, plus exact grid
    points, exact midpoints between neighbours, and values one ulp either side of them."""
    _, vmax, vmin = FORMATS[fmt]
    mags = np.exp2(rng.uniform(np.log2(vmin) - 3, np.log2(vmax), n)).astype(np.float32)
    grid = decoded_grid(fmt)
    mids = ((grid[1:].astype(np.float64) + grid[:-1]) / 2).astype(np.float32)
    special = np.concatenate([grid, mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf)])
    special = np.tile(special, 200)[: n // 5]
    mags[: special.size] = special
    # Also raw random float32 bit patterns (every mantissa bit pattern), kept in range.
    bits = rng.integers(0, 2**31, n // 5, dtype=np.uint32).view(np.float32)
    bits = bits[np.isfinite(bits) & (bits <= vmax)]
    mags[special.size : special.size + bits.size] = bits
    x = np.minimum(mags, np.float32(vmax))
    sign = rng.integers(0, 2, n).astype(bool)
    return np.where(sign, -x, x).astype(np.float32)


def decoded_grid(fmt):
    """Non-negative finite grid values of the format, from ml_dtypes."""
    t = FORMATS[fmt][0]
    n = 8 if fmt == "e2m1" else 128
    v = np.arange(n, dtype=np.uint8).view(t).astype(np.float32)
    return np.unique(v[np.isfinite(v)])


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_rne_matches_ml_dtypes_inside_finite_range(tmp_path, fmt):
    rng = np.random.default_rng(1234 if fmt == "e4m3" else 5678)
    x = random_in_range(rng, fmt, N)
    ours = cast(tmp_path, x, "--to", fmt, "--round", "rne")
    ref = x.astype(FORMATS[fmt][0]).view(np.uint8)
    if fmt == "e2m1":
        ref = ref & 0x0F
    assert ours.shape == x.shape and ours.dtype == np.uint8
    bad = np.nonzero(ours != ref)[0]
    assert bad.size == 0, (
        f"{bad.size} of {x.size} differ, first x={x[bad[0]]!r} ours={ours[bad[0]]} ref={ref[bad[0]]}"
    )


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_saturation(tmp_path, fmt):
    _, vmax, _ = FORMATS[fmt]
    maxpat = 0x7E if fmt == "e4m3" else 0x7
    sign = 0x80 if fmt == "e4m3" else 0x8
    big = np.array([vmax, vmax * 1.01, vmax * 1.5, vmax * 2, 1e30, np.finfo(np.float32).max],
                   np.float32)
    x = np.concatenate([big, -big])
    ours = cast(tmp_path, x, "--to", fmt)
    assert (ours[: big.size] == maxpat).all(), ours
    assert (ours[big.size :] == (maxpat | sign)).all(), ours
    # Inf saturates too once non-finite values are allowed; NaN is NaN (E4M3) or max (E2M1).
    inf = np.array([np.inf, -np.inf, np.nan], np.float32)
    ours = cast(tmp_path, inf, "--to", fmt, "--allow-nonfinite")
    assert ours[0] == maxpat and ours[1] == maxpat | sign
    assert ours[2] == (0x7F if fmt == "e4m3" else maxpat)


def test_nonfinite_rejected_by_default(tmp_path):
    x = np.array([1.0, 2.0, np.nan], np.float32)
    np.save(tmp_path / "nan.npy", x)
    r = subprocess.run([BIN, "cast", str(tmp_path / "nan.npy"), "--to", "e4m3",
                        "-o", str(tmp_path / "o.npy")], capture_output=True, text=True)
    assert r.returncode != 0
    assert "element 2" in r.stderr and "NaN" in r.stderr and "nan.npy" in r.stderr
    assert not (tmp_path / "o.npy").exists()


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("mode", ["floor", "ceil"])
def test_directed_rounding_against_grid_search(tmp_path, fmt, mode):
    rng = np.random.default_rng(99)
    x = random_in_range(rng, fmt, 200_000)
    grid = decoded_grid(fmt).astype(np.float64)
    full = np.unique(np.concatenate([-grid, grid]))  # sorted signed grid
    xd = x.astype(np.float64)
    if mode == "floor":
        idx = np.searchsorted(full, xd, side="right") - 1
    else:
        idx = np.searchsorted(full, xd, side="left")
    idx = np.clip(idx, 0, full.size - 1)
    expect = full[idx]
    ours = cast(tmp_path, x, "--to", fmt, "--round", mode)
    t = FORMATS[fmt][0]
    if fmt == "e2m1":
        got = ours.view(t).astype(np.float64)
    else:
        got = ours.view(t).astype(np.float64)
    # Compare values (the sign of zero aside).
    bad = np.nonzero(got != expect)[0]
    assert bad.size == 0, f"x={x[bad[0]]!r} got={got[bad[0]]} expect={expect[bad[0]]}"


@pytest.mark.parametrize("fmt,count,ref", [
    ("e4m3", 256, ml_dtypes.float8_e4m3fn),
    ("e2m1", 16, ml_dtypes.float4_e2m1fn),
    ("ue8m0", 256, ml_dtypes.float8_e8m0fnu),
])
def test_every_pattern_decodes_identically(tmp_path, fmt, count, ref):
    pats = np.arange(count, dtype=np.uint8)
    ours = cast(tmp_path, pats, "--from", fmt)
    theirs = pats.view(ref).astype(np.float32)
    assert ours.dtype == np.float32
    assert np.array_equal(np.isnan(ours), np.isnan(theirs))
    ok = ~np.isnan(theirs)
    assert np.array_equal(ours[ok].view(np.uint32), theirs[ok].view(np.uint32))  # incl. -0.0


def test_ue8m0_rounding_matches_ml_dtypes(tmp_path):
    # Random values over the whole exponent range, exact powers of two, and exact ties
    # 1.5 * 2^e (both round up to 2^(e+1)), against ml_dtypes' float8_e8m0fnu.
    rng = np.random.default_rng(7)
    e = rng.integers(-127, 127, 200_000)
    frac = rng.uniform(1.0, 2.0, e.size)
    frac[:1000] = 1.0
    frac[1000:2000] = 1.5
    x = (np.exp2(e) * frac).astype(np.float32)
    x = x[(x > 0) & np.isfinite(x)]
    ours = cast(tmp_path, x, "--to", "ue8m0")
    theirs = x.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    # ml_dtypes rounds float32-SUBNORMAL inputs in (2^-127, 1.5 * 2^-127) up to 2^-126;
    # the exact nearest value there is 2^-127 (pattern 0). Compare normal inputs with
    # ml_dtypes, subnormal ones with the exact nearest of {2^-127, 2^-126}.
    normal = x >= np.float32(2.0**-126)
    bad = np.nonzero((ours != theirs) & normal)[0]
    assert bad.size == 0, f"x={x[bad[0]]!r} ours={ours[bad[0]]} theirs={theirs[bad[0]]}"
    sub = x[~normal].astype(np.float64)
    assert sub.size > 100
    exact = np.where(sub >= 1.5 * 2.0**-127, 1, 0)
    assert np.array_equal(ours[~normal], exact)


def test_bad_format_name(tmp_path):
    np.save(tmp_path / "x.npy", np.ones(3, np.float32))
    r = subprocess.run([BIN, "cast", str(tmp_path / "x.npy"), "--to", "e3m4",
                        "-o", str(tmp_path / "o.npy")], capture_output=True, text=True)
    assert r.returncode != 0 and "e3m4" in r.stderr
    assert not (tmp_path / "o.npy").exists()
