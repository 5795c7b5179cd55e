"""Token sampling and per-token log-probabilities, shared by generation and training.

Which log-probability an engine reports matters for RL: the importance ratio in PPO/GRPO
compares the rollout's log-probs against ones recomputed by the trainer. Both sides use
``log_softmax(logits / temperature)`` at the chosen token: temperature is applied, top-p /
top-k truncation is *not* (truncation changes what gets sampled, not the policy the trainer
differentiates). At temperature 1.0 the rollout log-probs therefore equal the trainer's
``logprobs()`` up to float rounding.
"""

from __future__ import annotations

import torch


def token_logprobs(
    logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """log softmax(logits / temperature)[ids].

    logits: [..., V] (any float dtype; computed in float32), ids: [...] int64 -> [...] float32.
    Uses gather - logsumexp so no [..., V] log-prob tensor is materialised.
    """
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    picked = x.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(x, dim=-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) over the last dim. [..., V] -> [...] float32."""
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    logp = torch.log_softmax(x, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def filter_logits(logits: torch.Tensor, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """Set logits outside the top-k and outside the smallest top-p nucleus to -inf.

    logits: [B, V] float32 (already temperature-scaled) -> [B, V]. The most likely token is
    always kept, so a row never becomes all -inf.
    """
    if top_k and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Mass strictly before each token: drop a token once the tokens ahead of it cover top_p.
        before = probs.cumsum(-1) - probs
        drop_sorted = before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the next token for each row and return (tokens [B] int64, logprobs [B] float32).

    logits: [B, V] raw model logits. temperature 0 means greedy (log-probs then at temperature 1).
    """
    x = logits.float()
    if temperature <= 0:
        tokens = x.argmax(-1)
        return tokens, token_logprobs(x, tokens)
    scaled = x / temperature if temperature != 1.0 else x
    filtered = filter_logits(scaled, top_p=top_p, top_k=top_k)
    probs = torch.softmax(filtered, dim=-1)
    tokens = inverse_cdf_sample(probs, generator)
    return tokens, token_logprobs(scaled, tokens)


def inverse_cdf_sample(
    probs: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One draw per row of ``probs`` [B, V]: the first token whose cumulative probability exceeds
    a uniform number. Same distribution as ``torch.multinomial(probs, 1)``, which on CPU draws V
    exponentials per row (a third of the decode step of a 49k-vocabulary model on two cores);
    this draws one uniform per row. A token of probability 0 is never picked: the cumulative sum
    does not rise there. Float64 sums keep the rounding far below any token's probability."""
    cdf = probs.double().cumsum(-1)
    u = torch.rand(
        (probs.shape[0], 1), generator=generator, device=probs.device, dtype=torch.float64
    )
    idx = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    return idx.clamp_(max=probs.shape[-1] - 1)


class StopText:
    """Ends a response at the token that completes one of ``strings`` in its decoded text.

    Checked after every sampled token on the last few tokens only (enough of them to hold the
    longest string: a token decodes to at least one character), so a check costs one short
    decode whatever the response's length. A string is found at the token that completes it:
    earlier windows, checked at their own steps, did not hold it.
    """

    def __init__(self, tokenizer, strings):
        strings = tuple(s for s in strings if s)
        if tokenizer is None:
            raise ValueError("stop_strings need the model's tokenizer to read the sampled text")
        if not strings:
            raise ValueError("stop_strings: give at least one non-empty string")
        self.tokenizer, self.strings = tokenizer, strings
        self.window = max(len(s) for s in strings) + 2

    def ends(self, tokens) -> bool:
        tail = self.tokenizer.decode(list(tokens[-self.window :]), skip_special_tokens=False)
        return any(s in tail for s in self.strings)
