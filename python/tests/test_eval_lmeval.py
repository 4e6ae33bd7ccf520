"""`scalesweep eval` against lm-evaluation-harness 0.4.13 (bench/lmeval_compare.py), item by item.

The comparison itself is checked always, on made-up samples (it must fail on a real
difference). The run against lm-eval needs lm-eval (scripts/get-lm-eval.sh, after
scripts/get-references.sh), the task data (scripts/get-eval-data.sh), the SmolLM2 fixture
(scripts/get-models.sh) and a scalesweep with an `eval` command; it skips visibly, naming what is
missing. Both sides run the fp32 model transformers dequantizes from the Q4_1 GGUF; lm-eval runs
with batch size 1 (no padding). Asserted: every |Δ loglikelihood| <= 1e-4, the same context and
continuation strings, chosen answers equal except on near-ties (best two within 1e-4 in
lm-eval's values), accuracies equal where there are no near-ties.
SS_EVAL_LONG=1 adds a longer run (250 docs per task).
"""
import copy
import importlib.util
import os
import subprocess
import sys

import pytest

from cli_common import BIN

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import lmeval_compare as lc  # noqa: E402

GGUF = os.path.join(ROOT, "models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf")
DATA = os.environ.get("SS_EVAL_DATA", os.path.join(ROOT, "data/eval"))
QUICK_TASKS = ["arc_easy", "hellaswag", "winogrande", "piqa", "boolq", "lambada_openai",
               "mmlu_abstract_algebra", "mmlu_world_religions"]
LONG_TASKS = ["arc_easy", "arc_challenge", "hellaswag", "winogrande", "piqa", "boolq",
              "lambada_openai", "mmlu_abstract_algebra", "mmlu_world_religions"]
DATA_FILES = ["arc_easy/test.jsonl", "arc_challenge/test.jsonl", "hellaswag/validation.jsonl",
              "winogrande/validation.jsonl", "piqa/validation.jsonl", "boolq/validation.jsonl",
              "lambada_openai/test.jsonl", "mmlu/test.jsonl", "mmlu/dev.jsonl"]


# ---------------------------------------------------------------------------------------------
# the comparison on made-up samples (always runs)

def _req(ctx, cont, ll, greedy=False):
    return {"context": ctx, "continuation": cont, "loglikelihood": ll, "is_greedy": greedy}


def _lm_side():
    """lm-eval's side as load_lmeval returns it: arc_easy (acc, acc_norm), winogrande and
    lambada_openai, two docs each."""
    arc = {
        0: {"target": "1", "gold": 1, "metrics": {"acc": 1.0, "acc_norm": 1.0},
            "requests": [_req("Question: Q0?\nAnswer:", " red", -5.0),
                         _req("Question: Q0?\nAnswer:", " blue", -2.0),
                         _req("Question: Q0?\nAnswer:", " green", -7.0)]},
        # doc 1: choices 0 and 1 tie in ll (gap 5e-5): a near-tie for acc
        1: {"target": "0", "gold": 0, "metrics": {"acc": 1.0, "acc_norm": 0.0},
            "requests": [_req("Question: Q1?\nAnswer:", " aaaa", -3.00000),
                         _req("Question: Q1?\nAnswer:", " bbbbbbbbbb", -3.00005),
                         _req("Question: Q1?\nAnswer:", " c", -9.0)]},
    }
    wino = {
        0: {"target": "ran.", "gold": 1, "metrics": {"acc": 1.0},
            "requests": [_req("Ann", " ran.", -9.0), _req("Bob", " ran.", -4.0)]},
        1: {"target": "sat.", "gold": 0, "metrics": {"acc": 0.0},
            "requests": [_req("Ann", " sat.", -6.0), _req("Bob", " sat.", -5.0)]},
    }
    lam = {
        0: {"target": " end", "gold": None, "metrics": {"acc": 1.0},
            "requests": [_req("The", " end", -1.0, True)]},
        1: {"target": " stop", "gold": None, "metrics": {"acc": 0.0},
            "requests": [_req("A", " stop", -3.0, False)]},
    }
    docs = {"arc_easy": arc, "winogrande": wino, "lambada_openai": lam}
    metrics = {"arc_easy": {"acc": 1.0, "acc_norm": 0.5}, "winogrande": {"acc": 0.5},
               "lambada_openai": {"acc": 0.5, "perplexity": 2.718281828459045 ** 2}}
    return docs, metrics


