"""The GGUF writer's architectures (qwen2, qwen3, Llama-3 RoPE scaling, linear, YaRN) judged by
transformers and by llama.cpp (llama-cpp-python 0.3.36), as test_llama_cpp.py judges SmolLM2.

Tiny random models are built by transformers offline (2 layers, hidden 64, 4 query / 2 KV
heads, the stories260K tokenizer of 512 tokens; biases and norms randomized so that they
matter) and saved as Hugging Face directories. For each:
(a) our runtime's NLL on the directory equals transformers' on the same ids (TF_TOL);
(b) `quantize --keep-dense all --dense-dtype f32 -o X.gguf` (every tensor F32): our NLL on the
    GGUF equals ours on the directory, llama.cpp's on the GGUF equals ours within
    F32_NLL_TOL with an F32 KV cache, and greedy text is the same;
(c) the NVFP4 GGUF (`--method sweep-mse`): llama.cpp's NLL within QUANT_NLL_TOL of ours, greedy
    text as test_llama_cpp.check_greedy allows (near ties only);
(d) `convert` back: the F32 GGUF to a Hugging Face directory transformers scores as our runtime
    scores the source, the NVFP4 GGUF to a compressed-tensors checkpoint our runtime scores as
    the GGUF (every architecture, no llama.cpp needed).
Models llama.cpp cannot run (dynamic NTK, llama3 RoPE on qwen3) are refused by name before
anything is written. llama.cpp's qwen2 graph ignores the per-tensor `.scale` of the FFN Linears
(measured: doubling blk.N.ffn_up.scale leaves its logits unchanged, while it changes them for
llama and qwen3, and an all-NVFP4 qwen2 FFN gives NaN logits). So a Qwen2 model is stored by
default as llama.cpp's `llama` (whose graph adds q/k/v biases and applies every `.scale`), q/k
rows and their biases permuted as for Llama, every Linear NVFP4, `scalesweep.architecture` =
qwen2 so that our reader reads it back as Qwen2; `--gguf-arch qwen2` keeps llama.cpp's qwen2
layout with gate/up/down dense (io::gguf_nvfp4_obstacle; the writer refuses them as NVFP4).
Both layouts are judged by llama.cpp: the F32 GGUFs within F32_NLL_TOL show that the llama
layout is the same model.

SS_LARGE=1 adds the 1.5B Qwen2 fixture (scripts/get-qwen2-1.5b.sh): its NVFP4 GGUF, llama.cpp's
NLL and ours on the same WikiText windows (|diff| < LARGE_NLL_TOL) and greedy text; it prints
the figures. Skips visibly without torch/transformers, llama_cpp, the shared data or the
fixture.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_common import BIN, DATA, MODEL, VAL, need_bin, need_files

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import llama_cpp_judge as lj  # noqa: E402

torch = pytest.importorskip("torch", reason="torch not installed (tiny reference models)")
transformers = pytest.importorskip("transformers",
                                   reason="transformers not installed (tiny reference models)")

pytestmark = [need_bin, need_files(MODEL, VAL)]
need_llama_cpp = pytest.mark.skipif(lj.import_llama_cpp() is None,
                                    reason="llama_cpp not installed (scripts/get-llama-cpp.sh)")

N = 320           # tokens transformers and our runtime score (past the original context of 64)
TF_TOL = 5e-5     # as test_rope_transformers
F32_NLL_TOL = 1e-5  # as test_llama_cpp: all-F32 GGUF, F32 KV cache
QUANT_NLL_TOL = 2e-2  # as test_llama_cpp: llama.cpp's Q8_0 activations against NVFP4
# Measured (Nov 2026, llama-cpp-python 0.3.36), ours - llama.cpp on 508 tokens: F32 GGUFs
# qwen2 4.5e-7, qwen3 1.0e-7, llama3_rope -3.3e-7, qwen2_yarn -1.1e-6, llama_linear -7.7e-8;
# NVFP4 qwen2 (FFN Q8_0) 1.0e-2, qwen3 1.8e-3, llama3_rope 1.7e-2, qwen2_yarn -7.8e-3,
# llama_linear 1.0e-2 (random weights with logits near 15 amplify llama.cpp's activation
# rounding). Against transformers: |diff| <= 7.3e-7.
CTX, MAX_TOKENS = 128, 512

COMMON = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=512, rms_norm_eps=1e-5, initializer_range=0.4,
              bos_token_id=1, eos_token_id=2)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
MODELS = {
    # name: (transformers family, config overrides)
    "qwen2": ("Qwen2", dict(tie_word_embeddings=False,
                            rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "qwen3": ("Qwen3", dict(head_dim=32, tie_word_embeddings=True,
                            rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "llama3_rope": ("Llama", dict(tie_word_embeddings=False, rope_parameters=LLAMA3)),
    "qwen2_yarn": ("Qwen2", dict(tie_word_embeddings=True, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
        "original_max_position_embeddings": 64})),
    "llama_linear": ("Llama", dict(tie_word_embeddings=True, rope_parameters={
        "rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})),
}
ALL_DENSE = ["--keep-dense", "q,k,v,o,gate,up,down", "--dense-dtype", "f32"]


def run(*args, ok=True):
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=1800)
    if ok:
        assert p.returncode == 0, f"{args}: rc={p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def run_json(*args):
    return json.loads(run(*args, "--json").stdout)


def build(d, base, name, family, overrides, seed=0):
    cfg = getattr(transformers, family + "Config")(**{**COMMON, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, family + "ForCausalLM")(cfg).to(torch.float32).eval()
    with torch.no_grad():  # biases and norms start at 0 and 1: make them matter
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.copy_(0.4 * torch.randn_like(p))
            elif "norm" in n:
                p.copy_(1 + 0.2 * torch.randn_like(p))
    out = d / name
    model.save_pretrained(out, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (out / f).write_bytes((base / f).read_bytes())
    return model, out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf_archs")
    base = d / "base"
    run("convert", MODEL, "-o", base)  # stories260K as an HF directory: its tokenizer files
    text = d / "text.txt"
    text.write_text(Path(VAL).read_text(encoding="utf-8")[:12000], encoding="utf-8")
    return d, base, text


@pytest.fixture(scope="module")
def models(setup):
    d, base, _ = setup
    return {name: build(d, base, name, fam, ov) for name, (fam, ov) in MODELS.items()}


def hf_nll(model, ids):
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(x).logits[0].double()
    return torch.nn.functional.cross_entropy(logits[:-1], x[0, 1:]).item()


def our_nll(path, text, n=N):
    j = run_json("ppl", path, "--text", text, "--max-tokens", n, "--ctx", n, "--bos")
    assert j["tokens"] == n - 1
    return j["nll_per_token"]


@pytest.mark.parametrize("name", MODELS)
def test_runtime_matches_transformers(setup, models, name):
    _, _, text = setup
    model, path = models[name]
    ids = run_json("tokenize", path, "--file", text, "--bos")["ids"][:N]
    ours, ref = our_nll(path, text), hf_nll(model, ids)
    print(f"\n{name}: NLL/token over {N - 1} tokens: scalesweep {ours:.6f}, "
          f"transformers {ref:.6f}, diff {ours - ref:+.2e}")
    assert abs(ours - ref) < TF_TOL


def gguf_metadata(path):
    gguf = pytest.importorskip("gguf", reason="gguf-py not installed")
    r = gguf.GGUFReader(str(path))
    return r, {t.name: t for t in r.tensors}


def check_layout(path, name, qwen2_as="llama"):
    """The keys and tensors llama.cpp's converter writes for the architecture; a Qwen2 model
    stored as llama (`--gguf-arch llama`, the default) under llama with its biases and the
    source architecture recorded."""
    r, tensors = gguf_metadata(path)
    qwen2 = name.startswith("qwen2")
    arch = {"qwen2": qwen2_as, "qwen3": "qwen3", "llama3_rope": "llama", "qwen2_yarn": qwen2_as,
            "llama_linear": "llama"}[name]
    field = r.fields["general.architecture"]
    assert bytes(field.parts[field.data[0]]).decode() == arch
    src = r.fields.get("scalesweep.architecture")
    assert (src is not None) == (qwen2 and arch == "llama")
    if src is not None:
        assert bytes(src.parts[src.data[0]]).decode() == "qwen2"
    assert ("blk.0.attn_q.bias" in tensors) == qwen2
    assert ("blk.1.attn_k_norm.weight" in tensors) == (arch == "qwen3")
    assert ("rope_freqs.weight" in tensors) == (name == "llama3_rope")
    assert ("output.weight" in tensors) == (name in ("qwen2", "llama3_rope"))
    if name == "qwen3":
        assert f"{arch}.attention.key_length" in r.fields
    if name in ("qwen2_yarn", "llama_linear"):
        assert f"{arch}.rope.scaling.type" in r.fields


def gguf_of(setup, models, name, tag, *options):
    """Model `name` quantized with `options` into the GGUF {name}-{tag}.gguf, its layout checked:
    (that file, the model's own file, the evaluation text)."""
    d, _, text = setup
    _, path = models[name]
    out = d / f"{name}-{tag}.gguf"
    run("quantize", path, "-o", out, *options, "--force")
    check_layout(out, name)
    return out, path, text


@need_llama_cpp
@pytest.mark.parametrize("name", MODELS)
def test_f32_gguf_equals_llama_cpp(setup, models, name):
    from test_llama_cpp import check_greedy, judged_nll
    out, path, text = gguf_of(setup, models, name, "f32", *ALL_DENSE)
    assert our_nll(out, text) == pytest.approx(our_nll(path, text), abs=1e-6)
    ours, theirs = judged_nll(out, text, f32_kv=True, ctx=CTX, max_tokens=MAX_TOKENS)
    assert abs(ours - theirs) <= F32_NLL_TOL
    check_greedy(out, exact=True, f32_kv=True, prompts=["Once upon a time", "Lily and Tom"])


@need_llama_cpp
@pytest.mark.parametrize("name", MODELS)
def test_nvfp4_gguf_equals_llama_cpp(setup, models, name):
    from test_llama_cpp import check_greedy, judged_nll
    out, _, text = gguf_of(setup, models, name, "nvfp4", "--method", "sweep-mse")
    _, tensors = gguf_metadata(out)
    assert tensors["blk.0.ffn_gate.weight"].tensor_type.name == "NVFP4"  # qwen2 too (as llama)
    ours, theirs = judged_nll(out, text, ctx=CTX, max_tokens=MAX_TOKENS)
    assert abs(ours - theirs) <= QUANT_NLL_TOL
    check_greedy(out, exact=False, prompts=["Once upon a time", "Lily and Tom"])


@need_llama_cpp
def test_qwen2_stored_as_qwen2_keeps_the_ffn_dense(setup, models):
    """`--gguf-arch qwen2`: llama.cpp's own qwen2 layout, FFN in Q8_0 (its graph ignores the
    FFN's .scale), judged by llama.cpp as the llama layout is; refused for another output."""
    from test_llama_cpp import judged_nll
    d, _, text = setup
    _, path = models["qwen2"]
    out = d / "qwen2-native.gguf"
    run("quantize", path, "-o", out, "--method", "sweep-mse", "--gguf-arch", "qwen2",
        "--dense-dtype", "q8_0", "--force")
    check_layout(out, "qwen2", qwen2_as="qwen2")
    _, tensors = gguf_metadata(out)
    assert tensors["blk.0.ffn_gate.weight"].tensor_type.name == "Q8_0"
    assert tensors["blk.0.attn_q.weight"].tensor_type.name == "NVFP4"
    ours, theirs = judged_nll(out, text, ctx=CTX, max_tokens=MAX_TOKENS)
    assert abs(ours - theirs) <= QUANT_NLL_TOL
    p = subprocess.run([BIN, "quantize", path, "-o", str(d / "ct-native"), "--gguf-arch", "qwen2"],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "--gguf-arch: is for GGUF outputs only" in p.stderr, p.stderr


@pytest.mark.parametrize("family,overrides,want", [
    ("Llama", dict(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0,
                                    "factor": 2.0}), "rope scaling 'dynamic'"),
    ("Qwen3", dict(rope_parameters=LLAMA3), "rope scaling 'llama3' with the qwen3 architecture"),
])
def test_refused_by_name_before_writing(setup, family, overrides, want):
    d, base, _ = setup
    _, path = build(d, base, f"refused-{family}", family, overrides)
    out = d / f"refused-{family}.gguf"
    p = run("quantize", path, "-o", out, ok=False)
    assert p.returncode != 0 and want in p.stderr, p.stderr
    assert "cannot be written as a GGUF for llama.cpp" in p.stderr
    assert not out.exists() and not list(d.glob(f"refused-{family}.gguf*"))


# ---- the 1.5B Qwen2 fixture (opt-in) -------------------------------------------------------------

LARGE = ROOT / "models/qwen2.5-coder-1.5b/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
WIKI = Path(DATA) / "text/wikitext2_valid.txt"
# Measured (every Linear NVFP4, the model written as llama.cpp's llama): 1020 tokens, ctx 256:
# ours 2.592539, llama.cpp 2.593092 (|diff| 5.5e-4); 1,239,450,720 bytes; quantize 30 s;
# 4.3 min in all (2 cores shared with an llm-compressor run).
LARGE_NLL_TOL = 2e-2
LARGE_CTX, LARGE_TOKENS = 256, 1024


@need_llama_cpp
@pytest.mark.skipif(os.environ.get("SS_LARGE") != "1",
                    reason="the 1.5B Qwen2 GGUF test is opt-in (SS_LARGE=1; ~10 GB RAM, minutes)")
@pytest.mark.skipif(not LARGE.exists(), reason=f"fixture absent ({LARGE}; "
                                               "scripts/get-qwen2-1.5b.sh)")
@need_files(str(WIKI))
def test_qwen2_1_5b_nvfp4_gguf_equals_llama_cpp(tmp_path):
    from test_llama_cpp import check_greedy, judged_nll, wiki_text
    out = tmp_path / "qwen2-1.5b-nvfp4.gguf"
    t0 = time.time()
    # q8_0: the embeddings and the head (f32 would add 1.9 GB); every Linear NVFP4 (as llama)
    run("quantize", LARGE, "-o", out, "--method", "sweep-mse", "--dense-dtype", "q8_0")
    t_quant = time.time() - t0
    check_layout_large(out)
    text = tmp_path / "wiki.txt"
    text.write_text(wiki_text(), encoding="utf-8")
    t0 = time.time()
    ours, theirs = judged_nll(out, text, ctx=LARGE_CTX, max_tokens=LARGE_TOKENS)
    t_nll = time.time() - t0
    print(f"\n1.5B NVFP4 GGUF: {out.stat().st_size} bytes (source {LARGE.stat().st_size}); "
          f"quantize {t_quant:.0f} s; NLL ours {ours:.6f}, llama.cpp {theirs:.6f}, "
          f"|diff| {abs(ours - theirs):.2e} ({t_nll:.0f} s for both)")
    assert abs(ours - theirs) < LARGE_NLL_TOL
    check_greedy(out, exact=False, prompts=["def fibonacci(n):", "The capital of France is"])


def check_layout_large(path):
    r, tensors = gguf_metadata(path)
    assert "blk.27.attn_q.bias" in tensors and "output.weight" in tensors
    assert "rope_freqs.weight" not in tensors
    assert sum(t.tensor_type.name == "NVFP4" for t in tensors.values()) == 28 * 7
    assert tensors["blk.0.ffn_down.weight"].tensor_type.name == "NVFP4"
    assert tensors["token_embd.weight"].tensor_type.name == "Q8_0"


@pytest.mark.parametrize("name", MODELS)
def test_gguf_converts_back_for_every_architecture(setup, models, name):
    """`convert` of our GGUFs of every architecture: the F32 GGUF to a Hugging Face directory
    that transformers scores as our runtime scores the source (the config, RoPE scaling, q/k
    rows and biases/norms came back), and the NVFP4 GGUF to a compressed-tensors checkpoint
    that our runtime scores as the GGUF (the codes and scales carried as they are)."""
    d, _, text = setup
    model, path = models[name]
    f32 = d / f"{name}-rt-f32.gguf"
    run("quantize", path, "-o", f32, *ALL_DENSE, "--force")
    hf = d / f"{name}-from-gguf"
    run("convert", f32, "-o", hf, "--force")
    ids = run_json("tokenize", path, "--file", text, "--bos")["ids"][:N]
    back = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    src, theirs = our_nll(path, text), hf_nll(back, ids)
    print(f"\n{name}: NLL/token, source dir (ours) {src:.6f}, GGUF -> HF (transformers) "
          f"{theirs:.6f}")
    assert abs(theirs - src) < TF_TOL
    nv = d / f"{name}-rt-nvfp4.gguf"
    dense = ["--dense-dtype", "f32"] if name.startswith("qwen2") else []  # qwen2's FFN: dense
    run("quantize", path, "-o", nv, "--method", "sweep-mse", *dense, "--force")
    ct = d / f"{name}-ct-from-gguf"
    run("convert", nv, "-o", ct, "--force")
    assert json.loads((ct / "config.json").read_text())["quantization_config"]["format"]
    g, c = our_nll(nv, text), our_nll(ct, text)
    print(f"{name}: NLL/token, NVFP4 GGUF {g:.6f}, converted to compressed-tensors {c:.6f}")
    assert abs(g - c) < 1e-5
    assert abs(g - src) > 1e-4  # quantized: the comparison is not of two dense models
