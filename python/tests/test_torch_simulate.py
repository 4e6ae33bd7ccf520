"""scalesweep.torch.simulate: simulated W / WA / WAKV / WAKVQ on transformers models.

- tiny random Llama, Qwen2 and Qwen3 models (built offline): every setting changes the logits,
  remove() restores them bit for bit, bad inputs get messages naming the module or tensor;
- against the native runtime: the NLL of transformers + simulate equals `scalesweep ppl --quant S
  --method M --stats F` within 1e-4 nats/token for every setting x {absmax, sweep-mse,
  sweep-wmse} on stories260K (a real llama2.c model converted to a Hugging Face directory: GQA,
  head_dim 8 below the block, an FFN width of 172 with partial blocks, a tokenizer that adds BOS;
  measured: every difference below 3e-7), and for W on SmolLM2-135M (the Q4_1 GGUF dequantized
  to fp32). SmolLM2 under WA/WAKV/WAKVQ is chaotic: its NLL on 255 tokens moves by 0.02-0.08
  nats when the global scales change by 1e-7 relative, so two fp32 implementations whose
  activations differ in the last bit cannot agree to 1e-4 there (docs/PYTORCH.md); the test
  checks W there, and checks the chaos itself, so that the exemption stays justified.
"""
import json
import os
import subprocess

import numpy as np
import pytest

from cli_common import BIN, VAL, need_bin, need_files

torch = pytest.importorskip("torch", reason="torch not installed (scalesweep.torch)")
transformers = pytest.importorskip("transformers", reason="transformers not installed")
sst = pytest.importorskip("scalesweep.torch")
from scalesweep.torch._arch import INPUTS, Arch  # noqa: E402
from scalesweep.torch.stats import load_stats, save_stats  # noqa: E402

SETTINGS = ("W", "WA", "WAKV", "WAKVQ")
METHODS = ("absmax", "sweep-mse", "sweep-wmse")


def tiny(kind):
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    if kind == "llama":
        cfg = transformers.LlamaConfig(**common)
        cls = transformers.LlamaForCausalLM
    elif kind == "qwen2":
        cfg = transformers.Qwen2Config(**common)
        cls = transformers.Qwen2ForCausalLM
    else:
        cfg = transformers.Qwen3Config(head_dim=16, **common)
        cls = transformers.Qwen3ForCausalLM
    torch.manual_seed(0)
    return cls(cfg).eval()


def random_stats(model, path, seed=0, scale=1.0):
    a = Arch(model)
    d = a.dims()
    rng = np.random.default_rng(seed)
    layers = []
    for _ in range(a.n_layers):
        L = {}
        for nm in INPUTS:
            x = rng.standard_normal((40, d[nm])) * scale
            L[nm] = {"xtx": x.T @ x, "tokens": 40, "amax": float(np.abs(x).max())}
        for nm in "qkv":
            L[nm] = {"amax": 2.0 * scale, "sqnorm": rng.random(d[nm]) * 10}
        layers.append(L)
    save_stats(path, layers, 1, 40)
    return path


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_every_setting_changes_the_logits_and_remove_restores_them(kind, tmp_path):
    m = tiny(kind)
    stats = random_stats(m, str(tmp_path / "s.safetensors"))
    x = torch.randint(0, 128, (2, 10))
    with torch.no_grad():
        ref = m(x).logits
    weights = {n: p.detach().clone() for n, p in m.named_parameters()}
    impl = m.config._attn_implementation
    prev = None
    for s in SETTINGS:
        for meth in METHODS:
            with sst.simulate(m, s, meth, stats=stats) as h:
                with torch.no_grad():
                    out = m(x).logits
                assert "active" in repr(h)
            assert (out - ref).abs().max() > 1e-4, (kind, s, meth)
            if prev is not None and meth == "absmax":
                assert not torch.equal(out, prev), (kind, s)  # each setting adds something
            if meth == "absmax":
                prev = out
            with torch.no_grad():
                back = m(x).logits
            assert torch.equal(back, ref), (kind, s, meth)
    assert m.config._attn_implementation == impl
    for n, p in m.named_parameters():
        assert torch.equal(p, weights[n]), n


