"""lm-eval's model `scalesweep` (python/scalesweep/lm_eval.py: HFLM + scalesweep.torch.simulate).

A tiny random Llama (2 layers, hidden 64, 4 query / 2 KV heads, a 300-token byte-level BPE
tokenizer trained here on a few sentences; norms randomized) is built offline and saved; a
statistics file is written by scalesweep.torch.stats.save_stats. Checks: the registry gives our
class; quant=WA loglikelihoods through the lm-eval model API differ from quant=none and equal
those of transformers + simulate() on the same tokens; lm-eval's own command line run through
`python -m scalesweep.lm_eval` on a local two-document task gives the same numbers. Skips visibly
without lm-eval, torch, transformers or tokenizers.
"""
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not installed")
transformers = pytest.importorskip("transformers", reason="transformers not installed")
tokenizers = pytest.importorskip("tokenizers", reason="tokenizers not installed")
pytest.importorskip("lm_eval", reason="lm-evaluation-harness (lm_eval) not installed")
pytest.importorskip("safetensors", reason="safetensors not installed")

TEXT = ("The quick brown fox jumps over the lazy dog. A cat sat on the mat and looked at the "
        "bird. Water boils at one hundred degrees. The sun rises in the east and sets in the "
        "west. Plants need light, water and air to grow. ") * 4
REQUESTS = [("The sun rises in the", " east"), ("The sun rises in the", " west"),
            ("Water boils at", " one hundred degrees."), ("A cat sat on the", " mat")]
METHOD = "sweep-wmse"


def _tokenizer(out):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT], trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>",
                                                eos_token="</s>")
    fast.save_pretrained(out)
    return fast


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("lmeval_scalesweep")
    model_dir = d / "model"
    tok = _tokenizer(model_dir)
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.float32).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.2 * torch.randn_like(p))
    model.save_pretrained(model_dir, safe_serialization=True)

    from scalesweep.torch.stats import save_stats
    rng = np.random.default_rng(0)
    dims = {"attn_in": 64, "attn_out": 64, "mlp_in": 64, "mlp_out": 128}
    layers = []
    for _ in range(cfg.num_hidden_layers):
        L = {}
        for nm, n in dims.items():
            a = rng.standard_normal((32, n))
            L[nm] = {"xtx": a.T @ a, "tokens": 32, "amax": 2.5}
        for nm, n in (("q", 64), ("k", 32), ("v", 32)):
            L[nm] = {"amax": 3.0, "sqnorm": rng.uniform(0.5, 2.0, n)}
        layers.append(L)
    stats = d / "stats.safetensors"
    save_stats(stats, layers, nsamples=1, seqlen=32)
    return model_dir, stats, d


def _lm(model_dir, **kw):
    from scalesweep.lm_eval import ScalesweepLM
    return ScalesweepLM(pretrained=str(model_dir), device="cpu", dtype="float32", batch_size=1,
                        **kw)


def _lls(lm, reqs=REQUESTS):
    from lm_eval.api.instance import Instance
    out = lm.loglikelihood([Instance("loglikelihood", {}, (c, x), i)
                            for i, (c, x) in enumerate(reqs)])
    return [float(ll) for ll, _ in out]


def _direct(model, lm, reqs=REQUESTS):
    """transformers' forward on lm-eval's tokens (its _encode_pair: context and the whole text
    encoded separately), log_softmax and the sum over the continuation."""
    res = []
    for c, x in reqs:
        ctx = lm.tok_encode(c)
        whole = lm.tok_encode(c + x)
        assert whole[:len(ctx)] == ctx
        with torch.no_grad():
            logits = model(torch.tensor([whole[:-1]])).logits[0]
        lp = torch.log_softmax(logits.to(torch.float32), dim=-1)
        res.append(float(sum(lp[len(ctx) - 1 + i, t] for i, t in
                             enumerate(whole[len(ctx):]))))
    return res


