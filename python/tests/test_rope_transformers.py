"""RoPE types against transformers, end to end.

A tiny random LlamaForCausalLM is built by transformers for each rope type (default, linear,
llama3, yarn, dynamic), saved as a Hugging Face directory (config.json as transformers 5
writes it: rope_theta inside rope_parameters), and scored by `scalesweep ppl` and by
transformers itself on the same token ids: the NLLs must agree to float32 accuracy. A second
check shows the comparison can fail: every scaled type differs from the default by far more
than the tolerance. The yarn model is also written the transformers-4 way (rope_scaling +
top-level rope_theta) and must score the same.
"""
import json
import os
import shutil
import subprocess

import pytest

from cli_common import BIN, MODEL, VAL, need_bin, need_files

torch = pytest.importorskip("torch", reason="torch not installed (rope reference check)")
transformers = pytest.importorskip("transformers",
                                   reason="transformers not installed (rope reference check)")

pytestmark = [need_bin, need_files(MODEL, VAL)]
N = 320   # tokens scored (a window longer than the yarn/llama3 original context of 64)
TOL = 5e-5

ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
             "original_max_position_embeddings": 64},
    "yarn_betas": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                   "original_max_position_embeddings": 64, "beta_fast": 8.0, "beta_slow": 2.0,
                   "truncate": False, "attention_factor": 1.3},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
}


def run(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"{args}: rc={p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("rope")
    base = str(d / "base")
    run("convert", MODEL, "-o", base)  # for its tokenizer.json / tokenizer_config.json
    text = str(d / "text.txt")
    with open(VAL, encoding="utf-8") as f:
        open(text, "w", encoding="utf-8").write(f.read(6000))
    ids = json.loads(run("tokenize", base, "--file", text, "--bos", "--json"))["ids"][:N]
    assert len(ids) == N
    return d, base, text, ids


def build(d, base, name, rope):
    cfg = transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
        initializer_range=0.4, rope_parameters=dict(rope), bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)  # the same weights for every rope type
    model = transformers.LlamaForCausalLM(cfg).to(torch.float32).eval()
    out = str(d / name)
    model.save_pretrained(out, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(base, f), out)
    return model, out


def hf_nll(model, ids):
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(x).logits[0].double()
    return torch.nn.functional.cross_entropy(logits[:-1], x[0, 1:]).item()


def our_nll(path, text):
    j = json.loads(run("ppl", path, "--text", text, "--max-tokens", str(N), "--ctx", str(N),
                       "--bos", "--json"))
    assert j["tokens"] == N - 1
    return j["nll_per_token"]


def test_rope_types_match_transformers(setup):
    d, base, text, ids = setup
    ours, ref = {}, {}
    for name, rope in ROPES.items():
        model, path = build(d, base, name, rope)
        saved = json.load(open(os.path.join(path, "config.json")))
        assert saved["rope_parameters"]["rope_type"] == rope["rope_type"]
        assert "rope_theta" not in saved or saved.get("rope_theta") == 10000.0
        ref[name], ours[name] = hf_nll(model, ids), our_nll(path, text)
        assert abs(ours[name] - ref[name]) < TOL, (name, ours[name], ref[name])
    # The check is sensitive: each scaled type moves the NLL far beyond TOL. Dynamic NTK
    # only rescales past max_position_embeddings, so below it equals the default (in
    # transformers too).
    for name in ("linear", "llama3", "yarn", "yarn_betas"):
        assert abs(ref[name] - ref["default"]) > 20 * TOL, (name, ref)
    assert abs(ref["dynamic"] - ref["default"]) < TOL


def test_transformers4_layout_scores_the_same(setup):
    d, base, text, ids = setup
    model, path = build(d, base, "yarn4", ROPES["yarn"])
    cfg_path = os.path.join(path, "config.json")
    cfg = json.load(open(cfg_path))
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp.pop("rope_theta")
    rp["type"] = rp.pop("rope_type")
    cfg["rope_scaling"] = rp
    json.dump(cfg, open(cfg_path, "w"))
    assert abs(our_nll(path, text) - hf_nll(model, ids)) < TOL
