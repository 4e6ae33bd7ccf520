"""`scalesweep bench` (CPU quantization throughput), checked from the outside on a small
tensor: the JSON has every method for 1 thread and all threads, ratios consistent with the
times, absmax exactly 1, a copy baseline per thread count; bad options fail clearly."""

import json
import os
import subprocess

import pytest

BIN = os.environ.get("SCALESWEEP_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="SCALESWEEP_BIN not set (run through ctest)")


def run(*args):
    return subprocess.run([BIN, "bench", *args], capture_output=True, text=True, timeout=600)


def test_json_is_complete_and_consistent():
    r = run("--rows", "48", "--cols", "200", "--repeat", "1", "--threads", "2", "--json",
            "--methods", "sweep-mse", "sweep-wmse", "exhaustive-mse", "4over6")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["rows"] == 48 and j["cols"] == 200 and j["dtype"] == "bf16"
    assert j["copy_elements_per_s"] > 0
    res = j["results"]
    methods = {"absmax", "sweep-mse", "sweep-wmse", "exhaustive-mse", "4over6"}
    assert {x["method"] for x in res} == methods  # absmax is always added
    assert sorted({x["threads"] for x in res}) == [1, 2]
    for x in res:
        assert x["elements_per_s"] > 0
        absmax = next(a for a in res if a["method"] == "absmax" and a["threads"] == x["threads"])
        assert x["time_vs_absmax"] == pytest.approx(x["seconds"] / absmax["seconds"], rel=1e-9)
        assert x["elements_per_s"] == pytest.approx(48 * 200 / x["seconds"], rel=1e-9)
        if x["method"] == "absmax":
            assert x["time_vs_absmax"] == 1.0
    assert [c["threads"] for c in j["copy"]] == [1, 2]


def test_table_and_fp32():
    r = run("--rows", "16", "--cols", "64", "--repeat", "1", "--dtype", "fp32", "--threads", "1",
            "--methods", "absmax")
    assert r.returncode == 0, r.stderr
    assert "copy (baseline)" in r.stdout and "absmax" in r.stdout


@pytest.mark.parametrize("args,msg", [
    (["--dtype", "int8"], "--dtype"),
    (["--cols", "0"], "positive"),
    (["--methods", "nope"], "unknown method"),
    (["--methods", "opt-fp32"], "opt-fp32"),
    (["--repeat", "0"], "repeat"),
])
def test_bad_options_fail_clearly(args, msg):
    base = ["--rows", "8"] + ([] if "--cols" in args else ["--cols", "32"])
    r = run(*base, *args)
    assert r.returncode != 0
    assert msg in r.stderr


def test_global_scale_modes():
    r = run("--rows", "32", "--cols", "96", "--repeat", "1", "--threads", "2", "--json",
            "--methods", "sweep-mse", "--global-scale", "both")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["global_scale"] == "both"
    res = j["results"]
    keys = {(x["method"], x["threads"], x["global_scale"]) for x in res}
    assert keys == {(m, t, g) for m in ("absmax", "sweep-mse") for t in (1, 2)
                    for g in ("computed", "given")}
    for x in res:
        absmax = next(a for a in res if a["method"] == "absmax" and a["threads"] == x["threads"]
                      and a["global_scale"] == x["global_scale"])
        assert x["time_vs_absmax"] == pytest.approx(x["seconds"] / absmax["seconds"], rel=1e-9)
        copy = next(c for c in j["copy"] if c["threads"] == x["threads"])
        assert x["time_vs_copy"] == pytest.approx(x["seconds"] / copy["seconds"], rel=1e-9)
    for c in j["copy"]:
        assert "absmax_time_vs_copy" in c and "absmax_given_gs_time_vs_copy" in c
    r = run("--rows", "8", "--cols", "32", "--global-scale", "static")
    assert r.returncode != 0 and "--global-scale" in r.stderr
