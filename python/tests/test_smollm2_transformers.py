"""SmolLM2-135M-Instruct (the real-model fixture, a Q4_1 GGUF) against transformers.

transformers dequantizes the GGUF and writes a Hugging Face directory the way transformers 5
does (rope_theta 100000 only inside rope_parameters; a tokenizer that adds no BOS). `ppl` on
that directory must read rope_theta from rope_parameters, follow the tokenizer's BOS policy,
and score the NLL transformers computes on the same token ids.
"""
import json
import os
import subprocess
import sys

import pytest

from cli_common import BIN, VAL, need_bin, need_files

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../bench"))
from gguf_dense import dense_from_gguf  # noqa: E402  (bench/gguf_dense.py)

torch = pytest.importorskip("torch", reason="torch not installed (SmolLM2 reference check)")
transformers = pytest.importorskip("transformers",
                                   reason="transformers not installed (SmolLM2 reference check)")
pytest.importorskip("gguf", reason="gguf not installed (transformers reads the GGUF with it)")

GGUF = os.path.join(os.path.dirname(__file__), "../../models/smollm2-135m/"
                    "SmolLM2-135M-Instruct.Q4_1.gguf")
pytestmark = [need_bin, need_files(GGUF, VAL)]
N = 256


def run(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, f"{args}: rc={p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout


def test_smollm2_hf_dir_matches_transformers(tmp_path):
    tok, plain = dense_from_gguf(GGUF, make=transformers.LlamaForCausalLM)
    out = str(tmp_path / "smollm2")
    plain.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    saved = json.load(open(os.path.join(out, "config.json")))
    assert saved["rope_parameters"]["rope_theta"] == 100000.0 and "rope_theta" not in saved

    text = str(tmp_path / "text.txt")
    with open(VAL, encoding="utf-8") as fh:
        open(text, "w", encoding="utf-8").write(fh.read(4000))
    ids = tok(open(text, encoding="utf-8").read())["input_ids"][:N]
    assert ids[0] != tok.bos_token_id  # this tokenizer adds no BOS
    ours_ids = json.loads(run("tokenize", out, "--file", text, "--json"))["ids"][:N]
    assert ours_ids == ids

    j = json.loads(run("ppl", out, "--text", text, "--max-tokens", str(N), "--ctx", str(N),
                       "--json"))
    assert j["bos"] is False and j["tokens"] == N - 1
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = plain(x).logits[0].double()
    ref = torch.nn.functional.cross_entropy(logits[:-1], x[0, 1:]).item()
    print(f"SmolLM2 NLL/token: ours {j['nll_per_token']:.8f}, transformers {ref:.8f}")
    assert abs(j["nll_per_token"] - ref) < 1e-4, (j["nll_per_token"], ref)
    # rope_theta 10000 (the old default) would be far off: the check can fail.
    bad = os.path.join(out, "config.json")
    saved["rope_parameters"]["rope_theta"] = 10000.0
    json.dump(saved, open(bad, "w"))
    j10k = json.loads(run("ppl", out, "--text", text, "--max-tokens", str(N), "--ctx", str(N),
                          "--json"))
    assert abs(j10k["nll_per_token"] - ref) > 1e-2
