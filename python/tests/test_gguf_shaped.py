"""bench/gguf_shaped.py (synthetic GGUFs with a real model's shapes, llama.cpp's Q4_K_M type mix
and a real tokenizer) on its `tiny` preset: 2 qwen3 layers of embedding 256, the 151,936-token
tokenizer of the Qwen2.5-Coder-1.5B fixture (scripts/get-qwen2-1.5b.sh; skips visibly where it
is absent). Checks: the random Q4_K/Q6_K blocks decode (gguf-py's dequantizers) to finite
weights of std ~0.02 with the 6-bit scales where the script put them; `scalesweep inspect`
lists the Q4_K_M mix (2 layers: blk.1's attn_v and ffn_down, and output, in Q6_K) and the
copied tokenizer keys; `ppl` gives a finite NLL near log(vocab); a vocabulary mismatch is
refused by name. About 15 s (reading the fixture's tokenizer with GGUFReader dominates)."""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cli_common import WIKI, need_bin, need_wiki, run_json, run_ok

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench/gguf_shaped.py"
FIXTURE = ROOT / "models/qwen2.5-coder-1.5b/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
SMOL = ROOT / "models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"

gguf = pytest.importorskip("gguf", reason="gguf (gguf-py) not installed")
need_fixture = pytest.mark.skipif(
    not FIXTURE.exists(), reason=f"1.5B fixture absent ({FIXTURE}; scripts/get-qwen2-1.5b.sh)")

sys.path.insert(0, str(ROOT / "bench"))
import gguf_shaped  # noqa: E402


def test_blocks_decode_to_the_intended_weights():
    rng = np.random.default_rng(1)
    q4 = gguf_shaped.q4_k_blocks(rng, 512, 0.02)
    q6 = gguf_shaped.q6_k_blocks(rng, 512, 0.02)
    assert q4.shape == (512, gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q4_K][1])
    assert q6.shape == (512, gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q6_K][1])
    sc, mn = gguf.quants.Q4_K.get_scale_min(q4[:, 4:16])
    assert sc.min() >= 32 and sc.max() <= 63
    assert np.abs(mn.astype(int) - sc.astype(int)).max() <= 2
    for blocks, qt in ((q4, gguf.GGMLQuantizationType.Q4_K),
                       (q6, gguf.GGMLQuantizationType.Q6_K)):
        w = gguf.quants.dequantize(blocks.reshape(-1), qt)
        assert np.isfinite(w).all()
        assert abs(w.std() - 0.02) < 0.002, qt.name
        assert abs(w.mean()) < 0.002, qt.name


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("gguf_shaped") / "tiny.gguf"
    p = subprocess.run([sys.executable, SCRIPT, out, "--preset", "tiny", "--layers", "2",
                        "--tokenizer-from", FIXTURE], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    return out


@need_bin
@need_fixture
def test_inspect_lists_the_q4_k_m_mix_and_the_tokenizer(tiny):
    j = json.loads(run_ok("inspect", tiny, "--json"))  # several lines
    types = {t["name"]: t["type"] for t in j["tensors"]}
    counts = {k: list(types.values()).count(k) for k in set(types.values())}
    # 2 layers x 11 tensors + token_embd, output_norm, output; Q6_K: output and, for n = 2
    # (use_more_bits: i >= 7n/8 = 1), the second attn_v and ffn_down.
    assert counts == {"Q4_K": 13, "Q6_K": 3, "F32": 9}
    assert {n for n, t in types.items() if t == "Q6_K"} == {
        "output.weight", "blk.1.attn_v.weight", "blk.1.ffn_down.weight"}
    assert types["token_embd.weight"] == "Q4_K"
    shapes = {t["name"]: t["ne"] for t in j["tensors"]}
    assert shapes["token_embd.weight"] == [256, 151936]
    assert shapes["blk.0.attn_k.weight"] == [256, 128]
    assert shapes["blk.0.attn_q_norm.weight"] == [64]
    assert shapes["blk.0.ffn_down.weight"] == [512, 256]
    # The tokenizer keys, types and values (whole arrays) as the fixture's; read with
    # `inspect --json` (GGUFReader takes ~9 s per file on the 151,936 tokens and merges).
    meta = {m["key"]: m for m in j["metadata"]}
    src = [m for m in json.loads(run_ok("inspect", FIXTURE, "--json"))["metadata"]
           if m["key"].startswith("tokenizer.")]
    assert {"tokenizer.ggml.merges", "tokenizer.chat_template"} <= {m["key"] for m in src}
    for m in src:
        assert meta[m["key"]] == m, m["key"]
    assert meta["general.architecture"]["value"] == "qwen3"
    assert meta["general.file_type"]["value"] == 15  # MOSTLY_Q4_K_M
    data = np.memmap(tiny, np.uint8, mode="r")
    for t in j["tensors"]:
        start = j["data_offset"] + t["offset"]
        qt = gguf.GGMLQuantizationType[t["type"]]
        w = gguf.quants.dequantize(np.asarray(data[start:start + t["nbytes"]]), qt)
        assert np.isfinite(w).all(), t["name"]
        if t["type"] == "F32":
            mean = 0.0 if t["name"].endswith(".bias") else 1.0
            assert abs(w.mean() - mean) < 0.01, t["name"]
        else:
            assert 0.015 < w.std() < 0.025, t["name"]


@need_bin
@need_fixture
@need_wiki
def test_ppl_is_finite(tiny):
    r = run_json("ppl", tiny, "--text", WIKI, "--ctx", 64, "--max-tokens", 128)
    assert r["tokens"] == 126
    assert math.isfinite(r["nll_per_token"])
    # Random weights: about the uniform distribution's log(151936) = 11.93 nats/token.
    assert 10 < r["nll_per_token"] < 16


@need_fixture
@pytest.mark.skipif(not SMOL.exists(), reason=f"SmolLM2 fixture absent ({SMOL})")
def test_vocabulary_mismatch_is_refused(tmp_path):
    out = tmp_path / "x.gguf"
    p = subprocess.run([sys.executable, SCRIPT, out, "--layers", "1", "--tokenizer-from", SMOL],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "151936" in p.stderr and "49152" in p.stderr
    assert not out.exists()
