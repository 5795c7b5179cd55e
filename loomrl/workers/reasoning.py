"""Workers of reasoning RL: rollout (generation), reward (verifiable math), reference, actor.

An item is one prompt group: ``{"index", "question", "answer", "prompt_ids"}``; the rollout adds
``G`` sampled responses, the reward worker their rewards and group-normalised advantages, the
reference its log-probs, and the actor trains on whole groups. Each item's result depends only on
its own seed, so the same run under any plan produces the same data and the same parameters.
"""

from __future__ import annotations

import difflib
import re
import time
from dataclasses import dataclass, field
from typing import Any

from loomrl.config import finite_in
from loomrl.weights import WeightSink, WeightSource, resident
from loomrl.worker import Worker, dispatch


@dataclass
class ModelConfig:
    path: str = "smollm2-135m-instruct"  # local HF dir, or the packaged SmolLM2 name
    lr: float = 1e-6
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    # Sequences per forward/backward (bounds memory); not the flow's micro-batch.
    train_micro_batch: int = 8
    dtype: str = "auto"

    # what the engine reads (loomrl.engines.hf._DTYPES; a test keeps the two the same), here
    # so that a typo is found with the config, not in the first worker
    DTYPES = ("auto", "bf16", "bfloat16", "float16", "float32", "fp16", "fp32")

    def validate(self) -> list[str]:
        p = []
        if self.dtype not in self.DTYPES:
            p.append(f"dtype: {self.dtype!r} is not one of {', '.join(self.DTYPES)}")
        p += optimizer_problems(self)
        if self.train_micro_batch < 1:
            p.append(
                f"train_micro_batch: must be >= 1 sequence per forward/backward, got "
                f"{self.train_micro_batch}"
            )
        return p


def optimizer_problems(cfg: Any) -> list[str]:
    """The checks of a trained model's optimizer settings (``lr``, ``weight_decay``,
    ``grad_clip`` of ``cfg``: the actor's ModelConfig, the critic's CriticConfig): a
    grad_clip <= 0 would flip or zero every gradient, a weight_decay < 0 grow the weights."""
    p = []
    if not finite_in(cfg.lr, lambda x: x > 0):
        p.append(f"lr: must be a finite number > 0, got {cfg.lr}")
    if not finite_in(cfg.weight_decay, lambda x: x >= 0):
        p.append(f"weight_decay: must be a finite number >= 0, got {cfg.weight_decay}")
    if not finite_in(cfg.grad_clip, lambda x: x > 0):
        p.append(
            f"grad_clip: must be a finite number > 0 (the gradient norm's bound), got "
            f"{cfg.grad_clip}"
        )
    return p


