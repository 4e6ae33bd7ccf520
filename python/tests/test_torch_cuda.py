"""torch CUDA tensors through the Python module: they go to the CUDA kernels (src/kernels/cuda)
on the tensor's device and come back as CUDA tensors with the CPU path's bytes.

- Every dtype (float32, float16, bfloat16) x CUDA method, full and partial last blocks: codes,
  scales (row-major and swizzled), global scale, block losses, dequantize and fake_quantize
  equal the CPU path's on the same values; the results stay on the input's device.
- The global scale computed on the device (torch's amax) equals the CPU path's.
- Refusals with a message: non-finite input (naming the element), importance not on x's
  device, a format or method the kernels do not implement.

Skips visibly without torch, in a module built without CUDA, and where torch sees no GPU
(scripts/gpu_checks.sh runs it on a GPU machine).
"""
import pytest

try:
    import scalesweep as ss
except ImportError as e:  # pragma: no cover - depends on the build
    pytest.skip(f"Python module scalesweep not built or not on PYTHONPATH ({e})",
                allow_module_level=True)

torch = pytest.importorskip("torch", reason="torch not installed (scripts/get-references.sh)")
if not ss.CUDA:
    pytest.skip("this scalesweep module was built without CUDA", allow_module_level=True)
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
METHODS = ["absmax", "4over6", "sweep-mse", "sweep-wmse"]


def weights(rows, cols, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * torch.linspace(0.05, 4.0, cols)
    w[rows // 2, cols // 3] = 60.0  # an outlier, so the global scale matters
    w[1, :16] = 0.0  # a zero block
    return w.to(dtype)


def u8(t):
    return t.view(torch.uint8).cpu()


def host_bytes(t):
    """A tensor's values on the host, float8 as its bit patterns (torch.equal needs that)."""
    return u8(t) if t.dtype == torch.float8_e4m3fn else t.cpu()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("cols", [512, 40])  # 40: a partial last block (generic kernel)
def test_cuda_tensors_give_the_cpu_bytes(dtype, method, cols):
    x = weights(200, cols, seed=cols, dtype=dtype)
    imp = torch.rand(cols, generator=torch.Generator().manual_seed(5)) * 4.0 + 0.01
    kw_cpu = {"importance": imp} if method == "sweep-wmse" else {}
    kw_gpu = {"importance": imp.cuda()} if method == "sweep-wmse" else {}
    xg = x.cuda()
    for layout in ("row", "swizzled"):
        qc = ss.quantize(x, method=method, scale_layout=layout, losses=True, **kw_cpu)
        qg = ss.quantize(xg, method=method, scale_layout=layout, losses=True, **kw_gpu)
        assert qg.is_torch and qg.codes.device == xg.device and qg.scales.device == xg.device
        assert qg.codes.dtype == torch.uint8 and qg.scales.dtype == torch.float8_e4m3fn
        assert qg.global_scale == qc.global_scale
        assert torch.equal(qg.codes.cpu(), qc.codes)
        assert torch.equal(u8(qg.scales), u8(qc.scales)), layout
        # the contract loss is a float sum (docs/NUMERICS.md); the CPU reports it widened
        assert qg.losses.dtype == torch.float32
        assert torch.equal(qg.losses.cpu().double(), qc.losses)
    sdg, sdc = qg.state_dict("l"), qc.state_dict("l")
    assert list(sdg) == list(sdc)
    for k in sdc:
        assert sdg[k].device == xg.device and sdg[k].dtype == sdc[k].dtype, k
        assert torch.equal(host_bytes(sdg[k]), host_bytes(sdc[k])), k
    dg = ss.dequantize(qg)
    assert dg.device == xg.device and dg.dtype == torch.float32
    assert torch.equal(dg.cpu(), ss.dequantize(qc))
    fg = ss.fake_quantize(xg, method=method, **kw_gpu)
    assert fg.device == xg.device and fg.dtype == dtype and fg.shape == x.shape
    assert torch.equal(fg.cpu(), ss.fake_quantize(x, method=method, **kw_cpu))


def test_given_global_scale_and_non_contiguous_input():
    x = weights(64, 256, seed=1, dtype=torch.bfloat16)
    xg = x.cuda().t().contiguous().t()  # same values, column-major on the device
    assert not xg.is_contiguous()
    qg = ss.quantize(xg, method="sweep-mse", global_scale=3.5)
    qc = ss.quantize(x, method="sweep-mse", global_scale=3.5)
    assert qg.global_scale == 3.5
    assert torch.equal(qg.codes.cpu(), qc.codes)
    assert torch.equal(u8(qg.scales), u8(qc.scales))


def test_cuda_refusals_have_messages():
    x = weights(32, 64, seed=2, dtype=torch.float32)
    bad = x.clone()
    bad[3, 17] = float("nan")
    with pytest.raises(ValueError, match=r"\[3, 17\]"):
        ss.quantize(bad.cuda(), method="sweep-mse")
    with pytest.raises(ValueError, match="same device"):
        ss.quantize(x.cuda(), method="sweep-wmse", importance=torch.ones(64))
    with pytest.raises(ValueError, match="nvfp4 with block 16"):
        ss.quantize(x.cuda(), format="mxfp4", block=32, method="absmax")
    with pytest.raises(ValueError, match="no CUDA kernel"):
        ss.quantize(x.cuda(), method="opt-fp8-mse")
