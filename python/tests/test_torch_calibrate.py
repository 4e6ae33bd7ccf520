"""scalesweep.torch.calibrate: the statistics `scalesweep calibrate` writes, computed with hooks
on a transformers model (python/scalesweep/torch/calibrate.py).

- SmolLM2-135M (GGUF loaded by transformers in float32, CPU) and stories260K (llama2.c,
  converted to a Hugging Face directory by `scalesweep convert`; its tokenizer adds BOS, so
  this one covers the BOS path): the CLI's `calibrate --nsamples N --seqlen S --seed X` and
  calibrate(model, calibration_windows(ids, N, S, X, bos)) on the CLI's own token ids
  (`scalesweep tokenize --json`) give the same file: the same tensor names, dtypes and shapes,
  the same token counts and metadata, and every value within a relative 1e-4 of the tensor's
  largest magnitude (max |py - cli| / max |cli|, per tensor; full ΣxxT matrices compared through
  safetensors). Measured (2 cores, CPU): SmolLM2 at most 3.2e-6 (mlp_out amax; ΣxxT <= 1.6e-6),
  stories260K at most ~1e-6 (the printed figures). The differences are float32 forward-pass
  rounding (transformers' kernels vs ours), not sampling: a wrong window gives differences of
  order 1. The windows themselves are checked against splitmix64's published first outputs.
- The native loader accepts the Python file: `scalesweep ppl --quant WA --method sweep-wmse
  --stats PYFILE` runs. (Its NLL is not compared with the CLI file's: on SmolLM2 with 128
  calibration tokens a 3e-6 relative change of the amax values alone moves the WA NLL by
  0.02 to 0.07 nats, as NVFP4 block scales flip their FP8 rounding.)
- Tiny random Llama (GQA), Qwen2 (q/k/v biases) and Qwen3 (q/k norm, head_dim != hidden /
  heads): shapes, token counts, ΣxxT against an independent computation, [B, T] batches,
  nsamples, errors (seqlen mismatch, output with xtx=False, NaN activations naming the layer
  and input), the in-memory Stats usable by simulate(), and an unknown architecture (GPT-2)
  refused by name.
- On a CUDA device (skipped without one): the same statistics as on the CPU.

Skips visibly without torch / transformers / gguf / safetensors, without the CLI
(SCALESWEEP_BIN) and without the fixtures.
"""
import json
import os
import subprocess
import time

import numpy as np
import pytest

from cli_common import BIN, MODEL, TOK, VAL, need_bin, need_data, need_files

torch = pytest.importorskip("torch", reason="torch not installed (scripts/get-references.sh)")
transformers = pytest.importorskip("transformers", reason="transformers not installed")
pytest.importorskip("safetensors", reason="safetensors not installed")
try:
    import scalesweep.torch as sst
except ImportError as e:  # pragma: no cover - depends on the build
    pytest.skip(f"scalesweep.torch not importable ({e})", allow_module_level=True)
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

GGUF = os.path.join(os.path.dirname(__file__), "../../models/smollm2-135m/"
                    "SmolLM2-135M-Instruct.Q4_1.gguf")
REL_TOL = 1e-4


def run(*args):
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"{args}: rc={p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout


def cli_ids(tokenizer, text):
    return json.loads(run("tokenize", tokenizer, "--file", text, "--json"))["ids"]


def compare_files(cli, py):
    """Asserts the two statistics files agree; returns {kind: (max abs, max rel, tensor)}."""
    a, b = load_file(cli), load_file(py)
    assert sorted(a) == sorted(b)
    with safe_open(cli, "np") as f:
        ma = f.metadata()
    with safe_open(py, "np") as f:
        mb = f.metadata()
    assert ma == mb, (ma, mb)
    worst = {}
    for k in sorted(a):
        x, y = a[k], b[k]
        assert x.dtype == y.dtype and x.shape == y.shape, (k, x.dtype, y.dtype, x.shape, y.shape)
        if k.endswith(".tokens"):
            assert np.array_equal(x, y), (k, x, y)
            continue
        x, y = x.astype(np.float64), y.astype(np.float64)
        ad = float(np.abs(x - y).max())
        rel = ad / max(float(np.abs(x).max()), 1e-300)
        kind = k.split(".", 2)[2]
        if rel >= worst.get(kind, (0, -1, ""))[1]:
            worst[kind] = (ad, rel, k)
        assert rel <= REL_TOL, f"{k}: max |py - cli| = {ad:.3e}, relative {rel:.3e}"
    # The C++-compatible reader reads both alike.
    sa, sb = sst.load_stats(cli), sst.load_stats(py)
    assert (sa.nsamples, sa.seqlen, sa.seed) == (sb.nsamples, sb.seqlen, sb.seed)
    for La, Lb in zip(sa.layers, sb.layers):
        for nm in La:
            if "tokens" in La[nm]:
                assert La[nm]["tokens"] == Lb[nm]["tokens"]
            assert abs(La[nm]["amax"] - Lb[nm]["amax"]) <= REL_TOL * La[nm]["amax"]
            va = La[nm].get("diag", La[nm].get("sqnorm"))
            vb = Lb[nm].get("diag", Lb[nm].get("sqnorm"))
            assert np.abs(va - vb).max() <= REL_TOL * np.abs(va).max()
    return worst


