"""Writes the Arrow/Parquet fixtures of src/io/eval_data_test.cc (checked in; rerun only to
change them): the same 3 rows as docs.parquet, docs.arrow (IPC stream, 2 batches),
docs_file.arrow (IPC file format), saved/ (a save_to_disk folder: 2 data files, state.json)
and expected.jsonl (what read_documents must return). Needs pyarrow."""
import json
import os

import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet as pq

rows = [
    {"id": "Mercury_1", "question": "Café? 日本語 🙂", "n": 1, "big": 2**40, "u8": 255, "x": 0.5,
     "ok": True, "none": None, "tags": ["a", "b"],
     "choices": {"text": ["yes", "no"], "label": ["A", "B"]}, "cat": "red"},
    {"id": "Mercury_2", "question": "line\nbreak \"quoted\"", "n": -2, "big": -(2**40), "u8": 0,
     "x": -1.25, "ok": False, "none": None, "tags": [],
     "choices": {"text": ["x"], "label": ["1"]}, "cat": "blue"},
    {"id": "Mercury_3", "question": "", "n": None, "big": 0, "u8": 7, "x": None, "ok": None,
     "none": None, "tags": None, "choices": {"text": [], "label": []}, "cat": "red"},
]
schema = pa.schema([
    ("id", pa.string()), ("question", pa.string()), ("n", pa.int32()), ("big", pa.int64()),
    ("u8", pa.uint8()), ("x", pa.float32()), ("ok", pa.bool_()), ("none", pa.null()),
    ("tags", pa.list_(pa.string())),
    ("choices", pa.struct([("text", pa.list_(pa.string())), ("label", pa.list_(pa.string()))])),
    ("cat", pa.dictionary(pa.int8(), pa.string())),
])
t = pa.Table.from_pylist(rows, schema=schema)
here = os.path.dirname(os.path.abspath(__file__))
pq.write_table(t, os.path.join(here, "docs.parquet"))
with pa.ipc.new_stream(os.path.join(here, "docs.arrow"), schema) as w:
    for b in t.to_batches(max_chunksize=2):
        w.write_batch(b)
with pa.ipc.new_file(os.path.join(here, "docs_file.arrow"), schema) as w:
    w.write_table(t)
os.makedirs(os.path.join(here, "saved"), exist_ok=True)
names = ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]
for name, part in zip(names, (t.slice(0, 1), t.slice(1))):
    with pa.ipc.new_stream(os.path.join(here, "saved", name), schema) as w:
        w.write_table(part)
with open(os.path.join(here, "saved", "state.json"), "w") as f:
    json.dump({"_data_files": [{"filename": n} for n in names], "_split": "test"}, f, indent=2)
with open(os.path.join(here, "expected.jsonl"), "w", encoding="utf-8") as f:
    for r in t.to_pylist():
        f.write(json.dumps(r, ensure_ascii=False) + "\n")
