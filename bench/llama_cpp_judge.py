"""llama.cpp (through llama-cpp-python, scripts/get-llama-cpp.sh) as the judge of a GGUF file:
its own tokenization, its NLL on exactly the token windows `scalesweep ppl` scores, greedy
generation and prompt/generation speed. Used by python/tests/test_llama_cpp.py and
bench/llama_cpp_compare.py.

The NLL is computed here from llama.cpp's logits (one fresh sequence per window, every row's
logits kept, log-softmax in float64), not by llama.cpp's perplexity tool, so the windows are
ours: see `ppl_windows`.
"""
import contextlib
import ctypes
import json
import os
import subprocess
import time

import numpy as np


def cpu_has_amx():
    """Whether /proc/cpuinfo lists AMX (amx_int8): Sapphire/Emerald Rapids and later."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(" amx_int8" in line for line in f if line.startswith("flags"))
    except OSError:
        return False


def import_llama_cpp():
    """llama_cpp, or None where it is not installed (callers skip visibly).

    On a CPU with AMX, every model is loaded without llama.cpp's extra CPU buffer types
    (llama_model_params.use_extra_bufts = False): scripts/get-llama-cpp.sh builds with
    -march=native, which compiles in llama.cpp's AMX matmul, and that path segfaults in
    ggml_backend_amx_mul_mat on the first decode (seen on a 2-core Xeon VM with AMX, on every
    GGUF, llama.cpp's own Q4_1 fixture included). Without them llama.cpp runs its plain CPU
    kernels, as on a machine without AMX."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return None
    low = llama_cpp.llama_cpp
    if cpu_has_amx() and not getattr(low, "_scalesweep_no_extra_bufts", False):
        default_params = low.llama_model_default_params

        def params():
            p = default_params()
            p.use_extra_bufts = False
            return p

        low.llama_model_default_params = params
        low._scalesweep_no_extra_bufts = True
    return llama_cpp


def ppl_windows(n_stream, ctx, stride=None, max_tokens=0):
    """The windows `scalesweep ppl` runs (src/model/perplexity.cc, `plan` and `perplexity`):
    the first min(n_stream, max_tokens) tokens, windows [b, min(b + ctx, N)) every `stride`
    (default ctx) tokens, each a fresh sequence; a position is scored once, in the first window
    that predicts it. Returns [(b, e, first_scored_position)]."""
    stride = stride or ctx
    if ctx < 2 or stride > ctx:
        raise ValueError(f"ppl_windows: ctx {ctx}, stride {stride}")
    n = min(n_stream, max_tokens) if max_tokens > 0 else n_stream
    if n < 2:
        raise ValueError("ppl_windows: fewer than 2 tokens")
    out, scored_to, b = [], 1, 0
    while True:
        e = min(b + ctx, n)
        out.append((b, e, max(scored_to, b + 1)))
        scored_to = e
        if e >= n:
            return out
        b += stride


@contextlib.contextmanager
def quiet_stderr():
    """llama.cpp prints its load log on fd 2 even with verbose=False for some messages."""
    fd = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(fd, 2)
        os.close(fd)


class Judge:
    """One llama.cpp model on the CPU, `threads` threads, context `n_ctx`."""

    def __init__(self, path, n_ctx=512, threads=2, logits_all=True, f32_kv=False):
        """f32_kv: keep the KV cache in F32 (llama.cpp's default is F16, which alone moves the
        NLL by ~1e-4 against an fp32 runtime)."""
        llama_cpp = import_llama_cpp()
        if llama_cpp is None:
            raise RuntimeError("llama_cpp is not installed (scripts/get-llama-cpp.sh)")
        self.path = str(path)
        with quiet_stderr():
            self.llm = llama_cpp.Llama(model_path=self.path, n_ctx=n_ctx, n_batch=n_ctx,
                                       n_ubatch=n_ctx, logits_all=logits_all, n_threads=threads,
                                       n_threads_batch=threads, n_gpu_layers=0, verbose=False,
                                       **({"type_k": 0, "type_v": 0} if f32_kv else {}))
        self.n_ctx = n_ctx
        self.n_vocab = self.llm.n_vocab()
        self.logits_all = logits_all

    def tokenize(self, text, bos=False):
        return self.llm.tokenize(text.encode("utf-8"), add_bos=bos, special=False)

    def _last_logits(self):
        llama_cpp = import_llama_cpp()
        ptr = llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                     shape=(self.n_vocab,))

    def window_logits(self, tokens):
        """Logits (len(tokens) x vocab, float32) of one fresh sequence."""
        if not self.logits_all:
            raise RuntimeError("window_logits needs logits_all=True")
        if len(tokens) > self.n_ctx:
            raise ValueError(f"window of {len(tokens)} tokens exceeds n_ctx {self.n_ctx}")
        self.llm.reset()
        self.llm.eval(list(tokens))
        return np.array(self.llm.scores[:len(tokens)], dtype=np.float32)

    def nll(self, tokens, ctx, stride=None, max_tokens=0):
        """Summed NLL and count over `scalesweep ppl`'s windows of `tokens` (the token ids ppl
        scores, BOS included where the tokenizer adds one). Returns (nll_sum, n_scored,
        windows)."""
        total, count = 0.0, 0
        wins = ppl_windows(len(tokens), ctx, stride, max_tokens)
        for b, e, first in wins:
            lg = self.window_logits(tokens[b:e]).astype(np.float64)
            rows = lg[first - 1 - b:e - 1 - b]  # row i predicts position b + i + 1
            tgt = np.asarray(tokens[first:e])
            mx = rows.max(axis=1)
            lse = np.log(np.exp(rows - mx[:, None]).sum(axis=1)) + mx
            nll = lse - rows[np.arange(len(tgt)), tgt]
            if not np.all(np.isfinite(nll)):
                raise RuntimeError(f"{self.path}: non-finite llama.cpp loss in window {b}..{e}")
            total += float(nll.sum())
            count += len(tgt)
        return total, count, len(wins)

    def greedy(self, prompt_tokens, steps, eos=None, logits=None):
        """Greedy continuation: argmax of llama.cpp's logits, one token at a time on its KV
        cache; stops after `steps` tokens or at `eos`. Appends each step's logits to the list
        `logits` where one is given."""
        self.llm.reset()
        self.llm.eval(list(prompt_tokens))
        out = []
        for _ in range(steps):
            lg = self.llm.scores[self.llm.n_tokens - 1] if self.logits_all else self._last_logits()
            if logits is not None:
                logits.append(np.array(lg, dtype=np.float32))
            t = int(np.argmax(lg))
            out.append(t)
            if eos is not None and t == eos:
                break
            self.llm.eval([t])
        return out

    def speed(self, prompt_tokens, steps, repeat=1):
        """(prompt tokens/s, generation tokens/s): the best of `repeat` runs of one prefill of
        `prompt_tokens` and `steps` greedy decode steps after it (EOS ignored)."""
        best_p, best_g = 0.0, 0.0
        for _ in range(repeat):
            self.llm.reset()
            t0 = time.perf_counter()
            self.llm.eval(list(prompt_tokens))
            t1 = time.perf_counter()
            for _ in range(steps):
                lg = (self.llm.scores[self.llm.n_tokens - 1]
                      if self.logits_all else self._last_logits())
                self.llm.eval([int(np.argmax(lg))])
            t2 = time.perf_counter()
            best_p = max(best_p, len(prompt_tokens) / (t1 - t0))
            best_g = max(best_g, steps / (t2 - t1) if steps else 0.0)
        return best_p, best_g

    def close(self):
        self.llm.close()


