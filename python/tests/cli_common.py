"""Paths and skip markers shared by the CLI tests (pytest puts this directory on sys.path, so
the test files import it as `cli_common`)."""
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

BIN = os.environ.get("SCALESWEEP_BIN")
DATA = os.environ.get("SS_SHARED_DATA_DIR",
                      os.path.join(os.path.dirname(__file__), "../../../shared/data"))
MODEL = os.path.join(DATA, "models/stories260K/stories260K.bin")
TOK = os.path.join(DATA, "models/stories260K/tok512.bin")
VAL = os.path.join(DATA, "text/tinystories_val.txt")

need_bin = pytest.mark.skipif(not BIN, reason="SCALESWEEP_BIN not set (run through ctest)")


def need_files(*paths):
    """Skips (visibly) unless every path exists."""
    missing = [p for p in paths if not os.path.exists(p)]
    return pytest.mark.skipif(bool(missing), reason=f"shared data absent ({', '.join(missing)})")


need_data = need_files(MODEL, VAL)


WIKI = Path(DATA) / "text/wikitext2_valid.txt"
need_wiki = pytest.mark.skipif(not WIKI.exists(), reason=f"shared data absent ({WIKI})")


def run_ok(*args, timeout=300):
    """Runs the CLI with `args`; asserts exit 0 and returns stdout."""
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{args}: rc {p.returncode}\n{p.stderr}"
    return p.stdout


def run_cli(*args, ok=True, timeout=600):
    """Runs the CLI with `args` and returns the completed process; with ok, asserts exit 0 (the
    message: the arguments, the status, stdout and stderr)."""
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if ok:
        assert p.returncode == 0, f"{args}: rc={p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def check_help_defaults(help_text, cmd, wanted, option_prefix=""):
    """cmd's --help text shows its defaults as the code has them: no "(default", and for each
    option (its spellings joined by ",", after the regex option_prefix on the line) "=VALUE"."""
    assert "(default" not in help_text, help_text
    for names, default in wanted.items():
        m = re.search(r"^  " + option_prefix + re.escape(names) + r" (.*)$", help_text, re.M)
        assert m, f"{cmd} --help has no {names}:\n{help_text}"
        assert re.search("=" + re.escape(default) + r"(\s|$)", m.group(1)), \
            f"{cmd} {names}: {m.group(0)!r}"


def run_json(*args, timeout=300):
    """The CLI's --json output (its last line) as an object."""
    return json.loads(run_ok(*args, "--json", timeout=timeout).strip().splitlines()[-1])


def wiki_text(chars=6000):
    """Running prose from WikiText-2 validation (past the leading blank title lines)."""
    text = WIKI.read_text(encoding="utf-8")
    start = text.index(" = ") if " = " in text[:200] else 0
    return text[start:start + chars]


def windows_nll(model, torch, ids, ctx):
    """transformers' mean NLL/token over fresh windows of `ctx` ids (as `ppl --ctx` scores
    them) and the number of predicted tokens."""
    nll_sum, count = 0.0, 0
    with torch.no_grad():
        for b in range(0, len(ids), ctx):
            w = torch.tensor([ids[b:b + ctx]])
            if w.shape[1] < 2:
                continue
            logits = model(w).logits[0].double()
            lp = torch.log_softmax(logits[:-1], dim=-1)
            nll_sum += float(-lp.gather(1, w[0, 1:, None]).sum())
            count += w.shape[1] - 1
    return nll_sum / count, count


def check_wiki_nll(model_path, hf_model, torch, our_ids, tmp_path, ctx, max_tokens, label,
                   *ppl_args, timeout=300):
    """`ppl --ctx ctx --max-tokens max_tokens` on WikiText-2 equals transformers' NLL on our
    token ids (`our_ids(text)`) over the same fresh windows within 1e-4 nats/token; returns
    (our ppl JSON, the text, the ids) for the caller's own checks."""
    text = wiki_text()
    f = tmp_path / "wiki.txt"
    f.write_text(text, encoding="utf-8")
    ours = run_json("ppl", model_path, "--text", f, "--ctx", ctx, "--max-tokens", max_tokens,
                    *ppl_args, timeout=timeout)
    ids = our_ids(text)[:max_tokens]
    theirs, count = windows_nll(hf_model, torch, ids, ctx)
    assert ours["tokens"] == count
    print(f"\n{label} fp32 NLL/token over {count} WikiText-2 tokens: "
          f"scalesweep {ours['nll_per_token']:.8f}, transformers {theirs:.8f}, "
          f"diff {ours['nll_per_token'] - theirs:+.2e}")
    assert abs(ours["nll_per_token"] - theirs) <= 1e-4
    return ours, text, ids


def check_token_ids(hf_tok, our_ids, texts):
    """Our ids (`our_ids(text)`) equal transformers' tokenizer's on `texts` and 3,000
    characters of WikiText-2 (where present), and the tokenizer adds no BOS of its own."""
    texts = list(texts) + ([wiki_text(3000)] if WIKI.exists() else [])
    for t in texts:
        want = hf_tok(t, add_special_tokens=False)["input_ids"]
        assert our_ids(t) == want, repr(t)
    assert hf_tok("Hello")["input_ids"] == hf_tok("Hello", add_special_tokens=False)["input_ids"]


def check_greedy_equal(model_path, hf_model, hf_tok, torch, prompts, steps=16, timeout=300):
    """`generate --temperature 0` gives the tokens transformers' greedy generate gives, for
    each prompt (with BOS where ours prepends it); where we stop early, at BOS/EOS, the
    reference emits that token next."""
    cfg = hf_model.config
    for p in prompts:
        ours = run_json("generate", model_path, "--prompt", p, "--temperature", 0, "-n", steps,
                        timeout=timeout)
        ids = hf_tok(p, add_special_tokens=False)["input_ids"]
        if ours["n_prompt_tokens"] == len(ids) + 1:
            ids = [cfg.bos_token_id] + ids
        assert ours["n_prompt_tokens"] == len(ids)
        with torch.no_grad():
            out = hf_model.generate(torch.tensor([ids]), max_new_tokens=steps, do_sample=False,
                                    attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                    pad_token_id=hf_tok.eos_token_id)
        theirs = out[0, len(ids):].tolist()
        got = ours["tokens"]
        assert got == theirs[:len(got)], (p, got, theirs)
        if len(got) < steps:
            assert theirs[len(got)] in (cfg.bos_token_id, cfg.eos_token_id,
                                        hf_tok.eos_token_id), (p, got, theirs)


def run_readme_section(name):
    """Runs every ```python block of README.md's <!-- section:NAME --> (the examples a reader
    copies must work as written)."""
    import re
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    m = re.search(rf"<!-- section:{name} -->(.*?)<!-- /section:{name} -->", readme, re.S)
    assert m, f"README.md has no {name} section"
    blocks = re.findall(r"```python\n(.*?)```", m.group(1), re.S)
    assert blocks, f"README {name} section has no ```python example"
    for code in blocks:
        exec(compile(code, f"README.md:{name}", "exec"), {"__name__": "readme_example"})
