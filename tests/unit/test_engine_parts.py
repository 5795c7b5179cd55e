"""Batching and sampling helpers of the engines, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from loomrl.engines.batching import left_pad, pack_prompt_response, plan_micro_batches, slice_batch
from loomrl.engines.sampling import (
    entropy_from_logits,
    filter_logits,
    sample_tokens,
    token_logprobs,
)
from loomrl.errors import ConfigError


def test_left_pad_positions_count_real_tokens():
    ids, mask, pos = left_pad([[5, 6, 7], [9]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 9]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert pos.tolist() == [[0, 1, 2], [0, 0, 0]]


def test_pack_prompt_response_gather_positions():
    ids, mask, gather, resp, rmask = pack_prompt_response([[1, 2], [3]], [[4, 5, 6], [7]], pad_id=0)
    assert ids.tolist() == [[1, 2, 4, 5, 6], [3, 7, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    # Response token t of row i is predicted at position len(prompt_i) + t - 1.
    assert gather.tolist() == [[1, 2, 3], [0, 0, 0]]
    assert resp.tolist() == [[4, 5, 6], [7, 0, 0]]
    assert rmask.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_pack_rejects_empty_prompt():
    with pytest.raises(ConfigError, match="prompt_ids\\[1\\] is empty"):
        pack_prompt_response([[1], []], [[2], [3]], pad_id=0)


def test_plan_micro_batches_sorts_and_cuts():
    lengths = [3, 10, 5, 10, 1]
    assert plan_micro_batches(lengths, micro_batch_size=2) == [[1, 3], [2, 0], [4]]
    # Token budget 20: two rows of 10 fit; 5+3+1 rows padded to 5 -> 3*5 = 15 fit.
    assert plan_micro_batches(lengths, micro_batch_tokens=20) == [[1, 3], [2, 0, 4]]
    # A row longer than the budget still forms its own micro-batch.
    assert plan_micro_batches([50, 2], micro_batch_tokens=10) == [[0], [1]]
    assert plan_micro_batches(lengths, micro_batch_size=8) == [[1, 3, 2, 0, 4]]
    with pytest.raises(ConfigError):
        plan_micro_batches(lengths, micro_batch_size=0)


def test_slice_batch_field_kinds():
    batch = {
        "prompt_ids": [[1], [2], [3]],
        "response_ids": [[4, 5], [6], [7, 8, 9]],
        "adv_tok": [[0.5, 0.25], [1.0], [2.0, 3.0, 4.0]],
        "adv_seq": [1.0, 2.0, 3.0],
        "ref": torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [4.0, 5.0, 6.0]]),
        "tags": ["a", "b", "c"],
    }
    mb = slice_batch(batch, [2, 0], t_max=3)
    assert mb["response_ids"] == [[7, 8, 9], [4, 5]]
    assert mb["adv_tok"].tolist() == [[2.0, 3.0, 4.0], [0.5, 0.25, 0.0]]
    assert mb["adv_seq"].tolist() == [3.0, 1.0]
    assert mb["ref"].tolist() == [[4.0, 5.0, 6.0], [1.0, 2.0, 0.0]]
    assert mb["tags"] == ["c", "a"]
    bad = dict(batch, adv_tok=[[0.5], [1.0], [2.0]])
    with pytest.raises(ConfigError, match="adv_tok"):
        slice_batch(bad, [0], t_max=2)


def test_token_logprobs_and_entropy_by_hand():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # probs 1/4, 3/4
    lp = token_logprobs(logits, torch.tensor([1]))
    assert lp.item() == pytest.approx(math.log(0.75), abs=1e-6)
    ent = entropy_from_logits(logits)
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-6)
    # Temperature 2 halves the logits: probs proportional to 1 and sqrt(3).
    lp2 = token_logprobs(logits, torch.tensor([0]), temperature=2.0)
    assert lp2.item() == pytest.approx(math.log(1 / (1 + math.sqrt(3))), abs=1e-6)


def test_filter_logits_top_p_top_k():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    kept = filter_logits(logits, top_p=0.75)
    # 0.5 < 0.75 so the second token is needed; after 0.8 >= 0.75 the rest go.
    assert torch.isfinite(kept).tolist() == [[True, True, False, False]]
    kept = filter_logits(logits, top_p=0.5)
    assert torch.isfinite(kept).tolist() == [[True, False, False, False]]
    kept = filter_logits(logits, top_k=3)
    assert torch.isfinite(kept).tolist() == [[True, True, True, False]]


def test_sample_tokens_greedy_and_seeded():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.0]])
    tok, lp = sample_tokens(logits, temperature=0.0)
    assert tok.tolist() == [1, 0]
    assert torch.allclose(lp, torch.log_softmax(logits, -1)[[0, 1], [1, 0]])
    a = sample_tokens(logits, 1.0, generator=torch.Generator().manual_seed(3))[0]
    b = sample_tokens(logits, 1.0, generator=torch.Generator().manual_seed(3))[0]
    assert a.tolist() == b.tolist()


def test_rows_sharing_a_prompt_add_their_cache_gradients_in_one_order():
    """The shared-prompt pass copies a prompt's KV cache to the rows that use it; backward adds
    the rows' gradients into the prompt's keys and values. With indexing, 2 threads added them
    in whichever order they came (other last bits on most passes, and Adam turned those into
    other weights); now every pass adds row after row, the bits of a plain loop."""
    from transformers.cache_utils import DynamicCache

    from loomrl.engines.hf import select_cache_rows

    g = torch.Generator().manual_seed(0)
    k0, v0 = (torch.randn(1, 3, 43, 64, generator=g) for _ in range(2))
    gk, gv = (torch.randn(8, 3, 43, 64, generator=g) for _ in range(2))
    rows = torch.zeros(8, dtype=torch.long)
    want_k, want_v = torch.zeros_like(k0), torch.zeros_like(v0)
    for i in range(8):  # rows one after another
        want_k[0] += gk[i]
        want_v[0] += gv[i]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for _ in range(10):
            k, v = k0.clone().requires_grad_(), v0.clone().requires_grad_()
            cache = DynamicCache()
            cache.update(k, v, 0)
            select_cache_rows(cache, rows)
            keys, values = cache.layers[0].keys, cache.layers[0].values
            assert keys.shape == (8, 3, 43, 64)
            torch.autograd.backward([keys, values], [gk, gv])
            assert torch.equal(k.grad, want_k) and torch.equal(v.grad, want_v)
    finally:
        torch.set_num_threads(before)
