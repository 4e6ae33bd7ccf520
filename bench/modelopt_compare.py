#!/usr/bin/env python3
"""NVIDIA ModelOpt's NVFP4 calibrations (max, mse, mse + fp8_scale_sweep, local_hessian, gptq) on
the CPU, judged by held-out NLL beside scalesweep's own selectors (run with
.venv-modelopt/bin/python; scripts/get-modelopt.sh makes it).

Every ModelOpt run is its own process (mtq.quantize converts the model in place and ModelOpt
keeps registries). Schemes:
  W4A16: NVFP4 weights, every Linear but lm_head (ModelOpt's default_disabled_quantizers),
    inputs unquantized. "max" uses ModelOpt's own preset W4A16_NVFP4_CFG (NVFP4_DEFAULT_CFG
    without the input quantizers; dynamic block scales = AbsMax). The others use static block
    scales (configs/numerics/nvfp4_static), as ModelOpt's own NVFP4_W4A4_WEIGHT_MSE_FP8_SWEEP_CFG,
    NVFP4_W4A4_WEIGHT_LOCAL_HESSIAN_CFG and general/ptq/nvfp4_default-kv_none-gptq.yaml do:
    its mse / local_hessian calibrators skip dynamic weight quantizers
    (model_calib._make_weight_mse_calibrator), and gptq promotes them to static.
  W4A4: the same plus ModelOpt's dynamic NVFP4 input quantizers (NVFP4_DEFAULT_CFG for max, and
    ModelOpt's W4A4 presets for mse + fp8_scale_sweep and local_hessian).
Calibration: --nsamples windows of --seqlen tokens from --calib after its first
--calib-skip-chars characters, taken by bench/llmcompressor_blocks.py's calibration_ids (the
same tokens as bench/llmcompressor_compare.py's runs), one batch each.

Evaluation: NLL per predicted token of the fake-quantized model (ModelOpt's own forward) on the
first --max-tokens tokens of --eval (and on the first --short-tokens), non-overlapping windows
of --ctx, each window scored alone, its first token not predicted (`scalesweep ppl --ctx 512
--max-tokens 2048` counts the same 2044 tokens; the dense row is checked against it). Where
ModelOpt's fake quantization cannot run on the CPU and the scheme is weight-only with dynamic
(AbsMax) block scales, the model is evaluated after `mtq.compress` (ModelOpt's real NVFP4
weights, dequantized per forward by its own torch code, NVFP4QTensor) and the row says so.
Every failure is kept with its exception and the line of ModelOpt's source that raised it.

--export: ModelOpt's export_hf_checkpoint of each quantized model, and `scalesweep inspect` on
it. --eval-export DIR: only the NLL of such an export, its NVFP4 tensors decoded here from the
format (not by ModelOpt's code), a check of the mtq.compress evaluation. --ours: scalesweep
quantize (absmax at C=448 = ModelOpt's max rule, sweep-mse at C=256 and C=448, sweep-wmse, GPTQ
sweep-wmse) and `scalesweep ppl` on the same tokens (sweep-wmse and GPTQ calibrate with
scalesweep's own sampler on the same calibration text, not calibration_ids). --out FILE: the
JSON document rewritten after every row, so an interrupted run keeps its finished rows.

Usage: .venv-modelopt/bin/python bench/modelopt_compare.py MODEL_DIR --calib TEXT --eval TEXT
       [--calib-skip-chars 200000] [--nsamples 32] [--seqlen 512] [--ctx 512]
       [--max-tokens 16384] [--short-tokens 2048] [--runs max,mse,...] [--bin PATH]
       [--export] [--ours] [--workdir DIR] [--json] [--out FILE]
       .venv-modelopt/bin/python bench/modelopt_compare.py MODEL_DIR --eval EVAL --calib TEXT
       --eval-export DIR [--max-tokens N] [--short-tokens N]
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import compare_common as common  # noqa: E402

# run name -> (algorithm as ModelOpt's config takes it, weight numerics, with input quantizers)
RUNS = {
    "max": ("max", "dynamic", False),
    "mse": ({"method": "mse"}, "static", False),
    "mse_fp8_sweep": ({"method": "mse", "fp8_scale_sweep": True}, "static", False),
    "local_hessian": ({"method": "local_hessian", "fp8_scale_sweep": True}, "static", False),
    "gptq": ({"method": "gptq", "layerwise": {"enable": True}}, "static", False),
    "max_w4a4": ("max", "dynamic", True),
    "mse_fp8_sweep_w4a4": ({"method": "mse", "fp8_scale_sweep": True}, "static", True),
    "local_hessian_w4a4": ({"method": "local_hessian", "fp8_scale_sweep": True}, "static", True),
}
# scalesweep quantize rows: name -> its options (sweep-wmse and GPTQ calibrate on the same
# calibration text with scalesweep's own sampler)
OURS = {"absmax": ["--method", "absmax", "--max-block-scale", "448"],
        "sweep-mse": ["--method", "sweep-mse"],
        "sweep-mse C=448": ["--method", "sweep-mse", "--max-block-scale", "448"],
        "sweep-wmse": ["--method", "sweep-wmse"],
        "gptq sweep-wmse": ["--method", "sweep-wmse", "--gptq"]}


def modelopt_config(run):
    """A deep copy of one of ModelOpt's own presets, with the algorithm of the run."""
    import modelopt.torch.quantization as mtq
    algo, numerics, w4a4 = RUNS[run]
    if numerics == "dynamic":
        cfg = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG if w4a4 else mtq.W4A16_NVFP4_CFG)
    else:
        cfg = copy.deepcopy(mtq.NVFP4_W4A4_WEIGHT_MSE_FP8_SWEEP_CFG)
        if not w4a4:  # drop the input quantizer entry: weight-only
            cfg["quant_cfg"] = [e for e in cfg["quant_cfg"]
                                if e.get("quantizer_name") != "*input_quantizer"]
    cfg["algorithm"] = copy.deepcopy(algo)
    return cfg


