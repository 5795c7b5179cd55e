"""Padding token lists into tensors and splitting batches into micro-batches.

Generation pads on the left (every row's next token sits in the last column); training and
log-prob recomputation pad on the right (positions then start at 0 without position ids).
Both give each real token the same position index, so the two paths see identical inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from loomrl.errors import ConfigError


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int, device=None, width: int | None = None):
    """Left-pad token lists (to ``width`` columns when given, else to the longest).

    Returns (input_ids [B, L] int64, attention_mask [B, L] int64, position_ids [B, L] int64),
    where position_ids count only real tokens (0 for padding).
    """
    width = max([len(s) for s in seqs] + [width or 0])
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, width - len(s) :] = torch.as_tensor(list(s), dtype=torch.long)
            mask[i, width - len(s) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), pos.to(device)


def distinct_rows(seqs: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[int]]:
    """(the distinct sequences in order of first appearance, each row's index among them)."""
    first: dict[tuple[int, ...], int] = {}
    source = [first.setdefault(tuple(s), len(first)) for s in seqs]
    return [list(k) for k in first], source


def right_pad(seqs: Sequence[Sequence[int]], pad_id: int, device=None):
    """Right-pad token lists to the longest: (ids [b, T] int64, mask [b, T] float32)."""
    width = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.float32)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
            mask[i, : len(s)] = 1.0
    return ids.to(device), mask.to(device)


def pack_prompt_response(
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    pad_id: int,
    device=None,
):
    """Concatenate prompt+response per row and right-pad.

    Returns (input_ids [b, L], attention_mask [b, L], gather_pos [b, T], response [b, T],
    response_mask [b, T] float32), T = longest response. ``gather_pos[i, t]`` is the position
    whose output predicts response token t of row i (len(prompt_i) + t - 1); padded entries
    point at position 0 and are masked.
    """
    for i, p in enumerate(prompt_ids):
        if len(p) == 0:
            raise ConfigError(
                f"prompt_ids[{i}] is empty; every prompt needs at least one token (e.g. BOS) "
                "so that the first response token has a position to be predicted from"
            )
    rows = [list(p) + list(r) for p, r in zip(prompt_ids, response_ids, strict=True)]
    ids, mask = right_pad(rows, pad_id)
    resp, rmask = right_pad(response_ids, pad_id)
    gather = torch.zeros(resp.shape, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids, strict=True)):
        gather[i, : len(r)] = torch.arange(len(p) - 1, len(p) - 1 + len(r))
    return (
        ids.to(device),
        mask.long().to(device),
        gather.to(device),
        resp.to(device),
        rmask.to(device),
    )


def plan_micro_batches(
    lengths: Sequence[int],
    micro_batch_size: int | None = None,
    micro_batch_tokens: int | None = None,
    groups: Sequence[Sequence[Any]] | None = None,
) -> list[list[int]]:
    """Group sample indices into micro-batches of similar length to reduce padding.

    Indices are sorted by length (longest first, ties by index, so the plan is deterministic)
    and cut greedily: a micro-batch closes when it holds ``micro_batch_size`` rows, or when
    adding a row would make rows * longest_length exceed ``micro_batch_tokens``. A single row
    longer than the token budget still forms its own micro-batch.

    ``groups`` (e.g. each row's prompt): when some rows share a group, rows are ordered by
    group first (in order of first appearance), then by length, so that rows sharing a prompt
    land in the same micro-batch and the prompt is computed once for them.
    """
    if micro_batch_size is not None and micro_batch_size < 1:
        raise ConfigError(f"micro_batch_size={micro_batch_size} must be >= 1")
    if micro_batch_tokens is not None and micro_batch_tokens < 1:
        raise ConfigError(f"micro_batch_tokens={micro_batch_tokens} must be >= 1")
    distinct, rank = distinct_rows(groups) if groups is not None else ([], [])
    if groups is not None and len(distinct) < len(lengths):
        order = sorted(range(len(lengths)), key=lambda i: (rank[i], -lengths[i], i))
    else:
        order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    plan: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current:
            longest = max(lengths[current[0]], lengths[i])
            full = micro_batch_size is not None and len(current) >= micro_batch_size
            over = (
                micro_batch_tokens is not None and (len(current) + 1) * longest > micro_batch_tokens
            )
            if full or over:
                plan.append(current)
                current = []
        current.append(i)
    if current:
        plan.append(current)
    return plan


def slice_batch(
    batch: dict[str, Any],
    indices: Sequence[int],
    t_max: int,
    device=None,
) -> dict[str, Any]:
    """Select rows ``indices`` of a training batch and lay per-token fields out as [b, t_max].

    Field kinds, recognised by shape:
      * ``prompt_ids``/``response_ids``: lists of token lists (copied as lists);
      * per-token: a list of 1-D sequences/tensors with one value per response token, or a
        2-D tensor [B, >= t_max] right-padded along the response -> float tensor [b, t_max],
        zero where padded;
      * per-sequence: a 1-D tensor or a list of numbers -> tensor [b];
      * anything else (strings, dicts) -> list of the selected items.
    """
    out: dict[str, Any] = {}
    responses = batch["response_ids"]
    n_rows = len(responses)
    for key, value in batch.items():
        if key in ("prompt_ids", "response_ids"):
            out[key] = [list(value[i]) for i in indices]
            continue
        if isinstance(value, torch.Tensor):
            if value.shape[0] != n_rows:
                raise ConfigError(
                    f"batch[{key!r}] has {value.shape[0]} rows but there are {n_rows} responses"
                )
            if value.dim() == 1:
                out[key] = value[list(indices)].to(device)
            else:
                sel = value[list(indices)]
                if sel.shape[1] < t_max:
                    pad = torch.zeros((sel.shape[0], t_max - sel.shape[1]), dtype=sel.dtype)
                    sel = torch.cat([sel, pad], dim=1)
                out[key] = sel[:, :t_max].to(device)
            continue
        if isinstance(value, (list, tuple)):
            if len(value) != n_rows:
                raise ConfigError(
                    f"batch[{key!r}] has {len(value)} items but there are {n_rows} responses"
                )
            first = value[0] if value else None
            if isinstance(first, (int, float, bool)):
                out[key] = torch.as_tensor([value[i] for i in indices], dtype=torch.float32).to(
                    device
                )
            elif isinstance(first, (list, tuple, torch.Tensor)):
                rows = []
                for i in indices:
                    row = torch.as_tensor(value[i], dtype=torch.float32).reshape(-1)
                    if row.numel() != len(responses[i]):
                        raise ConfigError(
                            f"batch[{key!r}][{i}] has {row.numel()} values but response {i} has "
                            f"{len(responses[i])} tokens; per-token fields need one value per token"
                        )
                    rows.append(row)
                dense = torch.zeros((len(indices), t_max), dtype=torch.float32)
                for j, row in enumerate(rows):
                    dense[j, : row.numel()] = row
                out[key] = dense.to(device)
            else:
                out[key] = [value[i] for i in indices]
            continue
        out[key] = value
    return out
