#!/usr/bin/env bash
# Size figures of the tree for architecture reviews: lines in src/tools, the ten longest
# functions outside tests and CUDA (lizard from PyPI: pip install lizard), and the number of
# repeated code pairs (six or more shared lines) when the `duplicates` tool is on PATH.
set -u
cd "$(dirname "$0")/.."
echo "lines in src/tools: $(cat src/tools/* | wc -l) ($(ls src/tools | wc -l) files)"
echo "lines per layer (sources and headers, tests excluded):"
for d in src/*/; do
  l=$(basename "$d")
  n=$(find "$d" include/scalesweep/"$l" -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' \) \
        ! -name "*_test.cc" 2>/dev/null | xargs cat 2>/dev/null | wc -l || true)
  printf '  %-10s %6d\n' "$l" "$n"
done
if python3 -c 'import lizard' 2>/dev/null; then
  echo "ten longest functions (lines):"
  python3 -m lizard src -l cpp -x '*_test.cc' -x './src/kernels/*' -x 'src/kernels/*' 2>/dev/null |
    awk '/@src\//' | sort -u | sort -k5 -n -r | head -10 | awk '{printf "  %4d  %s\n", $5, $6}'
else
  echo "ten longest functions: pip install lizard"
fi
if command -v duplicates >/dev/null; then
  duplicates --seconds 120 --most 1 | head -1
fi
