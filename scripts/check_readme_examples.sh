#!/usr/bin/env bash
# Runs every ```sh block of README.md in order, as one script, from a scratch copy of the
# repository layout, and checks that .ci/run runs the test command README states.
#
#   scripts/check_readme_examples.sh [BUILD_DIR]     # BUILD_DIR defaults to build
#
# The first ```sh block (scripts/setup.sh / scripts/test.sh: installs packages) is not run;
# ```text blocks are output, not commands. The scratch directory holds links to BUILD_DIR
# (as build), models/ and ../shared, so the examples' relative paths resolve and their outputs
# (out/...) never touch the checkout. Exit 0 when every command succeeded.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
readme="$root/README.md"

# 1. README's test command is what CI runs.
test_cmd="$(awk '/^```sh$/ {inb = 1; next} /^```$/ {if (inb) exit; next} inb && /^scripts\/test\.sh/ {print $1}' "$readme")"
# .ci/run's commands: `scripts/X` lines, or `stage NAME scripts/X` (its timed stages).
ci_cmds="$(grep -v '^\s*#' "$root/.ci/run" |
  sed -nE 's/^[[:space:]]*(stage[[:space:]]+[^[:space:]]+[[:space:]]+)?(scripts\/[^[:space:]]+).*/\2/p' || true)"
ci_cmd="$(grep -Fx -- "$test_cmd" <<<"$ci_cmds" | head -n 1 || true)"
if [[ -z "$test_cmd" || "$test_cmd" != "$ci_cmd" ]]; then
  echo "check_readme_examples: README's test command '$test_cmd' is not among what .ci/run runs ($(echo $ci_cmds))" >&2
  exit 1
fi
echo "README test command '$test_cmd' = .ci/run's"

# 2. The examples.
[[ -x "$build/scalesweep" ]] || { echo "check_readme_examples: $build/scalesweep not built" >&2; exit 1; }
shared="$(cd "$root/../shared" 2>/dev/null && pwd)" || {
  echo "check_readme_examples: ../shared (data) not found beside $root" >&2
  exit 1
}
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
mkdir "$scratch/repo"
ln -s "$build" "$scratch/repo/build"
ln -s "$shared" "$scratch/shared"
[[ -e "$root/models" ]] && ln -s "$(cd "$root/models" && pwd)" "$scratch/repo/models"
[[ -e "$root/data" ]] && ln -s "$(cd "$root/data" && pwd)" "$scratch/repo/data"
[[ -e "$root/scripts" ]] && ln -s "$root/scripts" "$scratch/repo/scripts"

script="$scratch/examples.sh"
{
  echo 'set -euo pipefail'
  echo 'set -x'
  awk '
    /^```sh$/ { inb = 1; block = ""; next }
    /^```/ && inb {
      inb = 0
      if (block !~ /scripts\/setup\.sh/) printf "%s", block
      next
    }
    inb { block = block $0 "\n" }
  ' "$readme"
} >"$script"
n="$(grep -c 'build/scalesweep' "$script" || true)"
echo "running $n scalesweep commands from README.md in $scratch/repo"
(cd "$scratch/repo" && PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" bash "$script")
py="$scratch/examples.py"
awk '/^```python$/ {inb = 1; next} /^```/ && inb {inb = 0; next} inb {print}' "$readme" >"$py"
if PYTHONPATH="$build/python" python3 -c "import scalesweep" 2>/dev/null; then
  echo "running README's python example"
  (cd "$scratch/repo" && PYTHONPATH="$build/python" python3 "$py")
else
  echo "check_readme_examples: SKIP python example (no scalesweep module in $build/python)"
fi
echo "check_readme_examples: all README examples ran"
