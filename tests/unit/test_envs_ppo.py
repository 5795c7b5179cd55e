"""Embodied PPO pieces: normalisers, advantages with truncation, ring-group collection, PPO update."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import loomrl.envs.testing  # noqa: F401  (registers loomrl-test/* envs)
from loomrl.embodied import (
    UPDATE_STATS,
    GraphedPPOStep,
    PPOConfig,
    RewardScaler,
    RolloutBuffer,
    RunningMeanStd,
    collect,
    compute_advantages,
    ppo_step,
    ppo_update,
    set_lr,
    train_ppo,
)
from loomrl.envs import EnvConfig, VecEnv
from loomrl.errors import ConfigError
from loomrl.policies import MLPActorCritic


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


def test_running_mean_std_matches_numpy_and_round_trips():
    rng = np.random.default_rng(0)
    a, b = rng.normal(2, 3, (50, 4)), rng.normal(-1, 1, (30, 4))
    rms = RunningMeanStd((4,), eps=0.0)
    rms.update(a)
    rms.update(b)
    both = np.concatenate([a, b])
    np.testing.assert_allclose(rms.mean, both.mean(0), rtol=1e-12)
    np.testing.assert_allclose(rms.var, both.var(0), rtol=1e-12)
    x = rms.normalize(both[:3], clip=None)
    np.testing.assert_allclose(
        x, (both[:3] - both.mean(0)) / np.sqrt(both.var(0) + 1e-8), rtol=1e-5
    )
    assert np.abs(rms.normalize(both * 100, clip=5.0)).max() <= 5.0
    other = RunningMeanStd((4,))
    other.load_state_dict(rms.state_dict())
    np.testing.assert_array_equal(other.mean, rms.mean)
    with pytest.raises(ValueError, match="saved shape"):
        RunningMeanStd((3,)).load_state_dict(rms.state_dict())


def test_reward_scaler_uses_discounted_return_std():
    s = RewardScaler(1, gamma=0.5, clip=None)
    s.update(np.ones((3, 1)), np.array([[0.0], [1.0], [0.0]]))  # returns seen: 1, 1.5, then 1
    expected_std = np.sqrt(np.var([1.0, 1.5, 1.0]))
    out = s.scale(torch.ones(2, 1))
    assert_close(out, torch.full((2, 1), 1 / expected_std, dtype=torch.float32), rtol=1e-3, atol=0)


def _buffer(**kw) -> RolloutBuffer:
    T, N = kw["rewards"].shape
    z = torch.zeros(T, N)
    fields = dict(
        obs=z,
        actions=z,
        logp=z,
        values=z,
        rewards=z,
        terminated=z.bool(),
        truncated=z.bool(),
        final_values=z,
        last_value=torch.zeros(N),
    )
    fields.update(kw)
    return RolloutBuffer(**fields)


def test_advantages_bootstrap_through_truncation_but_not_termination():
    buf = _buffer(
        rewards=torch.tensor([[1.0], [1.0]]),
        values=torch.tensor([[0.5], [0.5]]),
        truncated=torch.tensor([[True], [False]]),
        final_values=torch.tensor([[2.0], [0.0]]),
        last_value=torch.tensor([3.0]),
    )
    adv, ret = compute_advantages(buf, gamma=0.9, lam=1.0)
    # t=1: 1 + .9*3 - .5 = 3.2.  t=0 (truncated): 1 + .9*V(final)=2.8, cut: 2.8 - .5 = 2.3
    assert_close(adv, torch.tensor([[2.3], [3.2]]))
    assert_close(ret, torch.tensor([[2.8], [3.7]]))
    buf.terminated[0, 0], buf.truncated[0, 0] = True, False
    adv, _ = compute_advantages(buf, gamma=0.9, lam=1.0)
    assert_close(adv[0], torch.tensor([0.5]))  # 1 - .5, nothing bootstrapped
    # Ended at the time limit: terminal and truncated at once, still nothing to bootstrap from.
    buf.truncated[0, 0] = True
    adv, _ = compute_advantages(buf, gamma=0.9, lam=1.0)
    assert_close(adv[0], torch.tensor([0.5]))


def _collect(policy, groups, split_workers=False, steps=30):
    cfg = EnvConfig("InvertedPendulum-v5", num_envs=8, seed=11, max_episode_steps=7)
    norm = RunningMeanStd((4,))
    if split_workers:  # one VecEnv per group, as separate env workers would hold them
        size = cfg.num_envs // groups
        env = [
            VecEnv(EnvConfig(**{**cfg.__dict__, "num_envs": size}), index_offset=g * size)
            for g in range(groups)
        ]
    else:
        env = VecEnv(cfg)
    bufs = [
        collect(env, policy, steps, groups, normalizer=norm) for _ in range(2)
    ]  # stats carry over
    return bufs, norm


def test_ring_group_collection_equals_unpipelined_collection():
    import gymnasium as gym

    policy = MLPActorCritic(4, gym.spaces.Box(-3.0, 3.0, (1,), np.float32), seed=0)
    (ref, ref2), ref_norm = _collect(policy, 1)
    assert ref.terminated.any() and ref.truncated.any(), "test needs both kinds of episode end"
    for groups, split in ((2, False), (8, False), (4, True)):
        (b, b2), norm = _collect(policy, groups, split)
        for name in (
            "obs",
            "actions",
            "logp",
            "values",
            "rewards",
            "terminated",
            "truncated",
            "final_values",
            "last_value",
        ):
            assert torch.equal(getattr(b, name), getattr(ref, name)), (groups, split, name)
            assert torch.equal(getattr(b2, name), getattr(ref2, name)), (groups, split, name)
        np.testing.assert_array_equal(norm.mean, ref_norm.mean)
        assert sorted(b.episodes.returns) == sorted(ref.episodes.returns)


def test_collect_rejects_bad_groups():
    env = VecEnv(EnvConfig("InvertedPendulum-v5", num_envs=2))
    with pytest.raises(ConfigError, match="groups=3"):
        collect(env, MLPActorCritic(4, env.single_action_space), 2, groups=3)


@pytest.mark.parametrize("steps", [0, -1])
def test_collect_rejects_a_rollout_of_no_steps(steps):
    # It failed in torch.stack ("expects a non-empty TensorList"), saying nothing of steps.
    env = VecEnv(EnvConfig("InvertedPendulum-v5", num_envs=2))
    with pytest.raises(ConfigError, match=rf"steps={steps}: a rollout needs"):
        collect(env, MLPActorCritic(4, env.single_action_space), steps)


def test_reset_observations_are_not_transitions():
    env = VecEnv(EnvConfig("loomrl-test/Counting-v0", num_envs=2, env_kwargs={"length": 3}))
    buf = collect(env, MLPActorCritic(2, env.single_action_space), 6)
    assert buf.rewards.shape == (6, 2) and (buf.rewards == 1).all()  # every step is real
    assert buf.terminated[:, 0].tolist() == [False, False, True, False, False, True]
    assert buf.obs[:, 0, 1].tolist() == [0, 1, 2, 0, 1, 2]  # step-in-episode seen by the policy
    assert buf.obs[3, 0, 0] == 1  # the state after a done is the next episode's reset obs
    assert buf.episodes.returns == [3.0] * 4


class UserPolicy(nn.Module):
    """A user's own module following only the act/evaluate protocol."""

    def __init__(self):
        super().__init__()
        self.mu = nn.Linear(4, 1)
        self.v = nn.Linear(4, 1)
        self.log_std = nn.Parameter(torch.zeros(1))

    def _dist(self, obs):
        return torch.distributions.Normal(self.mu(obs), self.log_std.exp())

    def act(self, obs):
        d = self._dist(obs)
        a = d.sample()
        return a, d.log_prob(a).sum(-1), self.v(obs).squeeze(-1)

    def evaluate(self, obs, action):
        d = self._dist(obs)
        return d.log_prob(action).sum(-1), d.entropy().sum(-1), self.v(obs).squeeze(-1)


