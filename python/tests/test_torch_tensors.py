"""torch tensors through the Python module (src/python/, python/scalesweep/).

- Every dtype (float32, float16, bfloat16) x method: a torch tensor gives the bytes of the
  numpy path on the same values (codes, scales, global scale), as torch tensors in the
  compressed-tensors layout; dequantize returns float32 torch, fake_quantize the input dtype.
- Inputs are read in place: a row-major tensor is not copied (the address the library reads is
  the tensor's data_ptr, also for float16/bfloat16); a strided one is gathered into a copy.
- QuantizedTensor.state_dict() is a compressed-tensors NVFP4 state dict: the library's own
  NVFP4 decompression reads it, giving the same FP4 values and scales as ours.
- Bad input (1-D, integer dtype, NaN, CUDA tensor in a CPU-only build) raises with a message.
- `import scalesweep` works with torch made unimportable (this test runs without torch too).

The torch tests skip visibly without torch; the compressed-tensors one without that package.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

try:
    import scalesweep as ss
except ImportError as e:  # pragma: no cover - depends on the build
    pytest.skip(f"Python module scalesweep not built or not on PYTHONPATH ({e})",
                allow_module_level=True)


def test_import_without_torch():
    """numpy in, numpy out, with every `import torch` failing: torch stays optional."""
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch blocked by the test")
        sys.meta_path.insert(0, Block())
        import numpy as np
        import scalesweep as ss
        x = np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)
        q = ss.quantize(x)
        assert isinstance(q.codes, np.ndarray) and not q.is_torch
        assert isinstance(ss.dequantize(q), np.ndarray)
        assert isinstance(ss.fake_quantize(x), np.ndarray)
        assert "torch" not in sys.modules
        sys.modules["torch"] = None   # `import torch` -> ImportError; still numpy
        assert isinstance(ss.quantize(x).codes, np.ndarray)
        print("ok", ss.__version__)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ), timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("ok ")


torch = pytest.importorskip("torch", reason="torch not installed (the torch tensor tests need "
                            "it; scripts/get-references.sh installs it)")
ml_dtypes = pytest.importorskip("ml_dtypes")

DTYPES = {"float32": (torch.float32, np.float32), "float16": (torch.float16, np.float16),
          "bfloat16": (torch.bfloat16, ml_dtypes.bfloat16)}
METHODS = ["absmax", "4over6", "sweep-mse", "sweep-wmse"]


def weights(rows=24, cols=64, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * torch.linspace(0.1, 3.0, cols)
    w[3, 5] = 40.0  # an outlier, so the global scale matters
    return w.to(dtype)


def as_numpy(t):
    """The same values as a numpy array of the matching dtype (bfloat16 via ml_dtypes)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("method", METHODS)
def test_same_bytes_as_numpy(dtype, method):
    t = weights(dtype=DTYPES[dtype][0])
    imp = torch.rand(t.shape[1], generator=torch.Generator().manual_seed(1)) + 0.1
    kw = {"importance": imp} if method == "sweep-wmse" else {}
    kwn = {"importance": imp.numpy()} if method == "sweep-wmse" else {}
    qt = ss.quantize(t, method=method, **kw)
    qn = ss.quantize(as_numpy(t), method=method, **kwn)
    assert qt.is_torch and not qn.is_torch
    assert qt.codes.dtype == torch.uint8 and qt.codes.shape == (24, 32)
    assert qt.scales.dtype == torch.float8_e4m3fn and qt.scales.shape == (24, 4)
    assert np.array_equal(qt.codes.numpy(), qn.codes)
    assert np.array_equal(qt.scales.view(torch.uint8).numpy(), qn.scales)
    assert qt.global_scale == qn.global_scale
    dq = ss.dequantize(qt)
    assert dq.dtype == torch.float32 and np.array_equal(dq.numpy(), ss.dequantize(qn))
    # fake_quantize: the input's dtype, each value the float32 result rounded by torch itself.
    ft = ss.fake_quantize(t, method=method, **kw)
    fn = ss.fake_quantize(as_numpy(t), method=method, **kwn)
    assert ft.dtype == t.dtype and ft.shape == t.shape
    assert torch.equal(ft, torch.from_numpy(fn).to(t.dtype))


