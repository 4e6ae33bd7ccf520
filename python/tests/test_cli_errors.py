"""Bad input to the CLI: a non-zero exit, a message naming the option or file, no crash and no
output left behind. Covers the option checks added in the CLI review (experiment's counts,
window, damping and empty --methods/--settings lists, the --report-dir that is checked before
the run, ppl --max-tokens, quantize --nsamples/--seqlen/--gptq-block, the GPTQ scale names, bench-gpu
--k/--runs/--warmup, tokenize's exclusive inputs, inspect's directory check, an output that is one of the
inputs) and a sweep of missing/corrupt inputs and unwritable outputs over every subcommand that reads a model or
writes a file.
"""
import os
import subprocess

import numpy as np
import pytest

from cli_common import BIN, DATA, MODEL, VAL, need_bin, need_data  # noqa: F401

pytestmark = need_bin


def fails(*args, names):
    """Runs the CLI, expects a clean failure whose message contains every string in `names`."""
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300)
    msg = p.stdout + p.stderr
    assert p.returncode not in (0, None), f"{args} succeeded: {msg}"
    assert p.returncode < 128 and p.returncode > 0, f"{args} crashed ({p.returncode}): {msg}"
    assert "terminate called" not in msg and "Traceback" not in msg, msg
    for n in names:
        assert n in msg, f"{args}: message does not name {n!r}: {msg}"
    return msg


# Cheap experiment arguments: the bad option is rejected before any model work.
EXP = ["--calib", VAL, "--nsamples", "2", "--seqlen", "16", "--max-tokens", "64", "--no-gptq",
       "--methods", "absmax", "--settings", "WA", "--no-errors"]


@need_data
@pytest.mark.parametrize("opt,val", [("--ctx", "0"), ("--ctx", "-4"), ("--stride", "-1"),
                                     ("--max-tokens", "-1"), ("--error-tokens", "-5"),
                                     ("--damp", "-1"), ("--damp", "nan")])
def test_experiment_rejects_bad_counts(opt, val):
    args = [a for a in EXP]
    if opt in args:  # replace the cheap default rather than giving the option twice
        i = args.index(opt)
        del args[i:i + 2]
    fails("experiment", MODEL, "--eval", VAL, *args, opt, val, names=[opt])


@need_data
@pytest.mark.parametrize("opt,val", [("--nsamples", "0"), ("--seqlen", "1")])
def test_experiment_rejects_bad_calibration_sizes(opt, val):
    args = [a for a in EXP]
    i = args.index(opt)
    del args[i:i + 2]
    fails("experiment", MODEL, "--eval", VAL, *args, opt, val, names=[opt])


@need_data
def test_experiment_reports_the_format_block_error_before_the_gptq_restriction():
    # Was: `--format mxfp4 --block 16` (GPTQ rows on by default) named the GPTQ restriction,
    # and only after --no-gptq the impossible block; the block error comes first, as in ppl.
    base = ["experiment", MODEL, "--eval", VAL, "--calib", VAL, "--nsamples", "2", "--seqlen",
            "16", "--max-tokens", "64", "--format", "mxfp4", "--block", "16"]
    for extra in ([], ["--no-gptq"]):
        msg = fails(*base, *extra, names=["--block: MXFP4 requires block 32 (got 16)"])
        assert "GPTQ" not in msg, msg
    # A possible block still gets the GPTQ restriction.
    fails(*base[:-1], "32", names=["--format: mxfp4", "GPTQ", "--no-gptq"])


