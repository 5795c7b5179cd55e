"""Built-in actor-critic policies: seeded init, shapes, per-row sampling, batch invariance."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from loomrl.policies import CNNActorCritic, MLPActorCritic, make_policy, row_generators

BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
DISC = gym.spaces.Discrete(4)


def assert_close(actual, expected, rtol=1.3e-6, atol=1e-5):
    # torch.testing.assert_close imports torch.distributed on first use (seconds); this is enough.
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, rtol=rtol, atol=atol), (actual, expected)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    # Tiny networks: intra-op threads only add synchronisation (badly so on a loaded 2-core box).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_same_seed_same_weights_regardless_of_global_rng():
    torch.manual_seed(1)
    a = MLPActorCritic(5, BOX, seed=7)
    torch.manual_seed(2)
    b = MLPActorCritic(5, BOX, seed=7)
    c = MLPActorCritic(5, BOX, seed=8)
    for (n, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), n
    assert not torch.equal(a.actor[0].weight, c.actor[0].weight)


def test_gaussian_act_and_evaluate_agree():
    p = MLPActorCritic(5, BOX, seed=0)
    obs = torch.randn(6, 5)
    a, logp, v = p.act(obs)
    assert a.shape == (6, 3) and logp.shape == v.shape == (6,)
    logp2, ent, v2 = p.evaluate(obs, a)
    assert_close(logp, logp2, rtol=1e-5, atol=1e-5)
    assert_close(v, v2, rtol=1e-5, atol=1e-5)
    # state-independent log-std initialised at 0: entropy of a unit Gaussian per dim
    assert_close(ent, torch.full((6,), 3 * 0.5 * np.log(2 * np.pi * np.e), dtype=torch.float32))


def test_act_draws_the_same_noise_first_and_leaves_checks_to_training():
    # act draws each row's noise before the forward (so its copy to a GPU waits for nothing):
    # the same draws as sampling after it.
    p = MLPActorCritic(5, BOX, seed=0)
    obs = torch.randn(4, 5)
    a, logp, _ = p.act(obs, generators=row_generators(0, range(4), [2] * 4))
    out, _ = p._forward(obs)
    late = p.heads.sample(out, row_generators(0, range(4), [2] * 4), deterministic=False)
    assert torch.equal(a, late)
    assert_close(logp, p.evaluate(obs, a)[0])
    # act skips torch.distributions' argument checks (each would wait for a GPU); a broken
    # network's NaN actions are refused where they are used, and training still checks.
    with torch.no_grad():
        p.actor[0].weight.fill_(float("nan"))
    a, logp, _ = p.act(obs, generators=row_generators(0, range(4), [3] * 4))
    assert torch.isnan(a).all() and torch.isnan(logp).all()
    with pytest.raises(ValueError, match="loc"):
        p.evaluate(obs, torch.zeros(4, 3))


def test_categorical_policy_and_discrete_start():
    space = gym.spaces.Discrete(4, start=1)
    p = MLPActorCritic(5, space, seed=0)
    a, logp, _ = p.act(torch.randn(64, 5))
    assert a.shape == (64,) and a.min() >= 1 and a.max() <= 4
    logp2, ent, _ = p.evaluate(torch.randn(64, 5) * 0, a)  # valid on any obs
    assert ent.shape == (64,) and torch.isfinite(logp2).all()


@pytest.mark.parametrize("space", [BOX, DISC])
def test_per_row_generators_make_actions_independent_of_batching(space):
    p = MLPActorCritic(5, space, seed=0)
    obs = torch.randn(8, 5)
    gens = lambda: row_generators(3, range(8), [11] * 8)  # noqa: E731
    whole = p.act(obs, generators=gens())
    g = gens()
    parts = [p.act(obs[i : i + 3], generators=g[i : i + 3]) for i in (0, 3, 6)]
    for k in range(3):
        assert torch.equal(whole[k], torch.cat([x[k] for x in parts]))
    assert torch.equal(whole[0], p.act(obs, generators=gens())[0])  # reproducible
    other = p.act(obs, generators=row_generators(3, range(8), [12] * 8))[0]
    assert not torch.equal(whole[0], other)  # the step count moves the stream


def test_deterministic_act_is_the_mean():
    p = MLPActorCritic(5, BOX, seed=0)
    obs = torch.randn(4, 5)
    a, _, _ = p.act(obs, deterministic=True)
    assert_close(a, p.actor(obs))


def test_cnn_policy_on_uint8_images():
    space = gym.spaces.Box(0, 255, (3, 48, 48), np.uint8)
    p = make_policy(space, BOX, seed=0)
    assert isinstance(p, CNNActorCritic)
    obs = torch.randint(0, 256, (5, 3, 48, 48), dtype=torch.uint8)
    a, logp, v = p.act(obs, generators=row_generators(0, range(5), [0] * 5))
    assert a.shape == (5, 3) and logp.shape == v.shape == (5,)
    logp2, _, _ = p.evaluate(obs, a)
    assert_close(logp, logp2, rtol=1e-4, atol=1e-4)
    small = make_policy(gym.spaces.Box(0, 255, (3, 24, 24), np.uint8), DISC, seed=0)
    assert small.act(obs[:, :, :24, :24])[0].shape == (5,)


def test_unsupported_spaces_are_explained():
    with pytest.raises(TypeError, match="Box and Discrete"):
        MLPActorCritic(5, gym.spaces.MultiBinary(3))
    with pytest.raises(ValueError, match="no built-in policy"):
        make_policy(gym.spaces.Box(0, 1, (2, 2), np.float32), BOX)
    with pytest.raises(ValueError, match="one per row"):
        MLPActorCritic(5, BOX).act(torch.zeros(3, 5), generators=row_generators(0, [0], [0]))
