"""Team CLI policies (src/tools/output.h, src/tools/seqlen.h):

- Single-file outputs (tensor -o, cast -o, calibrate -o, experiment --report-dir's files) never
  replace an existing file unless --force is given: a clear error naming the option and the
  path, exit 1, the old file untouched, no temp file left; with --force they are replaced. An
  output path that is a directory is refused even with --force.
- Sequence-length options above the model's max_seq_len (calibrate/experiment --seqlen,
  ppl/generate --calib-seqlen) are capped with exactly one stderr line
  "note: --seqlen N exceeds <model>'s max_seq_len M; using M".
"""
import json
import os
import re
import subprocess

import numpy as np
import pytest

from cli_common import BIN, DATA, MODEL, VAL, need_bin, need_data  # noqa: F401

pytestmark = need_bin


def run(*args, ok=True):
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=300)
    if ok:
        assert p.returncode == 0, f"{args} failed ({p.returncode}): {p.stderr}"
    return p


def refused(args, path, opt):
    p = run(*args, ok=False)
    assert p.returncode == 1, (args, p.returncode, p.stderr)
    assert "terminate called" not in p.stderr
    for frag in (opt, str(path), "already exists", "--force"):
        assert frag in p.stderr, (frag, p.stderr)


def no_temp_files(d):
    return not [p for p in os.listdir(d) if ".tmp" in p]


def small_calib_text(tmp_path):
    t = tmp_path / "calib.txt"
    with open(VAL) as f:
        t.write_text(f.read(30000))
    return t


def file_commands(tmp_path):
    """(name, args without --force, output path, option) for every single-file output."""
    w = tmp_path / "w.npy"
    np.save(w, np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32))
    cmds = [("tensor", ["tensor", w, "--method", "absmax", "-o", tmp_path / "t.safetensors"],
             tmp_path / "t.safetensors", "-o"),
            ("cast", ["cast", w, "--to", "e2m1", "-o", tmp_path / "c.npy"], tmp_path / "c.npy",
             "-o")]
    if os.path.exists(MODEL) and os.path.exists(VAL):
        text = small_calib_text(tmp_path)
        cmds.append(("calibrate", ["calibrate", MODEL, "--text", text, "--nsamples", "2",
                                   "--seqlen", "32", "-o", tmp_path / "s.safetensors"],
                     tmp_path / "s.safetensors", "-o"))
        rep = tmp_path / "rep"
        cmds.append(("experiment", ["experiment", MODEL, "--eval", text, "--calib", text,
                                    "--nsamples", "2", "--seqlen", "32", "--max-tokens", "64",
                                    "--no-gptq", "--methods", "absmax", "--settings", "WA",
                                    "--no-errors", "--report-dir", rep],
                     rep / "experiment.md", "--report-dir"))
    return cmds


def test_existing_output_needs_force(tmp_path):
    cmds = file_commands(tmp_path)
    if len(cmds) < 4:
        print("shared data absent: calibrate/experiment cases skipped")
    for name, args, out, opt in cmds:
        run(*args)
        assert out.exists(), name
        # An unrelated file at the path: refused, untouched.
        out.write_bytes(b"precious")
        refused(args, out, opt)
        assert out.read_bytes() == b"precious", name
        assert no_temp_files(out.parent), name
        # --force replaces it with a real output.
        run(*args, "--force")
        assert out.read_bytes() != b"precious", name
        assert no_temp_files(out.parent), name


def test_output_that_is_a_directory_is_refused_even_with_force(tmp_path):
    for name, args, out, opt in file_commands(tmp_path):
        if name == "experiment":
            continue  # --report-dir is a directory by design
        out.mkdir()
        for extra in ([], ["--force"]):
            p = run(*args, *extra, ok=False)
            assert p.returncode == 1 and "is a directory" in p.stderr and str(out) in p.stderr, (
                name, p.stderr)
        assert out.is_dir() and not os.listdir(out)


@need_data
def test_experiment_refuses_an_existing_svg_too(tmp_path):
    text = small_calib_text(tmp_path)
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / "layer_errors.svg").write_text("mine")
    args = ["experiment", MODEL, "--eval", text, "--calib", text, "--nsamples", "2", "--seqlen",
            "32", "--max-tokens", "64", "--no-gptq", "--methods", "absmax", "--settings", "WA",
            "--error-tokens", "64", "--report-dir", rep]
    refused(args, rep / "layer_errors.svg", "--report-dir")
    assert (rep / "layer_errors.svg").read_text() == "mine"
    assert not (rep / "experiment.md").exists()  # refused before the run, nothing written
    # --no-errors writes no SVG, so the existing one is no obstacle.
    run(*args, "--no-errors")
    assert (rep / "layer_errors.svg").read_text() == "mine" and (rep / "experiment.md").exists()


NOTE = re.compile(r"^note: (--[a-z-]+) (\d+) exceeds (.+)'s max_seq_len (\d+); using (\d+)$")


