#!/usr/bin/env python3
"""How far apart two correct implementations of simulated quantization can be, request by
request: the noise floor for bench/lmeval_compare.py --quant.

With quantized activations (WA, WAKV, WAKVQ) a value that lands on the other side of an FP4
rounding boundary, or a block whose best scale changes, moves the loglikelihood by up to nats;
two fp32 forward passes whose matrix products round differently (ours and PyTorch's) hit such
boundaries here and there. This script takes the requests lm-eval scored (its samples_*.jsonl)
and scores them with transformers + scalesweep.torch.simulate twice, once as is and once with
every quantizer input multiplied by (1 + rel * N(0, 1)) (rel 3e-7: a few float32 ulps, the size
of GEMM rounding differences), and prints per task the requests within --tol and the median and
max |Δ|; with --ours-samples also ours (the native runtime) against the unperturbed pass, and
how many of ours' requests over --tol the perturbed pass lands on (within --tol of ours).

    python3 bench/lmeval_sim_noise.py MODEL_DIR --lmeval-dir DIR --quant WAKVQ \\
        --method sweep-wmse --stats STATS --docs 20 [--ours-samples OURS.jsonl]
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import lmeval_compare as lc  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="HF model directory (the one lm-eval ran)")
    ap.add_argument("--lmeval-dir", required=True, help="lm-eval output folder (samples_*.jsonl)")
    ap.add_argument("--quant", required=True)
    ap.add_argument("--method", default="sweep-mse")
    ap.add_argument("--stats")
    ap.add_argument("--docs", type=int, default=20, help="first N docs of each task")
    ap.add_argument("--rel", type=float, default=3e-7)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ours-samples")
    a = ap.parse_args(argv)

    import torch
    import transformers

    import scalesweep as ss
    from scalesweep.torch import simulate
    torch.set_num_threads(a.threads)
    lm_docs, _, _ = lc.load_lmeval(a.lmeval_dir)
    ours = lc.load_ours(a.ours_samples) if a.ours_samples else {}
    tok = transformers.AutoTokenizer.from_pretrained(a.model)
    enc = lc.lmeval_tok_encode(tok)
    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    model.eval()

    def score(context, continuation):  # lm-eval's _encode_pair and fp32 log_softmax
        n = len(context) - len(context.rstrip())
        if n:
            continuation, context = context[-n:] + continuation, context[:-n]
        whole, ctx = enc(context + continuation), enc(context)
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([whole[:-1]])).logits[0], dim=-1)
        return float(sum(lp[len(ctx) - 1 + i, t].item()
                         for i, t in enumerate(whole[len(ctx):])))

    orig = ss.fake_quantize
    gen = torch.Generator().manual_seed(a.seed)

    def perturbed(x, **kw):
        if not kw.get("name", "").endswith(".weight"):
            x = x * (1 + a.rel * torch.randn(x.shape, generator=gen)).to(x.dtype)
        return orig(x, **kw)

    def summary(ds):
        ds = sorted(ds)
        return (f"{sum(d <= a.tol for d in ds)}/{len(ds)} within {a.tol:g}, median "
                f"{ds[len(ds) // 2]:.2e}, max {ds[-1]:.2e}")

    with simulate(model, a.quant, a.method, stats=a.stats, threads=a.threads):
        for task, per in lm_docs.items():
            noise, vs_ours, landed, over = [], [], 0, 0
            for doc_id in sorted(per)[:a.docs]:
                for i, r in enumerate(per[doc_id]["requests"]):
                    ss.fake_quantize = orig
                    x = score(r["context"], r["continuation"])
                    ss.fake_quantize = perturbed
                    try:
                        y = score(r["context"], r["continuation"])
                    finally:
                        ss.fake_quantize = orig
                    noise.append(abs(x - y))
                    o = ours.get(task, {}).get(doc_id)
                    if o is not None:
                        ol = float(o["requests"][i]["loglikelihood"])
                        vs_ours.append(abs(ol - x))
                        if abs(ol - x) > a.tol:
                            over += 1
                            landed += abs(ol - y) <= a.tol
            print(f"{task}: torch vs torch perturbed by {a.rel:g}: {summary(noise)}")
            if vs_ours:
                print(f"{task}: ours vs torch: {summary(vs_ours)}; of ours' {over} requests "
                      f"over tol the perturbed pass lands within tol of ours on {landed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
