#!/usr/bin/env python3
"""Prefill and decode speed and peak memory of the runtime on GGUF files, against llama.cpp
(llama-cpp-python, the version scripts/get-llama-cpp.sh pins) on the same files, same threads.
A Hugging Face or compressed-tensors directory among the models is run by scalesweep only (its
fp32 or NVFP4 counterpart of a GGUF row, for the ratios between them).

    python3 bench/gguf_speed.py MODEL [MODEL ...] [--bin build/scalesweep]
        [--threads 2] [--prompt-tokens 512] [--decode 64] [--repeat 3] [--json]
        [--no-llama-cpp]

Each measurement runs in its own process: `scalesweep generate FILE --prompt TEXT --steps N
--temperature 0 --json` (its prefill and decode seconds), and a llama.cpp worker that evaluates
the same text as one batch (n_batch = n_ubatch = 512) and then greedy-decodes N tokens one at a
time. Peak RSS is the child's getrusage maximum (it includes the file's mapped pages that were
read). The prompt is the start of WikiText-2 validation cut to --prompt-tokens words-worth of
text (both tokenize it with the file's tokenizer; the table shows both token counts). Rounds
alternate ours and llama.cpp so that both see the same load; best of --repeat for the speeds.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

from real_model_speed import run_ours_once

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = os.path.join(ROOT, "../shared/data/text/wikitext2_valid.txt")


def llama_worker(path, prompt, n_decode, threads):
    """Runs in a child process: prints one JSON line."""
    import numpy as np
    from llama_cpp_judge import import_llama_cpp
    llama_cpp = import_llama_cpp()  # without AMX's buffer type on an AMX CPU (see there)
    llm = llama_cpp.Llama(path, n_ctx=4096, n_batch=512, n_ubatch=512, n_threads=threads,
                          n_threads_batch=threads, verbose=False)
    toks = llm.tokenize(prompt.encode(), add_bos=True)
    n_vocab = llm.n_vocab()

    def last():
        p = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(p, shape=(n_vocab,))))

    t0 = time.perf_counter()
    llm.eval(toks)
    nxt = last()
    t1 = time.perf_counter()
    for _ in range(n_decode):
        llm.eval([nxt])
        nxt = last()
    t2 = time.perf_counter()
    print(json.dumps({"prompt_tokens": len(toks), "prefill_s": t1 - t0, "decode_s": t2 - t1,
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def run_llama(path, prompt, n_decode, threads):
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", path,
                        "--decode", str(n_decode), "--threads", str(threads),
                        "--prompt-text", prompt], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"llama.cpp on {path} failed: {p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_ours(binary, path, prompt, n_decode, threads):
    # real_model_speed's measurement (its own process, getrusage of the child), fp32 compute.
    return run_ours_once(binary, path, threads, prompt, n_decode, "fp32")


def best(runs, n_decode):
    b = dict(runs[0])
    b["prefill_s"] = min(r["prefill_s"] for r in runs)
    b["decode_s"] = min(r["decode_s"] for r in runs)
    b["rss_mb"] = max(r["rss_mb"] for r in runs)
    b["prefill_tok_s"] = b["prompt_tokens"] / b["prefill_s"]
    b["decode_tok_s"] = n_decode / b["decode_s"]
    return b


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", help="GGUF files or model directories")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/scalesweep"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--prompt-text", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        llama_worker(a.worker, a.prompt_text, a.decode, a.threads)
        return
    if not a.models:
        ap.error("give at least one model")
    have_llama = not a.no_llama_cpp
    if have_llama:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            print("llama-cpp-python is not installed (scripts/get-llama-cpp.sh): "
                  "llama.cpp rows skipped", file=sys.stderr)
            have_llama = False
    words = open(TEXT, encoding="utf-8").read().split(" ")
    # About 0.75 words a token for WikiText under BPE vocabularies of 32k-150k.
    prompt = " ".join(words[: int(a.prompt_tokens * 0.75)])
    rows = []
    for path in a.models:
        ours, theirs = [], []
        judge = have_llama and path.endswith(".gguf")
        for _ in range(a.repeat):
            ours.append(run_ours(a.bin, path, prompt, a.decode, a.threads))
            if judge:
                theirs.append(run_llama(path, prompt, a.decode, a.threads))
        name = os.path.basename(path.rstrip("/"))
        rows.append({"file": name, "runtime": "scalesweep", **best(ours, a.decode)})
        if judge:
            rows.append({"file": name, "runtime": "llama.cpp", **best(theirs, a.decode)})
    if a.json:
        print(json.dumps({"threads": a.threads, "decode_tokens": a.decode, "repeat": a.repeat,
                          "rows": rows}, indent=1))
        return
    print(f"{a.threads} threads, best of {a.repeat}; decode {a.decode} tokens greedy")
    print(f"{'file':48} {'runtime':11} {'prompt':>6} {'prefill tok/s':>13} "
          f"{'decode tok/s':>12} {'peak RSS MB':>11}")
    for r in rows:
        print(f"{r['file'][:48]:48} {r['runtime']:11} {r['prompt_tokens']:6d} "
              f"{r['prefill_tok_s']:13.1f} {r['decode_tok_s']:12.2f} {r['rss_mb']:11.0f}")
    pairs = [(rows[i], rows[i + 1]) for i in range(len(rows) - 1)
             if rows[i + 1]["runtime"] == "llama.cpp" and rows[i]["file"] == rows[i + 1]["file"]]
    if pairs:
        print("\nratios ours / llama.cpp (prefill, decode, RSS):")
        for o, t in pairs:
            print(f"  {o['file'][:48]:48} {o['prefill_tok_s'] / t['prefill_tok_s']:6.2f}x "
                  f"{o['decode_tok_s'] / t['decode_tok_s']:6.2f}x {o['rss_mb'] / t['rss_mb']:6.2f}x")


if __name__ == "__main__":
    main()
