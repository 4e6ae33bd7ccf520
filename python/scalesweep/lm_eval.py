"""lm-evaluation-harness model `scalesweep`: lm-eval's Hugging Face model (HFLM) with simulated
NVFP4 / MXFP4 applied by scalesweep.torch.simulate() (W, WA, WAKV, WAKVQ, the definitions of
`scalesweep eval --quant`):

    python -m scalesweep.lm_eval run --model scalesweep \\
        --model_args pretrained=DIR,quant=WAKVQ,method=sweep-wmse,stats=STATS \\
        --tasks arc_easy,hellaswag --device cpu --batch_size 1

`python -m scalesweep.lm_eval ARGS` is lm-eval's own command line (lm_eval.__main__.cli_evaluate,
the `lm_eval` / `lm-eval` command) with this model registered first; every other argument,
task, batching and `accelerate launch -m scalesweep.lm_eval ...` data parallelism are lm-eval's.
The stock `lm_eval` command cannot see it: lm-eval 0.4.13 knows only the models of its own
lm_eval.models.MODEL_MAPPING (no plugin entry-point group). From Python, `import
scalesweep.lm_eval` registers it, then `lm_eval.simple_evaluate(model="scalesweep", ...)`.

model_args besides HFLM's own (pretrained, dtype, device, batch_size, ...):
    quant   none (default), W, WA, WAKV, WAKVQ
    method  block-scale selector (default sweep-mse; sweep-wmse, absmax, 4over6, ...)
    stats   statistics file of `scalesweep calibrate` / scalesweep.torch.calibrate (needed for
            A, KV, Q and weighted methods)
    block   block size (default: 16 for nvfp4, 32 for mxfp4)
    format  nvfp4 (default) or mxfp4
    threads CPU threads of the quantize-dequantize kernels (0: all cores)

The model is loaded by HFLM as usual (onto its device, dtype as given) and simulate() is applied
in place afterwards; tensors on CUDA use the CUDA kernels.
"""
from lm_eval.api.registry import model_registry, register_model
from lm_eval.models.huggingface import HFLM

NAME = "scalesweep"


class ScalesweepLM(HFLM):
    """HFLM with simulated NVFP4 / MXFP4 (see the module doc)."""

    def __init__(self, pretrained, quant=None, method="sweep-mse", stats=None, block=None,
                 format="nvfp4", threads=0, **kwargs):
        from scalesweep.torch import check_settings, simulate
        # lm-eval's argument parser turns "none" into None and digits into int
        quant = "none" if quant is None else str(quant)
        check_settings(quant, method, format)  # refused before the model is loaded
        block = None if block in (None, 0, "0") else int(block)
        super().__init__(pretrained, **kwargs)
        self.sim_config = {"quant": quant, "method": method,
                           "stats": None if stats is None else str(stats), "block": block,
                           "format": str(format)}
        self.sim_handle = simulate(self.model, quant, method=method, stats=stats, block=block,
                                   format=format, threads=int(threads or 0),
                                   keep_original=False)

    def get_model_info(self):
        info = super().get_model_info()
        info["scalesweep"] = dict(self.sim_config)
        return info


def register():
    """Registers ScalesweepLM as lm-eval's model `scalesweep` (idempotent); returns the class."""
    if model_registry.get(NAME, None) is not ScalesweepLM:
        register_model(NAME)(ScalesweepLM)
    return ScalesweepLM


def main(argv=None):
    """lm-eval's command line with the model registered: `python -m scalesweep.lm_eval ARGS`
    takes exactly the arguments of `lm_eval ARGS`."""
    import sys

    from lm_eval.__main__ import cli_evaluate
    register()
    if argv is not None:
        sys.argv = [sys.argv[0]] + list(argv)
    cli_evaluate()


if __name__ == "__main__":
    # Run as a script this file is `__main__`; the class lm-eval gets is the one of the
    # importable module scalesweep.lm_eval (a second copy would collide in the registry).
    from scalesweep.lm_eval import main as _main
    _main()
else:
    register()
