"""The transformers architectures scalesweep.torch knows, and where their tensors are.

One adapter for simulate() and calibrate(): the decoder layers, the Linear projections grouped
by the input they read (the four inputs of the native runtime: attn_in = q/k/v, attn_out = o,
mlp_in = gate/up, mlp_out = down), the attention dimensions, and a hook on the attention
function that sees the query, key and value states after RoPE (and q/k norm), as the native
runtime quantizes and observes them.
"""
import itertools
import sys

SUPPORTED = ("llama", "qwen2", "qwen3")
INPUTS = ("attn_in", "attn_out", "mlp_in", "mlp_out")
GROUPS = {  # input -> (module path under the decoder layer, ...)
    "attn_in": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "attn_out": ("self_attn.o_proj",),
    "mlp_in": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp_out": ("mlp.down_proj",),
}
_names = itertools.count()


def _get(mod, path):
    for p in path.split("."):
        mod = getattr(mod, p)
    return mod


class Arch:
    """The decoder of a transformers causal LM of a supported architecture."""

    def __init__(self, model):
        cfg = getattr(model, "config", None)
        mt = getattr(cfg, "model_type", None)
        if mt in ("qwen3_moe", "mixtral"):
            raise ValueError(
                f"scalesweep.torch: {type(model).__name__}: mixture-of-experts models are not yet "
                "supported by scalesweep.torch (simulate, calibrate)")
        if mt not in SUPPORTED:
            raise ValueError(
                f"scalesweep.torch: {type(model).__name__} (model_type {mt!r}) is not a supported "
                f"architecture; supported: {', '.join(SUPPORTED)}")
        inner = getattr(model, "model", None)
        layers = getattr(inner, "layers", None)
        if layers is None:
            raise ValueError(f"scalesweep.torch: {type(model).__name__} has no model.layers")
        self.model = model
        self.config = cfg
        self.layers = list(layers)
        self.n_layers = len(self.layers)
        self.hidden = cfg.hidden_size
        self.n_heads = cfg.num_attention_heads
        self.n_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or self.hidden // self.n_heads
        self.intermediate = cfg.intermediate_size
        for li, layer in enumerate(self.layers):
            for paths in GROUPS.values():
                for p in paths:
                    try:
                        lin = _get(layer, p)
                    except AttributeError:
                        raise ValueError(f"scalesweep.torch: layer {li} of {type(model).__name__} "
                                         f"has no {p}") from None
                    if not hasattr(lin, "weight") or lin.weight.dim() != 2:
                        raise ValueError(f"scalesweep.torch: model.layers.{li}.{p} is not a "
                                         f"Linear with a 2-D weight ({type(lin).__name__})")

    def dims(self):
        """Input dimension of each input, and the q / kv state widths."""
        return {"attn_in": self.hidden, "attn_out": self.n_heads * self.head_dim,
                "mlp_in": self.hidden, "mlp_out": self.intermediate,
                "q": self.n_heads * self.head_dim, "k": self.n_kv_heads * self.head_dim,
                "v": self.n_kv_heads * self.head_dim}

    def linears(self, layer, which):
        """[(name, nn.Linear)] reading input `which` of decoder layer `layer`."""
        lay = self.layers[layer]
        return [(f"model.layers.{layer}.{p}", _get(lay, p)) for p in GROUPS[which]]

    def hook_attention(self, fn):
        """Runs fn(layer_idx, query, key, value) -> (query, key, value) on the states that enter
        the attention of every layer ([batch, heads, seq, head_dim], after RoPE), then the
        model's own attention implementation. Returns a callable that restores it."""
        from transformers import AttentionInterface
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        model = self.model
        base_name = model.config._attn_implementation
        if base_name in ALL_ATTENTION_FUNCTIONS:
            base = ALL_ATTENTION_FUNCTIONS[base_name]
        else:  # "eager": the architecture module's own function
            mod = sys.modules[type(self.layers[0].self_attn).__module__]
            base = getattr(mod, "eager_attention_forward", None)
            if base is None:
                raise ValueError(f"scalesweep.torch: attention implementation {base_name!r} of "
                                 f"{type(model).__name__} cannot be wrapped")

        def wrapped(module, query, key, value, attention_mask, **kwargs):
            query, key, value = fn(module.layer_idx, query, key, value)
            return base(module, query, key, value, attention_mask, **kwargs)

        name = f"scalesweep_{next(_names)}"
        AttentionInterface.register(name, wrapped)
        model.set_attn_implementation(name)

        def restore():
            model.set_attn_implementation(base_name)
        return restore
