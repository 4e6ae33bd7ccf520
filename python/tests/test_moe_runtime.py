"""Mixture-of-experts runtime (Qwen3-MoE, Mixtral) judged by transformers.

Tiny random Qwen3MoeForCausalLM and MixtralForCausalLM models are built by transformers offline
(2-4 layers, hidden 64, 4-8 experts of width 32, top-2; the stories260K tokenizer of 512 tokens)
and saved with save_pretrained (per-expert tensors, as published checkpoints name them). Checks:
(a) `scalesweep ppl` on the directory gives transformers' NLL per token within TOL (eager
    attention and experts), for norm_topk_prob on and off, dense layers between MoE layers
    (decoder_sparse_step, mlp_only_layers), bf16 weights, and transformers 5's fused expert
    layout (experts.gate_up_proj / down_proj); the check can fail: norm_topk_prob flipped
    moves the NLL far beyond TOL;
(b) greedy `generate` gives transformers' greedy token ids;
(c) a GGUF written from the same weights in llama.cpp's MoE layout (gguf-py's GGUFWriter:
    blk.N.ffn_{gate,up,down}_exps 3-D, blk.N.ffn_gate_inp; qwen3moe, and Mixtral as llama with
    expert_count) scores as the directory (F32 and F16), and llama.cpp (llama-cpp-python
    0.3.36, F32 KV cache) gives it our NLL within TOL (measured: |diff| <= 3.1e-7);
(d) bad inputs are refused with messages naming the file, the tensor or field and the index;
(e) the paths that do not handle MoE models yet (quantize from a file, experiment, convert,
    ppl --quant) refuse them by name before reading any weight.
Measured (transformers 5.23, torch 2.15): ours - transformers per token -3.3e-7 .. +1.3e-7 (f32,
bf16 weights); greedy ids equal. Skips visibly without torch/transformers, gguf-py, llama_cpp
(its test only) or the shared data.
"""
import copy
import importlib.util
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from cli_common import BIN, MODEL, VAL, need_bin, need_files

torch = pytest.importorskip("torch", reason="torch not installed (tiny reference models)")
transformers = pytest.importorskip("transformers",
                                   reason="transformers not installed (tiny reference models)")
safetensors_torch = pytest.importorskip("safetensors.torch",
                                        reason="safetensors not installed")

pytestmark = [need_bin, need_files(MODEL, VAL)]
N = 200        # tokens scored
TOL = 1e-5     # nats per token
STEPS = 24     # greedy tokens generated
REFUSED = "mixture-of-experts models are not yet supported by"

COMMON = dict(vocab_size=512, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, max_position_embeddings=512, tie_word_embeddings=False,
              initializer_range=0.3, num_experts_per_tok=2)
MODELS = {
    "qwen3_moe": ("Qwen3MoeConfig", dict(num_hidden_layers=2, intermediate_size=48,
                                         moe_intermediate_size=32, num_experts=8,
                                         norm_topk_prob=True, rms_norm_eps=1e-6)),
    "qwen3_moe_unnormed": ("Qwen3MoeConfig", dict(num_hidden_layers=2, intermediate_size=48,
                                                  moe_intermediate_size=32, num_experts=8,
                                                  norm_topk_prob=False)),
    "qwen3_moe_sparse": ("Qwen3MoeConfig", dict(num_hidden_layers=4, intermediate_size=48,
                                                moe_intermediate_size=32, num_experts=4,
                                                norm_topk_prob=True, decoder_sparse_step=2,
                                                mlp_only_layers=[3])),
    "mixtral": ("MixtralConfig", dict(num_hidden_layers=2, intermediate_size=32,
                                      num_local_experts=4, rms_norm_eps=1e-5)),
}


