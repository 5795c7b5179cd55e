"""Loss terms and masked reductions against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from loomrl.algos import (
    aggregate,
    entropy_from_logits,
    kl_loss,
    kl_penalty,
    kl_shaped_rewards,
    logprobs_from_logits,
    masked_mean,
    masked_var,
    masked_whiten,
    ppo_policy_loss,
    value_loss,
)
from loomrl.algos.losses import aggregate as aggregate_from_losses

f64 = torch.float64


def t(x):
    return torch.tensor(x, dtype=f64)


def close(a, b, tol=1e-6):
    b = b if isinstance(b, torch.Tensor) else t(b)
    torch.testing.assert_close(a, b, atol=tol, rtol=0)


# ---------------------------------------------------------------- masked helpers


def test_aggregate_modes():
    x = t([[1, 2, 3], [4, 5, 6]])
    m = t([[1, 1, 0], [1, 0, 0]])
    close(aggregate(x, m, "token-mean"), 7 / 3)  # (1 + 2 + 4) / 3
    close(aggregate(x, m, "seq-mean-token-mean"), 2.75)  # ((1 + 2) / 2 + 4 / 1) / 2
    close(aggregate(x, m, "seq-mean-token-sum"), 3.5)  # ((1 + 2) + 4) / 2
    assert aggregate_from_losses is aggregate


def test_aggregate_skips_empty_rows_and_empty_mask_is_zero():
    x = t([[1, 3], [100, 100]])
    m = t([[1, 1], [0, 0]])
    close(aggregate(x, m, "seq-mean-token-mean"), 2.0)  # only row 0: (1 + 3) / 2
    close(aggregate(x, m, "seq-mean-token-sum"), 4.0)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        out = aggregate(x, torch.zeros_like(m), mode)
        assert out.item() == 0.0


def test_aggregate_ignores_nan_on_padding():
    x = t([[1.0, float("nan")], [float("-inf"), 2.0]])
    m = t([[1, 0], [0, 1]])
    close(aggregate(x, m), 1.5)


def test_aggregate_errors():
    with pytest.raises(ValueError, match="agg='mean' is not a known aggregation mode"):
        aggregate(torch.zeros(2, 2), torch.ones(2, 2), "mean")
    with pytest.raises(ValueError, match=r"x has shape \(2, 2\) but mask has shape \(2, 3\)"):
        aggregate(torch.zeros(2, 2), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"needs x of shape \[B, T\]"):
        aggregate(torch.zeros(2, 2, 2), torch.ones(2, 2, 2), "seq-mean-token-sum")


def test_masked_mean_var_whiten():
    x = t([1, 2, 3, 100])
    m = t([1, 1, 1, 0])
    close(masked_mean(x, m), 2.0)
    close(masked_var(x, m), 2 / 3)  # ((-1)^2 + 0 + 1^2) / 3
    close(masked_var(x, m, unbiased=True), 1.0)  # 2 / (3 - 1)
    sd = math.sqrt(2 / 3 + 1e-8)
    close(masked_whiten(x, m), [-1 / sd, 0, 1 / sd, 0])
    close(masked_whiten(x, m, shift_mean=False), [-1 / sd + 2, 2, 1 / sd + 2, 0])
    close(masked_mean(t([[1, 2], [3, 4]]), t([[1, 1], [0, 0]]), dim=1), [1.5, 0])


def test_bool_mask_accepted():
    x = t([1, 5])
    close(masked_mean(x, torch.tensor([True, False])), 1.0)


# ---------------------------------------------------------------- PPO policy loss


def _ppo_inputs():
    # ratios r = [1.5, 0.5, 1.1, 3.0] (old_logp = 0, logp = log r), A = [1, 1, -1, -2]
    logp = torch.log(t([1.5, 0.5, 1.1, 3.0])).requires_grad_(True)
    return logp, torch.zeros(4, dtype=f64), t([1, 1, -1, -2]), torch.ones(4, dtype=f64)


def test_ppo_symmetric_clip():
    logp, old, adv, m = _ppo_inputs()
    loss, stats = ppo_policy_loss(logp, old, adv, m, clip_low=0.2, clip_high=0.2)
    # tok0: max(-1.5, -1.2) = -1.2 (clipped)   tok1: max(-0.5, -0.8) = -0.5
    # tok2: max(1.1, 1.1) = 1.1                 tok3: max(6.0, 2.4) = 6.0
    # mean = (-1.2 - 0.5 + 1.1 + 6.0) / 4 = 5.4 / 4 = 1.35
    close(loss, 1.35)
    assert stats["clip_frac"] == pytest.approx(0.25, abs=1e-12)
    assert stats["dual_clip_frac"] == 0.0
    assert stats["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1 + 3.0) / 4, abs=1e-9)
    assert stats["ratio_max"] == pytest.approx(3.0, abs=1e-9)
    # d loss / d logp = -A * ratio / 4 where unclipped, 0 where clipped
    loss.backward()
    close(logp.grad, [0.0, -0.5 / 4, 1.1 / 4, 6.0 / 4])


def test_ppo_stats_left_on_the_device_are_the_same_numbers():
    logp, old, adv, m = _ppo_inputs()
    _, read = ppo_policy_loss(logp, old, adv, m, dual_clip=2.5)
    _, unread = ppo_policy_loss(logp, old, adv, m, dual_clip=2.5, sync_stats=False)
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in unread.values())
    assert {k: v.item() for k, v in unread.items()} == read
    # No valid token: every stat is 0, ratio_max included, without asking whether any is.
    _, empty = ppo_policy_loss(logp, old, adv, torch.zeros(4, dtype=f64), sync_stats=False)
    assert {k: v.item() for k, v in empty.items()} == dict.fromkeys(read, 0.0)
    z = torch.zeros(0, dtype=f64)  # and no token at all
    assert ppo_policy_loss(z, z, z, z)[1] == dict.fromkeys(read, 0.0)


def test_ppo_clip_higher():
    logp, old, adv, m = _ppo_inputs()
    loss, _ = ppo_policy_loss(logp, old, adv, m, clip_low=0.2, clip_high=0.28)
    # tok0 now max(-1.5, -1.28) = -1.28 -> (-1.28 - 0.5 + 1.1 + 6.0) / 4 = 5.32 / 4 = 1.33
    close(loss, 1.33)
    # a low ratio with A < 0 is clipped by clip_low: r = 0.5, A = -1 -> max(0.5, 0.8) = 0.8
    loss2, stats2 = ppo_policy_loss(
        torch.log(t([0.5])), t([0.0]), t([-1.0]), t([1.0]), clip_low=0.2, clip_high=0.28
    )
    close(loss2, 0.8)
    assert stats2["clip_frac"] == 1.0


def test_ppo_dual_clip_bounds_negative_advantage_tokens():
    logp, old, adv, m = _ppo_inputs()
    loss, stats = ppo_policy_loss(logp, old, adv, m, dual_clip=2.5)
    # tok3: A = -2, loss 6.0 > bound -A * c = 2 * 2.5 = 5 -> 5
    # mean = (-1.2 - 0.5 + 1.1 + 5.0) / 4 = 4.4 / 4 = 1.1
    close(loss, 1.1)
    assert stats["dual_clip_frac"] == pytest.approx(0.25, abs=1e-12)
    loss.backward()
    close(logp.grad, [0.0, -0.5 / 4, 1.1 / 4, 0.0])
    # a bound above the loss changes nothing: c = 3.5 -> bound 7 > 6, not active
    loss3, stats3 = ppo_policy_loss(logp.detach(), old, adv, m, dual_clip=3.5)
    close(loss3, 1.35)
    assert stats3["dual_clip_frac"] == 0.0


def test_ppo_aggregation_and_mask():
    # two sequences: [tok0, tok1 | pad] and [tok2 | pad pad] with the values above
    logp = torch.log(t([[1.5, 0.5, 1.0], [1.1, 1.0, 1.0]]))
    adv = t([[1, 1, 50], [-1, 50, 50]])
    m = t([[1, 1, 0], [1, 0, 0]])
    old = torch.zeros(2, 3, dtype=f64)
    # per token: [-1.2, -0.5 | x] and [1.1 | x x]
    close(ppo_policy_loss(logp, old, adv, m, agg="token-mean")[0], (-1.2 - 0.5 + 1.1) / 3)
    close(ppo_policy_loss(logp, old, adv, m, agg="seq-mean-token-mean")[0], ((-1.7) / 2 + 1.1) / 2)
    close(ppo_policy_loss(logp, old, adv, m, agg="seq-mean-token-sum")[0], (-1.7 + 1.1) / 2)


def test_ppo_on_policy_is_minus_mean_advantage():
    adv = t([0.3, -1.2, 2.0])
    logp = t([-1.0, -2.0, -0.5])
    loss, stats = ppo_policy_loss(logp, logp.clone(), adv, torch.ones(3))
    close(loss, -(0.3 - 1.2 + 2.0) / 3)
    assert stats["clip_frac"] == 0.0 and stats["approx_kl"] == 0.0


def test_ppo_huge_log_ratio_stays_finite():
    loss, stats = ppo_policy_loss(t([500.0]), t([0.0]), t([-1.0]), t([1.0]), dual_clip=3.0)
    assert torch.isfinite(loss) and loss.item() == pytest.approx(3.0)
    assert math.isfinite(stats["ratio_max"])


def test_ppo_argument_errors_listed_together():
    z = torch.zeros(2)
    with pytest.raises(
        ValueError, match=r"clip_low=1.0 must be in \[0, 1\).*dual_clip=0.5 must be > 1"
    ):
        ppo_policy_loss(z, z, z, z, clip_low=1.0, dual_clip=0.5)
    with pytest.raises(ValueError, match="agg='sum' must be one of"):
        ppo_policy_loss(z, z, z, z, agg="sum")
    with pytest.raises(ValueError, match=r"advantages=\(3,\)"):
        ppo_policy_loss(z, z, torch.zeros(3), z)


# ---------------------------------------------------------------- value loss


def test_value_loss_clipped():
    # tok0: (1 - 2)^2 = 1; V_clip = 0.5 + clip(0.5, +-0.2) = 0.7 -> (0.7 - 2)^2 = 1.69 -> 1.69
    # tok1: (2 - 1)^2 = 1; V_clip = 2 + 0 = 2 -> 1 -> 1
    # 0.5 * (1.69 + 1) / 2 = 0.6725
    v, old, ret, m = t([1.0, 2.0]), t([0.5, 2.0]), t([2.0, 1.0]), t([1, 1])
    close(value_loss(v, old, ret, m, clip=0.2), 0.6725)
    close(value_loss(v, old, ret, m, clip=None), 0.5)  # 0.5 * (1 + 1) / 2
    close(value_loss(v, old, ret, t([0, 1]), clip=0.2), 0.5)  # only tok1: 0.5 * 1


def test_value_loss_errors():
    z = torch.zeros(2)
    with pytest.raises(ValueError, match="clip=0 must be > 0"):
        value_loss(z, z, z, z, clip=0)


# ---------------------------------------------------------------- KL, entropy, log-probs


def test_kl_estimators():
    # pi(token) = 0.5, pi_ref(token) = 0.25 -> d = log(0.25 / 0.5) = -log 2
    logp, ref = torch.log(t([0.5])), torch.log(t([0.25]))
    ln2 = math.log(2)
    close(kl_penalty(logp, ref, "k1"), [ln2])
    close(kl_penalty(logp, ref, "k2"), [0.5 * ln2**2])
    close(kl_penalty(logp, ref, "k3"), [0.5 + ln2 - 1])  # exp(-ln2) - (-ln2) - 1
    with pytest.raises(ValueError, match="kind='k4' is not known"):
        kl_penalty(logp, ref, "k4")


def test_k3_is_nonnegative_and_zero_on_policy():
    x = torch.linspace(-5, 5, 11, dtype=f64)
    assert (kl_penalty(x, torch.zeros_like(x), "k3") >= 0).all()
    assert kl_penalty(x, x, "k3").abs().max().item() == 0.0


def test_kl_loss_and_reward_shaping():
    logp, ref = torch.log(t([[0.5, 0.5]])), torch.log(t([[0.25, 0.5]]))
    m = t([[1, 1]])
    close(kl_loss(logp, ref, m, "k1"), math.log(2) / 2)  # (ln2 + 0) / 2
    lp = logp.clone().requires_grad_(True)
    shaped = kl_shaped_rewards(t([[0.0, 1.0]]), lp, ref, m, coef=0.1)
    close(shaped, [[-0.1 * math.log(2), 1.0]])
    assert not shaped.requires_grad  # the penalty is a reward, not a gradient path
    close(
        kl_shaped_rewards(t([[0.0, 1.0]]), logp, ref, t([[1, 0]]), coef=0.1),
        [[-0.1 * math.log(2), 0]],
    )


def test_entropy_from_logits():
    close(entropy_from_logits(torch.zeros(4, dtype=f64)), math.log(4))  # uniform over 4
    # p = [0.75, 0.25]: H = -(0.75 ln 0.75 + 0.25 ln 0.25)
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    close(entropy_from_logits(torch.log(t([[0.75, 0.25]]))), [h])
    # shift invariance, large logits, and a banned (-inf) token contribute 0
    close(entropy_from_logits(torch.log(t([0.75, 0.25])) + 1000.0), h)
    close(entropy_from_logits(t([0.0, float("-inf")])), 0.0)
    assert entropy_from_logits(torch.zeros(2, 3, 5)).shape == (2, 3)


def test_logprobs_from_logits():
    logits = torch.log(t([[[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]]])) + 3.0  # unnormalised
    out = logprobs_from_logits(logits, torch.tensor([[2, 0]]))
    close(out, [[math.log(0.5), math.log(0.1)]])
    with pytest.raises(ValueError, match="plus a vocabulary dimension"):
        logprobs_from_logits(logits, torch.tensor([2, 0]))