@pytest.mark.parametrize(
    "make", [lambda space: MLPActorCritic(4, space, seed=0), lambda space: UserPolicy()]
)
def test_ppo_update_runs_and_is_reproducible(make):
    def once():
        torch.manual_seed(0)
        env = VecEnv(EnvConfig("InvertedPendulum-v5", num_envs=4, seed=0))
        policy = make(env.single_action_space)
        opt = torch.optim.Adam(policy.parameters(), lr=3e-4, eps=1e-5)
        buf = collect(env, policy, 64, normalizer=RunningMeanStd((4,)))
        cfg = PPOConfig(rollout_steps=256, epochs=2, num_minibatches=4)
        stats = ppo_update(policy, opt, buf, cfg, generator=torch.Generator().manual_seed(0))
        return stats, [p.detach().clone() for p in policy.parameters()]

    s1, p1 = once()
    s2, p2 = once()
    for k in (
        "policy_loss",
        "value_loss",
        "entropy",
        "approx_kl",
        "clip_frac",
        "grad_norm",
        "explained_variance",
    ):
        assert np.isfinite(s1[k]), k
    assert s1 == s2 and all(torch.equal(a, b) for a, b in zip(p1, p2, strict=True))
    assert s1["epochs"] == 2


@pytest.mark.parametrize("target_kl", [None, 1e-12])
def test_ppo_update_runs_each_minibatch_through_its_step(target_kl):
    env = VecEnv(EnvConfig("InvertedPendulum-v5", num_envs=4, seed=0))
    cfg = PPOConfig(rollout_steps=256, epochs=3, num_minibatches=4, target_kl=target_kl)
    buf = collect(env, MLPActorCritic(4, env.single_action_space, seed=1), 64)
    policies = [MLPActorCritic(4, env.single_action_space, seed=0) for _ in range(2)]
    opts = [torch.optim.Adam(p.parameters(), lr=3e-4, eps=1e-5) for p in policies]
    rows, sizes = [], []

    def step(mb):  # what a GraphedPPOStep is to ppo_update: a callable on one minibatch
        sizes.append({k: len(v) for k, v in mb.items()})
        rows.append(ppo_step(policies[1], opts[1], cfg, mb))
        return rows[-1]

    gens = [torch.Generator().manual_seed(0) for _ in range(2)]
    plain = ppo_update(policies[0], opts[0], buf, cfg, generator=gens[0])
    stepped = ppo_update(policies[1], opts[1], buf, cfg, generator=gens[1], step=step)
    assert plain == stepped
    assert all(
        torch.equal(a, b)
        for a, b in zip(policies[0].parameters(), policies[1].parameters(), strict=True)
    )
    # Minibatches of 256 / 4 rows; under a tiny target_kl the first epoch's KL ends the update.
    epochs = 1 if target_kl else 3
    assert stepped["epochs"] == epochs and len(rows) == 4 * epochs
    assert all(set(s.values()) == {64} for s in sizes)
    # The stats are the minibatches' means, read once at the end.
    means = torch.stack(rows).mean(0).tolist()
    assert [stepped[k] for k in UPDATE_STATS] == means


