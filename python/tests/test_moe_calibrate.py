"""Calibration of mixture-of-experts models (issue 26 item 2) judged by transformers.

Tiny random Qwen3-MoE and Mixtral (test_moe_runtime.build: transformers 5.23, eager experts,
save_pretrained) go through `scalesweep calibrate`; the reference statistics come from hooks on
transformers' own router (mlp.gate / block_sparse_moe.gate: its input and the experts it picks)
over the same windows (scalesweep.torch.calibration_windows on the CLI's token ids), with each
expert's SwiGLU recomputed in float64 from the model's stacked expert weights:
(a) per expert, the routed token count equals transformers' exactly, and the gate/up input and
    the down input (ΣxxT, amax, tokens) agree within a relative 1e-4 of the tensor's largest
    magnitude; the router's input is the layer's mlp_in record;
(b) --calib-all-experts: every expert's statistics cover every token (its gate/up ΣxxT is the
    router input's), the routed counts stay transformers' and the dense records do not move;
(c) a router that never picks some experts (a zeroed router: transformers' topk ties pick the
    same two experts for every token) -> the report (text and --json) names the experts that saw
    no tokens, and --expert-min-tokens lists those below it with their counts.
Skips visibly without torch/transformers/safetensors or the shared data.
"""
import json
import os

import numpy as np
import pytest

from cli_common import need_bin, need_files, MODEL, VAL

torch = pytest.importorskip("torch", reason="torch not installed (tiny reference models)")
pytest.importorskip("transformers", reason="transformers not installed (tiny reference models)")
from safetensors.numpy import load_file  # noqa: E402

import test_moe_runtime as rt  # noqa: E402  (build, run, MODELS, the shared setup)

pytestmark = [need_bin, need_files(MODEL, VAL)]
setup = rt.setup  # the module fixture: converted tokenizer, text, ids
NS, SEQ, SEED = 3, 48, 5
REL = 1e-4


MASK = (1 << 64) - 1


def windows(base, text):
    """The sequences `calibrate --calib-nsamples NS --calib-seqlen SEQ --calib-seed SEED` runs
    (model::calibration_sequences: splitmix64, start = draw % valid starts, BOS first: the
    stories260K tokenizer adds one), on the CLI's own token ids; the same draw as
    scalesweep.torch.calibration_windows (checked against splitmix64's published outputs in
    test_torch_calibrate.py)."""
    ids = json.loads(rt.run("tokenize", base, "--file", text, "--json").stdout)["ids"]
    bos = json.loads(rt.run("tokenize", base, "--file", text, "--bos", "--json").stdout)["ids"][0]
    body = SEQ - 1
    starts = len(ids) - body + 1
    state, out = SEED, []
    for _ in range(NS):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        start = (z ^ (z >> 31)) % starts
        out.append(torch.tensor([[bos] + ids[start:start + body]], dtype=torch.long))
    return out


def moe_blocks(model):
    out = []
    for layer in model.model.layers:
        blk = getattr(layer, "mlp", None)
        if blk is None or not hasattr(blk, "experts"):
            blk = getattr(layer, "block_sparse_moe", blk)
        out.append(blk if hasattr(blk, "experts") else None)
    return out


def reference(model, wins):
    """Per MoE layer: router input rows [T, D] and the experts transformers picked [T, k]."""
    blocks = moe_blocks(model)
    seen = {l: ([], []) for l, b in enumerate(blocks) if b is not None}
    hooks = []
    for l, b in enumerate(blocks):
        if b is None:
            continue

        def hook(mod, args, out, l=l):
            seen[l][0].append(args[0].reshape(-1, args[0].shape[-1]).double())
            seen[l][1].append(out[2].reshape(-1, out[2].shape[-1]))
        hooks.append(b.gate.register_forward_hook(hook))
    with torch.no_grad():
        for w in wins:
            model(w)
    for h in hooks:
        h.remove()
    return {l: (torch.cat(x), torch.cat(i)) for l, (x, i) in seen.items()}


def expert_mid(block, e, x):
    ex = block.experts
    gu = ex.gate_up_proj[e].detach().double()
    inter = gu.shape[0] // 2
    g, u = x @ gu[:inter].T, x @ gu[inter:].T
    return torch.nn.functional.silu(g) * u


def close(a, b, what):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = max(np.abs(b).max(), 1e-30)
    err = np.abs(a - b).max() / scale
    assert err <= REL, f"{what}: relative difference {err:.2e}"
    return err


def calibrate(path, text, out, *extra):
    p = rt.run("calibrate", path, "--calib", text, "--calib-nsamples", str(NS), "--calib-seqlen",
               str(SEQ), "--calib-seed", str(SEED), "-o", out, "--json", *extra)
    return json.loads(p.stdout), load_file(out)


