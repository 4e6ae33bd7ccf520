"""quantize, calibrate and experiment on the shared option groups (src/tools/options.h): every
older spelling (quantize --out/--overwrite/--nsamples/--seqlen/--seed, calibrate
--text/--nsamples/--seqlen/--seed, experiment --nsamples/--seqlen/--seed) gives the same output
as the canonical one, --help shows the defaults from the code, and inspect is one command for
both checkpoint directories and GGUF files. (A file of its own beside test_cli_aliases.py, which
covers the other commands.)"""
import json
import re

import pytest

from cli_common import BIN, MODEL, TOK, VAL, need_bin, need_files  # noqa: F401
from cli_common import check_help_defaults
from cli_common import run_cli as run

pytestmark = [need_bin]

TIMING = {"seconds", "phases", "weight_seconds"}


def untimed(o):
    if isinstance(o, dict):
        return {k: untimed(v) for k, v in o.items() if k not in TIMING}
    if isinstance(o, list):
        return [untimed(v) for v in o]
    return o


def files_of(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@need_files(MODEL, TOK, VAL)
def test_quantize_old_spellings_write_the_same_checkpoint(tmp_path):
    base = ["quantize", MODEL, "--tokenizer", TOK, "--method", "sweep-wmse", "--gptq",
            "--quant", "WA", "--calib", VAL, "--threads", "2", "--json"]
    a, b = tmp_path / "a", tmp_path / "b"
    canon = json.loads(run(*base, "-o", a, "--calib-nsamples", "4", "--calib-seqlen", "64",
                           "--calib-seed", "5").stdout)
    old = json.loads(run(*base, "--out", b, "--nsamples", "4", "--seqlen", "64",
                         "--seed", "5").stdout)
    assert canon["out"] != old["out"]
    canon.pop("out"), old.pop("out")
    assert untimed(canon) == untimed(old)
    assert files_of(a) == files_of(b)
    # Another seed draws other sequences: the seed alias reaches calibration.
    c = tmp_path / "c"
    run(*base, "--output", c, "--nsamples", "4", "--seqlen", "64", "--seed", "6")
    assert files_of(c)["model.safetensors"] != files_of(a)["model.safetensors"]
    # --overwrite and --force both replace an existing output; without either it is refused.
    p = run(*base, "-o", b, "--nsamples", "4", "--seqlen", "64", "--seed", "6", ok=False)
    assert p.returncode == 1 and "already exists" in p.stderr, p.stderr
    run(*base, "-o", b, "--nsamples", "4", "--seqlen", "64", "--seed", "6", "--overwrite")
    assert files_of(b) == files_of(c)
    run(*base, "-o", b, "--nsamples", "4", "--seqlen", "64", "--seed", "5", "--force")
    assert files_of(b) == files_of(a)


@need_files(MODEL, TOK, VAL)
def test_calibrate_old_spellings_write_the_same_statistics(tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    canon = json.loads(run("calibrate", MODEL, "--tokenizer", TOK, "--calib", VAL,
                           "--calib-nsamples", "3", "--calib-seqlen", "32", "--calib-seed", "2",
                           "-o", a, "--json").stdout)
    old = json.loads(run("calibrate", MODEL, "--tokenizer", TOK, "--text", VAL, "--nsamples",
                         "3", "--seqlen", "32", "--seed", "2", "--output", b, "--json").stdout)
    assert canon.pop("output") == str(a) and old.pop("output") == str(b)
    assert canon == old and canon["nsamples"] == 3 and canon["seqlen"] == 32 and canon["seed"] == 2
    assert a.read_bytes() == b.read_bytes()
    # The canonical text option is required (the alias satisfies it, as above).
    p = run("calibrate", MODEL, "--tokenizer", TOK, "-o", tmp_path / "c.safetensors", ok=False)
    assert p.returncode != 0 and "--calib" in p.stderr, p.stderr


@need_files(MODEL, TOK, VAL)
def test_experiment_old_spellings_give_the_same_grid(tmp_path):
    base = ["experiment", MODEL, "--tokenizer", TOK, "--eval", VAL, "--calib", VAL,
            "--max-tokens", "128", "--methods", "absmax,sweep-mse", "--settings", "WA",
            "--error-tokens", "64", "--json"]
    canon = json.loads(run(*base, "--calib-nsamples", "2", "--calib-seqlen", "32",
                           "--calib-seed", "3", "--report-dir", tmp_path / "a").stdout)
    old = json.loads(run(*base, "--nsamples", "2", "--seqlen", "32", "--seed", "3",
                         "--report-dir", tmp_path / "b").stdout)
    assert untimed(canon) == untimed(old)
    assert [c["algo"] for c in canon["cells"]] == ["RTN", "RTN", "GPTQ", "GPTQ"]
    assert canon["layer_errors"] and canon["block"] == 16
    md_a = (tmp_path / "a" / "experiment.md").read_text()
    assert md_a == (tmp_path / "b" / "experiment.md").read_text()
    assert "(2 x 32 tokens, seed 3)" in md_a
    assert (tmp_path / "a" / "layer_errors.svg").read_bytes() == \
        (tmp_path / "b" / "layer_errors.svg").read_bytes()


@pytest.mark.parametrize("cmd, wanted", [
    ("quantize", {"--quant": "W", "--method": "sweep-mse", "--block": "0", "--threads": "0",
                  "--calib-nsamples,--nsamples": "128", "--calib-seqlen,--seqlen": "512",
                  "--calib-seed,--seed": "0", "--damp": "0.01", "--gptq-block": "128",
                  "--gptq-scales": "static", "--gptq-importance": "hdiag",
                  "--dense-dtype": "auto", "--partial-blocks": "dense", "--tp": "1",
                  "--max-shard-size": "5GB"}),
    ("calibrate", {"--calib-nsamples,--nsamples": "128", "--calib-seqlen,--seqlen": "512",
                   "--calib-seed,--seed": "0"}),
    ("experiment", {"--methods": "absmax,4over6,sweep-mse,sweep-wmse",
                    "--settings": "WA,WAKV,WAKVQ", "--format": "nvfp4", "--block": "0",
                    "--damp": "0.01", "--gptq-scales": "static", "--gptq-importance": "hdiag",
                    "--error-tokens": "2048",
                    "--calib-nsamples,--nsamples": "128"}),
])
def test_help_shows_defaults_from_the_code(cmd, wanted):
    # A short spelling ("-o,") may come first.
    check_help_defaults(run(cmd, "--help").stdout, cmd, wanted, option_prefix=r"(?:-\w, ?)?")


def test_output_spellings_listed_in_quantize_help():
    h = run("quantize", "--help").stdout
    assert re.search(r"^  -o,--output,--out TEXT REQUIRED", h, re.M), h
    assert re.search(r"^  --force,--overwrite ", h, re.M), h


def test_gptq_bench_is_no_longer_a_subcommand():
    # Moved to the benchmark binary bench/gptq_bench (the CLI no longer links BLAS itself).
    p = run("gptq-bench", ok=False)
    assert p.returncode != 0
    assert "gptq-bench" not in run("--help").stdout


@need_files(MODEL, TOK)
def test_inspect_dispatches_on_the_input_kind(tmp_path):
    q = tmp_path / "q"
    run("quantize", MODEL, "--tokenizer", TOK, "-o", q, "--method", "absmax")
    j = json.loads(run("inspect", q, "--json").stdout)
    assert j["format"] == "nvfp4-pack-quantized" and j["linears"]
    gguf = pytest.importorskip("gguf", reason="`pip install gguf` (gguf-py) for a GGUF file")
    import numpy as np
    g = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(g), "llama")
    w.add_tensor("t", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    jg = json.loads(run("inspect", g, "--json").stdout)
    assert jg["format"] == "gguf" and [t["name"] for t in jg["tensors"]] == ["t"]
    p = run("inspect", tmp_path / "nothing-here", ok=False)
    assert p.returncode == 1 and "no such directory" in p.stderr, p.stderr
    f = tmp_path / "plain.txt"
    f.write_text("not a model")
    p = run("inspect", f, ok=False)
    assert p.returncode == 1 and "nor a GGUF file" in p.stderr, p.stderr
    p = run("inspect", q, "--tensor", "x", ok=False)
    assert p.returncode == 1 and "--tensor applies to a GGUF file" in p.stderr, p.stderr


@need_files(MODEL, TOK, VAL)
@pytest.mark.parametrize("spelling", ["--calib-seqlen", "--seqlen", "--seqlen="])
def test_seqlen_cap_note_names_the_spelling_typed(tmp_path, spelling):
    # CLI11 does not say which name matched; the note names what the user typed.
    val = [spelling + "9999"] if spelling.endswith("=") else [spelling, "9999"]
    for cmd in (["calibrate", MODEL, "--tokenizer", TOK, "--calib", VAL, "--calib-nsamples", "2",
                 "-o", tmp_path / "s.safetensors", "--force"],
                ["quantize", MODEL, "--tokenizer", TOK, "--method", "sweep-wmse", "--calib", VAL,
                 "--calib-nsamples", "2", "-o", tmp_path / "q", "--force"]):
        p = run(*cmd, *val)
        name = spelling.rstrip("=")
        assert f"note: {name} 9999 exceeds {MODEL}'s max_seq_len 512; using 512" in p.stderr, \
            p.stderr
