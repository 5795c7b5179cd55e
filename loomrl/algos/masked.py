"""Masked reductions over padded token batches.

Every function takes a ``mask`` of the same shape as ``x`` whose ones mark the
positions that count (response tokens) and zeros the padding. Masks may be bool,
int or float; they are converted to ``x``'s dtype. Reductions over an empty mask
return 0 rather than NaN: a micro-batch with no response tokens must not poison
the gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def loss_scale_for(agg: str) -> str:
    """How a trainer combines micro-batch losses aggregated with ``agg`` (``train_step``'s
    ``loss_scale``) so that the batch's loss is the one ``agg`` names whatever the split: by
    their share of tokens for token-mean, of sequences for the sequence means (weighted by
    tokens, a sequence mean over micro-batches of one sequence each became a token mean)."""
    _check_agg(agg)
    return "tokens" if agg == "token-mean" else "sequences"


def _check_agg(mode: str) -> None:
    if mode not in AGG_MODES:
        raise ValueError(
            f"agg={mode!r} is not a known aggregation mode; use one of {list(AGG_MODES)}"
        )


def _check_same_shape(x: Tensor, mask: Tensor, fn: str) -> Tensor:
    if x.shape != mask.shape:
        raise ValueError(
            f"{fn}: x has shape {tuple(x.shape)} but mask has shape {tuple(mask.shape)}; "
            "they must match (pass the response mask of the same batch)"
        )
    return mask.to(dtype=x.dtype)


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` where ``mask`` is set. x, mask: [...]; returns a scalar, or x reduced over ``dim``."""
    m = _check_same_shape(x, mask, "masked_sum")
    # where() rather than x * m: padding may hold inf/NaN (e.g. log-probs of pad tokens).
    xm = torch.where(m > 0, x, torch.zeros_like(x)) * m
    return xm.sum() if dim is None else xm.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over masked positions. x, mask: [...]; scalar, or reduced over ``dim``.

    An empty mask (or an all-masked row when ``dim`` is given) yields 0.
    """
    m = _check_same_shape(x, mask, "masked_mean")
    count = m.sum() if dim is None else m.sum(dim=dim)
    return masked_sum(x, m, dim) / count.clamp(min=1.0)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = False) -> Tensor:
    """Variance of ``x`` over all masked positions (scalar). x, mask: [...].

    ``unbiased`` applies Bessel's correction (n - 1); with a single valid element it
    returns 0 instead of dividing by zero.
    """
    m = _check_same_shape(x, mask, "masked_var")
    mean = masked_mean(x, m)
    n = m.sum()
    sq = masked_sum((x - mean) ** 2, m)
    denom = (n - 1.0) if unbiased else n
    return sq / denom.clamp(min=1.0)


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Normalise ``x`` to zero mean and unit variance over masked positions. x, mask: [...] -> [...].

    Uses the population variance: ``(x - mean) / sqrt(var + eps)``. With
    ``shift_mean=False`` the mean is added back (only the scale changes). Padding
    positions are set to 0 in the output.
    """
    m = _check_same_shape(x, mask, "masked_whiten")
    mean = masked_mean(x, m)
    var = masked_var(x, m)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(m > 0, out, torch.zeros_like(out))


def aggregate(x: Tensor, mask: Tensor, mode: str = "token-mean") -> Tensor:
    """Reduce a per-token loss to a scalar. x, mask: [B, T] (or [T], treated as one sequence) -> [].

    Modes:
      - ``token-mean``: sum over all valid tokens / number of valid tokens. Every token
        weighs the same, so long responses weigh more (DAPO's choice).
      - ``seq-mean-token-mean``: mean over each sequence's valid tokens, then mean over
        sequences (GRPO paper). Every sequence weighs the same.
      - ``seq-mean-token-sum``: sum over each sequence's tokens, then mean over sequences
        (unnormalised by length, as in Dr. GRPO when divided by a constant).

    Sequences without any valid token are left out of the sequence means; if no token
    is valid at all the result is 0.
    """
    _check_agg(mode)
    m = _check_same_shape(x, mask, "aggregate")
    if mode == "token-mean":
        return masked_mean(x, m)
    if x.dim() == 1:
        x, m = x.unsqueeze(0), m.unsqueeze(0)
    if x.dim() != 2:
        raise ValueError(
            f"aggregate(mode={mode!r}) needs x of shape [B, T]; got {tuple(x.shape)}. "
            "Flatten the leading dimensions first or use mode='token-mean'."
        )
    per_seq = masked_sum(x, m, dim=-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / m.sum(dim=-1).clamp(min=1.0)
    has_tokens = (m.sum(dim=-1) > 0).to(x.dtype)
    return (per_seq * has_tokens).sum() / has_tokens.sum().clamp(min=1.0)
