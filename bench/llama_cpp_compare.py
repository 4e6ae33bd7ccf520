#!/usr/bin/env python3
"""NVFP4 side by side, judged by llama.cpp (llama-cpp-python 0.3.36, scripts/get-llama-cpp.sh):
for each model, llama.cpp's NLL on `scalesweep ppl`'s windows of held-out text, its prompt and
generation speed (tokens/s, --threads threads), our runtime's NLL on the same file and windows
with its prefill/decode speed and peak RSS (`ppl`, `generate`; --no-ours-runtime skips them),
the wall time and peak RSS of each quantization (GNU time) and the file size of

  f32            the source weights as an all-F32 GGUF (the reference row)
  llama.cpp      llama.cpp's own quantizers on that F32 GGUF: NVFP4 (ggml_quantize_chunk:
                 amax/6 UE4M3 scales, no per-tensor scale; bench/llama_cpp_judge.py explains why
                 not llama_model_quantize), Q4_0 and Q4_K_M (llama_model_quantize, no imatrix)
  ours           `scalesweep quantize SRC -o OUT.gguf --dense-dtype q8_0` with RTN + absmax,
                 RTN + sweep-mse, RTN + sweep-wmse and GPTQ with each of the three (sweep-wmse
                 and GPTQ calibrated on the text after the evaluation part: never overlapping);
                 with --target-bpw, mixed precision by sensitivity (`--target-bpw B`, Q8_0
                 where chosen) for each --mixed method, B and --sensitivity

    python3 bench/llama_cpp_compare.py [--bin build/scalesweep]
        [--models smollm2,stories260K,qwen2-1.5b] [--threads 2]
        [--workdir /tmp/scalesweep-llama-cpp] [--max-tokens N] [--no-ours-runtime] [--json]
        [--target-bpw 4.75,5.0 [--mixed rtn:sweep-wmse,gptq:sweep-wmse]
         [--sensitivity relative,kl]] [--rows ROWS.json] [--only 'LABEL;...']

Models: smollm2 = the SmolLM2-135M-Instruct fixture (models/, a Q4_1 GGUF: every variant
starts from the same dequantized Q4_1 weights; its F32 GGUF is llama_model_quantize(ALL_F32));
stories260K = ../shared/data/models/stories260K (llama2.c; its F32 GGUF is llama.cpp's
convert_hf_to_gguf.py on `scalesweep convert`'s HF directory, with our writer's tokenizer keys,
which tokenize as tokenizer.bin does; needs the llama.cpp source tree in $LLAMA_CPP_SRC, default
the unpacked llama-cpp-python sdist's vendor/llama.cpp, and the `sentencepiece` package that
convert_hf_to_gguf.py imports); qwen2-1.5b = the Qwen2.5-Coder-1.5B-Instruct fixture
(scripts/get-qwen2-1.5b.sh, the official Q4_K_M GGUF: every variant starts from its dequantized
weights; not run unless named, about an hour with --calib-nsamples 16 on 2 cores). Evaluation: the first --max-tokens tokens of the text in
fresh windows of --ctx tokens (ppl's rules); the token ids are ours and llama.cpp's own
tokenization is checked equal. Files and each row's result (FILE.result.json, keyed by the
file's size and mtime and the options) are cached in --workdir.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import llama_cpp_judge as lj  # noqa: E402

SHARED = os.path.join(ROOT, "../shared/data")
LLAMA_CPP_SRC = os.environ.get("LLAMA_CPP_SRC",
                               "/work/dl/llama_cpp_python-0.3.36/vendor/llama.cpp")
MODELS = {
    "smollm2": dict(
        source=os.path.join(ROOT, "models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"),
        text=os.path.join(SHARED, "text/wikitext2_valid.txt"), ctx=512, max_tokens=2048,
        calib_seqlen=512),
    "stories260K": dict(
        source=os.path.join(SHARED, "models/stories260K/stories260K.bin"),
        tokenizer=os.path.join(SHARED, "models/stories260K/tok512.bin"),
        text=os.path.join(SHARED, "text/tinystories_val.txt"), ctx=512, max_tokens=16384,
        calib_seqlen=256),
    # Qwen2.5-Coder-1.5B-Instruct, the official Q4_K_M GGUF (scripts/get-qwen2-1.5b.sh): every
    # variant starts from its dequantized Q4_K/Q6_K weights. Ours are written in llama.cpp's
    # llama layout (quantize --gguf-arch llama, the default: every Linear NVFP4).
    "qwen2-1.5b": dict(
        source=os.path.join(ROOT,
                            "models/qwen2.5-coder-1.5b/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
        text=os.path.join(SHARED, "text/wikitext2_valid.txt"), ctx=512, max_tokens=4096,
        calib_seqlen=512),
}
# Evaluation uses the text's first EVAL_CHARS characters (more than --max-tokens tokens need),
# calibration only what follows them: the two never overlap.
EVAL_CHARS = 200_000
# Our decode-speed prompt: the first characters of the evaluation text.
PROMPT_CHARS = 400
# (label, method, GPTQ, extra quantize arguments). The last row is mixed precision as Q4_K_M
# is: down_proj kept in Q8_0 (`--keep-dense down_proj`), every other Linear NVFP4.
OURS = [("ours RTN absmax", "absmax", False, []), ("ours RTN sweep-mse", "sweep-mse", False, []),
        ("ours RTN sweep-wmse", "sweep-wmse", False, []),
        ("ours GPTQ absmax", "absmax", True, []), ("ours GPTQ sweep-mse", "sweep-mse", True, []),
        ("ours GPTQ sweep-wmse", "sweep-wmse", True, []),
        ("ours GPTQ sweep-wmse, down_proj Q8_0", "sweep-wmse", True, ["--keep-dense", "down_proj"])]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def sh(*args):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))}: rc {p.returncode}\n{p.stderr[-3000:]}")
    return p.stdout


def run_measured(*args):
    """Runs a command to completion under GNU time (/usr/bin/time, Debian package `time`);
    returns (stdout, wall seconds, peak RSS in MB of that process). Not os.wait4: a child
    started from this Python keeps the parent's RSS (llama.cpp loaded) as its high-water mark."""
    with tempfile.NamedTemporaryFile("r") as tf:
        t0 = time.time()
        p = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", tf.name, *map(str, args)],
                           capture_output=True, text=True)
        wall = time.time() - t0
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, args))}: rc {p.returncode}\n"
                               f"{p.stderr[-3000:]}")
        return p.stdout, wall, int(tf.read().split()[-1]) / 1024


