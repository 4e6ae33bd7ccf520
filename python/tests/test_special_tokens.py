"""Special tokens in printed text (issue 30): `tokenize --decode` and `generate` print them as
nothing by default (transformers' pipelines and chat outputs) and as the vocabulary spells them
with --special (transformers' decode with skip_special_tokens=False), judged by transformers on
the SmolLM2 GGUF fixture's tokenizer."""
import os
import subprocess

import pytest

from cli_common import BIN, need_bin

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GGUF_DIR = os.path.join(ROOT, "models", "smollm2-135m")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF = os.path.join(GGUF_DIR, GGUF_NAME)
pytestmark = [need_bin, pytest.mark.skipif(not os.path.exists(GGUF),
                                           reason=f"SmolLM2 fixture absent ({GGUF})")]
CHAT = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"


def ours(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_decode_with_and_without_special_tokens_as_transformers():
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(GGUF_DIR, gguf_file=GGUF_NAME)
    ids = [int(x) for x in ours("tokenize", GGUF, "--text", CHAT).split()]
    assert ids == tok(CHAT, add_special_tokens=False)["input_ids"]
    args = ["tokenize", GGUF, "--decode", *map(str, ids)]
    kept = ours(*args, "--special")[:-1]  # the CLI ends the text with one newline
    skipped = ours(*args)[:-1]
    assert kept == tok.decode(ids, skip_special_tokens=False) == CHAT
    assert skipped == tok.decode(ids, skip_special_tokens=True)
    assert "<|im_start|>" in kept and "<|im_start|>" not in skipped


def test_generate_echoes_the_prompt_with_special_tokens_on_request():
    out = ours("generate", GGUF, "--prompt", CHAT, "-n", "2", "--temperature", "0", "--special")
    assert out.startswith(CHAT), out
    plain = ours("generate", GGUF, "--prompt", CHAT, "-n", "2", "--temperature", "0")
    assert "<|im_start|>" not in plain and plain.startswith("system\nBe brief.\nuser\nhi\n"), plain