def modelopt_frame(exc):
    """The innermost frame of the traceback inside ModelOpt's package: 'file:line: code'."""
    frames = traceback.extract_tb(exc.__traceback__)
    for fr in reversed(frames):
        if f"{os.sep}modelopt{os.sep}" in fr.filename:
            rel = fr.filename[fr.filename.index(f"{os.sep}modelopt{os.sep}") + 1:]
            return f"{rel}:{fr.lineno}: {fr.line}"
    fr = frames[-1] if frames else None
    return f"{fr.filename}:{fr.lineno}: {fr.line}" if fr else ""


def failure(stage, exc):
    """The exception, the line of ModelOpt that raised it, and ModelOpt's call chain to it."""
    chain = [f"{fr.filename[fr.filename.index(f'{os.sep}modelopt{os.sep}') + 1:]}:{fr.lineno} "
             f"{fr.name}" for fr in traceback.extract_tb(exc.__traceback__)
             if f"{os.sep}modelopt{os.sep}" in fr.filename]
    return {"stage": stage, "exception": f"{type(exc).__name__}: {exc}".strip()[:1500],
            "modelopt_line": modelopt_frame(exc), "modelopt_chain": chain[-8:]}


def environment():
    """What decides ModelOpt's NVFP4 kernels: CUDA, Triton, and ModelOpt's own gate on them."""
    import importlib.metadata as md
    import torch
    import modelopt.torch.kernels.quantization.gemm as gemm
    try:
        triton = md.version("triton")
    except md.PackageNotFoundError:
        triton = None
    return {"torch_cuda_available": torch.cuda.is_available(), "triton": triton,
            "modelopt_triton_kernels_available": gemm.IS_AVAILABLE}


def nll(model, ids, ctx, limits):
    """Mean NLL per predicted token over non-overlapping windows of ctx tokens, each window
    scored alone (its first token not predicted); one result per token limit in limits."""
    out = {}
    total, n = 0.0, 0
    for i, loss, count in common.window_losses(model, ids, ctx, max(limits)):
        total += loss
        n += count
        for lim in limits:
            if i + ctx >= min(lim, len(ids)) and lim not in out:
                out[lim] = (total / n, n)
    return out


E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def dequantize_export(model, export_dir):
    """Loads a ModelOpt NVFP4 export (export_hf_checkpoint, quant_method "modelopt") into the
    dense model, decoded here from the format alone, not by ModelOpt: W.weight is uint8 [N, K/2],
    element 2j in the low nibble and 2j+1 in the high one, each nibble sign (bit 3) and an E2M1
    magnitude index (bits 0-2); W.weight_scale is float8_e4m3fn [N, K/16]; W.weight_scale_2 a
    float32 scalar; w = e2m1 * weight_scale * weight_scale_2. Returns the decoded Linears' count."""
    import glob
    import torch
    from safetensors import safe_open
    table = torch.tensor(E2M1 + tuple(-v for v in E2M1), dtype=torch.float32)
    params = dict(model.named_parameters())
    n = 0
    for path in sorted(glob.glob(os.path.join(export_dir, "*.safetensors"))):
        with safe_open(path, "pt") as f:
            keys = set(f.keys())
            for k in sorted(keys):
                if k.endswith(".weight") and k[:-len("weight")] + "weight_scale" in keys:
                    base = k[:-len("weight")]
                    packed = f.get_tensor(k)
                    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(
                        packed.shape[0], -1).long()
                    s = f.get_tensor(base + "weight_scale").float()
                    s2 = f.get_tensor(base + "weight_scale_2").float()
                    w = table[codes].view(s.shape[0], s.shape[1], -1) * s[..., None] * s2
                    with torch.no_grad():
                        params[k].copy_(w.reshape(params[k].shape))
                    n += 1
    return n


