#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs every test: C++ (GoogleTest via CTest) and Python
# (pytest via CTest). Tests that need ../shared/data skip visibly where it is absent;
# GPU tests are reported as skipped where no GPU exists.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh -DSS_WERROR=ON "$@"
ctest --test-dir build --output-on-failure -j"$(nproc)"
