"""Weight-sync layout and routing: bucket planning, pack/unpack round trips, route choice."""

from __future__ import annotations

import pytest
import torch

from loomrl.transport import Path
from loomrl.weights import ALIGN, bucket_nbytes, pack, plan_buckets, route, unpack


def _specs(tensors: dict, dtype: str | None = None):
    out = []
    for n, t in tensors.items():
        dt = dtype or str(t.dtype).removeprefix("torch.")
        out.append((n, tuple(t.shape), dt, t.numel() * getattr(torch, dt).itemsize))
    return out


def test_buckets_respect_the_limit_keep_order_and_align():
    specs = [("a", (10,), "float32", 40), ("b", (100,), "float32", 400), ("c", (3,), "float32", 12)]
    buckets = plan_buckets(specs, 460)
    assert [[s.name for s in b] for b in buckets] == [["a"], ["b", "c"]]
    # "c" starts at the next 64-byte boundary after b's 400 bytes.
    assert [s.offset for s in buckets[1]] == [0, 448]
    assert bucket_nbytes(buckets[1]) == 448 + 12
    assert all(s.offset % ALIGN == 0 for b in buckets for s in b)


def test_an_oversized_tensor_gets_a_bucket_of_its_own():
    specs = [
        ("small", (1,), "float32", 4),
        ("big", (1000,), "float32", 4000),
        ("tail", (1,), "float32", 4),
    ]
    buckets = plan_buckets(specs, 100)
    assert [[s.name for s in b] for b in buckets] == [["small"], ["big"], ["tail"]]
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets(specs, 0)


@pytest.mark.parametrize("dtype", [None, "bfloat16", "float16"])
def test_pack_unpack_round_trip_with_cast(dtype):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(7, 5, generator=g),
        "b": torch.randn(5, generator=g),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "ids": torch.arange(6, dtype=torch.int64).reshape(2, 3),
    }
    cast = {
        k: (v.to(getattr(torch, dtype)) if dtype and v.is_floating_point() else v)
        for k, v in tensors.items()
    }
    specs = [
        (
            n,
            tuple(t.shape),
            str(cast[n].dtype).removeprefix("torch."),
            cast[n].numel() * cast[n].element_size(),
        )
        for n, t in tensors.items()
    ]
    got = {}
    for b in plan_buckets(specs, 64):
        flat = torch.empty(bucket_nbytes(b), dtype=torch.uint8)
        pack(tensors, b, flat)
        for name, t in unpack(flat, b):
            got[name] = t.clone()
    assert list(got) == list(tensors)
    for n, t in cast.items():
        assert got[n].dtype == t.dtype and got[n].shape == t.shape
        assert torch.equal(got[n], t), n


def _ep(node="n1", pid=1, gpu=None, location="cpu"):
    return {"node": node, "pid": pid, "gpu": gpu, "location": location}


def test_routes_follow_where_processes_and_weights_are():
    host = _ep(location="cpu")
    on_gpu = _ep(gpu="GPU-a", location="cuda")
    assert route(host, _ep(pid=2)) is Path.SHARED_MEMORY
    assert route(host, _ep(node="n2", pid=2)) is Path.GLOO
    assert route(on_gpu, _ep(pid=2, gpu="GPU-a")) is Path.CUDA_IPC
    assert route(on_gpu, _ep(pid=2, gpu="GPU-b")) is Path.NCCL
    assert route(on_gpu, _ep(node="n2", pid=2, gpu="GPU-a")) is Path.NCCL
    # Trainer offloaded to host between phases: its weights are host data, whatever the GPUs.
    offloaded = _ep(gpu="GPU-a", location="cpu")
    assert route(offloaded, _ep(pid=2, gpu="GPU-a")) is Path.SHARED_MEMORY
    # A receiver without a GPU gets GPU weights staged through host memory.
    assert route(on_gpu, _ep(pid=2)) is Path.SHARED_MEMORY
    assert route(host, _ep(pid=2), force="gloo") is Path.GLOO
    assert route(on_gpu, _ep(pid=2, gpu="GPU-b"), force="shared_memory") is Path.SHARED_MEMORY
    with pytest.raises(ValueError, match="path='ipc'"):
        route(host, _ep(pid=2), force="ipc")
    # Forced routes that cannot work between the two are refused with the reason.
    bad = [
        (host, _ep(node="n2", pid=2), "shared_memory", "another node"),
        (offloaded, _ep(pid=2, gpu="GPU-a"), "cuda_ipc", "not on a GPU now"),
        (on_gpu, _ep(pid=2, gpu="GPU-b"), "cuda_ipc", "not on the trainer's GPU"),
        (on_gpu, _ep(pid=2), "nccl", "has no GPU"),
    ]
    for src, dst, force, why in bad:
        with pytest.raises(ValueError, match=why):
            route(src, dst, force=force)


def test_run_config_checks_weight_sync_and_offload_settings():
    from loomrl.run import RunConfig

    p = RunConfig(weight_path="ipc", weight_bucket_mb=0, offload="sometimes").validate()
    assert "offload: 'sometimes' is not one of 'auto', 'always', 'never'" in p
    assert (
        "weight_path: 'ipc' is not one of ['auto', 'shared_memory', 'cuda_ipc', 'nccl', 'gloo']"
        in p
    )
    assert "weight_bucket_mb: must be > 0, got 0" in p
    assert RunConfig().validate() == []


def test_any_positive_bucket_size_lays_the_weights_out():
    """A run's weight_bucket_mb passes validation for any size > 0: one under a byte gives each
    tensor its own bucket, one larger than the model (or infinite) puts them all in one."""
    from loomrl.weights import WeightSync, _layout

    params = {"a": torch.ones(3), "b": torch.ones(2, 2), "c": torch.ones(1)}
    tiny = _layout(params, None, 1e-9)
    assert [[s.name for s in b] for b in tiny] == [["a"], ["b"], ["c"]]
    for huge in (1e6, float("inf")):
        assert [[s.name for s in b] for b in _layout(params, "bfloat16", huge)] == [["a", "b", "c"]]
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="bucket_mb=.*must be positive"):
            WeightSync(None, bucket_mb=bad)


def test_gpu_routes_are_refused_on_a_cluster_without_cuda():
    from loomrl.weights import cluster_problem

    for path in ("nccl", "cuda_ipc"):
        said = cluster_problem(path, has_cuda=False)
        assert said is not None and said.startswith(f"run.weight_path: {path!r} moves weights")
        assert "set run.weight_path=auto" in said
        assert cluster_problem(path, has_cuda=True) is None
    for path in ("auto", "shared_memory", "gloo"):
        assert cluster_problem(path, has_cuda=False) is None
