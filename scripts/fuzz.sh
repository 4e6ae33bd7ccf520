#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/*_fuzz.cc; clang, ASan+UBSan, build-fuzz/) and runs
# each for SECONDS (default 60), starting from the seed corpus fuzz/corpus/<target>/ and
# the corpus earlier runs grew in build-fuzz/corpus/<target>/. Prints per target: executions,
# corpus size, result. Exits non-zero on any crash, leak, timeout (> 10 s for one input),
# out-of-memory (RSS > 2048 MB or one allocation > 2048 MB) or unexpected exception (see
# fuzz/fuzz_util.h); the input that did it is kept as build-fuzz/artifacts/<target>-*.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   (TARGET: npy, gguf, ...; default all)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-60}
shift || true
# shellcheck source=lib/debs.sh
. scripts/lib/debs.sh
need_debs fuzz clang libclang-rt-dev llvm
FLAGS="-g -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
t0=$(date +%s)
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ "${LAUNCHER[@]}" \
  -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_CXX_FLAGS="$FLAGS" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DSS_WERROR=ON -DSS_BUILD_TESTS=OFF -DSS_BUILD_BENCH=OFF -DSS_CUDA=OFF -DSS_FUZZ=ON >/dev/null
if [ $# -gt 0 ]; then targets="$*"; else
  targets=$(ls fuzz/*_fuzz.cc | sed 's|fuzz/\(.*\)_fuzz.cc|\1|')
fi
cmake --build build-fuzz -j"$(nproc)" --target $(for t in $targets; do echo "${t}_fuzz"; done)
t1=$(date +%s)
echo "fuzz: build $((t1 - t0)) s; ${SECONDS_PER_TARGET} s per target"
mkdir -p build-fuzz/artifacts build-fuzz/logs
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
status=0
printf '%-20s %12s %8s  %s\n' target executions corpus result
for t in $targets; do
  mkdir -p "build-fuzz/corpus/$t"
  dict=(); [ -f "fuzz/$t.dict" ] && dict=(-dict="fuzz/$t.dict")
  log="build-fuzz/logs/$t.log"
  set +e
  "build-fuzz/fuzz/${t}_fuzz" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 \
    -rss_limit_mb=2048 -malloc_limit_mb=2048 -max_len=65536 -len_control=100 \
    -print_final_stats=1 -artifact_prefix="build-fuzz/artifacts/$t-" "${dict[@]}" \
    "build-fuzz/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1 || true)
  corpus=$(ls "build-fuzz/corpus/$t" | wc -l)
  if [ $rc -eq 0 ]; then result=ok; else
    result="FAILED (rc $rc; $(grep -m1 -oE 'ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer): [a-z-]+|runtime error: .*|ss_fuzz: .*' "$log" | head -c 160 || true); see $log)"
    status=1
  fi
  printf '%-20s %12s %8s  %s\n' "$t" "${execs:-?}" "$corpus" "$result"
done
t2=$(date +%s)
echo "fuzz: run $((t2 - t1)) s"
exit $status
