"""Advantage estimators against values computed by hand (arithmetic written out)."""

from __future__ import annotations

import math

import pytest
import torch

from loomrl.algos import (
    discounted_returns,
    gae,
    gae_tokens,
    grpo_advantages,
    outcome_to_token_rewards,
    reinforce_pp_advantages,
    rloo_advantages,
)

f64 = torch.float64


def t(x):
    return torch.tensor(x, dtype=f64)


def close(a, b, tol=1e-6):
    torch.testing.assert_close(a, t(b) if not isinstance(b, torch.Tensor) else b, atol=tol, rtol=0)


# ---------------------------------------------------------------- GRPO


def test_grpo_scaled_by_sample_std():
    # group 1: [1, 0, 0, 0] -> mean 0.25, deviations [0.75, -0.25, -0.25, -0.25]
    #   sample var = (0.75^2 + 3 * 0.25^2) / 3 = (0.5625 + 0.1875) / 3 = 0.25 -> std 0.5
    # group 2: [1, 1, 1, 1] -> all equal -> zero advantage
    eps = 1e-6
    adv = grpo_advantages(t([1, 0, 0, 0, 1, 1, 1, 1]), group_size=4, eps=eps)
    d = 0.5 + eps
    close(adv, [0.75 / d, -0.25 / d, -0.25 / d, -0.25 / d, 0, 0, 0, 0])


def test_grpo_without_std_scaling():
    # group 1: [2, 4] -> mean 3 -> [-1, 1]; group 2: [0, 1] -> mean 0.5 -> [-0.5, 0.5]
    adv = grpo_advantages(t([2, 4, 0, 1]), group_size=2, scale_std=False)
    close(adv, [-1, 1, -0.5, 0.5])


def test_grpo_two_sample_group_is_plus_minus_one_over_sqrt2():
    # [0, 1]: mean 0.5, sample std = sqrt((0.25 + 0.25) / 1) = sqrt(0.5)
    adv = grpo_advantages(t([0, 1]), group_size=2, eps=0.0)
    s = math.sqrt(0.5)
    close(adv, [-0.5 / s, 0.5 / s])


@pytest.mark.parametrize("eps", [0.0, 1e-6])
@pytest.mark.parametrize("value", [0.0, 1.0, 0.1, -3.7])
def test_grpo_equal_rewards_give_exact_zero_not_nan(eps, value):
    # 0.1 * 3 summed in float is 0.30000000000000004: the mean is not exactly 0.1,
    # so a naive (r - mean) / std would be +-1 or NaN.
    rewards = torch.full((6,), value, dtype=f64)
    for scale in (True, False):
        adv = grpo_advantages(rewards, group_size=3, scale_std=scale, eps=eps)
        assert torch.equal(adv, torch.zeros(6, dtype=f64))


def test_grpo_group_size_one_is_zero():
    adv = grpo_advantages(t([0.3, 0.9]), group_size=1)
    assert torch.equal(adv, torch.zeros(2, dtype=f64))


def test_grpo_float32_input_and_group_layout():
    # groups are contiguous: [g0 g0 g1 g1]
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 5.0, 5.0]), group_size=2, scale_std=False)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0.0, 0.0]))


def test_grpo_batch_not_divisible_names_both_numbers():
    with pytest.raises(ValueError, match="batch size 6 is not divisible by group_size 4"):
        grpo_advantages(torch.zeros(6), group_size=4)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_grpo_bad_group_size(bad):
    with pytest.raises(ValueError, match="group_size must be a positive int"):
        grpo_advantages(torch.zeros(4), group_size=bad)


def test_grpo_rejects_2d_and_nan():
    with pytest.raises(ValueError, match=r"1-D tensor \[B\]"):
        grpo_advantages(torch.zeros(2, 2), group_size=2)
    with pytest.raises(ValueError, match=r"NaN/inf at indices \[1\]"):
        grpo_advantages(torch.tensor([0.0, float("nan")]), group_size=2)


# ---------------------------------------------------------------- RLOO


def test_group_estimators_on_rewards_near_the_float32_limit():
    # A float32 group sum of 3e38 + 3.3e38 is inf; the estimators must still be exact.
    r = torch.tensor([3e38, 3e38, -3e38, 3e38])
    assert torch.allclose(grpo_advantages(r, 4), torch.tensor([0.5, 0.5, -1.5, 0.5]))
    assert grpo_advantages(r, 4).dtype == torch.float32
    big = torch.tensor([3e38, 3.3e38])
    assert torch.allclose(grpo_advantages(big, 2, scale_std=False), torch.tensor([-1.5e37, 1.5e37]))
    assert torch.allclose(rloo_advantages(big, 2), torch.tensor([-3e37, 3e37]))
    # A difference that float32 cannot hold is a clear error, not silent inf.
    with pytest.raises(ValueError, match="rloo_advantages: advantages overflow torch.float32"):
        rloo_advantages(torch.tensor([3e38, -3e38]), 2)
    with pytest.raises(ValueError, match="scale the rewards down"):
        grpo_advantages(r, 4, scale_std=False)