def test_fake_quantize_rounding_to_half_and_bfloat16():
    """The narrowing of fake_quantize's float32 result equals torch's .to(dtype), overflow too."""
    big = torch.tensor([[65504.0] * 15 + [1.0]], dtype=torch.float16)
    for t in (weights(rows=64, cols=128, seed=3, dtype=torch.float16),
              weights(rows=64, cols=128, seed=4, dtype=torch.bfloat16), big):
        f32 = ss.fake_quantize(t.float(), method="sweep-mse", max_block_scale=448.0)
        narrow = ss.fake_quantize(t, method="sweep-mse", max_block_scale=448.0)
        # the float32 and narrow inputs hold the same values, so the results differ only by
        # the final rounding
        assert torch.equal(narrow, f32.to(t.dtype))


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_row_major_input_is_read_in_place(dtype):
    t = weights(dtype=DTYPES[dtype][0])
    v = ss._core._input_view(t)
    assert v["address"] == t.data_ptr()  # no copy, no conversion in Python (f16/bf16 too)
    assert not v["copied"] and v["torch"] and v["dtype"] == dtype and v["shape"] == (24, 64)
    # a row slice of a bigger tensor is still row-major: read in place at its offset
    s = weights(rows=48, dtype=DTYPES[dtype][0])[8:32]
    v = ss._core._input_view(s)
    assert v["address"] == s.data_ptr() and not v["copied"]


def test_non_contiguous_input_is_copied():
    base = weights(rows=64, cols=48)
    for t in (base.t(), base[:, ::2], base.t()[::2]):
        assert not t.is_contiguous()
        v = ss._core._input_view(t)
        assert v["copied"] and v["address"] != t.data_ptr()
        q, ref = ss.quantize(t), ss.quantize(t.contiguous())
        assert torch.equal(q.codes, ref.codes) and q.global_scale == ref.global_scale
        assert torch.equal(q.scales.view(torch.uint8), ref.scales.view(torch.uint8))


def test_requires_grad_and_partial_blocks():
    w = torch.nn.Parameter(weights(cols=40))  # K = 40: a partial last block, as numpy allows
    q = ss.quantize(w)
    assert q.codes.shape == (24, 20) and q.scales.shape == (24, 3)
    ref = ss.quantize(w.detach().numpy())
    assert np.array_equal(q.codes.numpy(), ref.codes)
    sd = q.state_dict("layer")
    assert sd["layer.weight_packed"].shape == (24, 20)
    assert sd["layer.weight_scale"].shape == (24, 3)


def test_state_dict_layout():
    w = weights()
    q = ss.quantize(w, scale_layout="swizzled")
    sd = q.state_dict("model.layers.0.mlp.down_proj")
    assert list(sd) == [f"model.layers.0.mlp.down_proj.{k}" for k in
                        ("weight_packed", "weight_scale", "weight_global_scale")]
    p, s, g = sd.values()
    assert p.dtype == torch.uint8 and p.shape == (24, 32)
    assert s.dtype == torch.float8_e4m3fn and s.shape == (24, 4)  # row layout, not swizzled
    assert g.dtype == torch.float32 and g.shape == (1,) and g.item() == q.global_scale
    assert torch.equal(s.view(torch.uint8), ss.quantize(w).scales.view(torch.uint8))
    # numpy input: numpy tensors, E4M3 bit patterns as uint8
    sdn = ss.quantize(w.numpy()).state_dict()
    assert sdn["weight_scale"].dtype == np.uint8 and sdn["weight_global_scale"].dtype == np.float32
    with pytest.raises(ValueError, match="nvfp4"):
        ss.quantize(w, format="mxfp4", block=32).state_dict()


def test_mxfp4_scales_dtype():
    q = ss.quantize(weights(), format="mxfp4", block=32, method="absmax")
    assert q.scales.dtype == torch.float8_e8m0fnu and q.codes.dtype == torch.uint8


def test_dequantize_arrays_from_torch():
    w = weights()
    q = ss.quantize(w)
    sd = q.state_dict()
    out = ss.dequantize(sd["weight_packed"], sd["weight_scale"], sd["weight_global_scale"], 64)
    assert out.dtype == torch.float32 and torch.equal(out, ss.dequantize(q))
    out = ss.dequantize(q.codes, q.scales.view(torch.uint8), q.global_scale, 64)
    assert torch.equal(out, ss.dequantize(q))
    with pytest.raises(TypeError, match="scales: dtype torch.float16"):
        ss.dequantize(q.codes, q.scales.to(torch.float16), q.global_scale, 64)
    with pytest.raises(TypeError, match="codes: dtype torch.int16"):
        ss.dequantize(q.codes.to(torch.int16), q.scales, q.global_scale, 64)


