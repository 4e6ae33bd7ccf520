"""A request that cannot fit in memory is refused before the work starts, with the estimate and
the option that reduces it (issue 29 item 4; base/memory.h check_fits). SCALESWEEP_MEMORY_LIMIT
caps the memory the jobs plan for, so that the refusal can be provoked on any machine; a
generous cap changes nothing."""
import os
import subprocess

import pytest

from cli_common import BIN, MODEL, TOK, VAL, need_bin, need_data

pytestmark = [need_bin, need_data]


def run(env_limit, *args, timeout=300):
    env = dict(os.environ)
    if env_limit is None:
        env.pop("SCALESWEEP_MEMORY_LIMIT", None)
    else:
        env["SCALESWEEP_MEMORY_LIMIT"] = env_limit
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_ppl_refuses_a_context_that_does_not_fit():
    p = run("1", "ppl", MODEL, "--text", VAL, "--ctx", "256", "--max-tokens", "512")
    assert p.returncode != 0
    err = p.stderr
    assert "--ctx: perplexity with a context of 256 tokens needs about" in err, err
    assert "KV cache and activations" in err and "logits" in err, err
    assert "is available; a smaller value reduces the KV cache and activations" in err, err
    assert "Traceback" not in err and "terminate" not in err, err
    ok = run("64GiB", "ppl", MODEL, "--text", VAL, "--ctx", "256", "--max-tokens", "512")
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("cmd", ["quantize", "calibrate"])
def test_calibration_that_does_not_fit_is_refused_and_writes_nothing(tmp_path, cmd):
    out = tmp_path / ("out" if cmd == "quantize" else "stats.safetensors")
    args = [cmd, MODEL, "--tokenizer", TOK, "--calib", VAL, "--calib-nsamples", "4",
            "--calib-seqlen", "64", "-o", out]
    if cmd == "quantize":
        args += ["--gptq", "--method", "sweep-mse"]
    p = run("1", *args)
    assert p.returncode != 0
    assert "--calib-nsamples: calibration on 4 x 64 tokens needs about" in p.stderr, p.stderr
    assert "hidden states" in p.stderr and "statistics of" in p.stderr, p.stderr
    assert "a smaller value reduces the hidden states" in p.stderr, p.stderr
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_a_malformed_limit_is_named():
    p = run("lots", "ppl", MODEL, "--text", VAL, "--ctx", "64", "--max-tokens", "128")
    assert p.returncode != 0
    assert "SCALESWEEP_MEMORY_LIMIT='lots' is not a byte count" in p.stderr, p.stderr


def test_experiment_gptq_rows_that_do_not_fit_are_refused_before_calibrating():
    """experiment's GPTQ rows are held packed while the calibration builds them layer by
    layer: rows that would not fit are refused first, naming --methods."""
    args = ["experiment", MODEL, "--tokenizer", TOK, "--calib", VAL, "--eval", VAL,
            "--nsamples", "4", "--seqlen", "64", "--max-tokens", "256", "--settings", "W",
            "--methods", "absmax,sweep-mse", "--no-errors"]
    p = run("1", *args)
    assert p.returncode != 0
    err = p.stderr
    assert "--methods: experiment's GPTQ rows (built while calibrating) needs about" in err, err
    assert "2 rows of packed NVFP4 Linears" in err, err
    assert "a smaller value reduces the rows held (fewer methods, or --no-gptq)" in err, err
    assert "calibrate" not in err.split("--methods")[0], err  # nothing ran before it
    assert "Traceback" not in err and "terminate" not in err, err
