"""`scalesweep quantize` checkpoints, checked from the outside.

The checkpoint is read with the `safetensors` package (and the raw header for the F8_E4M3
scales, which numpy cannot represent), the NVFP4 weights are decompressed here from the
published compressed-tensors layout with numpy + ml_dtypes:

    codes: element 2i = low nibble, 2i+1 = high nibble of weight_packed[:, i]
    value: E2M1 magnitude {0, .5, 1, 1.5, 2, 3, 4, 6}[code & 7], negative when code & 8
    w = fl32(fl32(value * scale) / weight_global_scale)     (weight_global_scale: encode dir.)

and compared bit for bit with the runtime's own reader (`scalesweep inspect --dump-dequant`,
the code the model loader uses), and against the original fp32 weights of the llama2.c file.
"""

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
safetensors = pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

BIN = os.environ.get("SCALESWEEP_BIN")
DATA = os.environ.get("SS_SHARED_DATA_DIR", "")
MODEL = os.path.join(DATA, "models", "stories260K", "stories260K.bin")
TEXT = os.path.join(DATA, "text", "tinystories_val.txt")

pytestmark = pytest.mark.skipif(not BIN, reason="SCALESWEEP_BIN not set (run through ctest)")
need_data = pytest.mark.skipif(
    not os.path.exists(MODEL), reason=f"stories260K not found under SS_SHARED_DATA_DIR={DATA!r}"
)

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)
LINEARS = [
    ("self_attn.q_proj", "wq"),
    ("self_attn.k_proj", "wk"),
    ("self_attn.v_proj", "wv"),
    ("self_attn.o_proj", "wo"),
    ("mlp.gate_proj", "w1"),
    ("mlp.up_proj", "w3"),
    ("mlp.down_proj", "w2"),
]


def run(*args, ok=True):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=600)
    if ok:
        assert p.returncode == 0, f"{args}: rc={p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


def raw_tensor(path, name):
    hdr, start = header(path)
    e = hdr[name]
    b, end = e["data_offsets"]
    with open(path, "rb") as f:
        f.seek(start + b)
        return e, f.read(end - b)


def tensor_bytes(path, name):
    e, b = raw_tensor(path, name)
    return e["dtype"], e["shape"], b


