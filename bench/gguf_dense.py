"""A GGUF as transformers dequantizes it, in a plain fp32 model (no quantization config left):
the reference side of bench/lmeval_compare.py and python/tests/test_smollm2_transformers.py.
torch and transformers are imported by the function (the callers may run without them)."""
import os


def dense_from_gguf(gguf, make=None):
    """(tokenizer, model): the GGUF's tokenizer, and its weights dequantized by transformers in
    a fresh fp32 model made by make(config) (default: AutoModelForCausalLM.from_config), in
    eval mode."""
    import torch
    import transformers
    d, f = os.path.split(os.path.abspath(gguf))
    tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=f)
    m = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    cfg = m.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config  # the weights are dequantized fp32 now
    make = make or transformers.AutoModelForCausalLM.from_config
    plain = make(cfg).to(torch.float32).eval()
    plain.load_state_dict(m.state_dict())
    return tok, plain
