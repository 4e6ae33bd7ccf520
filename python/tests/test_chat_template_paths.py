"""The chat template, the generation config and the special tokens survive every output path
(issue 30 item 1; the struct is io/chat_meta.h):

  GGUF -> compressed-tensors   quantize SmolLM2.gguf -o DIR
  GGUF -> Hugging Face         convert SmolLM2.gguf -o DIR
  GGUF -> GGUF                 quantize SmolLM2.gguf -o OUT.gguf
  HF   -> GGUF                 quantize HF -o OUT.gguf
  HF   -> compressed-tensors   quantize HF -o DIR
  compressed-tensors -> GGUF   convert CT -o OUT.gguf
  NVFP4 GGUF -> CT             convert OUT.gguf -o DIR

Judged by transformers (apply_chat_template on the output gives the ids it gives on the source;
the same BOS/EOS/pad/unk and special tokens; GenerationConfig's eos ids) and by llama.cpp
(llama-cpp-python reads tokenizer.chat_template, the EOS/EOT ids and the sampling defaults
from our GGUF metadata, and tokenizes the rendered chat into the same ids).

The ids of a GGUF (source or output) are llama.cpp's tokenization of transformers' rendering
(skipped without llama-cpp-python): transformers' own GGUF tokenizer for SmolLM2 (tokenizer.ggml.pre "smollm") lacks the individual-digits
pre-tokenizer that llama.cpp and the original tokenizer.json apply, so on "And  3" it gives
[216, 216, 35] where llama.cpp (and our tokenizer.json) give [256, 35]. The rendered text is
compared with transformers in every case.

The HF source is SmolLM2 converted by us and then edited to look as transformers 5 saves an
Instruct model: the template only in chat_template.jinja, a generation_config.json with two EOS
ids and sampling defaults. Skips visibly without transformers, llama-cpp-python or the fixture.
"""
import functools
import json
import shutil
from pathlib import Path

import pytest

from cli_common import need_bin, run_ok

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"

transformers = pytest.importorskip("transformers", reason="transformers not installed "
                                   "(scripts/get-references.sh)")

pytestmark = [
    need_bin,
    pytest.mark.skipif(not FIXTURE.exists(),
                       reason=f"real-model fixture absent ({FIXTURE}; scripts/get-models.sh)"),
]

try:
    import llama_cpp
except ImportError:
    llama_cpp = None
need_llama_cpp = pytest.mark.skipif(llama_cpp is None,
                                    reason="llama_cpp not installed (scripts/get-llama-cpp.sh)")

CHATS = [
    [{"role": "user", "content": "Hi there"}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": "What is 2+2? <|im_end|> not a turn"},
     {"role": "assistant", "content": "4."},
     {"role": "user", "content": "And  3 + 3 ?\n\tnewline"}],
]
# The HF source's generation_config.json: two EOS ids (<|im_end|>, <|endoftext|>) and
# sampling defaults.
HF_GEN = {"bos_token_id": 1, "eos_token_id": [2, 0], "pad_token_id": 2, "do_sample": True,
          "temperature": 0.2, "top_p": 0.9, "top_k": 50, "repetition_penalty": 1.05}