@need_data
def test_experiment_report_dir_checked_before_the_run(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    bad = str(blocker / "report")  # under a regular file: cannot be created, even as root
    fails("experiment", MODEL, "--eval", VAL, *EXP, "--report-dir", bad,
          names=["--report-dir", bad])
    assert not os.path.exists(bad)


@need_data
def test_ppl_negative_max_tokens_names_the_option():
    msg = fails("ppl", MODEL, "--text", VAL, "--max-tokens", "-3", names=["--max-tokens", "-3"])
    assert "e+" not in msg and len(msg) < 400, msg  # (was a 250-digit garbage number)


@need_data
@pytest.mark.parametrize("opt,val", [("--nsamples", "0"), ("--nsamples", "-1"), ("--seqlen", "1"),
                                     ("--gptq-block", "-5")])
def test_quantize_rejects_bad_counts(tmp_path, opt, val):
    out = tmp_path / "q"
    msg = fails("quantize", MODEL, "-o", str(out), "--gptq", "--calib", VAL, opt, val,
                names=[opt, val])
    assert len(msg) < 400, msg  # a readable range, not CLI11's 300-digit double bound
    assert not out.exists()


@need_data
@pytest.mark.parametrize("cmd", ["quantize", "experiment"])
@pytest.mark.parametrize("opt,val,table", [
    ("--gptq-scales", "late", "unknown GPTQ scale timing 'late' (accepted: static, dynamic)"),
    ("--gptq-importance", "HDIAG", "unknown GPTQ importance 'HDIAG' (accepted: hdiag, obs)")])
def test_gptq_scale_names_are_parsed_with_their_tables(tmp_path, cmd, opt, val, table):
    out = tmp_path / "q"
    args = (["-o", str(out), "--gptq", "--calib", VAL] if cmd == "quantize"
            else ["--eval", VAL, *[a for a in EXP if a != "--no-gptq"]])
    fails(cmd, MODEL, *args, opt, val, names=[f"{opt}: {table}"])
    assert not out.exists()


@need_data
@pytest.mark.parametrize("opt", ["--settings", "--methods"])
def test_experiment_rejects_an_empty_list(opt):
    args = [a for a in EXP]
    if opt in args:
        i = args.index(opt)
        del args[i:i + 2]
    fails("experiment", MODEL, "--eval", VAL, *args, opt, ",", names=[opt])


@pytest.mark.parametrize("opt,val", [("--k", "0"), ("--runs", "0"), ("--warmup", "-1")])
def test_bench_gpu_count_messages_are_readable(opt, val):
    # Rejected by option parsing, so the same with and without CUDA.
    msg = fails("bench-gpu", opt, val, names=[opt, val])
    assert len(msg) < 400, msg


@need_data
@pytest.mark.parametrize("cmd", [
    ["calibrate", "{missing}", "--text", VAL, "-o", "{out}"],
    ["calibrate", "{corrupt}", "--text", VAL, "-o", "{out}"],
    ["ppl", "{missing}", "--text", VAL],
    ["ppl", "{corrupt}", "--text", VAL],
    ["ppl", MODEL, "--text", "{missing}"],
    ["generate", "{corrupt}"],
    ["generate", MODEL, "--quant", "WA", "--stats", "{corrupt}"],
    ["quantize", "{corrupt}", "-o", "{out}"],
    ["convert", "{corrupt}", "-o", "{out}"],
    ["experiment", "{corrupt}", "--eval", VAL] + EXP,
    ["inspect", "{missing}"],
    ["tokenize", "{corrupt}", "--text", "hi"],
    ["tensor", "{corrupt}", "--method", "sweep-mse"],
    ["cast", "{corrupt}", "--to", "e2m1", "-o", "{out}"],
])
def test_missing_or_corrupt_input_is_named(tmp_path, cmd):
    corrupt = tmp_path / "corrupt.bin"
    corrupt.write_bytes(b"\x01\x02\x03")
    paths = {"missing": str(tmp_path / "missing.bin"), "corrupt": str(corrupt),
             "out": str(tmp_path / "out")}
    args = [a.format(**paths) for a in cmd]
    named = [v for k, v in paths.items() if k != "out" and "{" + k + "}" in cmd]
    fails(*args, names=[os.path.basename(named[0])])
    assert not os.path.exists(paths["out"])


@need_data
def test_outputs_under_a_regular_file_fail_cleanly(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    np.save(tmp_path / "w.npy", np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32))
    w = str(tmp_path / "w.npy")
    for args, out in [
        (["calibrate", MODEL, "--text", VAL, "--nsamples", "2", "--seqlen", "16", "-o"], "s.st"),
        (["quantize", MODEL, "-o"], "q"),
        (["convert", MODEL, "-o"], "hf"),
        (["cast", w, "--to", "e2m1", "-o"], "c.npy"),
        (["tensor", w, "--method", "absmax", "-o"], "t.safetensors"),
    ]:
        bad = str(blocker / out)
        fails(*args, bad, names=[str(blocker)])
        assert blocker.read_text() == "x"
        assert sorted(os.listdir(tmp_path)) == ["file", "w.npy"], (args, os.listdir(tmp_path))


@pytest.mark.skipif(not os.path.exists(os.path.join(DATA, "models/stories260K/tok512.bin")),
                    reason="shared data absent (tok512.bin)")
@pytest.mark.parametrize("args,names", [
    (["--text", "hi", "--file", VAL], ["--text", "--file"]),
    (["--file", VAL, "--decode", "1"], ["--file", "--decode"]),
    (["--text", "hi", "--decode", "1"], ["--text", "--decode"]),
    (["--text", "hi", "--lines"], ["--lines", "--file"]),
])
def test_tokenize_inputs_are_exclusive(args, names):
    # Was: one input silently ignored (--decode won over --file, --lines without --file).
    fails("tokenize", os.path.join(DATA, "models/stories260K/tok512.bin"), *args, names=names)


def test_inspect_names_a_missing_or_non_directory_path(tmp_path):
    # Was: "<path>/config.json: cannot read" for both.
    missing = str(tmp_path / "nodir")
    assert "no such directory" in fails("inspect", missing, names=[missing])
    f = tmp_path / "file.bin"
    f.write_bytes(b"x")
    assert "not a directory" in fails("inspect", str(f), names=[str(f)])


@need_data
def test_output_that_is_an_input_is_refused(tmp_path):
    # Was: cast/tensor/calibrate silently replaced the file they were reading.
    w = tmp_path / "w.npy"
    np.save(w, np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32))
    before = w.read_bytes()
    text = tmp_path / "calib.txt"
    with open(VAL) as f:
        text.write_text(f.read(20000))
    text_before = text.read_bytes()
    for args in (["cast", str(w), "--to", "e2m1", "-o", str(w)],
                 ["tensor", str(w), "--method", "absmax", "-o", str(w)],
                 ["tensor", str(w), "--method", "sweep-wmse", "--importance",
                  str(tmp_path / "imp.npy"), "-o", str(tmp_path / "imp.npy")],
                 ["calibrate", MODEL, "--text", str(text), "--nsamples", "2", "--seqlen", "16",
                  "-o", str(text)]):
        if "--importance" in args:
            np.save(tmp_path / "imp.npy", np.ones(32, np.float32))
        out = args[-1]
        fails(*args, names=["-o", out, "input"])
    assert w.read_bytes() == before
    assert text.read_bytes() == text_before
    assert np.array_equal(np.load(tmp_path / "imp.npy"), np.ones(32, np.float32))


