#!/usr/bin/env bash
# Creates .venv-modelopt (git-ignored): a virtual environment holding NVIDIA ModelOpt
# (nvidia-modelopt 0.47.0, the newest on PyPI; its NVFP4 weight calibrations "max", "mse" with
# fp8_scale_sweep, "local_hessian" and "gptq" are judged by bench/modelopt_compare.py) with
# torch, transformers (ModelOpt 0.47.0's [hf] extra wants transformers >=4.57,<5.15),
# accelerate, and requests (modelopt.torch imports it without declaring it). torch comes from
# PyPI (its Linux wheels carry the CUDA libraries: about 6 GB, 2 min here); the comparison runs
# on the CPU. Apart from .venv-llmc because the pins differ (llm-compressor 0.14.0.1 wants
# transformers >=5.15).
# Idempotent: a venv that already holds the pinned versions is left as it is.
# Environment: PYTHON (the base interpreter, default python3).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV="$ROOT/.venv-modelopt"
PY=${PYTHON:-python3}
PKGS="nvidia-modelopt==0.47.0 torch==2.15.0 transformers==5.14.1 accelerate==1.15.0 requests==2.34.2"
# shellcheck source=lib/venv.sh
. "$ROOT/scripts/lib/venv.sh"
pinned_venv get-modelopt "$VENV" "$PKGS"
"$VENV/bin/python" -c 'import importlib.metadata as m; import modelopt.torch.quantization as mtq, torch, transformers; print("get-modelopt: nvidia-modelopt", m.version("nvidia-modelopt"), "torch", torch.__version__, "transformers", transformers.__version__, "accelerate", m.version("accelerate"), "requests", m.version("requests"))'
