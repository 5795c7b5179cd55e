"""Envs and rollout buffers that cannot fit the node's memory: a ConfigError naming the keys,
from the driver's estimate and from an env worker's measured build, never a hang."""

from __future__ import annotations

import pytest

from loomrl.embodied import PPOConfig
from loomrl.envs import EnvConfig, VecEnv
from loomrl.envs.memory import (
    MEMORY_FRACTION,
    estimate_env_memory,
    frame_bytes,
    memory_verdict,
    rollout_memory_problem,
)
from loomrl.errors import ConfigError
from loomrl.recipes.embodied_ppo import Config, check_memory

GiB = 2**30


class FakeMemory:
    """``available`` fixed; ``rss`` grows by ``per_env`` for every simulator made (``made``,
    counted by the ``counted`` fixture) and by 300 MB for the first (its imports)."""

    def __init__(self, available: float, per_env: float = 0.0):
        self._available, self._per_env = available, per_env
        self.made = self.rss_reads = 0

    def available(self) -> float:
        return self._available

    def rss(self) -> float:
        self.rss_reads += 1
        return 100e6 + (300e6 if self.made else 0) + self.made * self._per_env


@pytest.fixture
def counted(monkeypatch):
    """Memory figures whose resident set follows the simulators VecEnv makes."""
    made = []
    real = VecEnv._make

    def make(self):
        if self._memory is not None:
            self._memory.made += 1
        made.append(1)
        return real(self)

    monkeypatch.setattr(VecEnv, "_make", make)
    return made


def test_estimate_counts_envs_and_the_rollout_buffers():
    env = EnvConfig("CartPole-v1", num_envs=4, pixels=True, image_size=64)
    est = estimate_env_memory(env, 1e6, rollout_steps=256)
    assert est.envs_bytes == 4e6
    assert est.buffer_bytes >= 256 * frame_bytes(64)
    assert "env.image_size=64" in est.keys and "ppo.rollout_steps=256" in est.keys
    state = estimate_env_memory(EnvConfig("CartPole-v1", num_envs=4), 0, rollout_steps=256)
    normed = estimate_env_memory(
        EnvConfig("CartPole-v1", num_envs=4), 0, rollout_steps=256, obs_elems=4, normalize_obs=True
    )
    assert normed.buffer_bytes == state.buffer_bytes + 256 * 4 * 4 * 2


def test_verdict_fits_and_unknown_memory_pass():
    est = estimate_env_memory(EnvConfig("CartPole-v1", num_envs=8), 1e6, rollout_steps=2048)
    assert memory_verdict(est, 16 * GiB, what="x") is None
    assert memory_verdict(est, None, what="x") is None  # nothing readable: nothing refused


