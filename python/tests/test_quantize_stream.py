"""`scalesweep quantize` on a Hugging Face directory streams the model layer by layer. Checked
through the CLI on stories260K converted to bf16: RTN (with and without W4A4) writes the same
bytes as the whole-model path (`--no-stream`); sequential GPTQ (the streamed default) is
deterministic, reads back with the `safetensors` package, and beats RTN on layer-output loss."""
import json
import os
import subprocess
from pathlib import Path

import pytest

BIN = os.environ.get("SCALESWEEP_BIN")
DATA = Path(os.environ.get("SS_SHARED_DATA_DIR", Path(__file__).resolve().parents[3] / "shared" / "data"))
MODEL = DATA / "models" / "stories260K" / "stories260K.bin"
TOK = DATA / "models" / "stories260K" / "tok512.bin"
TEXT = DATA / "text" / "tinystories_val.txt"


def run(*args, check=True):
    r = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"{args} failed rc={r.returncode}: {r.stderr}")
    return r


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    if not BIN:
        pytest.skip("SCALESWEEP_BIN not set (run through ctest)")
    if not MODEL.exists() or not TOK.exists() or not TEXT.exists():
        pytest.skip(f"shared data absent ({MODEL})")
    out = tmp_path_factory.mktemp("qs") / "stories-bf16"
    run("convert", MODEL, "--tokenizer", TOK, "-o", out, "--dtype", "bf16", "--shard-mb", "0.2")
    return out


CAL = ["--calib", TEXT, "--nsamples", "8", "--seqlen", "64", "--seed", "1"]


@pytest.mark.parametrize("args", [
    ["--method", "sweep-mse"],
    ["--method", "absmax", "--quant", "WA", *CAL],
    ["--method", "sweep-wmse", "--quant", "WA", *CAL],
])
def test_streamed_rtn_equals_whole_model(hf, tmp_path, args):
    a, b = tmp_path / "whole", tmp_path / "stream"
    run("quantize", hf, "-o", a, "--no-stream", *args)
    run("quantize", hf, "-o", b, *args)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert json.loads((a / "config.json").read_text()) == json.loads((b / "config.json").read_text())


def test_sequential_gptq(hf, tmp_path):
    outs = []
    for name in ["g1", "g2"]:
        r = run("quantize", hf, "-o", tmp_path / name, "--gptq", "--quant", "WA", *CAL, "--json")
        outs.append(json.loads(r.stdout))
    b1 = (tmp_path / "g1" / "model.safetensors").read_bytes()
    assert b1 == (tmp_path / "g2" / "model.safetensors").read_bytes()
    assert len(outs[0]["linears"]) == 5 * 7
    lin = [x for x in outs[0]["linears"] if not x["dense"]]  # down_proj (K = 172) stays dense
    assert len(lin) == 5 * 6
    assert all(x["loss_gptq"] <= x["loss_rtn"] for x in lin)
    assert sum(x["loss_gptq"] for x in lin) < 0.9 * sum(x["loss_rtn"] for x in lin)
    assert all(x["input_global_scale"] > 0 for x in lin)
    # The wall-time breakdown: every phase ran, and together they fit in the total.
    ph = outs[0]["phases"]
    assert set(ph) == {"load", "forward", "hessians", "quantize", "write"}
    assert all(v > 0 for v in ph.values()), ph
    assert sum(ph.values()) <= outs[0]["seconds"]
    # --no-sequential calibrates on full-precision activations: the whole-model result.
    run("quantize", hf, "-o", tmp_path / "fp", "--gptq", "--quant", "WA", *CAL, "--no-sequential")
    run("quantize", hf, "-o", tmp_path / "whole", "--gptq", "--quant", "WA", *CAL, "--no-stream")
    fp = (tmp_path / "fp" / "model.safetensors").read_bytes()
    assert fp == (tmp_path / "whole" / "model.safetensors").read_bytes()
    assert fp != b1
    from safetensors import safe_open
    with safe_open(str(tmp_path / "g1" / "model.safetensors"), framework="np") as f:
        packed = f.get_tensor("model.layers.0.self_attn.q_proj.weight_packed")
        assert packed.dtype.name == "uint8" and packed.ndim == 2