def test_rloo_leave_one_out_baseline():
    # group [1, 0, 0, 0]: A_0 = 1 - mean(0,0,0) = 1; A_j = 0 - mean(1,0,0) = -1/3
    # group [2, 4, 6, 8]: A_0 = 2 - (4+6+8)/3 = 2 - 6 = -4; A_1 = 4 - (2+6+8)/3 = 4 - 16/3 = -4/3
    #                     A_2 = 6 - (2+4+8)/3 = 6 - 14/3 = 4/3;  A_3 = 8 - 12/3 = 4
    adv = rloo_advantages(t([1, 0, 0, 0, 2, 4, 6, 8]), group_size=4)
    close(adv, [1, -1 / 3, -1 / 3, -1 / 3, -4, -4 / 3, 4 / 3, 4])


def test_rloo_equal_rewards_zero():
    assert torch.equal(rloo_advantages(t([0.7] * 4), 2), torch.zeros(4, dtype=f64))


def test_rloo_errors():
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        rloo_advantages(torch.zeros(3), group_size=1)
    with pytest.raises(ValueError, match="batch size 5 is not divisible by group_size 2"):
        rloo_advantages(torch.zeros(5), group_size=2)


# ---------------------------------------------------------------- REINFORCE++


def test_discounted_returns_skips_padding():
    # row 0: r = [0, 0, 1], gamma 0.5 -> G2 = 1, G1 = 0 + 0.5 * 1 = 0.5, G0 = 0.25
    # row 1: r = [0, 2, pad] -> G1 = 2, G0 = 0 + 0.5 * 2 = 1, pad -> 0
    r = t([[0, 0, 1], [0, 2, 9]])  # the 9 sits on padding and must be ignored
    m = t([[1, 1, 1], [1, 1, 0]])
    close(discounted_returns(r, m, gamma=0.5), [[0.25, 0.5, 1], [1, 2, 0]])


def test_reinforce_pp_whitens_over_the_batch():
    r = t([[0, 0, 1], [0, 2, 0]])
    m = t([[1, 1, 1], [1, 1, 0]])
    adv = reinforce_pp_advantages(r, m, gamma=0.5)
    # returns on valid tokens: 0.25, 0.5, 1, 1, 2 -> mean = 4.75 / 5 = 0.95
    # var = (0.7^2 + 0.45^2 + 0.05^2 + 0.05^2 + 1.05^2) / 5
    #     = (0.49 + 0.2025 + 0.0025 + 0.0025 + 1.1025) / 5 = 1.8 / 5 = 0.36
    sd = math.sqrt(0.36 + 1e-8)
    expected = [
        [(0.25 - 0.95) / sd, (0.5 - 0.95) / sd, (1 - 0.95) / sd],
        [(1 - 0.95) / sd, (2 - 0.95) / sd, 0],
    ]
    close(adv, expected)


def test_reinforce_pp_bad_gamma():
    with pytest.raises(ValueError, match="gamma must be in"):
        reinforce_pp_advantages(torch.zeros(1, 2), torch.ones(1, 2), gamma=1.5)


