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
pytestmark = pytest.mark.skipif(not BIN, reason="SCALESWEEP_BIN not set (run through ctest)")


def run(*args):
    return subprocess.run([BIN, "bench-gpu", *args], capture_output=True, text=True, timeout=600)


def built_with_cuda():
    r = run("--k", "48", "--m", "0")
    return "built without CUDA" not in r.stderr


def test_bad_k_is_a_clear_error():
    r = run("--k", "100", "--m", "128", "--runs", "1")
    assert r.returncode != 0
    if built_with_cuda():
        assert "not a multiple of 16" in r.stderr, r.stderr
    else:
        assert "built without CUDA" in r.stderr, r.stderr


def test_bad_method_is_a_clear_error():
    r = run("--methods", "exhaustive-mse", "--m", "128", "--runs", "1")
    assert r.returncode != 0
    assert ("not implemented on CUDA" in r.stderr) or ("built without CUDA" in r.stderr), r.stderr


def test_runs_or_reports_why_not():
    r = run("--k", "256", "--m", "128", "256", "--runs", "3", "--warmup", "1", "--json")
    if r.returncode != 0:
        assert ("built without CUDA" in r.stderr) or ("no CUDA device" in r.stderr), r.stderr
        pytest.skip("no GPU here: " + r.stderr.strip().splitlines()[-1])
    j = json.loads(r.stdout)
    assert j["k"] == 256 and j["device"]
    rows = j["rows"]
    methods = {"absmax", "4over6", "sweep-mse", "sweep-wmse"}
    assert {(x["m"], x["method"]) for x in rows} == {(m, me) for m in (128, 256) for me in methods}
    for x in rows:
        assert x["median_ms"] > 0 and x["min_ms"] <= x["median_ms"]
        in_bytes = x["m"] * 256 * 2
        codes = x["m"] * 128
        swz = ((x["m"] + 127) // 128 * 128) * 16
        extra = 256 * 4 if x["method"] == "sweep-wmse" else 0
        assert x["bytes"] == in_bytes + codes + swz + extra
        assert abs(x["gbps"] - x["bytes"] / (x["median_ms"] * 1e-3) / 1e9) < 1e-6 * x["gbps"]
        if x["method"] == "absmax":
            assert x["rel_absmax"] == pytest.approx(1.0)