def test_weights_quantized_as_the_library_does(tmp_path):
    """W with absmax: each q/k/v weight is fake_quantize of its fp32 values with the global
    scale of the q/k/v group's amax (6C/amax, C = 448 for absmax)."""
    import scalesweep as ss
    m = tiny("llama")
    attn = m.model.layers[1].self_attn
    ws = [attn.q_proj.weight.detach().clone(), attn.k_proj.weight.detach().clone(),
          attn.v_proj.weight.detach().clone()]
    amax = max(float(w.abs().max()) for w in ws)
    gs = ss.global_scale_for_amax(amax, ss.default_max_block_scale("absmax"))
    h = sst.simulate(m, "W", "absmax")
    assert torch.equal(attn.k_proj.weight, ss.fake_quantize(ws[1], method="absmax",
                                                            global_scale=gs))
    h.remove()
    assert torch.equal(attn.k_proj.weight, ws[1])


def test_bad_inputs_get_clear_messages(tmp_path):
    m = tiny("llama")
    with pytest.raises(ValueError, match="needs calibration statistics"):
        sst.simulate(m, "WA", "absmax")
    with pytest.raises(ValueError, match="needs calibration statistics"):
        sst.simulate(m, "W", "sweep-wmse")
    with pytest.raises(ValueError, match="unknown quantization setting 'W4'"):
        sst.simulate(m, "W4", "absmax")
    with pytest.raises(ValueError, match="unknown method 'best'"):
        sst.simulate(m, "W", "best")
    with pytest.raises(ValueError, match="explicit offset window"):
        sst.simulate(m, "W", "sweep")
    # statistics of another model: a wider intermediate size
    other = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2))
    bad = random_stats(other, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match=r"layers\.0\.mlp_out\.xtx.*another model"):
        sst.simulate(m, "WA", "absmax", stats=bad)
    deeper = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(ValueError, match="3 layers.*has 2"):
        sst.simulate(m, "WA", "absmax", stats=random_stats(deeper, str(tmp_path / "d.st")))
    notstats = str(tmp_path / "x.safetensors")
    from safetensors.numpy import save_file
    save_file({"a": np.zeros(2, np.float32)}, notstats)
    with pytest.raises(ValueError, match="not a calibration statistics file"):
        load_stats(notstats)
    # an architecture it does not know
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=128, n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*'gpt2'.*supported: llama, qwen2"):
        sst.simulate(gpt2, "W", "absmax")
    # a failed call leaves the model untouched
    x = torch.randint(0, 128, (1, 8))
    with torch.no_grad():
        ref = m(x).logits
    with pytest.raises(ValueError):
        sst.simulate(m, "WA", "absmax", stats=bad)
    with torch.no_grad():
        assert torch.equal(m(x).logits, ref)


def test_cuda_tensor_on_a_build_without_cuda_is_refused():
    import scalesweep as ss
    if ss.CUDA or not torch.cuda.is_available():
        pytest.skip("needs a GPU visible to torch and a scalesweep built without CUDA")
    m = tiny("llama").cuda()
    with pytest.raises(RuntimeError, match="built without CUDA"):
        sst.simulate(m, "W", "absmax")


# ---- against the native runtime

GGUF = os.path.join(os.path.dirname(__file__), "../../models/smollm2-135m/"
                    "SmolLM2-135M-Instruct.Q4_1.gguf")
N = 256


