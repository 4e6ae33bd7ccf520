#!/usr/bin/env python3
"""Writes lm-eval 0.4.13 task YAMLs that read our data/eval JSONL into a folder (pass it to
lm-eval as --include_path, or to TaskManager(include_path=...)).

The templates beside this file (*.yaml.in) `include:` lm-eval's own task definitions from the
installed package by absolute path and change only the data source; this fills in
@LM_EVAL_TASKS@ (the installed lm_eval/tasks folder) and @DATA@ (the data folder, absolute),
writes one mmlu_<subject>.yaml per subject of the stock mmlu/default folder, and copies the
stock mmlu group files (_mmlu*.yaml: group mmlu and its four category groups, which hold no
data source) unchanged.

    python3 bench/lmeval_tasks/generate.py OUT_DIR [--data data/eval]
"""
import argparse
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
LM_EVAL_VERSION = "0.4.13"
TASKS = ["arc_easy", "arc_challenge", "hellaswag", "winogrande", "piqa", "boolq",
         "lambada_openai", "ifeval", "gsm8k_cot"]


def stock_tasks_dir():
    import lm_eval
    return os.path.join(os.path.dirname(os.path.abspath(lm_eval.__file__)), "tasks")


def mmlu_subjects():
    d = os.path.join(stock_tasks_dir(), "mmlu/default")
    return [n[len("mmlu_"):-len(".yaml")] for n in sorted(os.listdir(d))
            if n.startswith("mmlu_") and n.endswith(".yaml")]


def _fill(template, data_dir, subject=None):
    text = open(os.path.join(HERE, template), encoding="utf-8").read()
    text = text.replace("@LM_EVAL_TASKS@", stock_tasks_dir()).replace("@DATA@", data_dir)
    if subject is not None:
        text = text.replace("@SUBJECT@", subject)
    left = [p for p in ("@LM_EVAL_TASKS@", "@DATA@", "@SUBJECT@") if p in text]
    assert not left, f"{template}: placeholder {left} left"
    return text


def write_tasks(out_dir, data_dir):
    """Writes the YAMLs into out_dir; returns the task names (mmlu subjects as mmlu_<s>)."""
    import importlib.metadata
    got = importlib.metadata.version("lm_eval")
    if got != LM_EVAL_VERSION:
        raise RuntimeError(f"lm_eval {got} installed; these tasks are for {LM_EVAL_VERSION} "
                           "(scripts/get-lm-eval.sh)")
    data_dir = os.path.abspath(data_dir)
    for p in (data_dir, stock_tasks_dir()):
        if any(c in p for c in '"\\\n'):
            raise ValueError(f"path {p!r} has a character the YAML templates do not escape")
    os.makedirs(out_dir, exist_ok=True)
    names = []
    for t in TASKS:
        with open(os.path.join(out_dir, t + ".yaml"), "w", encoding="utf-8") as f:
            f.write(_fill(t + ".yaml.in", data_dir))
        names.append(t)
    for s in mmlu_subjects():
        with open(os.path.join(out_dir, f"mmlu_{s}.yaml"), "w", encoding="utf-8") as f:
            f.write(_fill("mmlu_subject.yaml.in", data_dir, s))
        names.append("mmlu_" + s)
    shutil.copy(os.path.join(HERE, "mmlu_utils.py"), out_dir)
    stock = os.path.join(stock_tasks_dir(), "mmlu/default")
    for n in sorted(os.listdir(stock)):
        if n.startswith("_mmlu") and n.endswith(".yaml"):
            shutil.copy(os.path.join(stock, n), out_dir)
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--data", default=os.path.join(HERE, "../../data/eval"))
    a = ap.parse_args()
    names = write_tasks(a.out_dir, a.data)
    print(f"{len(names)} tasks (+ group mmlu) in {a.out_dir}")


if __name__ == "__main__":
    main()
