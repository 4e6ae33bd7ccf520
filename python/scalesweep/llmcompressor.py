"""ScaleSweep block scales inside llm-compressor (>= 0.14): two weight observers.

Importing this module registers, in llm-compressor's own observer registry
(``llmcompressor.observers.Observer``):

- ``scalesweep_mse``:  per 16-element block, the FP8 E4M3 scale with the least squared error
  (scalesweep method ``sweep-mse``);
- ``scalesweep_wmse``: the same with each column weighted by its importance E[x^2], the
  per-input-channel second moment that llm-compressor's own ``imatrix_mse`` /
  ``nvfp4_expanded_imatrix`` observers accumulate with a forward-pre hook (we reuse their
  hook, so the importance is theirs, byte for byte); scalesweep method ``sweep-wmse``.

Both are used for NVFP4 weights (strategy TENSOR_GROUP, group 16: the NVFP4 and NVFP4A16
schemes), with QuantizationModifier (round to nearest) and with GPTQModifier (GPTQ keeps the
observer's block scales fixed). One recipe line::

    import scalesweep.llmcompressor  # registers the observers
    QuantizationModifier(targets="Linear", scheme="NVFP4A16", ignore=["lm_head"],
                         weight_observer="scalesweep_mse")

observer_kwargs: ``threads`` (the kernel's threads, 0 = all cores; any count gives the same
bytes) and, for ``scalesweep_wmse``, ``strict`` (default True: refuse a Linear without
importance data instead of llm-compressor's silent fallback to unweighted).

An all-zero block gets scale 0 from the kernel (what ``scalesweep quantize`` writes); the
observer hands compressed-tensors the FP8 eps 0.125 there instead, as its own
``calculate_qparams`` does, since its quantize step divides by the scale (codes stay 0).

Global scale: llm-compressor's convention, gs = 448 * 6 / amax, amax taken over this Linear
and the Linears fused with it (q/k/v, gate/up share one global scale, as vLLM requires; the
fusion is llm-compressor's own, through ``FusionHandler``). Our statistics are the plain
per-group min/max (those of ``memoryless_minmax``), so amax is the weights' AbsMax. One
rounding differs: compressed-tensors' ``generate_gparam`` evaluates 2688 / amax as torch does a
scalar over a tensor, fl(fl(1 / amax) * 2688), which is one ulp off the division in about a
quarter of cases; we use the correctly rounded division fl(2688 / amax)
(``scalesweep.global_scale_for_amax(amax, 448)``), the value ``scalesweep quantize
--max-block-scale 448`` writes. The block scales are then chosen for that global scale by
scalesweep's C++ kernels (``scalesweep.quantize(..., global_scale=gs)``), not re-implemented
here, so an llm-compressor RTN checkpoint made with ``scalesweep_mse`` has the bytes of
``scalesweep quantize --method sweep-mse --max-block-scale 448`` (python/tests).
"""

from __future__ import annotations

import numpy as np
import torch
from compressed_tensors.quantization import QuantizationStrategy, QuantizationType
from llmcompressor.observers.base import Observer, QParamsDict
from llmcompressor.observers.imatrix import IMatrixMSEObserver

try:  # inside the package (pip install ., or build/python/scalesweep): the compiled core
    from . import _core as _ss
except ImportError:  # this file loaded on its own, beside a build's extension module
    import scalesweep as _ss

__all__ = ["ScaleSweepMSEObserver", "ScaleSweepWMSEObserver", "block_scales"]

_BLOCK = 16
_FP8_MAX = 448.0  # compressed-tensors: gs = FP8 E4M3 max * FP4 E2M1 max / amax


def _check_args(name: str, args) -> None:
    """Refuse what these observers do not do, naming the setting (no silent fallback)."""
    if args.type != QuantizationType.FLOAT or args.num_bits != 4:
        raise ValueError(f"{name}: needs NVFP4 weights (type float, 4 bits); got type "
                         f"{args.type}, {args.num_bits} bits")
    if args.strategy != QuantizationStrategy.TENSOR_GROUP or args.group_size != _BLOCK:
        raise ValueError(f"{name}: needs strategy tensor_group with group_size {_BLOCK} "
                         f"(NVFP4); got strategy {args.strategy}, group_size {args.group_size}")
    if not args.symmetric:
        raise ValueError(f"{name}: NVFP4 is symmetric; got symmetric=False")


def block_scales(weight: torch.Tensor, global_scale: float, method: str,
                 importance: np.ndarray | None = None, name: str = "weight",
                 threads: int = 0) -> torch.Tensor:
    """FP8 E4M3 block scales (float32 values, shape [rows, cols/16]) chosen by scalesweep's
    kernel for ``weight`` [rows, cols] at the encode-direction global scale ``global_scale``
    (x ~ code * scale / global_scale, compressed-tensors' convention)."""
    w = weight.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()
    q = _ss.quantize(w, method=method, global_scale=float(global_scale), importance=importance,
                     threads=threads, name=name)
    bits = np.ascontiguousarray(q.scales).reshape(w.shape[0], -1)
    fp8 = torch.from_numpy(bits.view(np.uint8).copy()).view(torch.float8_e4m3fn)
    return fp8.to(torch.float32)


