# Debian packages of a set-up script (sourced by scripts/setup.sh, sanitize.sh, fuzz.sh):
# `need_debs WHO PKG...` installs the packages that are not installed yet (apt-get, with sudo
# when not root) and says which, prefixed by WHO; idempotent.
need_debs() {
  local who=$1 missing="" p
  shift
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  [ -n "$missing" ] || return 0
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "$who: installing Debian packages:$missing"
  $sudo apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
}
