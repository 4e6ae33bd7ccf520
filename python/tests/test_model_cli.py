"""End-to-end tests of `scalesweep generate`, `ppl` and `calibrate` on stories260K.

- generate: the known greedy continuation from BOS (data README), the --json schema.
- ppl: FP perplexity on the start of tinystories_val.txt in its known neighbourhood, the
  --json schema; every simulated NVFP4 setting (W/WA/WAKV/WAKVQ) gives a finite perplexity
  worse than FP but sane.
- MXFP4 simulated quantization (--format mxfp4): block 32 by default, finite and sane, not the
  NVFP4 result; impossible format/block/method combinations are clear errors.
- calibrate: writes a statistics file that reads back with the `safetensors` package with the
  documented tensors, and that ppl accepts with --stats.
- Bad input: non-zero exit with a message naming the problem, no output file left behind.
"""
import json
import math
import os
import subprocess

import pytest

from cli_common import BIN, DATA, MODEL, TOK, VAL, need_bin, need_files  # noqa: F401

pytestmark = [need_bin, need_files(MODEL, TOK, VAL)]

EXPECTED = ("Once upon a time, there was a little girl named Lily. She loved to play outside in "
            "the park.")
MAX_TOKENS = "4096"


def run(*args, check=True):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} failed ({p.returncode}): {p.stderr}")
    return p


def ppl_json(*extra):
    p = run("ppl", MODEL, "--tokenizer", TOK, "--text", VAL, "--max-tokens", MAX_TOKENS,
            "--json", *extra)
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def stats(tmp_path_factory):
    out = tmp_path_factory.mktemp("calib") / "stats.safetensors"
    run("calibrate", MODEL, "--tokenizer", TOK, "--text", VAL, "--nsamples", "16",
        "--seqlen", "256", "--seed", "0", "-o", str(out))
    return out


def test_generate_greedy_known_story():
    p = run("generate", MODEL, "--tokenizer", TOK, "-n", "200", "--temperature", "0")
    assert p.stdout.startswith(EXPECTED), p.stdout[:200]
    # The tokenizer is found beside the model when not given (tok512.bin).
    j = json.loads(run("generate", MODEL, "-n", "200", "--temperature", "0", "--json").stdout)
    assert j["text"].startswith(EXPECTED)
    assert j["n_prompt_tokens"] == 1
    assert 0 < j["n_generated"] <= 200 and len(j["tokens"]) == j["n_generated"]
    assert j["decode_tokens_per_s"] > 0


def test_generate_prompt_and_sampling_is_seeded():
    a = run("generate", MODEL, "--prompt", "Once upon a time", "-n", "40", "--temperature", "0.9",
            "--seed", "5", "--json").stdout
    b = run("generate", MODEL, "--prompt", "Once upon a time", "-n", "40", "--temperature", "0.9",
            "--seed", "5", "--json").stdout
    assert json.loads(a)["text"] == json.loads(b)["text"]
    assert json.loads(a)["text"].startswith("Once upon a time")


def test_ppl_fp_in_known_range():
    j = ppl_json()
    assert set(j) >= {"tokens", "nll_per_token", "ppl", "seconds", "prefill_tokens_per_s"}
    assert j["tokens"] > 4000
    # Reference: about 1.63 nats/token on tinystories_val.txt; an untrained model ~ln 512.
    assert 1.2 < j["nll_per_token"] < 1.8
    assert math.isclose(j["ppl"], math.exp(j["nll_per_token"]), rel_tol=1e-9)
    # Overlapping windows condition on more context: not worse.
    k = ppl_json("--ctx", "256", "--stride", "128")
    assert k["nll_per_token"] < j["nll_per_token"] + 0.05


@pytest.mark.parametrize("setting", ["W", "WA", "WAKV", "WAKVQ"])
def test_ppl_every_quant_setting(stats, setting):
    fp = ppl_json()["nll_per_token"]
    for method in ["absmax", "sweep-wmse"]:
        j = ppl_json("--quant", setting, "--method", method, "--stats", str(stats))
        assert j["quant"] == setting and j["method"] == method
        assert math.isfinite(j["nll_per_token"])
        assert fp < j["nll_per_token"] < fp + 2.0, (setting, method, j)


def test_ppl_quant_calibrates_on_the_fly():
    j = ppl_json("--quant", "WA", "--method", "sweep-mse", "--calib", VAL, "--calib-nsamples", "8",
                 "--calib-seqlen", "128")
    assert math.isfinite(j["nll_per_token"])
    p = run("ppl", MODEL, "--text", VAL, "--quant", "WA", "--method", "absmax", check=False)
    assert p.returncode != 0 and "--stats" in p.stderr


