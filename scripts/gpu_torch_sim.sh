#!/usr/bin/env bash
# GPU check of scalesweep.torch (issue 27): compiles the Python module against a bundle built
# here (scripts/gpu_bundle.sh), runs the CUDA tests of simulate/calibrate and
# bench/torch_sim_gpu.py.  scripts/gpu_torch_sim.sh BUNDLE [SHAPES]   (results in ${OUT:-gpu_out})
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
B=$ROOT/build-gpu-run
[ -e "$B" ] && [ ! -f "$B/.bundle-origin" ] && { echo "$B is not an unpacked bundle" >&2; exit 2; }
rm -rf "$B" && mkdir -p "$B" && tar -xJf "${1:?bundle}" -C "$B" || exit 1
export LD_LIBRARY_PATH="$B/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
PKG=$ROOT/pyb/scalesweep; rm -rf "$ROOT/pyb"; mkdir -p "$PKG" && cp -r python/scalesweep/. "$PKG/"
EXT=$(python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
t0=$SECONDS
g++ -std=c++20 -O1 -fPIC -shared -fvisibility=hidden -DSS_HAVE_CUDA=1 -DSS_VERSION='"gpu"' \
  -I"$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
  -I"$(python3 -c 'import pybind11; print(pybind11.get_include())')" -I"$ROOT/include" \
  -I"$ROOT/src" src/python/module.cc -o "$PKG/_core$EXT" -Wl,--start-group "$B"/.pylib/*.a \
  -Wl,--end-group "$B"/.libs/libhwy.so.* "$B"/.libs/libcudart.so.* -Wl,-rpath,"$B/.libs" \
  -lpthread >"$OUT/module.log" 2>&1 || { tail -20 "$OUT/module.log"; exit 1; }
echo "module compiled in $((SECONDS - t0)) s"
export PYTHONPATH=$ROOT/pyb PYTHONUNBUFFERED=1
python3 -c "import scalesweep as s; print('scalesweep CUDA', s.CUDA)"
timeout 120 python3 -m pytest -q -rs python/tests/test_torch_simulate.py::test_cuda_model_uses_the_cuda_kernels_with_the_cpu_bytes \
  python/tests/test_torch_calibrate.py::test_cuda_equals_cpu 2>&1 | tail -5 | tee "$OUT/pytest.log"
timeout 200 python3 bench/torch_sim_gpu.py --shapes "${2:-qwen2-1.5b,llama-3.1-8b}" \
  --json "$OUT/torch_sim.json" 2>&1 | grep -v Warning | tee "$OUT/torch_sim.txt"