def test_compressed_tensors_reads_our_state_dict():
    """Our torch output is a compressed-tensors NVFP4 state dict: the library's decompression
    unpacks the same FP4 values and scales, and its weight equals our dequantize."""
    pytest.importorskip("compressed_tensors", reason="compressed-tensors not installed")
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization import preset_name_to_scheme

    from compressed_tensors.quantization.lifecycle.forward import dequantize as ct_dequantize

    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    comp = BaseCompressor.get_value_from_registry("nvfp4-pack-quantized")
    for dtype in (torch.float32, torch.bfloat16):
        w = weights(rows=32, cols=128, seed=7, dtype=dtype)
        q = ss.quantize(w, method="sweep-mse")
        sd = q.state_dict()
        # The library's reading of our tensors: FP4 values (bf16, its default), E4M3 scales
        # and the global scale, in its own unpacking code.
        vals = unpack_fp4_from_uint8(sd["weight_packed"], 32, 128, dtype=torch.float32)
        scale = sd["weight_scale"].to(torch.float32).repeat_interleave(16, dim=1)
        gs = sd["weight_global_scale"]
        codes = np.empty((32, 128), np.uint8)
        codes[:, 0::2], codes[:, 1::2] = q.codes.numpy() & 15, q.codes.numpy() >> 4
        e2m1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)
        assert np.array_equal(vals.numpy(), e2m1[codes]), dtype
        ours = ss.dequantize(q)
        assert torch.equal(ours, (vals * scale) / gs), dtype  # fl(q * s) / gs, as vLLM
        # Its decompressor (bf16 output): fl_bf16(q * fl(s / gs)), bit for bit.
        lib = comp.decompress(dict(sd), scheme)["weight"]
        assert lib.dtype == torch.bfloat16
        assert torch.equal(lib, (vals * (scale / gs)).to(torch.bfloat16)), dtype
        # Its float32 dequantize: q * fl(s / gs); equal to ours except where the order of the
        # roundings differs (q = 1.5, 3, 6), and there by one float32 ulp.
        lib32 = ct_dequantize(x_q=vals, scale=sd["weight_scale"].to(torch.float32),
                              args=scheme.weights, global_scale=gs, dtype=torch.float32)
        assert torch.equal(lib32, vals * (scale / gs)), dtype
        differ = lib32 != ours
        assert torch.all((lib32 - ours).abs() <= 2.0 ** -23 * ours.abs()), dtype
        assert set(vals.abs()[differ].tolist()) <= {1.5, 3.0, 6.0}, dtype


def test_bad_tensors():
    w = weights()
    cases = [
        (lambda: ss.quantize(w[0]), ValueError, r"expected a 2-D array \[N, K\], got shape \(64,\)"),
        (lambda: ss.quantize(w[None]), ValueError, r"got shape \(1, 24, 64\)"),
        (lambda: ss.quantize(w.to(torch.int32)), TypeError, "dtype torch.int32 is not supported"),
        (lambda: ss.quantize(w.double()), TypeError, "dtype torch.float64 is not supported"),
        (lambda: ss.quantize(w[:0]), ValueError, "empty"),
        (lambda: ss.fake_quantize(w.to(torch.uint8)), TypeError, "torch.uint8"),
        (lambda: ss.quantize(w, format="mxfp4", block=16), ValueError, "block"),
        (lambda: ss.quantize(w, method="sweep-wmse", importance=torch.ones(63)), ValueError,
         r"importance: shape \(63,\) does not match"),
        (lambda: ss.quantize(w, method="sweep-wmse", importance=torch.ones(64,
                                                                            dtype=torch.float64)),
         TypeError, "importance: dtype torch.float64"),
    ]
    nan = w.clone()
    nan[3, 17] = float("nan")
    cases.append((lambda: ss.quantize(nan, name="w"), ValueError,
                  r"tensor 'w': element \[3, 17\] is NaN"))
    cases.append((lambda: ss.fake_quantize(nan.bfloat16()), ValueError, r"\[3, 17\] is NaN"))
    for fn, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            fn()


class FakeCudaTensor:
    """A DLPack producer on a CUDA device (no GPU here): what a torch CUDA tensor reports."""

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA, device 0

    def __dlpack__(self, *args, **kwargs):  # pragma: no cover - must not be reached
        raise AssertionError("exported a CUDA tensor")


@pytest.mark.skipif(ss.CUDA, reason="this module was built with CUDA")
def test_cuda_tensor_on_cpu_only_build():
    hint = r"built without CUDA; move the tensor to the CPU \(\.cpu\(\)\)"
    for fn in (ss.quantize, ss.fake_quantize, ss.evaluate):
        with pytest.raises(ValueError, match=hint):
            fn(FakeCudaTensor())
    if torch.cuda.is_available():  # a real one, where a GPU exists
        with pytest.raises(ValueError, match=hint):
            ss.quantize(weights().cuda())


def test_readme_torch_example_runs():
    from cli_common import run_readme_section
    run_readme_section("python-torch")
