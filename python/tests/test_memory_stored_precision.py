"""Peak resident memory of `scalesweep ppl` / `generate` on a synthetic bf16 Llama (about 180 MB
of weights, written by bench/synthetic_hf.py): the weights stay bf16 in the file mapping, so the
peak is the weight bytes plus a small constant, not the 2-3x an fp32 copy costs."""
import os
import resource
import subprocess
import sys

import pytest

from cli_common import BIN, TOK, VAL, need_bin, need_files

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../bench"))
import synthetic_hf  # noqa: E402

# Overhead allowed above the weight bytes: the binary and its libraries (oneDNN's sgemm code
# and packing buffers among them since the fp32 Linear products run there), the text and the
# tokenizer, activations and the KV cache of a 32-token window.
SLACK_MB = 100


def peak_rss_mb(cmd):
    """Runs cmd in a fresh Python process and returns the child's peak RSS in MB."""
    code = ("import resource, subprocess, sys\n"
            "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
            "sys.stderr.write(r.stdout + r.stderr)\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if r.returncode == 0 "
            "else -r.returncode if r.returncode < 0 else -1000 - r.returncode)\n")
    p = subprocess.run([sys.executable, "-c", code] + cmd, capture_output=True, text=True,
                       timeout=300)
    kb = int(p.stdout.strip().splitlines()[-1])
    assert kb > 0, f"{cmd} failed ({kb}): {p.stderr}"
    return kb / 1024.0


@need_bin
@need_files(TOK, VAL)
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_ppl_peak_rss_is_weights_plus_small(tmp_path, dtype):
    d = str(tmp_path / "m")
    params, nbytes = synthetic_hf.write(d, dim=1024, hidden=2816, layers=8, heads=16, kv_heads=4,
                                        vocab=512, dtype=dtype, seed=1)
    weights_mb = nbytes / 2**20
    assert weights_mb > 150
    for cmd in (["ppl", d, "--text", VAL, "--tokenizer", TOK, "--ctx", "32", "--max-tokens",
                 "64"],
                ["generate", d, "--tokenizer", TOK, "--prompt", "Once upon a time", "--steps",
                 "4", "--temperature", "0"]):
        mb = peak_rss_mb([BIN] + cmd)
        print(f"{cmd[0]} {dtype}: peak RSS {mb:.0f} MB for {weights_mb:.0f} MB of weights")
        # An fp32 copy of the weights alone would be 2x the bytes.
        assert mb < weights_mb + SLACK_MB, f"{cmd[0]}: peak RSS {mb:.0f} MB, weights {weights_mb:.0f} MB"


@need_bin
@need_files(TOK, VAL)
def test_calibrate_peak_rss_is_one_layer_of_statistics(tmp_path):
    """`calibrate` streams layer by layer: its peak is the (mapped) weights, the hidden states
    and ONE layer's float64 ΣxxT, not all layers' (the file holds them all); `ppl --stats`
    loads the file without ΣxxT (amax and the diagonal only)."""
    d = str(tmp_path / "m")
    dim, hidden, layers = 1024, 2816, 8
    params, nbytes = synthetic_hf.write(d, dim=dim, hidden=hidden, layers=layers, heads=16,
                                        kv_heads=4, vocab=512, dtype="bf16", seed=2)
    weights_mb = nbytes / 2**20
    # attn_in, attn_out, mlp_in [dim, dim] and mlp_out [hidden, hidden], float64.
    layer_mb = (3 * dim * dim + hidden * hidden) * 8 / 2**20
    stats = str(tmp_path / "stats.safetensors")
    nsamples, seqlen = 4, 64
    hidden_states_mb = nsamples * seqlen * dim * 4 / 2**20
    mb = peak_rss_mb([BIN, "calibrate", d, "--text", VAL, "--tokenizer", TOK, "--nsamples",
                      str(nsamples), "--seqlen", str(seqlen), "-o", stats])
    file_mb = os.path.getsize(stats) / 2**20
    assert file_mb > layers * layer_mb  # every layer's ΣxxT is in the file
    # One layer's ΣxxT plus its float64 row copy and scratch; all layers would be 8x.
    bound = weights_mb + hidden_states_mb + 1.5 * layer_mb + SLACK_MB
    print(f"calibrate: peak RSS {mb:.0f} MB (weights {weights_mb:.0f} MB, one layer's "
          f"statistics {layer_mb:.0f} MB, file {file_mb:.0f} MB); bound {bound:.0f} MB")
    assert bound < weights_mb + layers * layer_mb
    assert mb < bound, f"calibrate: peak RSS {mb:.0f} MB > {bound:.0f} MB"
    # ppl with simulated W4A4 from the file: no ΣxxT in memory.
    mb = peak_rss_mb([BIN, "ppl", d, "--text", VAL, "--tokenizer", TOK, "--ctx", "32",
                      "--max-tokens", "64", "--quant", "WA", "--method", "4over6", "--stats",
                      stats])
    print(f"ppl --quant WA --stats: peak RSS {mb:.0f} MB")
    # The mapped bf16 weights + their quantize-dequantized fp32 copy (2x the bytes) + slack;
    # the file's ΣxxT (more than the weights here) is neither loaded nor mapped in.
    bound = 3 * weights_mb + SLACK_MB
    assert bound < 3 * weights_mb + file_mb / 2
    assert mb < bound, f"ppl --stats: peak RSS {mb:.0f} MB > {bound:.0f} MB"
