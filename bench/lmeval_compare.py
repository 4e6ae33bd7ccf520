#!/usr/bin/env python3
"""`scalesweep eval` against lm-evaluation-harness 0.4.13, item by item.

Runs lm-eval (hf backend, fp32, CPU, batch size 1: every request is its own forward pass, so
no padding and no batch-shape-dependent GEMM rounding) on the first N docs of each task, with
the task YAMLs of bench/lmeval_tasks (lm-eval's stock definitions reading data/eval), and runs
ours:

    $SCALESWEEP_BIN eval MODEL_DIR --tasks T1,T2 --limit N --data DATA \\
        --log-samples OURS.jsonl --json --threads T

then matches every loglikelihood request by (task, doc_id, request index) and prints a table
per task: docs, accuracies (acc, acc_norm where the task has it; lambada: acc and perplexity),
max |Δ loglikelihood|, requests with |Δ| > tol, context/continuation string mismatches,
chosen-answer agreement, near-ties (docs whose best two choices by the metric's score, ll for
acc and ll/len(choice) for acc_norm, are within --tie in lm-eval's values: those may disagree
legitimately) and both wall times. Exit status 1 when anything fails (see `failures`).

    python3 bench/lmeval_compare.py MODEL --tasks arc_easy,hellaswag --limit 20 [--json OUT]

--quant W|WA|WAKV|WAKVQ --method M --stats F [--format --block] compares simulated quantization:
ours runs `scalesweep eval --quant Q --method M --stats F`, lm-eval the `scalesweep` model
(python/scalesweep/lm_eval.py: HFLM + scalesweep.torch.simulate, model_args quant=Q,method=M,
stats=F; scalesweep must be importable by lm-eval's python, e.g. PYTHONPATH=build/python).

MODEL is a Hugging Face model directory, or a .gguf that transformers dequantizes into an fp32
directory first (--work keeps it; the project fixture is
models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf). --tasks takes task names, `mmlu`
(all 57 subjects) and mmlu_<subject>. --lmeval-dir DIR reuses an lm-eval output folder
(results_*.json + samples_*.jsonl) instead of running lm-eval; --ours-samples/--ours-json reuse
our files instead of running the binary.
"""
import argparse
import glob
import json
import math
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "lmeval_tasks"))
import generate  # noqa: E402  (bench/lmeval_tasks/generate.py)
sys.path.insert(0, HERE)
from gguf_dense import dense_from_gguf  # noqa: E402

DEFAULT_TASKS = ["arc_easy", "hellaswag", "winogrande", "piqa", "boolq", "lambada_openai"]
TARGET_DELIMITER = " "  # lm-eval's default; none of these tasks sets another
NORM_TASKS = {"arc_easy", "arc_challenge", "hellaswag", "piqa"}  # tasks with acc_norm


# ---------------------------------------------------------------------------------------------
# model

def hf_dir_from_gguf(gguf, out):
    """transformers dequantizes the GGUF; its state dict goes into a plain fp32 Llama saved as
    safetensors with the tokenizer (bench/gguf_dense.py, shared with
    python/tests/test_smollm2_transformers.py)."""
    if os.path.exists(os.path.join(out, "model.safetensors")):
        return out
    tok, plain = dense_from_gguf(gguf)
    tmp = out + ".tmp"
    plain.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    os.rename(tmp, out)
    return out


# ---------------------------------------------------------------------------------------------
# running both sides

def expand_tasks(spec):
    out = []
    for t in spec:
        if t == "mmlu":
            out += ["mmlu_" + s for s in generate.mmlu_subjects()]
        else:
            out.append(t)
    return out


LMEVAL_WORKER = r"""
import sys, torch
torch.set_num_threads(int(sys.argv[1]))
if "scalesweep" in sys.argv[2:]:  # --model scalesweep: as `python -m scalesweep.lm_eval`
    import scalesweep.lm_eval  # noqa: F401  (registers the model)
from lm_eval.__main__ import cli_evaluate
sys.argv = ["lm-eval"] + sys.argv[2:]
cli_evaluate()
"""