@need_data
def test_quantize_preset_refuses_the_options_it_sets(tmp_path):
    out = tmp_path / "q"
    fails("quantize", MODEL, "-o", str(out), "--preset", "best", "--method", "absmax",
          "--gptq", "--calib", VAL, names=["--preset best sets --method, --gptq itself"])
    fails("quantize", MODEL, "-o", str(out), "--preset", "best", "--gptq-scales", "static",
          "--calib", VAL, names=["--gptq-scales"])
    fails("quantize", MODEL, "-o", str(out), "--preset", "best", "--search-global-scale", "4",
          "--calib", VAL, names=["--search-global-scale"])
    fails("quantize", MODEL, "-o", str(out), "--preset", "fastest", "--calib", VAL,
          names=["--preset", "unknown preset 'fastest'", "accepted: best"])
    fails("quantize", MODEL, "-o", str(out), "--preset", "best",
          names=["needs calibration statistics"])
    assert not out.exists()


@need_data
def test_quantize_preset_best_is_its_options_spelled_out(tmp_path):
    """--preset best writes the bytes of the options it stands for, and reports them."""
    import json
    common = ["--calib", VAL, "--nsamples", "4", "--seqlen", "64", "--json"]
    a, b = tmp_path / "preset", tmp_path / "spelled"
    pa = subprocess.run([BIN, "quantize", MODEL, "-o", str(a), "--preset", "best", *common],
                        capture_output=True, text=True, timeout=600)
    assert pa.returncode == 0, pa.stderr
    j = json.loads(pa.stdout)
    assert (j["preset"], j["method"], j["gptq"], j["gptq_scales"], j["gptq_importance"]) == (
        "best", "sweep-wmse", True, "dynamic", "hdiag")
    pb = subprocess.run([BIN, "quantize", MODEL, "-o", str(b), "--method", "sweep-wmse", "--gptq",
                         "--gptq-scales", "dynamic", "--gptq-importance", "hdiag", *common],
                        capture_output=True, text=True, timeout=600)
    assert pb.returncode == 0, pb.stderr
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
