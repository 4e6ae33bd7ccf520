"""`scalesweep quantize --target-bpw B` (mixed precision by sensitivity), checked from outside.

On stories260K (its down_proj, K = 172, is dense in every layer whatever the budget):

- compressed-tensors: config.json's `ignore` lists exactly the Linears the JSON report chose
  (whole q/k/v and gate/up groups) plus the forced down_proj and lm_head; `inspect` reads those
  back as dense and the others as NVFP4; the compressed-tensors library (when importable)
  validates the config with the same list; the Linear tensors' bytes are the report's bits,
  within the budget; the runtime loads the checkpoint;
- GGUF with `--dense-dtype q8_0`: gguf-py reads the chosen Linears as Q8_0 and the others as
  NVFP4, and their bytes are the report's bits;
- `--keep-dense` with one layer's Linear by name;
- refusals: a target below 4.5, below the model's least, or without calibration.
"""

import json
import os

import pytest

from cli_common import run_cli as run

BIN = os.environ.get("SCALESWEEP_BIN")
DATA = os.environ.get("SS_SHARED_DATA_DIR", "")
MODEL = os.path.join(DATA, "models", "stories260K", "stories260K.bin")
TOK = os.path.join(DATA, "models", "stories260K", "tok512.bin")
TEXT = os.path.join(DATA, "text", "tinystories_val.txt")

pytestmark = [
    pytest.mark.skipif(not BIN, reason="SCALESWEEP_BIN not set (run through ctest)"),
    pytest.mark.skipif(not os.path.exists(MODEL),
                       reason=f"stories260K not found under SS_SHARED_DATA_DIR={DATA!r}"),
]

CALIB = ["--calib", TEXT, "--nsamples", "4", "--seqlen", "64", "--method", "sweep-wmse"]
LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
GGUF_LINEARS = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]


def chosen(report):
    return {n for s in report["mixed"]["steps"] for n in s["linears"]}


def test_checkpoint_ignore_inspect_and_bits(tmp_path):
    out = tmp_path / "ct"
    rep = json.loads(run("quantize", MODEL, "-o", out, *CALIB, "--dense-dtype", "bf16",
                         "--target-bpw", "8.5", "--json").stdout)
    mixed = rep["mixed"]
    dense = chosen(rep)
    assert dense, "the budget was expected to keep some Linears dense"
    assert mixed["bits"] <= mixed["budget_bits"]
    assert mixed["target_bpw"] == 8.5 and mixed["sensitivity"] == "relative"
    assert rep["phases"]["sensitivity"] > 0  # the phase is reported when it ran
    n_layers = json.loads((out / "config.json").read_text())["num_hidden_layers"]
    # vLLM's fused groups: q/k/v and gate/up of a layer all or none.
    for l in range(n_layers):
        p = f"model.layers.{l}."
        for group in (LINEARS[0:3], LINEARS[4:6]):
            assert len({p + g in dense for g in group}) == 1, (l, group, sorted(dense))
    forced = {f"model.layers.{l}.mlp.down_proj" for l in range(n_layers)}
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert sorted(qc["ignore"][:-1]) == sorted(dense | forced)
    assert qc["ignore"][-1] == "lm_head"
    assert {r["name"] for r in rep["linears"] if r["dense"]} == dense | forced
    ins = json.loads(run("inspect", out, "--json").stdout)
    assert set(ins["dense"]) == dense | forced
    assert {r["name"] for r in ins["linears"]} == {
        f"model.layers.{l}.{n}" for l in range(n_layers) for n in LINEARS} - dense - forced
    # The Linear weight tensors' bytes, as the budget counts them.
    from safetensors import safe_open
    bits = 0
    with safe_open(str(out / "model.safetensors"), "np") as f:
        sizes = {}
        for k in f.keys():
            sl = f.get_slice(k)
            n = 1
            for d in sl.get_shape():
                n *= d
            sizes[k] = n * {"BF16": 2, "U8": 1, "F8_E4M3": 1, "F32": 4}[sl.get_dtype()]
    for l in range(n_layers):
        for n in LINEARS:
            m = f"model.layers.{l}.{n}"
            bits += 8 * (sizes[m + ".weight"] if m in dense | forced else
                         sizes[m + ".weight_packed"] + sizes[m + ".weight_scale"])
    assert bits == mixed["bits"]
    try:
        from compressed_tensors.quantization import QuantizationConfig
    except ImportError:
        pass
    else:
        assert list(QuantizationConfig.model_validate(qc).ignore) == qc["ignore"]
    ppl = json.loads(run("ppl", out, "--text", TEXT, "--max-tokens", "300", "--json").stdout)
    assert ppl["nll_per_token"] > 0