def notes(stderr):
    return [m for m in (NOTE.match(line) for line in stderr.splitlines()) if m]


def check_note(stderr, opt, n):
    ns = notes(stderr)
    assert len(ns) == 1, stderr
    m = ns[0]
    assert m.group(1) == opt and m.group(2) == str(n) and m.group(3) == MODEL, stderr
    assert m.group(4) == m.group(5)
    return int(m.group(5))


@need_data
def test_calibrate_caps_seqlen_with_one_note(tmp_path):
    text = small_calib_text(tmp_path)
    p = run("calibrate", MODEL, "--text", text, "--nsamples", "2", "--seqlen", "9999", "-o",
            tmp_path / "s.safetensors", "--json")
    cap = check_note(p.stderr, "--seqlen", 9999)
    assert cap == 512  # stories260K
    assert json.loads(p.stdout)["seqlen"] == cap
    # Exactly at the limit: no note, same statistics as the capped run.
    q = run("calibrate", MODEL, "--text", text, "--nsamples", "2", "--seqlen", str(cap), "-o",
            tmp_path / "t.safetensors")
    assert not notes(q.stderr) and "note:" not in q.stderr
    assert (tmp_path / "s.safetensors").read_bytes() == (tmp_path / "t.safetensors").read_bytes()


@need_data
@pytest.mark.parametrize("cmd", ["ppl", "generate"])
def test_sim_quant_caps_calib_seqlen(tmp_path, cmd):
    text = small_calib_text(tmp_path)
    extra = ["--text", text, "--max-tokens", "128"] if cmd == "ppl" else ["-n", "8",
                                                                           "--temperature", "0"]
    args = [cmd, MODEL, *extra, "--quant", "WA", "--method", "absmax", "--calib", text,
            "--calib-nsamples", "2", "--json"]
    a = run(*args, "--calib-seqlen", "100000")
    check_note(a.stderr, "--calib-seqlen", 100000)
    b = run(*args, "--calib-seqlen", "512")
    assert not notes(b.stderr)
    ka = json.loads(a.stdout)
    kb = json.loads(b.stdout)
    key = "nll_per_token" if cmd == "ppl" else "tokens"
    assert ka[key] == kb[key]  # the capped run is the run at max_seq_len
    # With --stats the calibration length is not used: no note.
    run("calibrate", MODEL, "--text", text, "--nsamples", "2", "--seqlen", "64", "-o",
        tmp_path / "s.safetensors")
    c = run(cmd, MODEL, *extra, "--quant", "WA", "--method", "absmax", "--stats",
            tmp_path / "s.safetensors", "--calib-seqlen", "100000")
    assert not notes(c.stderr)


@need_data
def test_experiment_caps_seqlen(tmp_path):
    text = small_calib_text(tmp_path)
    p = run("experiment", MODEL, "--eval", text, "--calib", text, "--nsamples", "2", "--seqlen",
            "4096", "--max-tokens", "64", "--no-gptq", "--methods", "absmax", "--settings", "WA",
            "--no-errors", "--report-dir", tmp_path / "rep")
    cap = check_note(p.stderr, "--seqlen", 4096)
    md = (tmp_path / "rep" / "experiment.md").read_text()
    assert f"2 x {cap} tokens" in md  # the report states the length actually used


@need_data
def test_convert_directory_output_never_replaces_its_input(tmp_path):
    # Was: `convert m.bin -o m.bin --force` replaced the checkpoint it read with the output
    # directory (same for the tokenizer, or a directory holding the model).
    tok = os.path.join(os.path.dirname(MODEL), "tok512.bin")
    m = tmp_path / "m.bin"
    t = tmp_path / "tok.bin"
    m.write_bytes(open(MODEL, "rb").read())
    t.write_bytes(open(tok, "rb").read())
    d = tmp_path / "d"
    d.mkdir()
    (d / "m.bin").write_bytes(m.read_bytes())
    for src, out, frag in [(m, m, "is the input file"), (m, t, "is the input file"),
                           (d / "m.bin", d, "contains the input"),
                           (d / "m.bin", tmp_path / "d" / ".." / "d", "contains the input")]:
        p = run("convert", src, "--tokenizer", t, "-o", out, "--force", ok=False)
        assert p.returncode == 1 and frag in p.stderr and "-o" in p.stderr, p.stderr
    assert m.read_bytes() == open(MODEL, "rb").read() and t.read_bytes() == open(tok, "rb").read()
    assert (d / "m.bin").is_file()
    # An existing output: refused without --force (same message as the single-file outputs),
    # replaced with it.
    out = tmp_path / "hf"
    run("convert", m, "--tokenizer", t, "-o", out)
    refused(["convert", m, "--tokenizer", t, "-o", out], out, "-o")
    run("convert", m, "--tokenizer", t, "-o", out, "--force")
    assert (out / "config.json").is_file()


