"""What PPO adds to the reasoning workers: a critic, the advantage stage, and the PPO actor.

The value model lives in two components, as the policy does (``rollout`` samples, ``actor``
learns): ``critic`` is an inference copy that adds per-token values to each item early in the
chain, and ``critic_train`` holds the trainable copy and its optimizer. A chain names each
component once, so one worker cannot both value the responses (before the advantages exist) and
learn from the returns (after); two components also let the plan place and time-share the
cheap valuation apart from the costly update. After every iteration the driver pushes
``critic_train``'s weights to ``critic`` with the same versioned weight sync as actor -> rollout.

Data on each item (one prompt group of G responses), per response ``j``:
  - ``values[j]``: V(s_t) before each response token (the critic);
  - ``token_advantages[j]``, ``returns[j]``: GAE over the response with the outcome reward on its
    last token, optionally minus a per-token KL penalty (the advantage stage);
  - ``critic_stats``: the value update's statistics, on the items ``critic_train`` passes on in
    its last call, so the actor can report them beside its own.

Batch-wide operations (advantage whitening, the optimizer steps) run only where the whole batch
is: in the trainers on their last call. The advantage stage is per item, so its output does not
depend on how the plan cuts the batch into micro-batches.

An empty response is trained as the single token EOS (as ``ActorWorker`` does); every per-token
field has ``max(1, len(response))`` entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loomrl.config import finite_in
from loomrl.weights import WeightSink, WeightSource, resident
from loomrl.worker import Worker
from loomrl.workers.reasoning import (
    ActorWorker,
    EngineWorker,
    ModelConfig,
    SamplingConfig,
    engine_config,
    optimizer_problems,
)


@dataclass
class PPOConfig:
    """The policy side of PPO and the advantage estimator."""

    clip_low: float = 0.2
    clip_high: float = 0.28  # > clip_low: clip-higher
    dual_clip: float | None = None  # e.g. 3.0 bounds the loss of negative-advantage tokens
    gamma: float = 1.0
    lam: float = 1.0  # 1.0: advantage = return - V (no bias from an untrained critic)
    ppo_epochs: int = 1  # optimizer steps over the batch per iteration
    whiten_advantages: bool = True  # over all tokens of the iteration's batch
    kl_coef: float = 0.0  # > 0: reference component and a per-token KL penalty on the reward
    kl_kind: str = "k1"
    agg: str = "token-mean"

    def validate(self) -> list[str]:
        p = []
        if not 0.0 <= self.clip_low < 1.0:
            p.append(f"clip_low: must be in [0, 1), got {self.clip_low}")
        if self.clip_high < 0:
            p.append(f"clip_high: must be >= 0, got {self.clip_high}")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            p.append(f"dual_clip: must be > 1 (or null to disable), got {self.dual_clip}")
        for key in ("gamma", "lam"):
            v = getattr(self, key)
            if not 0.0 <= v <= 1.0:
                p.append(f"{key}: must be in [0, 1], got {v}")
        if self.ppo_epochs < 1:
            p.append(f"ppo_epochs: must be >= 1, got {self.ppo_epochs}")
        if not finite_in(self.kl_coef, lambda x: x >= 0):
            p.append(f"kl_coef: must be a finite number >= 0, got {self.kl_coef}")
        if self.kl_kind not in ("k1", "k2", "k3"):
            p.append(f"kl_kind: {self.kl_kind!r} is not k1 | k2 | k3")
        if self.agg not in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
            p.append(
                f"agg: {self.agg!r} is not token-mean | seq-mean-token-mean | seq-mean-token-sum"
            )
        return p


@dataclass
class CriticConfig:
    """The value model: the policy's checkpoint with a fresh scalar head, its own optimizer."""

    lr: float = 1e-5
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    vf_clip: float | None = 0.2  # value clipping around the values the returns were built from
    train_micro_batch: int = 8

    def validate(self) -> list[str]:
        p = optimizer_problems(self)  # the actor's checks (ModelConfig)
        if self.vf_clip is not None and self.vf_clip <= 0:
            p.append(f"vf_clip: must be > 0 (or null to disable), got {self.vf_clip}")
        if self.train_micro_batch < 1:
            p.append(f"train_micro_batch: must be >= 1, got {self.train_micro_batch}")
        return p


def token_targets(
    rewards: Any,
    values: Any,
    mask: Any,
    gamma: float,
    lam: float,
    logp: Any = None,
    ref_logp: Any = None,
    kl_coef: float = 0.0,
    kl_kind: str = "k1",
) -> tuple[Any, Any, Any]:
    """Per-token PPO targets of B responses. rewards: [B]; values, mask, logp, ref_logp: [B, T].

    The outcome reward sits on each response's last token; with ``kl_coef > 0`` every token also
    pays ``kl_coef * KL_t(logp || ref_logp)``. Returns ``(advantages, returns, token_rewards)``,
    all [B, T] and zero on padding: GAE(gamma, lam) with the step after the last token terminal.
    """
    from loomrl.algos import gae_tokens, kl_shaped_rewards, outcome_to_token_rewards

    r = outcome_to_token_rewards(rewards, mask)
    if kl_coef > 0:
        r = kl_shaped_rewards(r, logp, ref_logp, mask, kl_coef, kl_kind)
    adv, ret = gae_tokens(r, values, mask, gamma, lam)
    return adv, ret, r


