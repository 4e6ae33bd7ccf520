# A pinned virtual environment of a reference tool (sourced by scripts/get-llmcompressor.sh and
# get-modelopt.sh): `pinned_venv WHO VENV "PKGS" [PIP_ARGS...]` makes VENV (with $PY, default
# python3) hold PKGS, a space-separated list in which NAME==VERSION is a pin checked against the
# installed version and a bare NAME need only be installed, unless it already does. Idempotent;
# the pins are written once, in PKGS.
pinned_venv() {
  local who=$1 venv=$2 pkgs=$3
  shift 3
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" - "$pkgs" <<'PYEOF' 2>/dev/null; then
import importlib.metadata as m
import sys
bad = []
for spec in sys.argv[1].split():
    name, _, want = spec.partition("==")
    have = m.version(name).split("+")[0]  # raises (refused) when absent
    if want and have != want:
        bad.append(spec)
raise SystemExit(1 if bad else 0)
PYEOF
    echo "$who: $venv already holds $pkgs"
  else
    [ -x "$venv/bin/python" ] || ${PY:-python3} -m venv "$venv"
    echo "$who: installing $pkgs into $venv (several GB with torch's CUDA wheels)"
    # shellcheck disable=SC2086
    "$venv/bin/python" -m pip install -q "$@" $pkgs
  fi
}
