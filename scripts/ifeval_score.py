#!/usr/bin/env python3
"""Scores IFEval responses with lm-eval 0.4.13's own checkers (lm_eval/tasks/ifeval).

    python3 scripts/ifeval_score.py RESPONSES.jsonl [--nltk-data DIR] [-o OUT.jsonl]
    python3 scripts/ifeval_score.py --check [--nltk-data DIR]   (all present? exit 0)

Input: one JSON object a line, {"key", "prompt", "instruction_id_list", "kwargs", "response"}
(the google/IFEval fields of a document and the model's response). Output (stdout, or -o): one
line a document, in input order, {"key", "follow_instruction_list_strict": [bool, ...],
"follow_instruction_list_loose": [bool, ...]}: the per-instruction results of
lm_eval.tasks.ifeval.utils.process_results (inst_level_strict_acc, inst_level_loose_acc; the
prompt-level metrics are their all()), so the scores are lm-eval's by construction.
`scalesweep eval --tasks ifeval` runs this (src/pipeline/ifeval.cc).

NLTK_DATA: --nltk-data, else $NLTK_DATA, else data/eval/nltk beside this script's repository
(scripts/get-ifeval.sh writes NLTK's punkt_tab there). Where punkt_tab is missing this refuses
instead of letting lm-eval's import call nltk.download.
Two sources of chance in lm-eval's checkers are fixed here so that a response always gets the
same verdict: langdetect (language:response_language) samples at random unless seeded (lm-eval
does not seed it; this sets DetectorFactory.seed = 0), and a checker given an invalid argument
draws one with Python's random module: in the 541 documents, keys 1122 and 1129
(keywords:letter_frequency with letter "#" and "!": a random ASCII letter instead). lm-eval's
verdict there depends on its process's random state at scoring time; this seeds random with 0
before each document.

Exit status: 0 scored; 3 a dependency is missing (lm-eval, nltk, langdetect, immutabledict,
punkt_tab: the message names the script that installs it); 1 bad input or a checker error;
2 usage.
"""
import argparse
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LM_EVAL_VERSION = "0.4.13"


def missing(msg):
    print(f"ifeval_score: {msg}", file=sys.stderr)
    sys.exit(3)


def load_checker(nltk_data):
    """lm_eval.tasks.ifeval.utils, after checking what its import needs."""
    os.environ["NLTK_DATA"] = nltk_data  # read by nltk at import
    import importlib.metadata as md
    try:
        got = md.version("lm_eval")
    except md.PackageNotFoundError:
        missing("lm-eval is not installed in " + sys.executable +
                ": run scripts/get-lm-eval.sh, then scripts/get-ifeval.sh")
    if got != LM_EVAL_VERSION:
        missing(f"lm-eval {got} installed in {sys.executable}; ifeval is scored with "
                f"{LM_EVAL_VERSION} (scripts/get-lm-eval.sh)")
    for mod in ("nltk", "langdetect", "immutabledict"):
        try:
            __import__(mod)
        except ImportError:
            missing(f"python module {mod} missing in {sys.executable}: run scripts/get-ifeval.sh")
    import nltk
    if nltk_data not in nltk.data.path:
        nltk.data.path.insert(0, nltk_data)
    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
    except LookupError:
        missing(f"NLTK's punkt_tab tables are not in {nltk_data} (nor NLTK's default folders): "
                "run scripts/get-ifeval.sh")
    import langdetect
    langdetect.DetectorFactory.seed = 0
    from lm_eval.tasks.ifeval import utils
    return utils


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("responses", nargs="?",
                    help="JSONL: key, prompt, instruction_id_list, kwargs, response")
    ap.add_argument("--check", action="store_true",
                    help="only check that lm-eval's checkers and punkt_tab load, then exit 0")
    ap.add_argument("--nltk-data", default=os.environ.get("NLTK_DATA") or
                    os.path.join(HERE, "..", "data", "eval", "nltk"))
    ap.add_argument("-o", "--output", help="write here instead of stdout")
    a = ap.parse_args()
    if not a.check and not a.responses:
        ap.error("RESPONSES.jsonl or --check required")
    utils = load_checker(os.path.abspath(a.nltk_data))
    if a.check:
        return 0
    out = []
    with open(a.responses, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                doc = {k: d[k] for k in ("key", "prompt", "instruction_id_list", "kwargs")}
                response = d["response"]
                if not isinstance(response, str) or len(doc["kwargs"]) != len(
                        doc["instruction_id_list"]):
                    raise ValueError("response not a string, or kwargs and instruction_id_list "
                                     "of different lengths")
            except (ValueError, KeyError, TypeError) as e:
                print(f"ifeval_score: {a.responses}:{n}: {e!r}", file=sys.stderr)
                return 1
            try:
                random.seed(0)
                r = utils.process_results(doc, [response])
            except Exception as e:  # a checker that fails on this document: name it
                print(f"ifeval_score: {a.responses}:{n} (key {doc['key']}): lm-eval's checker "
                      f"failed: {e!r}", file=sys.stderr)
                return 1
            out.append(json.dumps({
                "key": doc["key"],
                "follow_instruction_list_strict": [bool(x) for x in r["inst_level_strict_acc"]],
                "follow_instruction_list_loose": [bool(x) for x in r["inst_level_loose_acc"]],
            }))
    text = "".join(line + "\n" for line in out)
    if a.output:
        with open(a.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
