"""PyTorch integration for transformers models (Llama, Qwen2, Qwen3).

simulate(model, setting, ...)  simulated NVFP4 / MXFP4 in the forward pass: W, WA, WAKV, WAKVQ
                               with the native runtime's definitions (`scalesweep ppl --quant`);
                               returns a handle whose remove() restores the model.
calibrate(model, batches, ...) the calibration statistics `scalesweep calibrate` writes
                               (Linear-input ΣxxT, amax, Q/K/V channel norms), computed with
                               hooks in PyTorch (on the GPU where the model is), saved in the same
                               safetensors format.
calibration_windows(ids, ...)  the sequences `scalesweep calibrate --nsamples --seqlen --seed`
                               draws from the same token ids (its splitmix64 sampling).

CPU tensors use the CPU kernels, CUDA tensors the CUDA kernels (scalesweep.fake_quantize).
"""
try:
    import torch  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError("scalesweep.torch needs PyTorch (pip install torch)") from e

from .simulate import SimHandle, check_settings, simulate  # noqa: E402
from .stats import load_stats  # noqa: E402

__all__ = ["simulate", "check_settings", "SimHandle", "load_stats"]
try:  # the calibration hooks (scalesweep.torch.calibrate)
    from .calibrate import calibrate, calibration_windows  # noqa: E402,F401
    __all__ += ["calibrate", "calibration_windows"]
except ImportError:  # pragma: no cover
    pass
