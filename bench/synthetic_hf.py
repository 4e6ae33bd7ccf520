#!/usr/bin/env python3
"""Writes a random Llama Hugging Face directory (config.json + model.safetensors) with weights
in bf16, f16 or f32, for memory and speed measurements of models that cannot be downloaded here.

    python3 bench/synthetic_hf.py OUT_DIR --dim 2048 --hidden 5632 --layers 16 --heads 16 \
        --kv-heads 4 --vocab 32000 [--dtype bf16] [--seed 0]

The safetensors file is written directly (header + tensor bytes, one tensor in memory at a
time); values are N(0, 1/sqrt(fan_in)), norms N(1, 0.1). Prints the parameter count and bytes.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np


def tensor_list(dim, hidden, layers, heads, kv_heads, vocab, head_dim, tied):
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
            (p + "post_attention_layernorm.weight", (dim,), 0.1, 1.0),
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


def write(out_dir, dim, hidden, layers, heads, kv_heads, vocab, dtype="bf16", seed=0,
          tied=True, max_seq_len=4096):
    head_dim = dim // heads
    os.makedirs(out_dir, exist_ok=True)
    tensors = tensor_list(dim, hidden, layers, heads, kv_heads, vocab, head_dim, tied)
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
        "vocab_size": vocab, "max_position_embeddings": max_seq_len, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": tied, "bos_token_id": 1,
        "eos_token_id": 2, "hidden_act": "silu",
        "torch_dtype": {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[dtype],
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return params, off


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=5632)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--dtype", choices=["bf16", "f16", "f32"], default="bf16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--untied", action="store_true")
    a = ap.parse_args()
    params, nbytes = write(a.out_dir, a.dim, a.hidden, a.layers, a.heads, a.kv_heads, a.vocab,
                           a.dtype, a.seed, not a.untied)
    print(f"{a.out_dir}: {params} parameters, {nbytes} bytes of {a.dtype} weights")


if __name__ == "__main__":
    sys.exit(main())