def sim_args(sim):
    """`scalesweep eval` options of a simulated-quantization setting (None or quant none: no
    options): {"quant", "method", "stats", "format", "block"}."""
    if not sim or str(sim.get("quant", "none")).lower() in ("none", "fp"):
        return []
    out = ["--quant", sim["quant"], "--method", sim["method"]]
    if sim.get("stats"):
        out += ["--stats", os.path.abspath(sim["stats"])]
    if sim.get("format"):
        out += ["--format", sim["format"]]
    if sim.get("block"):
        out += ["--block", str(sim["block"])]
    return out


def lmeval_model(model_dir, threads, sim=None):
    """lm-eval's --model and --model_args: the stock hf model, or the scalesweep model
    (python/scalesweep/lm_eval.py: HFLM + scalesweep.torch.simulate) with the same setting."""
    args = f"pretrained={os.path.abspath(model_dir)},dtype=float32"
    if not sim_args(sim):
        return "hf", args
    args += f",quant={sim['quant']},method={sim['method']},threads={threads}"
    if sim.get("stats"):
        args += f",stats={os.path.abspath(sim['stats'])}"
    if sim.get("format"):
        args += f",format={sim['format']}"
    if sim.get("block"):
        args += f",block={sim['block']}"
    return "scalesweep", args


def run_lmeval(model_dir, tasks, limit, data, out_dir, threads, batch_size=1, log=None,
               chat=False, sim=None):
    """lm-eval's CLI in a child python with torch.set_num_threads(threads); returns the folder
    holding results_*.json and samples_*.jsonl, and the wall time. chat: --apply_chat_template
    (its CLI then also sets fewshot_as_multiturn, as ours does by default). sim: a simulated
    quantization setting (sim_args): the scalesweep model instead of hf."""
    task_dir = os.path.join(out_dir, "tasks")
    generate.write_tasks(task_dir, data)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS=str(threads))
    # OpenMP threads that sleep instead of spinning at barriers: the same thread count and so
    # the same GEMM partitioning (the same numbers), but on a shared, oversubscribed machine a
    # 2-thread forward pass measured 11x faster (0.27 s vs 3.0 s for 40 tokens, load 7 on 2
    # cores). Override by setting OMP_WAIT_POLICY.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    name, margs = lmeval_model(model_dir, threads, sim)
    cmd = [sys.executable, "-c", LMEVAL_WORKER, str(threads), "run",
           "--model", name, "--model_args", margs,
           "--device", "cpu", "--batch_size", str(batch_size),
           "--tasks", ",".join(tasks), "--include_path", task_dir,
           "--log_samples", "--output_path", os.path.join(out_dir, "out")]
    if limit:
        cmd += ["--limit", str(limit)]
    if chat:
        cmd += ["--apply_chat_template"]
    t0, c0 = time.time(), _child_cpu()
    with open(log or os.devnull, "w") as fh:
        p = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    wall, cpu = time.time() - t0, _child_cpu() - c0
    if p.returncode != 0:
        tail = open(log).read()[-3000:] if log else ""
        raise RuntimeError(f"lm-eval failed (rc={p.returncode})\n{tail}")
    res = glob.glob(os.path.join(out_dir, "out", "*", "results_*.json"))
    if len(res) != 1:
        raise RuntimeError(f"lm-eval: expected one results file under {out_dir}/out, got {res}")
    return os.path.dirname(res[0]), wall, cpu


def _child_cpu():
    """CPU seconds (user + system) of the finished children: on a shared machine the wall time
    depends on the load, this much less."""
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_ours(binary, model_dir, tasks, limit, data, out_dir, threads, chat=False, sim=None):
    samples = os.path.join(out_dir, "ours_samples.jsonl")
    cmd = [binary, "eval", model_dir, "--tasks", ",".join(tasks), "--data", data,
           "--log-samples", samples, "--json", "--threads", str(threads), "--force"]
    cmd += sim_args(sim)
    if limit:
        cmd[5:5] = ["--limit", str(limit)]
    if chat:
        cmd += ["--apply-chat-template"]
    t0, c0 = time.time(), _child_cpu()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall, cpu = time.time() - t0, _child_cpu() - c0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: rc={p.returncode}\n{p.stdout[-2000:]}\n"
                           f"{p.stderr[-2000:]}")
    with open(os.path.join(out_dir, "ours.json"), "w") as f:
        f.write(p.stdout)
    return samples, json.loads(p.stdout), wall, cpu