def decompress(packed, scale_bytes, gs, cols):
    """NVFP4 decompression from the compressed-tensors layout, in numpy."""
    rows = packed.shape[0]
    codes = np.empty((rows, packed.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2] = packed & 0x0F
    codes[:, 1::2] = packed >> 4
    codes = codes[:, :cols]
    q = E2M1[codes & 7]
    q = np.where(codes & 8, -q, q).astype(np.float32)
    s = scale_bytes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    s_full = np.repeat(s, 16, axis=1)[:, :cols]
    prod = (q * s_full).astype(np.float32)  # exact: <= 6 significant bits
    return (prod / np.float32(gs)).astype(np.float32)


def llama2c_weights(path):
    """The fp32 Linear weights of a legacy llama2.c file, rows permuted to HF rotate-half."""
    with open(path, "rb") as f:
        dim, hidden, n_layers, n_heads, n_kv, vocab, seq = struct.unpack("<7i", f.read(28))
        data = np.frombuffer(f.read(), dtype=np.float32)
    vocab = abs(vocab)
    hd = dim // n_heads
    kv_dim = n_kv * hd
    off = 0

    def take(*shape):
        nonlocal off
        n = int(np.prod(shape))
        a = data[off : off + n].reshape(shape)
        off += n
        return a

    take(vocab, dim)
    take(n_layers, dim)
    wq = take(n_layers, dim, dim)
    wk = take(n_layers, kv_dim, dim)
    wv = take(n_layers, kv_dim, dim)
    wo = take(n_layers, dim, dim)
    take(n_layers, dim)
    w1 = take(n_layers, hidden, dim)
    w2 = take(n_layers, dim, hidden)
    w3 = take(n_layers, hidden, dim)

    def to_hf(w, heads):  # interleaved pairs (2i, 2i+1) -> rotate-half (i, i + hd/2)
        return w.reshape(heads, hd // 2, 2, -1).transpose(0, 2, 1, 3).reshape(heads * hd, -1)

    out = []
    for l in range(n_layers):
        out.append(
            dict(wq=to_hf(wq[l], n_heads), wk=to_hf(wk[l], n_kv), wv=wv[l], wo=wo[l],
                 w1=w1[l], w2=w2[l], w3=w3[l])
        )
    return out, dict(dim=dim, hidden=hidden, n_layers=n_layers)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    if not os.path.exists(MODEL):
        pytest.skip(f"stories260K not found under SS_SHARED_DATA_DIR={DATA!r}")
    d = tmp_path_factory.mktemp("ckpt")
    # --partial-blocks quantize: every Linear NVFP4, down_proj (K = 172) with a partial last
    # block (scalesweep's runtime only); the default (vLLM-loadable) is tested below.
    rtn = str(d / "rtn_absmax")
    run("quantize", MODEL, "-o", rtn, "--method", "absmax", "--partial-blocks", "quantize")
    gptq = str(d / "gptq_wmse_wa")
    run("quantize", MODEL, "-o", gptq, "--method", "sweep-wmse", "--gptq", "--quant", "WA",
        "--calib", TEXT, "--nsamples", "16", "--seqlen", "128", "--partial-blocks", "quantize")
    dense = str(d / "rtn_absmax_dense")
    p = run("quantize", MODEL, "-o", dense, "--method", "absmax")
    return dict(rtn=rtn, gptq=gptq, dense=dense, dense_stderr=p.stderr, dir=d)


@need_data
@pytest.mark.parametrize("which", ["rtn", "gptq"])
def test_layout_and_bit_exact_decompression(checkpoints, which):
    out = checkpoints[which]
    st = os.path.join(out, "model.safetensors")
    orig, dims = llama2c_weights(MODEL)
    cfg = json.load(open(os.path.join(out, "config.json")))
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors"
    assert qc["format"] == "nvfp4-pack-quantized"
    assert qc["ignore"] == ["lm_head"]
    g = qc["config_groups"]["group_0"]
    assert g["targets"] == ["Linear"]
    w = g["weights"]
    assert (w["num_bits"], w["type"], w["strategy"], w["group_size"], w["symmetric"],
            w["dynamic"]) == (4, "float", "tensor_group", 16, True, False)
    assert w["scale_dtype"] == "torch.float8_e4m3fn"
    wa = which == "gptq"
    if wa:
        ia = g["input_activations"]
        assert ia["dynamic"] == "local" and ia["strategy"] == "tensor_group"
    else:
        assert g["input_activations"] is None

    dump = os.path.join(checkpoints["dir"], which + "_dequant.safetensors")
    run("inspect", out, "--dump-dequant", dump)
    runtime = load_file(dump)
    hdr, _ = header(st)
    names = set(hdr) - {"__metadata__"}
    expected = {"model.embed_tokens.weight", "model.norm.weight"}
    with safe_open(st, framework="numpy") as f:
        for l in range(dims["n_layers"]):
            p = f"model.layers.{l}."
            expected |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
            gs_of = {}
            for hf, key in LINEARS:
                pre = p + hf
                sfx = ["weight_packed", "weight_scale", "weight_global_scale"]
                if wa:
                    sfx.append("input_global_scale")
                expected |= {f"{pre}.{s}" for s in sfx}
                ow = orig[l][key]
                rows, cols = ow.shape
                packed = f.get_tensor(pre + ".weight_packed")
                assert packed.dtype == np.uint8 and packed.shape == (rows, (cols + 1) // 2)
                e, sb = raw_tensor(st, pre + ".weight_scale")
                assert e["dtype"] == "F8_E4M3" and e["shape"] == [rows, (cols + 15) // 16]
                scales = np.frombuffer(sb, dtype=np.uint8).reshape(rows, -1)
                assert not np.any((scales & 0x7F) == 0x7F) and not np.any(scales & 0x80)
                gs_t = f.get_tensor(pre + ".weight_global_scale")
                assert gs_t.dtype == np.float32 and gs_t.shape == (1,)
                gs = gs_t[0]
                gs_of[hf] = gs
                ours = decompress(packed, scales, gs, cols)
                theirs = runtime[pre + ".weight"]
                assert ours.shape == theirs.shape
                assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32)), pre
                # Close to the original weights: wrong nibble order, transposition or global
                # scale direction would give errors of order 1, not ~1%.
                nmse = float(np.sum((ours - ow) ** 2) / np.sum(ow.astype(np.float64) ** 2))
                assert nmse < 0.03, (pre, nmse)
                if wa:
                    igs = f.get_tensor(pre + ".input_global_scale")
                    assert igs.dtype == np.float32 and igs.shape == (1,) and igs[0] > 0
            # Encode-direction global scale shared by fused groups, from the largest amax.
            C = 448.0 if which == "rtn" else 256.0
            for group in (["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
                          ["mlp.gate_proj", "mlp.up_proj"]):
                keys = [dict(LINEARS)[h] for h in group]
                amax = np.float32(max(np.abs(orig[l][k]).max() for k in keys))
                for h in group:
                    assert gs_of[h] == np.float32(6 * C) / amax, (l, h)
    assert names == expected  # no lm_head (tied), nothing else


@need_data
def test_loaded_checkpoint_runs_and_matches_simulation(checkpoints):
    out = checkpoints["rtn"]
    a = json.loads(run("ppl", out, "--text", TEXT, "--max-tokens", "2000", "--json").stdout)
    b = json.loads(run("ppl", MODEL, "--text", TEXT, "--max-tokens", "2000", "--quant", "W",
                       "--method", "absmax", "--json").stdout)
    fp = json.loads(run("ppl", MODEL, "--text", TEXT, "--max-tokens", "2000", "--json").stdout)
    assert a["tokens"] == b["tokens"] > 1000
    assert a["nll_per_token"] == b["nll_per_token"]  # checkpoint == simulated W quantization
    assert fp["nll_per_token"] < a["nll_per_token"] < fp["nll_per_token"] + 0.5
    g = run("generate", out, "--prompt", "Once upon a time", "-n", "20", "--temperature", "0")
    assert "Once upon a time" in g.stdout


@need_data
def test_bad_inputs(checkpoints, tmp_path):
    out = str(tmp_path / "x")
    p = run("quantize", MODEL, "-o", out, "--gptq", ok=False)
    assert p.returncode != 0 and "--gptq: GPTQ needs calibration" in p.stderr
    assert not os.path.exists(out)
    p = run("quantize", MODEL, "-o", out, "--quant", "WAKV", ok=False)
    assert p.returncode != 0 and "--quant" in p.stderr
    p = run("quantize", MODEL, "-o", out, "--block", "32", ok=False)
    assert p.returncode != 0 and "block 16" in p.stderr
    p = run("quantize", MODEL, "-o", out, "--method", "opt-fp32", ok=False)
    assert p.returncode != 0 and "opt-fp32" in p.stderr
    p = run("quantize", MODEL, "-o", checkpoints["rtn"], ok=False)  # exists: untouched
    assert p.returncode != 0 and "already exists" in p.stderr
    assert os.path.exists(os.path.join(checkpoints["rtn"], "model.safetensors"))
    # Unsupported architecture in a HF directory.
    bad = tmp_path / "mistral"
    bad.mkdir()
    cfg = json.load(open(os.path.join(checkpoints["rtn"], "config.json")))
    del cfg["quantization_config"]
    cfg["architectures"] = ["MambaForCausalLM"]
    cfg["model_type"] = "mamba"
    (bad / "config.json").write_text(json.dumps(cfg))
    p = run("quantize", str(bad), "-o", out, ok=False)
    assert p.returncode != 0 and "Mamba" in p.stderr
    assert not os.path.exists(out)
    # A corrupt scale byte in a checkpoint: clear error naming the tensor.
    broken = tmp_path / "broken"
    subprocess.run(["cp", "-r", checkpoints["rtn"], str(broken)], check=True)
    st = broken / "model.safetensors"
    os.chmod(st, 0o644)
    hdr, start = header(str(st))
    e = hdr["model.layers.2.mlp.down_proj.weight_scale"]
    data = bytearray(st.read_bytes())
    data[start + e["data_offsets"][0] + 3] = 0x7F
    st.write_bytes(bytes(data))
    p = run("ppl", str(broken), "--text", TEXT, "--max-tokens", "100", ok=False)
    assert p.returncode != 0
    assert "model.layers.2.mlp.down_proj.weight_scale" in p.stderr and "NaN" in p.stderr


@need_data
def test_experiment_cli(tmp_path):
    rep = tmp_path / "rep"
    p = run("experiment", MODEL, "--calib", TEXT, "--eval", TEXT, "--nsamples", "8", "--seqlen",
            "128", "--max-tokens", "600", "--methods", "absmax,sweep-wmse", "--settings",
            "WA,WAKVQ", "--error-tokens", "256", "--report-dir", str(rep), "--json")
    j = json.loads(p.stdout)
    assert j["eval_tokens"] > 500
    cells = j["cells"]
    assert len(cells) == 2 * 2 * 2  # {RTN, GPTQ} x 2 methods x 2 settings
    assert {(c["algo"], c["method"], c["setting"]) for c in cells} == {
        (a, m, s) for a in ("RTN", "GPTQ") for m in ("absmax", "sweep-wmse")
        for s in ("WA", "WAKVQ")}
    fp = j["fp"]["nll_per_token"]
    for c in cells:
        assert c["nll_per_token"] > fp * 0.98
        assert abs(c["recovery"] - 100 * fp / c["nll_per_token"]) < 1e-9
    errs = j["layer_errors"]
    assert len(errs) == 5 * 14  # 7 weights + 4 Linear inputs + Q, K, V per layer
    for e in errs:
        for m in ("absmax", "sweep-wmse"):
            g = e["methods"][m]
            assert g["nmse"] >= e["opt_nmse"] * (1 - 1e-6)  # opt-fp32 is a lower bound
            assert g["nwmse"] >= e["opt_nwmse"] * (1 - 1e-6)
    md = (rep / "experiment.md").read_text()
    assert "| FP |" in md and "Recovery" in md and "NWMSE gap" in md
    import xml.etree.ElementTree as ET
    root = ET.parse(rep / "layer_errors.svg").getroot()
    assert root.tag.endswith("svg")
    p = run("experiment", MODEL, "--eval", TEXT, ok=False)
    assert p.returncode != 0 and "calibration" in p.stderr


@need_data
def test_default_leaves_down_proj_dense(checkpoints):
    """K = 172 is not a multiple of 16: vLLM cannot load down_proj as NVFP4, so by default it
    stays dense (the source's fp32 values) and is listed in quantization_config.ignore, one
    stderr note per module; every other tensor equals the all-NVFP4 checkpoint's."""
    out, full = checkpoints["dense"], checkpoints["rtn"]
    orig, dims = llama2c_weights(MODEL)
    downs = [f"model.layers.{l}.mlp.down_proj" for l in range(dims["n_layers"])]
    qc = json.load(open(os.path.join(out, "config.json")))["quantization_config"]
    assert qc["ignore"] == downs + ["lm_head"]
    assert qc["version"] == "0.14.0"
    notes = [l for l in checkpoints["dense_stderr"].splitlines() if l.startswith("note:")]
    assert len(notes) == len(downs)
    for m, n in zip(downs, notes):
        assert m in n and "K = 172" in n and "ignore" in n
    st, st_full = os.path.join(out, "model.safetensors"), os.path.join(full, "model.safetensors")
    hdr, _ = header(st)
    hdr_full, _ = header(st_full)
    with safe_open(st, framework="numpy") as f:
        for l, m in enumerate(downs):
            w = f.get_tensor(m + ".weight")
            assert w.dtype == np.float32 and np.array_equal(w.view(np.uint32),
                                                            orig[l]["w2"].view(np.uint32))
            assert not any(k.startswith(m + ".weight_") for k in hdr)
    same = set(hdr) - {"__metadata__"} - {m + ".weight" for m in downs}
    assert same == {k for k in hdr_full if k != "__metadata__" and
                    not any(k.startswith(m + ".") for m in downs)}
    for k in same:
        assert tensor_bytes(st, k) == tensor_bytes(st_full, k), k
    # The runtime loads the mixed checkpoint; inspect lists the dense modules.
    j = json.loads(run("inspect", out, "--json").stdout)
    assert j["dense"] == downs and len(j["linears"]) == 6 * dims["n_layers"]
    a = json.loads(run("ppl", out, "--text", TEXT, "--max-tokens", "2000", "--json").stdout)
    q = json.loads(run("ppl", full, "--text", TEXT, "--max-tokens", "2000", "--json").stdout)
    fp = json.loads(run("ppl", MODEL, "--text", TEXT, "--max-tokens", "2000", "--json").stdout)
    assert a["tokens"] == fp["tokens"] > 1000
    assert fp["nll_per_token"] < a["nll_per_token"] < q["nll_per_token"] + 0.05


@need_data
def test_sharded_checkpoint(checkpoints, tmp_path):
    """--max-shard-size splits the output as Hugging Face does; same tensors, same model."""
    out = str(tmp_path / "sharded")
    run("quantize", MODEL, "-o", out, "--method", "absmax", "--max-shard-size", "40KB")
    names = sorted(n for n in os.listdir(out) if n.endswith(".safetensors"))
    n = len(names)
    assert n > 3 and names == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    idx = json.load(open(os.path.join(out, "model.safetensors.index.json")))
    single = os.path.join(checkpoints["dense"], "model.safetensors")
    hdr, _ = header(single)
    tensors = set(hdr) - {"__metadata__"}
    assert set(idx["weight_map"]) == tensors and set(idx["weight_map"].values()) == set(names)
    assert idx["metadata"]["total_size"] == sum(
        hdr[k]["data_offsets"][1] - hdr[k]["data_offsets"][0] for k in tensors)
    for k in tensors:
        assert tensor_bytes(os.path.join(out, idx["weight_map"][k]), k) == tensor_bytes(single, k)
    for fn in names:  # each shard is a valid safetensors file (reference reader)
        with safe_open(os.path.join(out, fn), framework="numpy") as f:
            assert set(f.keys()) == {k for k, v in idx["weight_map"].items() if v == fn}
    d1, d2 = str(tmp_path / "d1.safetensors"), str(tmp_path / "d2.safetensors")
    run("inspect", out, "--dump-dequant", d1)
    run("inspect", checkpoints["dense"], "--dump-dequant", d2)
    a, b = load_file(d1), load_file(d2)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    pa = json.loads(run("ppl", out, "--text", TEXT, "--max-tokens", "500", "--json").stdout)
    pb = json.loads(run("ppl", checkpoints["dense"], "--text", TEXT, "--max-tokens", "500",
                        "--json").stdout)
    assert pa["nll_per_token"] == pb["nll_per_token"]
    p = run("quantize", MODEL, "-o", str(tmp_path / "x"), "--max-shard-size", "5QB", ok=False)
    assert p.returncode != 0 and "--max-shard-size" in p.stderr
    assert not os.path.exists(tmp_path / "x")


@need_data
def test_sharded_tensor_missing_from_index(tmp_path):
    """A tensor in a shard but not in model.safetensors.index.json: inspect reports it as the
    runtime loader does (was: inspect exited 0 listing the checkpoint), naming shard, tensor
    and index, for a dense tensor (model.norm.weight) and an NVFP4 one (weight_packed)."""
    out = tmp_path / "sharded"
    run("quantize", MODEL, "-o", str(out), "--method", "absmax", "--max-shard-size", "40KB")
    idx_path = out / "model.safetensors.index.json"
    idx = json.loads(idx_path.read_text())
    run("inspect", str(out))
    for name in ("model.norm.weight", "model.layers.1.self_attn.q_proj.weight_packed"):
        broken = json.loads(json.dumps(idx))
        shard = broken["weight_map"].pop(name)
        os.chmod(idx_path, 0o644)
        idx_path.write_text(json.dumps(broken))
        want = f"{shard}: tensor '{name}' is in this file but missing from " \
               "model.safetensors.index.json"
        for args in (["inspect", str(out)], ["inspect", str(out), "--json"],
                     ["ppl", str(out), "--text", TEXT, "--max-tokens", "100"]):
            p = run(*args, ok=False)
            assert p.returncode == 1 and want in p.stderr, (args, p.stderr)
            assert p.stdout == "", (args, p.stdout)
    idx_path.write_text(json.dumps(idx))
    run("inspect", str(out))


@need_data
def test_reader_rejects_non_contiguous_offsets(checkpoints, tmp_path):
    """Gaps and trailing bytes are rejected as huggingface/safetensors does, naming the file."""
    src = os.path.join(checkpoints["dense"], "model.safetensors")
    hdr, start = header(src)
    raw = open(src, "rb").read()
    broken = tmp_path / "trailing"
    subprocess.run(["cp", "-r", checkpoints["dense"], str(broken)], check=True)
    st = broken / "model.safetensors"
    os.chmod(st, 0o644)
    st.write_bytes(raw + b"\0" * 8)
    with pytest.raises(Exception):  # the reference reader agrees
        with safe_open(str(st), framework="numpy") as f:
            f.keys()
    p = run("ppl", str(broken), "--text", TEXT, "--max-tokens", "100", ok=False)
    assert p.returncode != 0 and "model.safetensors" in p.stderr and "8 trailing bytes" in p.stderr
    p = run("inspect", str(broken), ok=False)
    assert p.returncode != 0 and "trailing bytes" in p.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))


@need_data
def test_gptq_dynamic_scales_write_an_ordinary_checkpoint(tmp_path):
    """--gptq-scales dynamic: the same checkpoint layout and global scales as static GPTQ, block
    scales chosen in the column loop (so some differ), named in --json and in the producer
    metadata, and the runtime loads it."""
    common = ["--method", "sweep-wmse", "--gptq", "--calib", TEXT, "--nsamples", "8",
              "--seqlen", "64", "--partial-blocks", "quantize", "--json"]
    st, dy = str(tmp_path / "static"), str(tmp_path / "dynamic")
    js = json.loads(run("quantize", MODEL, "-o", st, *common).stdout)
    jd = json.loads(run("quantize", MODEL, "-o", dy, *common, "--gptq-scales", "dynamic",
                        "--gptq-importance", "hdiag").stdout)
    assert js["gptq_scales"] == "static" and "gptq_importance" not in js
    assert jd["gptq_scales"] == "dynamic" and jd["gptq_importance"] == "hdiag"
    fs, fd = os.path.join(st, "model.safetensors"), os.path.join(dy, "model.safetensors")
    hs, _ = header(fs)
    hd, _ = header(fd)
    assert hs["__metadata__"]["producer"] == "scalesweep sweep-wmse gptq"
    assert hd["__metadata__"]["producer"] == "scalesweep sweep-wmse gptq dynamic hdiag"
    assert {k: (v["dtype"], v["shape"]) for k, v in hs.items() if k != "__metadata__"} == \
        {k: (v["dtype"], v["shape"]) for k, v in hd.items() if k != "__metadata__"}
    differ = 0
    for name in hs:
        if name.endswith("weight_global_scale"):
            assert tensor_bytes(fs, name) == tensor_bytes(fd, name), name
        elif name.endswith("weight_scale"):
            _, a = raw_tensor(fs, name)
            _, b = raw_tensor(fd, name)
            differ += int(np.sum(np.frombuffer(a, np.uint8) != np.frombuffer(b, np.uint8)))
    assert differ > 0, "dynamic scales equal static's everywhere"
    assert [l["name"] for l in js["linears"]] == [l["name"] for l in jd["linears"]]
    ppl = json.loads(run("ppl", dy, "--text", TEXT, "--max-tokens", "256", "--json").stdout)
    assert ppl["source"] == "checkpoint" and np.isfinite(ppl["nll_per_token"])
    # experiment takes the same options: its GPTQ row is this checkpoint's NLL.
    ex = json.loads(run("experiment", MODEL, "--calib", TEXT, "--nsamples", "8", "--seqlen",
                        "64", "--eval", TEXT, "--max-tokens", "256", "--methods", "sweep-wmse",
                        "--settings", "W", "--no-rtn", "--no-errors", "--gptq-scales",
                        "dynamic", "--gptq-importance", "hdiag", "--json").stdout)
    assert ex["gptq_scales"] == "dynamic" and ex["gptq_importance"] == "hdiag"
    assert [c["algo"] for c in ex["cells"]] == ["GPTQ"] and ex["cells"][0]["weight_seconds"] > 0
    assert ex["cells"][0]["nll_per_token"] == pytest.approx(ppl["nll_per_token"], abs=1e-9)