def test_outcome_to_token_rewards():
    mask = t([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    out = outcome_to_token_rewards(t([1, 2, 3]), mask)
    close(out, [[0, 1, 0], [0, 0, 2], [0, 0, 0]])


# ---------------------------------------------------------------- GAE (time-major)


def test_gae_with_episode_end():
    # env 0: r = [1, 1, 1], V = [0.5, 0.5, 0.5], done at t=1, V(s_T) = 2, gamma .9, lam .8
    #   t=2: delta = 1 + 0.9 * 2 - 0.5 = 2.3;           A2 = 2.3
    #   t=1: done -> delta = 1 - 0.5 = 0.5;             A1 = 0.5 (trace cut)
    #   t=0: delta = 1 + 0.9 * 0.5 - 0.5 = 0.95;        A0 = 0.95 + 0.9 * 0.8 * 0.5 = 1.31
    # env 1: r = [0, 0, 1], V = 0, no dones, V(s_T) = 0
    #   delta = [0, 0, 1]; A2 = 1, A1 = 0.72, A0 = 0.72^2 = 0.5184
    rewards = t([[1, 0], [1, 0], [1, 1]])
    values = t([[0.5, 0], [0.5, 0], [0.5, 0]])
    dones = t([[0, 0], [1, 0], [0, 0]])
    adv, ret = gae(rewards, values, dones, t([2, 0]), gamma=0.9, lam=0.8)
    close(adv, [[1.31, 0.5184], [0.5, 0.72], [2.3, 1.0]])
    close(ret, [[1.81, 0.5184], [1.0, 0.72], [2.8, 1.0]])


def test_gae_lambda_one_is_monte_carlo_minus_value():
    # gamma = lam = 1, no dones: A_t = sum_{k>=t} r_k + V(s_T) - V_t
    # r = [1, 2, 3], V = [1, 1, 1], V(s_T) = 10 -> returns [16, 15, 13]
    adv, ret = gae(t([[1], [2], [3]]), t([[1], [1], [1]]), torch.zeros(3, 1), t([10]), 1.0, 1.0)
    close(ret, [[16], [15], [13]])
    close(adv, [[15], [14], [12]])


def test_gae_lambda_zero_is_one_step_td():
    # lam = 0: A_t = r_t + gamma V_{t+1} - V_t; r = [1, 1], V = [2, 3], V(s_T) = 4, gamma .5
    #   A0 = 1 + 0.5 * 3 - 2 = 0.5; A1 = 1 + 0.5 * 4 - 3 = 0
    adv, _ = gae(t([[1], [1]]), t([[2], [3]]), torch.zeros(2, 1), t([4]), 0.5, 0.0)
    close(adv, [[0.5], [0.0]])


def test_gae_shape_errors():
    with pytest.raises(ValueError, match=r"must all be \[T, N\]"):
        gae(torch.zeros(3, 2), torch.zeros(3, 1), torch.zeros(3, 2), torch.zeros(2), 0.9, 0.9)
    with pytest.raises(ValueError, match=r"last_value must be \[N\]"):
        gae(torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(3), 0.9, 0.9)
    with pytest.raises(ValueError, match="lam=1.5"):
        gae(torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(2), 0.9, 1.5)


# ---------------------------------------------------------------- GAE (token-level)


def test_gae_tokens_terminal_after_last_token():
    # r = [0, 0, 1, pad], V = [0.1, 0.2, 0.3, pad], gamma = lam = 1:
    #   A_t = sum r - V_t -> [0.9, 0.8, 0.7, 0]; returns = [1, 1, 1, 0]
    r = t([[0, 0, 1, 0]])
    v = t([[0.1, 0.2, 0.3, 9.0]])
    m = t([[1, 1, 1, 0]])
    adv, ret = gae_tokens(r, v, m, gamma=1.0, lam=1.0)
    close(adv, [[0.9, 0.8, 0.7, 0]])
    close(ret, [[1, 1, 1, 0]])


def test_gae_tokens_lambda_half():
    # gamma 1, lam 0.5, r = [0, 0, 1], V = [0.1, 0.2, 0.3]
    #   A2 = 1 - 0.3 = 0.7
    #   A1 = (0 + 0.3 - 0.2) + 0.5 * 0.7 = 0.1 + 0.35 = 0.45
    #   A0 = (0 + 0.2 - 0.1) + 0.5 * 0.45 = 0.1 + 0.225 = 0.325
    adv, _ = gae_tokens(t([[0, 0, 1]]), t([[0.1, 0.2, 0.3]]), t([[1, 1, 1]]), 1.0, 0.5)
    close(adv, [[0.325, 0.45, 0.7]])


def test_gae_tokens_bridges_masked_gap():
    # token 1 is masked (e.g. tool output): its reward 7 and value 5 are ignored and
    # token 0 links to token 2.  gamma = lam = 1, V = [0.1, -, 0.3], r = [0, -, 1]
    #   A2 = 1 - 0.3 = 0.7;  A0 = (0 + 0.3 - 0.1) + 0.7 = 0.9
    adv, ret = gae_tokens(t([[0, 7, 1]]), t([[0.1, 5, 0.3]]), t([[1, 0, 1]]), 1.0, 1.0)
    close(adv, [[0.9, 0, 0.7]])
    close(ret, [[1.0, 0, 1.0]])


def test_gae_tokens_matches_time_major_gae_for_full_rows():
    torch.manual_seed(0)
    r, v = torch.randn(3, 5, dtype=f64), torch.randn(3, 5, dtype=f64)
    adv_tok, _ = gae_tokens(r, v, torch.ones(3, 5), 0.97, 0.9)
    # time-major: episodes end at the last step (done), nothing to bootstrap
    dones = torch.zeros(5, 3, dtype=f64)
    dones[-1] = 1
    adv_tm, _ = gae(r.T, v.T, dones, torch.zeros(3, dtype=f64), 0.97, 0.9)
    close(adv_tok, adv_tm.T, tol=1e-12)