def _dense(rows: list[list[float]]) -> tuple[Any, Any]:
    """Right-pad per-token lists: ([B, T] float32, mask [B, T])."""
    import torch

    t = max(len(r) for r in rows)
    x = torch.zeros(len(rows), t)
    m = torch.zeros(len(rows), t)
    for i, r in enumerate(rows):
        x[i, : len(r)] = torch.as_tensor(r, dtype=torch.float32)
        m[i, : len(r)] = 1.0
    return x, m


def _rows(x: Any, mask: Any) -> list[list[float]]:
    return [x[i, : int(mask[i].sum())].tolist() for i in range(x.shape[0])]


class AdvantageWorker(Worker):
    """The advantage stage: per item, GAE advantages and returns from rewards and values (CPU)."""

    def __init__(self, ppo: PPOConfig):
        super().__init__()
        self.ppo = ppo

    def compute(self, items: list[dict]) -> list[dict]:
        import torch

        from loomrl.algos import masked_mean

        c = self.ppo
        out = []
        for it in items:
            values, mask = _dense(it["values"])
            logp = ref = None
            if c.kl_coef > 0:
                if "logprobs" not in it or "ref_logprobs" not in it:
                    raise KeyError(
                        "ppo.kl_coef > 0 needs each item's sampling log-probs ('logprobs', from the "
                        "rollout) and reference log-probs ('ref_logprobs'); an item has "
                        f"{sorted(it)}. Set ppo.kl_coef=0 or make the rollout keep its log-probs."
                    )
                logp, _ = _dense(
                    [_fit(x, len(v)) for x, v in zip(it["logprobs"], it["values"], strict=True)]
                )
                ref, _ = _dense(it["ref_logprobs"])
            rewards = torch.tensor(it["rewards"], dtype=torch.float32)
            adv, ret, r = token_targets(
                rewards, values, mask, c.gamma, c.lam, logp, ref, c.kl_coef, c.kl_kind
            )
            extra = {}
            if c.kl_coef > 0:
                from loomrl.algos import kl_penalty

                extra["kl"] = float(masked_mean(kl_penalty(logp, ref, c.kl_kind), mask))
            out.append(
                {**it, "token_advantages": _rows(adv, mask), "returns": _rows(ret, mask), **extra}
            )
        return out


def _fit(x: list[float], n: int) -> list[float]:
    """Sampling log-probs of an empty response (trained as one EOS token) are taken as 0."""
    return list(x)[:n] + [0.0] * (n - len(x))


def _nonempty(responses: list[list[int]], eos: int) -> list[list[int]]:
    return [list(r) if r else [eos] for r in responses]


def _value_engine(model: ModelConfig, critic: CriticConfig, trainable: bool, seed: int):
    from loomrl.engines.hf import HFValueEngine

    return HFValueEngine(engine_config(model, trainable, seed, critic, value_head=True))


