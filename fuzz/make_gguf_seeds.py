#!/usr/bin/env python3
"""Writes the GGUF seeds of fuzz/corpus/gguf/ with gguf-py's GGUFWriter: a tiny Llama model
(config keys, a byte-level BPE tokenizer, tensors in F32, F16, Q8_0, Q4_0, and one Q4_K and Q6_K block), a
tiny Qwen3-MoE model in llama.cpp's expert layout (router ffn_gate_inp, stacked 3-D
ffn_{gate,up,down}_exps, a per-expert ffn_*_exps.scale) and a metadata-only file, each with a
truncated copy and a copy with one header byte changed.
Usage: fuzz/make_gguf_seeds.py OUT_DIR"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q


def byte_bpe(w):
    """A byte-level BPE tokenizer of 260 tokens."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    toks = [bytes([b]).decode("latin-1") for b in range(256)] + ["he", "ll", "hell", "<|endoftext|>"]
    w.add_token_list(toks)
    w.add_token_types([1] * 259 + [3])
    w.add_token_merges(["h e", "l l", "he ll"])
    w.add_bos_token_id(259)
    w.add_eos_token_id(259)


def tiny_qwen3moe(path):
    """Two Qwen3-MoE layers (hidden 32, 4 experts of width 16, top 2), experts stacked as
    llama.cpp stores them; the gate experts in Q8_0 with a per-expert F32 scale."""
    w = gguf.GGUFWriter(path, "qwen3moe")
    d, nl, vocab, hd, experts, inter = 32, 2, 260, 8, 4, 16
    w.add_block_count(nl)
    w.add_context_length(64)
    w.add_embedding_length(d)
    w.add_feed_forward_length(48)
    w.add_expert_feed_forward_length(inter)
    w.add_expert_count(experts)
    w.add_expert_used_count(2)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    byte_bpe(w)
    rng = np.random.default_rng(2)

    def t(name, shape, qt=Q.F32):
        a = rng.standard_normal(shape).astype(np.float32)
        if qt == Q.F32:
            w.add_tensor(name, a)
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qt), raw_dtype=qt)

    t("token_embd.weight", (vocab, d))
    t("output.weight", (vocab, d), Q.Q8_0)
    t("output_norm.weight", (d,))
    for l in range(nl):
        b = f"blk.{l}."
        for n in ("attn_norm", "ffn_norm"):
            t(b + n + ".weight", (d,))
        for n in ("attn_q_norm", "attn_k_norm"):
            t(b + n + ".weight", (hd,))
        t(b + "attn_q.weight", (4 * hd, d))
        t(b + "attn_k.weight", (2 * hd, d))
        t(b + "attn_v.weight", (2 * hd, d))
        t(b + "attn_output.weight", (d, 4 * hd))
        t(b + "ffn_gate_inp.weight", (experts, d))
        t(b + "ffn_gate_exps.weight", (experts, inter, d), Q.Q8_0)
        w.add_tensor(b + "ffn_gate_exps.scale", np.full((experts,), 0.5, np.float32))
        t(b + "ffn_up_exps.weight", (experts, inter, d))
        t(b + "ffn_down_exps.weight", (experts, d, inter))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tiny_llama(path):
    w = gguf.GGUFWriter(path, "llama")
    d, ff, nl, vocab = 32, 48, 1, 260
    w.add_block_count(nl)
    w.add_context_length(64)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    byte_bpe(w)
    rng = np.random.default_rng(1)

    def t(name, shape, qt):
        a = rng.standard_normal(shape).astype(np.float32)
        if qt == Q.F32:
            w.add_tensor(name, a)
        elif qt == Q.F16:
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qt), raw_dtype=qt)

    t("token_embd.weight", (vocab, d), Q.Q8_0)
    t("output_norm.weight", (d,), Q.F32)
    t("blk.0.attn_norm.weight", (d,), Q.F32)
    t("blk.0.ffn_norm.weight", (d,), Q.F32)
    t("blk.0.attn_q.weight", (d, d), Q.F16)
    t("blk.0.attn_k.weight", (d // 2, d), Q.Q4_0)
    t("blk.0.attn_v.weight", (d // 2, d), Q.Q8_0)
    t("blk.0.attn_output.weight", (d, d), Q.F16)
    t("blk.0.ffn_gate.weight", (ff, d), Q.Q4_0)
    t("blk.0.ffn_up.weight", (ff, d), Q.Q8_0)
    t("blk.0.ffn_down.weight", (d, ff), Q.F16)
    # gguf-py cannot quantize to K-quants: one block of bytes each (scales as f16 1.0).
    for name, qt in (("kquant.q4_k", Q.Q4_K), ("kquant.q6_k", Q.Q6_K)):
        nbytes = gguf.GGML_QUANT_SIZES[qt][1]
        raw = rng.integers(0, 256, size=(1, nbytes), dtype=np.uint8)
        raw[0, -2:] = (0x00, 0x3C) if qt == Q.Q6_K else raw[0, -2:]
        if qt == Q.Q4_K:
            raw[0, 0:4] = (0x00, 0x3C, 0x00, 0x38)
        w.add_tensor(name, raw, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def metadata_only(path):
    w = gguf.GGUFWriter(path, "qwen3")
    w.add_string("general.name", "fuzz")
    w.add_array("some.ints", [1, 2, 3])
    w.add_array("some.floats", [1.5, -2.0])
    w.add_bool("some.flag", True)
    w.add_uint64("some.u64", 1 << 40)
    w.add_int8("some.i8", -3)
    w.add_float64("some.f64", 0.25)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    out = os.path.join(sys.argv[1], "gguf")
    os.makedirs(out, exist_ok=True)
    for name, make, flip in (("tiny_llama.gguf", tiny_llama, 30),
                             ("tiny_qwen3moe.gguf", tiny_qwen3moe, 30),
                             ("metadata.gguf", metadata_only, 24)):
        p = os.path.join(out, name)
        make(p)
        b = open(p, "rb").read()
        open(os.path.join(out, "broken_truncated_" + name), "wb").write(b[: len(b) // 2])
        f = bytearray(b)
        f[flip] ^= 0x5A
        open(os.path.join(out, "broken_flipped_" + name), "wb").write(bytes(f))


if __name__ == "__main__":
    main()