def test_verdict_that_does_not_fit_names_keys_values_sizes_and_fix():
    env = EnvConfig("CartPole-v1", num_envs=100_000)
    est = estimate_env_memory(env, 2e6, rollout_steps=200_000)
    msg = memory_verdict(est, 16e9, what="the envs")
    assert msg is not None
    assert "env.num_envs=100000" in msg and "ppo.rollout_steps=200000" in msg
    assert "200 GB" in msg and "16 GB available" in msg
    fit = int((MEMORY_FRACTION * 16e9 - est.buffer_bytes) // 2e6)
    assert f"about {fit} fit" in msg and "lower env.num_envs" in msg


def test_the_driver_refuses_huge_pixel_frames_before_any_worker_starts():
    cfg = Config(
        env=EnvConfig("CartPole-v1", num_envs=8, pixels=True, image_size=100_000),
        ppo=PPOConfig(rollout_steps=64, num_minibatches=4),
    )
    with pytest.raises(ConfigError) as e:
        check_memory(cfg, FakeMemory(64 * GiB))
    msg = str(e.value)
    assert "env.image_size=100000" in msg and "lower env.image_size" in msg
    check_memory(  # the example's own settings fit
        Config(env=EnvConfig("CartPole-v1", num_envs=8), ppo=PPOConfig(rollout_steps=2048)),
        FakeMemory(8 * GiB),
    )


def test_a_vecenv_refuses_envs_whose_measured_projection_exceeds_the_available_memory(counted):
    mem = FakeMemory(available=1e9, per_env=50e6)  # 50 MB a simulator, 1 GB available
    with pytest.raises(ConfigError) as e:
        VecEnv(EnvConfig("CartPole-v1", num_envs=64), memory=mem)
    msg = str(e.value)
    assert "env.num_envs=64" in msg and "lower env.num_envs" in msg
    assert "measured over the first 5 simulators" in msg
    assert mem.rss_reads == 2  # stopped at the first check, 59 simulators before the end
    assert len(counted) == 5
    assert "59 env(s) x 50 MB" in msg


def test_a_vecenv_that_fits_is_built_and_reads_memory_rarely(counted):
    mem = FakeMemory(available=64 * GiB, per_env=1e6)
    venv = VecEnv(EnvConfig("CartPole-v1", num_envs=64), memory=mem)
    try:
        assert venv.reset().shape[0] == 64
        assert mem.rss_reads == 5  # after envs 1, 5, 10, 20 and 40: logarithmic in num_envs
    finally:
        venv.close()


def test_env_workers_sharing_a_node_count_each_others_simulators(counted):
    # 64 envs x 5 MB fit alone (~0.3 GB); four workers building at once do not (~1.2 GB).
    VecEnv(EnvConfig("CartPole-v1", num_envs=64), memory=FakeMemory(1e9, 5e6)).close()
    with pytest.raises(ConfigError, match="4 env workers"):
        VecEnv(EnvConfig("CartPole-v1", num_envs=64), memory=FakeMemory(1e9, 5e6), memory_share=4)


def test_validate_says_memory_before_building_the_cnn_on_a_stand_in_of_that_size():
    cfg = Config(
        env=EnvConfig("CartPole-v1", num_envs=8, pixels=True, image_size=100_000),
        ppo=PPOConfig(rollout_steps=64, num_minibatches=4),
    )
    problems = cfg.validate()  # 8 x 60 GB of frames and 64 x 30 GB of buffers: no node has it
    assert len(problems) == 1 and "env.image_size=100000" in problems[0], problems
    assert "GB available" in problems[0] and "CNNActorCritic" not in problems[0]


def test_ranks_count_only_the_group_s_ranks_on_their_own_node():
    # An env worker multiplies its projection by the ranks that build beside it: on two nodes
    # of two ranks each that is 2, not the group's 4 (each node has its own memory).
    from types import SimpleNamespace

    from loomrl.worker import ranks_on_node

    def on(node):
        return [SimpleNamespace(node=node)]

    assert ranks_on_node([on(0), on(0), on(1), on(1)]) == [2, 2, 2, 2]
    assert ranks_on_node([on(0), on(1), on(1), on(1)]) == [1, 3, 3, 3]
    assert ranks_on_node([on(3)]) == [1]


def test_the_buffers_of_an_envs_own_images_count_a_byte_an_element_and_name_rollout_steps():
    env = EnvConfig("loomrl-test/ImageObs-v0", num_envs=4)
    fits = rollout_memory_problem(env, 4096, True, (3, 20, 24), FakeMemory(10e6))
    assert fits is None  # 4096 x (1440 + 22) bytes = 6 MB, no normaliser's copy for images
    msg = rollout_memory_problem(env, 8192, True, (3, 20, 24), FakeMemory(10e6))
    assert msg is not None and "ppo.rollout_steps=8192" in msg
    assert "observations of [3, 20, 24] uint8 images from loomrl-test/ImageObs-v0" in msg
    rows = int(MEMORY_FRACTION * 10e6 // (1440 + 22))
    assert (
        f"lower ppo.rollout_steps (the buffer holds that many observations; about {rows} rows fit)"
        in msg
    )
    assert "lower env.num_envs" not in msg  # rollout_steps counts every env's rows: no help


def test_state_buffers_count_float32_twice_with_the_normaliser_and_unknown_shapes_not_at_all():
    env = EnvConfig("CartPole-v1", num_envs=4)
    room = FakeMemory(1e6)  # 0.8 MB planned
    assert rollout_memory_problem(env, 4096, True, None, room) is None  # 22 bytes a row
    assert rollout_memory_problem(env, 4096, False, (40,), room) is None  # 160 + 22
    msg = rollout_memory_problem(env, 4096, True, (40,), room)  # 320 + 22
    assert msg is not None and "[40] float32 numbers" in msg


def test_a_single_process_run_whose_buffers_cannot_fit_is_refused_before_it_collects():
    from loomrl.embodied import train_ppo

    # 3 MB an observation; 2**40 rows of them are more than any node holds.
    env = EnvConfig(
        "loomrl.envs.testing:loomrl-test/ImageObs-v0",
        num_envs=2,
        env_kwargs={"height": 1000, "width": 1000},
    )
    with pytest.raises(ConfigError) as e:
        train_ppo(env, PPOConfig(rollout_steps=2**40, num_minibatches=1), total_steps=2**40)
    assert "ppo.rollout_steps=1099511627776" in str(e.value)
    assert "[3, 1000, 1000] uint8 images" in str(e.value)


def test_once_the_envs_are_made_their_pixel_frames_are_in_use_and_only_the_buffers_count():
    env = EnvConfig("CartPole-v1", num_envs=1000, pixels=True, image_size=64)
    room = FakeMemory(10e6)  # 8 MB planned: the 25 MB of frames do not fit, 3 MB of buffers do
    before = rollout_memory_problem(env, 256, True, None, room)
    assert before is not None and "the envs' pixel frames and the rollout buffers" in before
    assert rollout_memory_problem(env, 256, True, (3, 64, 64), room) is None
