"""Policy, value, KL and entropy terms for policy-gradient training of language models.

Pure functions of tensors. Per-token inputs are [B, T] (any matching shapes work
for ``token-mean``) with a response mask whose zeros mark prompt and padding
tokens. Log-probabilities are of the sampled tokens under each policy.
"""

from __future__ import annotations

import torch
from torch import Tensor

from loomrl.algos.masked import AGG_MODES, aggregate, masked_mean

KL_KINDS = ("k1", "k2", "k3")

# exp() of a log-ratio beyond this overflows float16/bfloat16 and is meaningless anyway:
# such tokens are clipped by the PPO objective, so bounding the ratio changes no gradient.
_MAX_LOG_RATIO = 20.0


def _check_shapes(fn: str, **tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        listed = ", ".join(f"{n}={s}" for n, s in shapes.items())
        raise ValueError(f"{fn}: all inputs must have the same shape; got {listed}")


def ppo_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    sync_stats: bool = True,
) -> tuple[Tensor, dict[str, float] | dict[str, Tensor]]:
    """Clipped surrogate policy loss. logp, old_logp, advantages, mask: [B, T] -> (loss [], stats).

    Per token, with ``ratio = exp(logp - old_logp)``::

        loss_t = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))

    ``clip_high > clip_low`` is DAPO's clip-higher (more room to raise unlikely tokens).
    With ``dual_clip = c`` (c > 1), tokens with A < 0 are additionally bounded by
    ``-A * c`` so a huge ratio on a bad token cannot blow up the loss.
    The per-token loss is reduced with ``aggregate(..., agg)``.

    Stats (python floats, over valid tokens): ``clip_frac`` (tokens where the clipped
    branch is active), ``dual_clip_frac``, ``ratio_mean``, ``ratio_max`` and
    ``approx_kl`` (k3 estimate of KL(old || new)). ``sync_stats=False`` leaves them as
    detached 0-d tensors on the inputs' device: each float is a wait for the device, and a
    training loop that reads them once per update instead of once per minibatch keeps the
    device's queue full.
    """
    _check_shapes("ppo_policy_loss", logp=logp, old_logp=old_logp, advantages=advantages, mask=mask)
    problems = []
    if not 0.0 <= clip_low < 1.0:
        problems.append(f"clip_low={clip_low} must be in [0, 1)")
    if clip_high < 0.0:
        problems.append(f"clip_high={clip_high} must be >= 0")
    if dual_clip is not None and dual_clip <= 1.0:
        problems.append(f"dual_clip={dual_clip} must be > 1 (or None to disable)")
    if agg not in AGG_MODES:
        problems.append(f"agg={agg!r} must be one of {list(AGG_MODES)}")
    if problems:
        raise ValueError("ppo_policy_loss: " + "; ".join(problems))

    log_ratio = (logp - old_logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    clip_active = clipped > unclipped
    dual_active = torch.zeros_like(clip_active)
    if dual_clip is not None:
        bound = -advantages * dual_clip
        dual_active = (advantages < 0) & (per_token > bound)
        per_token = torch.where(dual_active, bound, per_token)

    loss = aggregate(per_token, mask, agg)
    with torch.no_grad():
        m = mask.to(torch.bool)
        fm = m.to(ratio.dtype)
        # 0 where no token is valid, without asking the device whether any is (ratios are > 0).
        ratio_max = (
            torch.where(m, ratio, torch.zeros_like(ratio)).max()
            if ratio.numel()
            else ratio.new_zeros(())
        )
        stats = {
            "clip_frac": masked_mean(clip_active.to(ratio.dtype), fm),
            "dual_clip_frac": masked_mean(dual_active.to(ratio.dtype), fm),
            "ratio_mean": masked_mean(ratio, fm),
            "ratio_max": ratio_max,
            "approx_kl": masked_mean(kl_penalty(old_logp, logp, "k3"), fm),
        }
        if sync_stats:
            stats = dict(zip(stats, torch.stack(list(stats.values())).tolist(), strict=True))
    return loss, stats


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None = 0.2,
    agg: str = "token-mean",
) -> Tensor:
    """Clipped value loss. values, old_values, returns, mask: [B, T] -> loss [].

    ``0.5 * max((V - R)^2, (V_clip - R)^2)`` with ``V_clip = V_old + clip(V - V_old, -clip, clip)``;
    ``clip=None`` gives the plain ``0.5 * (V - R)^2``. Reduced with ``aggregate(..., agg)``.
    """
    _check_shapes("value_loss", values=values, old_values=old_values, returns=returns, mask=mask)
    if clip is not None and clip <= 0:
        raise ValueError(f"value_loss: clip={clip} must be > 0 (or None to disable clipping)")
    err = (values - returns) ** 2
    if clip is not None:
        v_clipped = old_values + (values - old_values).clamp(-clip, clip)
        err = torch.maximum(err, (v_clipped - returns) ** 2)
    return aggregate(0.5 * err, mask, agg)


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str = "k1") -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled-token log-probs. [...] -> [...].

    With ``d = ref_logp - logp`` (tokens sampled from pi):
      - ``k1 = -d``: unbiased, can be negative; the usual choice as a reward penalty.
      - ``k2 = d^2 / 2``: biased, low variance.
      - ``k3 = exp(d) - d - 1``: unbiased and always >= 0; the usual choice as a loss
        (its gradient through ``logp`` is that of a KL).
    Detach the result before subtracting it from rewards.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"kl_penalty: kind={kind!r} is not known; use one of {list(KL_KINDS)}")
    _check_shapes("kl_penalty", logp=logp, ref_logp=ref_logp)
    d = (ref_logp - logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d * d
    return torch.exp(d) - d - 1.0


def kl_loss(
    logp: Tensor, ref_logp: Tensor, mask: Tensor, kind: str = "k3", agg: str = "token-mean"
) -> Tensor:
    """KL to the reference policy as a loss term. logp, ref_logp, mask: [B, T] -> loss []."""
    return aggregate(kl_penalty(logp, ref_logp, kind), mask, agg)


def kl_shaped_rewards(
    token_rewards: Tensor,
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    coef: float,
    kind: str = "k1",
) -> Tensor:
    """Subtract a KL penalty from per-token rewards. All inputs [B, T] -> [B, T].

    ``r'_t = r_t - coef * KL_t`` on valid tokens, 0 on padding. The penalty is
    detached: as a reward it shapes the advantage, it is not differentiated.
    """
    kl = kl_penalty(logp, ref_logp, kind).detach()
    _check_shapes("kl_shaped_rewards", token_rewards=token_rewards, kl=kl, mask=mask)
    m = mask.to(token_rewards.dtype)
    return (token_rewards - coef * kl) * m


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the categorical distribution given by ``logits``. [..., V] -> [...].

    ``H = logsumexp(z) - sum softmax(z) * z``, stable for large logits.
    """
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    probs = torch.softmax(logits, dim=-1)
    # where(): a -inf logit (banned token) has probability 0 and must contribute 0, not NaN.
    p_z = torch.where(probs > 0, probs * logits, torch.zeros_like(logits))
    return torch.logsumexp(logits, dim=-1) - p_z.sum(dim=-1)


def logprobs_from_logits(logits: Tensor, tokens: Tensor) -> Tensor:
    """Log-probabilities of ``tokens`` under ``logits``. logits: [..., V]; tokens: [...] -> [...].

    ``logits[..., t, :]`` must already be the distribution of ``tokens[..., t]`` (shift
    by one position before calling for a causal LM).
    """
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(
            f"logprobs_from_logits: logits {tuple(logits.shape)} must be tokens "
            f"{tuple(tokens.shape)} plus a vocabulary dimension"
        )
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    logz = torch.logsumexp(logits, dim=-1)
    picked = torch.gather(logits, -1, tokens.long().unsqueeze(-1)).squeeze(-1)
    return picked - logz
