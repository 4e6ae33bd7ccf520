#!/usr/bin/env bash
# Installs a wheel (scripts/wheel.sh) on a bare Debian 12 system and runs it there: a chroot
# made by debootstrap (minbase: Python and libc, none of the libraries scalesweep builds
# against, no compiler), kept in $SS_CHROOT (default /var/tmp/ss-chroot) for the next run.
# Inside: a venv, `pip install WHEEL` (numpy from PyPI), then `import scalesweep` quantizes a
# tensor and the `scalesweep` CLI prints its version and runs `demo`. Needs root, debootstrap
# and a reachable Debian mirror and PyPI; exits non-zero on any failure.
#   scripts/test-wheel.sh WHEEL
set -euo pipefail
WHEEL=$(realpath "${1:?usage: scripts/test-wheel.sh WHEEL}")
ROOT=${SS_CHROOT:-/var/tmp/ss-chroot}
[ "$(id -u)" -eq 0 ] || { echo "test-wheel: needs root (chroot)" >&2; exit 1; }
if [ ! -x "$ROOT/usr/bin/python3" ]; then
  command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null
  echo "test-wheel: making a bare Debian 12 in $ROOT (debootstrap, a few minutes)" >&2
  debootstrap --variant=minbase --include=python3,python3-venv bookworm "$ROOT" \
    http://deb.debian.org/debian >"$ROOT.log" 2>&1 || { tail "$ROOT.log" >&2; exit 1; }
fi
# The point of the test: none of the build's libraries are there.
for p in libopenblas0 libopenblas0-pthread liblapacke libhwy1 libdnnl3 libgomp1 g++ python3-numpy; do
  if chroot "$ROOT" dpkg -s "$p" >/dev/null 2>&1; then
    echo "test-wheel: $ROOT has $p installed; it must be bare" >&2; exit 1
  fi
done
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
# The host's trust store and pip configuration (a proxy's CA may be in them), so that pip in
# the chroot reaches PyPI as the host's does; the environment (PIP_*) passes through chroot.
ca=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
if [ -f "$ca" ]; then mkdir -p "$ROOT$(dirname "$ca")" && cp "$ca" "$ROOT$ca"; fi
if [ -f /etc/pip.conf ]; then cp /etc/pip.conf "$ROOT/etc/pip.conf"; fi
mkdir -p "$ROOT/proc" "$ROOT/tmp/wheel"
mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
trap 'umount "$ROOT/proc" 2>/dev/null || true' EXIT
rm -rf "$ROOT/tmp/wheel" "$ROOT/tmp/venv" && mkdir -p "$ROOT/tmp/wheel"
cp "$WHEEL" "$ROOT/tmp/wheel/"
name=$(basename "$WHEEL")
chroot "$ROOT" /bin/sh -euc "
  cd /tmp
  python3 -m venv /tmp/venv
  /tmp/venv/bin/pip install -q /tmp/wheel/$name
  /tmp/venv/bin/python -c '
import numpy as np, scalesweep as ss
x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
q = ss.quantize(x)
err = float(np.abs(ss.dequantize(q) - x).max())
assert q.codes.shape == (8, 32) and err < 1.0, (q.codes.shape, err)
print(\"test-wheel: import scalesweep\", ss.__version__, \"quantized (8, 64), max error\", round(err, 4))
'
  /tmp/venv/bin/scalesweep --version
  /tmp/venv/bin/scalesweep demo >/tmp/demo.txt
  head -n 3 /tmp/demo.txt
"
echo "test-wheel: $name installs and runs on a bare Debian 12 (no build libraries)"
