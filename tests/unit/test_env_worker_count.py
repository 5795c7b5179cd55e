"""How many env worker processes a GPU node starts for env.cpu_cores (plain data, no GPU)."""

from __future__ import annotations

from loomrl.cluster import Cluster, Device, Node
from loomrl.cycle import host_env_workers
from loomrl.cycle_trial import host_workers
from loomrl.embodied import PPOConfig
from loomrl.envs import EnvConfig
from loomrl.recipes.embodied_ppo import Config


def _gpu_node(cores: float, gpus: int = 1) -> Cluster:
    devs = tuple(Device(index=j, node=0, local=j, kind="gpu") for j in range(gpus))
    cluster = Cluster([Node(0, "n0", "127.0.0.1", cores, float(gpus), devs)], owns_ray=False)
    cluster.__dict__["has_cuda"] = True  # real CUDA GPUs, as nvidia-smi would have counted
    return cluster


def _cfg(num_envs: int, cpu_cores: float) -> Config:
    return Config(
        env=EnvConfig("CartPole-v1", num_envs=num_envs, cpu_cores=cpu_cores),
        ppo=PPOConfig(rollout_steps=num_envs * 4, num_minibatches=4),
    )


def test_a_tiny_core_share_starts_no_more_env_processes_than_the_node_has_cores():
    cluster = _gpu_node(16.0)
    assert cluster.has_cuda
    assert host_workers(cluster, _cfg(100, 0.01)) == 10  # largest divisor of 100 within 16
    assert host_workers(cluster, _cfg(64, 0.01)) == 16
    assert host_workers(cluster, _cfg(100_000, 0.01)) == 16
    assert host_env_workers(7, 0.01, 16.0) == 7  # fewer envs than cores: one worker each


def test_whole_core_shares_keep_their_counts_and_halves_stop_at_the_cores():
    assert host_env_workers(64, 1.0, 16.0) == 16
    assert host_env_workers(64, 2.0, 16.0) == 8
    assert host_env_workers(64, 0.5, 16.0) == 16  # reserves 8 cores, one process per core
    assert host_env_workers(8, 4.0, 2.0) == 1  # nothing fits: one (check_cores says why)
