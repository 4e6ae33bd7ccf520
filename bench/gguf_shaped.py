#!/usr/bin/env python3
"""A synthetic GGUF with a real model's layer shapes, random weights stored in llama.cpp's
Q4_K_M type mix, and a real tokenizer: what `scalesweep` reads, converts and quantizes from a
GGUF, at 8B size, without downloading an 8B model.

    python3 bench/gguf_shaped.py OUT.gguf [--preset qwen3-8b|qwen2-1.5b|tiny] [--layers N]
        [--tokenizer-from SRC.gguf] [--seed S] [--std 0.02] [--order hf|natural] [--force]

    # the full Qwen3-8B shapes (36 layers, 5,027,781,984 bytes; about 1 min on 2 cores, 0.56 GB
    # peak RSS): 217 Q4_K, 37 Q6_K, 145 F32 tensors
    python3 bench/gguf_shaped.py models/qwen3-8b-shaped/q4_k_m.gguf
    # a 2-layer file of the same shapes (1.10 GB: the 151,936-row embedding and output dominate)
    python3 bench/gguf_shaped.py /tmp/q3-8b-2l.gguf --layers 2

The tokenizer: every `tokenizer.*` key of SRC.gguf (default: the Qwen2.5-Coder-1.5B fixture,
models/qwen2.5-coder-1.5b/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf, scripts/get-qwen2-1.5b.sh)
is copied with its own value types: model, pre, tokens, token_type, merges, BOS/EOS/pad ids,
add_bos_token, chat_template. The preset's vocabulary must equal SRC's token count (the
script refuses a mismatch; `tiny` takes SRC's).

Presets (general.architecture; tensors as llama.cpp names them, ne = [in, out]):
  qwen3-8b    qwen3: 36 layers, embedding 4096, feed_forward 12288, 32 heads, 8 KV heads, head
              dim 128 (attention.key_length/value_length), vocab 151936, rope freq_base 1e6,
              rms eps 1e-6, context 40960; attn_q_norm/attn_k_norm [128] F32; untied output.
  qwen2-1.5b  qwen2: Qwen2.5-1.5B: 28 layers, 1536, 8960, 12 heads, 2 KV heads, q/k/v biases
              F32, untied output (as the fixture; `--layers 28 --order hf` reproduces the
              fixture's tensor names, shapes, types and order exactly).
  tiny        qwen3: embedding 256, feed_forward 512, 4 heads, 2 KV heads, head dim 64, 2
              layers, the source's vocabulary (for tests: ~55 MB, seconds).

Type mix: llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_M rule (src/llama-quant.cpp,
llama_tensor_get_type): output.weight Q6_K; token_embd.weight Q4_K; attn_v.weight and
ffn_down.weight Q6_K when use_more_bits(i, n) (i < n/8, or i >= 7n/8, or (i - n/8) % 3 == 2),
else Q4_K; every other matrix Q4_K; 1-D tensors (norms, biases) F32. llama.cpp's `i` is a
counter of attn_v (resp. ffn_down) tensors in the order the file lists them, not the layer
number. Official Qwen GGUFs list tensors in the order of the Hugging Face names sorted as
strings (convert_hf_to_gguf.py reads safetensors keys sorted: lm_head, embed_tokens,
layers.0, layers.1, layers.10, ..., layers.19, layers.2, ..., norm), so the Q6_K layers are
not the first/last/every-third layer numbers. This is checked against the fixture: its 28
layers are 169 Q4_K, 29 Q6_K and 141 F32 tensors with attn_v/ffn_down Q6_K in layers
0,1,5,6,7,8,9,10,13,16,19,21,24,27, which is exactly what this rule gives with the fixture's
order (`--order hf`, the default); for Qwen3-8B's 36 layers it puts attn_v/ffn_down in Q6_K in
layers 0-2, 4-11, 14, 17, 22, 25, 28, 30 and 33. `--order natural` writes token_embd, blk.0 .. blk.N-1 (each
in llama.cpp's attn/ffn order), output_norm, output, and applies the rule to layer numbers.

Random blocks are valid and dequantize to realistic magnitudes (std ~= --std, 0.02 by default;
every value finite):
  Q4_K (144 bytes / 256 weights: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128
  bytes of nibbles): w = d*sc_j*q - dmin*m_j; sc_j uniform in [32, 63] (llama.cpp's scales
  use the 6-bit range), m_j = sc_j +- 2, dmin = 7.5 d (centered sub-blocks, small offsets),
  q uniform 0..15, d per block from the target std with a 10% log-normal jitter.
  Q6_K (210 bytes: 128 ql, 64 qh, 16 int8 scales, fp16 d): w = d*s_j*(q - 32); |s_j| uniform
  in [64, 127] with random signs (llama.cpp's int8 scales fill that range), q uniform 0..63;
  d (about 1.1e-5 for std 0.02) is an fp16 subnormal, as in real Q6_K files of such weights.
  Norms: 1 + N(0, 0.02) (attn_norm, ffn_norm, output_norm, attn_q_norm, attn_k_norm);
  biases: N(0, 0.01).
The data are generated per tensor in chunks of at most 32 MiB and streamed to the file (gguf-py's
GGUFWriter writes the header, the key/values and the tensor infos; the data are appended in
its layout: 32-byte alignment), so the script's own peak memory is the source tokenizer
(~0.6 GB while GGUFReader parses it) plus one chunk. The output is written to OUT.tmp and
renamed into place; an existing OUT is kept unless --force.
"""
import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as QT
    from gguf import GGUFValueType as VT