# ---------------------------------------------------------------------------------------------
# reading both sides

def load_lmeval(folder):
    """{task: {doc_id: {"target": .., "requests": [{context, continuation, loglikelihood,
    is_greedy}], "metrics": {..}}}}, {task: {metric: value}}, lm-eval's own timing."""
    res = sorted(glob.glob(os.path.join(folder, "results_*.json")))
    if not res:
        raise RuntimeError(f"no results_*.json in {folder}")
    results = json.load(open(res[-1]))
    stamp = os.path.basename(res[-1])[len("results_"):-len(".json")]
    docs = {}
    for task in results["results"]:
        path = os.path.join(folder, f"samples_{task}_{stamp}.jsonl")
        if not os.path.exists(path):
            continue  # a group row
        per = {}
        for line in open(path, encoding="utf-8"):
            s = json.loads(line)
            args = s["arguments"]
            reqs = []
            for i in range(len(args)):
                a = args[f"gen_args_{i}"]
                ll, greedy = s["filtered_resps"][i]
                reqs.append({"context": a["arg_0"], "continuation": a["arg_1"],
                             "loglikelihood": float(ll), "is_greedy": _bool(greedy)})
            per[int(s["doc_id"])] = {"target": s["target"], "gold": lmeval_gold(task, s),
                                     "requests": reqs,
                                     "metrics": {m: s[m] for m in s.get("metrics", [])}}
        docs[task] = per
    metrics = {}
    for task, r in results["results"].items():
        metrics[task] = {k.split(",")[0]: v for k, v in r.items()
                         if "," in k and k.split(",")[1] == "none"}
    timing = results.get("total_evaluation_time_seconds")
    return docs, metrics, float(timing) if timing is not None else None


def _bool(x):
    return x if isinstance(x, bool) else str(x) == "True"


def load_ours(samples_path):
    docs = {}
    for n, line in enumerate(open(samples_path, encoding="utf-8"), 1):
        if not line.strip():
            continue
        s = json.loads(line)
        key = int(s["doc_id"])
        per = docs.setdefault(s["task"], {})
        if key in per:
            raise ValueError(f"{samples_path}:{n}: {s['task']} doc {key} twice")
        per[key] = s
    return docs


# ---------------------------------------------------------------------------------------------
# the comparison

def _argmax(xs):
    best = 0
    for i, x in enumerate(xs):
        if x > xs[best]:
            best = i  # first maximum, as numpy.argmax
    return best


def _gap(xs):
    """Distance between the best and the second-best score."""
    if len(xs) < 2:
        return math.inf
    s = sorted(xs, reverse=True)
    return s[0] - s[1]


def _choice_len(continuation, delimiter=TARGET_DELIMITER):
    # lm-eval's acc_norm divides by len(choice) in characters; the request's continuation is
    # target_delimiter + choice (no delimiter under --apply_chat_template).
    assert continuation.startswith(delimiter), continuation
    return float(len(continuation) - len(delimiter))


def lmeval_gold(task, sample):
    """The gold choice index of an lm-eval sample: its `target` is the index as a string for
    these multiple-choice tasks; winogrande's is the shared continuation text, so the index comes
    from the doc's answer ("1"/"2") as lm-eval's doc_to_text maps it; lambada has none."""
    if task.startswith("lambada"):
        return None
    if task == "winogrande":
        return {"1": 0, "2": 1}[sample["doc"]["answer"]]
    return int(sample["target"])