class _ScaleSweepMixin:
    """Statistics: the per-group min/max (for the fused global scale) and the observed weight
    (for the block scales, chosen in get_qparams once the global scale is known)."""

    _method = ""
    _stats_attrs = ["min_vals", "max_vals", "_ss_weight"]

    def _check_weight_observer(self, name: str) -> None:
        """Refuse any use but a weight observer, and weight settings these observers do not
        do (_check_args)."""
        if self.is_weight_obs:
            _check_args(name, self.args)
        else:
            raise ValueError(f"{name}: a weight observer (got base_name "
                             f"'{self.base_name}'); use it as weight_observer")

    def _observe(self, observed: torch.Tensor) -> None:
        # observed: (1, rows, groups, 16) for a TENSOR_GROUP weight
        self.min_vals = torch.amin(observed, dim=(0, -1))
        self.max_vals = torch.amax(observed, dim=(0, -1))
        self._ss_weight = observed[0].reshape(observed.shape[1], -1)

    def _importance(self) -> np.ndarray | None:
        return None

    def get_global_scale(self) -> torch.Tensor:
        """gs = fl(2688 / amax) over the fusion group (see the module's notes)."""
        amax = 0.0
        for st in self.fusion_handler.get_fused_statistics():
            amax = max(amax, float(st["max_vals"].max()), float(-st["min_vals"].min()))
        return torch.tensor([_ss.global_scale_for_amax(amax, _FP8_MAX)], dtype=torch.float32,
                            device=self.min_vals.device)

    def _block_scales(self, w: torch.Tensor, global_scale: float) -> torch.Tensor:
        """The block scales (float32 values, [rows, cols/16]) at this global scale."""
        return block_scales(w, global_scale, self._method, self._importance(),
                            name=self.base_name,
                            threads=self.args.observer_kwargs.get("threads", 0))

    @torch.no_grad
    def get_qparams(self) -> QParamsDict:
        assert self.has_statistics, "No statistics available. Call observer(value) first."
        global_scale = self.get_global_scale()
        w = self._ss_weight
        scale = self._block_scales(w, float(global_scale.item()))
        # an all-zero block: compressed-tensors' eps instead of 0 (see the module's notes)
        eps = torch.finfo(torch.float8_e4m3fn).eps
        scale = torch.where(scale == 0, torch.full_like(scale, eps), scale)
        scale = scale.to(device=w.device, dtype=self.min_vals.dtype)
        zero_point = torch.zeros(scale.shape, device=w.device, dtype=self.min_vals.dtype)
        self.delete_statistics()
        return {"scale": scale, "zero_point": zero_point, "global_scale": global_scale}


@Observer.register("scalesweep_mse")
class ScaleSweepMSEObserver(_ScaleSweepMixin, Observer):
    """NVFP4 block scales with the least squared error over FP8 E4M3 scales (sweep-mse)."""

    _method = "sweep-mse"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._check_weight_observer("scalesweep_mse")

    def update_statistics_from_observed(self, observed: torch.Tensor) -> None:
        self._observe(observed)


@Observer.register("scalesweep_wmse")
class ScaleSweepWMSEObserver(_ScaleSweepMixin, IMatrixMSEObserver):
    """NVFP4 block scales with the least importance-weighted squared error (sweep-wmse); the
    importance is llm-compressor's imatrix E[x^2] per input channel (IMatrixMSEObserver's
    hook). Without importance data it raises (observer_kwargs strict=False: falls back, with
    llm-compressor's warning, to the unweighted sweep-mse)."""

    _method = "sweep-wmse"
    _stats_attrs = ["min_vals", "max_vals", "_ss_weight", "_imatrix_sum", "_imatrix_count"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.strict = self.args.observer_kwargs.get("strict", True)
        self._check_weight_observer("scalesweep_wmse")

    def update_statistics_from_observed(self, observed: torch.Tensor) -> None:
        self._observe(observed)
        try:
            imp = self._get_validated_importance(observed)
        except (ValueError, NotImplementedError) as e:  # strict (the default)
            raise ValueError(
                f"scalesweep_wmse: no importance for this Linear ({e}). The imatrix E[x^2] is "
                "accumulated while calibration data runs through the model: give oneshot a "
                "dataset, and with QuantizationModifier also requires_calibration_data=True "
                "(observer_kwargs strict=False falls back to sweep-mse)") from e
        self._ss_importance = None if imp is None else imp.detach().to(
            device="cpu", dtype=torch.float32).contiguous().numpy()

    def _importance(self) -> np.ndarray | None:
        return getattr(self, "_ss_importance", None)

    def get_qparams(self) -> QParamsDict:
        if self._importance() is None:  # strict=False and no importance: unweighted
            self._method = "sweep-mse"
        return super().get_qparams()