def test_set_lr_and_the_recorded_steps_warm_up_checks():
    import gymnasium as gym

    net = MLPActorCritic(4, gym.spaces.Box(-3.0, 3.0, (1,), np.float32), seed=0)
    plain = torch.optim.Adam(net.parameters(), lr=1e-3)
    tensor_lr = torch.optim.Adam(net.parameters(), lr=torch.tensor(1e-3))
    held = tensor_lr.param_groups[0]["lr"]
    set_lr(plain, 5e-4)
    set_lr(tensor_lr, 5e-4)
    assert plain.param_groups[0]["lr"] == 5e-4
    # A tensor learning rate changes in place: a recorded step reads that very tensor.
    assert tensor_lr.param_groups[0]["lr"] is held and held.item() == pytest.approx(5e-4)
    with pytest.raises(ValueError, match=r"warmup=0 must be >= 1"):
        GraphedPPOStep(net, plain, PPOConfig(), warmup=0)


def test_ppo_config_reports_problems():
    with pytest.raises(ConfigError) as e:
        PPOConfig(gamma=1.5, clip=0.0, num_minibatches=0)
    assert len(e.value.problems) == 3 and "gamma=1.5" in str(e.value)
    # Values that would flatten observations or rewards, or break Adam or the early stop.
    with pytest.raises(ConfigError) as e:
        PPOConfig(obs_clip=0.0, reward_clip=-1.0, adam_eps=0.0, target_kl=0.0, hidden=(64, 0))
    assert [p.split("=")[0] for p in e.value.problems] == [
        "adam_eps",
        "target_kl",
        "obs_clip",
        "reward_clip",
        "hidden",
    ]
    with pytest.raises(ConfigError, match=r"vf_coef=0.5, ent_coef=-0.01: must be >= 0"):
        PPOConfig(ent_coef=-0.01)
    PPOConfig(target_kl=None, value_clip=None, hidden=())  # off, off, a linear policy


@pytest.mark.slow
def test_ppo_learns_inverted_pendulum_within_10_minutes():
    torch.set_num_threads(1)
    result = train_ppo(
        EnvConfig("InvertedPendulum-v5", num_envs=8, seed=0),
        PPOConfig(seed=0),
        total_steps=500_000,
        time_limit_s=600,
        target_return=950,
    )
    curve = [(int(p["steps"]), round(p["mean_return"], 1)) for p in result.curve]
    assert result.reached_target, f"mean return never reached 950 in {result.time_s:.0f} s: {curve}"
    assert result.target_time_s < 600


