"""The PPO step recorded as a CUDA graph: the numbers of the eager step, across learning-rate
changes, minibatch shapes and weights moved off the device and back. Skipped without a GPU."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from loomrl.embodied import (  # noqa: E402
    GraphedPPOStep,
    PPOConfig,
    RolloutBuffer,
    capturable_adam,
    ppo_update,
    set_lr,
)
from loomrl.policies import make_policy  # noqa: E402
from loomrl.workers.policy import _to_device  # noqa: E402

BOX = gym.spaces.Box(-3.0, 3.0, (2,), np.float32)
SPACES = {
    "cnn": gym.spaces.Box(0, 255, (3, 64, 64), np.uint8),
    "mlp": gym.spaces.Box(-np.inf, np.inf, (11,), np.float32),
}


def _buffer(space, T, N, seed):
    g = torch.Generator().manual_seed(seed)
    if space.dtype == np.uint8:
        obs = torch.randint(0, 256, (T, N, *space.shape), dtype=torch.uint8, generator=g)
    else:
        obs = torch.randn(T, N, *space.shape, generator=g)
    z = torch.zeros(T, N)
    buf = RolloutBuffer(
        obs=obs,
        actions=torch.randn(T, N, 2, generator=g),
        logp=torch.randn(T, N, generator=g) - 2.0,
        values=torch.randn(T, N, generator=g),
        rewards=torch.randn(T, N, generator=g),
        terminated=torch.rand(T, N, generator=g) < 0.05,
        truncated=z.bool(),
        final_values=z,
        last_value=torch.randn(N, generator=g),
    )
    return _to_device(buf, "cuda")


def _trainer(net, ppo):
    return capturable_adam(net.parameters(), ppo.lr, ppo.adam_eps, "cuda")


def _params(net):
    return [p.detach().clone() for p in net.parameters()]


@pytest.mark.parametrize("kind", ["cnn", "mlp"])
def test_graphed_step_matches_the_eager_step(kind, monkeypatch):
    # cuDNN's default backward of a convolution sums with atomics, in an order that varies
    # from run to run (a few last-bit differences between two eager runs): compare on its
    # deterministic algorithms, where any difference is the recording's.
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    ppo = PPOConfig(rollout_steps=256, epochs=2, num_minibatches=4)
    eager = make_policy(SPACES[kind], BOX, seed=0).cuda()
    graphed = copy.deepcopy(eager)
    e_opt, g_opt = _trainer(eager, ppo), _trainer(graphed, ppo)
    step = GraphedPPOStep(graphed, g_opt, ppo)
    e_gen, g_gen = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    # Annealed learning rates (changed in place), then a rollout of another shape (minibatches
    # of 32 rows instead of 64: recorded again), then the weights moved away and back.
    for i, (T, N, frac) in enumerate([(32, 8, 1.0), (32, 8, 0.5), (16, 8, 0.25), (32, 8, 0.1)]):
        if i == 3:
            graphed.cpu()
            graphed.cuda()
            eager.cpu()
            eager.cuda()
        for opt in (e_opt, g_opt):
            set_lr(opt, ppo.lr * frac)
        buf = _buffer(SPACES[kind], T, N, seed=i)
        s_e = ppo_update(eager, e_opt, buf, ppo, generator=e_gen)
        s_g = ppo_update(graphed, g_opt, buf, ppo, generator=g_gen, step=step)
        for a, b in zip(_params(eager), _params(graphed), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert s_e == pytest.approx(s_g, rel=0, abs=0, nan_ok=True), i
    assert step.failed is None
    assert step.captures == 3  # the first layout, the second, and again after the move


def test_a_step_that_cannot_be_recorded_runs_eagerly_and_says_why():
    ppo = PPOConfig(rollout_steps=256, epochs=1, num_minibatches=4)
    net = make_policy(SPACES["mlp"], BOX, seed=0).cuda()
    # Not capturable: Adam refuses to be recorded.
    opt = torch.optim.Adam(net.parameters(), lr=ppo.lr, eps=ppo.adam_eps)
    step = GraphedPPOStep(net, opt, ppo)
    before = _params(net)
    with pytest.warns(UserWarning, match="runs eagerly"):
        stats = ppo_update(net, opt, _buffer(SPACES["mlp"], 32, 8, 0), ppo, step=step)
    assert step.failed and step.captures == 0
    assert np.isfinite(stats["policy_loss"])
    assert all(not torch.equal(a, b) for a, b in zip(before, _params(net), strict=True))


def test_a_recorded_step_at_learning_rate_zero_moves_no_weight():
    """A trial's updates (learning rate 0) replay the recorded step and leave every parameter's
    bits as they were; back at the run's learning rate the same replay moves them."""
    ppo = PPOConfig(rollout_steps=256, epochs=2, num_minibatches=4)
    net = make_policy(SPACES["cnn"], BOX, seed=0).cuda()
    opt = _trainer(net, ppo)
    step = GraphedPPOStep(net, opt, ppo)
    gen = torch.Generator().manual_seed(1)
    buf = _buffer(SPACES["cnn"], 32, 8, seed=0)
    ppo_update(net, opt, buf, ppo, generator=gen, step=step)  # warm-up steps, then recorded
    assert step.captures == 1
    before = _params(net)
    set_lr(opt, 0.0)
    ppo_update(net, opt, buf, ppo, generator=gen, step=step)  # replays only
    assert step.captures == 1
    for a, b in zip(before, _params(net), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    set_lr(opt, ppo.lr)
    ppo_update(net, opt, buf, ppo, generator=gen, step=step)
    assert any(not torch.equal(a, b) for a, b in zip(before, _params(net), strict=True))


def test_a_recorded_step_with_a_non_finite_gradient_moves_no_weight():
    """The recorded step skips a minibatch whose gradient norm is not finite on the device
    (the fused Adam's found_inf), as the eager step does, and takes the next finite one."""
    ppo = PPOConfig(rollout_steps=256, epochs=1, num_minibatches=4)
    net = make_policy(SPACES["mlp"], BOX, seed=0).cuda()
    opt = _trainer(net, ppo)
    step = GraphedPPOStep(net, opt, ppo)
    buf = _buffer(SPACES["mlp"], 32, 8, seed=0)
    ppo_update(net, opt, buf, ppo, step=step)  # warm-up steps, then recorded
    assert step.captures == 1
    before = _params(net)
    moments = {k: v.clone() for k, v in opt.state[next(net.parameters())].items()}
    bad = _buffer(SPACES["mlp"], 32, 8, seed=1)
    bad.obs[:, :, 0] = float("inf")
    from loomrl.errors import TrainingError

    with pytest.raises(TrainingError, match="PPO steps in a row had a non-finite gradient"):
        ppo_update(net, opt, bad, ppo, step=step)  # four skipped steps: the run would stop
    assert step.captures == 1  # replayed, not recorded again
    for a, b in zip(before, _params(net), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for k, v in moments.items():
        torch.testing.assert_close(v, opt.state[next(net.parameters())][k], rtol=0, atol=0)
    ppo_update(net, opt, buf, ppo, step=step)
    assert any(not torch.equal(a, b) for a, b in zip(before, _params(net), strict=True))
