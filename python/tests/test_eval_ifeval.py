"""`scalesweep eval --tasks ifeval` against lm-evaluation-harness 0.4.13's own scoring.

The scorer (scripts/ifeval_score.py) is lm-eval's process_results by construction; checked here:
  - on made-up responses to the first 25 documents, its per-instruction lists equal
    process_results called in this process;
  - a real run (`eval SmolLM2 --tasks ifeval --limit 3 --max-gen-tokens 64 --log-samples`):
    the prompts are the data's, every logged per-document metric equals process_results on the
    logged generation, and the task's four metrics equal lm-eval's aggregation of those (mean;
    agg_inst_level_acc).
Needs lm-eval (scripts/get-lm-eval.sh), the checkers' modules and punkt_tab
(scripts/get-ifeval.sh), the data (scripts/get-eval-data.sh), the SmolLM2 fixture
(scripts/get-models.sh) and SCALESWEEP_BIN; skips visibly, naming what is missing.
"""
import json
import os
import random
import subprocess
import sys

import pytest

from cli_common import BIN

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
GGUF = os.path.join(ROOT, "models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf")
DATA = os.environ.get("SS_EVAL_DATA", os.path.join(ROOT, "data/eval"))
IFEVAL = os.path.join(DATA, "ifeval/train.jsonl")
NLTK = os.path.join(DATA, "nltk")
SCORER = os.path.join(ROOT, "scripts/ifeval_score.py")
METRICS = ["prompt_level_strict_acc", "inst_level_strict_acc", "prompt_level_loose_acc",
           "inst_level_loose_acc"]


def _scorer_missing():
    if not os.path.exists(IFEVAL):
        return f"{IFEVAL} absent (scripts/get-eval-data.sh)"
    p = subprocess.run([sys.executable, SCORER, "--check", "--nltk-data", NLTK],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"rc {p.returncode}"
    return None


@pytest.fixture(scope="module")
def lm_utils():
    why = _scorer_missing()
    if why:
        pytest.skip(why)
    import nltk
    if NLTK not in nltk.data.path:
        nltk.data.path.insert(0, NLTK)
    import langdetect
    langdetect.DetectorFactory.seed = 0  # as the scorer (lm-eval leaves it unseeded)
    from lm_eval.tasks.ifeval import utils
    return utils


def _process_results(utils, doc, response):
    """lm-eval's process_results with random seeded as the scorer seeds it (keys 1122 and 1129
    draw a random letter: scripts/ifeval_score.py)."""
    random.seed(0)
    return utils.process_results(doc, [response])


def _docs(n):
    with open(IFEVAL, encoding="utf-8") as f:
        return [json.loads(line) for _, line in zip(range(n), f)]


def _score(rows, tmp_path):
    """scripts/ifeval_score.py on rows (docs with "response"): {key: line}."""
    src = tmp_path / "responses.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    p = subprocess.run([sys.executable, SCORER, str(src), "--nltk-data", NLTK],
                       capture_output=True, text=True, check=True)
    return [json.loads(line) for line in p.stdout.splitlines()]


def test_scorer_is_lmeval_process_results(lm_utils, tmp_path):
    docs = _docs(30)  # keys 1122 and 1129 among them
    responses = [
        "",
        "hello, world",
        "THIS IS ALL CAPITALS. NO COMMA HERE.",
        "*highlighted section part 1*\n*highlighted section part 2*\n*highlighted part 3*\n"
        + " ".join(["word"] * 320),
        "Here is my answer.\n\n***\n\nSecond paragraph. P.S. bye",
        '{"json": "maybe"}',
        "Bonjour, je suis content de vous voir aujourd'hui. Merci beaucoup.",
    ]
    rows = [dict(d, response=responses[i % len(responses)] + (d["prompt"] if i % 3 else ""))
            for i, d in enumerate(docs)]
    got = _score(rows, tmp_path)
    assert [g["key"] for g in got] == [d["key"] for d in docs]
    followed = 0
    for g, r in zip(got, rows):
        want = _process_results(lm_utils, r, r["response"])
        assert g["follow_instruction_list_strict"] == want["inst_level_strict_acc"], r["key"]
        assert g["follow_instruction_list_loose"] == want["inst_level_loose_acc"], r["key"]
        followed += sum(want["inst_level_loose_acc"])
    assert followed > 0  # the responses exercise both verdicts


def _eval_missing():
    why = []
    if not os.path.exists(GGUF):
        why.append("SmolLM2 fixture absent (scripts/get-models.sh)")
    if not BIN:
        why.append("SCALESWEEP_BIN not set (run through ctest)")
    return why


def test_eval_ifeval_matches_lmeval_scoring(lm_utils, tmp_path):
    why = _eval_missing()
    if why:
        pytest.skip("; ".join(why))
    log = tmp_path / "samples.jsonl"
    # Run from elsewhere: the scorer is found beside the binary, the data given.
    p = subprocess.run([BIN, "eval", GGUF, "--tasks", "ifeval", "--limit", "3",
                        "--max-gen-tokens", "64", "--threads", "2", "--data", DATA,
                        "--log-samples", str(log), "--json"],
                       capture_output=True, text=True, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout)["results"]["ifeval"]
    samples = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    docs = _docs(3)
    assert [s["doc_id"] for s in samples] == [0, 1, 2] and res["n"] == 3
    per_doc = {m: [] for m in METRICS}
    for s, d in zip(samples, docs):
        assert s["requests"][0]["context"] == d["prompt"]  # doc_to_text: the prompt, as is
        want = _process_results(lm_utils, d, s["generation"])
        for m in METRICS:
            got = s["metrics"][m]
            if m.startswith("inst_level"):
                assert [bool(x) for x in got] == want[m], (d["key"], m)
            else:
                assert bool(got) == want[m], (d["key"], m)
            per_doc[m].append(want[m])
    for m in METRICS:
        if m.startswith("inst_level"):
            want = lm_utils.agg_inst_level_acc(per_doc[m])
            assert res[m + "_stderr"] == "N/A"
        else:
            want = sum(per_doc[m]) / len(per_doc[m])
        assert abs(res[m] - want) <= 1e-12, (m, res[m], want)
