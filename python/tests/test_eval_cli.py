"""`scalesweep eval` and `experiment --tasks` end to end on stories260K with small task files
written here (no installed data needed): the output shapes, --limit, the per-document log, the
refusals (unknown task, missing or corrupt data, an existing log), and experiment's task columns
equal to `eval` on the same simulated model.
"""
import json
import os
import subprocess

import pytest

from cli_common import BIN, MODEL, TOK, VAL, need_bin, need_data

pytestmark = [need_bin, need_data]


def run(*args, check=True, env=None):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, **(env or {})))
    if check:
        assert p.returncode == 0, f"{args}: rc={p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def write_jsonl(path, docs):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d) + "\n")


@pytest.fixture()
def data(tmp_path):
    d = tmp_path / "eval"
    write_jsonl(str(d / "piqa/validation.jsonl"), [
        {"goal": "Lily wanted to play", "sol1": "with her ball.", "sol2": "on the moon.", "label": 0},
        {"goal": "The dog ran", "sol1": "to the park.", "sol2": "into a cloud.", "label": 0},
        {"goal": "Tom was sad", "sol1": "so he cried.", "sol2": "so he sang loud songs.", "label": 0},
    ])
    write_jsonl(str(d / "lambada_openai/test.jsonl"), [
        {"text": "Once upon a time, there was a little girl named Lily. She liked to play with her ball"},
        {"text": "The cat sat on the mat. The cat was happy"},
    ])
    return str(d)


def test_eval_json_log_and_limit(data, tmp_path):
    log = str(tmp_path / "log.jsonl")
    j = json.loads(run("eval", MODEL, "--tokenizer", TOK, "--tasks", "piqa,lambada_openai",
                       "--data", data, "--log-samples", log, "--json").stdout)
    r = j["results"]
    assert r["piqa"]["n"] == 3 and set(r["piqa"]) >= {"acc", "acc_stderr", "acc_norm",
                                                     "acc_norm_stderr"}
    assert r["lambada_openai"]["n"] == 2 and r["lambada_openai"]["perplexity"] > 1
    assert j["documents"] == 5 and j["requests"] == 8
    lines = [json.loads(x) for x in open(log, encoding="utf-8")]
    assert [x["task"] for x in lines] == ["piqa"] * 3 + ["lambada_openai"] * 2
    first = lines[0]
    assert first["requests"][0]["context"] == "Question: Lily wanted to play\nAnswer:"
    assert first["requests"][0]["continuation"] == " with her ball."
    assert first["requests"][0]["tokens"] > 0 and first["target"] == "0"
    lls = [q["loglikelihood"] for q in first["requests"]]
    assert first["metrics"]["acc"] == (1.0 if lls[0] > lls[1] else 0.0)
    # acc averages the per-document values.
    assert r["piqa"]["acc"] == pytest.approx(sum(x["metrics"]["acc"] for x in lines[:3]) / 3)
    # --limit: the first documents, the same numbers; a thread count changes nothing.
    j1 = json.loads(run("eval", MODEL, "--tokenizer", TOK, "--tasks", "piqa", "--data", data,
                        "--limit", "1", "--threads", "1", "--json").stdout)
    assert j1["results"]["piqa"]["n"] == 1 and j1["documents"] == 1
    # The table form names the tasks and metrics.
    out = run("eval", MODEL, "--tokenizer", TOK, "--tasks", "lambada_openai", "--data", data).stdout
    assert "| lambada_openai | 2 | perplexity |" in out


def test_eval_refusals(data, tmp_path):
    def fails(*args, want):
        p = run("eval", MODEL, "--tokenizer", TOK, *args, check=False)
        assert p.returncode == 1, (args, p.stdout, p.stderr)
        assert want in p.stderr, (want, p.stderr)
        return p

    fails("--tasks", "piqa,nope", "--data", data, want='unknown task "nope" (known: arc_easy')
    fails("--tasks", "hellaswag", "--data", data,
          want="hellaswag/validation.jsonl: no such file (task hellaswag; run "
               "scripts/get-eval-data.sh")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"goal": "g", "sol1": "a", "sol2": "b", "label": 0}\nnot json\n')
    fails("--tasks", "piqa", "--data", data, "--task-data", f"piqa={bad}", want=f"{bad}")
    fails("--tasks", "piqa", "--data", data, "--task-data", f"boolq={bad}",
          want="task boolq is not in --tasks")
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text('{"goal": "g", "sol1": "a", "label": 0}\n')
    fails("--tasks", "piqa", "--data", data, "--task-data", f"piqa={wrong}",
          want='document 0 (task piqa): field "sol2" missing')
    log = tmp_path / "exists.jsonl"
    log.write_text("keep\n")
    fails("--tasks", "piqa", "--data", data, "--log-samples", str(log), want="--force")
    assert log.read_text() == "keep\n"  # untouched
    fails("--tasks", "hellaswag", "--num-fewshot", "2", "--data", data, want="few-shot pool")