def llama_cpp_quantize(dst, fn, *args):
    """llama_cpp_judge.FN(*ARGS) (one of llama.cpp's quantizers, writing `dst`) in a process
    of its own, so that its wall time and peak RSS are measured as ours are; recorded in
    dst.quant.json."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import llama_cpp_judge as lj; "
            "a = sys.argv[3:]; getattr(lj, sys.argv[2])(*(int(x) if x.isdigit() else x "
            "for x in a))")
    _, wall, rss = run_measured(sys.executable, "-c", code, os.path.join(ROOT, "bench"), fn,
                                *args)
    with open(dst + ".quant.json", "w") as f:
        json.dump(dict(seconds=wall, peak_rss_mb=rss, args=[fn, *map(str, args)]), f)
    log(f"  {os.path.basename(dst)}: {fn} in {wall:.0f} s, peak RSS {rss:.0f} MB")


def ours_runtime(binary, path, eval_file, max_tokens, ctx, prompt, tg, repeat):
    """Our runtime on the file: NLL on the same windows (ppl), prefill tokens/s, decode
    tokens/s (generate, greedy, best of `repeat`) and the peak RSS of the ppl run."""
    out, _, rss = run_measured(binary, "ppl", path, "--text", eval_file, "--max-tokens",
                               max_tokens, "--ctx", ctx, "--json")
    ppl = json.loads(out)
    out, _, grss = run_measured(binary, "generate", path, "--prompt", prompt, "-n", tg,
                                "--temperature", 0, "--repeat", repeat, "--json")
    gen = json.loads(out)
    return dict(ours_nll=ppl["nll_per_token"], ours_tokens=ppl["tokens"],
                ours_prompt_tps=ppl["prefill_tokens_per_s"],
                ours_gen_tps=gen["best_decode_tokens_per_s"], ours_ppl_rss_mb=rss,
                ours_gen_rss_mb=grss)


def f32_source(name, spec, work, binary):
    """The model's weights as an all-F32 GGUF (see the module docstring)."""
    out = os.path.join(work, f"{name}-f32.gguf")
    if os.path.exists(out):
        return out
    llama_cpp = lj.import_llama_cpp()
    if spec["source"].endswith(".gguf"):
        lj.llama_model_quantize(spec["source"], out, llama_cpp.LLAMA_FTYPE_ALL_F32)
        return out
    hf = os.path.join(work, f"{name}-hf")
    if not os.path.isdir(hf):
        sh(binary, "convert", spec["source"], "--tokenizer", spec["tokenizer"], "-o", hf)
    conv = os.path.join(work, f"{name}-f32-convert_hf_to_gguf.gguf")
    if not os.path.exists(conv):
        env = dict(os.environ, PYTHONPATH=os.path.join(LLAMA_CPP_SRC, "gguf-py"))
        p = subprocess.run([sys.executable, os.path.join(LLAMA_CPP_SRC, "convert_hf_to_gguf.py"),
                            hf, "--outtype", "f32", "--outfile", conv], capture_output=True,
                           text=True, env=env)
        if p.returncode != 0:
            raise RuntimeError(f"convert_hf_to_gguf.py {hf}: rc {p.returncode}\n{p.stderr[-3000:]}")
    tok = os.path.join(work, f"{name}-tokenizer-donor.gguf")
    if not os.path.exists(tok):
        sh(binary, "quantize", spec["source"], "-o", tok, "--method", "absmax", "--force")
    lj.with_tokenizer_of(conv, tok, out)
    return out


