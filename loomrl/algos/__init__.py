"""RL algorithm maths as pure torch functions: advantages, losses, masked reductions.

Nothing here knows about models, workers, Ray or configs; every function takes
tensors and returns tensors, with shapes in its docstring.
"""

from loomrl.algos.advantages import (
    discounted_returns,
    gae,
    gae_tokens,
    grpo_advantages,
    outcome_to_token_rewards,
    reinforce_pp_advantages,
    rloo_advantages,
)
from loomrl.algos.losses import (
    KL_KINDS,
    entropy_from_logits,
    kl_loss,
    kl_penalty,
    kl_shaped_rewards,
    logprobs_from_logits,
    ppo_policy_loss,
    value_loss,
)
from loomrl.algos.masked import (
    AGG_MODES,
    aggregate,
    loss_scale_for,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

__all__ = [
    "AGG_MODES",
    "KL_KINDS",
    "aggregate",
    "discounted_returns",
    "entropy_from_logits",
    "gae",
    "gae_tokens",
    "grpo_advantages",
    "kl_loss",
    "kl_penalty",
    "kl_shaped_rewards",
    "logprobs_from_logits",
    "loss_scale_for",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "outcome_to_token_rewards",
    "ppo_policy_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "value_loss",
]
