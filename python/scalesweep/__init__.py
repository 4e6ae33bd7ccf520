"""scalesweep: accurate NVFP4 / MXFP4 quantization (ScaleSweep) of numpy arrays and torch tensors.

The functions are the compiled extension ``scalesweep._core`` (src/python/), the same
C++ library as the ``scalesweep`` CLI, so the bytes are the CLI's. numpy arrays in give numpy
arrays out; torch tensors (float32 / float16 / bfloat16, CPU) in give torch tensors out, read
in place (no copy for a row-major tensor; a strided one is copied once). torch is optional and
never imported by scalesweep itself.

    import scalesweep as ss
    q = ss.quantize(w)                 # w: [N, K] numpy array or torch tensor
    sd = q.state_dict("model.layers.0.mlp.down_proj")  # compressed-tensors NVFP4 tensors
    w_hat = ss.dequantize(q)           # float32, the same kind as w
    w_fq = ss.fake_quantize(w)         # quantize-dequantize; torch input keeps its dtype
"""
from ._core import *  # noqa: F401,F403  (every public function and QuantizedTensor)
from ._core import CUDA, FORMATS, METHODS, __version__  # noqa: F401