@pytest.mark.parametrize("setting", ["W", "WA"])
def test_ppl_mxfp4(stats, setting):
    fp = ppl_json()["nll_per_token"]
    res = {}
    for method in ["absmax", "sweep-mse"]:
        j = ppl_json("--quant", setting, "--format", "mxfp4", "--method", method, "--stats",
                     str(stats))
        assert j["quant"] == setting and j["method"] == method
        assert j["format"] == "mxfp4" and j["block"] == 32
        assert fp < j["nll_per_token"] < fp + 2.0, (setting, method, j)
        res[method] = j["nll_per_token"]
        # Same block size in NVFP4 is a different (E4M3-scaled) result.
        n = ppl_json("--quant", setting, "--format", "nvfp4", "--block", "32", "--method", method,
                     "--stats", str(stats))
        assert n["format"] == "nvfp4" and n["block"] == 32
        assert n["nll_per_token"] != j["nll_per_token"]
    # --block 32 given explicitly is the default.
    k = ppl_json("--quant", setting, "--format", "MXFP4", "--block", "32", "--method", "sweep-mse",
                 "--stats", str(stats))
    assert k["nll_per_token"] == res["sweep-mse"]


def test_generate_mxfp4_json(stats):
    j = json.loads(run("generate", MODEL, "-n", "20", "--temperature", "0", "--quant", "WAKVQ",
                       "--format", "mxfp4", "--method", "sweep-wmse", "--stats", str(stats),
                       "--json").stdout)
    assert j["format"] == "mxfp4" and j["block"] == 32 and j["quant"] == "WAKVQ"
    assert j["n_generated"] > 0


@pytest.mark.parametrize("args,frags", [
    (["--format", "mxfp4", "--block", "16"], ["MXFP4", "16", "--block: "]),
    (["--format", "mxfp4", "--block", "64"], ["MXFP4", "64"]),
    (["--format", "fp8"], ["fp8", "nvfp4, mxfp4"]),
    (["--method", "sweep"], ["sweep", "window"]),
    (["--block", "12"], ["12", "8, 16, 32, 64"]),
])
@pytest.mark.parametrize("cmd", ["ppl", "generate"])
def test_impossible_format_combinations(tmp_path, cmd, args, frags):
    extra = ["--text", VAL] if cmd == "ppl" else ["-n", "4"]
    p = run(cmd, MODEL, *extra, "--quant", "W", *args, check=False)
    assert p.returncode == 1, p.stderr
    assert "terminate called" not in p.stderr
    for f in frags:
        assert f in p.stderr, (f, p.stderr)


@pytest.mark.parametrize("args,named", [
    (["--format", "mxfp4"], "--format"),
    (["--method", "absmax"], "--method"),
    (["--block", "32"], "--block"),
    (["--quant", "FP", "--format", "mxfp4", "--block", "32"], "--format"),
])
@pytest.mark.parametrize("cmd", ["ppl", "generate"])
def test_shaping_options_without_quant_refused(cmd, args, named):
    # --format/--method/--block only shape --quant: without it the run would silently be FP.
    extra = ["--text", VAL] if cmd == "ppl" else ["-n", "4"]
    p = run(cmd, MODEL, *extra, *args, check=False)
    assert p.returncode == 1, p.stderr
    assert f"{named}: given without a simulated-quantization setting" in p.stderr, p.stderr
    assert "set quant to W, WA, WAKV or WAKVQ" in p.stderr, p.stderr


def test_calibrate_file_contents(stats):
    from safetensors.numpy import load_file
    import numpy as np
    t = load_file(str(stats))
    h = t["layers.0.attn_in.xtx"]
    assert h.dtype == np.float64 and h.shape == (64, 64)
    assert np.allclose(h, h.T)
    assert np.all(np.diag(h) >= 0)
    assert t["layers.4.mlp_out.xtx"].shape == (172, 172)
    assert int(t["layers.2.attn_out.tokens"][0]) == 16 * 256
    assert t["layers.1.q.sqnorm"].shape == (64,)
    assert t["layers.1.k.sqnorm"].shape == (32,)
    assert float(t["layers.3.v.amax"][0]) > 0
    # Same seed: identical statistics.
    out2 = stats.parent / "again.safetensors"
    run("calibrate", MODEL, "--text", VAL, "--nsamples", "16", "--seqlen", "256", "--seed", "0",
        "-o", str(out2))
    assert np.array_equal(load_file(str(out2))["layers.0.attn_in.xtx"], h)


