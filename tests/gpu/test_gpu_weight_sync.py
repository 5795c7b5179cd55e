"""Weight sync between worker processes on real GPUs: CUDA IPC on one GPU, NCCL across two,
and the host shared-memory route from a GPU trainer. Skipped where torch sees no GPU."""

from __future__ import annotations

import pytest

import loomrl
from loomrl import wait
from loomrl.weights import WeightSink, WeightSource, WeightSync

pytestmark = pytest.mark.gpu


class _Engine:
    def __init__(self, seed: int, dtype: str):
        import torch

        torch.manual_seed(seed)
        self.device = torch.device("cuda")
        self.net = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 1000)).to(
            self.device, getattr(torch, dtype)
        )
        self.version = 0

    def named_parameters(self):
        return self.net.named_parameters()

    def set_weights(self, named):
        import torch

        params = dict(self.net.named_parameters())
        with torch.no_grad():
            for name, t in named:
                params[name].copy_(t)


class GpuTrainer(loomrl.Worker, WeightSource):
    def __init__(self):
        super().__init__()
        self.engine = _Engine(0, "float32")

    def step(self) -> None:
        import torch

        with torch.no_grad():
            for p in self.engine.net.parameters():
                p.mul_(1.5).add_(0.25)
        self.engine.version += 1

    def digest(self) -> dict:
        import torch

        return {
            k: float(v.detach().to(torch.bfloat16).double().sum())
            for k, v in self.engine.named_parameters()
        }


class GpuUser(loomrl.Worker, WeightSink):
    def __init__(self):
        super().__init__()
        self.engine = _Engine(1, "bfloat16")

    def digest(self) -> dict:
        return {k: float(v.detach().double().sum()) for k, v in self.engine.named_parameters()}


@pytest.fixture(scope="module")
def gpu_cluster():
    c = loomrl.Cluster.start()
    yield c
    c.shutdown()


def _check(trainer, user, sync, route):
    wait(trainer.step())
    assert sync() == wait(trainer.weights_endpoint())[0]["version"]
    assert list(sync.last.routes) == [route]
    assert wait(user.digest())[0] == wait(trainer.digest())[0]


def test_cuda_ipc_on_one_gpu_and_shared_memory_from_a_gpu_trainer(gpu_cluster):
    trainer = gpu_cluster.launch(GpuTrainer, 1, devices=[0], name="gt")
    user = gpu_cluster.launch(GpuUser, 1, devices=[0], name="gu")
    try:
        _check(trainer, user, WeightSync(trainer, user, bucket_mb=1), "cuda_ipc")
        _check(trainer, user, WeightSync(trainer, user, path="shared_memory"), "shared_memory")
        _check(trainer, user, WeightSync(trainer, user, bucket_mb=1), "cuda_ipc")
    finally:
        trainer.kill()
        user.kill()


def test_nccl_between_two_gpus(gpu_cluster):
    if gpu_cluster.num_devices < 2:
        pytest.skip("needs two GPUs")
    trainer = gpu_cluster.launch(GpuTrainer, 1, devices=[0], name="gt2")
    user = gpu_cluster.launch(GpuUser, 1, devices=[1], name="gu2")
    try:
        sync = WeightSync(trainer, user, bucket_mb=1)
        _check(trainer, user, sync, "nccl")
        _check(trainer, user, sync, "nccl")  # cached pair group
    finally:
        trainer.kill()
        user.kill()
