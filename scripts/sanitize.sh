#!/usr/bin/env bash
# Builds the C++ test suite with AddressSanitizer + UndefinedBehaviorSanitizer (clang) into
# build-asan/ and runs every GoogleTest test through CTest. Any finding aborts the test that
# hit it (-fno-sanitize-recover=all), so the script exits non-zero.
# Usage: scripts/sanitize.sh [extra cmake args]   (env: SS_SANITIZE_BUILD_TYPE, default Debug)
# Excluded: python_tests (the pytest suite drives the CLI and the pybind11 module through the
# system Python; an ASan runtime there needs LD_PRELOAD of libasan into python3 and reports
# CPython's own allocations; the CLI paths it covers are the same library calls the
# GoogleTest suite runs here).
# Also excluded: QuantizeStreamMemory.BoundedByOneLayer, which measures the heap through
# glibc's allocator statistics (ASan replaces the allocator, so its probe sees 0 bytes), and
# Threads.CreationFailureFallsBackToFewerThreads, which caps the address space so that thread
# creation fails (ASan's shadow and fake stacks need that space and abort first).
# handle_sigbus=0: our own SIGBUS handler (a mapped input truncated while read, io/atomic_file)
# is under test and is installed only over the default action, which ASan's would replace.
# Suppressions: none needed (scripts/sanitize.supp documents the policy: third-party only).
set -euo pipefail
cd "$(dirname "$0")/.."
# clang and its sanitizer runtimes (Debian), idempotent like scripts/setup.sh.
# shellcheck source=lib/debs.sh
. scripts/lib/debs.sh
need_debs sanitize clang libclang-rt-dev llvm
BT=${SS_SANITIZE_BUILD_TYPE:-Debug}
FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
t0=$(date +%s)
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE="$BT" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ "${LAUNCHER[@]}" \
  -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_CXX_FLAGS="$FLAGS" \
  -DCMAKE_EXE_LINKER_FLAGS="$FLAGS" -DCMAKE_SHARED_LINKER_FLAGS="$FLAGS" \
  -DSS_WERROR=ON -DSS_BUILD_BENCH=OFF -DSS_CUDA=OFF "$@" >/dev/null
# Every *_test binary (the CLI and the Python module are not needed for the C++ suite).
targets=$(ninja -C build-asan -t targets all | grep -oE '^[a-z]+_test:' | tr -d : | sort -u)
cmake --build build-asan -j"$(nproc)" --target $targets
t1=$(date +%s)
export ASAN_OPTIONS="handle_sigbus=0:detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
ctest --test-dir build-asan --output-on-failure -j"$(nproc)" -LE python \
  -E '^(QuantizeStreamMemory\.BoundedByOneLayer|Threads\.CreationFailureFallsBackToFewerThreads)$'
t2=$(date +%s)
echo "sanitize: build ${BT} $((t1 - t0)) s, tests $((t2 - t1)) s"
