"""Checkpoints evaluated as they will run, and BOS as the tokenizer asks.

A compressed-tensors W4A4 checkpoint (quantize --quant WA) runs its Linear inputs through
NVFP4 at run time with its stored input_global_scale (absmax block scales per token, as vLLM
does), so `ppl CKPT` scores the same NLL as `ppl FP --quant WA --method absmax` with the
same calibration statistics (the same global scales). --quant on an already-NVFP4 checkpoint
is refused unless --force-requant. BOS follows the tokenizer's add-BOS policy unless
--bos/--no-bos say otherwise.
"""
import json
import os
import shutil

import pytest

from cli_common import MODEL, VAL, need_bin, need_files
from cli_common import run_cli as run

pytestmark = [need_bin, need_files(MODEL, VAL)]
MAXTOK = "2000"


def ppl(model, *extra):
    return json.loads(run("ppl", model, "--text", VAL, "--max-tokens", MAXTOK, "--json",
                          *extra).stdout)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("w4a4")
    stats = str(d / "stats.safetensors")
    run("calibrate", MODEL, "--text", VAL, "--nsamples", "8", "--seqlen", "128", "-o", stats)
    wa = str(d / "wa")  # every Linear NVFP4 (down_proj's K = 172 has a partial last block)
    run("quantize", MODEL, "-o", wa, "--quant", "WA", "--method", "absmax", "--stats", stats,
        "--partial-blocks", "quantize")
    wa_dense = str(d / "wa_dense")  # default: down_proj left dense (ignore), its input FP
    run("quantize", MODEL, "-o", wa_dense, "--quant", "WA", "--method", "absmax", "--stats",
        stats)
    w = str(d / "w")
    run("quantize", MODEL, "-o", w, "--method", "absmax", "--partial-blocks", "quantize")
    return dict(stats=stats, wa=wa, wa_dense=wa_dense, w=w, dir=d)


def test_w4a4_checkpoint_scores_its_w4a4_nll(ckpts):
    a = ppl(ckpts["wa"])
    sim = ppl(MODEL, "--quant", "WA", "--method", "absmax", "--stats", ckpts["stats"])
    w_only = ppl(MODEL, "--quant", "W", "--method", "absmax")
    assert a["tokens"] == sim["tokens"] > 1000
    assert a["nll_per_token"] == sim["nll_per_token"]  # same weights, same global scales
    assert a["nll_per_token"] != w_only["nll_per_token"]  # the activations are quantized
    assert (a["quant"], a["method"], a["format"], a["block"], a["source"]) == \
        ("WA", "absmax", "nvfp4", 16, "checkpoint")
    assert sim["source"] == "simulated"
    # generate reports the same
    g = json.loads(run("generate", ckpts["wa"], "--prompt", "Once upon a time", "-n", "8",
                       "--temperature", "0", "--json").stdout)
    assert (g["quant"], g["source"]) == ("WA", "checkpoint")


def test_w4a16_checkpoint_reports_weights_only(ckpts):
    a = ppl(ckpts["w"])
    b = ppl(MODEL, "--quant", "W", "--method", "absmax")
    assert a["nll_per_token"] == b["nll_per_token"]
    assert (a["quant"], a["source"]) == ("W", "checkpoint")
    # --method shapes nothing on a weight-only checkpoint: refused as without a checkpoint
    p = run("ppl", ckpts["w"], "--text", VAL, "--method", "sweep-mse", ok=False)
    assert p.returncode != 0 and "--method: given without" in p.stderr, p.stderr


def test_dense_down_proj_input_stays_full_precision(ckpts):
    a = ppl(ckpts["wa_dense"])
    full = ppl(ckpts["wa"])
    assert a["source"] == "checkpoint" and a["quant"] == "WA"
    assert a["nll_per_token"] != full["nll_per_token"]


def test_activation_selector_flag(ckpts):
    a = ppl(ckpts["wa"], "--method", "sweep-mse")
    sim = ppl(MODEL, "--quant", "WA", "--method", "absmax", "--stats", ckpts["stats"])
    assert a["method"] == "sweep-mse" and a["source"] == "checkpoint"
    assert a["nll_per_token"] != sim["nll_per_token"]
    p = run("ppl", ckpts["wa"], "--text", VAL, "--format", "mxfp4", ok=False)
    assert p.returncode != 0 and "--format: mxfp4" in p.stderr, p.stderr
    for m in ("sweep-wmse", "sweep-hessian"):
        p = run("ppl", ckpts["wa"], "--text", VAL, "--method", m, ok=False)
        assert p.returncode != 0 and "needs calibration (importance or Hessians)" in p.stderr, \
            p.stderr