def test_experiment_task_columns_equal_eval(data, tmp_path):
    # MXFP4 RTN rows are the simulated model `eval --quant` runs with the same statistics: the
    # task numbers of every row equal eval's.
    text = tmp_path / "t.txt"
    with open(VAL) as f:
        text.write_text(f.read(20000))
    cal = ["--nsamples", "4", "--seqlen", "128", "--seed", "1"]
    rep = tmp_path / "rep"
    j = json.loads(run("experiment", MODEL, "--tokenizer", TOK, "--eval", str(text), "--calib",
                       str(text), *cal, "--max-tokens", "1000", "--format", "mxfp4", "--no-gptq",
                       "--methods", "absmax,sweep-mse", "--settings", "W,WA", "--no-errors",
                       "--tasks", "piqa,lambada_openai", "--task-data-dir", data,
                       "--report-dir", str(rep), "--json").stdout)
    assert set(j["fp"]["tasks"]) == {"piqa", "lambada_openai"}
    stats = tmp_path / "s.safetensors"
    run("calibrate", MODEL, "--tokenizer", TOK, "--text", str(text), *cal, "-o", str(stats))
    for c in j["cells"]:
        e = json.loads(run("eval", MODEL, "--tokenizer", TOK, "--tasks", "piqa,lambada_openai",
                           "--data", data, "--quant", c["setting"], "--format", "mxfp4",
                           "--method", c["method"], "--stats", str(stats), "--json").stdout)
        for t in ("piqa", "lambada_openai"):
            for m, v in c["tasks"][t].items():
                assert e["results"][t][m] == pytest.approx(v, rel=1e-12, abs=0), (c, t, m)
        avg = (c["tasks"]["piqa"]["acc_norm"] + c["tasks"]["lambada_openai"]["acc"]) / 2
        assert c["task_average"] == pytest.approx(avg)
        assert c["task_recovery"] == pytest.approx(100 * avg / j["fp"]["task_average"])
    md = (rep / "experiment.md").read_text()
    assert "piqa acc_norm" in md and "Task recovery (%)" in md
    assert (rep / "task_recovery.svg").read_text().startswith("<svg")


def test_eval_runs_a_w4a4_checkpoint_as_it_declares(data, tmp_path):
    # A compressed-tensors W4A4 checkpoint runs as vLLM would (NVFP4 weights, run-time
    # activation quantization with its stored global scales): the same loglikelihoods as the
    # simulated WA model with the statistics it was written from.
    stats = str(tmp_path / "stats.safetensors")
    run("calibrate", MODEL, "--tokenizer", TOK, "--text", VAL, "--nsamples", "8", "--seqlen",
        "128", "-o", stats)
    ck = str(tmp_path / "wa")
    run("quantize", MODEL, "--tokenizer", TOK, "-o", ck, "--quant", "WA", "--method", "absmax",
        "--stats", stats, "--partial-blocks", "quantize")
    a_log, b_log = str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")
    a = json.loads(run("eval", ck, "--tasks", "piqa,lambada_openai", "--data", data,
                       "--log-samples", a_log, "--json").stdout)
    b = json.loads(run("eval", MODEL, "--tokenizer", TOK, "--tasks", "piqa,lambada_openai",
                       "--data", data, "--quant", "WA", "--method", "absmax", "--stats", stats,
                       "--log-samples", b_log, "--json").stdout)
    assert (a["runtime"]["quant"], a["runtime"]["source"]) == ("WA", "checkpoint")
    assert b["runtime"]["source"] == "simulated"
    la = [json.loads(x) for x in open(a_log)]
    lb = [json.loads(x) for x in open(b_log)]
    for x, y in zip(la, lb):
        for q, r in zip(x["requests"], y["requests"]):
            assert q["loglikelihood"] == r["loglikelihood"], (x, y)
    assert a["results"] == b["results"]
