"""`scalesweep convert` (llama2.c -> Hugging Face directory) and the tokenizer.json BPE
tokenizers, checked with independent tools: the `safetensors` package, numpy, ml_dtypes, and
(when installed) Hugging Face `tokenizers` as the reference encoder."""
import json
import os
import random
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

BIN = os.environ.get("SCALESWEEP_BIN")
DATA = Path(os.environ.get("SS_SHARED_DATA_DIR", Path(__file__).resolve().parents[3] / "shared" / "data"))
MODEL = DATA / "models" / "stories260K" / "stories260K.bin"
TOK = DATA / "models" / "stories260K" / "tok512.bin"
TEXT = DATA / "text" / "tinystories_val.txt"

needs_bin = pytest.mark.skipif(not BIN, reason="SCALESWEEP_BIN not set (run through ctest)")
needs_data = pytest.mark.skipif(not MODEL.exists() or not TOK.exists() or not TEXT.exists(),
                                reason=f"shared data absent ({MODEL})")


def run(*args, check=True):
    r = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"{args} failed rc={r.returncode}: {r.stderr}")
    return r


def first_lines(n):
    with open(TEXT, encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(n)]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    if not BIN or not MODEL.exists() or not TOK.exists():
        pytest.skip("needs SCALESWEEP_BIN and shared data")
    out = tmp_path_factory.mktemp("conv") / "stories260K-hf"
    r = run("convert", MODEL, "--tokenizer", TOK, "-o", out, "--json")
    return out, json.loads(r.stdout)


def read_llama2c_legacy(path):
    raw = Path(path).read_bytes()
    dim, hidden, L, H, KV, vocab, seq = struct.unpack("<7i", raw[:28])
    f = np.frombuffer(raw[28:], dtype="<f4")
    hd = dim // H
    kv = KV * hd
    sizes = [("emb", (abs(vocab), dim)), ("rms_att", (L, dim)), ("wq", (L, dim, dim)),
             ("wk", (L, kv, dim)), ("wv", (L, kv, dim)), ("wo", (L, dim, dim)),
             ("rms_ffn", (L, dim)), ("w1", (L, hidden, dim)), ("w2", (L, dim, hidden)),
             ("w3", (L, hidden, dim)), ("rms_final", (dim,))]
    out, at = {}, 0
    for name, shape in sizes:
        n = int(np.prod(shape))
        out[name] = f[at:at + n].reshape(shape)
        at += n
    return dict(dim=dim, hidden=hidden, L=L, H=H, KV=KV, vocab=vocab, seq=seq, hd=hd), out