def test_gguf_types_and_bits(tmp_path):
    gguf = pytest.importorskip("gguf")
    out = tmp_path / "m.gguf"
    rep = json.loads(run("quantize", MODEL, "--tokenizer", TOK, "-o", out, *CALIB,
                         "--dense-dtype", "q8_0", "--target-bpw", "8", "--json").stdout)
    dense = chosen(rep)
    assert dense and not any(n.endswith("ffn_down") for n in dense)
    r = gguf.GGUFReader(str(out))
    bits = 0
    seen = 0
    for t in r.tensors:
        parts = t.name.split(".")
        if len(parts) != 4 or parts[3] != "weight" or parts[2] not in GGUF_LINEARS:
            continue
        seen += 1
        name = ".".join(parts[:3])
        want = ("F16" if parts[2] == "ffn_down" else  # 172 columns: no Q8_0 either
                "Q8_0" if name in dense else "NVFP4")
        assert t.tensor_type.name == want, name
        bits += 8 * int(t.n_bytes)
    assert seen == len(rep["linears"])
    assert bits == rep["mixed"]["bits"] <= rep["mixed"]["budget_bits"]


def test_keep_dense_names_one_layer(tmp_path):
    """--keep-dense takes one layer's Linear by the report's names (GGUF and HF spellings)."""
    gguf = pytest.importorskip("gguf")
    out = tmp_path / "one.gguf"
    rep = json.loads(run("quantize", MODEL, "--tokenizer", TOK, "-o", out, "--dense-dtype",
                         "q8_0", "--keep-dense", "blk.1.attn_v,model.layers.3.self_attn.q_proj",
                         "--json").stdout)
    dense = {r["name"] for r in rep["linears"] if r["dense"]}
    assert dense == {f"model.layers.{l}.mlp.down_proj" for l in range(5)} | {
        "model.layers.1.self_attn.v_proj", "model.layers.3.self_attn.q_proj"}
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(out)).tensors}
    assert types["blk.1.attn_v.weight"] == "Q8_0" and types["blk.3.attn_q.weight"] == "Q8_0"
    assert types["blk.0.attn_v.weight"] == "NVFP4" and types["blk.1.attn_q.weight"] == "NVFP4"
    assert "blk.1.attn_v.scale" not in types and "blk.0.attn_v.scale" in types
    p = run("quantize", MODEL, "--tokenizer", TOK, "-o", tmp_path / "x.gguf", "--keep-dense",
            "blk.9.ffn_up", ok=False)
    assert ("--keep-dense: model.layers.9.mlp.up_proj: the model has 5 layers (0..4)"
            in p.stderr), p.stderr
    p = run("quantize", MODEL, "--tokenizer", TOK, "-o", tmp_path / "x.gguf", "--keep-dense",
            "blk.1.mlp.up_proj", ok=False)
    assert "--keep-dense 'blk.1.mlp.up_proj': expected a Linear for every layer" in p.stderr


def test_refusals(tmp_path):
    out = tmp_path / "never.gguf"
    p = run("quantize", MODEL, "--tokenizer", TOK, "-o", out, *CALIB, "--target-bpw", "4.4",
            ok=False)
    assert p.returncode != 0
    assert "--target-bpw: 4.4 bits per weight is below NVFP4's 4.5" in p.stderr, p.stderr
    p = run("quantize", MODEL, "--tokenizer", TOK, "-o", out, "--target-bpw", "6", ok=False)
    assert "--target-bpw: mixed precision measures each Linear's sensitivity" in p.stderr, p.stderr
    p = run("quantize", MODEL, "--tokenizer", TOK, "-o", out, *CALIB, "--dense-dtype", "q8_0",
            "--target-bpw", "5", ok=False)
    assert "--target-bpw: 5 bits per weight is below this model's least: 7.2" in p.stderr, p.stderr
    p = run("quantize", MODEL, "--tokenizer", TOK, "-o", out, *CALIB, "--target-bpw", "8",
            "--sensitivity", "bogus", ok=False)
    assert "--sensitivity: unknown sensitivity 'bogus'" in p.stderr, p.stderr
    assert not out.exists()
    assert "(default" not in run("quantize", "--help").stdout
