"""What the comparisons with other quantizers (bench/llmcompressor_compare.py,
bench/modelopt_compare.py) share: their common options, the evaluation tokens, and the
transformers side's NLL over non-overlapping windows, each window scored alone (its first token
not predicted), as `scalesweep ppl` scores them. torch is imported by the functions (each script
runs in its own environment)."""
import os


def add_common_args(ap, root):
    """The model, the calibration and evaluation texts, the scalesweep binary (under root's
    build/ by default), the calibration sampling and the evaluation windows."""
    ap.add_argument("model_dir")
    ap.add_argument("--calib", required=True, help="calibration text (never the eval text)")
    ap.add_argument("--eval", required=True, help="held-out evaluation text")
    ap.add_argument("--bin", default=os.path.join(root, "build", "scalesweep"))
    ap.add_argument("--nsamples", type=int, default=32)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=16384)


def eval_ids(tok, eval_text, max_tokens):
    """The first max_tokens tokens of the text as the tokenizer encodes it (BOS first where it
    adds one; SmolLM2's adds none)."""
    with open(eval_text, encoding="utf-8") as f:
        return tok(f.read())["input_ids"][:max_tokens]


def window_losses(model, ids, ctx, end):
    """For each window ids[i:i + ctx], i in range(0, end - 1, ctx) (until a window of fewer
    than 2 tokens): (i, the summed NLL of its predicted tokens, their count), without grad."""
    import torch
    with torch.no_grad():
        for i in range(0, end - 1, ctx):
            win = ids[i:i + ctx]
            if len(win) < 2:
                break
            x = torch.tensor([win])
            logits = model(x).logits[0, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum").item()
            yield i, loss, len(win) - 1
