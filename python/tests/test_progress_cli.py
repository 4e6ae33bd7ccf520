"""Progress without a terminal: whole lines (here stderr is a pipe), per decoder layer for
quantize, with rates from wall time that agree with the command's own summary."""
import json
import os
import re
import subprocess

from cli_common import BIN, MODEL, VAL, need_bin, need_files

import pytest

pytestmark = [need_bin, need_files(MODEL, VAL)]


def run(*args, interval="0"):
    env = dict(os.environ, SCALESWEEP_PROGRESS_INTERVAL=interval)
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, f"{args}: rc={p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


# The rate is "N unit/s", or "N s/unit" for steps slower than one a second (group 6 or 7).
LINE = re.compile(r"^(\w[\w ()]*): (\d+)/(\d+) (\w+) \((\d+)%\), "
                  r"(?:([\d.]+) \4/s|([\d.]+) s/\4), elapsed "
                  r"(\d\d:\d\d)(?:, ETA (\d\d:\d\d)|, done)$")


def rate(m):
    """Units per second of a progress line."""
    return float(m.group(6)) if m.group(6) else 1.0 / float(m.group(7))


def progress_lines(stderr, label):
    out = []
    for line in stderr.splitlines():
        assert "\r" not in line and "\033" not in line, repr(line)  # no terminal drawing
        m = LINE.match(line)
        if m and m.group(1) == label:
            out.append(m)
    return out


def test_quantize_gptq_prints_a_line_per_layer(tmp_path):
    p = run("quantize", MODEL, "-o", str(tmp_path / "q"), "--gptq", "--method", "absmax",
            "--calib", VAL, "--nsamples", "4", "--seqlen", "64")
    lines = progress_lines(p.stderr, "quantize")
    n_layers = 5  # stories260K
    assert [int(m.group(2)) for m in lines] == [7 * (i + 1) for i in range(n_layers)], p.stderr
    assert all(int(m.group(3)) == 7 * n_layers and m.group(4) == "linear" for m in lines)
    assert lines[-1].group(0).endswith(", done")
    assert all(m.group(9) for m in lines[:-1])  # ETA on the others
    assert len(progress_lines(p.stderr, "calibrate")) == 4  # one per sequence here


def test_lines_are_rate_limited_by_default_interval(tmp_path):
    # With a 3 s interval a sub-second run prints its first layer and the final line only.
    p = run("quantize", MODEL, "-o", str(tmp_path / "q"), "--method", "absmax", interval="3")
    lines = progress_lines(p.stderr, "quantize")
    assert [int(m.group(2)) for m in lines] == [7, 35], p.stderr
    assert lines[-1].group(0).endswith(", done")


def test_ppl_bar_and_summary_agree():
    p = run("ppl", MODEL, "--text", VAL, "--max-tokens", "4000", "--json")
    j = json.loads(p.stdout)
    lines = progress_lines(p.stderr, "ppl")
    assert len(lines) == j["windows"], p.stderr  # one line per window (interval 0)
    last = lines[-1]
    assert int(last.group(2)) == int(last.group(3)) == j["prefill_tokens"]
    # Same count, same clock: the rates agree within the bar's start-up (loading is before it).
    assert rate(last) == pytest.approx(j["prefill_tokens_per_s"], rel=0.1)


def test_experiment_stages_name_their_units():
    """Each experiment stage counts in its own unit: tokens for perplexity, Linears for the
    RTN rows' weight quantization (stories260K: 5 layers x 7 Linears), calibration sequences
    for the calibration, during which the GPTQ rows are built layer by layer."""
    p = run("experiment", MODEL, "--calib", VAL, "--eval", VAL, "--nsamples", "4", "--seqlen",
            "64", "--max-tokens", "512", "--methods", "absmax", "--settings", "W", "--no-errors")
    fp = progress_lines(p.stderr, "FP")
    assert fp and all(m.group(4) == "tok" for m in fp), p.stderr
    w = progress_lines(p.stderr, "RTN absmax weights")
    assert w and all(m.group(4) == "linear" for m in w), p.stderr
    assert w[-1].group(2) == w[-1].group(3) == "35", p.stderr
    c = progress_lines(p.stderr, "calibrate and quantize (GPTQ rows)")
    assert c and all(m.group(4) == "seq" for m in c), p.stderr
    assert c[-1].group(2) == c[-1].group(3) == "4", p.stderr
    assert not progress_lines(p.stderr, "GPTQ absmax weights"), p.stderr
