"""process_docs for the MMLU tasks of bench/lmeval_tasks: one function docs_<subject> per
subject, keeping that subject's rows of the all-subject JSONL in file order (so doc_id counts
within the subject, as with the hub's per-subject configs)."""
import os

SUBJECTS = [n[len("mmlu_"):-len(".yaml")] for n in sorted(os.listdir(
    os.path.join(os.path.dirname(__import__("lm_eval").__file__), "tasks/mmlu/default")))
    if n.startswith("mmlu_") and n.endswith(".yaml")]


def _keep(subject):
    def process_docs(dataset):
        return dataset.filter(lambda d: d["subject"] == subject)
    return process_docs


for _s in SUBJECTS:
    globals()["docs_" + _s] = _keep(_s)
