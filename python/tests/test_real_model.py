"""A real model end to end: SmolLM2-135M-Instruct (Q4_1 GGUF, Llama architecture, byte-level
BPE with the "smollm" pre-tokenizer, tied embeddings), installed by scripts/get-models.sh.

(a) `scalesweep ppl MODEL.gguf` gives a plausible NLL on WikiText-2;
(b) our token ids (from the GGUF metadata) equal those of transformers' tokenizer loaded from
    the directory `scalesweep convert MODEL.gguf -o DIR` writes, on WikiText and on
    unicode / digit / whitespace / special-token cases;
(c) the fp32 NLL of our runtime on the GGUF equals transformers' on the converted directory
    (same token windows: fresh sequences of CTX tokens, no BOS, as the file's add_bos_token =
    false) to 1e-4 nats/token;
(d) greedy generation (temperature 0) gives the same tokens as transformers' greedy generate;
(e) the weights we dequantize and unpermute equal transformers' own GGUF loader's
    (`from_pretrained(..., gguf_file=...)`, which dequantizes with its own code and undoes
    llama.cpp's q/k permutation independently of ours).

Everything skips visibly without the fixture; (b)-(e) without torch + transformers.
"""
import json
from pathlib import Path

import pytest

from cli_common import (check_greedy_equal, check_token_ids, check_wiki_nll, need_bin, need_wiki,
                        run_json, wiki_text)

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"

need_fixture = pytest.mark.skipif(
    not FIXTURE.exists(), reason=f"real-model fixture absent ({FIXTURE}; scripts/get-models.sh)")

CTX = 64
MAX_TOKENS = 4 * CTX  # four windows: small enough for 2 cores

pytestmark = [need_bin, need_fixture]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2") / "hf"
    j = run_json("convert", FIXTURE, "-o", out)
    assert j["source_format"] == "gguf"
    assert j["architecture"] == "LlamaForCausalLM"
    assert j["vocab"] == 49152
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_theta"] == 100000
    assert cfg["num_key_value_heads"] == 3 and cfg["num_attention_heads"] == 9
    assert cfg["tie_word_embeddings"] is True
    return out


@pytest.fixture(scope="module")
def torch_tf():
    torch = pytest.importorskip("torch", reason="torch not installed (transformers checks)")
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    torch.set_num_threads(2)
    return torch, transformers


@pytest.fixture(scope="module")
def hf_model(hf_dir, torch_tf):
    torch, transformers = torch_tf
    m = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    m.eval()
    return m


@pytest.fixture(scope="module")
def hf_tok(hf_dir, torch_tf):
    _, transformers = torch_tf
    return transformers.AutoTokenizer.from_pretrained(hf_dir)


def our_ids(text):
    return run_json("tokenize", FIXTURE, "--text", text)["ids"]


@need_wiki
def test_ppl_on_wikitext_is_plausible(tmp_path):
    f = tmp_path / "wiki.txt"
    f.write_text(wiki_text(), encoding="utf-8")
    j = run_json("ppl", FIXTURE, "--text", f, "--ctx", CTX, "--max-tokens", MAX_TOKENS,
                 "--no-bos")
    assert j["tokens"] == MAX_TOKENS - 4  # each window predicts CTX - 1 tokens
    # A 135M model on WikiText-2: perplexity in the tens (a broken model or tokenizer gives
    # hundreds or more; the uniform distribution gives ln 49152 = 10.8 nats).
    assert 1.5 < j["nll_per_token"] < 4.5, j


TEXTS = [
    "Hello world",
    "The year 2024 had 366 days; pi = 3.14159265.",
    "  leading and trailing spaces   ",
    "tabs\tand\nnewlines\n\n\r\n  indented",
    "caf\u00e9 na\u00efve \u00fcber \u00c5ngstr\u00f6m",
    "\u4e2d\u6587\u5b57\u7b26 \u65e5\u672c\u8a9e \ud55c\uad6d\uc5b4",
    "emoji \U0001F600\U0001F680 and \u2603 snowman",
    "<|im_start|>user\nWhat is 12+34?<|im_end|>\n<|im_start|>assistant\n",
    "don't won't I'm you're we'll they've it's",
    "12345678901234567890 1,000,000 0.001",
    "\u0661\u0662\u0663 \u0968\u0969 \u2167",  # non-ASCII digits (Arabic-Indic, Devanagari, Roman)
]


def test_token_ids_equal_transformers(hf_tok):
    # The file's add_bos_token is false: no BOS of the tokenizer's own either.
    check_token_ids(hf_tok, our_ids, TEXTS)


@need_wiki
def test_fp_nll_equals_transformers(tmp_path, hf_model, torch_tf):
    torch, _ = torch_tf
    check_wiki_nll(FIXTURE, hf_model, torch, our_ids, tmp_path, CTX, MAX_TOKENS,
                   "SmolLM2-135M Q4_1", "--no-bos")


PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]


def test_greedy_generation_equals_transformers(hf_model, hf_tok, torch_tf):
    torch, _ = torch_tf
    check_greedy_equal(FIXTURE, hf_model, hf_tok, torch, PROMPTS)


def test_weights_equal_transformers_gguf_loader(hf_dir, torch_tf):
    torch, transformers = torch_tf
    st = pytest.importorskip("safetensors.torch", reason="safetensors not installed")
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        FIXTURE.parent, gguf_file=FIXTURE.name, dtype=torch.float32).state_dict()
    ours = st.load_file(str(hf_dir / "model.safetensors"))
    assert "lm_head.weight" not in ours  # tied
    for name, t in ours.items():
        assert name in ref, name
        r = ref[name].to(torch.float32)
        assert r.shape == t.shape, name
        # Both dequantize the same blocks in fp32 (bitwise for Q8_0/F32; Q4_1 d*q+m may
        # round differently under fused multiply-add).
        assert torch.allclose(t, r, rtol=0, atol=1e-6), (name, float((t - r).abs().max()))


def test_generate_echoes_the_whole_prompt_without_bos():
    # SmolLM2's tokenizer adds no BOS: the echoed prompt must still begin with its first token
    # (it used to start at the second, as if the first were BOS).
    prompt = "The capital of France is"
    for bos in ([], ["--bos"]):
        j = run_json("generate", FIXTURE, "--prompt", prompt, "-n", "2", "--temperature", "0",
                     *bos, "--json")
        assert j["text"].startswith(prompt), (bos, j["text"])