class CriticWorker(EngineWorker, WeightSource, WeightSink):
    """The value model. ``values`` is the valuation stage, ``train`` the update stage (a map that
    passes items on unchanged and runs one clipped value-loss update per PPO epoch on the whole
    batch at its last call). Build with ``trainable=False`` for the inference copy."""

    def __init__(
        self,
        model: ModelConfig,
        critic: CriticConfig,
        ppo: PPOConfig,
        seed: int = 0,
        trainable: bool = True,
    ):
        super().__init__()
        self.critic, self.ppo = critic, ppo
        self.engine = _value_engine(model, critic, trainable, seed)
        tok = self.engine.tokenizer
        self.eos = int(tok.eos_token_id if tok is not None and tok.eos_token_id is not None else 0)
        self.buffer: list[dict] = []
        self.last_stats: dict[str, float] = {}

    def values(self, items: list[dict]) -> list[dict]:
        """Add ``values``: V(s_t) for every token of every response (no gradients).

        One forward per prompt group, never across groups: a group's values then do not depend
        on which groups share its micro-batch, so every plan computes the same numbers."""
        out = []
        with resident(self.engine) as eng:
            for it in items:
                rs = _nonempty(it["response_ids"], self.eos)
                vals = eng.values([it["prompt_ids"]] * len(rs), rs)
                out.append({**it, "values": [v.tolist() for v in vals]})
        return out

    def train(self, items: list[dict]) -> list[dict]:
        """Buffer the iteration's items; on the last call, update and attach ``critic_stats``."""
        self.buffer.extend(items)
        if not getattr(self, "flow_last_call", True):
            return items
        batch, self.buffer = sorted(self.buffer, key=lambda it: it["index"]), []
        self.last_stats = self.update(batch)
        return [{**it, "critic_stats": dict(self.last_stats)} for it in items]

    def update(self, groups: list[dict]) -> dict[str, float]:
        """``ppo.ppo_epochs`` optimizer steps of the clipped value loss over ``groups``."""
        import torch

        from loomrl.algos import loss_scale_for, masked_mean, masked_var, value_loss

        prompts, responses, old, ret = [], [], [], []
        for g in groups:
            rs = _nonempty(g["response_ids"], self.eos)
            prompts += [g["prompt_ids"]] * len(rs)
            responses += rs
            old += g["values"]
            ret += g["returns"]
        batch = {
            "prompt_ids": prompts,
            "response_ids": responses,
            "old_values": old,
            "returns": ret,
        }
        clip, agg = self.critic.vf_clip, self.ppo.agg

        def loss_fn(v, mb):
            m = mb["mask"]
            loss = value_loss(v, mb["old_values"], mb["returns"], m, clip=clip, agg=agg)
            with torch.no_grad():
                stats = {
                    "value_mean": float(masked_mean(v, m)),
                    "value_error": float(masked_mean((v - mb["returns"]).abs(), m)),
                }
                if clip is not None:
                    out = ((v - mb["old_values"]).abs() > clip).float()
                    stats["value_clip_frac"] = float(masked_mean(out, m))
            return loss, stats

        with resident(self.engine) as eng:
            for _ in range(self.ppo.ppo_epochs):
                stats = eng.train_step(batch, loss_fn, loss_scale=loss_scale_for(agg))
        returns, m = _dense(ret)
        err = returns - _dense(old)[0]
        var_r, var_e = float(masked_var(returns, m)), float(masked_var(err, m))
        return {
            "value_loss": float(stats["loss"]),
            "grad_norm": float(stats.get("grad_norm", float("nan"))),
            "value_mean": float(stats["value_mean"]),
            "value_error": float(stats["value_error"]),
            "value_clip_frac": float(stats.get("value_clip_frac", 0.0)),
            "return_mean": float(masked_mean(returns, m)),
            # How much of the returns' variance the values the advantages used explain.
            "explained_variance": 1.0 - var_e / var_r if var_r > 1e-8 else 0.0,
        }

    def version(self) -> int:
        return self.engine.version

    def param_sha256(self) -> str:
        with resident(self.engine) as eng:
            return eng.param_sha256()

    def save_state(self) -> dict:
        import copy

        with resident(self.engine) as eng:
            # Copy before leaving: offload frees the storage the live state dict points to.
            return copy.deepcopy(eng.state_dict())

    def load_state(self, state: dict) -> None:
        with resident(self.engine) as eng:
            eng.load_state_dict(state)


class PPOActorWorker(ActorWorker):
    """The actor with token-level advantages: clipped (clip-higher, optional dual-clip) PPO loss,
    ``ppo_epochs`` optimizer steps per iteration. With more than one epoch the policy moves between
    steps, so the sampling policy's log-probs are computed once before the first step; with one
    epoch they equal the current ones and the ratio is exactly 1."""

    def __init__(self, model: ModelConfig, sampling: SamplingConfig, ppo: PPOConfig, seed: int = 0):
        super().__init__(model, sampling, ppo, seed)  # type: ignore[arg-type]
        self.ppo = ppo

    def _update(self, groups: list[dict]) -> dict[str, float]:
        from loomrl.algos import loss_scale_for, masked_whiten, ppo_policy_loss

        tok = self.engine.tokenizer
        eos = int(tok.eos_token_id if tok is not None and tok.eos_token_id is not None else 0)
        prompts, responses, adv = [], [], []
        for g in groups:
            rs = _nonempty(g["response_ids"], eos)
            prompts += [g["prompt_ids"]] * len(rs)
            responses += rs
            adv += g["token_advantages"]
        a, m = _dense(adv)
        if self.ppo.whiten_advantages:
            a = masked_whiten(a, m)
        batch: dict[str, Any] = {"prompt_ids": prompts, "response_ids": responses, "advantages": a}
        c, temp = self.ppo, self.sampling.temperature
        if c.ppo_epochs > 1:
            batch["old_logprobs"] = self.engine.logprobs(prompts, responses, temperature=temp)

        def loss_fn(logp, mb):
            old = mb["old_logprobs"] if "old_logprobs" in mb else logp.detach()
            return ppo_policy_loss(
                logp,
                old,
                mb["advantages"],
                mb["mask"],
                clip_low=c.clip_low,
                clip_high=c.clip_high,
                dual_clip=c.dual_clip,
                agg=c.agg,
            )

        for _ in range(c.ppo_epochs):
            stats = self.engine.train_step(
                batch, loss_fn, temperature=temp, loss_scale=loss_scale_for(c.agg)
            )
        rewards = [r for g in groups for r in g["rewards"]]
        stats["reward_mean"] = sum(rewards) / max(1, len(rewards))
        stats["response_len"] = sum(len(r) for r in responses) / max(1, len(responses))
        stats["gen_tokens"] = float(sum(g["gen_tokens"] for g in groups))
        stats["malformed"] = float(sum(g["malformed"] for g in groups))
        if "kl" in groups[0]:
            stats["kl"] = sum(g["kl"] for g in groups) / len(groups)
        critic = next((g["critic_stats"] for g in groups if "critic_stats" in g), {})
        stats.update({f"critic/{k}": v for k, v in critic.items()})
        return stats