def _ours(docs, metrics):
    ours = {}
    for s in lc.ours_from_lmeval(docs):
        ours.setdefault(s["task"], {})[s["doc_id"]] = s
    res = {t: dict(m, n=len(ours[t])) for t, m in metrics.items()}
    return ours, res


def _compare(docs, metrics, ours, res):
    rows = lc.compare(docs, metrics, ours, res, list(docs))
    return {r["task"]: r for r in rows}


def test_compare_identical_passes():
    docs, metrics = _lm_side()
    ours, res = _ours(docs, metrics)
    rows = _compare(docs, metrics, ours, res)
    assert all(r["ok"] for r in rows.values()), {t: r["failures"] for t, r in rows.items()}
    assert rows["arc_easy"]["acc"]["near_ties"] == [1]
    assert rows["arc_easy"]["requests"] == 6 and rows["arc_easy"]["max_abs_dll"] == 0


def test_compare_fails_on_loglikelihood_difference():
    docs, metrics = _lm_side()
    ours, res = _ours(docs, metrics)
    ours["winogrande"][0]["requests"][1]["loglikelihood"] += 2e-4
    rows = _compare(docs, metrics, ours, res)
    assert not rows["winogrande"]["ok"] and rows["winogrande"]["over_tol"] == 1
    assert abs(rows["winogrande"]["max_abs_dll"] - 2e-4) < 1e-9
    assert rows["arc_easy"]["ok"]
    ours2, res2 = _ours(docs, metrics)
    ours2["winogrande"][0]["requests"][1]["loglikelihood"] += 5e-5  # within 1e-4: fine
    assert _compare(docs, metrics, ours2, res2)["winogrande"]["ok"]
    ours3, res3 = _ours(docs, metrics)
    ours3["lambada_openai"][1]["requests"][0]["loglikelihood"] = float("nan")
    assert not _compare(docs, metrics, ours3, res3)["lambada_openai"]["ok"]


def test_compare_float64_referee_decides_which_side_is_off():
    docs, metrics = _lm_side()
    ours, res = _ours(docs, metrics)
    ours["winogrande"][0]["requests"][1]["loglikelihood"] += 3e-4  # -4.0 -> -3.9997
    # The exact value is ours': lm-eval's fp32 reduction is the one off; passes, counted.
    rows = {r["task"]: r for r in lc.compare(docs, metrics, ours, res, list(docs),
                                             referee=lambda c, x: -3.9997)}
    assert rows["winogrande"]["ok"] and rows["winogrande"]["lm_eval_off_f64"] == 1
    assert rows["winogrande"]["over_tol"] == 0
    # The exact value is lm-eval's: ours is off, fails.
    rows = {r["task"]: r for r in lc.compare(docs, metrics, ours, res, list(docs),
                                             referee=lambda c, x: -4.0)}
    assert not rows["winogrande"]["ok"] and rows["winogrande"]["over_tol"] == 1


def test_compare_fails_on_prompt_difference():
    docs, metrics = _lm_side()
    ours, res = _ours(docs, metrics)
    ours["arc_easy"][0]["requests"][2]["context"] = "Question: Q0?\nAnswer: "
    r = _compare(docs, metrics, ours, res)["arc_easy"]
    assert not r["ok"] and r["string_mismatches"] == 1


