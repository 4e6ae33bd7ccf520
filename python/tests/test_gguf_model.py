"""GGUF models without the real-model fixture: a tiny Llama GGUF with a SentencePiece
(`tokenizer.ggml.model = llama`) vocabulary, written by gguf-py's GGUFWriter, against
transformers' own GGUF loaders.

- the merges `scalesweep convert` derives from the token scores equal transformers'
  generate_merges(vocab, scores);
- `scalesweep tokenize tiny.gguf` equals transformers' tokenizer built from the same GGUF
  (texts that do not start with a space: there llama.cpp and SentencePiece prepend "▁" to the
  leading space, transformers 5's LlamaTokenizer does not, and we follow llama.cpp);
- the weights `convert` writes (q/k rows unpermuted by us) equal those transformers' GGUF
  loader produces (it undoes llama.cpp's permutation with its own code), and the model's
  logits from `ppl` match.
"""
import json
import subprocess

import numpy as np
import pytest

from cli_common import BIN, need_bin

gguf = pytest.importorskip("gguf", reason="`pip install gguf` (gguf-py) for the GGUF checks")

pytestmark = need_bin

U = "\u2581"
PIECES = [U, "t", "h", "e", "w", "o", "r", "l", "d", "a", "i", "n", "s", "c", "k",
          U + "t", "he", U + "the", "in", U + "a", U + "in", "or", "wor", U + "w", U + "wor", "ld",
          U + "world", "ll", U + "h", U + "he", "llo", U + "hello", "er", "es", "st", "ck"]
TOKENS = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + PIECES
# SentencePiece order: the earlier piece has the higher score. Two pieces share a score so
# the tie-breaks matter (within "▁wor": "▁w"+"or" before "▁"+"wor", longer left part first).
SCORES = [0.0, 0.0, 0.0] + [0.0] * 256 + [-float(i) for i in range(len(PIECES))]
SCORES[TOKENS.index(U + "wor")] = SCORES[TOKENS.index(U + "w")]
TYPES = [2, 3, 3] + [6] * 256 + [1] * len(PIECES)
TEXTS = ["hello world", "the world in a", "Hello World!", "h\u00e9llo", "two  spaces ",
         "x", "stack checks", "\u4e2d"]


def write_tiny(path, arch="llama"):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(32)
    w.add_embedding_length(16)
    w.add_feed_forward_length(32)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(8)
    w.add_tokenizer_model("llama")
    w.add_token_list(TOKENS)
    w.add_token_scores(SCORES)
    w.add_token_types(TYPES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    rng = np.random.default_rng(0)
    v = len(TOKENS)

    def t(name, shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.3).astype(np.float32))

    t("token_embd.weight", (v, 16))
    t("output_norm.weight", (16,))
    p = "blk.0."
    for name, shape in [("attn_norm.weight", (16,)), ("attn_q.weight", (16, 16)),
                        ("attn_k.weight", (8, 16)), ("attn_v.weight", (8, 16)),
                        ("attn_output.weight", (16, 16)), ("ffn_norm.weight", (16,)),
                        ("ffn_gate.weight", (32, 16)), ("ffn_up.weight", (32, 16)),
                        ("ffn_down.weight", (16, 32))]:
        t(p + name, shape)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def cli(*args):
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"{args}: rc {p.returncode}\n{p.stderr}"
    return p.stdout


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_gguf")
    write_tiny(d / "tiny.gguf")
    cli("convert", d / "tiny.gguf", "-o", d / "hf")
    return d


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("transformers", reason="transformers not installed")


def test_merges_equal_transformers_generate_merges(tiny, tf):
    from transformers.tokenization_utils_base import generate_merges
    want = generate_merges({t: i for i, t in enumerate(TOKENS)}, dict(zip(TOKENS, SCORES)))
    merges = json.loads((tiny / "hf/tokenizer.json").read_text())["model"]["merges"]
    got = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]
    assert got == [tuple(m) for m in want]
    # The tie-break is exercised: "▁w"+"or" (left 2 code points) before "▁"+"wor".
    assert got.index((U + "w", "or")) < got.index((U, "wor"))