def report(name, worst):
    for kind, (ad, rel, k) in sorted(worst.items()):
        print(f"{name} {kind:12s} max abs {ad:.3e} rel {rel:.3e} ({k})")
    return max(r for _, r, _ in worst.values())


def test_splitmix64_windows():
    from scalesweep.torch.calibrate import _splitmix64
    # splitmix64's first outputs for seed 0 (the reference C implementation, Vigna).
    s, r1 = _splitmix64(0)
    s, r2 = _splitmix64(s)
    assert (r1, r2) == (0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4)
    ids = list(range(100, 200))
    w = sst.calibration_windows(ids, 3, 10, seed=0, bos=1)
    assert [x.shape for x in w] == [(1, 10)] * 3
    assert int(w[0][0, 0]) == 1 and int(w[0][0, 1]) == 100 + r1 % (100 - 9 + 1)
    w = sst.calibration_windows(ids, 2, 10, seed=0)  # no BOS: 10 text tokens
    assert w[0][0].tolist() == list(range(100 + r1 % 91, 100 + r1 % 91 + 10))
    assert len(sst.calibration_windows(ids, 1, 100)[0][0]) == 100  # the whole text
    with pytest.raises(ValueError, match="the text has 100 tokens, fewer than seqlen = 101"):
        sst.calibration_windows(ids, 1, 101)
    with pytest.raises(ValueError, match="seqlen must be at least 2"):
        sst.calibration_windows(ids, 1, 1)


@need_bin
@need_files(GGUF, VAL)
def test_smollm2_equals_cli(tmp_path):
    pytest.importorskip("gguf", reason="gguf not installed (transformers reads the GGUF)")
    import gguf
    t0 = time.time()
    text = tmp_path / "text.txt"
    with open(VAL, encoding="utf-8") as fh:
        text.write_text(fh.read(4000), encoding="utf-8")
    n, seqlen, seed = 2, 64, 3
    cli = str(tmp_path / "cli.safetensors")
    run("calibrate", GGUF, "--text", text, "--nsamples", n, "--seqlen", seqlen, "--seed", seed,
        "-o", cli)
    f = gguf.GGUFReader(GGUF).fields["tokenizer.ggml.add_bos_token"]
    add_bos = bool(f.parts[f.data[0]][0])
    assert not add_bos  # SmolLM2's GGUF: no BOS (the stories260K test covers BOS)
    ids = cli_ids(GGUF, text)
    d, name = os.path.split(os.path.abspath(GGUF))
    model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=name,
                                                              dtype=torch.float32)
    py = str(tmp_path / "py.safetensors")
    t1 = time.time()
    stats = sst.calibrate(model, sst.calibration_windows(ids, n, seqlen, seed, None),
                          output=py, seed=seed)
    t_py = time.time() - t1
    assert (stats.nsamples, stats.seqlen, stats.seed, stats.path) == (n, seqlen, seed, py)
    worst = report("SmolLM2", compare_files(cli, py))
    print(f"SmolLM2: worst relative difference {worst:.2e}; calibrate() {t_py:.1f} s")
    # The native loader takes the Python file.
    out = json.loads(run("ppl", GGUF, "--quant", "WA", "--method", "sweep-wmse", "--stats", py,
                         "--text", text, "--max-tokens", 256, "--json").strip().splitlines()[-1])
    assert out["quant"] == "WA" and out["source"] == "simulated" and out["tokens"] == 255
    assert np.isfinite(out["nll_per_token"])
    print(f"ppl WA sweep-wmse with the Python statistics: NLL {out['nll_per_token']:.4f}; "
          f"test {time.time() - t0:.1f} s")


