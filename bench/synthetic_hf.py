#!/usr/bin/env python3
"""Writes a random Llama Hugging Face directory (config.json + model.safetensors) with weights
in bf16, f16 or f32, for memory and speed measurements of models that cannot be downloaded here.

    python3 bench/synthetic_hf.py OUT_DIR --dim 2048 --hidden 5632 --layers 16 --heads 16 \
        --kv-heads 4 --vocab 32000 [--dtype bf16] [--seed 0]
    python3 bench/synthetic_hf.py OUT_DIR --preset llama-3.1-8b [--layers 4] \
        --tokenizer-from HF_DIR

--preset llama-3.1-8b gives Llama-3.1-8B's shapes and RoPE (hidden 4096, 32 layers, 32 query
and 8 KV heads, intermediate 14336, vocabulary 128256, untied head, rope_theta 500000, llama3
RoPE scaling factor 8 from 8192 positions); --layers overrides the depth (a few layers of the
same shapes, to extrapolate per-layer costs). --preset qwen3-30b-a3b gives Qwen3-30B-A3B's
(qwen3_moe: hidden 2048, 48 layers, 32 query and 4 KV heads of 128, q/k norms, 128 experts of
width 768 with 8 routed per token and renormalised weights, vocabulary 151936, untied head,
rope_theta 1e6; 1.2 GB of bf16 a layer); --experts overrides the expert count (a quick run of
the plumbing). --tokenizer-from copies a real tokenizer
(tokenizer.json, tokenizer_config.json, special_tokens_map.json, chat template) from an HF
directory and takes its BOS/EOS ids; its ids must lie below the vocabulary.

The safetensors file is written directly (header + tensor bytes, one tensor in memory at a
time); values are N(0, 1/sqrt(fan_in)), norms N(1, 0.1). Prints the parameter count and bytes.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np


def tensor_list(dim, hidden, layers, heads, kv_heads, vocab, head_dim, tied, experts=0,
                moe_hidden=0):
    kv = kv_heads * head_dim
    qd = heads * head_dim
    out = [("model.embed_tokens.weight", (vocab, dim), 1.0, 0.0)]
    for l in range(layers):
        p = f"model.layers.{l}."
        out += [
            (p + "input_layernorm.weight", (dim,), 0.1, 1.0),
            (p + "self_attn.q_proj.weight", (qd, dim), dim ** -0.5, 0.0),
            (p + "self_attn.k_proj.weight", (kv, dim), dim ** -0.5, 0.0),
            (p + "self_attn.v_proj.weight", (kv, dim), dim ** -0.5, 0.0),
            (p + "self_attn.o_proj.weight", (dim, qd), qd ** -0.5, 0.0),
        ]
        if experts:  # Qwen3-MoE: q/k norms, the router, every expert's gate/up/down
            out += [(p + "self_attn.q_norm.weight", (head_dim,), 0.1, 1.0),
                    (p + "self_attn.k_norm.weight", (head_dim,), 0.1, 1.0)]
        out.append((p + "post_attention_layernorm.weight", (dim,), 0.1, 1.0))
        if experts:
            out.append((p + "mlp.gate.weight", (experts, dim), dim ** -0.5, 0.0))
            for e in range(experts):
                q = p + f"mlp.experts.{e}."
                out += [
                    (q + "gate_proj.weight", (moe_hidden, dim), dim ** -0.5, 0.0),
                    (q + "up_proj.weight", (moe_hidden, dim), dim ** -0.5, 0.0),
                    (q + "down_proj.weight", (dim, moe_hidden), moe_hidden ** -0.5, 0.0),
                ]
            continue
        out += [
            (p + "mlp.gate_proj.weight", (hidden, dim), dim ** -0.5, 0.0),
            (p + "mlp.up_proj.weight", (hidden, dim), dim ** -0.5, 0.0),
            (p + "mlp.down_proj.weight", (dim, hidden), hidden ** -0.5, 0.0),
        ]
    out.append(("model.norm.weight", (dim,), 0.1, 1.0))
    if not tied:
        out.append(("lm_head.weight", (vocab, dim), dim ** -0.5, 0.0))
    return out


def encode(x, dtype):
    if dtype == "f32":
        return x.astype("<f4").tobytes()
    if dtype == "f16":
        return x.astype("<f2").tobytes()
    u = x.astype("<f4").view("<u4")
    # round to nearest even (the values are finite)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype("<u2").tobytes()


PRESETS = {
    "llama-3.1-8b": dict(dim=4096, hidden=14336, layers=32, heads=32, kv_heads=8, vocab=128256,
                         tied=False, max_seq_len=131072, rope_theta=500000.0,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192}),
    # Qwen3-30B-A3B (qwen3_moe): 48 layers, every one sparse, 128 experts of width 768, 8 routed
    # per token with renormalised top-k weights, q/k RMS norms, head dim 128.
    "qwen3-30b-a3b": dict(dim=2048, hidden=6144, layers=48, heads=32, kv_heads=4, vocab=151936,
                          tied=False, max_seq_len=40960, rope_theta=1000000.0, head_dim=128,
                          experts=128, moe_hidden=768, top_k=8, rms_eps=1e-6),
}
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja"]


def write(out_dir, dim, hidden, layers, heads, kv_heads, vocab, dtype="bf16", seed=0,
          tied=True, max_seq_len=4096, rope_theta=10000.0, rope_scaling=None, bos=1, eos=2,
          head_dim=None, experts=0, moe_hidden=0, top_k=0, rms_eps=1e-5):
    head_dim = head_dim or dim // heads
    os.makedirs(out_dir, exist_ok=True)
    tensors = tensor_list(dim, hidden, layers, heads, kv_heads, vocab, head_dim, tied, experts,
                          moe_hidden)
    esize = {"f32": 4, "f16": 2, "bf16": 2}[dtype]
    st_dtype = {"f32": "F32", "f16": "F16", "bf16": "BF16"}[dtype]
    header, off = {}, 0
    for name, shape, _, _ in tensors:
        n = int(np.prod(shape)) * esize
        header[name] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    rng = np.random.default_rng(seed)
    params = 0
    with open(os.path.join(out_dir, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name, shape, scale, offset in tensors:
            x = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale) + np.float32(offset)
            f.write(encode(x, dtype))
            params += x.size
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": dim, "intermediate_size": hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "vocab_size": vocab, "max_position_embeddings": max_seq_len, "rope_theta": rope_theta,
        "rms_norm_eps": rms_eps, "tie_word_embeddings": tied, "bos_token_id": bos,
        "eos_token_id": eos, "hidden_act": "silu",
        "torch_dtype": {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[dtype],
    }
    if experts:
        cfg.update({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                    "num_experts": experts, "num_experts_per_tok": top_k,
                    "moe_intermediate_size": moe_hidden, "norm_topk_prob": True,
                    "decoder_sparse_step": 1, "mlp_only_layers": [], "attention_bias": False,
                    "use_sliding_window": False, "sliding_window": None})
    if rope_scaling:
        cfg["rope_scaling"] = rope_scaling
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return params, off


def copy_tokenizer(src, out_dir, vocab):
    """Copies the tokenizer files of HF directory `src`; returns its (bos, eos) ids."""
    import shutil
    if not os.path.exists(os.path.join(src, "tokenizer.json")):
        sys.exit(f"synthetic_hf: {src}: no tokenizer.json")
    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), out_dir)
    tok = json.load(open(os.path.join(src, "tokenizer.json"), encoding="utf-8"))
    ids = list(tok["model"]["vocab"].values()) + [t["id"] for t in tok.get("added_tokens", [])]
    if max(ids) >= vocab:
        sys.exit(f"synthetic_hf: {src}: token id {max(ids)} is not below the vocabulary {vocab}")
    cfg = json.load(open(os.path.join(src, "config.json")))
    return cfg.get("bos_token_id", 1), cfg.get("eos_token_id", 2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--preset", choices=sorted(PRESETS))
    ap.add_argument("--tokenizer-from", help="HF directory whose tokenizer files are copied")
    ap.add_argument("--dim", type=int)
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--experts", type=int, help="MoE presets: the number of experts")
    ap.add_argument("--dtype", choices=["bf16", "f16", "f32"], default="bf16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--untied", action="store_true")
    a = ap.parse_args()
    p = dict(dim=2048, hidden=5632, layers=16, heads=16, kv_heads=4, vocab=32000,
             tied=not a.untied)
    if a.preset:
        p.update(PRESETS[a.preset])
    if a.experts is not None and not p.get("experts"):
        sys.exit("synthetic_hf: --experts needs a mixture-of-experts preset (qwen3-30b-a3b)")
    for k in ("dim", "hidden", "layers", "heads", "kv_heads", "vocab", "experts"):
        if getattr(a, k) is not None:
            p[k] = getattr(a, k)
    if p.get("experts"):
        p["top_k"] = min(p["top_k"], p["experts"])
    os.makedirs(a.out_dir, exist_ok=True)
    if a.tokenizer_from:
        p["bos"], p["eos"] = copy_tokenizer(a.tokenizer_from, a.out_dir, p["vocab"])
    params, nbytes = write(a.out_dir, dtype=a.dtype, seed=a.seed, **p)
    print(f"{a.out_dir}: {params} parameters, {nbytes} bytes of {a.dtype} weights")


if __name__ == "__main__":
    sys.exit(main())