def test_pixel_rollout_and_update_with_the_cnn_policy():
    from loomrl.envs import probe_rendering
    from loomrl.policies import make_policy

    problem = probe_rendering("egl", timeout_s=60)
    if problem is not None:
        pytest.skip(f"headless EGL rendering unavailable: {problem}")
    env = VecEnv(EnvConfig("InvertedPendulum-v5", num_envs=2, pixels=True, image_size=40))
    policy = make_policy(env.single_observation_space, env.single_action_space, seed=0)
    buf = collect(env, policy, 4, groups=2)
    assert buf.obs.shape == (4, 2, 3, 40, 40) and buf.obs.dtype == torch.uint8
    opt = torch.optim.Adam(policy.parameters(), lr=3e-4)
    stats = ppo_update(policy, opt, buf, PPOConfig(rollout_steps=8, epochs=1, num_minibatches=2))
    assert np.isfinite(stats["policy_loss"])


@pytest.mark.parametrize("slip", ["value_column", "logp_column"])
def test_a_policy_whose_evaluate_returns_columns_is_a_config_error_naming_evaluate(slip):
    """evaluate() giving values (or log-probs) of [n, 1] would broadcast against [n] targets;
    the PPO step says which output has which shape instead."""
    from loomrl.errors import ConfigError

    class Slipped(UserPolicy):
        def evaluate(self, obs, action):
            logp, ent, v = super().evaluate(obs, action)
            if slip == "value_column":
                return logp, ent, v[:, None]
            return logp[:, None], ent, v

    env = VecEnv(EnvConfig("InvertedPendulum-v5", num_envs=4, seed=0))
    policy = Slipped()
    buf = collect(env, UserPolicy(), 16)
    opt = torch.optim.Adam(policy.parameters(), lr=3e-4)
    cfg = PPOConfig(rollout_steps=64, epochs=1, num_minibatches=2)
    with pytest.raises(ConfigError) as e:
        ppo_update(policy, opt, buf, cfg, generator=torch.Generator().manual_seed(0))
    msg = str(e.value)
    what = "values" if slip == "value_column" else "log-probs"
    assert (
        "evaluate() on 32 observations" in msg and f"{what} of shape [32, 1], expected [32]" in msg
    )