@need_bin
@need_data
def test_stories260k_with_bos_equals_cli(tmp_path):
    text = tmp_path / "text.txt"
    with open(VAL, encoding="utf-8") as fh:
        text.write_text(fh.read(3000), encoding="utf-8")
    n, seqlen, seed = 6, 96, 4
    cli = str(tmp_path / "cli.safetensors")
    run("calibrate", MODEL, "--tokenizer", TOK, "--text", text, "--nsamples", n, "--seqlen",
        seqlen, "--seed", seed, "-o", cli)
    hf = tmp_path / "hf"
    run("convert", MODEL, "--tokenizer", TOK, "-o", hf)
    # The CLI's BOS policy for this tokenizer, as ppl reports it.
    ppl = json.loads(run("ppl", MODEL, "--tokenizer", TOK, "--text", text, "--max-tokens", 16,
                         "--json").strip().splitlines()[-1])
    assert ppl["bos"] is True
    bos = json.loads(run("tokenize", TOK, "--text", "x", "--bos", "--json"))["bos"]
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # GQA
    py = str(tmp_path / "py.safetensors")
    windows = sst.calibration_windows(cli_ids(TOK, text), n, seqlen, seed, bos)
    assert all(int(w[0, 0]) == bos for w in windows)
    sst.calibrate(model, windows, output=py, seed=seed)
    worst = report("stories260K", compare_files(cli, py))
    print(f"stories260K: worst relative difference {worst:.2e}")
    # Another seed picks other windows: the comparison would see it.
    other = str(tmp_path / "other.safetensors")
    sst.calibrate(model, sst.calibration_windows(cli_ids(TOK, text), n, seqlen, seed + 1, bos),
                  output=other, seed=seed)
    with pytest.raises(AssertionError):
        compare_files(cli, other)
    # Spread windows (--calib-windows spread): the same file from the same placement; the
    # random file differs.
    spread = str(tmp_path / "spread.safetensors")
    run("calibrate", MODEL, "--tokenizer", TOK, "--text", text, "--nsamples", n, "--seqlen",
        seqlen, "--calib-windows", "spread", "-o", spread)
    py_spread = str(tmp_path / "py_spread.safetensors")
    sst.calibrate(model, sst.calibration_windows(cli_ids(TOK, text), n, seqlen, bos=bos,
                                                 windows="spread"),
                  output=py_spread, windows="spread")
    with safe_open(spread, "np") as f:
        assert f.metadata()["windows"] == "spread"
    report("stories260K spread", compare_files(spread, py_spread))
    with pytest.raises(AssertionError):
        compare_files(cli, spread)