def scalesweep_json(binary, *args, timeout=1800):
    """Runs `scalesweep ARGS --json` and returns the last stdout line parsed."""
    p = subprocess.run([str(binary), *map(str, args), "--json"], capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"scalesweep {' '.join(map(str, args))}: rc {p.returncode}\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# llama.cpp's own quantizers -------------------------------------------------------------------

def llama_model_quantize(src, dst, ftype, threads=2):
    """llama.cpp's llama_model_quantize (the library behind llama-quantize) from `src` to
    `dst` with `ftype` (a llama_cpp.LLAMA_FTYPE_*), requantizing a quantized source. Raises
    with llama.cpp's return code when it refuses."""
    llama_cpp = import_llama_cpp()
    p = llama_cpp.llama_model_quantize_default_params()
    p.nthread = threads
    p.ftype = ftype
    p.allow_requantize = True
    with quiet_stderr():
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), p)
    if rc != 0 or not os.path.exists(dst):
        raise RuntimeError(f"llama_model_quantize {src} -> {dst} (ftype {ftype}): rc {rc}")


def _ggml_quantize_chunk():
    llama_cpp = import_llama_cpp()
    lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    f = lib.ggml_quantize_chunk
    f.restype = ctypes.c_size_t
    f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                  ctypes.c_int64, ctypes.c_void_p]
    return f


