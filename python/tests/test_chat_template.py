"""The chat templates scalesweep renders in C++ (model/chat_template.h) against transformers.

src/model/testdata/chat_templates.json holds each supported template's text (with its source),
message lists and the rendering transformers' tokenizer.apply_chat_template gives for them,
with and without add_generation_prompt; src/model/chat_template_test.cc checks that the C++
renderer gives the same strings, this test that transformers still does (so C++ == file ==
transformers), and that the SmolLM2 entry is the template the project's GGUF fixture carries.

    python3 python/tests/test_chat_template.py --write   # regenerates the expected strings
"""
import json
import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURE = os.path.join(ROOT, "src", "model", "testdata", "chat_templates.json")
GGUF = os.path.join(ROOT, "models", "smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf")

QWEN25 = None  # filled from the fixture

MESSAGES = [
    [{"role": "system", "content": "You answer questions."},
     {"role": "user", "content": "Question: What is 2+2?\nAnswer:"}],
    [{"role": "user", "content": "Question: Which is heavier?\nAnswer:"}],
    # lm-eval's few-shot as turns, with the mmlu description as the system message
    [{"role": "system", "content": "The following are questions about x.\n\n"},
     {"role": "user", "content": "Q: one?\nA:"}, {"role": "assistant", "content": "1"},
     {"role": "user", "content": "Q: two?\nA:"}],
    # whitespace at both ends (Llama-3's `| trim`), a no-break space, non-ASCII
    [{"role": "user", "content": " \n\u00a0Caf\u00e9: \u00bfqu\u00e9?  \t\n"}],
]


def render(text, bos, messages, gen):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")),
        bos_token=bos or None)
    tok.chat_template = text
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)


def expected_cases(templates):
    out = []
    for t in templates:
        for i, m in enumerate(MESSAGES):
            for gen in (False, True):
                out.append({"template": t["name"], "messages": m, "add_generation_prompt": gen,
                            "expected": render(t["text"], t.get("bos_token"), m, gen)})
    return out


def test_transformers_renders_the_fixture():
    pytest.importorskip("transformers")
    fx = json.load(open(FIXTURE, encoding="utf-8"))
    by_name = {t["name"]: t for t in fx["templates"]}
    assert len(fx["cases"]) == len(fx["templates"]) * len(MESSAGES) * 2
    for c in fx["cases"]:
        t = by_name[c["template"]]
        got = render(t["text"], t.get("bos_token"), c["messages"], c["add_generation_prompt"])
        assert got == c["expected"], (c["template"], c["messages"])


def test_smollm2_fixture_is_the_gguf_template():
    if not os.path.exists(GGUF):
        pytest.skip(f"{GGUF} absent")
    gguf = pytest.importorskip("gguf")
    r = gguf.GGUFReader(GGUF)
    f = r.fields["tokenizer.chat_template"]
    text = bytes(f.parts[f.data[0]]).decode("utf-8")
    fx = json.load(open(FIXTURE, encoding="utf-8"))
    assert text == {t["name"]: t for t in fx["templates"]}["smollm2"]["text"]


if __name__ == "__main__" and "--write" in sys.argv:
    fx = json.load(open(FIXTURE, encoding="utf-8"))
    fx["cases"] = expected_cases(fx["templates"])
    with open(FIXTURE, "w", encoding="utf-8") as f:
        json.dump(fx, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{FIXTURE}: {len(fx['cases'])} cases")
