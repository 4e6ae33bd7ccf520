"""Calibration statistics in PyTorch: what `scalesweep calibrate` writes, computed with hooks on
a transformers Llama / Qwen2 / Qwen3 model on whatever device it is (GPU included).

The definitions are the native ones (include/scalesweep/model/calib.h, src/model/calib.cc):
per decoder layer l and for each of the four Linear inputs (attn_in = input of q/k/v,
attn_out = input of o_proj, mlp_in = input of gate/up, mlp_out = input of down_proj), over
every row (token) of every calibration sequence, BOS included when the sequence starts with it:

    xtx    = sum over rows of x x^T            float64 [dim, dim]
    tokens = number of rows                    int
    amax   = max |x|                           float32

and for the query, key and value states as they enter the attention (after bias, q/k norm
and RoPE), flattened per token to [heads * head_dim] channels (channel h * head_dim + d):

    amax   = max |.|,   sqnorm = per-channel sum of squares (float64)

Sampling: `scalesweep calibrate --nsamples N --seqlen S --seed X` runs N windows of the text's
token ids (model::calibration_sequences: BOS, when the tokenizer adds one, then S - 1 text
tokens starting at a splitmix64-drawn offset). calibration_windows() reproduces that choice
exactly from the same token ids, so calibrate(model, calibration_windows(ids, N, S, X, bos))
computes the statistics of the CLI's own sequences.
"""
import numpy as np
import torch

from ._arch import INPUTS, Arch
from .stats import WINDOWS, Stats, save_stats

_MASK = (1 << 64) - 1


def _splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & _MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return state, z ^ (z >> 31)


