"""Trainer -> users weight sync between worker processes on CPU: shared memory and Gloo routes,
dtype casts, versions, several receiving ranks, bad routes refused."""

from __future__ import annotations

import os

import pytest

import loomrl
from loomrl import wait
from loomrl.weights import WeightSink, WeightSource, WeightSync


class _Engine:
    """The engine interface weight sync needs: named parameters, a version, set_weights."""

    def __init__(self, seed: int, dtype: str):
        import torch

        torch.manual_seed(seed)
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.Linear(48, 3)).to(
            getattr(torch, dtype)
        )
        self.device = torch.device("cpu")
        self.version = 0

    def named_parameters(self):
        return self.net.named_parameters()

    def set_weights(self, named):
        import torch

        params = dict(self.net.named_parameters())
        with torch.no_grad():
            for name, t in named:
                params[name].copy_(t)


class Trainer(loomrl.Worker, WeightSource):
    def __init__(self, seed: int = 0, dtype: str = "float32"):
        super().__init__()
        self.engine = _Engine(seed, dtype)

    def step(self) -> None:
        import torch

        with torch.no_grad():
            for p in self.engine.net.parameters():
                p.add_(0.125)
        self.engine.version += 1

    def params(self) -> dict:
        return {k: v.detach().float().clone() for k, v in self.engine.named_parameters()}


class User(loomrl.Worker, WeightSink):
    def __init__(self, seed: int = 1, dtype: str = "float32"):
        super().__init__()
        self.engine = _Engine(seed, dtype)

    def params(self) -> dict:
        return {k: v.detach().float().clone() for k, v in self.engine.named_parameters()}

    def segments(self) -> int:
        return len([n for n in os.listdir("/dev/shm") if n.startswith("loomrl_")])


def _same(a: dict, b: dict, cast=None) -> bool:
    import torch

    return all(torch.equal(cast(a[k]) if cast else a[k], b[k]) for k in a)


@pytest.fixture
def pair(cluster):
    made = []

    def make(n_users=1, user_dtype="float32"):
        t = cluster.launch(Trainer, 1, devices=[0], name="w_trainer")
        u = cluster.launch(User, n_users, 1, user_dtype, devices=[1], name="w_user")
        made.extend([t, u])
        return t, u

    yield make
    for g in made:
        g.kill()


def test_shared_memory_sync_to_every_rank_then_versions(pair):
    trainer, users = pair(n_users=2)
    sync = WeightSync(trainer, users, bucket_mb=0.004)  # several buckets
    wait(trainer.step())
    assert sync() == 1
    assert sync.last.routes == {"shared_memory": [0, 1]} and sync.last.skipped == 0
    want = wait(trainer.params())[0]
    for got in wait(users.params()):
        assert _same(want, got)
    assert [ep["version"] for ep in wait(users.weights_endpoint())] == [1, 1]
    # Already current: nothing moves.
    sync()
    assert sync.last.skipped == 2 and sync.last.routes == {}
    # The trainer reuses its segment: repeated syncs do not pile segments up.
    before = wait(users.on(0).segments())[0]
    for _ in range(3):
        wait(trainer.step())
        sync()
    assert wait(users.on(0).segments())[0] == before
    want = wait(trainer.params())[0]
    assert all(_same(want, got) for got in wait(users.params()))


def test_cast_to_the_users_dtype(pair):
    import torch

    trainer, users = pair(user_dtype="bfloat16")
    wait(trainer.step())
    WeightSync(trainer, users)()
    want = wait(trainer.params())[0]
    got = wait(users.params())[0]
    assert _same(want, got, cast=lambda t: t.to(torch.bfloat16).float())


def test_gloo_route_sends_every_bucket(pair):
    trainer, users = pair(n_users=2)
    sync = WeightSync(trainer, users, bucket_mb=0.004, path="gloo")
    for _ in range(2):  # the second sync reuses the cached pair groups
        wait(trainer.step())
        sync()
        assert sync.last.routes == {"gloo": [0, 1]}
        want = wait(trainer.params())[0]
        assert all(_same(want, got) for got in wait(users.params()))


def test_forced_routes_that_cannot_work_are_refused_before_anything_moves(pair):
    trainer, users = pair()
    wait(trainer.step())
    with pytest.raises(ValueError, match="path='cuda_ipc' cannot reach this receiver: the trainer"):
        WeightSync(trainer, users, path="cuda_ipc")()
    with pytest.raises(ValueError, match="path='nccl' cannot reach"):
        WeightSync(trainer, users, path="nccl")()
    assert [ep["version"] for ep in wait(users.weights_endpoint())] == [0]
    with pytest.raises(ValueError, match="path='fast'"):
        WeightSync(trainer, users, path="fast")


@pytest.mark.parametrize("path", ["nccl", "cuda_ipc"])
def test_a_gpu_route_on_a_cluster_without_cuda_is_refused_before_any_worker_starts(
    cluster, tmp_path, path
):
    from loomrl.errors import ConfigError
    from loomrl.run import Run, RunConfig

    if cluster.has_cuda:
        pytest.skip("this cluster has CUDA GPUs: the route may work")
    before = len(cluster._groups)
    rc = RunConfig(output_dir=str(tmp_path), weight_path=path, progress=False, tensorboard=False)
    with pytest.raises(ConfigError, match=f"run.weight_path: '{path}' moves weights between CUDA"):
        Run(None, rc)
    assert len(cluster._groups) == before and not (tmp_path / "config.yaml").exists()
    # The session's Ray is still up: Run did not own it.
    import ray

    assert ray.is_initialized()


class DyingUser(User):
    def apply_weights(self, named):
        os._exit(1)  # the receiver's process dies in the middle of a push


@pytest.mark.parametrize("path", ["shared_memory", "gloo"])
def test_a_receiver_that_dies_mid_push_is_reported_and_the_trainer_goes_on(cluster, path):
    trainer = cluster.launch(Trainer, 1, devices=[0], name="w_trainer_d")
    user = cluster.launch(DyingUser, 1, devices=[1], name="w_dying")
    try:
        wait(trainer.step())
        with pytest.raises(loomrl.WorkerDiedError, match="w_dying"):
            WeightSync(trainer, user, bucket_mb=0.004, path=path, timeout=30)()
        # The trainer is not left blocked in a send to the dead peer.
        wait(trainer.step(), timeout=30)
    finally:
        trainer.kill()
        user.kill()


class MixedUser(User):
    """A receiver that keeps one module in float32 among bfloat16 ones."""

    def __init__(self):
        super().__init__(1, "bfloat16")
        self.engine.net[1].float()

    def raw(self) -> dict:
        return {k: v.detach().clone() for k, v in self.engine.named_parameters()}


def test_each_tensor_travels_in_the_receivers_dtype_for_it(cluster):
    import torch

    trainer = cluster.launch(Trainer, 1, devices=[0], name="w_trainer_m")
    user = cluster.launch(MixedUser, 1, devices=[1], name="w_mixed")
    try:
        wait(trainer.step())
        ep = wait(user.weights_endpoint())[0]
        assert ep["dtype"] == "mixed" and ep["dtypes"]["1.weight"] == "float32"
        WeightSync(trainer, user)()
        want, got = wait(trainer.params())[0], wait(user.raw())[0]
        assert got["1.weight"].dtype == torch.float32
        assert torch.equal(got["1.weight"], want["1.weight"])  # not rounded through bf16
        assert torch.equal(got["0.weight"], want["0.weight"].to(torch.bfloat16))
    finally:
        trainer.kill()
        user.kill()