def run(*args, ok=True):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=600)
    if ok:
        assert p.returncode == 0, f"{args}: rc={p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def build(d, base, name, seed=0, dtype=torch.float32, **extra):
    cls, kw = MODELS[name]
    cfg = getattr(transformers, cls)(**{**COMMON, **kw, **extra})  # extra overrides
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, attn_implementation="eager", experts_implementation="eager").eval()
    out = str(d / f"{name}_{seed}_{str(dtype)[6:]}")
    # The reference computes in fp32 on the saved (rounded) parameters; buffers such as RoPE's
    # inv_freq stay fp32 (model.to(bf16) would round them too).
    with torch.no_grad():
        for prm in model.parameters():
            prm.copy_(prm.to(dtype).to(torch.float32))
    copy.deepcopy(model).to(dtype).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(base, f), out)
    return model, out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("moe")
    base = str(d / "base")
    run("convert", MODEL, "-o", base)  # its tokenizer.json / tokenizer_config.json
    text = str(d / "text.txt")
    with open(VAL, encoding="utf-8") as f:
        open(text, "w", encoding="utf-8").write(f.read(4000))
    p = run("tokenize", base, "--file", text, "--bos", "--json")
    ids = json.loads(p.stdout)["ids"][:N]
    assert len(ids) == N
    return d, base, text, ids


def hf_nll(model, ids):
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(x).logits[0].double()
    return torch.nn.functional.cross_entropy(logits[:-1], x[0, 1:]).item()


def our_nll(path, text, *extra):
    p = run("ppl", path, "--text", text, "--max-tokens", str(N), "--ctx", str(N), "--bos",
            "--json", *extra)
    j = json.loads(p.stdout)
    assert j["tokens"] == N - 1
    return j["nll_per_token"]


@pytest.mark.parametrize("name", list(MODELS))
def test_nll_matches_transformers(setup, name):
    d, base, text, ids = setup
    model, path = build(d, base, name)
    ours, ref = our_nll(path, text), hf_nll(model, ids)
    print(f"{name}: ours {ours:.8f} transformers {ref:.8f} diff {ours - ref:+.2e}")
    assert abs(ours - ref) < TOL, (name, ours, ref)
    if name.startswith("qwen3_moe"):  # the check can fail: the other renormalisation
        cfg = json.load(open(os.path.join(path, "config.json")))
        cfg["norm_topk_prob"] = not cfg["norm_topk_prob"]
        json.dump(cfg, open(os.path.join(path, "config.json"), "w"))
        flipped = our_nll(path, text)
        assert abs(flipped - ref) > 100 * TOL, (name, flipped, ref)


def test_bf16_experts_match_transformers(setup):
    d, base, text, ids = setup
    for name in ("qwen3_moe", "mixtral"):
        model, path = build(d, base, name, seed=1, dtype=torch.bfloat16)
        ours, ref = our_nll(path, text), hf_nll(model, ids)
        print(f"{name} bf16: ours {ours:.8f} transformers {ref:.8f} diff {ours - ref:+.2e}")
        assert abs(ours - ref) < TOL, (name, ours, ref)


def fuse(path, mixtral):
    """Rewrites a per-expert checkpoint in transformers 5's fused layout (one file)."""
    f = os.path.join(path, "model.safetensors")
    t = safetensors_torch.load_file(f)
    out = {}
    layers = sorted({int(k.split(".")[2]) for k in t if k.startswith("model.layers.")})
    blk, names = ("block_sparse_moe", ("w1", "w3", "w2")) if mixtral else \
        ("mlp", ("gate_proj", "up_proj", "down_proj"))
    for k, v in t.items():
        if ".experts." not in k and f".{blk}.gate." not in k:
            out[k] = v
    for l in layers:
        p = f"model.layers.{l}.{blk}."
        if p + "gate.weight" not in t:
            continue
        n = len({k.split(".")[5] for k in t if k.startswith(p + "experts.")})
        g = [t[f"{p}experts.{e}.{names[0]}.weight"] for e in range(n)]
        u = [t[f"{p}experts.{e}.{names[1]}.weight"] for e in range(n)]
        dn = [t[f"{p}experts.{e}.{names[2]}.weight"] for e in range(n)]
        q = f"model.layers.{l}.mlp."
        out[q + "gate.weight"] = t[p + "gate.weight"]
        out[q + "experts.gate_up_proj"] = torch.stack(
            [torch.cat([a, b], 0) for a, b in zip(g, u)]).contiguous()
        out[q + "experts.down_proj"] = torch.stack(dn).contiguous()
    safetensors_torch.save_file(out, f, metadata={"format": "pt"})


