"""The shared option groups on the commands that use them (src/tools/options.h): the old
spellings kept as aliases give the same output as the canonical ones, `generate --seed` still
seeds calibration when --calib-seed is absent, and --help shows the defaults from the code (no
hand-typed "(default ...)")."""
import json
import re
import subprocess

import pytest

from cli_common import BIN, MODEL, TOK, VAL, need_bin, need_files  # noqa: F401
from cli_common import check_help_defaults

pytestmark = [need_bin]

# Fields that measure wall-clock time differ between two identical runs.
TIMING = {"seconds", "prefill_tokens_per_s", "prefill_seconds", "decode_seconds",
          "decode_tokens_per_s", "best_decode_tokens_per_s"}


def run(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{args} failed ({p.returncode}): {p.stderr}"
    return p


def untimed(stdout):
    return {k: v for k, v in json.loads(stdout).items() if k not in TIMING}


CALIB = ["--quant", "WA", "--calib", VAL, "--calib-nsamples", "4", "--calib-seqlen", "64"]


@need_files(MODEL, TOK, VAL)
def test_ppl_seed_alias_is_the_calibration_seed():
    base = ["ppl", MODEL, "--tokenizer", TOK, "--text", VAL, "--max-tokens", "512", "--json",
            *CALIB]
    canon = untimed(run(*base, "--calib-seed", "3").stdout)
    assert canon == untimed(run(*base, "--seed", "3").stdout)
    assert canon["quant"] == "WA" and canon["source"] == "simulated"


@need_files(MODEL, TOK, VAL)
def test_spread_windows_take_no_seed():
    """--calib-windows spread places the windows evenly: the seed draws nothing, so giving one
    is refused (with its option named), and the statistics differ from random windows'."""
    base = ["ppl", MODEL, "--tokenizer", TOK, "--text", VAL, "--max-tokens", "512", "--json",
            *CALIB]
    spread = untimed(run(*base, "--calib-windows", "spread").stdout)
    assert spread != untimed(run(*base).stdout)  # random windows, seed 0
    p = subprocess.run([BIN, *base, "--calib-windows", "spread", "--calib-seed", "3"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert "--calib-seed draws random windows; --calib-windows spread places them evenly" \
        in p.stderr, p.stderr
    p = subprocess.run([BIN, *base, "--calib-windows", "even"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode != 0
    assert "--calib-windows: unknown calibration windows 'even' (accepted: random, spread)" \
        in p.stderr, p.stderr


@need_files(MODEL, TOK, VAL)
def test_generate_seed_seeds_calibration_unless_calib_seed_is_given():
    base = ["generate", MODEL, "--tokenizer", TOK, "-n", "24", "--temperature", "0.8",
            "--json", *CALIB]
    only_seed = untimed(run(*base, "--seed", "7").stdout)
    # Today's behaviour of a command line with only --seed: it seeds sampling and calibration.
    assert only_seed == untimed(run(*base, "--seed", "7", "--calib-seed", "7").stdout)
    assert only_seed["n_generated"] > 0


@need_files(MODEL, TOK)
def test_convert_output_spellings_write_the_same_files(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    run("convert", MODEL, "--tokenizer", TOK, "-o", str(a), "--json")
    run("convert", MODEL, "--tokenizer", TOK, "--output", str(b), "--json")
    # --force replaces the existing directory.
    run("convert", MODEL, "--tokenizer", TOK, "--output", str(b), "--force")
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n


@pytest.mark.parametrize("cmd, wanted", [
    ("ppl", {"--quant": "none", "--method": "sweep-mse", "--format": "nvfp4", "--block": "0",
             "--calib-nsamples": "128", "--calib-seqlen": "512", "--calib-seed,--seed": "0",
             "--calib-windows": "random",
             "--ctx": "0", "--stride": "0", "--max-tokens": "0"}),
    ("generate", {"-n,--steps": "256", "--temperature": "1", "--top-p": "0.9", "--seed": "0",
                  "--repeat": "1", "--calib-nsamples": "128"}),
    ("convert", {"--dtype": "f32", "--shard-mb": "0"}),
    ("cast", {"--round": "rne"}),
    ("bench", {"--rows": "8192", "--cols": "8192", "--dtype": "bf16", "--threads": "0",
               "--repeat": "3", "--block": "16"}),
    ("bench-gpu", {"--k": "8192", "--dtype": "bf16", "--runs": "100", "--warmup": "10"}),
])
def test_help_shows_defaults_from_the_code(cmd, wanted):
    check_help_defaults(run(cmd, "--help").stdout, cmd, wanted)


def test_generate_help_says_where_calib_seed_comes_from():
    h = run("generate", "--help").stdout
    assert re.search(r"^  --calib-seed UINT +calibration sampling seed; default: the --seed value",
                     h, re.M), h
