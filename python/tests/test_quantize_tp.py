"""`scalesweep quantize --tp N` on stories260K (dim 64, n_heads 8, hidden 172, 5 layers).

vLLM's RowParallelLinear (o_proj, down_proj) splits K over the tensor-parallel ranks and each
rank's NVFP4 weight_scale is [N, (K / tp) // 16], so those Linears stay dense (listed in
quantization_config.ignore) when (K / tp) % 16 != 0 or K % tp != 0. down_proj (K = 172) is
dense at any tp (K % 16 != 0); o_proj (K = 64) is fine up to tp 4 and dense at tp 8."""

import json
import os
import subprocess

import pytest

from cli_common import BIN, MODEL, TOK, need_bin, need_files

pytestmark = [need_bin, need_files(MODEL, TOK)]

N_LAYERS = 5
DOWNS = [f"model.layers.{l}.mlp.down_proj" for l in range(N_LAYERS)]
OS = [f"model.layers.{l}.self_attn.o_proj" for l in range(N_LAYERS)]


def quantize(out, *extra, ok=True):
    p = subprocess.run([BIN, "quantize", MODEL, "-o", str(out), "--method", "absmax", *extra],
                       capture_output=True, text=True, timeout=600)
    if ok:
        assert p.returncode == 0, f"{extra}: rc={p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def ignore(out):
    with open(os.path.join(out, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    assert "tp" not in qc and "tensor_parallel_size" not in qc  # nothing new recorded
    return qc["ignore"]


def notes(p):
    return [l for l in p.stderr.splitlines() if l.startswith("note:")]


def test_tp2_same_ignore_as_tp1(tmp_path):
    """tp 2: o_proj 64 / 2 = 32 is whole blocks, so the checkpoint lists what tp 1 lists."""
    p1 = quantize(tmp_path / "tp1")
    p2 = quantize(tmp_path / "tp2", "--tp", "2")
    expect = DOWNS + ["lm_head"]
    assert ignore(tmp_path / "tp1") == expect
    assert ignore(tmp_path / "tp2") == expect
    assert notes(p2) == notes(p1) and len(notes(p2)) == N_LAYERS
    assert "refuse" not in p2.stderr
    with open(tmp_path / "tp1" / "model.safetensors", "rb") as a, \
            open(tmp_path / "tp2" / "model.safetensors", "rb") as b:
        assert a.read() == b.read()


def test_tp8_keeps_o_proj_dense(tmp_path):
    """tp 8: o_proj K / tp = 8 -> dense too; gate/up N = 172 % 8 != 0 -> one note that vLLM
    itself refuses tp 8 for this model."""
    out = tmp_path / "tp8"
    p = quantize(out, "--tp", "8")
    expect = [m for l in range(N_LAYERS) for m in (OS[l], DOWNS[l])] + ["lm_head"]
    assert ignore(out) == expect
    n = notes(p)
    refusals = [l for l in n if "refuse" in l]
    assert len(refusals) == 1 and "tensor_parallel_size = 8" in refusals[0]
    assert "gate_proj has N = 172" in refusals[0]
    per_layer = [l for l in n if "stays dense" in l]
    assert len(per_layer) == 2 * N_LAYERS
    for m in OS:
        (line,) = [l for l in per_layer if m in l]
        assert "tp = 8" in line and "K / tp = 8 " in line and "ignore" in line
    # The runtime loads the mixed checkpoint and lists the dense modules.
    j = json.loads(subprocess.run([BIN, "inspect", str(out), "--json"], capture_output=True,
                                  text=True, check=True, timeout=600).stdout)
    assert sorted(j["dense"]) == sorted(OS + DOWNS)
    # tp 4: 64 / 4 = 16 whole blocks, only down_proj.
    quantize(tmp_path / "tp4", "--tp", "4")
    assert ignore(tmp_path / "tp4") == DOWNS + ["lm_head"]


def test_tp_partial_blocks_quantize_and_bad_values(tmp_path):
    """--partial-blocks quantize stores everything as NVFP4 whatever tp; tp outside 1..1024
    is an error that writes nothing."""
    p = quantize(tmp_path / "pq", "--tp", "8", "--partial-blocks", "quantize")
    assert ignore(tmp_path / "pq") == ["lm_head"]
    assert not [l for l in notes(p) if "stays dense" in l]
    for bad in ["0", "-2", "1025", "two"]:
        out = tmp_path / f"bad{bad}"
        p = quantize(out, "--tp", bad, ok=False)
        assert p.returncode != 0 and "--tp" in p.stderr, p.stderr
        assert not out.exists()


def test_tp8_streamed_hf_source(tmp_path):
    """A Hugging Face source (the streamed, layer-by-layer path) gets the same tp rule."""
    hf = tmp_path / "hf"
    subprocess.run([BIN, "convert", MODEL, "--tokenizer", TOK, "-o", str(hf), "--dtype", "bf16"],
                   capture_output=True, text=True, check=True, timeout=600)
    p = subprocess.run([BIN, "quantize", str(hf), "-o", str(tmp_path / "q"), "--tp", "8"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert ignore(tmp_path / "q") == [m for l in range(N_LAYERS)
                                      for m in (OS[l], DOWNS[l])] + ["lm_head"]
    assert len([l for l in notes(p) if "stays dense" in l]) == 2 * N_LAYERS