def test_fused_expert_layout_scores_the_same(setup):
    d, base, text, ids = setup
    for name in ("qwen3_moe_sparse", "mixtral"):
        model, path = build(d, base, name, seed=2)
        per_expert = our_nll(path, text)
        fuse(path, name == "mixtral")
        fused = our_nll(path, text)
        assert fused == per_expert, (name, fused, per_expert)
        assert abs(fused - hf_nll(model, ids)) < TOL


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_greedy_generation_matches_transformers(setup, name):
    d, base, text, ids = setup
    model, path = build(d, base, name, seed=3)
    prompt = "Once upon a time there was a"
    p = run("generate", path, "--prompt", prompt, "-n", str(STEPS), "--temperature", "0",
            "--bos", "--json")
    j = json.loads(p.stdout)
    ours = j["tokens"]
    pr = json.loads(run("tokenize", base, "--text", prompt, "--bos", "--json").stdout)["ids"]
    assert j["n_prompt_tokens"] == len(pr)
    with torch.no_grad():
        gen = model.generate(torch.tensor([pr]), max_new_tokens=STEPS, do_sample=False,
                             eos_token_id=None, pad_token_id=0)[0, len(pr):].tolist()
    print(f"{name}: ours {ours}\n{' ' * len(name)}  transformers {gen}")
    assert ours == gen[:len(ours)]
    if len(ours) < STEPS:  # we stop at BOS/EOS, which transformers (eos None) generates
        assert gen[len(ours)] in (1, 2), (ours, gen)
    assert len(set(ours)) > 1 or len(ours) < 3  # not a trivial run


# ---- GGUF in llama.cpp's MoE layout ---------------------------------------------------------

gguf = pytest.importorskip("gguf", reason="gguf-py not installed (GGUF writer)")


def llama_permute(w, heads):  # convert_hf_to_gguf.py LlamaModel.permute
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