def run_json(*args):
    p = subprocess.run([BIN, *map(str, args), "--json"], capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, f"{args}: rc={p.returncode}\n{p.stdout}\n{p.stderr}"
    return json.loads(p.stdout)


def native_nll(model_dir, text, setting, method, stats):
    j = run_json("ppl", model_dir, "--text", text, "--max-tokens", N, "--ctx", N, "--quant",
                 setting, "--method", method, "--stats", stats)
    return j["nll_per_token"], j


def simulated_nll(model, ids, setting, method, stats):
    x = torch.tensor([ids])
    with sst.simulate(model, setting, method, stats=stats):
        with torch.no_grad():
            logits = model(x).logits[0].double()
    return torch.nn.functional.cross_entropy(logits[:-1], x[0, 1:]).item()


@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    from cli_common import MODEL, TOK
    if not BIN:
        pytest.skip("SCALESWEEP_BIN not set")
    if not all(os.path.exists(p) for p in (MODEL, TOK, VAL)):
        pytest.skip(f"fixture missing: {MODEL}, {TOK} or {VAL}")
    tmp = tmp_path_factory.mktemp("stories_sim")
    hf = str(tmp / "hf")
    run_json("convert", MODEL, "--tokenizer", TOK, "-o", hf)
    with open(VAL, encoding="utf-8") as fh:
        body = fh.read(6000)
    calib, text = str(tmp / "calib.txt"), str(tmp / "text.txt")
    open(calib, "w", encoding="utf-8").write(body[:3000])
    open(text, "w", encoding="utf-8").write(body[3000:])
    stats = str(tmp / "stats.safetensors")
    run_json("calibrate", hf, "--calib", calib, "--nsamples", 8, "--seqlen", 128, "-o", stats)
    ids = run_json("tokenize", hf, "--file", text)["ids"]
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    return model, hf, text, stats, ids


@pytest.mark.parametrize("setting", SETTINGS)
def test_stories260k_nll_equals_the_native_runtime(stories, setting):
    model, hf, text, stats, ids = stories
    for meth in METHODS:
        ours, j = native_nll(hf, text, setting, meth, stats)
        seq = ([model.config.bos_token_id] if j["bos"] else []) + ids
        seq = seq[:N]
        assert j["tokens"] == len(seq) - 1
        ref = simulated_nll(model, seq, setting, meth, stats)
        print(f"stories260K {setting} {meth}: ppl {ours:.8f}, transformers+simulate {ref:.8f}")
        assert abs(ours - ref) < 1e-4, (setting, meth, ours, ref)
    with torch.no_grad():
        x = torch.tensor([seq])
        fp = torch.nn.functional.cross_entropy(model(x).logits[0].double()[:-1], x[0, 1:]).item()
    assert abs(fp - ref) > 1e-3  # the simulation changed the NLL: the comparison can fail


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    pytest.importorskip("gguf", reason="gguf not installed (transformers reads the GGUF with it)")
    if not BIN:
        pytest.skip("SCALESWEEP_BIN not set")
    if not (os.path.exists(GGUF) and os.path.exists(VAL)):
        pytest.skip(f"fixture missing: {GGUF} or {VAL} (scripts/get-smollm2.sh)")
    tmp = tmp_path_factory.mktemp("smollm2_sim")
    d, f = os.path.split(os.path.abspath(GGUF))
    tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=f)
    m = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    cfg = m.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    plain = transformers.LlamaForCausalLM(cfg).to(torch.float32).eval()
    plain.load_state_dict(m.state_dict())
    out = str(tmp / "hf")
    plain.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    text = str(tmp / "text.txt")
    with open(VAL, encoding="utf-8") as fh:
        body = fh.read(6000)
    open(text, "w", encoding="utf-8").write(body[3000:])
    calib = str(tmp / "calib.txt")
    open(calib, "w", encoding="utf-8").write(body[:3000])
    stats = str(tmp / "stats.safetensors")
    run_json("calibrate", out, "--calib", calib, "--nsamples", 4, "--seqlen", 128, "-o", stats)
    ids = tok(open(text, encoding="utf-8").read())["input_ids"][:N]
    return plain, out, text, stats, ids


def test_smollm2_weights_equal_the_native_runtime(smollm2):
    plain, out, text, stats, ids = smollm2
    for meth in METHODS:
        ours, j = native_nll(out, text, "W", meth, stats)
        assert j["bos"] is False and j["tokens"] == N - 1
        ref = simulated_nll(plain, ids, "W", meth, stats)
        print(f"SmolLM2 W {meth}: ppl {ours:.8f}, transformers+simulate {ref:.8f}")
        assert abs(ours - ref) < 1e-4, (meth, ours, ref)


