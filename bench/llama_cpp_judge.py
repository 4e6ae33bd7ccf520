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


def import_llama_cpp():
    """llama_cpp, or None where it is not installed (callers skip visibly)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return None
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

    def __init__(self, path, n_ctx=512, threads=2, logits_all=True):
        llama_cpp = import_llama_cpp()
        if llama_cpp is None:
            raise RuntimeError("llama_cpp is not installed (scripts/get-llama-cpp.sh)")
        self.path = str(path)
        with quiet_stderr():
            self.llm = llama_cpp.Llama(model_path=self.path, n_ctx=n_ctx, n_batch=n_ctx,
                                       n_ubatch=n_ctx, logits_all=logits_all, n_threads=threads,
                                       n_threads_batch=threads, n_gpu_layers=0, verbose=False)
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

    def greedy(self, prompt_tokens, steps, eos=None):
        """Greedy continuation: argmax of llama.cpp's logits, one token at a time on its KV
        cache; stops after `steps` tokens or at `eos`."""
        self.llm.reset()
        self.llm.eval(list(prompt_tokens))
        out = []
        for _ in range(steps):
            lg = self.llm.scores[self.llm.n_tokens - 1] if self.logits_all else self._last_logits()
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
