"""`scalesweep bounds`: the exact window derivation and the attack, checked from the outside.

The JSON must carry the paper's NVFP4 numbers exactly (Tables 1-3), the certificates must
re-verify with Python's own exact fractions, and the attack must break a too-narrow window.
"""

import json
import os
import subprocess
from fractions import Fraction as F

import pytest

BIN = os.environ.get("SCALESWEEP_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="SCALESWEEP_BIN not set (run through ctest)")

E2M1 = [F(0), F(1, 2), F(1), F(3, 2), F(2), F(3), F(4), F(6)]


def run(*args):
    return subprocess.run([BIN, "bounds", *args], capture_output=True, text=True, timeout=600)


def derive(*args):
    r = run("--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def d(r, y):
    return min((y - r * g) ** 2 for g in E2M1)


def margin(r, us, lams, m, n):
    """A + (n-1) B by brute force over all breakpoints (independent of the C++ code)."""
    hi = 6 * F(m + 1, m)
    pts = {F(0), F(6), hi}
    for x in [r, *us]:
        for a, b in zip(E2M1, E2M1[1:]):
            p = x * (a + b) / 2
            if 0 < p < hi:
                pts.add(p)

    def delta(y):
        return sum(l * d(u, y) for u, l in zip(us, lams)) - d(r, y)

    A = max(delta(y) for y in pts if y >= 6)
    B = max(delta(y) for y in pts)
    return A + (n - 1) * B


def test_nvfp4_tables_match_the_paper():
    j = derive()
    assert j["upper"]["alpha"] == "12/7"
    assert [r["paper_delta"] for r in j["upper"]["rows"]] == [7, 7, 7, 7, 7, 7, 6, 6]
    assert [r["delta"] for r in j["upper"]["rows"]] == [7, 7, 7, 7, 7, 6, 6, 6]
    assert j["lower"]["ell"] == "4/5"
    assert [r["delta"] for r in j["lower"]["rows"]] == [3, 2, 2, 2, 2, 2, 2, 3]
    assert [r["inf"] for r in j["lower"]["rows"]][:2] == ["1 101", "1 111"]
    assert j["window"] == [-3, 7]
    paper = {c["r"]: c["margin"] for c in j["paper_certificates"]}
    assert paper == {"7/9": "-781/5184", "10/13": "-7/169", "11/14": "-1/196"}
    assert sorted(c["r"] for c in j["certificates"]) == ["10/13", "11/14", "7/9"]


def test_certificates_reverify_in_python_fractions():
    for n in (16, 32):
        j = derive("--block", str(n))
        assert j["certificates"], n
        for c in j["certificates"]:
            us = [F(u) for u in c["u"]]
            lams = [F(l) for l in c["lambda"]]
            assert sum(lams) == 1
            got = margin(F(c["r"]), us, lams, c["m"], n)
            assert str(got) == c["margin"], (n, c["r"])
            assert got < 0 and c["valid"]


def test_per_base_windows_and_mxfp4():
    j = derive()
    pb = {p["pattern"]: p["window"] for p in j["per_base"]}
    assert pb[56] == [-3, 7] and pb[61] == [-2, 6] and pb[1] == [0, 14] and pb[126] is None
    mx = derive("--scale", "ue8m0", "--block", "32")
    assert mx["window"] == [0, 1]
    assert all(p["window"] == [0, 1] for p in mx["per_base"] if 1 <= p["pattern"] <= 252)


def test_attack_breaks_narrow_window_and_spares_the_paper_window():
    r = run("--attack", "--window=-2,6", "--blocks", "300", "--base", "56", "--base", "63",
            "--json", "--fail-on-hit")
    assert r.returncode == 2, r.stderr
    j = json.loads(r.stdout)
    assert j["hits"] and all(h["offset"] > 6 or h["offset"] < -2 for h in j["hits"])
    r = run("--attack", "--blocks", "300", "--base", "56", "--base", "3", "--fail-on-hit")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 counterexample(s)" in r.stdout


def test_bad_options_are_clear_errors():
    for args, msg in [(["--elem", "e9m9"], "unknown element format"),
                      (["--scale", "fp16"], "unknown scale format"),
                      (["--block", "0"], "--block must be in 1..1024"),
                      (["--attack", "--window=3,1"], "expected L,R")]:
        r = run(*args)
        assert r.returncode != 0 and msg in r.stderr, (args, r.stderr)
