"""NVFP4 GGUF files written by `scalesweep quantize -o X.gguf` and `scalesweep convert`,
judged by gguf-py (the `gguf` package, the reference reader of llama.cpp's format):

- gguf-py reads every file we write (metadata and tensors);
- gguf.quants.dequantize of each NVFP4 tensor times its `.scale` equals, bit for bit, the
  weights our runtime loads from the same file (exported by `convert --dequantize`, q/k rows
  back in Hugging Face order, which the test undoes with its own numpy permutation);
- compressed-tensors -> GGUF -> compressed-tensors is byte-identical (codes, block scales,
  global scales, config);
- `ppl` on the GGUF equals `ppl` on the compressed-tensors checkpoint of the same run within
  1e-4 nats/token: GGUF dequantizes fl(fl(q*s) * fl(1/gs)), compressed-tensors fl(q*s / gs),
  which differ by at most one rounding per weight;
- our tokenizer on the written GGUF gives the same ids as on the source;
- Q8_0 dense tensors equal gguf-py's Q8_0 quantizer byte for byte;
- bad requests and bad inputs fail with a message and leave nothing behind.
"""
import json
import os
import subprocess

import numpy as np
import pytest

from cli_common import BIN, DATA, MODEL, TOK, need_bin, need_files

gguf = pytest.importorskip("gguf", reason="`pip install gguf` (gguf-py) for the GGUF checks")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

pytestmark = [need_bin, need_files(MODEL, TOK)]