SAMPLING = ("temperature", "top_p", "top_k", "repetition_penalty")


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    """Every output of the paths above (one quantize/convert run each)."""
    d = tmp_path_factory.mktemp("chat_paths")
    o = {"gguf_src": FIXTURE}
    o["gguf_ct"] = d / "gguf_ct"
    run_ok("quantize", FIXTURE, "-o", o["gguf_ct"])
    o["gguf_hf"] = d / "gguf_hf"
    run_ok("convert", FIXTURE, "-o", o["gguf_hf"], "--dtype", "bf16")
    o["gguf_gguf"] = d / "gguf.gguf"
    run_ok("quantize", FIXTURE, "-o", o["gguf_gguf"])
    # The HF source: transformers 5's layout (template in chat_template.jinja only).
    src = d / "hf_src"
    shutil.copytree(o["gguf_hf"], src)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (src / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    (src / "generation_config.json").write_text(json.dumps(HF_GEN, indent=2))
    o["hf_src"] = src
    o["hf_gguf"] = d / "hf.gguf"
    run_ok("quantize", src, "-o", o["hf_gguf"])
    o["hf_ct"] = d / "hf_ct"
    run_ok("quantize", src, "-o", o["hf_ct"])
    o["ct_gguf"] = d / "ct.gguf"  # compressed-tensors (from the HF source) -> GGUF
    run_ok("convert", o["hf_ct"], "-o", o["ct_gguf"])
    o["gguf_ct2"] = d / "gguf_ct2"  # that NVFP4 GGUF back to compressed-tensors
    run_ok("convert", o["ct_gguf"], "-o", o["gguf_ct2"])
    return o


@functools.lru_cache(maxsize=None)
def tokenizer(path):
    path = Path(path)
    if path.is_dir():
        return transformers.AutoTokenizer.from_pretrained(path)
    return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def chat_ids(tok, chat, gen=True):
    r = tok.apply_chat_template(chat, add_generation_prompt=gen, tokenize=True)
    return list(r["input_ids"] if hasattr(r, "keys") else r)


@functools.lru_cache(maxsize=None)
def llama_vocab(path):
    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


def ids_of(path, chat, gen):
    """The ids of `chat` on a model: transformers' apply_chat_template on a directory;
    llama.cpp's tokenization of transformers' rendering on a GGUF (see above)."""
    tok = tokenizer(path)
    if Path(path).is_dir():
        return chat_ids(tok, chat, gen)
    if llama_cpp is None:
        pytest.skip("llama_cpp not installed: no judge of GGUF ids "
                    "(transformers' GGUF tokenizer differs on digits)")
    text = tok.apply_chat_template(chat, add_generation_prompt=gen, tokenize=False)
    return llama_vocab(path).tokenize(text.encode(), add_bos=False, special=True)


# (output, its source): GGUF-born outputs against the fixture, HF-born against the HF source.
PATHS = [("gguf_ct", "gguf_src"), ("gguf_hf", "gguf_src"), ("gguf_gguf", "gguf_src"),
         ("hf_src", "gguf_src"), ("hf_gguf", "hf_src"), ("hf_ct", "hf_src"),
         ("ct_gguf", "hf_src"), ("gguf_ct2", "hf_src")]


@pytest.mark.parametrize("name,source", PATHS)
def test_apply_chat_template_same_ids(out, name, source):
    """Every chat renders to the same text and the same ids on output and source, with the
    same special tokens (BOS/EOS/pad/unk, the special set, skip_special_tokens)."""
    want, got = tokenizer(out[source]), tokenizer(out[name])
    assert got.chat_template == want.chat_template
    for chat in CHATS:
        for gen in (True, False):
            assert got.apply_chat_template(chat, add_generation_prompt=gen, tokenize=False) == \
                want.apply_chat_template(chat, add_generation_prompt=gen, tokenize=False)
            ids = ids_of(out[source], chat, gen)
            assert ids_of(out[name], chat, gen) == ids, (name, chat, gen)
            assert got.decode(ids, skip_special_tokens=True) == \
                want.decode(ids, skip_special_tokens=True)
    for attr in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert getattr(got, attr) == getattr(want, attr), attr
    assert set(got.all_special_tokens) == set(want.all_special_tokens)
    assert got.convert_tokens_to_ids("<|im_start|>") == want.convert_tokens_to_ids("<|im_start|>")


def hf_output_files(path):
    """The HF-side files a server reads: transformers 5's chat_template.jinja, and
    tokenizer_config.json's chat_template for older readers (llama.cpp's converter)."""
    tmpl = (path / "chat_template.jinja").read_text()
    assert json.loads((path / "tokenizer_config.json").read_text())["chat_template"] == tmpl
    return tmpl


@pytest.mark.parametrize("name", ["gguf_ct", "gguf_hf", "gguf_ct2"])
def test_hf_outputs_write_chat_template_jinja(out, name):
    src_tmpl = tokenizer(FIXTURE).chat_template
    assert hf_output_files(out[name]) == src_tmpl


def gen_config(path):
    return transformers.GenerationConfig.from_pretrained(path)


@pytest.mark.parametrize("name", ["gguf_ct", "gguf_hf"])
def test_generation_config_from_gguf(out, name):
    """A GGUF source's BOS/EOS/padding ids (SmolLM2: 1, 2, 2) in generation_config.json."""
    g = gen_config(out[name])
    assert (g.bos_token_id, g.eos_token_id, g.pad_token_id) == (1, 2, 2)
    assert g.temperature in (None, 1.0) and not g.do_sample  # the fixture has no defaults


@pytest.mark.parametrize("name", ["hf_ct", "gguf_ct2"])
def test_generation_config_from_hf(out, name):
    """The HF source's EOS list and sampling defaults reach compressed-tensors directly and
    through GGUF and back (GGUF has no do_sample key: that one field is lost on the way)."""
    g = json.loads((out[name] / "generation_config.json").read_text())
    assert g["eos_token_id"] == HF_GEN["eos_token_id"]
    assert (g["bos_token_id"], g["pad_token_id"]) == (1, 2)
    for k in SAMPLING:
        assert g[k] == HF_GEN[k], k
    assert gen_config(out[name]).eos_token_id == HF_GEN["eos_token_id"]
    if name == "hf_ct":
        assert g == HF_GEN  # copied as it is


@need_llama_cpp
@pytest.mark.parametrize("name,source", [("gguf_gguf", "gguf_src"), ("hf_gguf", "hf_src"),
                                         ("ct_gguf", "hf_src")])
def test_llama_cpp_reads_template_and_ids(out, name, source):
    """llama.cpp (vocab only) reads our GGUF's template, EOS (and EOT = the second EOS id of
    the HF source), padding and sampling defaults, and tokenizes the rendered chat (special
    tokens parsed) into transformers' ids."""
    want = tokenizer(out[source])
    llm = llama_vocab(out[name])
    md = llm.metadata
    assert md["tokenizer.chat_template"] == want.chat_template
    assert int(md["tokenizer.ggml.eos_token_id"]) == 2
    assert int(md["tokenizer.ggml.bos_token_id"]) == 1
    assert int(md["tokenizer.ggml.padding_token_id"]) == 2
    if source == "hf_src":
        assert int(md["tokenizer.ggml.eot_token_id"]) == 0
        assert float(md["general.sampling.temp"]) == pytest.approx(0.2)
        assert float(md["general.sampling.top_p"]) == pytest.approx(0.9)
        assert int(md["general.sampling.top_k"]) == 50
        assert float(md["general.sampling.penalty_repeat"]) == pytest.approx(1.05)
    else:
        assert "tokenizer.ggml.eot_token_id" not in md
        assert not any(k.startswith("general.sampling.") for k in md)
    for chat in CHATS:
        text = want.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        assert ids == ids_of(out[source], chat, True), chat