@dataclass
class SamplingConfig:
    group_size: int = 8  # responses per prompt (GRPO's G)
    max_new_tokens: int = 48
    temperature: float = 1.0
    top_p: float = 1.0
    gen_groups: int = 4  # prompt groups generated together (one padded batch)
    eval_max_new_tokens: int = 48

    def validate(self) -> list[str]:
        p = []
        for key in ("max_new_tokens", "eval_max_new_tokens", "gen_groups"):
            if getattr(self, key) < 1:
                p.append(f"{key}: must be >= 1, got {getattr(self, key)}")
        # Log-probs divide the logits by the temperature: 0 would make every one NaN (greedy
        # decoding is not a policy PPO or GRPO can train).
        if not finite_in(self.temperature, lambda x: x > 0):
            p.append(f"temperature: must be a finite number > 0 (sampling), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            p.append(f"top_p: must be in (0, 1], got {self.top_p}")
        return p


@dataclass
class AlgoConfig:
    advantage: str = "grpo"  # grpo | grpo_no_std | rloo
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0  # > 0 adds the reference component and a k3 KL loss
    agg: str = "token-mean"

    def validate(self) -> list[str]:
        p = []
        if self.advantage not in ("grpo", "grpo_no_std", "rloo"):
            p.append(f"advantage: {self.advantage!r} is not grpo | grpo_no_std | rloo")
        if not finite_in(self.kl_coef, lambda x: x >= 0):
            p.append(f"kl_coef: must be a finite number >= 0, got {self.kl_coef}")
        if not 0 <= self.clip_low < 1:
            p.append(
                f"clip_low: must be in [0, 1) (the ratio's floor is 1 - clip_low), got {self.clip_low}"
            )
        if self.clip_high < 0:
            p.append(f"clip_high: must be >= 0, got {self.clip_high}")
        from loomrl.algos import AGG_MODES

        if self.agg not in AGG_MODES:
            p.append(f"agg: {self.agg!r} is not one of {', '.join(AGG_MODES)}")
        return p


def model_dir(path: str) -> str:
    """``tiny-llama`` / ``tiny-qwen2``: a random tiny model built once into the cache (tests,
    examples that must run anywhere); anything else goes to ``loomrl.models.resolve_model``."""
    if path in ("tiny-llama", "tiny-qwen2"):
        import os

        from loomrl.models import cache_root, tiny_model

        d = cache_root() / path
        if not (d / "config.json").exists():
            tmp = d.with_name(f"{path}.tmp-{os.getpid()}")
            tiny_model(tmp, arch=path.split("-")[1], seed=0)
            try:
                os.replace(tmp, d)
            except OSError:  # another process built it first
                import shutil

                shutil.rmtree(tmp, ignore_errors=True)
        return str(d)
    return path


def engine_config(
    model: ModelConfig, trainable: bool, seed: int, optim: Any = None, **extra: Any
) -> Any:
    """The engine settings of a worker: ``model``'s checkpoint and dtype, and the optimizer
    settings (lr, weight_decay, grad_clip, train_micro_batch) of ``optim`` (default: ``model``)."""
    from loomrl.engines.hf import EngineConfig

    optim = optim or model
    return EngineConfig(
        model=model_dir(model.path),
        trainable=trainable,
        lr=optim.lr,
        weight_decay=optim.weight_decay,
        grad_clip=optim.grad_clip,
        micro_batch_size=optim.train_micro_batch,
        seed=seed,
        dtype=model.dtype,
        **extra,
    )


def _engine(model: ModelConfig, trainable: bool, seed: int):
    from loomrl.engines.hf import HFEngine

    return HFEngine(engine_config(model, trainable, seed))


class EngineWorker(Worker):
    """A worker owning one model engine: time-sharing moves that engine on and off the device."""

    engine: Any

    def onload(self) -> None:
        self.engine.onload()

    def offload(self) -> None:
        self.engine.offload()


class RolloutWorker(EngineWorker, WeightSink):
    def __init__(self, model: ModelConfig, sampling: SamplingConfig, seed: int = 0):
        super().__init__()
        self.sampling, self.seed = sampling, seed
        self.engine = _engine(model, trainable=False, seed=seed)
        self.step = 0

    def generate(self, items: list[dict]) -> list[dict]:
        """Sample G responses per prompt group, in chunks of ``gen_groups`` groups aligned by index."""
        s = self.sampling
        chunks: dict[int, list[dict]] = {}
        for it in items:
            chunks.setdefault(it["index"] // s.gen_groups, []).append(it)
        out: list[dict] = []
        for c, group in sorted(chunks.items()):
            prompts = [it["prompt_ids"] for it in group for _ in range(s.group_size)]
            t = time.perf_counter()
            # Per piece of a chunk: a plan whose micro-batch splits a chunk of gen_groups
            # groups over calls gives each piece its own draws (the same seed for every
            # piece drew the same noise for different prompt groups).
            cols = self._responses(
                prompts, hash((self.seed, group[0]["step"], c, group[0]["index"])) & 0x7FFFFFFF
            )
            dt = time.perf_counter() - t
            for j, it in enumerate(group):
                sl = slice(j * s.group_size, (j + 1) * s.group_size)
                mine = {k: v[sl] for k, v in cols.items()}
                masks = mine.get("response_masks")
                out.append(
                    {
                        **it,
                        **mine,
                        # Tokens the policy sampled (not what a tool inserted).
                        "gen_tokens": sum(map(sum, masks))
                        if masks is not None
                        else sum(len(r) for r in mine["response_ids"]),
                        "gen_s": dt / len(group),  # this group's share of the batched call
                        "version": self.engine.version,
                    }
                )
        by_index = {o["index"]: o for o in out}
        return [by_index[it["index"]] for it in items]

    def _responses(self, prompts: list[list[int]], seed: int) -> dict[str, list]:
        """One response per prompt row, as columns over the rows: ``response_ids``, ``logprobs``
        and ``texts`` (subclasses add columns, e.g. a multi-turn agent's ``response_masks``)."""
        s = self.sampling
        gen = self.engine.generate(
            prompts,
            max_new_tokens=s.max_new_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            seed=seed,
        )
        return {
            "response_ids": gen.response_ids,
            "logprobs": gen.response_logprobs,
            "texts": [self.engine.decode(r) for r in gen.response_ids],
        }

    @dispatch("split")
    def evaluate(self, examples: list[dict]) -> list[str]:
        """Greedy responses to held-out prompts (the driver scores them with the task)."""
        texts: list[str] = []
        with resident(self.engine):
            for i in range(0, len(examples), 16):
                chunk = examples[i : i + 16]
                gen = self.engine.generate(
                    [e["prompt_ids"] for e in chunk],
                    max_new_tokens=self.sampling.eval_max_new_tokens,
                    temperature=0.0,
                    seed=0,
                )
                texts.extend(self.engine.decode(ids) for ids in gen.response_ids)
        return texts

    def save_state(self) -> dict:
        """Weights and version, to carry a replica to new devices when the flow re-plans."""
        with resident(self.engine) as eng:
            weights = {k: v.detach().to("cpu", copy=True) for k, v in eng.named_parameters()}
        return {"weights": weights, "version": self.engine.version}

    def load_state(self, state: dict) -> None:
        with resident(self.engine) as eng:
            eng.set_weights(state["weights"], version=state["version"])


class RewardWorker(Worker):
    stateless = True  # scores depend only on the texts and answers

    def __init__(self, task: dict, algo: AlgoConfig, group_size: int):
        super().__init__()
        from loomrl.tasks import make_task

        self.task = make_task(**task)
        self.algo, self.group_size = algo, group_size

    def score(self, items: list[dict]) -> list[dict]:
        import torch

        from loomrl.algos import grpo_advantages, rloo_advantages
        from loomrl.tasks import Example
        from loomrl.tasks.base import score_checked

        out = []
        for it in items:
            ex = Example(it["question"], it["answer"], it.get("meta", {}))
            res = [score_checked(self.task, t, ex) for t in it["texts"]]
            r = torch.tensor([x.reward for x in res], dtype=torch.float32)
            if self.algo.advantage == "rloo":
                adv = rloo_advantages(r, self.group_size)
            else:
                adv = grpo_advantages(r, self.group_size, scale_std=self.algo.advantage == "grpo")
            out.append(
                {
                    **it,
                    "rewards": r.tolist(),
                    "advantages": adv.tolist(),
                    "malformed": sum(x.malformed for x in res),
                }
            )
        return out


class ReferenceWorker(EngineWorker):
    def __init__(self, model: ModelConfig, sampling: SamplingConfig, seed: int = 0):
        super().__init__()
        self.engine = _engine(model, trainable=False, seed=seed)
        self.temperature = sampling.temperature

    def logprobs(self, items: list[dict]) -> list[dict]:
        out = []
        for it in items:
            lp = self.engine.logprobs(
                [it["prompt_ids"]] * len(it["response_ids"]),
                it["response_ids"],
                temperature=self.temperature,
            )
            out.append({**it, "ref_logprobs": [x.tolist() for x in lp]})
        return out


AGENT_STATS = ("searches", "tool_failures", "answered")


class ActorWorker(EngineWorker, WeightSource):
    """Trains on whole prompt groups; one optimizer step per iteration over the batch it received."""

    def __init__(
        self, model: ModelConfig, sampling: SamplingConfig, algo: AlgoConfig, seed: int = 0
    ):
        super().__init__()
        from loomrl.distributed import join_process_group

        join_process_group(self)  # several GPU ranks: the engine shards with FSDP2 over them
        self.engine = _engine(model, trainable=True, seed=seed)
        self.sampling, self.algo = sampling, algo
        self.buffer: list[dict] = []
        self.last_stats: dict[str, float] = {}

    def train(self, items: list[dict]) -> list[dict]:
        """Collect this iteration's groups; the update runs when the last micro-batch arrives."""
        self.buffer.extend(items)
        if not getattr(self, "flow_last_call", True):
            return [{"index": it["index"]} for it in items]
        batch, self.buffer = sorted(self.buffer, key=lambda it: it["index"]), []
        if not batch:
            return []
        self.last_stats = self._update(batch)
        return [{"index": it["index"], **self.last_stats} for it in items]

    def _update(self, groups: list[dict]) -> dict[str, float]:
        import torch

        from loomrl.algos import kl_loss, loss_scale_for, ppo_policy_loss

        prompts, responses, adv, ref, masks = [], [], [], [], []
        for g in groups:
            for j, r in enumerate(g["response_ids"]):
                prompts.append(g["prompt_ids"])
                responses.append(r if r else [self.engine.tokenizer.eos_token_id or 0])
                adv.append(g["advantages"][j])
                if "ref_logprobs" in g:
                    ref.append(g["ref_logprobs"][j])
                if "response_masks" in g:
                    # Tokens a tool inserted are context the policy read, not actions it took.
                    masks.append(g["response_masks"][j] if r else [0])
        batch: dict[str, Any] = {
            "prompt_ids": prompts,
            "response_ids": responses,
            "advantages": torch.tensor(adv, dtype=torch.float32),
        }
        if ref:
            batch["ref_logprobs"] = ref
        if masks:
            batch["response_mask"] = masks
        algo = self.algo

        def loss_fn(logp, mb):
            a = mb["advantages"].reshape(-1, 1).expand_as(logp)
            # One update per batch: the sampling policy is the current one, so old = logp.detach().
            loss, stats = ppo_policy_loss(
                logp,
                logp.detach(),
                a,
                mb["mask"],
                clip_low=algo.clip_low,
                clip_high=algo.clip_high,
                agg=algo.agg,
            )
            if algo.kl_coef > 0 and "ref_logprobs" in mb:
                kl = kl_loss(logp, mb["ref_logprobs"], mb["mask"], kind="k3", agg=algo.agg)
                loss = loss + algo.kl_coef * kl
                stats = {**stats, "kl": float(kl.detach())}
            return loss, stats

        stats = self.engine.train_step(
            batch,
            loss_fn,
            temperature=self.sampling.temperature,
            loss_scale=loss_scale_for(algo.agg),
        )
        rewards = [r for g in groups for r in g["rewards"]]
        stats["reward_mean"] = sum(rewards) / max(1, len(rewards))
        stats["response_len"] = sum(len(r) for r in responses) / max(1, len(responses))
        stats["gen_tokens"] = float(sum(g["gen_tokens"] for g in groups))
        stats["malformed"] = float(sum(g["malformed"] for g in groups))
        for key in AGENT_STATS:  # per-response counts of an agent's rollout, as means
            if key in groups[0]:
                values = [v for g in groups for v in g[key]]
                stats[key] = sum(values) / max(1, len(values))
        return stats

    def param_sha256(self) -> str:
        with resident(self.engine) as eng:
            return eng.param_sha256()

    def version(self) -> int:
        return self.engine.version

    def save_state(self) -> dict:
        import copy

        with resident(self.engine) as eng:
            # Copy before leaving: offload frees the storage the live state dict points to.
            return copy.deepcopy(eng.state_dict())

    def load_state(self, state: dict) -> None:
        with resident(self.engine) as eng:
            eng.load_state_dict(state)


@dataclass
class TaskConfig:
    name: str = "arithmetic"
    level: int = 1
    eval_size: int = 64
    instruction: str = "think"  # "think": reason then \boxed{}; "direct": the boxed answer alone
    options: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> list[str]:
        from loomrl.tasks import task_names, task_options
        from loomrl.tasks.prompts import INSTRUCTIONS

        p = []
        if self.instruction not in INSTRUCTIONS:
            p.append(f"instruction: {self.instruction!r} is not one of {sorted(INSTRUCTIONS)}")
        if self.name not in task_names():  # before any worker starts, not in the first one
            close = difflib.get_close_matches(str(self.name), task_names(), n=1)
            p.append(
                f"name: {self.name!r} is not a task"
                + (f" — did you mean {close[0]!r}?" if close else "")
                + f"; known tasks: {', '.join(task_names())}"
            )
            return p
        # options that have keys of their own would override them, or be overridden
        own = {
            "name": "task.name",
            "seed": "run.seed",
            "level": "task.level",
            "eval_size": "task.eval_size",
        }
        for k in sorted(set(self.options) & set(own)):
            p.append(
                f"options.{k}: set {own[k]} instead (task.options holds the task's others; a "
                "run directory's config.yaml from an older loomrl: edit it there)"
            )
        takes = task_options(self.name)  # None: the task takes any keyword
        others = [o for o in takes or () if o not in own]
        unknown = sorted(set(self.options) - set(own) - set(others)) if takes is not None else []
        for k in unknown:
            close = difflib.get_close_matches(str(k), others, n=1)
            p.append(
                f"options.{k}: task {self.name!r} has no such option"
                + (f" — did you mean {close[0]!r}?" if close else "")
                + f"; its options: {', '.join(others) or 'none'}"
            )
        if not set(self.options) & set(own):
            p.extend(self._task_problems(set(unknown)))
        return p

    def _task_problems(self, unknown: set[str]) -> list[str]:
        """Build the task here, as the workers will (without the ``unknown`` options, said
        already), so that its own checks (levels, values, dataset files) fail with the config,
        not in the first worker."""
        from loomrl.errors import ConfigError
        from loomrl.tasks import make_task

        kwargs = {k: v for k, v in self.as_kwargs(0).items() if k not in unknown}
        try:
            make_task(**kwargs)
        except ConfigError as e:
            out = []
            for problem in e.problems:
                key = re.match(r"[A-Za-z_][A-Za-z0-9_]*", problem)
                mine = key is not None and key.group(0) in {"level", "eval_size"}
                given = key is not None and key.group(0) in self.options
                out.append(f"options.{problem}" if given and not mine else problem)
            return out
        except Exception as e:  # noqa: BLE001 - a dataset file, a value of the wrong type, ...
            return [f"options: the task {self.name!r} cannot be built ({type(e).__name__}: {e})"]
        return []

    def as_kwargs(self, seed: int) -> dict:
        kw: dict[str, Any] = {"name": self.name, "seed": seed, **self.options}
        if self.name in ("arithmetic", "digits"):
            kw["level"] = self.level
        if self.name in ("arithmetic", "countdown", "digits", "search_qa"):
            kw["eval_size"] = self.eval_size
        return kw