def write_gguf(model, out, ftype=np.float32, drop=(), extra_kv=(), extra_tensors=()):
    """The tiny model in llama.cpp's layout (as convert_hf_to_gguf.py writes it), with the
    tensors `extra_tensors` ((name, numpy array) pairs) added after the model's."""
    cfg = model.config
    mixtral = cfg.model_type == "mixtral"
    arch = "llama" if mixtral else "qwen3moe"
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(out, arch)
    L = cfg.num_hidden_layers
    w.add_block_count(L)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_expert_count(cfg.num_local_experts if mixtral else cfg.num_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    if not mixtral:
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    for k, v in extra_kv:
        w.add_uint32(f"{arch}.{k}", v)

    def add(name, a, matrix=True):
        if name in drop:
            return
        w.add_tensor(name, np.ascontiguousarray(a.astype(ftype if matrix else np.float32)))

    add("token_embd.weight", sd["model.embed_tokens.weight"])
    add("output_norm.weight", sd["model.norm.weight"], False)
    add("output.weight", sd["lm_head.weight"])
    for l in range(L):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        q, k = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
        if mixtral:
            q = llama_permute(q, cfg.num_attention_heads)
            k = llama_permute(k, cfg.num_key_value_heads)
        add(b + "attn_norm.weight", sd[p + "input_layernorm.weight"], False)
        add(b + "attn_q.weight", q)
        add(b + "attn_k.weight", k)
        add(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        add(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        if not mixtral:
            add(b + "attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"], False)
            add(b + "attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"], False)
        add(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"], False)
        gu, dn = sd[p + "mlp.experts.gate_up_proj"], sd[p + "mlp.experts.down_proj"]
        half = gu.shape[1] // 2
        add(b + "ffn_gate_inp.weight", sd[p + "mlp.gate.weight"], False)
        add(b + "ffn_gate_exps.weight", gu[:, :half])
        add(b + "ffn_up_exps.weight", gu[:, half:])
        add(b + "ffn_down_exps.weight", dn)
    for name, a in extra_tensors:
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_gguf_moe_layout_scores_as_the_directory(setup, name):
    d, base, text, ids = setup
    tok = os.path.join(base, "tokenizer.json")
    model, path = build(d, base, name, seed=4)
    hf = our_nll(path, text)
    g32 = str(d / f"{name}-f32.gguf")
    write_gguf(model, g32)
    ours32 = our_nll(g32, text, "--tokenizer", tok)
    print(f"{name}: directory {hf:.8f} GGUF F32 {ours32:.8f} diff {ours32 - hf:+.2e}")
    assert abs(ours32 - hf) < TOL
    # F16 experts in the mapping: as the directory saved in f16.
    model16, path16 = build(d, base, name, seed=4, dtype=torch.float16)
    g16 = str(d / f"{name}-f16.gguf")
    write_gguf(model16, g16, np.float16)
    ours16, hf16 = our_nll(g16, text, "--tokenizer", tok), our_nll(path16, text)
    print(f"{name}: directory f16 {hf16:.8f} GGUF F16 {ours16:.8f} diff {ours16 - hf16:+.2e}")
    assert abs(ours16 - hf16) < TOL
    assert abs(hf16 - hf_nll(model16, ids)) < TOL


def test_gguf_bad_moe_inputs_named(setup):
    d, base, text, ids = setup
    tok = os.path.join(base, "tokenizer.json")
    model, _ = build(d, base, "qwen3_moe", seed=5)
    g = str(d / "missing.gguf")
    write_gguf(model, g, drop=("blk.1.ffn_up_exps.weight",))
    err = run("ppl", g, "--text", text, "--tokenizer", tok, ok=False).stderr
    assert "missing.gguf" in err and "tensor 'blk.1.ffn_up_exps.weight' is missing" in err, err
    g = str(d / "shared.gguf")
    write_gguf(model, g, extra_kv=(("expert_shared_count", 1),))
    err = run("ppl", g, "--text", text, "--tokenizer", tok, ok=False).stderr
    assert "shared.gguf" in err and "qwen3moe.expert_shared_count' = 1" in err, err
    # A per-expert `.scale` (llama.cpp's F32 {n_expert}) is applied: all ones scores as none,
    # one expert's halved moves the NLL; one of the wrong length or type is refused by name.
    E = model.config.num_experts
    plain = str(d / "plain.gguf")
    write_gguf(model, plain)
    nll = our_nll(plain, text, "--tokenizer", tok)
    scale = "blk.1.ffn_down_exps.scale"
    for tag, a, want in (
            ("ones", np.ones(E, np.float32), None),
            ("half", np.array([1, 1, 0.5] + [1] * (E - 3), np.float32), None),
            ("long", np.ones(E + 1, np.float32), f"expected F32 ne [{E}], got F32 ne [{E + 1}]"),
            ("f16", np.ones(E, np.float16), f"expected F32 ne [{E}], got F16 ne [{E}]")):
        g = str(d / f"scale-{tag}.gguf")
        write_gguf(model, g, extra_tensors=((scale, a),))
        if want is None:
            got = our_nll(g, text, "--tokenizer", tok)
            assert (got == nll) == (tag == "ones"), (tag, got, nll)
            continue
        err = run("ppl", g, "--text", text, "--tokenizer", tok, ok=False).stderr
        assert f"scale-{tag}.gguf" in err and f"tensor '{scale}': {want}" in err, err


# ---- bad inputs ------------------------------------------------------------------------------

def edit_config(path, **kv):
    f = os.path.join(path, "config.json")
    cfg = json.load(open(f))
    cfg.update(kv)
    json.dump(cfg, open(f, "w"))


def edit_tensors(path, fn):
    f = os.path.join(path, "model.safetensors")
    t = safetensors_torch.load_file(f)
    fn(t)
    safetensors_torch.save_file(t, f, metadata={"format": "pt"})


def ppl_error(path, text):
    p = run("ppl", path, "--text", text, "--max-tokens", "16", ok=False)
    assert p.returncode != 0
    return p.stderr


def test_bad_moe_checkpoints_named(setup):
    d, base, text, ids = setup
    _, q = build(d, base, "qwen3_moe", seed=6)
    _, m = build(d, base, "mixtral", seed=6)
    cases = []
    for src, name in ((q, "q"), (m, "m")):
        dst = str(d / f"bad_{name}")
        shutil.copytree(src, dst)
        cases.append(dst)
    bq, bm = cases
    # A missing expert tensor: the file, the tensor, the expert and layer.
    edit_tensors(bq, lambda t: t.pop("model.layers.1.mlp.experts.5.up_proj.weight"))
    err = ppl_error(bq, text)
    assert "bad_q" in err, err
    assert "missing tensor 'model.layers.1.mlp.experts.5.up_proj.weight'" in err, err
    assert "(expert 5 of 8 in layer 1)" in err, err
    # A router of the wrong shape.
    edit_tensors(bm, lambda t: t.update({"model.layers.0.block_sparse_moe.gate.weight":
                                         torch.zeros(3, 64)}))
    err = ppl_error(bm, text)
    assert "model.safetensors" in err and \
        "tensor 'model.layers.0.block_sparse_moe.gate.weight': shape mismatch, expected [4, 64]" \
        ", got [3, 64]" in err, err
    # Unknown or unsupported MoE fields, by name.
    fields = [
        (q, dict(shared_expert_intermediate_size=64),
         "field 'shared_expert_intermediate_size' = 64 (shared experts) is not supported"),
        (q, dict(n_group=4), "field 'n_group' = 4 (grouped top-k routing) is not supported"),
        (q, dict(scoring_func="sigmoid"), "field 'scoring_func' = \"sigmoid\""),
        (q, dict(mlp_only_layers=[0, 7]), "mlp_only_layers[1] = 7 is not a layer index in [0, 2)"),
        (q, dict(decoder_sparse_step=0), "decoder_sparse_step 0 must be at least 1"),
        (q, dict(num_experts=6), "num_experts 6 and num_local_experts 8 disagree"),
        (q, dict(num_experts_per_tok=9), "num_experts_per_tok 9 is outside [1, 8]"),
        (m, dict(norm_topk_prob=False), "norm_topk_prob = false: MixtralForCausalLM always"),
        (m, dict(decoder_sparse_step=2), "decoder_sparse_step is set, but MixtralForCausalLM"),
        (m, dict(sliding_window=64), "sliding_window 64 < max_position_embeddings 512"),
    ]
    for i, (src, kv, want) in enumerate(fields):
        dst = str(d / f"field{i}")
        shutil.copytree(src, dst)
        edit_config(dst, **kv)
        err = ppl_error(dst, text)
        assert "config.json" in err and want in err, (kv, err)


# ---- paths that refuse MoE models ------------------------------------------------------------

def test_unsupported_paths_refuse_moe_before_reading_weights(setup):
    d, base, text, ids = setup
    model, path = build(d, base, "qwen3_moe", seed=7)
    g = str(d / "refuse.gguf")
    write_gguf(model, g)
    # No weights to read: a refusal made after loading would fail on the missing file instead.
    hollow = str(d / "hollow")
    shutil.copytree(path, hollow)
    os.remove(os.path.join(hollow, "model.safetensors"))
    out = str(d / "out")
    cmds = [
        (["quantize", g, "-o", out + ".gguf", "--tokenizer", os.path.join(base, "tokenizer.json")],
         "quantize from a file (a Hugging Face directory is needed)"),
        (["experiment", hollow, "--eval", text, "--calib", text], "experiment"),
        (["convert", g, "-o", str(d / "conv")], "convert"),
        (["ppl", hollow, "--text", text, "--quant", "W"], "simulated quantization (quant)"),
        (["generate", hollow, "--prompt", "a", "--quant", "WA", "--calib", text],
         "simulated quantization (quant)"),
    ]
    # A GGUF output llama.cpp could not run (experts 32 wide): refused by the GGUF writer's
    # rules, also before any weight is read (test_moe_gguf.py: the GGUF that can be written).
    cmds.append((["quantize", hollow, "-o", out + ".gguf"], None))
    for args, what in cmds:
        p = run(*args, ok=False)
        assert p.returncode != 0, args
        want = (f"{REFUSED} {what}" if what else
                "cannot be written as a GGUF for llama.cpp: expert down row length 32")
        assert want in p.stderr, (args, p.stderr)
        assert "model.safetensors" not in p.stderr, (args, p.stderr)
    assert not os.path.exists(out) and not os.path.exists(out + ".gguf")
    # The dense runtime path itself runs the GGUF.
    assert our_nll(g, text, "--tokenizer", os.path.join(base, "tokenizer.json")) > 0


def test_torch_adapter_refuses_moe(setup):
    # scalesweep.torch's adapter, read from the source tree (it needs no native module).
    src = os.path.join(os.path.dirname(__file__), "..", "scalesweep", "torch", "_arch.py")
    spec = importlib.util.spec_from_file_location("scalesweep_torch_arch", src)
    arch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(arch)
    d, base, text, ids = setup
    for name in ("qwen3_moe", "mixtral"):
        model, _ = build(d, base, name, seed=8)
        with pytest.raises(ValueError, match="mixture-of-experts models are not yet supported by "
                                             r"scalesweep.torch \(simulate, calibrate\)"):
            arch.Arch(model)


# ---- llama.cpp as the judge of the GGUF layout ------------------------------------------------

@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_gguf_moe_layout_equals_llama_cpp(setup, name):
    """llama.cpp (llama-cpp-python 0.3.36) runs the GGUF written in its MoE layout with the
    NLL our runtime gives it: the layout, the q/k permutation of Mixtral (llama) and the
    normalised softmax routing are llama.cpp's."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
    import llama_cpp_judge as lj
    if lj.import_llama_cpp() is None:
        pytest.skip("llama_cpp not installed (scripts/get-llama-cpp.sh)")
    d, base, text, ids = setup
    tok_gguf = str(d / "tok.gguf")
    if not os.path.exists(tok_gguf):  # the stories260K tokenizer as our writer stores it
        run("quantize", MODEL, "--keep-dense", "q,k,v,o,gate,up,down", "--dense-dtype", "f32",
            "-o", tok_gguf)
    model, _ = build(d, base, name, seed=9)
    raw, judged = str(d / f"{name}-raw.gguf"), str(d / f"{name}-judged.gguf")
    write_gguf(model, raw)
    lj.with_tokenizer_of(raw, tok_gguf, judged)
    ours = our_nll(judged, text)
    total, count, _ = lj.Judge(judged, n_ctx=N, f32_kv=True).nll(ids, N)
    theirs = total / count
    print(f"{name}: ours {ours:.8f} llama.cpp {theirs:.8f} diff {ours - theirs:+.2e}")
    assert count == N - 1
    assert abs(ours - theirs) < TOL, (name, ours, theirs)