def test_token_ids_equal_transformers_gguf_tokenizer(tiny, tf):
    ref = tf.AutoTokenizer.from_pretrained(tiny, gguf_file="tiny.gguf")
    for t in TEXTS:
        ours = json.loads(cli("tokenize", tiny / "tiny.gguf", "--text", t, "--json"))["ids"]
        assert ours == ref(t, add_special_tokens=False)["input_ids"], repr(t)
    ours = json.loads(cli("tokenize", tiny / "tiny.gguf", "--text", "hi", "--bos", "--json"))
    assert ours["ids"] == ref("hi")["input_ids"]  # BOS added (llama.cpp's SentencePiece default)


def test_weights_equal_transformers_gguf_loader(tiny, tf):
    torch = pytest.importorskip("torch", reason="torch not installed")
    st = pytest.importorskip("safetensors.torch", reason="safetensors not installed")
    ref = tf.AutoModelForCausalLM.from_pretrained(tiny, gguf_file="tiny.gguf",
                                                  dtype=torch.float32).state_dict()
    ours = st.load_file(str(tiny / "hf/model.safetensors"))
    for name, t in ours.items():
        assert torch.equal(t, ref[name].to(torch.float32)), name
    # The permutation is not the identity on this model (the check above has teeth).
    r = gguf.GGUFReader(str(tiny / "tiny.gguf"))
    raw_q = next(np.array(x.data) for x in r.tensors if x.name == "blk.0.attn_q.weight")
    assert not np.array_equal(raw_q, ours["model.layers.0.self_attn.q_proj.weight"].numpy())


def test_every_model_command_takes_a_gguf(tiny, tmp_path):
    g = tiny / "tiny.gguf"
    text = tmp_path / "t.txt"
    text.write_text("the world in a hello world stack checks " * 40)
    ppl = json.loads(cli("ppl", g, "--text", text, "--ctx", 16, "--max-tokens", 64, "--json"))
    assert ppl["tokens"] > 0 and ppl["nll_per_token"] > 0
    gen = json.loads(cli("generate", g, "--prompt", "hello", "-n", 4, "--temperature", 0,
                         "--json"))
    assert gen["n_prompt_tokens"] >= 2
    cli("calibrate", g, "--text", text, "--nsamples", 2, "--seqlen", 16, "-o",
        tmp_path / "stats.safetensors")
    exp = json.loads(cli("experiment", g, "--eval", text, "--stats", tmp_path / "stats.safetensors",
                         "--max-tokens", 64, "--ctx", 16, "--methods", "absmax", "--settings",
                         "WA", "--no-gptq", "--no-errors", "--json"))
    assert exp
    q = tmp_path / "q"
    cli("quantize", g, "-o", q, "--quant", "W", "--method", "absmax")
    # The quantized checkpoint carries the GGUF's tokenizer and loads like the source.
    assert json.loads((q / "tokenizer.json").read_text()) == \
        json.loads((tiny / "hf/tokenizer.json").read_text())
    for t in TEXTS:
        a = json.loads(cli("tokenize", g, "--text", t, "--json"))["ids"]
        assert json.loads(cli("tokenize", q, "--text", t, "--json"))["ids"] == a
    qp = json.loads(cli("ppl", q, "--text", text, "--ctx", 16, "--max-tokens", 64, "--json"))
    assert qp["tokens"] == ppl["tokens"]


def test_unrecognised_and_truncated_files_are_named(tmp_path, tiny):
    bad = tmp_path / "notes.gguf"
    bad.write_text("just some text, not a model\n")
    for cmd in (["ppl", bad, "--text", bad], ["generate", bad], ["convert", bad, "-o",
                                                                 tmp_path / "o"]):
        p = subprocess.run([BIN, *map(str, cmd)], capture_output=True, text=True, timeout=60)
        assert p.returncode != 0
        assert f"{bad}: unrecognised model file" in p.stderr, p.stderr
    data = (tiny / "tiny.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:len(data) // 2])
    p = subprocess.run([BIN, "ppl", str(cut), "--text", str(bad)], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0
    assert f"{cut}: " in p.stderr and "unrecognised model file" not in p.stderr, p.stderr
