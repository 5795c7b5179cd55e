"""GPU checks without Ray: CUDA IPC through loomrl.transport between two processes, and the HF
engine's generate / offload / onload on a CUDA device. Skipped where torch sees no GPU."""

from __future__ import annotations

import multiprocessing as mp

import pytest

pytestmark = pytest.mark.gpu


def _payload():
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    return {
        "w": torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16, generator=g),
        "b": torch.arange(1000, device="cuda", dtype=torch.int64),
        "host": torch.ones(3),
        "meta": {"step": 7},
    }


def _digest(x) -> list:
    import torch

    return (
        [
            float(x["w"].float().sum().item()),
            int(x["b"].sum().item()),
            float(x["host"].sum().item()),
            x["meta"]["step"],
            str(x["w"].dtype),
            x["w"].is_cuda,
        ]
        if isinstance(x["w"], torch.Tensor)
        else []
    )


def _consumer(packed, q) -> None:
    from loomrl.transport import import_buffers, unflatten

    skeleton, exported = packed
    q.put(_digest(unflatten(skeleton, import_buffers(exported))))


def test_cuda_ipc_roundtrip_between_processes():
    import torch

    from loomrl.transport import as_host_array, export_buffers, flatten

    x = _payload()
    skeleton, buffers = flatten(x, keep_device=True)
    dev = tuple(i for i, b in enumerate(buffers) if isinstance(b, torch.Tensor) and b.is_cuda)
    assert len(dev) == 2
    # Host buffers travel as arrays (PickleBuffer needs pickle protocol 5), as the Channel does.
    exported = export_buffers(
        [b if i in dev else as_host_array(b) for i, b in enumerate(buffers)], dev
    )
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_consumer, args=((skeleton, exported), q))
    p.start()
    got = q.get(timeout=120)
    p.join(timeout=60)
    assert p.exitcode == 0
    assert got == _digest(x)


def test_hf_engine_generate_offload_onload_on_cuda(tmp_path):
    import torch

    from loomrl.engines.hf import EngineConfig, HFEngine
    from loomrl.models import tiny_model

    d = tiny_model(tmp_path / "m", hidden=64, layers=2)
    eng = HFEngine(EngineConfig(model=str(d), trainable=True))
    assert eng.device.type == "cuda"
    out1 = eng.generate([[5, 6, 7], [8, 9]], max_new_tokens=8, temperature=1.0, seed=3)
    sha = eng.param_sha256()
    used = torch.cuda.memory_allocated()
    eng.offload()
    assert torch.cuda.memory_allocated() < used
    eng.onload()
    assert eng.param_sha256() == sha
    out2 = eng.generate([[5, 6, 7], [8, 9]], max_new_tokens=8, temperature=1.0, seed=3)
    assert out1.response_ids == out2.response_ids