ROOT = os.path.join(os.path.dirname(__file__), "../..")
SMOL = os.path.join(ROOT, "models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf")
WIKI = os.path.join(DATA, "text/wikitext2_valid.txt")
LINEARS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
           "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
           "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def run(*args, ok=True):
    r = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True)
    if ok:
        assert r.returncode == 0, r.stderr + r.stdout
    return r


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The GGUF files under test: name -> (path, source for tokenize)."""
    d = tmp_path_factory.mktemp("gguf_writer")
    out = {}
    run("quantize", MODEL, "-o", d / "stories.gguf", "--method", "sweep-mse")
    out["stories"] = (d / "stories.gguf", TOK)
    run("convert", MODEL, "-o", d / "hf")  # a tiny HF dir with a SentencePiece tokenizer.json
    run("quantize", d / "hf", "-o", d / "hf.gguf", "--method", "4over6")
    out["hf"] = (d / "hf.gguf", d / "hf")
    if os.path.exists(SMOL):
        run("quantize", SMOL, "-o", d / "smol.gguf", "--method", "absmax")
        out["smol"] = (d / "smol.gguf", SMOL)
    return d, out


def reader_tensors(path):
    r = gguf.GGUFReader(str(path))
    return r, {t.name: t for t in r.tensors}


def to_hf_rows(w, heads):
    """llama.cpp's q/k row order back to Hugging Face's (GGUF row h*hd + 2i + a holds HF row
    h*hd + a*hd/2 + i), written independently of the C++ code."""
    rows, cols = w.shape
    hd = rows // heads
    return w.reshape(heads, hd // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


@pytest.mark.parametrize("name", ["stories", "hf", "smol"])
def test_gguf_py_dequantize_times_scale_is_our_weights(files, name, tmp_path):
    d, out = files
    if name not in out:
        pytest.skip(f"real-model fixture absent ({SMOL})")
    path = out[name][0]
    r, ts = reader_tensors(path)
    assert r.fields["general.architecture"].contents() == "llama"
    assert r.fields["general.file_type"].contents() == 39  # LLAMA_FTYPE_MOSTLY_NVFP4
    assert r.fields["general.alignment"].contents() == 32
    heads = r.fields["llama.attention.head_count"].contents()
    kv_heads = r.fields["llama.attention.head_count_kv"].contents()
    # Our runtime's weights: convert --dequantize loads the GGUF as `ppl` does.
    run("convert", path, "--dequantize", "-o", tmp_path / "deq")
    ours = safetensors_numpy.load_file(str(tmp_path / "deq/model.safetensors"))
    n_nvfp4 = 0
    for t in r.tensors:
        if not t.name.endswith(".weight") or not t.name.startswith("blk."):
            continue
        _, layer, lin, _ = t.name.split(".")
        if lin not in LINEARS:
            continue
        hf = f"model.layers.{layer}.{LINEARS[lin]}.weight"
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        if t.tensor_type == gguf.GGMLQuantizationType.NVFP4:
            n_nvfp4 += 1
            scale = ts[t.name[:-len(".weight")] + ".scale"]
            assert scale.tensor_type == gguf.GGMLQuantizationType.F32
            s = np.asarray(scale.data, dtype=np.float32).reshape(-1)
            assert s.shape == (1,)
            w = (w.astype(np.float32) * s[0]).astype(np.float32)
        else:
            assert f"{t.name[:-len('.weight')]}.scale" not in ts
        if lin in ("attn_q", "attn_k"):
            w = to_hf_rows(w, heads if lin == "attn_q" else kv_heads)
        np.testing.assert_array_equal(w.view(np.uint32), ours[hf].view(np.uint32), err_msg=hf)
    assert n_nvfp4 > 0
    emb = gguf.quants.dequantize(ts["token_embd.weight"].data, ts["token_embd.weight"].tensor_type)
    np.testing.assert_array_equal(emb.astype(np.float32), ours["model.embed_tokens.weight"])


@pytest.mark.parametrize("name", ["stories", "hf", "smol"])
def test_our_tokenizer_on_the_gguf_equals_the_source(files, name):
    d, out = files
    if name not in out:
        pytest.skip(f"real-model fixture absent ({SMOL})")
    path, src = out[name]
    texts = ["Once upon a time, there was a little girl named Lily.",
             "  two spaces, digits 12345 and ümlauts!\nnew line"]
    for text in texts:
        a = json.loads(run("tokenize", path, "--text", text, "--bos", "--json").stdout)
        b = json.loads(run("tokenize", src, "--text", text, "--bos", "--json").stdout)
        assert a["ids"] == b["ids"], text
        assert (a["bos"], a["eos"]) == (b["bos"], b["eos"])


def test_hf_byte_level_tokenizer_matches_llama_cpp_converter(files, tmp_path):
    """SmolLM2 through a HF directory: the tokenizer.* keys we write from tokenizer.json equal
    those of the original GGUF (llama.cpp's converter): tokens, merges, types, pre."""
    if not os.path.exists(SMOL):
        pytest.skip(f"real-model fixture absent ({SMOL})")
    run("convert", SMOL, "-o", tmp_path / "hf", "--dtype", "bf16")
    run("quantize", tmp_path / "hf", "-o", tmp_path / "s.gguf", "--method", "absmax")
    a = gguf.GGUFReader(str(tmp_path / "s.gguf")).fields
    b = gguf.GGUFReader(SMOL).fields
    for k in ["tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
              "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
              "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"]:
        assert a[k].contents() == b[k].contents(), k


def test_ct_to_gguf_to_ct_is_byte_identical(tmp_path):
    st = pytest.importorskip("safetensors")
    torch = pytest.importorskip("torch")
    run("quantize", MODEL, "-o", tmp_path / "ct", "--method", "sweep-wmse", "--gptq",
        "--calib", WIKI, "--nsamples", "4", "--seqlen", "64")
    run("convert", tmp_path / "ct", "-o", tmp_path / "x.gguf")
    r = json.loads(run("convert", tmp_path / "x.gguf", "-o", tmp_path / "ct2", "--json").stdout)
    assert r["global_scales_recorded"] is True
    a = st.safe_open(str(tmp_path / "ct/model.safetensors"), "pt")
    b = st.safe_open(str(tmp_path / "ct2/model.safetensors"), "pt")
    assert set(a.keys()) == set(b.keys())
    assert any(k.endswith("weight_global_scale") for k in a.keys())
    for k in a.keys():
        assert torch.equal(a.get_tensor(k).view(torch.uint8), b.get_tensor(k).view(torch.uint8)), k
    ca = json.load(open(tmp_path / "ct/config.json"))
    cb = json.load(open(tmp_path / "ct2/config.json"))
    assert ca == cb
    # The GGUF written by quantize directly is the one convert writes, but for the record of
    # the exact global scales (a metadata key llama.cpp ignores).
    run("quantize", MODEL, "-o", tmp_path / "q.gguf", "--method", "sweep-wmse", "--gptq",
        "--calib", WIKI, "--nsamples", "4", "--seqlen", "64")
    _, tq = reader_tensors(tmp_path / "q.gguf")
    rx, tx = reader_tensors(tmp_path / "x.gguf")
    assert "scalesweep.nvfp4.global_scales" in rx.fields
    assert tq.keys() == tx.keys()
    for k in tq:
        np.testing.assert_array_equal(np.asarray(tq[k].data), np.asarray(tx[k].data), err_msg=k)


def test_gguf_without_record_converts_with_reciprocal_scales(files, tmp_path):
    _, out = files
    r = run("convert", out["stories"][0], "-o", tmp_path / "ct")
    assert "global scales are fl(1 / scale)" in r.stderr + r.stdout


def test_ppl_gguf_equals_ct_checkpoint(tmp_path):
    run("quantize", MODEL, "-o", tmp_path / "ct", "--method", "sweep-mse")
    run("quantize", MODEL, "-o", tmp_path / "m.gguf", "--method", "sweep-mse")
    ppl = {}
    for k in ("ct", "m.gguf"):
        j = json.loads(run("ppl", tmp_path / k, "--text", WIKI, "--max-tokens", "3000",
                           "--json").stdout.splitlines()[0])
        ppl[k] = j["nll_per_token"]
    assert abs(ppl["ct"] - ppl["m.gguf"]) < 1e-4, ppl


def test_q8_0_dense_equals_gguf_py_quantizer(tmp_path):
    r = run("quantize", MODEL, "-o", tmp_path / "q.gguf", "--method", "absmax",
            "--dense-dtype", "q8_0")
    # down_proj (172 columns) cannot be NVFP4 nor Q8_0: stored f16, said so.
    assert "down_proj" in r.stderr and "f16" in r.stderr
    run("convert", MODEL, "-o", tmp_path / "hf")
    src = safetensors_numpy.load_file(str(tmp_path / "hf/model.safetensors"))
    _, ts = reader_tensors(tmp_path / "q.gguf")
    t = ts["token_embd.weight"]
    assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0
    ref = gguf.quants.quantize(src["model.embed_tokens.weight"], gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(np.asarray(t.data).reshape(-1), ref.reshape(-1))
    assert ts["blk.0.ffn_down.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert ts["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32


@pytest.mark.parametrize("args,msg", [
    (["--quant", "WA", "--calib", WIKI], "--quant: WA: llama.cpp applies NVFP4 input scales"),
    (["--max-shard-size", "1MB"], "a GGUF output is one file"),
    (["--partial-blocks", "quantize"], "whole 64-element super-blocks"),
    (["--tp", "2"], "--tp: applies to vLLM checkpoints"),
])
def test_quantize_refuses_options_gguf_cannot_hold(tmp_path, args, msg):
    r = run("quantize", MODEL, "-o", tmp_path / "x.gguf", *args, ok=False)
    assert r.returncode != 0
    assert msg in r.stderr
    assert not os.listdir(tmp_path)


def test_q8_0_only_for_gguf(tmp_path):
    r = run("quantize", MODEL, "-o", tmp_path / "ct", "--dense-dtype", "q8_0", ok=False)
    assert r.returncode != 0 and "q8_0 is for GGUF outputs only" in r.stderr


def test_convert_refuses_bad_inputs(files, tmp_path):
    d, _ = files
    r = run("convert", d / "hf", "-o", tmp_path / "x.gguf", ok=False)
    assert r.returncode != 0 and "converts a compressed-tensors NVFP4 checkpoint" in r.stderr
    # An NVFP4 GGUF whose block-scale byte 0x7F (ggml: 0, E4M3: NaN) has no CT equivalent.
    rd, ts = reader_tensors(files[1]["stories"][0])
    w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "llama")
    for f in rd.fields.values():
        if f.name.startswith("GGUF.") or f.name in ("general.architecture", "general.alignment"):
            continue
        v = f.contents()
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_array(f.name, v)
        else:
            w.add_key_value(f.name, v, vt)
    for t in rd.tensors:
        data = np.array(t.data, copy=True)
        if t.name == "blk.1.attn_v.weight":
            data.reshape(-1)[36 * 3 + 2] = 0x7F  # row 3 (64 columns: one super-block), sub-block 2
        w.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = run("convert", tmp_path / "bad.gguf", "-o", tmp_path / "ct", ok=False)
    assert r.returncode != 0
    assert "'blk.1.attn_v.weight' row 3 block 2: scale byte 0x7F" in r.stderr
    assert not os.path.exists(tmp_path / "ct")


def test_foreign_producer_checkpoint_converts_losslessly(tmp_path):
    """Another producer's layout: every NVFP4 Linear re-made by the compressed-tensors library
    itself (llm-compressor's math: generate_gparam global scale, calculate_qparams block
    scales, the library's packer) and its quantization_config as the library dumps it. It
    converts to GGUF and back with every tensor byte-identical, and `ppl` agrees."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("compressed_tensors", reason="compressed-tensors not installed")
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam
    from safetensors.torch import load_file, save_file
    import shutil

    run("quantize", MODEL, "-o", tmp_path / "ours", "--method", "sweep-mse")
    shutil.copytree(tmp_path / "ours", tmp_path / "foreign")
    cfg = json.load(open(tmp_path / "ours/config.json"))
    qcfg = QuantizationConfig.model_validate(cfg["quantization_config"])
    scheme = qcfg.config_groups["group_0"]
    comp = BaseCompressor.get_value_from_registry("nvfp4-pack-quantized")
    t = load_file(str(tmp_path / "ours/model.safetensors"))
    out = dict(t)
    n = 0
    for k in list(t):
        if not k.endswith(".weight_packed"):
            continue
        p = k[: -len(".weight_packed")]
        w = comp.decompress({s: t[f"{p}.{s}"] for s in
                             ("weight_packed", "weight_scale", "weight_global_scale")},
                            scheme)["weight"].float()
        w = w + 0.01 * torch.sin(torch.arange(w.numel(), dtype=torch.float32)).reshape(w.shape)
        gs = generate_gparam(w.min(), w.max())
        rows, cols = w.shape
        g = w.reshape(rows, cols // 16, 16)
        scale, zp = calculate_qparams(g.amin(-1), g.amax(-1), scheme.weights, global_scale=gs)
        c = comp.compress({"weight": w, "weight_scale": scale, "weight_global_scale": gs,
                           "weight_zero_point": zp}, scheme)
        for s in ("weight_packed", "weight_scale", "weight_global_scale"):
            out[f"{p}.{s}"] = c[s].contiguous()
        n += 1
    assert n == 30
    save_file(out, str(tmp_path / "foreign/model.safetensors"), metadata={"format": "pt"})
    dumped = qcfg.model_dump(exclude_none=True)
    dumped["quant_method"] = "compressed-tensors"
    cfg["quantization_config"] = json.loads(json.dumps(dumped, default=str))
    json.dump(cfg, open(tmp_path / "foreign/config.json", "w"), indent=2)

    run("convert", tmp_path / "foreign", "-o", tmp_path / "f.gguf")
    run("convert", tmp_path / "f.gguf", "-o", tmp_path / "back")
    a = load_file(str(tmp_path / "foreign/model.safetensors"))
    b = load_file(str(tmp_path / "back/model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)), k
    ppl = [json.loads(run("ppl", tmp_path / x, "--text", WIKI, "--max-tokens", "2000",
                          "--json").stdout.splitlines()[0])["nll_per_token"]
           for x in ("foreign", "f.gguf")]
    assert abs(ppl[0] - ppl[1]) < 1e-4, ppl