def test_registry_gives_our_class():
    import scalesweep.lm_eval as m
    from lm_eval.api.registry import get_model
    assert get_model("scalesweep") is m.ScalesweepLM
    assert m.register() is m.ScalesweepLM  # idempotent
    assert get_model("scalesweep") is m.ScalesweepLM
    assert get_model("hf").__name__ == "HFLM"  # lm-eval's own models still there


def test_unknown_setting_refused_before_loading(tiny):
    with pytest.raises(ValueError, match="unknown quant"):
        _lm(tiny[0], quant="WX")
    with pytest.raises(ValueError, match="unknown method"):
        _lm(tiny[0], quant="WA", method="nope", stats=str(tiny[1]))


def test_wa_loglikelihoods_equal_transformers_plus_simulate(tiny):
    from scalesweep.torch import simulate
    model_dir, stats, _ = tiny
    lm_fp = _lm(model_dir, quant=None)
    # create_from_arg_string: the path of lm-eval's --model_args (values parsed by lm-eval)
    from scalesweep.lm_eval import ScalesweepLM
    lm_wa = ScalesweepLM.create_from_arg_string(
        f"pretrained={model_dir},quant=WA,method={METHOD},stats={stats},block=16",
        {"device": "cpu", "batch_size": 1})
    assert lm_wa.get_model_info()["scalesweep"]["quant"] == "WA"
    fp, wa = _lls(lm_fp), _lls(lm_wa)
    assert max(abs(a - b) for a, b in zip(fp, wa)) > 1e-3, (fp, wa)

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    assert _direct(model, lm_fp) == pytest.approx(fp, abs=1e-5)
    with simulate(model, "WA", METHOD, stats=stats):
        direct = _direct(model, lm_wa)
    assert direct == pytest.approx(wa, abs=1e-5), (direct, wa)


def test_cli_python_m_scalesweep_lm_eval(tiny):
    """`python -m scalesweep.lm_eval run --model scalesweep ...` (lm-eval's own CLI) on a local
    multiple-choice task reading a two-document JSONL file."""
    model_dir, stats, d = tiny
    docs = [{"q": "The sun rises in the", "choices": ["east", "west"], "gold": 0},
            {"q": "A cat sat on the", "choices": ["mat", "dog"], "gold": 0}]
    (d / "docs.jsonl").write_text("".join(json.dumps(x) + "\n" for x in docs))
    tasks = d / "tasks"
    tasks.mkdir(exist_ok=True)
    (tasks / "tiny_mc.yaml").write_text(
        "task: tiny_mc\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {d / 'docs.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{q}}\"\n"
        "doc_to_choice: \"{{choices}}\"\ndoc_to_target: gold\n"
        "metric_list:\n  - metric: acc\n")
    out = d / "out"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "scalesweep.lm_eval", "run", "--model", "scalesweep",
           "--model_args", f"pretrained={model_dir},quant=WA,method={METHOD},stats={stats}",
           "--tasks", "tiny_mc", "--include_path", str(tasks), "--device", "cpu",
           "--batch_size", "1", "--log_samples", "--output_path", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    samples = glob.glob(str(out / "*" / "samples_tiny_mc_*.jsonl"))
    assert len(samples) == 1, samples
    got = {}
    for line in open(samples[0]):
        s = json.loads(line)
        for i in range(len(s["arguments"])):
            a = s["arguments"][f"gen_args_{i}"]
            got[a["arg_0"], a["arg_1"]] = float(s["filtered_resps"][i][0])
    assert len(got) == 4
    lm_wa = _lm(model_dir, quant="WA", method=METHOD, stats=str(stats))
    want = _lls(lm_wa, list(got))
    assert list(got.values()) == pytest.approx(want, abs=1e-5)
    res = json.load(open(glob.glob(str(out / "*" / "results_*.json"))[0]))
    assert res["config"]["model"] == "scalesweep"