def calibration_windows(tokens, nsamples, seqlen, seed=0, bos=None, windows="random"):
    """The sequences `scalesweep calibrate --nsamples nsamples --seqlen seqlen --seed seed`
    runs over a text whose token ids (no BOS, no EOS) are `tokens`: a list of nsamples
    LongTensors [1, seqlen]. bos: the BOS id when the tokenizer adds one (the sequence is BOS
    then seqlen - 1 text tokens), None when it adds none (seqlen text tokens). The offsets are
    drawn as model::calibration_sequences draws them (splitmix64 seeded by `seed`, start =
    draw % number of valid starts), so the same ids give the same windows as the CLI.
    windows="spread" (`--calib-windows spread`): start i = i * max(1, (n - body) //
    max(1, nsamples - 1)), no seed (n text tokens, body text tokens per window).

    The CLI's ids: `scalesweep tokenize MODEL --file TEXT --json` ("ids"); its BOS policy is the
    tokenizer's (GGUF tokenizer.ggml.add_bos_token, tokenizer.json's post-processor). The CLI
    caps seqlen at the model's max_seq_len; do the same before calling this."""
    tokens = [int(t) for t in (tokens.tolist() if hasattr(tokens, "tolist") else tokens)]
    nsamples, seqlen, seed = int(nsamples), int(seqlen), int(seed)
    if nsamples <= 0:
        raise ValueError("calibration_windows: nsamples must be positive")
    if seqlen < 2:
        raise ValueError("calibration_windows: seqlen must be at least 2")
    if not 0 <= seed <= _MASK:
        raise ValueError(f"calibration_windows: seed {seed} is not a 64-bit unsigned integer")
    if windows not in WINDOWS:
        raise ValueError(f"calibration_windows: windows '{windows}' "
                         f"(accepted: {', '.join(WINDOWS)})")
    body = seqlen - 1 if bos is not None else seqlen
    n = len(tokens)
    if n < body:
        raise ValueError(f"calibration_windows: the text has {n} tokens, fewer than "
                         f"{'seqlen - 1' if bos is not None else 'seqlen'} = {body}")
    if windows == "spread" and n < body + nsamples - 1:
        raise ValueError(f"calibration_windows: the text has {n} tokens, fewer than the "
                         f"{body + nsamples - 1} that {nsamples} spread windows need")
    starts = n - body + 1
    step = max(1, (n - body) // max(1, nsamples - 1))
    state, out = seed, []
    for i in range(nsamples):
        if windows == "spread":
            s = i * step
        else:
            state, r = _splitmix64(state)
            s = r % starts
        seq = ([int(bos)] if bos is not None else []) + tokens[s:s + body]
        out.append(torch.tensor([seq], dtype=torch.long))
    return out


def _rows(batch, device):
    """A batch as a LongTensor [B, T] on `device`."""
    if not torch.is_tensor(batch) and hasattr(batch, "keys") and "input_ids" in batch:
        batch = batch["input_ids"]  # a dict / transformers BatchEncoding
    t = torch.as_tensor(batch)
    if t.dim() == 1:
        t = t.unsqueeze(0)
    if t.dim() != 2 or t.dtype.is_floating_point or t.dtype == torch.bool:
        raise ValueError(f"calibrate: a batch must be token ids [1, T] (or [T], [B, T]); got "
                         f"{tuple(t.shape)} of {t.dtype}")
    return t.to(device=device, dtype=torch.long)


def _amax(rows, sdev):
    """max |rows| as a float32 scalar on sdev; NaN when any element is NaN (torch's max
    propagates NaN), inf when any is infinite: the running amax doubles as the finiteness check
    (one host sync per sequence, not per hook)."""
    return rows.abs().max().to(device=sdev, dtype=torch.float32)


class _Acc:
    """The running statistics of one layer, float64 on `device`."""

    def __init__(self, dims, device, xtx):
        f64 = dict(dtype=torch.float64, device=device)
        self.inputs = {}
        for nm in INPUTS:
            d = dims[nm]
            self.inputs[nm] = {"xtx": torch.zeros(d, d, **f64) if xtx else None,
                               "diag": None if xtx else torch.zeros(d, **f64),
                               "amax": torch.zeros((), dtype=torch.float32, device=device),
                               "tokens": 0}
        self.states = {nm: {"sqnorm": torch.zeros(dims[nm], **f64),
                            "amax": torch.zeros((), dtype=torch.float32, device=device)}
                       for nm in ("q", "k", "v")}


def _check_finite(accs, first, count):
    """A NaN or infinite activation would poison the statistics (the native calibration refuses
    it too): raises naming the first layer and input (in forward order) where one appeared."""
    amaxes = []
    for li, acc in enumerate(accs):
        amaxes += [(li, f"input {nm}", acc.inputs[nm]["amax"]) for nm in INPUTS[:1]]
        amaxes += [(li, nm, acc.states[nm]["amax"]) for nm in ("q", "k", "v")]
        amaxes += [(li, f"input {nm}", acc.inputs[nm]["amax"]) for nm in INPUTS[1:]]
    flags = torch.stack([torch.isfinite(a) for _, _, a in amaxes]).cpu()
    if bool(flags.all()):
        return
    li, what, a = amaxes[int((~flags).nonzero()[0])]
    seqs = f"sequence {first}" if count == 1 else f"sequences {first}..{first + count - 1}"
    raise ValueError(f"calibrate: layer {li} {what}: a {'NaN' if bool(a.isnan()) else 'infinite'}"
                     f" activation in {seqs}; the forward pass overflowed (weights or inputs out "
                     "of range)")


def calibrate(model, batches, output=None, nsamples=None, seqlen=None, seed=0, xtx=True,
              stats_device=None, windows="random"):
    """The calibration statistics of `model` (a transformers Llama, Qwen2 or Qwen3 causal LM,
    on any device and dtype) over `batches`, with the definitions of `scalesweep calibrate`
    (see the module doc). Returns a Stats (the class load_stats returns, usable as
    simulate(..., stats=...)); with xtx=True each input record also holds "xtx" (numpy float64
    [dim, dim]). output: a path to write the native statistics file to (save_stats, atomic);
    `scalesweep ppl/quantize/experiment --stats` and load_stats read it.

    batches: an iterable of token-id sequences, each a LongTensor [1, T] (or [T], a list of
    ints, [B, T] for B sequences of one length, or a dict with "input_ids"); every row of every
    sequence is counted, there is no padding or attention mask. Include the BOS yourself where
    the model's tokenizer adds one (calibration_windows does, as the CLI does).
    nsamples: use the first nsamples sequences (ValueError when there are fewer); None: all.
    seqlen: None: recorded as the sequences' length (the longest when they differ); an int:
    every sequence must have that length. seed: recorded in the file (the seed that picked
    the windows, as the CLI records its --seed); it draws nothing here. windows: recorded
    likewise ("random" or "spread", as calibration_windows placed them).
    xtx: False keeps only the diagonal of each ΣxxT (what simulate() reads; memory O(dim)
    instead of O(dim²)); such statistics cannot be written to a file (the format carries the
    full ΣxxT, which GPTQ reads), so output must then be None.
    stats_device: where the float64 accumulators live (default: the device of the model's
    first parameter). With xtx=True they take 8 * (2 * hidden² + (heads*head_dim)² +
    intermediate²) bytes per layer, all layers at once (they accumulate during the forward);
    pass "cpu" when that does not fit beside the model.

    The model runs without gradients, in eval mode (restored after), with use_cache=False;
    hooks are removed and the attention implementation restored on return or error. Run it on
    the full-precision model (not under simulate(): the statistics would see quantized values).
    Raises ValueError for an architecture other than llama / qwen2 / qwen3 (naming it), for
    malformed batches and for a NaN or infinite activation (naming layer, input and element).
    """
    arch = Arch(model)
    if output is not None and not xtx:
        raise ValueError("calibrate: output= needs xtx=True (the statistics file carries the "
                         "full ΣxxT, which GPTQ reads); with xtx=False use the returned Stats")
    if nsamples is not None and int(nsamples) <= 0:
        raise ValueError("calibrate: nsamples must be positive")
    if seqlen is not None and int(seqlen) < 2:
        raise ValueError("calibrate: seqlen must be at least 2")
    first = next(iter(model.parameters()))
    device = first.device
    sdev = torch.device(stats_device) if stats_device is not None else device
    dims = arch.dims()
    accs = [_Acc(dims, sdev, xtx) for _ in range(arch.n_layers)]
    undo = []

    def on_input(li, nm, x):
        a = accs[li].inputs[nm]
        rows = x.detach().reshape(-1, x.shape[-1])
        a["amax"] = torch.maximum(a["amax"], _amax(rows, sdev))
        r64 = rows.to(device=sdev, dtype=torch.float64)
        if xtx:
            a["xtx"].addmm_(r64.T, r64)
        else:
            a["diag"] += r64.square().sum(0)
        a["tokens"] += rows.shape[0]

    def on_state(li, nm, x):  # [batch, heads, seq, head_dim]
        b, h, s, d = x.shape
        rows = x.detach().transpose(1, 2).reshape(b * s, h * d)
        st = accs[li].states[nm]
        st["amax"] = torch.maximum(st["amax"], _amax(rows, sdev))
        st["sqnorm"] += rows.to(device=sdev, dtype=torch.float64).square().sum(0)

    def on_attention(li, q, k, v):
        on_state(li, "q", q)
        on_state(li, "k", k)
        on_state(li, "v", v)
        return q, k, v

    was_training = model.training
    n_seq, lengths = 0, []
    try:
        for li in range(arch.n_layers):
            for nm in INPUTS:
                _, lin = arch.linears(li, nm)[0]  # q/k/v (gate/up) read one input: hook one

                def pre(module, args, kwargs, li=li, nm=nm):
                    on_input(li, nm, args[0] if args else kwargs["input"])

                undo.append(lin.register_forward_pre_hook(pre, with_kwargs=True).remove)
        undo.append(arch.hook_attention(on_attention))
        model.eval()
        inner = model.model
        with torch.no_grad():
            for batch in batches:
                if nsamples is not None and n_seq >= int(nsamples):
                    break
                ids = _rows(batch, device)
                if nsamples is not None and n_seq + ids.shape[0] > int(nsamples):
                    ids = ids[:int(nsamples) - n_seq]
                T = ids.shape[1]
                if T < 1:
                    raise ValueError("calibrate: an empty sequence")
                if seqlen is not None and T != int(seqlen):
                    raise ValueError(f"calibrate: sequence {n_seq} has {T} tokens, seqlen is "
                                     f"{int(seqlen)}")
                inner(input_ids=ids, use_cache=False)
                _check_finite(accs, n_seq, ids.shape[0])
                n_seq += ids.shape[0]
                lengths.append(T)
    finally:
        while undo:
            undo.pop()()
        model.train(was_training)
    if n_seq == 0:
        raise ValueError("calibrate: no calibration sequences (batches is empty)")
    if nsamples is not None and n_seq < int(nsamples):
        raise ValueError(f"calibrate: nsamples {int(nsamples)}, but batches gave {n_seq} "
                         "sequences")

    layers = []
    for acc in accs:
        L = {}
        for nm in INPUTS:
            a = acc.inputs[nm]
            rec = {"tokens": int(a["tokens"]), "amax": float(a["amax"])}
            if xtx:
                m = a["xtx"]
                m = (torch.triu(m) + torch.triu(m, 1).T).cpu().numpy()  # exactly symmetric
                rec["xtx"] = m
                rec["diag"] = np.array(np.diagonal(m), dtype=np.float64)
            else:
                rec["diag"] = a["diag"].cpu().numpy()
            L[nm] = rec
        for nm in ("q", "k", "v"):
            st = acc.states[nm]
            L[nm] = {"amax": float(st["amax"]), "sqnorm": st["sqnorm"].cpu().numpy()}
        layers.append(L)
    del accs
    rec_seqlen = int(seqlen) if seqlen is not None else max(lengths)
    stats = Stats(layers, n_seq, rec_seqlen, int(seed), None)
    if output is not None:
        save_stats(output, layers, n_seq, rec_seqlen, int(seed), windows)
        stats.path = str(output)
    return stats