def test_compare_near_tie_may_disagree_but_not_elsewhere():
    docs, metrics = _lm_side()
    # ours flips the near-tie of arc doc 1 (ll within 1e-4 of lm-eval's): allowed, accuracy
    # then differs, which is allowed only because there is a near-tie
    ours, res = _ours(docs, metrics)
    ours["arc_easy"][1]["requests"][1]["loglikelihood"] = -2.99999
    ours["arc_easy"][1]["metrics"]["acc"] = 0
    res["arc_easy"]["acc"] = 0.5
    r = _compare(docs, metrics, ours, res)["arc_easy"]
    assert r["ok"], r["failures"]
    assert r["acc"]["disagree"] == [1] and r["acc"]["disagree_not_near_tie"] == []
    # a flip where lm-eval's best two are far apart fails (here through ll too)
    ours, res = _ours(docs, metrics)
    ours["winogrande"][1]["requests"][1]["loglikelihood"] = -7.0
    ours["winogrande"][1]["metrics"]["acc"] = 1
    res["winogrande"]["acc"] = 1.0
    r = _compare(docs, metrics, ours, res)["winogrande"]
    assert not r["ok"] and r["acc"]["disagree_not_near_tie"] == [1]


def test_compare_fails_on_accuracy_or_metric_or_docs():
    docs, metrics = _lm_side()
    ours, res = _ours(docs, metrics)
    res["winogrande"]["acc"] = 1.0  # reported accuracy not what the docs say, no near-tie
    assert not _compare(docs, metrics, ours, res)["winogrande"]["ok"]
    ours, res = _ours(docs, metrics)
    ours["winogrande"][1]["metrics"]["acc"] = 1  # per-doc metric inconsistent with its lls
    r = _compare(docs, metrics, ours, res)["winogrande"]
    assert not r["ok"] and r["ours_metric_inconsistent"] == 1
    ours, res = _ours(docs, metrics)
    del ours["arc_easy"][1]
    assert not _compare(docs, metrics, ours, res)["arc_easy"]["ok"]
    ours, res = _ours(docs, metrics)
    ours["arc_easy"][0]["target"] = 2  # a different gold
    assert not _compare(docs, metrics, ours, res)["arc_easy"]["ok"]
    ours, res = _ours(docs, metrics)
    res["lambada_openai"]["perplexity"] *= 1.01
    assert not _compare(docs, metrics, ours, res)["lambada_openai"]["ok"]
    ours, res = _ours(docs, metrics)
    ours["lambada_openai"][0]["requests"][0]["is_greedy"] = False
    r = _compare(docs, metrics, ours, res)["lambada_openai"]
    assert not r["ok"] and r["greedy_mismatches"] == 1


def test_quant_options_reach_both_sides():
    """--quant/--method/--stats/--format/--block: `scalesweep eval` options for ours, the
    scalesweep model (python/scalesweep/lm_eval.py) with the same settings for lm-eval."""
    sim = {"quant": "WAKVQ", "method": "sweep-wmse", "stats": "/s.st", "format": None,
           "block": 0}
    assert lc.sim_args(sim) == ["--quant", "WAKVQ", "--method", "sweep-wmse", "--stats", "/s.st"]
    assert lc.lmeval_model("/m", 2, sim) == (
        "scalesweep", "pretrained=/m,dtype=float32,quant=WAKVQ,method=sweep-wmse,threads=2,"
        "stats=/s.st")
    sim2 = dict(sim, quant="W", method="sweep-mse", stats=None, format="mxfp4", block=32)
    assert lc.sim_args(sim2) == ["--quant", "W", "--method", "sweep-mse", "--format", "mxfp4",
                                 "--block", "32"]
    assert lc.lmeval_model("/m", 2, sim2)[1].endswith(",format=mxfp4,block=32")
    for none in (None, dict(sim, quant="none")):
        assert lc.sim_args(none) == []
        assert lc.lmeval_model("/m", 2, none) == ("hf", "pretrained=/m,dtype=float32")


def test_compare_acc_norm_uses_choice_length():
    docs, metrics = _lm_side()
    d = copy.deepcopy(docs)
    # acc_norm of doc 1: -3/4 vs -3.00005/10 vs -9/1: choice 1 wins per character
    ours, res = _ours(d, metrics)
    rows = _compare(d, metrics, ours, res)
    assert rows["arc_easy"]["acc_norm"]["lm_eval_from_docs"] == 0.5