def test_streamed_errors(hf, tmp_path):
    r = run("quantize", hf, "-o", tmp_path / "x", "--gptq", check=False)
    assert r.returncode != 0 and "--calib" in r.stderr
    r = run("quantize", hf, "-o", tmp_path / "x", "--gptq", "--calib", tmp_path / "missing.txt",
            check=False)
    assert r.returncode != 0 and "missing.txt" in r.stderr
    assert not (tmp_path / "x").exists()


def test_streamed_with_stats_file(hf, tmp_path):
    st = tmp_path / "stats.safetensors"
    run("calibrate", hf, "--text", TEXT, "--nsamples", "4", "--seqlen", "64", "-o", st)
    a, b = tmp_path / "whole", tmp_path / "stream"
    args = ["--method", "sweep-wmse", "--gptq", "--quant", "WA", "--stats", st]
    run("quantize", hf, "-o", a, "--no-stream", *args)
    run("quantize", hf, "-o", b, *args)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def tensors_of(d):
    """{name: (dtype, shape, bytes)} of a checkpoint directory, one file or shards, read with
    the `safetensors` package (the reference Rust reader) and the raw headers."""
    import struct
    idx = d / "model.safetensors.index.json"
    files = sorted(set(json.loads(idx.read_text())["weight_map"].values())) if idx.exists() \
        else ["model.safetensors"]
    out = {}
    from safetensors import safe_open
    for fn in files:
        raw = (d / fn).read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        hdr = json.loads(raw[8:8 + n])
        with safe_open(str(d / fn), framework="np") as f:  # validates the file
            keys = set(f.keys())
        for k, e in hdr.items():
            if k == "__metadata__":
                continue
            assert k in keys and k not in out, (fn, k)
            b, en = e["data_offsets"]
            out[k] = (e["dtype"], e["shape"], raw[8 + n + b:8 + n + en])
    return out, files


def test_streamed_sharded_equals_single(hf, tmp_path):
    a, b = tmp_path / "single", tmp_path / "sharded"
    run("quantize", hf, "-o", a, "--method", "sweep-mse")
    r = run("quantize", hf, "-o", b, "--method", "sweep-mse", "--max-shard-size", "30000",
            "--json")
    files = json.loads(r.stdout)["files"]
    assert len(files) > 3 and not (b / "model.safetensors").exists()
    assert files == [f"model-{i:05d}-of-{len(files):05d}.safetensors"
                     for i in range(1, len(files) + 1)]
    ta, fa = tensors_of(a)
    tb, fb = tensors_of(b)
    assert fa == ["model.safetensors"] and sorted(fb) == files
    assert ta == tb  # same tensors, dtypes, shapes and bytes
    idx_text = (b / "model.safetensors.index.json").read_text()
    idx = json.loads(idx_text)
    # As transformers' save_pretrained writes it.
    assert idx_text == json.dumps(idx, indent=2, sort_keys=True) + "\n"
    assert idx["metadata"]["total_size"] == sum(len(v[2]) for v in ta.values())
    size = {"U8": 1, "F8_E4M3": 1, "BF16": 2, "F16": 2, "F32": 4}
    assert idx["metadata"]["total_parameters"] == sum(len(v[2]) // size[v[0]] for v in ta.values())
    for fn in files:  # <= the limit, unless a single tensor is larger
        held = [k for k, f in idx["weight_map"].items() if f == fn]
        assert sum(len(tb[k][2]) for k in held) <= 30000 or len(held) == 1
    pa = json.loads(run("ppl", a, "--text", TEXT, "--max-tokens", "600", "--json").stdout)
    pb = json.loads(run("ppl", b, "--text", TEXT, "--max-tokens", "600", "--json").stdout)
    assert pa["nll_per_token"] == pb["nll_per_token"]


def test_seqlen_capped_with_note(hf, tmp_path):
    args = ["--method", "sweep-wmse", "--calib", TEXT, "--nsamples", "2", "--seed", "3"]
    a = run("quantize", hf, "-o", tmp_path / "cap", *args, "--seqlen", "100000")
    run("quantize", hf, "-o", tmp_path / "max", *args, "--seqlen", "512")
    notes = [l for l in a.stderr.splitlines() if "max_seq_len" in l]
    assert notes == [f"note: --seqlen 100000 exceeds {hf}'s max_seq_len 512; using 512"]
    assert (tmp_path / "cap" / "model.safetensors").read_bytes() == \
        (tmp_path / "max" / "model.safetensors").read_bytes()
