#!/usr/bin/env python3
"""Prefill and decode speed and peak memory of `scalesweep generate` (bf16 and fp32 weights;
bf16 weights also with `--compute bf16`, bf16 prefill products) against transformers (torch
fp32 and bf16) on the same Hugging Face model, same thread count.

    python3 bench/real_model_speed.py [--bin build/scalesweep] [--threads 2]
        [--prompt-tokens 512] [--decode 128] [--model-dir DIR] [--no-fp32]

DIR (default /tmp/scalesweep-smollm2) holds bf16/ and f32/ Hugging Face copies of the
SmolLM2-135M-Instruct fixture; they are made from models/smollm2-135m/*.gguf with transformers
(gguf_file=..., save_pretrained) when absent. Each measurement runs in its own process (peak
RSS from getrusage of that process; the best prefill and decode times of --repeat runs). Prints a table with the ratios to transformers.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GGUF_DIR = os.path.join(ROOT, "models/smollm2-135m")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = os.path.join(ROOT, "../shared/data/text/wikitext2_valid.txt")


def make_hf_dirs(model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(GGUF_DIR, gguf_file=GGUF_NAME)
    m = AutoModelForCausalLM.from_pretrained(GGUF_DIR, gguf_file=GGUF_NAME, dtype=torch.float32)
    # save_pretrained refuses a model loaded from GGUF: the state dict (dequantized by
    # transformers) and the config are written directly.
    from safetensors.torch import save_file
    for dt, sub in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        d = os.path.join(model_dir, sub)
        os.makedirs(d, exist_ok=True)
        sd = {k: v.to(dt).contiguous() for k, v in m.state_dict().items()}
        if m.config.tie_word_embeddings:
            sd.pop("lm_head.weight", None)
        save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        cfg = m.config.to_dict()
        cfg.pop("quantization_config", None)
        cfg["dtype"] = "float32" if sub == "f32" else "bfloat16"
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        tok.save_pretrained(d)


def prompt_text(model_dir, n_tokens, text_path):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(os.path.join(model_dir, "bf16"))
    with open(text_path, encoding="utf-8") as f:
        text = f.read(200000)
    ids = tok(text, add_special_tokens=False)["input_ids"][: n_tokens - 1]
    return tok.decode(ids)


def torch_worker(model_dir, dtype, threads, prompt, n_decode, repeat):
    """Runs in a child process: prints one JSON line."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.set_num_threads(threads)
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    src = os.path.join(model_dir, "bf16" if dtype == "bf16" else "f32")
    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=dt)
    model.eval()
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    if tok.bos_token_id is not None and ids[0, 0].item() != tok.bos_token_id:
        ids = torch.cat([torch.tensor([[tok.bos_token_id]]), ids], dim=1)
    best_p = best_d = float("inf")
    with torch.inference_mode():
        for _ in range(repeat):
            t0 = time.perf_counter()
            out = model(ids, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            t1 = time.perf_counter()
            past = out.past_key_values
            for _ in range(n_decode):
                out = model(nxt, past_key_values=past, use_cache=True)
                past = out.past_key_values
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            t2 = time.perf_counter()
            best_p, best_d = min(best_p, t1 - t0), min(best_d, t2 - t1)
    print(json.dumps({"prompt_tokens": ids.shape[1], "prefill_s": best_p,
                      "decode_tokens": n_decode, "decode_s": best_d,
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def run_ours(binary, hf_dir, threads, prompt, n_decode, repeat, compute="fp32"):
    runs = [run_ours_once(binary, hf_dir, threads, prompt, n_decode, compute)
            for _ in range(repeat)]
    best = dict(runs[0])
    best["prefill_s"] = min(r["prefill_s"] for r in runs)
    best["decode_s"] = min(r["decode_s"] for r in runs)
    best["rss_mb"] = max(r["rss_mb"] for r in runs)
    return best


def run_ours_once(binary, hf_dir, threads, prompt, n_decode, compute):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    code = ("import resource, subprocess, sys\n"
            "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
            "sys.stderr.write(r.stderr)\n"
            "if r.returncode: sys.exit(r.returncode)\n"
            "print(r.stdout.strip().splitlines()[-1])\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    p = subprocess.run([sys.executable, "-c", code, binary, "generate", hf_dir, "--prompt", prompt,
                        "--steps", str(n_decode), "--temperature", "0", "--json",
                        "--compute", compute],
                       capture_output=True, text=True, env=env)
    if p.returncode:
        raise SystemExit(f"scalesweep generate failed: {p.stderr}")
    lines = p.stdout.strip().splitlines()
    j = json.loads(lines[-2])
    assert j["compute"] == compute, (j["compute"], compute)
    return {"prompt_tokens": j["n_prompt_tokens"], "prefill_s": j["prefill_seconds"],
            "decode_tokens": j["decode_tokens"], "decode_s": j["decode_seconds"],
            "rss_mb": int(lines[-1]) / 1024}


def run_torch(model_dir, dtype, threads, prompt, n_decode, repeat):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", dtype,
                        "--model-dir", model_dir, "--threads", str(threads),
                        "--decode", str(n_decode), "--repeat", str(repeat), "--prompt", prompt],
                       capture_output=True, text=True, env=env)
    if p.returncode:
        raise SystemExit(f"transformers {dtype} failed: {p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/scalesweep"))
    ap.add_argument("--model-dir", default="/tmp/scalesweep-smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs per configuration; the best prefill and decode times are kept")
    ap.add_argument("--no-fp32", action="store_true", help="skip the fp32-weight rows")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--prompt", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        torch_worker(a.model_dir, a.worker, a.threads, a.prompt, a.decode, a.repeat)
        return 0
    if not os.path.exists(os.path.join(a.model_dir, "bf16", "config.json")):
        print(f"making {a.model_dir}/{{bf16,f32}} from {GGUF_NAME} ...", file=sys.stderr)
        make_hf_dirs(a.model_dir)
    prompt = prompt_text(a.model_dir, a.prompt_tokens, a.text)
    rows = []
    hf = lambda sub: os.path.join(a.model_dir, sub)  # noqa: E731
    configs = [
        ("scalesweep bf16", lambda: run_ours(a.bin, hf("bf16"), a.threads, prompt, a.decode,
                                             a.repeat)),
        ("scalesweep bf16 --compute bf16",
         lambda: run_ours(a.bin, hf("bf16"), a.threads, prompt, a.decode, a.repeat, "bf16")),
        ("scalesweep fp32", lambda: run_ours(a.bin, hf("f32"), a.threads, prompt, a.decode,
                                             a.repeat)),
        ("transformers bf16", lambda: run_torch(a.model_dir, "bf16", a.threads, prompt,
                                                a.decode, a.repeat)),
        ("transformers fp32", lambda: run_torch(a.model_dir, "fp32", a.threads, prompt,
                                                a.decode, a.repeat))]
    if a.no_fp32:
        configs = [c for c in configs if c[0].split()[1] != "fp32"]
    load0 = os.getloadavg()
    for name, fn in configs:
        r = fn()
        r["name"] = name
        r["prefill_tps"] = r["prompt_tokens"] / r["prefill_s"]
        r["decode_tps"] = r["decode_tokens"] / r["decode_s"]
        rows.append(r)
        print(f"  {name}: done", file=sys.stderr)
    ref = {r["name"].split()[1]: r for r in rows if r["name"].startswith("transformers")}
    load1 = os.getloadavg()
    print(f"threads {a.threads}, model {a.model_dir}, best of {a.repeat} runs each; load average "
          f"(1/5/15 min) before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, after "
          f"{load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    print(f"{'':30} {'prompt':>6} {'prefill tok/s':>14} {'decode tok/s':>13} {'peak RSS MB':>12}"
          f"   {'prefill x':>9} {'decode x':>8} {'RSS x':>6}  (x: vs transformers, same dtype)")
    for r in rows:
        t = ref[r["name"].split()[1]]
        print(f"{r['name']:30} {r['prompt_tokens']:6d} {r['prefill_tps']:14.1f} "
              f"{r['decode_tps']:13.1f} {r['rss_mb']:12.0f}   "
              f"{r['prefill_tps'] / t['prefill_tps']:9.2f} {r['decode_tps'] / t['decode_tps']:8.2f} "
              f"{r['rss_mb'] / t['rss_mb']:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
