"""Token sampling: the inverse-CDF draw matches the categorical distribution it samples from."""

from __future__ import annotations

import torch

from loomrl.engines.sampling import inverse_cdf_sample, sample_tokens


def test_inverse_cdf_sample_follows_the_distribution():
    probs = torch.tensor([[0.5, 0.0, 0.2, 0.3], [0.0, 0.0, 0.0, 1.0], [0.1, 0.1, 0.1, 0.7]])
    g = torch.Generator().manual_seed(0)
    n = 20_000
    counts = torch.zeros_like(probs)
    for _ in range(n // 1000):
        draws = torch.stack([inverse_cdf_sample(probs, g) for _ in range(1000)], dim=1)
        for row in range(probs.shape[0]):
            counts[row] += torch.bincount(draws[row], minlength=probs.shape[1])
    freq = counts / n
    # Zero-probability tokens are never drawn; the rest within 4 standard errors.
    assert freq[probs == 0].sum() == 0
    se = (probs * (1 - probs) / n).sqrt()
    assert ((freq - probs).abs() <= 4 * se + 1e-9).all(), freq


def test_inverse_cdf_sample_is_seeded_and_handles_unnormalised_rows():
    probs = torch.softmax(torch.randn(5, 100, generator=torch.Generator().manual_seed(1)), -1)
    a = inverse_cdf_sample(probs, torch.Generator().manual_seed(7))
    b = inverse_cdf_sample(probs, torch.Generator().manual_seed(7))
    assert torch.equal(a, b)
    # Rows that do not sum to one exactly (top-p filtering, rounding) still give valid tokens.
    tok = inverse_cdf_sample(probs * 0.5, torch.Generator().manual_seed(7))
    assert torch.equal(tok, a)


def test_sample_tokens_top_p_never_leaves_the_nucleus():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.05, 0.05]]))
    g = torch.Generator().manual_seed(0)
    seen = {int(sample_tokens(logits, 1.0, top_p=0.8, generator=g)[0]) for _ in range(500)}
    assert seen == {0, 1}
