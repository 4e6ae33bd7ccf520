"""Requests that can be refused from the options, the files named and the model's metadata are
refused before any weight is read (issue 30 item 3): each refusal below comes with the one
message of its check, a non-zero exit, nothing written, and a peak RSS of the process far
below what reading the model costs (the control case loads the same model and must exceed the
bound, so the bound means something). The model is SmolLM2-135M's GGUF fixture (its load reads
and checks every tensor of a 100 MB file)."""
import os
import subprocess
import sys

import pytest

from cli_common import BIN, need_bin, need_wiki, WIKI

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GGUF = os.path.join(ROOT, "models", "smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf")
need_gguf = pytest.mark.skipif(not os.path.exists(GGUF),
                               reason=f"SmolLM2 fixture absent ({GGUF}; scripts/get-models.sh)")
pytestmark = [need_bin, need_wiki, need_gguf]

# Peak RSS bound of a refusal: the binary alone peaks at about 30-40 MB, a refusal after the
# fixture is loaded (the control below) at about 70 MB or more.
BOUND_KB = 56 * 1024

PEAK = ("import resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "sys.stderr.write(r.stderr)\n"
        "print(r.returncode)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")


def run_peak(*args):
    """(exit code, stderr, peak RSS in KB) of `scalesweep ARGS`."""
    p = subprocess.run([sys.executable, "-c", PEAK, BIN, *map(str, args)], capture_output=True,
                       text=True, timeout=600)
    lines = p.stdout.strip().splitlines()
    return int(lines[-2]), p.stderr, int(lines[-1])


@pytest.fixture(scope="module")
def nvfp4_dir(tmp_path_factory):
    """A compressed-tensors NVFP4 checkpoint of the fixture (RTN)."""
    out = tmp_path_factory.mktemp("ct") / "smol-nvfp4"
    p = subprocess.run([BIN, "quantize", GGUF, "-o", str(out)], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    return str(out)


def test_the_bound_is_below_a_load():
    # Refused after the load: whether the text has 2 tokens is known only once it is encoded.
    code, err, kb = run_peak("ppl", GGUF, "--text", WIKI, "--max-tokens", "1")
    assert code != 0 and "fewer than 2 tokens" in err, err
    assert kb > BOUND_KB, f"a refusal after the load peaked at {kb} KB: the bound proves nothing"


CASES = {
    "ctx beyond max_seq_len": (["ppl", GGUF, "--text", WIKI, "--ctx", "100000"],
                               "ppl: ctx 100000 exceeds the model's max_seq_len 8192"),
    "stride beyond ctx": (["ppl", GGUF, "--text", WIKI, "--ctx", "512", "--stride", "600"],
                          "ppl: stride 600 exceeds ctx 512 (tokens would be skipped)"),
    "missing text": (["ppl", GGUF, "--text", "/nonexistent/eval.txt"], "/nonexistent/eval.txt"),
    "activations without calibration": (["generate", GGUF, "--prompt", "hi", "--quant", "WA"],
                                        "calibration statistics needed"),
    "missing calibration text (ppl)": (
        ["ppl", GGUF, "--text", WIKI, "--quant", "WA", "--calib", "/nonexistent/c.txt"],
        "/nonexistent/c.txt: cannot open text file"),
    "missing calibration text (quantize --gptq)": (
        ["quantize", GGUF, "-o", "{tmp}/out", "--gptq", "--calib", "/nonexistent/c.txt"],
        "/nonexistent/c.txt: cannot open text file"),
    "missing statistics (quantize)": (
        ["quantize", GGUF, "-o", "{tmp}/out", "--method", "sweep-wmse", "--stats",
         "/nonexistent/s.safetensors"],
        "/nonexistent/s.safetensors: cannot open"),
    "W4A4 into a GGUF": (["quantize", GGUF, "-o", "{tmp}/out.gguf", "--quant", "WA", "--calib",
                          WIKI], "a GGUF output is W4A16"),
    "--keep-dense names no Linear": (["quantize", GGUF, "-o", "{tmp}/out", "--keep-dense", "foo"],
                                     "--keep-dense 'foo': expected a Linear"),
    "--target-bpw without calibration": (["quantize", GGUF, "-o", "{tmp}/out", "--target-bpw",
                                          "5"], "--target-bpw: mixed precision measures"),
    "MXFP4 with block 16": (["generate", GGUF, "--prompt", "hi", "--quant", "W", "--format",
                             "mxfp4", "--block", "16"], "MXFP4 requires block 32"),
    "unknown task": (["eval", GGUF, "--tasks", "nosuchtask"], 'unknown task "nosuchtask"'),
    "task data absent": (["eval", GGUF, "--tasks", "arc_easy", "--task-data",
                          "arc_easy=/nonexistent/arc.jsonl"], "/nonexistent/arc.jsonl"),
    "missing calibration text (calibrate)": (
        ["calibrate", GGUF, "-o", "{tmp}/s.safetensors", "--calib", "/nonexistent/c.txt"],
        "/nonexistent/c.txt"),
    "GGUF into a GGUF with convert": (["convert", GGUF, "-o", "{tmp}/q8.gguf", "--dtype", "q8_0"],
                                      "-o .gguf converts a compressed-tensors NVFP4 checkpoint"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_refused_before_the_weights_are_read(name, tmp_path):
    args, want = CASES[name]
    args = [str(a).replace("{tmp}", str(tmp_path)) for a in args]
    code, err, kb = run_peak(*args)
    assert code != 0, f"{name}: not refused\n{err}"
    assert want in err, f"{name}: {err}"
    assert "Traceback" not in err and "terminate" not in err, err
    assert kb < BOUND_KB, f"{name}: peak RSS {kb} KB before the refusal (bound {BOUND_KB} KB)"
    assert not any(tmp_path.iterdir()), f"{name}: wrote {list(tmp_path.iterdir())}"


def test_requantizing_a_checkpoint_is_refused_from_its_config(nvfp4_dir):
    code, err, kb = run_peak("ppl", nvfp4_dir, "--text", WIKI, "--quant", "W")
    assert code != 0 and "the checkpoint's weights are already NVFP4" in err, err
    assert "--force-requant" in err, err
    assert kb < BOUND_KB, f"peak RSS {kb} KB before the refusal (bound {BOUND_KB} KB)"
