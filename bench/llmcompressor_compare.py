#!/usr/bin/env python3
"""llm-compressor oneshot on the CPU with each weight observer, RTN and GPTQ: held-out NLL of
the saved compressed-tensors checkpoints (scalesweep's runtime and transformers) and the time
(run with .venv-llmc/bin/python; scripts/get-llmcompressor.sh makes it).

Runs, each in its own process (llm-compressor keeps a global session):
  {rtn: QuantizationModifier, gptq: GPTQModifier} x {default (the scheme's observer,
  memoryless_minmax), nvfp4_expanded_mse, nvfp4_expanded_imatrix, scalesweep_mse,
  scalesweep_wmse}, all with scheme --scheme (NVFP4A16: W4A16, the default; NVFP4: W4A4, the
  activations' global scales calibrated, blocks quantized at run time), targets Linear, ignore
  lm_head (and Linears whose K is not a multiple of 16). Calibration: --nsamples windows of --seqlen tokens of --calib
  (pre-tokenized input_ids; never the evaluation text), the same for every run; RTN runs with
  an observer that needs no data are data-free, as llm-compressor runs them.

For each checkpoint: oneshot wall time; NLL per token on the first --max-tokens tokens of
--eval in windows of --ctx by `scalesweep ppl CKPT --json` (a W4A4 checkpoint runs as it
declares: activations quantized per token as vLLM does) and, for W4A16, by transformers (the
checkpoint loaded with from_pretrained, decompressed by compressed-tensors; it decompresses the
weights only, so a W4A4 row has no transformers NLL). The dense model is the first row.

Usage: .venv-llmc/bin/python bench/llmcompressor_compare.py MODEL_DIR --calib TEXT --eval TEXT
       [--bin build/scalesweep] [--nsamples 32] [--seqlen 512] [--ctx 512]
       [--max-tokens 16384] [--algos rtn,gptq] [--observers default,...] [--workdir DIR]
       [--scheme NVFP4A16|NVFP4]
       [--no-dense] [--json]
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import compare_common as common  # noqa: E402

OBSERVERS = ["default", "nvfp4_expanded_mse", "nvfp4_expanded_imatrix", "scalesweep_mse",
             "scalesweep_wmse"]
ALGOS = ["rtn", "gptq"]
NEEDS_DATA = {"nvfp4_expanded_imatrix", "scalesweep_wmse"}


SCHEMES = ["NVFP4A16", "NVFP4"]


def run_oneshot(model_dir, algo, observer, out_dir, calib, nsamples, seqlen, scheme,
                prepare=None):
    """One oneshot run in this process; writes the checkpoint to out_dir and returns its
    timing. prepare(model), when given, changes the loaded model and returns more module names
    to ignore (bench/llmcompressor_staged.py: one range of layers per run)."""
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import llmcompressor_blocks as blocks
    blocks.import_observers()  # registers scalesweep_mse / scalesweep_wmse
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = blocks.calibration_ids(tok, calib, nsamples, seqlen)
    ds = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids]})
    ignore = ["lm_head"] + [n for n, m in model.named_modules()
                            if isinstance(m, torch.nn.Linear) and m.in_features % 16 != 0]
    if prepare:
        ignore += prepare(model)
    kw = dict(targets="Linear", scheme=scheme, ignore=ignore)
    if observer != "default":
        kw["weight_observer"] = observer
    if algo == "rtn":
        if observer in NEEDS_DATA:
            kw["requires_calibration_data"] = True
        recipe = QuantizationModifier(**kw)
    else:
        recipe = GPTQModifier(**kw)
    t0 = time.perf_counter()
    oneshot(model=model, dataset=ds, recipe=recipe, num_calibration_samples=len(ids),
            max_seq_length=seqlen, shuffle_calibration_samples=False)
    t = time.perf_counter() - t0
    model.save_pretrained(out_dir, save_compressed=True)
    tok.save_pretrained(out_dir)
    return {"oneshot_s": t}


def nll_transformers(ckpt, eval_text, ctx, max_tokens):
    """Mean NLL per predicted token: non-overlapping windows of ctx tokens over the first
    max_tokens tokens (BOS first when the tokenizer adds one), each window scored alone."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils.quantization_config import CompressedTensorsConfig
    tok = AutoTokenizer.from_pretrained(ckpt)
    # run_compressed=False: compressed-tensors decompresses the NVFP4 Linears at load into
    # dense parameters (kept compressed, they are decompressed per forward in bfloat16 and meet
    # float32 activations). Dense checkpoints (the reference row) load as they are.
    kw = {}
    with open(os.path.join(ckpt, "config.json"), encoding="utf-8") as f:
        if "quantization_config" in json.load(f):
            kw["quantization_config"] = CompressedTensorsConfig(run_compressed=False)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, **kw)
    # compressed-tensors decompresses NVFP4 Linears to bfloat16 while the rest loads as
    # float32: widen them (bf16 -> f32 is exact; the bf16 rounding of code * s / gs is
    # compressed-tensors' own)
    # (transformers refuses .float() on a quantized model; the parameters are widened in place)
    with torch.no_grad():
        for prm in model.parameters():
            if prm.dtype == torch.bfloat16:
                prm.data = prm.data.float()
    model.eval()
    ids = common.eval_ids(tok, eval_text, max_tokens)
    total, n = 0.0, 0
    for _, loss, count in common.window_losses(model, ids, ctx, len(ids)):
        total += loss
        n += count
    return {"nll_hf": total / n, "tokens_hf": n}