except ImportError:  # pragma: no cover
    sys.exit("gguf_shaped: the `gguf` Python package is required (pip install gguf)")

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = ROOT / "models/qwen2.5-coder-1.5b/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QK_K = 256
CHUNK_BYTES = 32 << 20

PRESETS = {
    "qwen3-8b": dict(arch="qwen3", name="Qwen3-8B", layers=36, dim=4096, ff=12288, heads=32,
                     kv_heads=8, head_dim=128, vocab=151936, ctx=40960, rope_base=1e6,
                     eps=1e-6, qk_norm=True, qkv_bias=False, key_length=True),
    "qwen2-1.5b": dict(arch="qwen2", name="Qwen2.5-1.5B", layers=28, dim=1536, ff=8960,
                       heads=12, kv_heads=2, head_dim=128, vocab=151936, ctx=32768,
                       rope_base=1e6, eps=1e-6, qk_norm=False, qkv_bias=True,
                       key_length=False),
    "tiny": dict(arch="qwen3", name="tiny", layers=2, dim=256, ff=512, heads=4, kv_heads=2,
                 head_dim=64, vocab=None, ctx=4096, rope_base=1e6, eps=1e-6, qk_norm=True,
                 qkv_bias=False, key_length=True),
}


def use_more_bits(i_layer, n_layers):
    """llama.cpp src/llama-quant.cpp use_more_bits (integer division as in C++)."""
    return (i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8
            or (i_layer - n_layers // 8) % 3 == 2)


def tensor_plan(p, order):
    """[(gguf name, numpy shape (out, in) or (n,), kind)] in file order; kind is "matrix",
    "norm" or "bias"."""
    d, ff, hd = p["dim"], p["ff"], p["head_dim"]
    q, kv = p["heads"] * hd, p["kv_heads"] * hd
    # (HF name suffix, GGUF name suffix, shape, kind), in llama.cpp's per-layer order.
    layer = [("input_layernorm.weight", "attn_norm.weight", (d,), "norm"),
             ("self_attn.q_proj.weight", "attn_q.weight", (q, d), "matrix"),
             ("self_attn.k_proj.weight", "attn_k.weight", (kv, d), "matrix"),
             ("self_attn.v_proj.weight", "attn_v.weight", (kv, d), "matrix"),
             ("self_attn.o_proj.weight", "attn_output.weight", (d, q), "matrix")]
    if p["qkv_bias"]:
        layer += [("self_attn.q_proj.bias", "attn_q.bias", (q,), "bias"),
                  ("self_attn.k_proj.bias", "attn_k.bias", (kv,), "bias"),
                  ("self_attn.v_proj.bias", "attn_v.bias", (kv,), "bias")]
    if p["qk_norm"]:
        layer += [("self_attn.q_norm.weight", "attn_q_norm.weight", (hd,), "norm"),
                  ("self_attn.k_norm.weight", "attn_k_norm.weight", (hd,), "norm")]
    layer += [("post_attention_layernorm.weight", "ffn_norm.weight", (d,), "norm"),
              ("mlp.gate_proj.weight", "ffn_gate.weight", (ff, d), "matrix"),
              ("mlp.up_proj.weight", "ffn_up.weight", (ff, d), "matrix"),
              ("mlp.down_proj.weight", "ffn_down.weight", (d, ff), "matrix")]
    rows = [("model.embed_tokens.weight", "token_embd.weight", (p["vocab"], d), "matrix")]
    for i in range(p["layers"]):
        rows += [(f"model.layers.{i}.{h}", f"blk.{i}.{g}", s, k) for h, g, s, k in layer]
    rows += [("model.norm.weight", "output_norm.weight", (d,), "norm"),
             ("lm_head.weight", "output.weight", (p["vocab"], d), "matrix")]
    if order == "hf":
        rows.sort(key=lambda r: r[0])
    return [(g, s, k) for _, g, s, k in rows]


def assign_types(plan, n_layers):
    """llama.cpp's Q4_K_M type of each tensor, counting attn_v/ffn_down in file order."""
    i_wv = i_down = 0
    types = []
    for name, shape, kind in plan:
        if kind != "matrix":
            types.append(QT.F32)
            continue
        if shape[-1] % QK_K:
            sys.exit(f"gguf_shaped: {name}: ne[0] = {shape[-1]} is not a multiple of {QK_K} "
                     "(llama.cpp would fall back to another type; not modelled)")
        if name == "output.weight":
            t = QT.Q6_K
        elif "attn_v.weight" in name:
            t = QT.Q6_K if use_more_bits(i_wv, n_layers) else QT.Q4_K
            i_wv += 1
        elif "ffn_down" in name:
            t = QT.Q6_K if use_more_bits(i_down, n_layers) else QT.Q4_K
            i_down += 1
        else:
            t = QT.Q4_K
        types.append(t)
    return types


def _fp16_bytes(x):
    return np.ascontiguousarray(x.astype(np.float16)).view(np.uint8).reshape(-1, 2)


def q4_k_blocks(rng, nb, std):
    """nb valid Q4_K blocks (nb x 144 bytes) whose weights have std ~= `std`."""
    out = np.empty((nb, 144), np.uint8)
    sc = rng.integers(32, 64, (nb, 8), dtype=np.int16)
    mn = np.clip(sc + rng.integers(-2, 3, (nb, 8), dtype=np.int16), 0, 63)
    # nibbles uniform on 0..15: std sqrt(255/12); sub-block j spreads d*sc_j times that.
    rms_sc = np.sqrt((sc.astype(np.float64) ** 2).mean(axis=1))
    d = std / (rms_sc * np.sqrt(255 / 12)) * np.exp(rng.normal(0, 0.1, nb))
    d16 = d.astype(np.float16)
    out[:, 0:2] = _fp16_bytes(d16)
    out[:, 2:4] = _fp16_bytes(7.5 * d16.astype(np.float64))
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    # 6-bit packing (ggml get_scale_min_k4): bytes 0-3 sc0-3 | hi2(sc4-7) << 6, bytes 4-7
    # m0-3 | hi2(m4-7) << 6, bytes 8-11 lo4(sc4-7) | lo4(m4-7) << 4.
    out[:, 4:8] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 8:12] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    out[:, 12:16] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    out[:, 16:] = np.frombuffer(rng.bytes(nb * 128), np.uint8).reshape(nb, 128)
    return out


def q6_k_blocks(rng, nb, std):
    """nb valid Q6_K blocks (nb x 210 bytes) whose weights have std ~= `std`."""
    out = np.empty((nb, 210), np.uint8)
    out[:, :192] = np.frombuffer(rng.bytes(nb * 192), np.uint8).reshape(nb, 192)  # ql, qh
    mag = rng.integers(64, 128, (nb, 16), dtype=np.int16)
    s = np.where(rng.random((nb, 16)) < 0.5, -mag, mag).astype(np.int8)
    out[:, 192:208] = s.view(np.uint8)
    # q - 32 with q uniform on 0..63: std sqrt(4095/12).
    rms_s = np.sqrt((mag.astype(np.float64) ** 2).mean(axis=1))
    d = std / (rms_s * np.sqrt(4095 / 12)) * np.exp(rng.normal(0, 0.1, nb))
    out[:, 208:210] = _fp16_bytes(d)
    return out


BLOCKS = {QT.Q4_K: q4_k_blocks, QT.Q6_K: q6_k_blocks}


def tensor_nbytes(shape, qtype):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n = int(np.prod(shape))
    assert n % block == 0
    return n // block * size


def tensor_chunks(rng, shape, qtype, kind, std):
    """The tensor's bytes in chunks of whole rows, each at most CHUNK_BYTES (one row at least)."""
    if qtype == QT.F32:
        if kind == "norm":
            yield (1.0 + rng.normal(0, 0.02, shape)).astype(np.float32)
        else:
            yield rng.normal(0, 0.01, shape).astype(np.float32)
        return
    rows, cols = shape
    row_blocks = cols // QK_K
    row_bytes = tensor_nbytes((cols,), qtype)
    step = max(1, CHUNK_BYTES // row_bytes)
    for r in range(0, rows, step):
        yield BLOCKS[qtype](rng, (min(step, rows - r)) * row_blocks, std)


def copy_tokenizer(reader, writer):
    """Every tokenizer.* key of `reader`, with its value types; returns the token count."""
    n_tokens = None
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == VT.ARRAY else None
        if vtype == VT.ARRAY and len(field.types) != 2:
            sys.exit(f"gguf_shaped: {key}: nested arrays are not supported")
        value = field.contents()
        writer.add_key_value(key, value, vtype, sub)
        if key == "tokenizer.ggml.tokens":
            n_tokens = len(value)
    return n_tokens


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("output", type=Path, help="OUT.gguf")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="qwen3-8b")
    ap.add_argument("--layers", type=int, help="number of layers (default: the preset's)")
    ap.add_argument("--tokenizer-from", type=Path, default=DEFAULT_SOURCE,
                    help="GGUF whose tokenizer.* keys are copied (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--std", type=float, default=0.02,
                    help="standard deviation of the dequantized weights (default 0.02)")
    ap.add_argument("--order", choices=["hf", "natural"], default="hf",
                    help="tensor order: hf (the official Qwen GGUFs': HF names sorted; "
                         "default) or natural (layer by layer)")
    ap.add_argument("--force", action="store_true", help="replace an existing OUTPUT")
    a = ap.parse_args(argv)

    p = dict(PRESETS[a.preset])
    if a.layers is not None:
        if a.layers < 1:
            ap.error("--layers must be at least 1")
        p["layers"] = a.layers
    if a.output.exists() and not a.force:
        sys.exit(f"gguf_shaped: {a.output} exists (--force replaces it)")
    if not a.tokenizer_from.exists():
        sys.exit(f"gguf_shaped: tokenizer source {a.tokenizer_from} absent "
                 "(scripts/get-qwen2-1.5b.sh, or --tokenizer-from ANY.gguf)")

    t0 = time.time()
    reader = gguf.GGUFReader(a.tokenizer_from)
    arch = p["arch"]
    w = gguf.GGUFWriter(None, arch)
    w.add_type("model")
    w.add_name(f"synthetic {p['name']}-shaped Q4_K_M (random weights)")
    w.add_description("random weights in llama.cpp Q4_K_M's type mix, written by "
                      "scalesweep bench/gguf_shaped.py; tokenizer copied from "
                      f"{a.tokenizer_from.name}; seed {a.seed}")
    w.add_block_count(p["layers"])
    w.add_context_length(p["ctx"])
    w.add_embedding_length(p["dim"])
    w.add_feed_forward_length(p["ff"])
    w.add_head_count(p["heads"])
    w.add_head_count_kv(p["kv_heads"])
    w.add_rope_freq_base(p["rope_base"])
    w.add_layer_norm_rms_eps(p["eps"])
    if p["key_length"]:
        w.add_key_length(p["head_dim"])
        w.add_value_length(p["head_dim"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    n_tokens = copy_tokenizer(reader, w)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if n_tokens is None:
        sys.exit(f"gguf_shaped: {a.tokenizer_from} has no tokenizer.ggml.tokens")
    if p["vocab"] is None:
        p["vocab"] = n_tokens
    elif p["vocab"] != n_tokens:
        sys.exit(f"gguf_shaped: preset {a.preset} has a vocabulary of {p['vocab']} tokens but "
                 f"{a.tokenizer_from} has {n_tokens}: give a GGUF with a {p['vocab']}-token "
                 "tokenizer (Qwen2/Qwen2.5/Qwen3's), or --preset tiny (takes the source's)")
    del reader
    t_tok = time.time() - t0

    plan = tensor_plan(p, a.order)
    types = assign_types(plan, p["layers"])
    for (name, shape, _), t in zip(plan, types):
        dtype = np.dtype(np.float32) if t == QT.F32 else np.dtype(np.uint8)
        nbytes = tensor_nbytes(shape, t)
        # gguf-py takes numpy (reversed) shapes; for quantized types the shape in bytes.
        bshape = shape if t == QT.F32 else (*shape[:-1], tensor_nbytes(shape[-1:], t))
        w.add_tensor_info(name, bshape, dtype, nbytes, raw_dtype=None if t == QT.F32 else t)

    a.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.output.with_name(a.output.name + ".tmp")
    w.open_output_file(tmp)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    align = w.data_alignment
    for idx, ((name, shape, kind), t) in enumerate(zip(plan, types)):
        fout.write(bytes(-fout.tell() % align))
        start = fout.tell()
        rng = np.random.default_rng([a.seed, idx])
        for chunk in tensor_chunks(rng, shape, t, kind, a.std):
            fout.write(chunk.tobytes())
        assert fout.tell() - start == tensor_nbytes(shape, t), name
    fout.write(bytes(-fout.tell() % align))
    w.close()
    os.replace(tmp, a.output)

    counts = {}
    for t in types:
        counts[t.name] = counts.get(t.name, 0) + 1
    size = a.output.stat().st_size
    print(f"gguf_shaped: wrote {a.output}: {a.preset}, {p['layers']} layers, "
          f"{len(plan)} tensors ({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))}), "
          f"{size} bytes in {time.time() - t0:.1f} s (tokenizer {n_tokens} tokens from "
          f"{a.tokenizer_from.name}, read in {t_tok:.1f} s)")


if __name__ == "__main__":
    main()