@pytest.mark.parametrize(
    "slip, said",
    [
        (
            "two",
            r"must return \(log-probs, entropies, values\) as three torch tensors, got "
            r"tuple of 2 values",
        ),
        ("numpy", r"as three torch tensors, got \(Tensor, Tensor, ndarray\)"),
        ("detached", r"evaluate\(\) returned log-probs and values that carry no gradient"),
    ],
)
def test_a_policy_whose_evaluate_returns_the_wrong_things_is_a_config_error(slip, said):
    """Two values gave a bare unpacking error, a detached output autograd's "does not require
    grad", each with a traceback from the worker; the PPO step names evaluate() instead."""

    class Slipped(UserPolicy):
        def evaluate(self, obs, action):
            logp, ent, v = super().evaluate(obs, action)
            if slip == "two":
                return logp, v
            if slip == "numpy":
                return logp, ent, v.detach().numpy()
            return logp.detach(), ent.detach(), v.detach()

    env = VecEnv(EnvConfig("InvertedPendulum-v5", num_envs=4, seed=0))
    policy = Slipped()
    buf = collect(env, UserPolicy(), 16)
    opt = torch.optim.Adam(policy.parameters(), lr=3e-4)
    cfg = PPOConfig(rollout_steps=64, epochs=1, num_minibatches=2)
    with pytest.raises(ConfigError, match=said):
        ppo_update(policy, opt, buf, cfg, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("total_steps", [0, -100, 2.5])
def test_train_ppo_refuses_no_steps_and_a_window_of_none_before_any_env_starts(total_steps):
    # It trained one whole update (ppo.rollout_steps transitions) for 0 or negative steps, and
    # with window=0 its mean return was the mean of no episodes (a target never reached).
    from loomrl.embodied import train_ppo

    env = EnvConfig("InvertedPendulum-v5", num_envs=2)
    ppo = PPOConfig(rollout_steps=64, num_minibatches=2, epochs=1)
    with pytest.raises(ConfigError, match=r"total_steps=.*must be a whole number >= 1"):
        train_ppo(env, ppo, total_steps)
    with pytest.raises(ConfigError, match=r"window=0: must be a whole number >= 1"):
        train_ppo(env, ppo, 64, window=0, target_return=0.0)


@pytest.mark.parametrize("fused", [False, True])
def test_a_step_with_a_non_finite_gradient_keeps_weights_and_adam_state(fused):
    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    opt = torch.optim.Adam(net.parameters(), lr=0.1, fused=fused)
    cfg = PPOConfig()

    class Wrapped(nn.Module):  # evaluate(): log-probs, entropies and values of one row each
        def __init__(self):
            super().__init__()
            self.net = net

        def evaluate(self, obs, actions):
            out = self.net(obs)
            return out[:, 0], torch.zeros(len(obs)), out[:, 1]

    policy = Wrapped()
    mb = {
        "obs": torch.randn(4, 3),
        "actions": torch.zeros(4, 1),
        "old_logp": torch.zeros(4),
        "adv": torch.randn(4),
        "ret": torch.randn(4),
        "old_v": torch.zeros(4),
    }
    row = ppo_step(policy, opt, cfg, mb)  # a finite step: applied, Adam's state made
    assert row[UPDATE_STATS.index("skipped")] == 0
    before = [p.detach().clone() for p in net.parameters()]
    state = {k: v.clone() for k, v in opt.state[net.weight].items()}
    mb["obs"][1, 0] = float("inf")
    row = ppo_step(policy, opt, cfg, mb)
    assert row[UPDATE_STATS.index("skipped")] == 1
    assert not torch.isfinite(row[UPDATE_STATS.index("grad_norm")])
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    assert all(torch.equal(state[k], opt.state[net.weight][k]) for k in state)
    mb["obs"][1, 0] = 0.5
    ppo_step(policy, opt, cfg, mb)  # finite again: applied
    assert not torch.equal(before[0], net.weight)
    assert opt.state[net.weight]["step"] == state["step"] + 1


def test_nonfinite_streak_counts_across_updates_and_stops_at_the_limit():
    from loomrl.embodied import MAX_NONFINITE_STEPS, nonfinite_streak
    from loomrl.errors import TrainingError

    assert MAX_NONFINITE_STEPS == 3
    assert nonfinite_streak(0, [0, 1, 0, 1, 1]) == 2
    assert nonfinite_streak(2, [0, 0]) == 0
    assert nonfinite_streak(1, []) == 1
    with pytest.raises(TrainingError, match=r"^3 PPO steps in a row had a non-finite gradient"):
        nonfinite_streak(2, [1, 0])
    with pytest.raises(TrainingError, match="Lower ppo.lr"):
        nonfinite_streak(0, [1, 1, 1, 0])


def test_ppo_update_skips_non_finite_steps_and_reports_them():
    env = VecEnv(EnvConfig("InvertedPendulum-v5", num_envs=4, seed=0))
    cfg = PPOConfig(rollout_steps=64, epochs=1, num_minibatches=4)
    buf = collect(env, MLPActorCritic(4, env.single_action_space, seed=1), 16)
    policy = MLPActorCritic(4, env.single_action_space, seed=0)
    opt = torch.optim.Adam(policy.parameters(), lr=3e-4, eps=1e-5)
    calls = []
    every = [False]

    def step(mb):  # every other minibatch (or every one) meets an infinite observation
        if len(calls) % 2 or every[0]:
            mb = {**mb, "obs": mb["obs"].clone()}
            mb["obs"][0, 0] = float("inf")
        calls.append(1)
        return ppo_step(policy, opt, cfg, mb)

    stats = ppo_update(policy, opt, buf, cfg, step=step, nonfinite_before=2)
    assert stats["skipped"] == 2 and stats["nonfinite_in_a_row"] == 1
    assert np.isfinite(stats["grad_norm"])
    assert all(torch.isfinite(p).all() for p in policy.parameters())
    from loomrl.errors import TrainingError

    kept = [p.detach().clone() for p in policy.parameters()]
    every[0], calls[:] = True, []
    # The streak of one left by the previous update: this update's second skip is the third.
    with pytest.raises(TrainingError, match="^3 PPO steps in a row"):
        ppo_update(policy, opt, buf, cfg, step=step, nonfinite_before=1)
    assert len(calls) == 4  # the update ran its steps; none of them was applied
    assert all(torch.equal(a, b) for a, b in zip(kept, policy.parameters(), strict=True))
