"""Advantage estimators: group-relative (GRPO, RLOO), REINFORCE++ and GAE.

Pure functions of tensors; nothing here knows about models, workers or configs.
Outcome-reward estimators (GRPO, RLOO) take one scalar reward per sample and
assume the batch is laid out group by group: samples ``[g*G, (g+1)*G)`` are the
G responses to prompt g. Token-level estimators take [B, T] tensors with a
response mask.
"""

from __future__ import annotations

import torch
from torch import Tensor

from loomrl.algos.masked import masked_whiten


def _check_groups(rewards: Tensor, group_size: int, fn: str) -> int:
    if rewards.dim() != 1:
        raise ValueError(
            f"{fn}: rewards must be a 1-D tensor [B] (one scalar per response); "
            f"got shape {tuple(rewards.shape)}"
        )
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"{fn}: group_size must be a positive int; got {group_size!r}")
    batch = rewards.shape[0]
    if batch % group_size != 0:
        raise ValueError(
            f"{fn}: batch size {batch} is not divisible by group_size {group_size}; "
            "the batch must hold whole groups (number of prompts x responses per prompt)"
        )
    if not bool(torch.isfinite(rewards).all()):
        bad = torch.nonzero(~torch.isfinite(rewards)).flatten()[:5].tolist()
        raise ValueError(
            f"{fn}: rewards contain NaN/inf at indices {bad}; fix the reward function "
            "(a malformed response should score 0, not NaN)"
        )
    return batch // group_size


def _as_groups(rewards: Tensor, num_groups: int, group_size: int) -> tuple[Tensor, torch.dtype]:
    """Rewards as [num_groups, group_size] in float64, and the dtype the result goes back to.

    Finite float32 rewards near the top of the range (3e38) overflow a float32 group sum or
    mean to inf, so the arithmetic runs in float64 (MPS has none: float32 there).
    """
    out = torch.promote_types(rewards.dtype, torch.float32)
    work = torch.float32 if rewards.device.type == "mps" else torch.float64
    return rewards.to(work).view(num_groups, group_size), out


def _back(advantages: Tensor, dtype: torch.dtype, fn: str) -> Tensor:
    out = advantages.reshape(-1).to(dtype)
    if not bool(torch.isfinite(out).all()):
        raise ValueError(
            f"{fn}: advantages overflow {dtype} (rewards differ by more than the dtype can "
            "hold); scale the rewards down, e.g. divide them by their largest magnitude"
        )
    return out