def compare_task(task, lm_docs, ours_docs, lm_metrics, ours_metrics, tol=1e-4, tie=1e-4,
                 token_counter=None, referee=None, delimiter=TARGET_DELIMITER,
                 f64_tol_per_token=1e-6):
    r = {"task": task, "docs": len(lm_docs), "failures": []}
    fail = r["failures"].append
    missing = sorted(set(lm_docs) - set(ours_docs))
    extra = sorted(set(ours_docs) - set(lm_docs))
    if missing:
        fail(f"{len(missing)} docs lm-eval scored are missing from ours (first {missing[:5]})")
    if extra:
        fail(f"{len(extra)} docs in ours that lm-eval did not score (first {extra[:5]})")
    lambada = task.startswith("lambada")
    has_norm = task in NORM_TASKS
    n_req = n_over = n_str = n_greedy = n_tok = n_metric = n_lm_off = 0
    lm_off_max = ours_off_max = 0.0
    max_d = 0.0
    worst = None
    dlls = []
    str_examples, tok_examples = [], []
    agree = {"acc": 0, "acc_norm": 0}
    disagree = {"acc": [], "acc_norm": []}
    near = {"acc": [], "acc_norm": []}
    lm_acc, ours_acc = {"acc": [], "acc_norm": []}, {"acc": [], "acc_norm": []}
    lm_ll_sum = ours_ll_sum = 0.0
    for doc_id in sorted(set(lm_docs) & set(ours_docs)):
        L, O = lm_docs[doc_id], ours_docs[doc_id]
        lr, orq = L["requests"], O["requests"]
        if len(lr) != len(orq):
            fail(f"doc {doc_id}: lm-eval has {len(lr)} requests, ours {len(orq)}")
            continue
        for i, (a, b) in enumerate(zip(lr, orq)):
            n_req += 1
            if a["context"] != b["context"] or a["continuation"] != b["continuation"]:
                n_str += 1
                if len(str_examples) < 3:
                    str_examples.append({"doc_id": doc_id, "request": i,
                                         "lm_eval": [a["context"], a["continuation"]],
                                         "ours": [b["context"], b["continuation"]]})
            d = abs(a["loglikelihood"] - float(b["loglikelihood"]))
            dlls.append(d)
            if not d <= max_d:  # NaN counts as worst
                max_d = d if d == d else math.inf
                worst = {"doc_id": doc_id, "request": i, "lm_eval": a["loglikelihood"],
                         "ours": b["loglikelihood"]}
            if not d <= tol:
                # lm-eval reduces log_softmax and the sum over the continuation in fp32, which
                # drifts by up to ~1e-5 per token: the float64 referee (same model and tokens)
                # decides which side is off. Ours within tol of it: lm-eval's rounding.
                ref = referee(a["context"], a["continuation"]) if referee else None
                # fp32 forward passes (ours too) round each token's logit: their distance to
                # the float64 value grows with the continuation's length.
                ref_tol = tol + f64_tol_per_token * float(b.get("tokens", 1))
                if ref is not None and abs(float(b["loglikelihood"]) - ref) <= ref_tol:
                    n_lm_off += 1
                    lm_off_max = max(lm_off_max, abs(a["loglikelihood"] - ref))
                    ours_off_max = max(ours_off_max, abs(float(b["loglikelihood"]) - ref))
                else:
                    n_over += 1
            if bool(a["is_greedy"]) != bool(b.get("is_greedy")):
                n_greedy += 1
            if token_counter is not None and "tokens" in b:
                want = token_counter(a["context"], a["continuation"])
                if want != b["tokens"]:
                    n_tok += 1
                    if len(tok_examples) < 3:
                        tok_examples.append({"doc_id": doc_id, "request": i,
                                             "lm_eval": want, "ours": b["tokens"]})
        if lambada:
            a, b = lr[0], orq[0]
            lm_ll_sum += a["loglikelihood"]
            ours_ll_sum += float(b["loglikelihood"])
            lm_acc["acc"].append(int(a["is_greedy"]))
            ours_acc["acc"].append(int(bool(b["is_greedy"])))
            if bool(a["is_greedy"]) == bool(b["is_greedy"]):
                agree["acc"] += 1
            else:
                disagree["acc"].append(doc_id)
            if int(O.get("metrics", {}).get("acc", int(bool(b["is_greedy"])))) != \
                    int(bool(b["is_greedy"])):
                n_metric += 1
            continue
        gold = L["gold"]
        try:
            ours_gold = int(O["target"])
        except (KeyError, TypeError, ValueError):
            ours_gold = None
        if ours_gold != gold:
            fail(f"doc {doc_id}: ours' target {O.get('target')!r}, lm-eval's gold {gold}")
        la = [x["loglikelihood"] for x in lr]
        oa = [float(x["loglikelihood"]) for x in orq]
        scores = {"acc": (la, oa)}
        if has_norm:
            lens = [_choice_len(x["continuation"], delimiter) for x in lr]
            scores["acc_norm"] = ([x / n for x, n in zip(la, lens)],
                                  [x / n for x, n in zip(oa, lens)])
        for m, (ls, os_) in scores.items():
            lp, op = _argmax(ls), _argmax(os_)
            lm_acc[m].append(int(lp == gold))
            ours_acc[m].append(int(op == gold))
            if lp == op:
                agree[m] += 1
            else:
                disagree[m].append(doc_id)
            if _gap(ls) <= tie:
                near[m].append(doc_id)
            # lm-eval's own per-doc metric must be what its lls give (checks our reading of
            # its files, the gold index included); ours must be what our lls give.
            if m in L["metrics"] and int(L["metrics"][m]) != int(lp == gold):
                fail(f"doc {doc_id}: lm-eval's {m} {L['metrics'][m]} is not what its "
                     f"loglikelihoods give with gold {gold} (reading error)")
            if m in O.get("metrics", {}) and int(O["metrics"][m]) != int(op == gold):
                n_metric += 1
    r.update({
        "requests": n_req, "max_abs_dll": max_d, "worst": worst, "over_tol": n_over,
        "within_tol": sum(1 for d in dlls if d <= tol),
        "median_abs_dll": sorted(dlls)[len(dlls) // 2] if dlls else None,
        "lm_eval_off_f64": n_lm_off, "lm_eval_off_f64_max": lm_off_max,
        "ours_vs_f64_max_there": ours_off_max,
        "tol": tol, "string_mismatches": n_str, "string_examples": str_examples,
        "greedy_mismatches": n_greedy, "token_mismatches": n_tok if token_counter else None,
        "token_examples": tok_examples, "ours_metric_inconsistent": n_metric, "tie": tie,
    })
    metrics = ["acc", "acc_norm"] if has_norm else ["acc"]
    for m in metrics:
        near_set = set(near[m])
        r[m] = {
            "lm_eval": lm_metrics.get(m), "ours": (ours_metrics or {}).get(m),
            "lm_eval_from_docs": _mean(lm_acc[m]), "ours_from_docs": _mean(ours_acc[m]),
            "agree": agree[m], "disagree": disagree[m],
            "disagree_not_near_tie": [d for d in disagree[m] if d not in near_set],
            "near_ties": near[m],
        }
    if lambada and n_req:
        r["perplexity"] = {"lm_eval": lm_metrics.get("perplexity"),
                           "ours": (ours_metrics or {}).get("perplexity"),
                           "lm_eval_from_docs": math.exp(-lm_ll_sum / n_req),
                           "ours_from_docs": math.exp(-ours_ll_sum / n_req)}
    # verdicts
    if n_over:
        fail(f"{n_over} of {n_req} requests differ by more than {tol} (max {max_d:.3g})")
    if n_str:
        fail(f"{n_str} requests with a different context or continuation string")
    if n_tok:
        fail(f"{n_tok} requests whose continuation token count differs from lm-eval's "
             "tokenization")
    if n_metric:
        fail(f"{n_metric} docs where ours' metrics are not what its loglikelihoods give")
    for m in metrics:
        x = r[m]
        if x["disagree_not_near_tie"]:
            fail(f"{m}: chosen answers differ on docs {x['disagree_not_near_tie'][:10]} "
                 "that are no near-ties")
        if lm_metrics.get(m) is not None and x["lm_eval_from_docs"] is not None and \
                abs(lm_metrics[m] - x["lm_eval_from_docs"]) > 1e-9:
            fail(f"{m}: lm-eval's reported {lm_metrics[m]} is not the mean of its docs "
                 f"{x['lm_eval_from_docs']} (reading error)")
        if ours_metrics is not None:
            if x["ours"] is None:
                fail(f"{m}: absent from ours' --json results")
            elif not x["near_ties"] and lm_metrics.get(m) is not None and \
                    abs(x["ours"] - lm_metrics[m]) > 1e-9:
                fail(f"{m}: ours {x['ours']} != lm-eval {lm_metrics[m]} with no near-ties")
            elif x["ours_from_docs"] is not None and abs(x["ours"] - x["ours_from_docs"]) > 1e-9:
                fail(f"{m}: ours' reported {x['ours']} is not the mean of its docs "
                     f"{x['ours_from_docs']}")
            if ours_metrics.get("n") is not None and ours_metrics["n"] != len(ours_docs):
                fail(f"ours' n {ours_metrics['n']} != its {len(ours_docs)} logged docs")
    if lambada and n_req and ours_metrics is not None:
        p = r["perplexity"]
        if p["ours"] is not None and abs(p["ours"] - p["lm_eval"]) > 1e-4 * p["lm_eval"]:
            fail(f"perplexity: ours {p['ours']} vs lm-eval {p['lm_eval']}")
    r["ok"] = not r["failures"]
    return r


def _mean(xs):
    return sum(xs) / len(xs) if xs else None


def compare(lm_docs, lm_metrics, ours_docs, ours_results, tasks, **kw):
    rows = []
    for t in tasks:
        if t not in lm_docs:
            rows.append({"task": t, "ok": False, "failures": ["lm-eval has no samples"]})
            continue
        rows.append(compare_task(t, lm_docs[t], ours_docs.get(t, {}), lm_metrics.get(t, {}),
                                 None if ours_results is None else ours_results.get(t, {}),
                                 **kw))
    return rows


def f64_referee(model_dir, sim=None):
    """(context, continuation) -> loglikelihood by transformers in float64 on lm-eval's tokens
    (its _encode_pair with tok_encode's has_bos_prefix rule), log_softmax and sum in float64:
    the exact value both sides round. sim: a simulated quantization setting, applied with
    scalesweep.torch.simulate to the float64 model (its quantize-dequantize runs in float32 on
    float64 inputs rounded to float32, so there the referee is close, not exact: an element
    on a rounding boundary may fall the other way)."""
    import torch
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    model.eval()
    if sim_args(sim):
        from scalesweep.torch import simulate
        simulate(model, sim["quant"], method=sim["method"], stats=sim.get("stats"),
                 block=sim.get("block") or None, format=sim.get("format") or "nvfp4",
                 keep_original=False)
    enc = lmeval_tok_encode(tok)

    def score(context, continuation):
        n = len(context) - len(context.rstrip())
        if n:
            continuation = context[-n:] + continuation
            context = context[:-n]
        whole = enc(context + continuation)
        ctx = enc(context)
        cont = whole[len(ctx):]
        with torch.no_grad():
            logits = model(torch.tensor([whole[:-1]])).logits[0]
        lp = torch.log_softmax(logits, dim=-1)
        return float(sum(lp[len(ctx) - 1 + i, t].item() for i, t in enumerate(cont)))

    return score


def lmeval_tok_encode(tok):
    """HFLM.tok_encode with add_bos_token unset: the tokenizer's own special tokens, none for a
    text that already starts with the prefix token (BOS, else EOS) as text."""
    bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    bos_str = tok.decode(bos)

    def enc(s):
        return tok.encode(s, add_special_tokens=False) if s.startswith(bos_str) \
            else tok.encode(s)

    return enc


def lmeval_token_counter(model_dir):
    """Continuation token count as lm-eval 0.4.13 HFLM tokenizes a (context, continuation) pair
    (TemplateLM._encode_pair with HFLM.tok_encode, add_bos_token unset)."""
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    enc = lmeval_tok_encode(tok)

    def count(context, continuation):
        if context == "":
            c = tok.encode(continuation, add_special_tokens=False)
            return len(c) if c[0] != bos else len(c) - 1
        n = len(context) - len(context.rstrip())
        if n:
            context, continuation = context[:-n], context[-n:] + continuation
        return len(enc(context + continuation)) - len(enc(context))
    return count


# ---------------------------------------------------------------------------------------------
# the fake "ours" (developing the comparison before `scalesweep eval` exists; tests)

def ours_from_lmeval(lm_docs, token_counter=None):
    """Our log-samples format made from lm-eval's own samples: the comparison must pass it."""
    out = []
    for task, per in lm_docs.items():
        for doc_id in sorted(per):
            d = per[doc_id]
            reqs = [dict(x) for x in d["requests"]]
            if token_counter:
                for x in reqs:
                    x["tokens"] = token_counter(x["context"], x["continuation"])
            target = d["target"] if d["gold"] is None else d["gold"]
            out.append({"task": task, "doc_id": doc_id, "target": target, "requests": reqs,
                        "metrics": {m: int(v) for m, v in d["metrics"].items()
                                    if m in ("acc", "acc_norm")}})
    return out


# ---------------------------------------------------------------------------------------------
# report

def fmt_table(rows, walls):
    lines = []
    hdr = (f"{'task':<34} {'docs':>5} {'metric':<10} {'lm-eval':>9} {'ours':>9} "
           f"{'agree':>7} {'near-tie':>8} {'max|dll|':>9} {'lm-off':>6} {'>tol':>5} {'str!=':>5} ok")
    lines.append(hdr)
    lines.append("-" * len(hdr))
    for r in rows:
        if "requests" not in r:
            lines.append(f"{r['task']:<34} {'':>5} FAILED: {'; '.join(r['failures'])}")
            continue
        ms = [m for m in ("acc", "acc_norm", "perplexity") if m in r]
        for k, m in enumerate(ms):
            x = r[m]
            lv, ov = x["lm_eval"], x["ours"]
            f = "{:.2f}" if m == "perplexity" else "{:.4f}"
            ag = f"{x['agree']}/{r['docs']}" if "agree" in x else ""
            nt = str(len(x["near_ties"])) if "near_ties" in x else ""
            head = (f"{r['task']:<34} {r['docs']:>5}" if k == 0 else f"{'':<34} {'':>5}")
            tail = (f" {r['max_abs_dll']:>9.2e} {r.get('lm_eval_off_f64', 0):>6}"
                    f" {r['over_tol']:>5} {r['string_mismatches']:>5}"
                    f" {'yes' if r['ok'] else 'NO'}") if k == 0 else ""
            lines.append(f"{head} {m:<10} {_f(f, lv):>9} {_f(f, ov):>9} {ag:>7} {nt:>8}{tail}")
        if r["within_tol"] != r["requests"]:
            lines.append(f"    {r['within_tol']}/{r['requests']} requests within tol "
                         f"{r['tol']:g}; median |dll| {r['median_abs_dll']:.2e}")
        if r.get("lm_eval_off_f64"):
            lines.append(f"    {r['lm_eval_off_f64']} requests over tol with ours within tol of "
                         f"the float64 value (lm-eval off by up to "
                         f"{r['lm_eval_off_f64_max']:.2e}, ours by up to "
                         f"{r['ours_vs_f64_max_there']:.2e})")
        for msg in r["failures"]:
            lines.append(f"    ! {msg}")
    lines.append("")
    lines.append("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in walls.items()
                                      if v is not None)
                 + f"  (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    return "\n".join(lines)


def _f(f, v):
    return "-" if v is None else f.format(v)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="HF model directory or .gguf")
    ap.add_argument("--tasks", default=",".join(DEFAULT_TASKS))
    ap.add_argument("--limit", type=int, default=20, help="first N docs of each task (0: all)")
    ap.add_argument("--data", default=os.path.abspath(os.path.join(HERE, "../data/eval")))
    ap.add_argument("--bin", default=os.environ.get(
        "SCALESWEEP_BIN", os.path.abspath(os.path.join(HERE, "../build/scalesweep"))))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=1, help="lm-eval's (1: no padding)")
    ap.add_argument("--work", help="keep lm-eval's output, ours and the fp32 model here")
    ap.add_argument("--lmeval-dir", help="reuse this lm-eval output folder (no lm-eval run)")
    ap.add_argument("--ours-samples", help="reuse our log-samples file (no scalesweep run)")
    ap.add_argument("--ours-json", help="with --ours-samples: our --json output")
    ap.add_argument("--fake-ours", action="store_true",
                    help="compare lm-eval with itself (ours made from its samples): checks the "
                         "harness before `scalesweep eval` exists")
    ap.add_argument("--no-token-check", action="store_true",
                    help="skip checking ours' per-request token counts against lm-eval's "
                         "tokenization (needs transformers)")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--f64-tol-per-token", type=float, default=1e-6,
                    help="a request over --tol passes when ours is within --tol + tokens x this "
                         "of the float64 value (the fp32 forward's rounding grows with length)")
    ap.add_argument("--no-f64", action="store_true",
                    help="no float64 referee for the requests over --tol (then any such request "
                         "fails, including those where lm-eval's fp32 reduction is the one off)")
    ap.add_argument("--tie", type=float, default=1e-4)
    ap.add_argument("--json", help="write everything here")
    ap.add_argument("--quant", default="none",
                    help="simulated quantization on both sides: none, W, WA, WAKV, WAKVQ (ours: "
                         "`scalesweep eval --quant`; lm-eval: the scalesweep model of "
                         "python/scalesweep/lm_eval.py, HFLM + scalesweep.torch.simulate, which "
                         "needs scalesweep importable, e.g. PYTHONPATH)")
    ap.add_argument("--method", default="sweep-mse", help="with --quant: block-scale selector")
    ap.add_argument("--stats", help="with --quant: statistics file of `scalesweep calibrate`")
    ap.add_argument("--format", default=None, help="with --quant: nvfp4 (default) or mxfp4")
    ap.add_argument("--block", type=int, default=0, help="with --quant: block size (0: format's)")
    ap.add_argument("--apply-chat-template", action="store_true",
                    help="both sides render contexts with the model's chat template (lm-eval's "
                         "--apply_chat_template, ours --apply-chat-template)")
    a = ap.parse_args(argv)
    sim = {"quant": a.quant, "method": a.method, "stats": a.stats, "format": a.format,
           "block": a.block}

    work = a.work or tempfile.mkdtemp(prefix="lmeval_compare_")
    os.makedirs(work, exist_ok=True)
    tasks = expand_tasks([t for t in a.tasks.split(",") if t])
    model = a.model
    if model.endswith(".gguf"):
        model = hf_dir_from_gguf(model, os.path.join(work, "model_fp32"))
    walls = {}
    if a.lmeval_dir:
        lm_folder = a.lmeval_dir
    else:
        run_dir = tempfile.mkdtemp(prefix="lmeval_", dir=work)
        lm_folder, walls["lm-eval"], walls["lm-eval cpu"] = run_lmeval(
            model, tasks, a.limit, a.data, run_dir, a.threads, a.batch_size,
            log=os.path.join(run_dir, "lmeval.log"), chat=a.apply_chat_template, sim=sim)
    lm_docs, lm_metrics, lm_timing = load_lmeval(lm_folder)
    walls["lm-eval (its own timer)"] = lm_timing
    counter = None if a.no_token_check else lmeval_token_counter(model)
    if a.fake_ours:
        fake = ours_from_lmeval(lm_docs, counter)
        ours_docs = {}
        for s in fake:
            ours_docs.setdefault(s["task"], {})[s["doc_id"]] = s
        ours_results = {t: dict(lm_metrics[t], n=len(ours_docs.get(t, {})))
                        for t in lm_metrics}
    elif a.ours_samples:
        ours_docs = load_ours(a.ours_samples)
        ours_results = json.load(open(a.ours_json))["results"] if a.ours_json else None
    else:
        samples, j, walls["ours"], walls["ours cpu"] = run_ours(
            a.bin, model, tasks, a.limit, a.data, work, a.threads, chat=a.apply_chat_template,
            sim=sim)
        ours_docs, ours_results = load_ours(samples), j["results"]
    # The float64 referee decides only where it is meaningful: with quantized activations,
    # K/V or Q (WA, WAKV, WAKVQ), float64 inputs rounded to float32 fall on the other side of
    # a rounding or scale-choice boundary here and there and the loglikelihoods move by up to
    # nats (measured on SmolLM2: torch float64 vs torch float32, both simulate(), differ by
    # 0.04 to 3.7 on every one of 16 requests), so it is no referee there.
    sim_acts = bool(sim_args(sim)) and sim["quant"].lower() != "w"
    referee = None if a.no_f64 or a.fake_ours or sim_acts else f64_referee(model, sim)
    rows = compare(lm_docs, lm_metrics, ours_docs, ours_results, tasks, tol=a.tol, tie=a.tie,
                   token_counter=counter, referee=referee,
                   delimiter="" if a.apply_chat_template else TARGET_DELIMITER)
    print(fmt_table(rows, walls))
    ok = all(r["ok"] for r in rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ok": ok, "tasks": rows, "wall_s": walls, "limit": a.limit,
                       "lm_eval_dir": lm_folder, "model": model,
                       "apply_chat_template": a.apply_chat_template,
                       "sim": sim if sim_args(sim) else None,
                       "load_average": os.getloadavg(), "cores": os.cpu_count(),
                       "lm_eval_version": generate.LM_EVAL_VERSION}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
