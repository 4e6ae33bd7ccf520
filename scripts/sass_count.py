#!/usr/bin/env python3
"""Static SASS instruction counts of the CUDA quantize kernels (docs/CUDA.md).

Compiles src/kernels/cuda/quantize.cu to a cubin per architecture with the flags of
src/kernels/cuda/CMakeLists.txt (IEEE contract: -ftz=false -prec-div=true -fmad=false),
disassembles it (cuobjdump -sass, or nvdisasm) and prints, for the vectorized kernel
quantize_vec<dtype, method, fast> of every method (exact numerics) and of the sweeps' fast
numerics (rows "sweep-mse (fast)", "sweep-wmse (fast)"):

  total     instructions in the kernel
  block     instructions of the grid-stride loop body (one 16-element block) with each
            candidate scan counted once; built with -DSS_CUDA_SASS_PROBE=1, which fixes the
            bench-gpu outputs (codes + swizzled scales, importance for sweep-wmse) at compile
            time, so this is the executed path of one block, minus the scan repetitions
  scans     candidate loops (the pruned sweep has an ascending and a descending one)
  cand      instructions of the longest candidate loop body (one candidate of one block)
  /elem     cand / 16: issued instructions per element per candidate
  mix       of the candidate loop: packed-16-bit (HSET2/HFMA2/HMUL2/HADD2/HMNMX2),
            FP32 (FADD/FMUL/FSET/FSEL/FMNMX and the packed f32x2 FADD2/FMUL2), other
  fp32x2    packed f32x2 instructions in the candidate loop (sm_100+)
Exit status 1 (with a WARNING line) when a candidate loop of an exact kernel holds an
FFMA/FFMA2: a contracted e*e + L changes the loss bytes (the fast kernels use FFMA by design;
for them the check is that each element kept its 4 FFMA, t = fma(M, 2^22, r),
q = fma(-M, 2^22, t), e and L: the magic-add rounding of src/kernels/cuda/fast_quant.h was
not folded away).

Loops are found from backward branches: the grid-stride loop is the longest one, the
candidate loops the outermost loops of more than 64 instructions nested inside it (the
sweeps' window scans).

Usage:  scripts/sass_count.py [--arch 90 --arch 100a] [--dtype bf16] [--json out.json]
        [--cubin-dir DIR] [--keep]
cuobjdump/nvdisasm are looked up in PATH, $CUDA_HOME/bin, /usr/local/cuda/bin and the
pip wheels nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm (pip install them if missing).
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = [
    "-O3", "-DNDEBUG", "-std=c++20", "-ftz=false", "-prec-div=true", "-prec-sqrt=true",
    "-fmad=false", "--expt-relaxed-constexpr", "-Xcompiler=-ffp-contract=off",
    "-Xcompiler=-fno-fast-math", "-DSS_CUDA_SASS_PROBE=1",
]
# (row label, scalesweep::Method enumerator index, cuda::Numerics index: 0 exact, 1 fast,
# 2 half2)
KERNELS = [("absmax", 0, 0), ("4over6", 1, 0), ("sweep-mse", 2, 0), ("sweep-wmse", 3, 0),
           ("exhaustive-mse", 5, 0), ("exhaustive-wmse", 6, 0), ("sweep-mse (fast)", 2, 1),
           ("sweep-wmse (fast)", 3, 1), ("sweep-mse (half2)", 2, 2), ("sweep-wmse (half2)", 3, 2)]
METHODS = [k[0] for k in KERNELS]

# Issue-rate / bandwidth model (docs/CUDA.md): name, arch, SMs, sustained SM clock (GHz,
# assumed), DRAM bandwidth (TB/s, datasheet), fraction of it a device-to-device copy reaches
# (assumed). Every SM issues 4 warp-instructions per clock (one per scheduler).
GPUS = [
    ("H100 SXM", "90", 132, 1.755, 3.35, 0.90),
    ("H200 SXM", "90", 132, 1.755, 4.80, 0.90),
    ("B200", "100a", 148, 1.90, 8.00, 0.90),
    ("RTX PRO 6000 Blackwell", "120a", 188, 2.40, 1.792, 0.90),
]
# Bytes per element moved by bench-gpu (bf16 in, packed codes, swizzled E4M3 scales; the
# importance vector is negligible) and by the copy it is compared with (read + write).
BYTES = 2 + 0.5 + 1 / 16
COPY_BYTES = 4.0
# Warp steps of the sweeps' candidate loops on bench-like data (1 + the largest ascending +
# the largest descending trip count among 32 lanes), printed by cuda_host_test
# CudaSweep.PruningOnBenchLikeData; the unpruned single loop runs the largest window.
# exhaustive-mse: the same test's walk over 1..126 (zero stop); the fast kernels walk as the
# exact ones (sweep-mse pruned, sweep-wmse plain), on their estimates.
STEPS = {"sweep-mse": 10.16, "sweep-wmse": 16.0, "exhaustive-mse": 41.67,
         "sweep-mse (fast)": 10.16, "sweep-wmse (fast)": 16.0, "sweep-mse (half2)": 10.16,
         "sweep-wmse (half2)": 16.0}
DTYPES = {"f32": 0, "bf16": 1, "f16": 2}


def find_tool(name):
    cands = [shutil.which(name)]
    for d in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if d:
            cands.append(os.path.join(d, "bin", name))
    for p in sys.path:
        cands += glob.glob(os.path.join(p, "nvidia", "cu*", "bin", name))
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def compile_cubin(nvcc, arch, out, root):
    src = os.path.join(root, "src", "kernels", "cuda", "quantize.cu")
    cmd = [nvcc, f"-arch=sm_{arch}", "-cubin", "-I", os.path.join(root, "include"), "-I",
           os.path.join(root, "src")] + FLAGS + ["-x", "cu", src, "-o", out]
    subprocess.run(cmd, check=True)


def disassemble(cubin):
    tool = find_tool("cuobjdump")
    if tool:
        return subprocess.run([tool, "-sass", cubin], check=True, capture_output=True,
                              text=True).stdout
    tool = find_tool("nvdisasm")
    if tool:
        return subprocess.run([tool, "-c", cubin], check=True, capture_output=True,
                              text=True).stdout
    sys.exit("sass_count: neither cuobjdump nor nvdisasm found "
             "(pip install nvidia-cuda-cuobjdump, or put the CUDA toolkit's bin in PATH)")


INS = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
FUNC = re.compile(r"(?:Function : |\.text\.)(\S+?)(?::|\s|$)")


def functions(sass):
    """{mangled name: [(address, instruction text)]}"""
    out, cur = {}, None
    for line in sass.splitlines():
        m = FUNC.search(line)
        if m and ("Function :" in line or line.startswith(".text.")):
            cur = m.group(1)
            out[cur] = []
            continue
        m = INS.match(line)
        if m and cur is not None:
            out[cur].append((int(m.group(1), 16), m.group(2)))
    return out


def opcode(text):
    t = re.sub(r"^@!?U?P[T0-9]+\s+", "", text)
    return t.split()[0] if t else ""


def loops(ins):
    """Backward branches as (start, end) address ranges, inclusive."""
    res = []
    for a, t in ins:
        if opcode(t) != "BRA":
            continue
        m = re.search(r"(0x[0-9a-f]+)\s*$", t)
        if m and int(m.group(1), 16) < a:
            res.append((int(m.group(1), 16), a))
    return res


def count_range(ins, lo, hi):
    return [t for a, t in ins if lo <= a <= hi]


def classify(ops):
    h16 = fp32 = x2 = other = 0
    for t in ops:
        op = opcode(t)
        base = op.split(".")[0]
        if base in ("FADD2", "FMUL2", "FFMA2"):
            x2 += 1
            fp32 += 1
        elif base in ("HSET2", "HFMA2", "HMUL2", "HADD2", "HMNMX2", "HSETP2"):
            h16 += 1
        elif base in ("FADD", "FMUL", "FSET", "FSETP", "FSEL", "FMNMX", "FFMA"):
            fp32 += 1
        else:
            other += 1
    return h16, fp32, x2, other


def analyse(ins):
    total = len(ins)
    lps = loops(ins)
    if not lps:
        return {"total": total, "block": total, "cand": 0}
    grid = max(lps, key=lambda r: r[1] - r[0])
    block = len(count_range(ins, *grid))
    inner = [r for r in lps if r != grid and grid[0] <= r[0] and r[1] <= grid[1]]
    # Candidate scans: inner loops of more than 64 instructions (the small ones are the
    # atomic retry / dequant store loops); sum of the disjoint outermost ones.
    big = sorted([r for r in inner if len(count_range(ins, *r)) > 64], key=lambda r: r[0])
    scans = []
    for r in big:
        if not any(o[0] <= r[0] and r[1] <= o[1] and o != r for o in big):
            scans.append(r)
    bodies = [count_range(ins, *r) for r in scans]
    cand_ops = max(bodies, key=len) if bodies else []
    h16, fp32, x2, other = classify(cand_ops)
    # A fused multiply-add inside a candidate loss breaks the contract (fl(fl(e*e) + L) is two
    # roundings); ptxas 13.0 contracts even mul.rn/add.rn.f32x2 with --fmad=false.
    ffma = sum(1 for b in bodies for t in b if opcode(t).split(".")[0] in ("FFMA", "FFMA2"))
    ffma_cand = sum(1 for t in cand_ops if opcode(t).split(".")[0] == "FFMA")
    return {"ffma_in_scans": ffma, "ffma_in_cand": ffma_cand, "total": total, "block": block, "cand": len(cand_ops), "scans": len(scans),
            "scan_bodies": [len(b) for b in bodies], "h16": h16, "fp32": fp32, "fp32x2": x2,
            "other": other}


def dynamic_per_block(r, steps):
    """Instructions one warp issues per 16-element block (per lane): the straight-line block
    path (which holds the peeled first candidate and one body of each scan) plus the remaining
    scan steps."""
    if not r.get("cand"):
        return r["block"]
    if r["method"] not in steps:
        return None
    return r["block"] + (steps[r["method"]] - 1 - r["scans"]) * r["cand"]


def predict(rows, steps):
    print("\nPREDICTION (not a measurement): time per element = max(memory, issue); memory = "
          f"{BYTES:.4f} B / (copy efficiency x DRAM BW), issue = instructions per element / "
          "(SMs x 4 x 32 lanes x clock)")
    print("| GPU | method | instr/elem | issue ps/elem | memory ps/elem | bound | "
          "x absmax | % of copy BW |")
    print("|---|---|---:|---:|---:|---|---:|---:|")
    for name, arch, sms, ghz, tbs, eff in GPUS:
        rs = {r["method"]: r for r in rows if r["arch"] == f"sm_{arch}"}
        if not rs:
            continue
        rate = sms * 4 * 32 * ghz * 1e9
        mem = BYTES / (eff * tbs * 1e12)
        t = {}
        for meth in METHODS:
            if meth not in rs:
                continue
            dyn = dynamic_per_block(rs[meth], steps)
            if dyn is None:  # no warp-step figure for this method
                continue
            ipe = dyn / 16
            iss = ipe / rate
            t[meth] = (ipe, iss, mem, max(iss, mem))
        for meth, (ipe, iss, mm, tt) in t.items():
            rel = tt / t["absmax"][3] if "absmax" in t else float("nan")
            bw = (BYTES / tt) / (eff * tbs * 1e12) * 100
            print(f"| {name} | {meth} | {ipe:.1f} | {iss * 1e12:.2f} | {mm * 1e12:.2f} | "
                  f"{'issue' if iss > mm else 'memory'} | {rel:.2f} | {bw:.0f}% |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", action="append", help="sm arch, e.g. 90, 100a (repeatable)")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--nvcc", default=os.environ.get("NVCC", "/usr/local/cuda/bin/nvcc"))
    ap.add_argument("--cubin-dir", help="reuse/keep cubins here (quantize_sm<arch>.cubin)")
    ap.add_argument("--json", help="also write the table as JSON to this file")
    ap.add_argument("--predict", action="store_true",
                    help="also print the issue-rate/bandwidth prediction per GPU (docs/CUDA.md)")
    ap.add_argument("--steps", action="append", default=[], metavar="METHOD=N",
                    help="warp steps of a sweep's candidate loops (default sweep-mse=10.16, "
                         "sweep-wmse=16 from the host test; use the window size for an "
                         "unpruned single scan)")
    ap.add_argument("--root", default=ROOT,
                    help="source tree to compile (default: this checkout), e.g. an older "
                         "commit unpacked with git archive, for before/after tables")
    args = ap.parse_args()
    archs = args.arch or ["90", "100a"]
    tmp = args.cubin_dir or tempfile.mkdtemp(prefix="sass_count_")
    os.makedirs(tmp, exist_ok=True)
    rows = []
    for arch in archs:
        cubin = os.path.join(tmp, f"quantize_sm{arch}.cubin")
        if not (args.cubin_dir and os.path.exists(cubin)):
            compile_cubin(args.nvcc, arch, cubin, args.root)
        funcs = functions(disassemble(cubin))
        for meth, mi, fast in KERNELS:
            # Itanium mangling of quantize_vec<DType, Method, Numerics, bool kDeq> (kDeq =
            # false: the bench-gpu launch has no dequant output); the namespace prefixes (N...,
            # S_, NS1_) depend on where the enums live, so match them loosely.
            key = re.compile(rf"quantize_vecIL[^E]*DTypeE{DTYPES[args.dtype]}E"
                             rf"L[^E]*MethodE{mi}EL[^E]*NumericsE{fast}ELb0E")
            names = [n for n in funcs if key.search(n)]
            if not names:
                sys.exit(f"sass_count: kernel quantize_vec<{args.dtype}, {meth}> not found "
                         f"in the sm_{arch} cubin")
            r = analyse(funcs[names[0]])
            r.update(arch=f"sm_{arch}", method=meth, dtype=args.dtype, fast=fast)
            rows.append(r)
    if not args.cubin_dir:
        shutil.rmtree(tmp, ignore_errors=True)
    hdr = ("| arch | method | total | block | scans | cand | /elem | 16-bit | fp32 | fp32x2 | "
           "other |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"quantize_vec<{args.dtype}, method>: static SASS instruction counts")
    print(hdr)
    for r in rows:
        c = r["cand"]
        per = f"{c / 16:.2f}" if c else "-"
        print(f"| {r['arch']} | {r['method']} | {r['total']} | {r['block']} | "
              f"{r.get('scans', 0)} | {c or '-'} | "
              f"{per} | {r.get('h16', '-') if c else '-'} | {r.get('fp32', '-') if c else '-'} | "
              f"{r.get('fp32x2', '-') if c else '-'} | {r.get('other', '-') if c else '-'} |")
    if args.predict:
        steps = dict(STEPS)
        for kv in args.steps:
            k, v = kv.split("=")
            steps[k] = float(v)
        predict(rows, steps)
    bad = [r for r in rows if r.get("ffma_in_scans") and not r["fast"]]
    for r in bad:
        print(f"WARNING: {r['arch']} {r['method']}: {r['ffma_in_scans']} FFMA/FFMA2 in the "
              "candidate loops: the loss is no longer the contract's (docs/NUMERICS.md)")
    folded = [r for r in rows if r["fast"] == 1 and r.get("cand") and r["ffma_in_cand"] < 64]
    for r in folded:
        print(f"WARNING: {r['arch']} {r['method']}: {r['ffma_in_cand']} FFMA in the candidate "
              "loop, fewer than 4 per element: the magic-add E2M1 rounding was folded away")
    bad += folded
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