def test_spread_windows_are_llmcompressor_examples_windows(tmp_path):
    """calibration_windows(..., windows="spread") takes the windows of bench/
    llmcompressor_blocks.py's calibration_ids (llm-compressor's examples: nsamples windows
    spread evenly over the text), without BOS exactly those token ids."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../bench"))
    import llmcompressor_blocks as blocks

    class Tok:  # a tokenizer whose ids are the text's characters' code points
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) for c in text]}

    path = tmp_path / "t.txt"
    for n_chars, nsamples, seqlen in [(1000, 16, 50), (1000, 1, 50), (97, 5, 90), (5000, 7, 64)]:
        text = "".join(chr(0x4e00 + (i * 7919) % 5000) for i in range(n_chars))
        path.write_text(text, encoding="utf-8")
        want = blocks.calibration_ids(Tok(), str(path), nsamples, seqlen)
        got = sst.calibration_windows([ord(c) for c in text], nsamples, seqlen, windows="spread")
        assert [w[0].tolist() for w in got] == want, (n_chars, nsamples, seqlen)
    with pytest.raises(ValueError, match="fewer than the 104 that 16 spread windows need"):
        sst.calibration_windows(list(range(100)), 16, 89, windows="spread")
    with pytest.raises(ValueError, match="windows 'even'"):
        sst.calibration_windows(list(range(100)), 2, 10, windows="even")


def tiny(kind, **kw):
    torch.manual_seed(0)
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    common.update(kw)
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).eval()
    if kind == "qwen2":  # q/k/v biases
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common)).eval()
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=32, **common)).eval()


def attn_in_rows(model, batches):
    """The attn_in rows of layer 0, independently: the output of its input_layernorm."""
    rows = []
    h = model.model.layers[0].input_layernorm.register_forward_hook(
        lambda m, a, o: rows.append(o.detach().reshape(-1, o.shape[-1]).double()))
    try:
        with torch.no_grad():
            for b in batches:
                model(b)
    finally:
        h.remove()
    return torch.cat(rows)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_tiny_shapes_and_values(kind, tmp_path):
    model = tiny(kind)
    arch_dims = {"llama": dict(q=64, k=32, attn_out=64), "qwen2": dict(q=64, k=32, attn_out=64),
                 "qwen3": dict(q=128, k=64, attn_out=128)}
    dims = dict(attn_in=64, mlp_in=64, mlp_out=96, v=arch_dims[kind]["k"], **arch_dims[kind])
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 128, (1, 20), generator=g) for _ in range(3)]
    out = tmp_path / "s.safetensors"
    s = sst.calibrate(model, batches, output=out)
    assert (s.nsamples, s.seqlen, s.seed) == (3, 20, 0)
    assert len(s.layers) == 2
    for L in s.layers:
        for nm in ("attn_in", "attn_out", "mlp_in", "mlp_out"):
            assert L[nm]["tokens"] == 60
            assert L[nm]["xtx"].shape == (dims[nm], dims[nm])
            assert np.array_equal(L[nm]["xtx"], L[nm]["xtx"].T)
            assert L[nm]["amax"] > 0
        for nm in "qkv":
            assert L[nm]["sqnorm"].shape == (dims[nm],) and L[nm]["amax"] > 0
    x = attn_in_rows(model, batches)
    ref = (x.T @ x).numpy()
    assert np.abs(s.layers[0]["attn_in"]["xtx"] - ref).max() <= 1e-9 * np.abs(ref).max()
    assert s.layers[0]["attn_in"]["amax"] == pytest.approx(float(x.abs().max()), rel=1e-6)
    loaded = sst.load_stats(out)
    loaded.check(sst._arch.Arch(model).dims(), 2)
    np.testing.assert_array_equal(loaded.layers[1]["q"]["sqnorm"], s.layers[1]["q"]["sqnorm"])
    # One [3, 20] batch is three sequences; the same statistics up to summation order.
    s3 = sst.calibrate(model, [torch.cat(batches)], xtx=False)
    assert s3.nsamples == 3
    for L, L3 in zip(s.layers, s3.layers):
        assert L3["mlp_out"]["tokens"] == 60 and "xtx" not in L3["mlp_out"]
        np.testing.assert_allclose(L3["mlp_out"]["diag"], L["mlp_out"]["diag"], rtol=1e-5)
        np.testing.assert_allclose(L3["k"]["sqnorm"], L["k"]["sqnorm"], rtol=1e-5)
    # nsamples takes the first sequences; lists of ints are batches too.
    s1 = sst.calibrate(model, [b[0].tolist() for b in batches], nsamples=1, xtx=False)
    assert s1.nsamples == 1 and s1.layers[0]["attn_in"]["tokens"] == 20
    # In-memory statistics drive simulate() (which restores the model).
    with sst.simulate(model, "WAKVQ", "sweep-wmse", stats=s3):
        with torch.no_grad():
            model(batches[0])


def test_errors(tmp_path):
    model = tiny("llama")
    b = [torch.randint(0, 128, (1, 16))]
    with pytest.raises(ValueError, match="sequence 0 has 16 tokens, seqlen is 32"):
        sst.calibrate(model, b, seqlen=32)
    with pytest.raises(ValueError, match="nsamples 2, but batches gave 1 sequences"):
        sst.calibrate(model, b, nsamples=2)
    with pytest.raises(ValueError, match="output= needs xtx=True"):
        sst.calibrate(model, b, output=tmp_path / "x.safetensors", xtx=False)
    with pytest.raises(ValueError, match="batches is empty"):
        sst.calibrate(model, [])
    with pytest.raises(ValueError, match="token ids"):
        sst.calibrate(model, [torch.zeros(1, 4)])
    assert not (tmp_path / "x.safetensors").exists()
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="layer 1 input mlp_out: a NaN activation in sequence 0"):
        sst.calibrate(model, b)
    # Hooks and the attention implementation are restored after the error.
    assert model.config._attn_implementation in ("sdpa", "eager")
    assert not model.model.layers[0].self_attn.q_proj._forward_pre_hooks


def test_unknown_architecture_refused():
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=2)
    model = transformers.GPT2LMHeadModel(cfg)
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel \(model_type 'gpt2'\) is not a "
                                         r"supported architecture; supported: llama, qwen2, qwen3"):
        sst.calibrate(model, [[1, 2, 3]])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
def test_cuda_equals_cpu():
    model = tiny("qwen3")
    g = torch.Generator().manual_seed(2)
    batches = [torch.randint(0, 128, (1, 24), generator=g) for _ in range(2)]
    cpu = sst.calibrate(model, batches)
    gpu = sst.calibrate(model.cuda(), batches)  # the batches move to the model's device
    for Lc, Lg in zip(cpu.layers, gpu.layers):
        for nm, rec in Lc.items():
            for key in ("xtx", "sqnorm"):
                if key in rec:
                    ref = np.abs(rec[key]).max()
                    assert np.abs(Lg[nm][key] - rec[key]).max() <= 1e-5 * ref, (nm, key)
            assert Lg[nm]["amax"] == pytest.approx(rec["amax"], rel=1e-5)
            assert Lg[nm].get("tokens") == rec.get("tokens")
    # Accumulators on the host while the model runs on the GPU: the same numbers.
    host = sst.calibrate(model, batches, stats_device="cpu")
    np.testing.assert_allclose(host.layers[1]["mlp_out"]["xtx"], gpu.layers[1]["mlp_out"]["xtx"],
                               rtol=1e-12, atol=1e-12)
