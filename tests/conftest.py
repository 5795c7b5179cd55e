"""Shared fixtures. One embedded Ray instance serves the whole test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if not os.path.exists("/dev/nvidia0"):
    # The session cluster's GPUs are logical on a machine without any: pixel env workers on
    # them would ask EGL for devices 1, 2, 3 that do not exist. Render on EGL's first device.
    # (Ray's workers inherit this environment when the session cluster starts.)
    os.environ.setdefault("MUJOCO_EGL_DEVICE_ID", "0")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cluster():
    """A loomrl Cluster on an embedded Ray with 4 logical GPUs (placement tests) on this CPU machine."""
    from loomrl import Cluster

    c = Cluster.start(num_cpus=2, num_gpus=4)
    yield c
    c.shutdown()


@pytest.fixture(scope="session")
def ray_session(cluster):
    """Plain Ray, for tests that only need Ray itself (channels, transport). Same instance as `cluster`."""
    import ray

    yield ray


@pytest.fixture(scope="session")
def tiny_grpo_temporal(cluster, tmp_path_factory):
    """The output directory of one uninterrupted temporal run of examples/tiny_grpo.yaml
    (tests/_tiny_grpo.py: seed, steps, profile): the resume tests' reference and the temporal
    side of the placement-invariance test. Made once: a run starts its worker processes anew,
    seconds each. Tests read it and write nothing there."""
    from _tiny_grpo import COMMON, CONFIG, STEPS, run_main

    out = tmp_path_factory.mktemp("tiny_grpo_temporal")
    run_main(CONFIG, ["placement=temporal", *COMMON, f"steps={STEPS}", f"output_dir={out}"])
    return out