@need_data
def test_quantize_never_replaces_its_input_even_with_overwrite(tmp_path):
    # Was: `quantize hf -o hf --overwrite` replaced the HF source it read with its output, and
    # `-o <a directory holding the model> --overwrite` deleted that whole directory.
    tok = os.path.join(os.path.dirname(MODEL), "tok512.bin")
    hf = tmp_path / "d" / "hf"
    hf.parent.mkdir()
    run("convert", MODEL, "--tokenizer", tok, "-o", hf)
    calib = small_calib_text(tmp_path)
    before = {p: open(hf / p, "rb").read() for p in os.listdir(hf)}
    for src, out, extra, frag in [
            (hf, hf, [], "is the input"), (hf, tmp_path / "d", [], "contains the input"),
            (hf, tmp_path, [], "contains the input"),
            (hf, calib, ["--method", "sweep-wmse", "--calib", calib, "--nsamples", "2",
                         "--seqlen", "32"], "is the input"),
            (MODEL, tmp_path / "bin_dir" / "..", ["--tokenizer", tok], None)]:
        if frag is None:  # llama2.c source: a directory holding it
            d = tmp_path / "bin_dir"
            d.mkdir()
            (d / "m.bin").write_bytes(open(MODEL, "rb").read())
            src, out, frag = d / "m.bin", d, "contains the input"
        p = run("quantize", src, "-o", out, "--overwrite", *extra, ok=False)
        assert p.returncode == 1 and frag in p.stderr and "-o" in p.stderr, p.stderr
        assert "terminate called" not in p.stderr
    assert {p: open(hf / p, "rb").read() for p in os.listdir(hf)} == before
    assert calib.is_file() and (tmp_path / "bin_dir" / "m.bin").is_file()
    # Still replaces an ordinary existing output with --overwrite, refuses it without.
    out = tmp_path / "q"
    run("quantize", hf, "-o", out)
    p = run("quantize", hf, "-o", out, ok=False)
    assert p.returncode == 1 and "already exists" in p.stderr
    run("quantize", hf, "-o", out, "--overwrite")
    run("quantize", hf, "-o", out, "--force")  # the team's flag name works too
    p = run("quantize", hf, "-o", hf, "--force", ok=False)
    assert p.returncode == 1 and "is the input" in p.stderr
    assert (out / "model.safetensors").is_file() and no_temp_files(tmp_path)


@need_data
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_interrupted_quantize_leaves_no_temp_directory(tmp_path, sig):
    # Was: Ctrl-C (or a kill) during quantize left ".q.tmp.XXXXXX" with the shards written so
    # far beside the output (gigabytes for a real model): the cleanup ran only on exceptions.
    import signal
    import time
    tok = os.path.join(os.path.dirname(MODEL), "tok512.bin")
    hf = tmp_path / "hf"
    run("convert", MODEL, "--tokenizer", tok, "-o", hf)
    out = tmp_path / "q"
    p = subprocess.Popen([BIN, "quantize", str(hf), "-o", str(out), "--gptq", "--calib", VAL,
                          "--nsamples", "256", "--seqlen", "512", "--max-shard-size", "20KB"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and p.poll() is None:
        if [x for x in os.listdir(tmp_path) if x.startswith(".q.tmp")]:
            break
        time.sleep(0.01)
    assert p.poll() is None, "quantize finished before it could be interrupted"
    time.sleep(0.3)  # let it write a few files into the temp directory
    p.send_signal(getattr(signal, sig))
    p.communicate(timeout=60)
    assert p.returncode == -getattr(signal, sig), p.returncode  # still dies by the signal
    assert sorted(os.listdir(tmp_path)) == ["hf"], os.listdir(tmp_path)


@need_data
def test_inspect_dump_follows_the_output_policy(tmp_path):
    # Was: `inspect CKPT --dump-dequant CKPT/model.safetensors` replaced the checkpoint's own
    # weights with the dump (the checkpoint then had 0 quantized Linears), and an existing
    # dump file was replaced without --force.
    q = tmp_path / "q"
    run("quantize", MODEL, "-o", q, "--max-shard-size", "100KB")
    files = sorted(os.listdir(q))
    before = {p: open(q / p, "rb").read() for p in files}
    shard = next(p for p in files if p.endswith(".safetensors"))
    for target in (shard, "model.safetensors.index.json", "config.json"):
        p = run("inspect", q, "--dump-dequant", q / target, "--force", ok=False)
        assert p.returncode == 1 and "is the input file" in p.stderr, p.stderr
        assert "--dump-dequant" in p.stderr
    assert {p: open(q / p, "rb").read() for p in sorted(os.listdir(q))} == before
    d = tmp_path / "d.safetensors"
    run("inspect", q, "--dump-dequant", d)
    refused(["inspect", q, "--dump-dequant", d], d, "--dump-dequant")
    run("inspect", q, "--dump-dequant", d, "--force")
    assert no_temp_files(tmp_path)