@pytest.mark.parametrize("cmd", ["ppl", "generate"])
def test_requant_refused_without_force(ckpts, cmd):
    extra = ["--text", VAL, "--max-tokens", "200"] if cmd == "ppl" else ["-n", "4"]
    p = run(cmd, ckpts["wa"], *extra, "--quant", "W", ok=False)
    assert p.returncode != 0
    assert "already NVFP4" in p.stderr and "--force-requant" in p.stderr, p.stderr
    j = json.loads(run(cmd, ckpts["wa"], *extra, "--quant", "W", "--method", "absmax",
                       "--force-requant", "--json").stdout)
    assert (j["quant"], j["source"]) == ("W", "checkpoint+simulated")


def test_bos_follows_tokenizer_policy(ckpts, tmp_path):
    # llama2.c: always BOS
    a = ppl(MODEL)
    assert a["bos"] is True
    nb = ppl(MODEL, "--no-bos")
    assert nb["bos"] is False and nb["nll_per_token"] != a["nll_per_token"]
    # An HF directory whose tokenizer_config.json says add_bos_token: false
    d = tmp_path / "nobos"
    shutil.copytree(ckpts["w"], d)
    cfg = json.load(open(d / "tokenizer_config.json"))
    assert cfg["add_bos_token"] is True
    with_bos = ppl(str(d))
    cfg["add_bos_token"] = False
    json.dump(cfg, open(d / "tokenizer_config.json", "w"))
    without = ppl(str(d))
    forced = ppl(str(d), "--bos")
    assert with_bos["bos"] is True and without["bos"] is False and forced["bos"] is True
    assert forced["nll_per_token"] == with_bos["nll_per_token"]
    assert without["nll_per_token"] != with_bos["nll_per_token"]
    g = json.loads(run("generate", str(d), "--prompt", "Once", "-n", "2", "--temperature", "0",
                       "--json").stdout)
    g2 = json.loads(run("generate", str(d), "--prompt", "Once", "-n", "2", "--temperature",
                        "0", "--bos", "--json").stdout)
    assert g["bos"] is False and g2["bos"] is True
    assert g2["n_prompt_tokens"] == g["n_prompt_tokens"] + 1
    # calibration follows the same policy: the stats differ with and without BOS
    s_nobos, s_bos = str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")
    run("calibrate", str(d), "--text", VAL, "--nsamples", "2", "--seqlen", "64", "-o", s_nobos)
    cfg["add_bos_token"] = True
    json.dump(cfg, open(d / "tokenizer_config.json", "w"))
    run("calibrate", str(d), "--text", VAL, "--nsamples", "2", "--seqlen", "64", "-o", s_bos)
    assert open(s_nobos, "rb").read() != open(s_bos, "rb").read()


def test_w4a4_checkpoint_missing_input_global_scale_refused(ckpts, tmp_path):
    d = tmp_path / "broken"
    shutil.copytree(ckpts["wa"], d)
    f = str(d / "model.safetensors")
    name = "model.layers.2.self_attn.k_proj.input_global_scale"
    data = bytearray(open(f, "rb").read())
    n = int.from_bytes(data[:8], "little")
    header = data[8:8 + n].decode()
    assert header.count(f'"{name}"') == 1
    # The same bytes under another name of the same length: the scale is gone.
    data[8:8 + n] = header.replace(f'"{name}"', f'"{name[:-1]}X"').encode()
    open(f, "wb").write(bytes(data))
    p = run("ppl", str(d), "--text", VAL, "--max-tokens", "100", ok=False)
    assert p.returncode != 0
    assert f"tensor '{name}' is missing" in p.stderr and "W4A4" in p.stderr, p.stderr


def test_quantize_and_experiment_refuse_nvfp4_source(ckpts, tmp_path):
    p = run("quantize", ckpts["w"], "-o", str(tmp_path / "again"), "--method", "absmax",
            ok=False)
    assert p.returncode != 0 and "already quantized" in p.stderr, p.stderr
    p = run("experiment", ckpts["w"], "--eval", VAL, "--stats", ckpts["stats"], ok=False)
    assert p.returncode != 0 and "already NVFP4" in p.stderr and "--force-requant" in p.stderr