# ---------------------------------------------------------------------------------------------
# against lm-eval (skips visibly where a piece is missing)

def _missing():
    why = []
    if importlib.util.find_spec("torch") is None or \
            importlib.util.find_spec("transformers") is None:
        why.append("torch/transformers absent (scripts/get-references.sh)")
    if importlib.util.find_spec("lm_eval") is None:
        why.append("lm-eval absent (scripts/get-lm-eval.sh)")
    if importlib.util.find_spec("gguf") is None:
        why.append("gguf absent (scripts/setup.sh)")
    gone = [f for f in DATA_FILES if not os.path.exists(os.path.join(DATA, f))]
    if gone:
        why.append(f"eval data absent in {DATA} ({', '.join(gone[:3])}...; "
                   "scripts/get-eval-data.sh)")
    if not os.path.exists(GGUF):
        why.append("SmolLM2 fixture absent (scripts/get-models.sh)")
    if not BIN:
        why.append("SCALESWEEP_BIN not set (run through ctest)")
    else:
        p = subprocess.run([BIN, "eval", "--help"], capture_output=True, text=True)
        if p.returncode != 0:
            why.append(f"{BIN} has no `eval` command yet")
    return why


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    why = _missing()
    if why:
        pytest.skip("; ".join(why))
    return lc.hf_dir_from_gguf(GGUF, str(tmp_path_factory.mktemp("smollm2") / "fp32"))


def _run(model_dir, tmp_path, tasks, limit, chat=False):
    out = str(tmp_path / "compare.json")
    rc = lc.main([model_dir, "--tasks", ",".join(tasks), "--limit", str(limit),
                  "--data", DATA, "--bin", BIN, "--threads", "2", "--work", str(tmp_path),
                  "--json", out] + (["--apply-chat-template"] if chat else []))
    import json
    j = json.load(open(out))
    assert j["apply_chat_template"] == chat
    for r in j["tasks"]:
        assert r["ok"], (r["task"], r["failures"])
        # Over 1e-4 only where lm-eval's fp32 sum is the side off the float64 value.
        assert r["over_tol"] == 0 and r["string_mismatches"] == 0
        assert r["max_abs_dll"] <= 1e-4 or r["lm_eval_off_f64"] > 0
        assert r["acc"]["disagree_not_near_tie"] == []
        if not r["acc"]["near_ties"]:
            assert abs(r["acc"]["ours"] - r["acc"]["lm_eval"]) <= 1e-9
    assert rc == 0 and j["ok"]


def test_eval_matches_lmeval_quick(model_dir, tmp_path):
    _run(model_dir, tmp_path, QUICK_TASKS, int(os.environ.get("SS_EVAL_LIMIT", "10")))


def test_chat_template_matches_lmeval(model_dir, tmp_path):
    """--apply-chat-template against lm-eval's --apply_chat_template (SmolLM2's ChatML template
    with its default system message; multiple choice, multiple input, loglikelihood, and mmlu's
    5 shots as turns with the description as the system message): the same rendered contexts
    and continuations (no target delimiter), loglikelihoods and accuracies."""
    _run(model_dir, tmp_path, ["arc_easy", "winogrande", "boolq", "lambada_openai",
                               "mmlu_abstract_algebra"], 4, chat=True)
    samples = open(tmp_path / "ours_samples.jsonl", encoding="utf-8").readline()
    assert "<|im_start|>system\\nYou are a helpful AI assistant named SmolLM" in samples


@pytest.mark.skipif(os.environ.get("SS_EVAL_LONG") != "1",
                    reason="long lm-eval comparison (250 docs per task, tens of minutes on 2 "
                           "cores): set SS_EVAL_LONG=1")
def test_eval_matches_lmeval_long(model_dir, tmp_path):
    _run(model_dir, tmp_path, LONG_TASKS, 250)
