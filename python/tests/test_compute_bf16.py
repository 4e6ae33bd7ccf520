"""`--compute bf16` (bf16 prefill matrix products, model::Compute::kBF16) against the fp32
default: the NLL moves by the rounding of activations and weights to bf16, no more; and on
the SmolLM2 fixture it lands close to transformers' bf16 NLL.

Tolerances: with bf16 operands (relative rounding 2^-9 per operand, fp32 accumulation) the
mean NLL moves by ~1e-3 nats (measured: stories260K 6.2e-4 over ~2000 tokens, SmolLM2-135M
1.3e-3 to 2.3e-3 over 255 tokens: a last-bit change in an fp32 activation can flip its bf16
rounding, so the figure moves with any fp32 detail upstream, e.g. the attention's threading);
0.02 nats is ~10x that and still ~1/10 of what 4-bit quantization costs these models.
transformers (GGUF loaded in bf16: activations rounded to bf16 between ops) lands 2.5e-4 to
1.3e-3 nats from ours with --compute bf16; the check allows 0.01.
"""
import json
import os

import pytest

from cli_common import MODEL, TOK, VAL, need_bin, need_data, need_files, run_cli

GGUF = os.path.join(os.path.dirname(__file__), "../../models/smollm2-135m/"
                    "SmolLM2-135M-Instruct.Q4_1.gguf")


def run(*args, check=True):
    return run_cli(*args, ok=check, timeout=900)


def ppl(model, *extra):
    return json.loads(run("ppl", model, *extra, "--json").stdout)


@need_bin
@need_data
def test_stories260k_bf16_close_to_fp32():
    common = ["--tokenizer", TOK, "--text", VAL, "--max-tokens", "2048", "--ctx", "256"]
    f = ppl(MODEL, *common)
    b = ppl(MODEL, *common, "--compute", "bf16")
    assert f["compute"] == "fp32" and b["compute"] == "bf16"
    assert f["tokens"] == b["tokens"] > 2000
    d = abs(b["nll_per_token"] - f["nll_per_token"])
    print(f"stories260K NLL fp32 {f['nll_per_token']:.6f} bf16 {b['nll_per_token']:.6f} "
          f"diff {d:.2e}")
    assert d < 0.02, (f["nll_per_token"], b["nll_per_token"])
    assert b["nll_per_token"] != f["nll_per_token"]  # the mode is in effect
    # The default is the fp32 path: an explicit --compute fp32 gives the same bits.
    assert ppl(MODEL, *common, "--compute", "fp32")["nll_per_token"] == f["nll_per_token"]
    g = json.loads(run("generate", MODEL, "--tokenizer", TOK, "--prompt", "Once upon a time",
                       "--steps", "8", "--temperature", "0", "--json", "--compute",
                       "bf16").stdout.strip().splitlines()[-1])
    assert g["compute"] == "bf16"


@need_bin
@need_data
def test_unknown_compute_refused():
    p = run("ppl", MODEL, "--tokenizer", TOK, "--text", VAL, "--compute", "fp16", check=False)
    assert p.returncode != 0
    assert "unknown compute mode 'fp16' (accepted: fp32, bf16)" in p.stderr, p.stderr


@need_bin
@need_files(GGUF, VAL)
def test_smollm2_bf16_close_to_fp32_and_transformers(tmp_path):
    torch = pytest.importorskip("torch", reason="torch not installed (transformers bf16 NLL)")
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    pytest.importorskip("gguf", reason="gguf not installed (transformers reads the GGUF)")
    n = 256
    text = str(tmp_path / "text.txt")
    with open(VAL, encoding="utf-8") as fh:
        open(text, "w", encoding="utf-8").write(fh.read(4000))
    common = ["--text", text, "--max-tokens", str(n), "--ctx", str(n)]
    f = ppl(GGUF, *common)
    b = ppl(GGUF, *common, "--compute", "bf16")
    assert b["compute"] == "bf16" and f["tokens"] == b["tokens"] == n - 1

    d, name = os.path.split(os.path.abspath(GGUF))
    tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=name)
    m = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=name,
                                                          dtype=torch.bfloat16).eval()
    ids = tok(open(text, encoding="utf-8").read(), add_special_tokens=False)["input_ids"]
    if f["bos"]:
        ids = [tok.bos_token_id] + ids
    ids = ids[:n]
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = m(x).logits[0].double()
    hf = torch.nn.functional.cross_entropy(logits[:-1], x[0, 1:]).item()
    ours_b, ours_f = b["nll_per_token"], f["nll_per_token"]
    print(f"SmolLM2 NLL fp32 {ours_f:.6f}, --compute bf16 {ours_b:.6f} "
          f"(diff {ours_b - ours_f:+.2e}), transformers bf16 {hf:.6f} (vs ours bf16 "
          f"{hf - ours_b:+.2e})")
    assert abs(ours_b - ours_f) < 0.02
    assert ours_b != ours_f
    assert abs(hf - ours_b) < 0.01
