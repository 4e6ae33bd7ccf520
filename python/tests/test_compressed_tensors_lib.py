"""Our checkpoints read by the compressed-tensors library itself (when it is importable).

compressed-tensors pulls torch (> 1 GB from PyPI with its CUDA wheels), so it is not part of
the project's setup and this module skips visibly without it. With it (e.g. a venv with
`pip install compressed-tensors`, then SCALESWEEP_BIN=... python -m pytest this file):

1. config.json's quantization_config validates as the library's pydantic QuantizationConfig,
   and for releases 0.14.0 .. 0.18.0 (the serialization we reproduce, `version` "0.14.0")
   its model_dump() equals what we wrote, field for field;
2. every NVFP4 Linear decompresses with the library's NVFP4 compressor (nvfp4-pack-quantized,
   looked up in its registry): the unpacked FP4 values equal our codes exactly, and the weight
   equals our dequantized weight (`inspect --dump-dequant`, the runtime's reader) to within
   one rounding of the library's output dtype. (The library computes q * fl(s / gs) where we
   and vLLM compute fl(q * s) / gs: the two can differ in the last bit for q = 1.5, 3, 6.)
"""

import json
import os
import subprocess

import numpy as np
import pytest

ct = pytest.importorskip("compressed_tensors", reason="compressed-tensors not installed "
                         "(pip install compressed-tensors; it needs torch)")
torch = pytest.importorskip("torch")
safetensors = pytest.importorskip("safetensors")
from safetensors.numpy import load_file  # noqa: E402
from safetensors.torch import load_file as load_torch  # noqa: E402

BIN = os.environ.get("SCALESWEEP_BIN")
DATA = os.environ.get("SS_SHARED_DATA_DIR", "")
MODEL = os.path.join(DATA, "models", "stories260K", "stories260K.bin")

pytestmark = [
    pytest.mark.skipif(not BIN, reason="SCALESWEEP_BIN not set (run through ctest)"),
    pytest.mark.skipif(not os.path.exists(MODEL),
                       reason=f"stories260K not found under SS_SHARED_DATA_DIR={DATA!r}"),
]


def run(*args):
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"{args}: {p.stderr}"
    return p


@pytest.fixture(scope="module", params=["W", "WA"])
def ckpt(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("ct_" + request.param)
    out = d / "out"
    args = ["--quant", request.param]
    if request.param == "WA":
        args += ["--calib", os.path.join(DATA, "text", "tinystories_val.txt"), "--nsamples", "4",
                 "--seqlen", "64"]
    run("quantize", MODEL, "-o", out, "--method", "sweep-mse", *args)
    dump = d / "dequant.safetensors"
    run("inspect", out, "--dump-dequant", dump)
    return out, dump


def version_tuple(v):
    return tuple(int(x) for x in v.split(".")[:3] if x.isdigit())


def test_config_validates(ckpt):
    from compressed_tensors.quantization import QuantizationConfig

    out, _ = ckpt
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    cfg = QuantizationConfig.model_validate(qc)
    assert cfg.format == "nvfp4-pack-quantized"
    assert list(cfg.ignore) == qc["ignore"]
    scheme = cfg.config_groups["group_0"]
    assert scheme.weights.num_bits == 4 and scheme.weights.group_size == 16
    if (0, 14, 0) <= version_tuple(ct.__version__) <= (0, 18, 0):
        dumped = cfg.model_dump()
        ours = {k: v for k, v in qc.items()
                if k not in ("version", "sparsity_config", "transform_config")}
        assert {k: dumped[k] for k in ours} == ours


def nvfp4_compressor():
    from compressed_tensors.compressors import BaseCompressor

    cls = BaseCompressor.get_value_from_registry("nvfp4-pack-quantized")
    # 0.14 .. 0.15: an instance with decompress_weight(); 0.16+: classmethods only.
    return cls() if hasattr(cls, "decompress_weight") else cls


def decompress_with_library(tensors, prefix, scheme):
    comp = nvfp4_compressor()
    data = {k: tensors[f"{prefix}.{k}"] for k in
            ("weight_packed", "weight_scale", "weight_global_scale")}
    if hasattr(comp, "decompress_weight"):  # 0.14 .. 0.15: instance API
        return comp.decompress_weight(compressed_data=dict(data),
                                      quantization_args=scheme.weights)
    return comp.decompress(dict(data), scheme)["weight"]  # 0.16+: per-module state dict


def test_library_decompression_matches_runtime(ckpt):
    from compressed_tensors.quantization import QuantizationConfig

    try:
        from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    except ImportError:
        from compressed_tensors.compressors.quantized_compressors.fp4_quantized import (
            unpack_fp4_from_uint8)
    out, dump = ckpt
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    scheme = QuantizationConfig.model_validate(qc).config_groups["group_0"]
    tensors = load_torch(str(out / "model.safetensors"))
    runtime = load_file(str(dump))
    e2m1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)
    n = 0
    for key in runtime:
        prefix = key[: -len(".weight")]
        ours = runtime[key]
        rows, cols = ours.shape
        packed = tensors[prefix + ".weight_packed"]
        # FP4 values: low nibble first, sign bit 8.
        vals = unpack_fp4_from_uint8(packed, rows, cols, dtype=torch.float32).numpy()
        p = packed.numpy()
        codes = np.empty((rows, cols), dtype=np.uint8)
        codes[:, 0::2] = p & 15
        codes[:, 1::2] = (p >> 4)[:, : cols // 2]
        expect = np.where(codes & 8, -e2m1[codes & 7], e2m1[codes & 7]).astype(np.float32)
        assert np.array_equal(vals, expect), prefix
        lib = decompress_with_library(tensors, prefix, scheme)
        # One rounding of the library's output dtype (bf16 by default, or fp32).
        eps = 2.0 ** -8 if lib.dtype in (torch.bfloat16, torch.float16) else 2.0 ** -23
        lib = lib.to(torch.float32).numpy()
        assert lib.shape == ours.shape, prefix
        assert np.all(np.abs(lib - ours) <= eps * np.abs(ours) + 1e-30), prefix
        n += 1
    assert n > 0