def mixed_rows(targets, mixed, sensitivities, samples):
    """OURS-style rows of mixed precision (`quantize --target-bpw B --sensitivity S`): for each
    "rtn:METHOD" or "gptq:METHOD" of `mixed`, each B of `targets` and each S of
    `sensitivities`."""
    rows = []
    for kind_method in filter(None, mixed.split(",")):
        kind, method = kind_method.split(":")
        for b in filter(None, targets.split(",")):
            for sens in filter(None, sensitivities.split(",")):
                extra = ["--target-bpw", b, "--sensitivity", sens]
                if sens in ("kl", "nll"):
                    extra += ["--sensitivity-samples", str(samples)]
                rows.append((f"ours {kind.upper()} {method}, {b} bpw ({sens})", method,
                             kind == "gptq", extra))
    return rows


def variants(name, spec, work, binary, calib, nsamples, skip_gptq, ours=OURS):
    """[(label, path)], building what is missing."""
    llama_cpp = lj.import_llama_cpp()
    src = f32_source(name, spec, work, binary)
    out = [("f32 (source)", src)]
    p = os.path.join(work, f"{name}-llama.cpp-nvfp4.gguf")
    if not os.path.exists(p):
        llama_cpp_quantize(p, "llama_cpp_nvfp4", src, p)
    out.append(("llama.cpp NVFP4", p))
    for label, ftype in (("llama.cpp Q4_0", "LLAMA_FTYPE_MOSTLY_Q4_0"),
                         ("llama.cpp Q4_K_M", "LLAMA_FTYPE_MOSTLY_Q4_K_M")):
        p = os.path.join(work, f"{name}-{label.split()[-1].lower()}.gguf")
        if not os.path.exists(p):
            llama_cpp_quantize(p, "llama_model_quantize", src, p,
                               getattr(llama_cpp, ftype))
        out.append((label, p))
    for label, method, gptq, extra, *rest in ours:
        if gptq and skip_gptq:
            continue
        tag = "-" + "-".join(a.lstrip("-") for a in extra) if extra else ""
        if rest:  # a row's own file tag (--rows)
            tag = "-" + rest[0]
        p = os.path.join(work, f"{name}-ours-{'gptq' if gptq else 'rtn'}-{method}{tag}.gguf")
        if not os.path.exists(p):
            args = [binary, "quantize", spec["source"], "-o", p, "--method", method,
                    "--dense-dtype", "q8_0", "--force", *extra]
            if gptq:
                args += ["--gptq"]
            # activation-weighted, GPTQ or mixed precision: calibration statistics
            if gptq or method.endswith("wmse") or "--target-bpw" in extra:
                args += ["--calib", calib, "--calib-nsamples", nsamples,
                         "--calib-seqlen", spec["calib_seqlen"], "--calib-seed", 0]
            _, wall, rss = run_measured(*args)
            with open(p + ".quant.json", "w") as f:
                json.dump(dict(seconds=wall, peak_rss_mb=rss, args=[str(x) for x in args]), f)
            log(f"  {label}: quantized in {wall:.0f} s, peak RSS {rss:.0f} MB")
        out.append((label, p))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/scalesweep"))
    ap.add_argument("--models", default="smollm2,stories260K")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", default="/tmp/scalesweep-llama-cpp")
    ap.add_argument("--max-tokens", type=int, default=0, help="override each model's default")
    ap.add_argument("--ctx", type=int, default=0, help="override each model's default")
    ap.add_argument("--pp", type=int, default=128, help="prompt tokens for the speed runs")
    ap.add_argument("--tg", type=int, default=32, help="generated tokens for the speed runs")
    ap.add_argument("--repeat", type=int, default=2, help="speed runs; the best counts")
    ap.add_argument("--calib-nsamples", type=int, default=32)
    ap.add_argument("--no-gptq", action="store_true")
    ap.add_argument("--target-bpw", default="",
                    help="comma-separated B: mixed-precision rows (quantize --target-bpw B) for "
                    "each of --mixed")
    ap.add_argument("--mixed", default="rtn:sweep-wmse,gptq:sweep-wmse",
                    help="the mixed-precision rows' RTN/GPTQ and method, comma-separated")
    ap.add_argument("--sensitivity", default="relative",
                    help="comma-separated quantize --sensitivity values of the mixed rows")
    ap.add_argument("--sensitivity-samples", type=int, default=4,
                    help="quantize --sensitivity-samples of the kl/nll rows")
    ap.add_argument("--rows", default="",
                    help="a JSON file of extra rows [label, method, gptq, [quantize args], "
                    "file tag] (e.g. explicit --keep-dense lists)")
    ap.add_argument("--only", default="",
                    help="labels separated by ';': build and score only these rows (f32 "
                    "always)")
    ap.add_argument("--no-ours-runtime", action="store_true",
                    help="score the files with llama.cpp only (not also with `scalesweep ppl` "
                    "and `generate`)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if lj.import_llama_cpp() is None:
        sys.exit("llama_cpp is not installed (scripts/get-llama-cpp.sh)")
    if not os.access("/usr/bin/time", os.X_OK):
        sys.exit("/usr/bin/time is absent (Debian package `time`): it measures peak RSS")
    os.makedirs(a.workdir, exist_ok=True)
    rows = []
    for name in a.models.split(","):
        if name not in MODELS:
            sys.exit(f"--models: unknown model {name!r} (accepted: {', '.join(MODELS)})")
        spec = MODELS[name]
        missing = [p for k, p in spec.items() if k in ("source", "tokenizer", "text")
                   and not os.path.exists(p)]
        if missing:
            log(f"{name}: skipped, missing {', '.join(missing)}")
            continue
        ctx = a.ctx or spec["ctx"]
        max_tokens = a.max_tokens or spec["max_tokens"]
        text = open(spec["text"], encoding="utf-8").read()
        eval_file = os.path.join(a.workdir, f"{name}-eval.txt")
        calib_file = os.path.join(a.workdir, f"{name}-calib.txt")
        with open(eval_file, "w", encoding="utf-8") as f:
            f.write(text[:EVAL_CHARS])
        with open(calib_file, "w", encoding="utf-8") as f:
            f.write(text[EVAL_CHARS:])
        log(f"{name}: building the variants in {a.workdir}")
        ours = OURS + mixed_rows(a.target_bpw, a.mixed, a.sensitivity, a.sensitivity_samples)
        if a.rows:
            with open(a.rows) as f:
                ours += [tuple(r) for r in json.load(f)]
        if a.only:
            keep = set(a.only.split(";"))
            ours = [r for r in ours if r[0] in keep]
        vs = variants(name, spec, a.workdir, a.bin, calib_file, a.calib_nsamples, a.no_gptq,
                      ours)
        if a.only:
            vs = [v for v in vs if v[0] == "f32 (source)" or v[0] in keep]
        # ppl's BOS rule for this tokenizer (its --json says), then the ids it scores.
        add_bos = lj.scalesweep_json(a.bin, "ppl", vs[0][1], "--text", eval_file, "--ctx", 2,
                                     "--max-tokens", 2)["bos"]
        ids = lj.scalesweep_json(a.bin, "tokenize", vs[0][1], "--file", eval_file,
                                 *(["--bos"] if add_bos else []))["ids"][:max_tokens]
        if len(ids) < max_tokens:
            sys.exit(f"{eval_file}: {len(ids)} tokens, fewer than --max-tokens {max_tokens}")
        for label, path in vs:
            t0 = time.time()
            st = os.stat(path)
            key = dict(file=os.path.basename(path), size=st.st_size, mtime=st.st_mtime, ctx=ctx,
                       max_tokens=max_tokens, threads=a.threads, pp=a.pp, tg=a.tg,
                       ours=not a.no_ours_runtime)
            cache = path + ".result.json"
            if os.path.exists(cache):
                with open(cache) as f:
                    c = json.load(f)
                if c.get("key") == key:
                    rows.append(c["row"])
                    log(f"  {label:22s} (cached: {cache})")
                    continue
            judge = lj.Judge(path, n_ctx=ctx, threads=a.threads)
            try:
                own = judge.tokenize(text[:EVAL_CHARS], bos=add_bos)[:max_tokens]
                if own != ids:
                    raise RuntimeError(f"{path}: llama.cpp tokenizes {eval_file} differently")
                nll, n, windows = judge.nll(ids, ctx)
            finally:
                judge.close()
            speed = lj.Judge(path, n_ctx=a.pp + a.tg + 1, threads=a.threads, logits_all=False)
            try:
                pp, tg = speed.speed(ids[:a.pp], a.tg, repeat=a.repeat)
            finally:
                speed.close()
            row = dict(model=name, variant=label, file=os.path.basename(path),
                       mib=os.path.getsize(path) / 2**20, nll=nll / n, ppl=math.exp(nll / n),
                       tokens=n, windows=windows, ctx=ctx,
                       prompt_tps=pp, gen_tps=tg, threads=a.threads)
            if os.path.exists(path + ".quant.json"):
                with open(path + ".quant.json") as f:
                    q = json.load(f)
                row.update(quant_s=q["seconds"], quant_rss_mb=q["peak_rss_mb"])
            if not a.no_ours_runtime:
                row.update(ours_runtime(a.bin, path, eval_file, max_tokens, ctx,
                                        text[:PROMPT_CHARS], a.tg, a.repeat))
            rows.append(row)
            with open(cache + ".tmp", "w") as f:
                json.dump(dict(key=key, row=row), f)
            os.replace(cache + ".tmp", cache)
            log(f"  {label:22s} NLL {row['nll']:.4f}  {row['mib']:.2f} MiB  pp {pp:.0f} tg {tg:.0f}"
                f" tokens/s  ({time.time() - t0:.0f} s)")
    for r in rows:
        base = next(x for x in rows if x["model"] == r["model"] and x["variant"] == "f32 (source)")
        r["dnll_vs_f32"] = r["nll"] - base["nll"]
    if a.json:
        print(json.dumps(dict(rows=rows, llama_cpp=lj.import_llama_cpp().__version__), indent=1))
        return
    print(f"llama.cpp (llama-cpp-python {lj.import_llama_cpp().__version__}) NLL/token on the "
          f"first tokens of held-out text, {a.threads} threads")
    print("NLL: llama.cpp's; ours: `scalesweep ppl` on the same file and windows; quant: wall "
          "seconds and peak RSS of the quantization run")
    print(f"{'model':12s} {'variant':22s} {'MiB':>8s} {'NLL':>8s} {'dNLL':>8s} {'PPL':>8s} "
          f"{'pp t/s':>8s} {'tg t/s':>8s} {'ours NLL':>8s} {'ours pp':>8s} {'ours tg':>8s} "
          f"{'ours MB':>8s} {'quant s':>8s} {'quant MB':>8s}  tokens (ctx)")

    def cell(r, k, fmt):
        return format(r[k], fmt) if k in r else f"{'-':>8s}"

    for r in rows:
        print(f"{r['model']:12s} {r['variant']:22s} {r['mib']:8.2f} {r['nll']:8.4f} "
              f"{r['dnll_vs_f32']:+8.4f} {r['ppl']:8.3f} {r['prompt_tps']:8.0f} "
              f"{r['gen_tps']:8.0f} {cell(r, 'ours_nll', '8.4f')} "
              f"{cell(r, 'ours_prompt_tps', '8.1f')} {cell(r, 'ours_gen_tps', '8.2f')} "
              f"{cell(r, 'ours_ppl_rss_mb', '8.0f')} {cell(r, 'quant_s', '8.0f')} {cell(r, 'quant_rss_mb', '8.0f')}  "
              f"{r['tokens']} ({r['ctx']})")


if __name__ == "__main__":
    main()