def interleave(w_hf, heads, hd):
    """Inverse of the llama2.c -> HF permutation: rotate-half rows back to (2i, 2i+1) pairs."""
    cols = w_hf.shape[1]
    x = w_hf.reshape(heads, 2, hd // 2, cols)          # [h, half, i, c]
    return x.transpose(0, 2, 1, 3).reshape(heads * hd, cols)  # [h, i, half, c]


@needs_bin
@needs_data
def test_convert_config_and_tensors(converted):
    from safetensors.numpy import load_file

    out, rep = converted
    assert rep["source_format"] == "llama2c-legacy"
    assert rep["parameters"] == 260032
    names = sorted(p.name for p in out.iterdir())
    assert names == ["config.json", "generation_config.json", "model.safetensors",
                     "tokenizer.json", "tokenizer_config.json"]
    hdr, w = read_llama2c_legacy(MODEL)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]) == (64, 172, 5)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]) == (8, 4, 512)
    assert cfg["max_position_embeddings"] == 512 and cfg["tie_word_embeddings"] is True
    assert cfg["rms_norm_eps"] == 1e-5 and cfg["rope_theta"] == 10000.0
    gen = json.loads((out / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"]) == (1, 2)

    t = load_file(str(out / "model.safetensors"))
    L, dim, hidden, kv = hdr["L"], hdr["dim"], hdr["hidden"], hdr["KV"] * hdr["hd"]
    expect = {"model.embed_tokens.weight": (512, dim), "model.norm.weight": (dim,)}
    for l in range(L):
        p = f"model.layers.{l}."
        expect.update({p + "input_layernorm.weight": (dim,),
                       p + "post_attention_layernorm.weight": (dim,),
                       p + "self_attn.q_proj.weight": (dim, dim),
                       p + "self_attn.k_proj.weight": (kv, dim),
                       p + "self_attn.v_proj.weight": (kv, dim),
                       p + "self_attn.o_proj.weight": (dim, dim),
                       p + "mlp.gate_proj.weight": (hidden, dim),
                       p + "mlp.up_proj.weight": (hidden, dim),
                       p + "mlp.down_proj.weight": (dim, hidden)})
    assert sorted(t) == sorted(expect)  # tied: no lm_head.weight
    for k, shape in expect.items():
        assert t[k].shape == shape and t[k].dtype == np.float32, k

    np.testing.assert_array_equal(t["model.embed_tokens.weight"], w["emb"])
    np.testing.assert_array_equal(t["model.norm.weight"], w["rms_final"])
    for l in range(L):
        p = f"model.layers.{l}."
        q, k = t[p + "self_attn.q_proj.weight"], t[p + "self_attn.k_proj.weight"]
        # The HF rows are a permutation of the llama2.c rows, and interleaving undoes it.
        assert not np.array_equal(q, w["wq"][l])
        np.testing.assert_array_equal(interleave(q, hdr["H"], hdr["hd"]), w["wq"][l])
        np.testing.assert_array_equal(interleave(k, hdr["KV"], hdr["hd"]), w["wk"][l])
        np.testing.assert_array_equal(t[p + "self_attn.v_proj.weight"], w["wv"][l])
        np.testing.assert_array_equal(t[p + "self_attn.o_proj.weight"], w["wo"][l])
        np.testing.assert_array_equal(t[p + "mlp.gate_proj.weight"], w["w1"][l])
        np.testing.assert_array_equal(t[p + "mlp.down_proj.weight"], w["w2"][l])
        np.testing.assert_array_equal(t[p + "mlp.up_proj.weight"], w["w3"][l])
        np.testing.assert_array_equal(t[p + "input_layernorm.weight"], w["rms_att"][l])
        np.testing.assert_array_equal(t[p + "post_attention_layernorm.weight"], w["rms_ffn"][l])


@needs_bin
@needs_data
def test_converted_model_same_perplexity(converted, tmp_path):
    out, _ = converted
    text = tmp_path / "t.txt"
    text.write_text("\n".join(first_lines(60)) + "\n", encoding="utf-8")
    a = json.loads(run("ppl", MODEL, "--tokenizer", TOK, "--text", text, "--max-tokens", "400",
                       "--json").stdout)
    b = json.loads(run("ppl", out, "--text", text, "--max-tokens", "400", "--json").stdout)
    assert a["tokens"] == b["tokens"] > 0
    assert abs(a["nll_per_token"] - b["nll_per_token"]) <= 1e-6


@needs_bin
@needs_data
def test_hf_dir_written_by_python_bf16_fp16_sharded(converted, tmp_path):
    """A HF directory written by the `safetensors` package (bf16 / fp16, sharded with an index)
    loads and gives nearly the fp32 perplexity."""
    import ml_dtypes
    from safetensors.numpy import load_file, save_file

    out, _ = converted
    t = load_file(str(out / "model.safetensors"))
    text = tmp_path / "t.txt"
    text.write_text("\n".join(first_lines(60)) + "\n", encoding="utf-8")
    ref = json.loads(run("ppl", out, "--text", text, "--max-tokens", "300", "--json").stdout)
    for dt, name in [(ml_dtypes.bfloat16, "bf16"), (np.float16, "fp16")]:
        d = tmp_path / name
        d.mkdir()
        for f in ["config.json", "tokenizer.json", "tokenizer_config.json"]:
            (d / f).write_bytes((out / f).read_bytes())
        keys = sorted(t)
        half = len(keys) // 2
        shards = {"model-00001-of-00002.safetensors": keys[:half],
                  "model-00002-of-00002.safetensors": keys[half:]}
        wm = {}
        for fn, ks in shards.items():
            save_file({k: t[k].astype(dt) for k in ks}, str(d / fn), metadata={"format": "pt"})
            wm.update({k: fn for k in ks})
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
        r = json.loads(run("ppl", d, "--text", text, "--max-tokens", "300", "--json").stdout)
        assert r["tokens"] == ref["tokens"]
        assert abs(r["nll_per_token"] - ref["nll_per_token"]) < 0.05, (name, r, ref)
        # A tensor of the wrong shape is named in the error.
        bad = dict(load_file(str(d / "model-00001-of-00002.safetensors")))
        k0 = sorted(bad)[0]
        bad[k0] = bad[k0][..., :-1].copy()
        save_file(bad, str(d / "model-00001-of-00002.safetensors"))
        r = run("ppl", d, "--text", text, "--json", check=False)
        assert r.returncode != 0 and k0 in r.stderr and "shape mismatch" in r.stderr, r.stderr


@needs_bin
@needs_data
def test_convert_errors(converted, tmp_path):
    out, _ = converted
    r = run("convert", MODEL, "--tokenizer", TOK, "-o", out, check=False)
    assert r.returncode != 0 and "already exists" in r.stderr
    r = run("convert", tmp_path / "nope.bin", "-o", tmp_path / "x", check=False)
    assert r.returncode != 0 and "nope.bin" in r.stderr
    assert not (tmp_path / "x").exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no temporary directory left


@needs_bin
@needs_data
def test_converted_tokenizer_matches_llama2c_and_hf_tokenizers(converted, tmp_path):
    out, _ = converted
    lines = first_lines(200)
    f = tmp_path / "lines.txt"
    f.write_text("\n".join(lines), encoding="utf-8")
    ours = json.loads(run("tokenize", out, "--file", f, "--lines", "--bos", "--json").stdout)["ids"]
    ref = json.loads(run("tokenize", TOK, "--file", f, "--lines", "--bos", "--json").stdout)["ids"]
    same = sum(a == b for a, b in zip(ours, ref))
    print(f"tokenizer.json vs tok512.bin: {same}/{len(lines)} lines identical")
    assert len(ours) == len(ref) == 200 and same == 200
    tokenizers = pytest.importorskip("tokenizers", reason="`pip install tokenizers` for the HF check")
    tk = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    hf = [tk.encode(s).ids for s in lines]  # its post-processor adds <s>
    same_hf = sum(a == b for a, b in zip(ours, hf))
    print(f"tokenizer.json: scalesweep vs HF tokenizers: {same_hf}/{len(lines)} lines identical")
    assert same_hf == 200
    assert tk.decode(hf[0]) == lines[0]


LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
EXTRA = ["héllo wörld ÄÖÜ straße", "日本語のテキスト、漢字。", "emoji 😀🎉👍🏽 mix",
         "tabs\tand\r\nCRLF\n\n  spaces   end  ", "numbers 1234567 3.14159 ١٢٣ ⅷ",
         "I'M HERE, you're there; they'LL", "Привет, мир!", "a\u00a0b\u2003c", "x  \n\n\t y"]


@needs_bin
@pytest.mark.parametrize("kind", ["gpt2", "llama3", "qwen2", "smollm"])
def test_byte_level_tokenizer_matches_hf_tokenizers(kind, tmp_path):
    """Train a small byte-level BPE with HF `tokenizers` (GPT-2 / Llama-3 / Qwen2 regex, SmolLM
    digits), then compare scalesweep's encodings on text with Unicode, emoji, digits, CRLF."""
    tokenizers = pytest.importorskip("tokenizers", reason="`pip install tokenizers` for this check")
    from tokenizers import Regex, decoders, models, pre_tokenizers, trainers

    pt = pre_tokenizers
    tok = tokenizers.Tokenizer(models.BPE())
    if kind == "gpt2":
        tok.pre_tokenizer = pt.ByteLevel(add_prefix_space=False, use_regex=True)
    elif kind == "smollm":
        tok.pre_tokenizer = pt.Sequence([pt.Digits(individual_digits=True),
                                         pt.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        tok.pre_tokenizer = pt.Sequence([
            pt.Split(Regex(LLAMA3 if kind == "llama3" else QWEN2), behavior="isolated"),
            pt.ByteLevel(add_prefix_space=False, use_regex=False)])
    if kind == "qwen2":  # as Qwen2: NFC normalizer
        tok.normalizer = tokenizers.normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(0)
    if TEXT.exists():
        corpus = first_lines(1500)
    else:  # self-contained fallback corpus
        words = ["the", "cat", "sat", "on", "mat", "Lily", "played", "park", "happy", "big"]
        corpus = [" ".join(rng.choice(words) for _ in range(12)) + "." for _ in range(1500)]
    trainer = trainers.BpeTrainer(vocab_size=900, show_progress=False,
                                  initial_alphabet=pt.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|im_start|>"])
    tok.train_from_iterator(corpus[:1200] + EXTRA * 3, trainer)
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    if kind == "llama3":  # as Llama 3: whole pre-tokens found in the vocabulary are not merged
        j = json.loads(path.read_text(encoding="utf-8"))
        j["model"]["ignore_merges"] = True
        zid = max(list(j["model"]["vocab"].values()) + [a["id"] for a in j["added_tokens"]]) + 1
        j["model"]["vocab"]["\u0120zzqx"] = zid  # "Ġzzqx"
        path.write_text(json.dumps(j), encoding="utf-8")
        tok = tokenizers.Tokenizer.from_file(str(path))
        assert tok.encode(" zzqx").ids == [zid]
    # An added token that only matches as a whole word (not inside "foobar", "foo1", "_foo").
    tok.add_tokens([tokenizers.AddedToken("foo", single_word=True, normalized=False)])
    tok.save(str(path))
    chars = "aAbé ,.'\n\t0123😀日\u00a0-!?sSlLrRvVeEdDmMtT\r"
    texts = corpus[1200:1400] + EXTRA + ["".join(rng.choice(chars) for _ in range(rng.randint(1, 40)))
                                         for _ in range(200)]
    texts += ["<|endoftext|>hello<|im_start|> x", "a <|endoftext|> b", " zzqx zzqx", "zzqx",
              "foo bar", "foobar", "xfoo", "_foo", "foo1", "(foo)", "éfoo", "a foo b foofoo foo."]
    # Decomposed / reorderable / Hangul sequences (NFC changes them; identity elsewhere).
    marks = ["e\u0301", "a\u0302\u0323", "\u212b", "\u1100\u1161\u11a8", "x\u0323\u0307",
             "\u0958", "\u2126", "o\u0308\u0304", " ", "a", "\u0301"]
    texts += ["".join(rng.choice(marks) for _ in range(rng.randint(1, 12))) for _ in range(100)]
    texts = [t for t in texts if "\n" not in t]  # one text per line for --lines
    crlf = ["tabs\tand\r\nCRLF\n\n  spaces   end  ", "x  \n\n\t y", "a\n\nb\r\n\r\n c\n"]
    f = tmp_path / "texts.txt"
    f.write_bytes("\n".join(texts).encode("utf-8"))
    ours = json.loads(run("tokenize", path, "--file", f, "--lines", "--json").stdout)["ids"]
    ref = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    same = sum(a == b for a, b in zip(ours, ref))
    bad = [(t, a, b) for t, a, b in zip(texts, ours, ref) if a != b][:3]
    assert len(ours) == len(texts) and same == len(texts), bad
    for t in crlf:  # whole-file encodings keep newlines
        g = tmp_path / "one.txt"
        g.write_bytes(t.encode("utf-8"))
        ids = json.loads(run("tokenize", path, "--file", g, "--json").stdout)["ids"]
        assert ids == tok.encode(t, add_special_tokens=False).ids, t
        back = json.loads(run("tokenize", path, "--decode", *ids, "--json").stdout)["text"]
        assert back == t


@needs_bin
@needs_data
@pytest.mark.parametrize("scheme,split", [("always", False), ("first", True), ("never", False)])
def test_sentencepiece_metaspace_variants_match_hf_tokenizers(converted, tmp_path, scheme, split):
    """The converted tokenizer.json rewritten with the newer Metaspace pre-tokenizer (as in
    Mistral / recent Llama-2 conversions) instead of the legacy Prepend+Replace normalizer."""
    tokenizers = pytest.importorskip("tokenizers", reason="`pip install tokenizers` for this check")
    out, _ = converted
    j = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme,
                          "split": split}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(j), encoding="utf-8")
    tk = tokenizers.Tokenizer.from_file(str(path))
    rng = random.Random(5)
    chars = "aAbé ,.'\t0123😀日\u00a0-!?sS \u2581"
    texts = [s for s in first_lines(150) if s] + [" lead", "  two", "x<s> y", "<s>first", "a </s>b"]
    texts += ["".join(rng.choice(chars) for _ in range(rng.randint(1, 30))) for _ in range(150)]
    f = tmp_path / "texts.txt"
    f.write_bytes("\n".join(texts).encode("utf-8"))
    ours = json.loads(run("tokenize", path, "--file", f, "--lines", "--json").stdout)["ids"]
    ref = [tk.encode(t, add_special_tokens=False).ids for t in texts]
    bad = [(t, a, b) for t, a, b in zip(texts, ours, ref) if a != b][:3]
    assert len(ours) == len(texts) and not bad, bad