def nll_scalesweep(binary, ckpt, eval_text, ctx, max_tokens):
    out = subprocess.run([binary, "ppl", ckpt, "--text", eval_text, "--ctx", str(ctx),
                          "--max-tokens", str(max_tokens), "--json"], capture_output=True,
                         text=True)
    if out.returncode != 0:
        return {"nll_ss": None, "ss_error": out.stderr.strip()[-500:]}
    j = json.loads(out.stdout)
    return {"nll_ss": j["nll_per_token"], "tokens_ss": j["tokens"]}


def child(a):
    """Prints a cumulative RESULT line after each stage (the parent reads the last one), so a
    failing evaluation keeps the oneshot time."""
    res = {}
    if a.one_algo != "dense":
        if not a.eval_only:
            res.update(run_oneshot(a.model_dir, a.one_algo, a.one_observer, a.one_out,
                                   a.calib, a.nsamples, a.seqlen, a.scheme))
            print("RESULT " + json.dumps(res), flush=True)
        ckpt = a.one_out
    else:
        ckpt = a.model_dir
    if a.scheme == "NVFP4A16" or a.one_algo == "dense":
        res.update(nll_transformers(ckpt, a.eval, a.ctx, a.max_tokens))
    print("RESULT " + json.dumps(res), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(ap, ROOT)
    ap.add_argument("--algos", default=",".join(ALGOS))
    ap.add_argument("--observers", default=",".join(OBSERVERS))
    ap.add_argument("--workdir", default="/tmp/scalesweep-llmc-compare")
    ap.add_argument("--scheme", default="NVFP4A16", choices=SCHEMES,
                    help="NVFP4A16 (W4A16) or NVFP4 (W4A4)")
    ap.add_argument("--no-dense", action="store_true", help="skip the dense model's row")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--one-algo", help=argparse.SUPPRESS)
    ap.add_argument("--one-observer", help=argparse.SUPPRESS)
    ap.add_argument("--one-out", help=argparse.SUPPRESS)
    ap.add_argument("--eval-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if os.path.abspath(a.calib) == os.path.abspath(a.eval):
        sys.exit("llmcompressor_compare: --calib and --eval are the same file; calibrate on "
                 "other text")
    if a.one_algo:
        child(a)
        return
    for p, what in ((a.model_dir, "model directory"), (a.calib, "--calib"), (a.eval, "--eval"),
                    (a.bin, "--bin")):
        if not os.path.exists(p):
            sys.exit(f"llmcompressor_compare: {what} {p} does not exist")
    algos = [x for x in a.algos.split(",") if x]
    observers = [x for x in a.observers.split(",") if x]
    for x in algos:
        if x not in ALGOS:
            sys.exit(f"llmcompressor_compare: --algos: unknown '{x}' (accepted: {ALGOS})")
    for x in observers:
        if x not in OBSERVERS:
            sys.exit(f"llmcompressor_compare: --observers: unknown '{x}' (accepted: "
                     f"{OBSERVERS})")
    os.makedirs(a.workdir, exist_ok=True)
    runs = ([] if a.no_dense else [("dense", "-")]) + [(al, ob) for al in algos
                                                       for ob in observers]
    rows = []
    for al, ob in runs:
        out = os.path.join(a.workdir, f"{al}-{ob}" + ("" if a.scheme == "NVFP4A16" else
                                                        f"-{a.scheme}"))
        cmd = [sys.executable, os.path.abspath(__file__), a.model_dir, "--calib", a.calib,
               "--eval", a.eval, "--nsamples", str(a.nsamples), "--seqlen", str(a.seqlen),
               "--ctx", str(a.ctx), "--max-tokens", str(a.max_tokens), "--one-algo", al,
               "--one-observer", ob, "--one-out", out, "--scheme", a.scheme]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        row = {"algo": al, "observer": ob, "process_s": time.perf_counter() - t0}
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if lines:
            row.update(json.loads(lines[-1][len("RESULT "):]))
        if p.returncode != 0 or not lines:
            row["error"] = (p.stderr or p.stdout).strip()[-2000:]
        if lines:
            row.update(nll_scalesweep(a.bin, out if al != "dense" else a.model_dir, a.eval,
                                      a.ctx, a.max_tokens))
        rows.append(row)
        # progress: stdout for the table, stderr under --json
        print(f"{al:5s} {ob:24s} oneshot {row.get('oneshot_s', 0):7.1f} s  "
              f"NLL scalesweep {row.get('nll_ss') or float('nan'):.4f}  "
              f"transformers {row.get('nll_hf', float('nan')):.4f}"
              + (f"  ERROR {row['error'][-300:]}" if "error" in row else ""),
              file=sys.stderr if a.json else sys.stdout, flush=True)
    if a.json:
        print(json.dumps({"model": a.model_dir, "scheme": a.scheme, "calib": a.calib,
                          "eval": a.eval,
                          "nsamples": a.nsamples, "seqlen": a.seqlen, "ctx": a.ctx,
                          "max_tokens": a.max_tokens, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