def grpo_advantages(
    rewards: Tensor, group_size: int, scale_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """Group-normalised advantages. rewards: [B] -> [B], B = num_groups * group_size.

    ``A_i = (r_i - mean_g) / (std_g + eps)`` with the group's sample standard deviation
    (Bessel-corrected, n - 1), or ``A_i = r_i - mean_g`` when ``scale_std`` is False
    (Dr. GRPO: dividing by std over-weights groups that are almost solved or failed).
    A group whose rewards are all equal gets exactly zero advantage (no signal), never
    NaN, whatever ``eps``; so does any group of size 1.
    """
    num_groups = _check_groups(rewards, group_size, "grpo_advantages")
    r, dtype = _as_groups(rewards, num_groups, group_size)
    centred = r - r.mean(dim=1, keepdim=True)
    # A group of equal rewards carries no signal. Its mean can still differ from the
    # rewards in the last bit (0.1 * 3 / 3 != 0.1), and dividing that rounding error
    # by a std that is just as tiny would give +-1; zero such groups exactly.
    flat = r.amax(dim=1, keepdim=True) == r.amin(dim=1, keepdim=True)
    if scale_std and group_size > 1:
        if eps < 0:
            raise ValueError(f"grpo_advantages: eps must be >= 0; got {eps}")
        centred = centred / (r.std(dim=1, keepdim=True, unbiased=True) + eps)
    centred = torch.where(flat, torch.zeros_like(centred), centred)
    return _back(centred, dtype, "grpo_advantages")


def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """REINFORCE leave-one-out advantages. rewards: [B] -> [B].

    ``A_i = r_i - mean_{j != i} r_j = (G * r_i - sum_g) / (G - 1)``: the baseline of
    each sample is the mean of the other samples of its group, so it is unbiased.
    Needs group_size >= 2.
    """
    num_groups = _check_groups(rewards, group_size, "rloo_advantages")
    if group_size < 2:
        raise ValueError(
            f"rloo_advantages: group_size must be >= 2 (the baseline is the mean of the "
            f"other responses of the group); got {group_size}"
        )
    r, dtype = _as_groups(rewards, num_groups, group_size)
    total = r.sum(dim=1, keepdim=True)
    return _back((group_size * r - total) / (group_size - 1), dtype, "rloo_advantages")


def discounted_returns(token_rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """Reward-to-go per token. token_rewards, mask: [B, T] -> [B, T].

    ``G_t = r_t + gamma * G_{t+1}`` over valid tokens; padding positions are skipped
    (they neither add reward nor count as a discount step) and are 0 in the output.
    """
    if token_rewards.shape != mask.shape or token_rewards.dim() != 2:
        raise ValueError(
            "discounted_returns: token_rewards and mask must both be [B, T]; got "
            f"{tuple(token_rewards.shape)} and {tuple(mask.shape)}"
        )
    m = mask.to(token_rewards.dtype)
    out = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in range(token_rewards.shape[1] - 1, -1, -1):
        step = token_rewards[:, t] + gamma * running
        running = m[:, t] * step + (1.0 - m[:, t]) * running
        out[:, t] = m[:, t] * step
    return out


def reinforce_pp_advantages(token_rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """REINFORCE++ advantages. token_rewards, mask: [B, T] -> [B, T].

    Discounted reward-to-go per token (any per-token KL penalty should already be
    folded into ``token_rewards``, see ``kl_shaped_rewards``), then whitened over all
    valid tokens of the batch (global, not per group). Padding is 0.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"reinforce_pp_advantages: gamma must be in [0, 1]; got {gamma}")
    returns = discounted_returns(token_rewards, mask, gamma)
    return masked_whiten(returns, mask)


def gae(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    last_value: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation, time-major. rewards, values, dones: [T, N]; last_value: [N].

    Returns ``(advantages [T, N], returns [T, N])`` with ``returns = advantages + values``.
    ``dones[t] = 1`` means the episode ended at step t: the value of step t+1 belongs to
    a new episode and is not bootstrapped, and the GAE trace is cut there.
    ``last_value`` is V(s_T), the value of the observation after the last step.

        delta_t = r_t + gamma * V_{t+1} * (1 - d_t) - V_t
        A_t     = delta_t + gamma * lam * (1 - d_t) * A_{t+1}
    """
    if rewards.dim() != 2 or values.shape != rewards.shape or dones.shape != rewards.shape:
        raise ValueError(
            "gae: rewards, values and dones must all be [T, N]; got "
            f"{tuple(rewards.shape)}, {tuple(values.shape)}, {tuple(dones.shape)}"
        )
    if last_value.shape != rewards.shape[1:]:
        raise ValueError(
            f"gae: last_value must be [N] = {tuple(rewards.shape[1:])}; got {tuple(last_value.shape)}"
        )
    _check_gamma_lam("gae", gamma, lam)
    not_done = 1.0 - dones.to(values.dtype)
    adv = torch.zeros_like(values)
    next_value = last_value.to(values.dtype)
    next_adv = torch.zeros_like(next_value)
    for t in range(rewards.shape[0] - 1, -1, -1):
        delta = rewards[t] + gamma * next_value * not_done[t] - values[t]
        next_adv = delta + gamma * lam * not_done[t] * next_adv
        adv[t] = next_adv
        next_value = values[t]
    return adv, adv + values


def gae_tokens(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Token-level GAE for language-model PPO. rewards, values, mask: [B, T].

    Returns ``(advantages [B, T], returns [B, T])``, zero on padding. Each row is one
    episode; the step after the last valid token is terminal (value 0). Masked-out
    positions inside a row (e.g. tool output spliced into a response) are skipped:
    the recursion links each valid token to the next valid one.
    """
    if rewards.dim() != 2 or values.shape != rewards.shape or mask.shape != rewards.shape:
        raise ValueError(
            "gae_tokens: rewards, values and mask must all be [B, T]; got "
            f"{tuple(rewards.shape)}, {tuple(values.shape)}, {tuple(mask.shape)}"
        )
    _check_gamma_lam("gae_tokens", gamma, lam)
    m = mask.to(values.dtype)
    adv = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(next_value)
    for t in range(rewards.shape[1] - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * next_adv
        valid = m[:, t]
        adv[:, t] = valid * a
        # Carry the state through padding so the next valid token links across the gap.
        next_adv = valid * a + (1.0 - valid) * next_adv
        next_value = valid * values[:, t] + (1.0 - valid) * next_value
    returns = (adv + values) * m
    return adv, returns


def _check_gamma_lam(fn: str, gamma: float, lam: float) -> None:
    problems = []
    if not 0.0 <= gamma <= 1.0:
        problems.append(f"gamma={gamma}")
    if not 0.0 <= lam <= 1.0:
        problems.append(f"lam={lam}")
    if problems:
        raise ValueError(f"{fn}: {', '.join(problems)} out of range; both must be in [0, 1]")


def outcome_to_token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """Place each sequence's scalar reward on its last valid token. rewards: [B]; mask: [B, T] -> [B, T].

    Used to feed outcome rewards to token-level estimators (REINFORCE++, GAE).
    Rows with no valid token get no reward.
    """
    if rewards.dim() != 1 or mask.dim() != 2 or rewards.shape[0] != mask.shape[0]:
        raise ValueError(
            "outcome_to_token_rewards: rewards must be [B] and mask [B, T]; got "
            f"{tuple(rewards.shape)} and {tuple(mask.shape)}"
        )
    m = mask.to(torch.bool)
    t_idx = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(m, t_idx, torch.full_like(t_idx, -1)).max(dim=1).values
    out = torch.zeros(
        mask.shape, dtype=torch.promote_types(rewards.dtype, torch.float32), device=mask.device
    )
    rows = torch.nonzero(last >= 0).flatten()
    out[rows, last[rows]] = rewards[rows].to(out.dtype)
    return out