@pytest.mark.parametrize("name", ["qwen3_moe", "qwen3_moe_sparse", "mixtral"])
def test_expert_statistics_match_transformers(setup, name):
    d, base, text, ids = setup
    model, path = rt.build(d, base, name, seed=3)
    wins = windows(base, text)
    ref = reference(model, wins)
    blocks = moe_blocks(model)
    js, st = calibrate(path, text, str(d / f"{name}.stats"))
    allj, allst = calibrate(path, text, str(d / f"{name}_all.stats"), "--calib-all-experts")
    T = NS * SEQ
    worst = 0.0
    for l, (x, chosen) in ref.items():
        E = blocks[l].experts.gate_up_proj.shape[0]
        p = f"layers.{l}."
        assert f"{p}mlp_out.xtx" not in st  # no dense down projection in a MoE layer
        worst = max(worst, close(st[f"{p}mlp_in.xtx"], (x.T @ x).numpy(), f"{p}router input"))
        counts = torch.bincount(chosen.reshape(-1), minlength=E).tolist()
        assert js["layers"][l]["expert_routed_tokens"] == counts
        assert allj["layers"][l]["expert_routed_tokens"] == counts
        for e in range(E):
            q = f"{p}experts.{e}."
            assert int(st[q + "routed"][0]) == counts[e]
            assert int(allst[q + "routed"][0]) == counts[e]
            rows = (chosen == e).any(dim=1)
            xe = x[rows]
            mid = expert_mid(blocks[l], e, xe)
            assert int(st[q + "mlp_in.tokens"][0]) == counts[e]
            assert int(st[q + "mlp_out.tokens"][0]) == counts[e]
            if counts[e]:
                worst = max(worst, close(st[q + "mlp_in.xtx"], (xe.T @ xe).numpy(), q + "mlp_in"))
                worst = max(worst, close(st[q + "mlp_out.xtx"], (mid.T @ mid).numpy(),
                                         q + "mlp_out"))
                close(st[q + "mlp_out.amax"], [mid.abs().max().item()], q + "mlp_out.amax")
            # Every token through every expert (--calib-all-experts).
            assert int(allst[q + "mlp_in.tokens"][0]) == T
            np.testing.assert_array_equal(allst[q + "mlp_in.xtx"], allst[f"{p}mlp_in.xtx"])
            mid_all = expert_mid(blocks[l], e, x)
            worst = max(worst, close(allst[q + "mlp_out.xtx"], (mid_all.T @ mid_all).numpy(),
                                     q + "mlp_out (all experts)"))
    # The dense records (attention) are those of the routed forward.
    for k in st:
        if ".experts." not in k and k.endswith(".xtx"):
            np.testing.assert_array_equal(st[k], allst[k], err_msg=k)
    print(f"{name}: worst relative difference vs transformers {worst:.2e}")


def test_report_names_experts_without_tokens(setup):
    d, base, text, ids = setup
    model, path = rt.build(d, base, "qwen3_moe", seed=4)
    # Layer 1's router zeroed: every token's probabilities tie and topk picks the same 2 of 8.
    from safetensors.torch import load_file as tload, save_file as tsave
    f = os.path.join(path, "model.safetensors")
    sd = tload(f)
    sd["model.layers.1.mlp.gate.weight"].zero_()
    tsave(sd, f, metadata={"format": "pt"})
    with torch.no_grad():
        model.model.layers[1].mlp.gate.weight.zero_()
    picked = torch.topk(torch.full((8,), 1 / 8.0), 2).indices.tolist()
    unseen = sorted(set(range(8)) - set(picked))
    js, st = calibrate(path, text, str(d / "zero.stats"))
    cov = {c["layer"]: c for c in js["experts"]["under_calibrated"]}
    assert js["experts"]["min_tokens"] == 64  # the hidden size, by default
    assert cov[1]["unseen"] == unseen
    assert js["layers"][1]["expert_routed_tokens"] == [NS * SEQ if e in picked else 0
                                                       for e in range(8)]
    for e in unseen:
        assert float(st[f"layers.1.experts.{e}.mlp_in.amax"][0]) == 0.0
    # Text report; a threshold above every count lists the others with their counts.
    p = rt.run("calibrate", path, "--calib", text, "--calib-nsamples", str(NS), "--calib-seqlen",
               str(SEQ), "--calib-seed", str(SEED), "-o", str(d / "zero2.stats"),
               "--expert-min-tokens", "100000")
    line = [ln for ln in p.stdout.splitlines() if ln.strip().startswith("layer 1:")]
    assert line, p.stdout
    assert "no tokens: " + ", ".join(map(str, unseen)) in line[0], line[0]
    for e in picked:
        assert f"{e} ({NS * SEQ})" in line[0], line[0]
    assert "routed calibration tokens below 100000" in p.stdout
