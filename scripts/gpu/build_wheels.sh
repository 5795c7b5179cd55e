#!/usr/bin/env bash
# Builds out/gpu_wheels, what scripts/gpu/run_all.sh installs on the GPU machine (which has torch
# and transformers but no Ray, gymnasium or MuJoCo, and no network), from PyPI on this machine:
#   ray_slim.tar.xz  Ray 2.60 for CPython 3.12 without the parts loomrl does not use (the whole
#                    wheel, 79 MB, is over the 64 MiB a device call carries)
#   whl/             Ray's schema dependencies
#   emb/             gymnasium and MuJoCo (3.2.7, as pyproject pins) with their pure-Python needs
#   .gl/             the Debian GL loader packages MuJoCo's EGL rendering needs there (apt-get
#                    download on this Debian machine; run_all.sh unpacks them into /)
# The SmolLM2 tokenizer (tok/) is not built here: the embodied stages do not need it.
# Usage: bash scripts/gpu/build_wheels.sh   (then carry ["out/gpu_wheels", ".gl"])
set -euo pipefail
cd "$(dirname "$0")/../.."
DST=out/gpu_wheels
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
get() { # get DIR SPEC...: cp312 manylinux or pure-Python wheels, no dependency resolution
    local dir=$1; shift
    python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux_2_28_x86_64 --platform any -d "$dir" "$@"
}
mkdir -p "$DST/whl" "$DST/emb"
get "$TMP" ray==2.60.0
mkdir "$TMP/ray"
unzip -q "$TMP"/ray-2.60.0-*.whl -d "$TMP/ray"  # unzip keeps the executables' modes (gcs_server...)
(cd "$TMP/ray" && rm -rf ray/jars ray/dashboard/client/build ray/rllib ray/serve ray/tune \
    ray/train ray/data ray/llm && tar -cJf - .) > "$DST/ray_slim.tar.xz"
get "$DST/whl" jsonschema==4.26.0 referencing==0.37.0 rpds-py==0.30.0 \
    jsonschema-specifications==2025.9.1
get "$DST/emb" gymnasium==1.4.0 farama-notifications==0.0.6 mujoco==3.2.7 glfw==2.11.0 \
    PyOpenGL==3.1.10 absl-py==2.5.1 etils==1.15.0 importlib-resources==7.1.0 zipp==4.1.2 \
    cloudpickle==3.1.3
rm -rf .gl && mkdir .gl  # stale packages would be unpacked too
# (apt-get download needs the package lists: run apt-get update first on a machine without them)
(cd .gl && apt-get download -q libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
du -sh "$DST"/* .gl