def test_bad_inputs(tmp_path):
    p = run("ppl", str(tmp_path / "nope.bin"), "--text", VAL, check=False)
    assert p.returncode != 0 and "nope.bin" in p.stderr
    bad = tmp_path / "bad.bin"
    bad.write_bytes(open(MODEL, "rb").read()[:1000])
    p = run("generate", str(bad), "--tokenizer", TOK, check=False)
    assert p.returncode != 0 and "bad.bin" in p.stderr and "needs" in p.stderr
    p = run("ppl", MODEL, "--text", VAL, "--quant", "W4", check=False)
    assert p.returncode != 0 and "W4" in p.stderr
    p = run("ppl", MODEL, "--text", VAL, "--quant", "W", "--method", "nosuch", check=False)
    assert p.returncode != 0 and "nosuch" in p.stderr
    p = run("ppl", MODEL, "--text", VAL, "--ctx", "4096", check=False)
    assert p.returncode != 0 and "max_seq_len" in p.stderr
    out = tmp_path / "s.safetensors"
    # --seqlen above max_seq_len is capped with a note (team policy), not refused.
    p = run("calibrate", MODEL, "--text", VAL, "--seqlen", "9999", "--nsamples", "2", "-o",
            str(out))
    assert "note: --seqlen 9999 exceeds" in p.stderr and out.exists()
    p = run("calibrate", MODEL, "--text", str(tmp_path / "missing.txt"), "-o",
            str(tmp_path / "m.safetensors"), check=False)
    assert p.returncode != 0 and "missing.txt" in p.stderr
    assert not (tmp_path / "m.safetensors").exists()
    p = run("ppl", MODEL, "--text", VAL, "--quant", "WA", "--stats", str(bad), check=False)
    assert p.returncode != 0 and "bad.bin" in p.stderr


def test_converted_hf_directory_runs_the_same(tmp_path):
    out = tmp_path / "hf"
    p = run("convert", MODEL, "--tokenizer", TOK, "-o", str(out), check=False)
    if p.returncode != 0 and "convert" in p.stderr and "subcommand" in p.stderr.lower():
        pytest.skip("convert command not available")
    assert p.returncode == 0, p.stderr
    j = json.loads(run("generate", str(out), "-n", "200", "--temperature", "0", "--json").stdout)
    assert j["text"].startswith(EXPECTED)
    a = ppl_json()
    b = json.loads(run("ppl", str(out), "--text", VAL, "--max-tokens", MAX_TOKENS, "--json").stdout)
    assert a["tokens"] == b["tokens"]
    assert abs(a["nll_per_token"] - b["nll_per_token"]) < 1e-5


def test_experiment_mxfp4_rtn_matches_ppl(tmp_path):
    # experiment --format mxfp4 (RTN rows) runs the same simulated model as ppl --format mxfp4
    # with the same calibration: identical NLL per cell. GPTQ rows are refused for MXFP4.
    text = tmp_path / "t.txt"
    with open(VAL) as f:
        text.write_text(f.read(20000))
    cal = ["--nsamples", "4", "--seqlen", "128", "--seed", "1"]
    j = json.loads(run("experiment", MODEL, "--eval", str(text), "--calib", str(text), *cal,
                       "--max-tokens", "1500", "--format", "mxfp4", "--no-gptq", "--methods",
                       "absmax,sweep-mse", "--settings", "W,WA", "--no-errors", "--json").stdout)
    assert j["format"] == "mxfp4" and j["block"] == 32 and len(j["cells"]) == 4
    stats = tmp_path / "s.safetensors"
    run("calibrate", MODEL, "--text", str(text), *cal, "-o", str(stats))
    for c in j["cells"]:
        p = json.loads(run("ppl", MODEL, "--text", str(text), "--max-tokens", "1500", "--quant",
                           c["setting"], "--format", "mxfp4", "--method", c["method"], "--stats",
                           str(stats), "--json").stdout)
        assert p["nll_per_token"] == pytest.approx(c["nll_per_token"], rel=1e-12, abs=0), c
    p = run("experiment", MODEL, "--eval", str(text), "--calib", str(text), "--format", "mxfp4",
            check=False)
    assert p.returncode == 1 and "--no-gptq" in p.stderr and "mxfp4" in p.stderr
    p = run("experiment", MODEL, "--eval", str(text), "--calib", str(text), "--format", "mxfp4",
            "--no-gptq", "--block", "16", check=False)
    assert p.returncode == 1 and "MXFP4" in p.stderr and "16" in p.stderr