def eval_export(a):
    """NLL of a ModelOpt NVFP4 export decoded by dequantize_export, in this process."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(a.model_dir)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32)
    model.eval()
    res = {"export_dir": a.eval_export, "decoded_linears": dequantize_export(model,
                                                                             a.eval_export)}
    ids = common.eval_ids(tok, a.eval, a.max_tokens)
    limits = sorted({a.short_tokens, a.max_tokens})
    t0 = time.perf_counter()
    r = nll(model, ids, a.ctx, limits)
    res["eval_s"] = time.perf_counter() - t0
    for lim in limits:
        res[f"nll_{lim}"], res[f"tokens_{lim}"] = r[lim]
    print(json.dumps(res, indent=1))


def weight_quantizers(model):
    return [m.weight_quantizer for m in model.modules()
            if hasattr(m, "weight_quantizer") and m.weight_quantizer.is_enabled]


def child(a):
    """One run in this process. Prints a cumulative RESULT line after each stage (the parent
    reads the last one), so a failure keeps what came before it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import llmcompressor_blocks as blocks

    torch.manual_seed(0)
    res = {"loadavg_start": os.getloadavg()[0]}

    def emit():
        print("RESULT " + json.dumps(res), flush=True)

    tok = AutoTokenizer.from_pretrained(a.model_dir)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32)
    model.eval()
    ids = common.eval_ids(tok, a.eval, a.max_tokens)
    if os.path.abspath(a.calib) == os.path.abspath(a.eval):  # disjoint: eval inside the skip
        with open(a.eval, encoding="utf-8") as f:
            head = f.read()[:a.calib_skip_chars]
        n_head = len(tok(head)["input_ids"])
        if n_head < len(ids):
            raise SystemExit(f"modelopt_compare: the first {len(ids)} eval tokens reach past "
                             f"--calib-skip-chars {a.calib_skip_chars} ({n_head} tokens)")
        res["eval_tokens_in_skipped_chars"] = n_head
    limits = sorted({a.short_tokens, a.max_tokens})
    if a.one != "dense":
        import modelopt.torch.quantization as mtq
        calib = blocks.calibration_ids(tok, a.calib_file, a.nsamples, a.seqlen)
        res["calib_sequences"] = len(calib)

        def forward_loop(m):
            with torch.no_grad():
                for c in calib:
                    m(torch.tensor([c]))

        res["env"] = environment()
        cfg = modelopt_config(a.one)
        res["algorithm"] = cfg["algorithm"]
        t0 = time.perf_counter()
        try:
            mtq.quantize(model, cfg, forward_loop)
            res["quantize_s"] = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - the failure is the result
            res["quantize_s"] = time.perf_counter() - t0
            res["error"] = failure("quantize", e)
            emit()
            return
        wq = weight_quantizers(model)
        res["weight_quantizers"] = len(wq)
        res["input_quantizers"] = sum(1 for m in model.modules() if hasattr(m, "input_quantizer")
                                      and m.input_quantizer.is_enabled)
        emit()
        if a.export:
            from modelopt.torch.export import export_hf_checkpoint
            out = os.path.join(a.workdir, f"export-{a.one}")
            t0 = time.perf_counter()
            try:
                # on a copy: the export leaves the model's weights unfit for mtq.compress
                export_hf_checkpoint(copy.deepcopy(model), export_dir=out)
                res["export"] = {"dir": out, "s": time.perf_counter() - t0}
            except Exception as e:  # noqa: BLE001
                res["export"] = {"dir": out, "error": failure("export", e)}
            emit()
    t0 = time.perf_counter()
    res["eval_path"] = "fake-quant" if a.one != "dense" else "dense"
    wq = weight_quantizers(model) if a.one != "dense" else []
    try:
        r = nll(model, ids, a.ctx, limits)
    except Exception as e:  # noqa: BLE001
        res["eval_error"] = failure("eval (fake-quant forward)", e)
        emit()
        dynamic_weights_only = (a.one != "dense" and res.get("input_quantizers") == 0 and
                                all(not getattr(q, "is_static_block_quant", False) for q in wq))
        if not dynamic_weights_only:
            return
        import modelopt.torch.quantization as mtq
        t0 = time.perf_counter()
        try:
            mtq.compress(model)  # real NVFP4 weights; the forward dequantizes them in torch
            res["compress_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            r = nll(model, ids, a.ctx, limits)
            res["eval_path"] = "mtq.compress"
        except Exception as e:  # noqa: BLE001
            res["eval_error_compress"] = failure("eval (mtq.compress)", e)
            emit()
            return
    res["eval_s"] = time.perf_counter() - t0
    res["loadavg_end"] = os.getloadavg()[0]
    for lim in limits:
        res[f"nll_{lim}"], res[f"tokens_{lim}"] = r[lim]
    emit()


def run_ss(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr.strip()[-800:]


def ss_ppl(binary, ckpt, eval_text, ctx, max_tokens):
    rc, out, err = run_ss([binary, "ppl", ckpt, "--text", eval_text, "--ctx", str(ctx),
                           "--max-tokens", str(max_tokens), "--json"])
    if rc != 0:
        return None, err
    j = json.loads(out)
    return (j["nll_per_token"], j["tokens"]), None


def ours(a, name):
    """scalesweep quantize with one selector, then scalesweep ppl on both token counts."""
    out = os.path.join(a.workdir, "ours-" + name.replace(" ", "-").replace("=", ""))
    cmd = [a.bin, "quantize", a.model_dir, "-o", out, "--force"] + OURS[name]
    if "sweep-wmse" in OURS[name]:
        cmd += ["--calib", a.calib_file, "--nsamples", str(a.nsamples), "--seqlen",
                str(a.seqlen)]
    row = {"run": f"ours {name}", "scheme": "W4A16", "cmd": " ".join(cmd[1:]),
           "loadavg_start": os.getloadavg()[0]}
    t0 = time.perf_counter()
    rc, _, err = run_ss(cmd)
    row["quantize_s"] = time.perf_counter() - t0
    if rc != 0:
        row["error"] = {"stage": "scalesweep quantize", "exception": err}
        return row
    for lim in sorted({a.short_tokens, a.max_tokens}):
        r, err = ss_ppl(a.bin, out, a.eval, a.ctx, lim)
        if r is None:
            row["error"] = {"stage": "scalesweep ppl", "exception": err}
            return row
        row[f"nll_{lim}"], row[f"tokens_{lim}"] = r
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(ap, ROOT)
    ap.add_argument("--calib-skip-chars", type=int, default=0,
                    help="calibrate on the text after its first N characters")
    ap.add_argument("--short-tokens", type=int, default=2048)
    ap.add_argument("--runs", default=",".join(RUNS))
    ap.add_argument("--export", action="store_true",
                    help="export_hf_checkpoint each quantized model and scalesweep inspect it")
    ap.add_argument("--ours", action="store_true", help="scalesweep quantize rows too")
    ap.add_argument("--no-dense", action="store_true", help="skip the dense model's row")
    ap.add_argument("--workdir", default="/tmp/scalesweep-modelopt-compare")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", metavar="FILE",
                    help="also write the JSON document to FILE, rewritten after every row (an "
                         "interrupted run keeps its finished rows)")
    ap.add_argument("--eval-export", metavar="DIR",
                    help="only evaluate a ModelOpt NVFP4 export, decoded from its tensors")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--calib-file", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        child(a)
        return
    if a.eval_export:
        eval_export(a)
        return
    for p, what in ((a.model_dir, "model directory"), (a.calib, "--calib"), (a.eval, "--eval")):
        if not os.path.exists(p):
            sys.exit(f"modelopt_compare: {what} {p} does not exist")
    runs = [x for x in a.runs.split(",") if x]
    for x in runs:
        if x not in RUNS:
            sys.exit(f"modelopt_compare: --runs: unknown '{x}' (accepted: {list(RUNS)})")
    os.makedirs(a.workdir, exist_ok=True)
    with open(a.calib, encoding="utf-8") as f:
        text = f.read()
    calib_file = os.path.join(a.workdir, "calib.txt")
    with open(calib_file, "w", encoding="utf-8") as f:
        f.write(text[a.calib_skip_chars:])
    if text[a.calib_skip_chars:] and os.path.abspath(a.calib) == os.path.abspath(a.eval) \
            and a.calib_skip_chars == 0:
        sys.exit("modelopt_compare: --calib and --eval are the same file; calibrate on other "
                 "text or past --calib-skip-chars")
    a.calib_file = calib_file
    log = sys.stderr if a.json else sys.stdout
    rows = []
    for run in ([] if a.no_dense else ["dense"]) + runs:
        cmd = [sys.executable, os.path.abspath(__file__), a.model_dir, "--calib", a.calib,
               "--eval", a.eval, "--nsamples", str(a.nsamples), "--seqlen", str(a.seqlen),
               "--ctx", str(a.ctx), "--max-tokens", str(a.max_tokens), "--short-tokens",
               str(a.short_tokens), "--workdir", a.workdir, "--one", run,
               "--calib-file", calib_file, "--calib-skip-chars", str(a.calib_skip_chars)] + (["--export"] if a.export else [])
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        row = {"run": run, "scheme": "dense" if run == "dense" else
               ("W4A4" if RUNS[run][2] else "W4A16"), "process_s": time.perf_counter() - t0}
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if lines:
            row.update(json.loads(lines[-1][len("RESULT "):]))
        if p.returncode != 0 or not lines:
            row["process_error"] = (p.stderr or p.stdout).strip()[-2000:]
        if run == "dense" and os.path.exists(a.bin):
            for lim in sorted({a.short_tokens, a.max_tokens}):
                r, err = ss_ppl(a.bin, a.model_dir, a.eval, a.ctx, lim)
                row[f"nll_ss_{lim}"] = r[0] if r else err
        if "export" in row and "error" not in row["export"] and os.path.exists(a.bin):
            rc, out, err = run_ss([a.bin, "inspect", row["export"]["dir"]])
            row["export"]["scalesweep_inspect"] = {"rc": rc, "stderr": err,
                                                   "stdout": out[-800:]}
        rows.append(row)
        write_doc(a, rows, final=False)
        err = row.get("error") or row.get("eval_error_compress") or row.get("eval_error")
        if row.get("eval_path") == "mtq.compress":
            err = None  # evaluated after mtq.compress; the fake-quant failure stays in the row
        print(f"{run:20s} {row['scheme']:5s} quantize {row.get('quantize_s', 0):7.1f} s  "
              f"NLL {a.short_tokens} {row.get(f'nll_{a.short_tokens}', float('nan')):.4f}  "
              f"{a.max_tokens} {row.get(f'nll_{a.max_tokens}', float('nan')):.4f}  "
              f"eval {row.get('eval_path', '-')}"
              + (f"  FAILED at {err['stage']}: {err['exception'][:200]} [{err['modelopt_line']}]"
                 if err else ""), file=log, flush=True)
    if a.ours:
        for name in OURS:
            row = ours(a, name)
            rows.append(row)
            write_doc(a, rows, final=False)
            print(f"{row['run']:20s} W4A16 quantize {row['quantize_s']:7.1f} s  "
                  f"NLL {a.short_tokens} {row.get(f'nll_{a.short_tokens}', float('nan')):.4f}  "
                  f"{a.max_tokens} {row.get(f'nll_{a.max_tokens}', float('nan')):.4f}"
                  + (f"  FAILED: {row['error']}" if "error" in row else ""), file=log,
                  flush=True)
    write_doc(a, rows, final=True)


def write_doc(a, rows, final):
    """The JSON document: printed at the end under --json, written to --out after every row."""
    if not (a.out or (final and a.json)):
        return
    import importlib.metadata as md
    vers = {}
    for pkg in ("nvidia-modelopt", "torch", "transformers", "accelerate"):
        try:
            vers[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            vers[pkg] = None
    doc = json.dumps({"model": a.model_dir, "calib": a.calib,
                      "calib_skip_chars": a.calib_skip_chars, "eval": a.eval,
                      "nsamples": a.nsamples, "seqlen": a.seqlen, "ctx": a.ctx,
                      "max_tokens": a.max_tokens, "short_tokens": a.short_tokens,
                      "complete": final, "versions": vers, "runs": rows}, indent=1)
    if a.out:
        with open(a.out + ".tmp", "w", encoding="utf-8") as f:
            f.write(doc + "\n")
        os.replace(a.out + ".tmp", a.out)
    if final and a.json:
        print(doc)


if __name__ == "__main__":
    main()