def ggml_quantize(rows, qtype):
    """llama.cpp's own quantizer (ggml_quantize_chunk, no importance matrix) on a float32
    matrix; returns the row-major bytes, shaped (rows, bytes per row) as gguf-py stores them."""
    import gguf
    a = np.ascontiguousarray(rows, dtype=np.float32)
    nrows, ncols = a.shape
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if ncols % block:
        raise ValueError(f"{ncols} columns are not a multiple of {qtype.name}'s block {block}")
    out = np.zeros((nrows, ncols // block * size), dtype=np.uint8)
    n = _ggml_quantize_chunk()(int(qtype), a.ctypes.data, out.ctypes.data, 0, nrows, ncols, None)
    if n != out.nbytes:
        raise RuntimeError(f"ggml_quantize_chunk({qtype.name}) wrote {n} bytes, expected {out.nbytes}")
    return out


LINEAR_SUFFIXES = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                   "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")


def _copy_kv(r, w, skip=(), override=None):
    import gguf
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture" or f.name in skip:
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        val = override[f.name] if override and f.name in override else f.contents()
        w.add_key_value(f.name, val, vt, sub)


def _finish(w, dst, tmp):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, dst)


def with_tokenizer_of(weights_gguf, tokenizer_gguf, dst):
    """`weights_gguf` with every tokenizer.* key replaced by those of `tokenizer_gguf`.
    (llama.cpp's convert_hf_to_gguf.py on a llama2.c model converted to HF gives a `llama`
    vocabulary whose byte tokens llama.cpp tokenizes differently from tokenizer.bin; the
    tokenizer our writer translates from tokenizer.bin tokenizes as the .bin does.)"""
    import gguf
    r, t = gguf.GGUFReader(weights_gguf), gguf.GGUFReader(tokenizer_gguf)
    tmp = str(dst) + ".tmp"
    w = gguf.GGUFWriter(tmp, r.fields["general.architecture"].contents())
    _copy_kv(r, w, skip={k for k in r.fields if k.startswith("tokenizer.")})
    _copy_kv(t, w, skip={k for k in t.fields if not k.startswith("tokenizer.")})
    for x in r.tensors:
        w.add_tensor(x.name, np.asarray(x.data), raw_dtype=x.tensor_type)
    _finish(w, dst, tmp)


def llama_cpp_nvfp4(src_f32, dst):
    """llama.cpp's own NVFP4 quantization of an all-F32 GGUF. This llama.cpp's
    llama_model_quantize refuses LLAMA_FTYPE_MOSTLY_NVFP4 ("invalid output file type 39": its
    llama_ftype_get_default_type has no NVFP4 case), so the tensors are quantized by the same
    library's ggml_quantize_chunk(GGML_TYPE_NVFP4) (quantize_row_nvfp4_ref: per 16 elements the
    UE4M3 scale of amax/6, no per-tensor scale, so no `.scale` tensors) and the file is
    assembled with gguf-py. The type choice is llama-quant's for a 64-element-block ftype:
    every block Linear whose row length is a multiple of 64 -> NVFP4 (others F16, as our writer
    stores them; llama-quant has no fallback type for NVFP4 and would stop), the (tied) token embedding / output -> Q6_K,
    or Q8_0 where the row length is no multiple of 256 (llama-quant's fallback for Q6_K: SmolLM2's
    576 gives Q8_0, as in its Q4_0 and Q4_K_M files), 1-D tensors F32. Returns {tensor name: type name}."""
    import gguf
    r = gguf.GGUFReader(src_f32)
    tmp = str(dst) + ".tmp"
    w = gguf.GGUFWriter(tmp, r.fields["general.architecture"].contents())
    _copy_kv(r, w, override={"general.file_type": 39})  # LLAMA_FTYPE_MOSTLY_NVFP4
    types = {}
    for t in r.tensors:
        if t.tensor_type != gguf.GGMLQuantizationType.F32:
            raise ValueError(f"{src_f32}: tensor {t.name} is {t.tensor_type.name}, expected F32")
        shape = [int(x) for x in reversed(t.shape)]  # numpy order: rows, cols
        data = np.asarray(t.data, dtype=np.float32).reshape(shape)
        q = None
        if t.name.endswith(LINEAR_SUFFIXES) and shape[-1] % 64 == 0:
            q = gguf.GGMLQuantizationType.NVFP4
        elif t.name in ("token_embd.weight", "output.weight") and shape[-1] % 256 == 0:
            q = gguf.GGMLQuantizationType.Q6_K
        elif t.name in ("token_embd.weight", "output.weight"):
            q = gguf.GGMLQuantizationType.Q8_0
        if q is None and t.name.endswith(LINEAR_SUFFIXES):
            w.add_tensor(t.name, data.astype(np.float16))
            types[t.name] = "F16"
        elif q is None:
            w.add_tensor(t.name, data)
            types[t.name] = "F32"
        else:
            w.add_tensor(t.name, ggml_quantize(data, q), raw_dtype=q)
            types[t.name] = q.name
    _finish(w, dst, tmp)
    return types