def test_smollm2_activation_settings_are_chaotic(smollm2):
    """Why WA/WAKV/WAKVQ are not compared to 1e-4 on SmolLM2: global scales 1e-7 relative
    apart move its WA NLL by far more than that (measured 0.016-0.03 nats), so last-bit
    differences of the activations between two fp32 implementations do too."""
    plain, out, text, stats, ids = smollm2
    st = load_stats(stats)
    base = simulated_nll(plain, ids, "WA", "absmax", st)
    for L in st.layers:
        for nm in INPUTS:
            L[nm]["amax"] = float(np.float32(L[nm]["amax"]) * np.float32(1 + 2 ** -22))
    moved = simulated_nll(plain, ids, "WA", "absmax", st)
    ours, _ = native_nll(out, text, "WA", "absmax", stats)
    print(f"SmolLM2 WA absmax: transformers+simulate {base:.6f}, with amax +2^-22 {moved:.6f}, "
          f"ppl {ours:.6f}")
    assert abs(moved - base) > 1e-3
    assert abs(ours - base) < 0.2  # the same model and setting, within the chaos


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
def test_cuda_model_uses_the_cuda_kernels_with_the_cpu_bytes(tmp_path):
    """On a GPU the same simulation runs through the CUDA kernels (exact numerics: the CPU's
    bytes): W gives bit-identical weights, and every setting's logits agree with the CPU run
    up to the GPU's own matmul rounding."""
    import scalesweep as ss
    if not ss.CUDA:
        pytest.skip("scalesweep built without CUDA")
    cpu = tiny("qwen3")
    gpu = tiny("qwen3").cuda()
    stats = random_stats(cpu, str(tmp_path / "s.safetensors"))
    x = torch.randint(0, 128, (2, 12))
    for meth in METHODS:
        with sst.simulate(cpu, "W", meth, stats=stats), sst.simulate(gpu, "W", meth, stats=stats):
            for (n, pc), (_, pg) in zip(cpu.named_parameters(), gpu.named_parameters()):
                assert torch.equal(pc, pg.cpu()), (meth, n)
        for s in SETTINGS[1:]:
            with sst.simulate(cpu, s, meth, stats=stats), sst.simulate(gpu, s, meth, stats=stats):
                with torch.no_grad():
                    a, b = cpu(x).logits, gpu(x.cuda()).logits.cpu()
            assert torch.allclose(a, b, atol=2e-2, rtol=0), (s, meth, float((a - b).abs().max()))


def test_readme_example_runs():
    from cli_common import run_readme_section
    run_readme_section("python-sim")


def test_statistics_file_hostile_inputs_are_refused_by_name(tmp_path):
    """load_stats on truncated, corrupt and mislabelled files: a ValueError naming the file
    (and the tensor where there is one), never a numpy error or a silent misread."""
    import json
    import struct
    m = tiny("llama")
    good = random_stats(m, str(tmp_path / "good.safetensors"))
    raw = open(good, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    cases = {
        "empty": b"",
        "short": raw[:5],
        "huge_header": struct.pack("<Q", 1 << 40) + raw[8:],
        "not_json": struct.pack("<Q", 4) + b"{{{{" + raw[8 + n:],
        "truncated": raw[:len(raw) - 100],
    }
    bad = dict(hdr)
    name = "layers.1.mlp_out.xtx"
    bad[name] = dict(hdr[name], data_offsets=[hdr[name]["data_offsets"][0],
                                              hdr[name]["data_offsets"][1] - 8])
    for label, body in [("offsets", bad), ("dtype", {**hdr, name: dict(hdr[name], dtype="F32")}),
                        ("shape", {**hdr, name: dict(hdr[name], shape=["x", 2])})]:
        h = json.dumps(body).encode()
        cases[label] = struct.pack("<Q", len(h)) + h + raw[8 + n:]
    for label, body in cases.items():
        p = tmp_path / f"{label}.safetensors"
        p.write_bytes(body)
        with pytest.raises(ValueError) as e:
            load_stats(p)
        msg = str(e.value)
        assert str(p) in msg, (label, msg)
        if label in ("offsets", "dtype", "shape", "truncated"):
            assert "tensor '" in msg, (label, msg)
