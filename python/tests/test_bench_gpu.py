"""`scalesweep bench-gpu` (CUDA operator benchmark), checked from the outside.

Every build has the command: without the CUDA kernels it must fail with "built without CUDA",
with them but without a device with "no CUDA device: <reason>", and bad options must fail with
a clear message before any device is touched. Where a GPU exists, the JSON output is checked
for completeness and consistency (bytes, bandwidth, ratios).
"""

import json
import os
import subprocess

import pytest

BIN = os.environ.get("SCALESWEEP_BIN")
needs_bin = pytest.mark.skipif(not BIN, reason="SCALESWEEP_BIN not set (run through ctest)")


def run(*args):
    return subprocess.run([BIN, "bench-gpu", *args], capture_output=True, text=True, timeout=600)


def built_with_cuda():
    r = run("--k", "48", "--m", "0")
    return "built without CUDA" not in r.stderr


@needs_bin
def test_bad_k_is_a_clear_error():
    r = run("--k", "100", "--m", "128", "--runs", "1")
    assert r.returncode != 0
    if built_with_cuda():
        assert "not a multiple of 16" in r.stderr, r.stderr
    else:
        assert "built without CUDA" in r.stderr, r.stderr


@needs_bin
def test_bad_method_is_a_clear_error():
    r = run("--methods", "opt-fp8-mse", "--m", "128", "--runs", "1")
    assert r.returncode != 0
    assert ("not implemented on CUDA" in r.stderr) or ("built without CUDA" in r.stderr), r.stderr


@needs_bin
def test_bad_numerics_is_a_clear_error():
    r = run("--numerics", "approx", "--m", "128", "--runs", "1")
    assert r.returncode != 0
    assert ("--numerics: unknown numerics 'approx'" in r.stderr) or (
        "built without CUDA" in r.stderr), r.stderr


@needs_bin
def test_runs_or_reports_why_not():
    r = run("--k", "256", "--m", "128", "256", "--runs", "3", "--warmup", "1", "--json")
    if r.returncode != 0:
        assert ("built without CUDA" in r.stderr) or ("no CUDA device" in r.stderr), r.stderr
        pytest.skip("no GPU here: " + r.stderr.strip().splitlines()[-1])
    j = json.loads(r.stdout)
    assert j["k"] == 256 and j["device"]
    rows = j["rows"]
    # default: --numerics all; the sweeps get an exact, a fast and a half2 row, the others
    # exact only
    series = {("absmax", "exact"), ("4over6", "exact"), ("sweep-mse", "exact"),
              ("sweep-mse", "fast"), ("sweep-mse", "half2"), ("sweep-wmse", "exact"),
              ("sweep-wmse", "fast"), ("sweep-wmse", "half2"), ("exhaustive-mse", "exact")}
    assert {(x["m"], x["method"], x["numerics"]) for x in rows} == {
        (m, me, nu) for m in (128, 256) for me, nu in series}
    for x in rows:
        assert x["median_ms"] > 0 and x["min_ms"] <= x["median_ms"]
        in_bytes = x["m"] * 256 * 2
        codes = x["m"] * 128
        swz = ((x["m"] + 127) // 128 * 128) * 16
        extra = 256 * 4 if x["method"] in ("sweep-wmse", "exhaustive-wmse") else 0
        assert x["bytes"] == in_bytes + codes + swz + extra
        assert abs(x["gbps"] - x["bytes"] / (x["median_ms"] * 1e-3) / 1e9) < 1e-6 * x["gbps"]
        if x["method"] == "absmax":
            assert x["rel_absmax"] == pytest.approx(1.0)


# ---- scripts/sass_count.py (static SASS table of docs/CUDA.md): the parser on a synthetic
# listing, no CUDA toolkit needed.
def _sass_count():
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "sass_count.py")
    spec = importlib.util.spec_from_file_location("sass_count", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _listing(name, body):
    lines = [f"\t\tFunction : {name}"]
    for i, ins in enumerate(body):
        lines.append(f"        /*{16 * i:04x}*/                   {ins} ;   /* 0x0 */")
    return "\n".join(lines)


def test_sass_count_finds_grid_and_candidate_loops():
    sc = _sass_count()
    body = ["S2R R0, SR_TID.X"]                                   # 0x00
    body += ["LDG.E.128 R4, desc[UR4][R2.64]"]                    # 0x10: grid loop start
    body += ["FADD R1, R1, R2"] * 30                              # 0x20..
    cand_start = 16 * len(body)
    body += ["HSET2.BF16_V2.BF.GT.AND R5, R6, R7, PT"] * 40
    body += ["FMUL R8, R8, R8"] * 30
    body += ["ISETP.GE.AND P0, PT, R9, R10, PT"]
    body += [f"@P0 BRA 0x{cand_start:x}"]                          # candidate loop, 72 instr
    body += ["STG.E.64 desc[UR4][R2.64], R4"]
    body += ["@!P1 BRA 0x10"]                                      # grid loop back edge
    body += ["EXIT"]
    funcs = sc.functions(_listing("kern_a", body))
    r = sc.analyse(funcs["kern_a"])
    assert r["total"] == len(body)
    assert r["scans"] == 1 and r["cand"] == 72
    assert r["block"] == len(body) - 2  # from 0x10 to the grid back edge
    assert r["h16"] == 40 and r["fp32"] == 30 and r["ffma_in_scans"] == 0
    # a contracted e*e + L in the loss loop is reported
    body2 = list(body)
    body2[cand_start // 16 + 45] = "FFMA R8, R8, R8, R1"
    r2 = sc.analyse(sc.functions(_listing("kern_b", body2))["kern_b"])
    assert r2["ffma_in_scans"] == 1


def test_sass_count_prediction_formula():
    sc = _sass_count()
    r = {"method": "sweep-mse", "block": 1000, "cand": 200, "scans": 2}
    # the block holds the peeled first candidate and one body of each scan
    assert sc.dynamic_per_block(r, {"sweep-mse": 10}) == 1000 + 7 * 200
    assert sc.dynamic_per_block({"method": "absmax", "block": 368, "cand": 0}, {}) == 368
