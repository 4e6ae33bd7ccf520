"""Splits WikiText-2 (validation) into disjoint calibration and evaluation halves at the article
heading nearest past the middle: OUTDIR/calib.txt (first half) and OUTDIR/eval.txt (second).
The one split of the bench scripts (real_model_results.sh, gguf_memory.sh).

    python3 bench/split_wikitext.py WIKITEXT.txt OUTDIR
"""
import sys


def main(src, out):
    lines = open(src, encoding="utf-8").read().split("\n")
    i = len(lines) // 2
    while not (lines[i].startswith(" = ") and not lines[i].startswith(" = =")):
        i += 1
    open(out + "/calib.txt", "w", encoding="utf-8").write("\n".join(lines[:i]))
    open(out + "/eval.txt", "w", encoding="utf-8").write("\n".join(lines[i:]))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
