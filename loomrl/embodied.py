"""PPO for embodied control: observation/reward normalisers, the rollout buffer, the env<->policy
collection cycle, the PPO update and a single-process training loop.

Run the reference experiment (InvertedPendulum-v5 to a return of 950, a few minutes on 2 cores):

    python -m loomrl.embodied InvertedPendulum-v5 --total-steps 300000 --target-return 950

Advantage and loss maths come from ``loomrl.algos`` (gae, ppo_policy_loss, value_loss); this
module only arranges tensors for them. It knows nothing of Ray: a Ray env worker holds a
``VecEnv`` and a policy worker a policy; ``collect`` is the sequential reference of their cycle.
"""

from __future__ import annotations

import functools
import inspect
import time
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from loomrl.algos import gae, ppo_policy_loss, value_loss
from loomrl.config import finite_in
from loomrl.envs.memory import NodeMemory, rollout_memory_problem
from loomrl.envs.vec import EnvConfig, EpisodeStats, VecEnv
from loomrl.errors import ConfigError
from loomrl.policies import make_policy, row_generators

__all__ = [
    "UPDATE_STATS",
    "GraphedPPOStep",
    "PPOConfig",
    "RewardScaler",
    "RolloutBuffer",
    "RunningMeanStd",
    "TrainResult",
    "capturable_adam",
    "collect",
    "compute_advantages",
    "ppo_step",
    "ppo_update",
    "set_lr",
    "train_ppo",
]


# ---------------------------------------------------------------------------------------------
# normalisers


class RunningMeanStd:
    """Running mean/variance of batches x[B, *shape] (parallel-merge formula, float64)."""

    def __init__(self, shape: Sequence[int] = (), eps: float = 1e-4):
        self.mean = np.zeros(tuple(shape), np.float64)
        self.var = np.ones(tuple(shape), np.float64)
        self.count = float(
            eps
        )  # a pseudo-count: the first batch dominates without dividing by zero

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float64).reshape(-1, *self.mean.shape)
        if len(x) == 0:
            return
        b_mean, b_var, b_count = x.mean(0), x.var(0), float(len(x))
        delta = b_mean - self.mean
        total = self.count + b_count
        self.mean = self.mean + delta * b_count / total
        m2 = self.var * self.count + b_var * b_count + delta**2 * self.count * b_count / total
        self.var = m2 / total
        self.count = total

    def normalize(self, x: np.ndarray, clip: float | None = 10.0, eps: float = 1e-8) -> np.ndarray:
        """(x - mean) / sqrt(var + eps), clipped to [-clip, clip]; float32, same shape as x."""
        y = (np.asarray(x, np.float64) - self.mean) / np.sqrt(self.var + eps)
        if clip is not None:
            y = np.clip(y, -clip, clip)
        return y.astype(np.float32)

    def state_dict(self) -> dict[str, Any]:
        return {"mean": self.mean.copy(), "var": self.var.copy(), "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if np.shape(state["mean"]) != self.mean.shape:
            raise ValueError(
                f"RunningMeanStd.load_state_dict: saved shape {np.shape(state['mean'])} != {self.mean.shape}"
            )
        self.mean = np.array(state["mean"], np.float64)
        self.var = np.array(state["var"], np.float64)
        self.count = float(state["count"])


class RewardScaler:
    """Divides rewards by the running std of each env's discounted return (not centred, so the
    sign of rewards is kept), then clips. Stats come from whole rollouts, see ``update``."""

    def __init__(self, num_envs: int, gamma: float, clip: float | None = 10.0):
        self.gamma, self.clip = gamma, clip
        self.rms = RunningMeanStd(())
        self.ret = np.zeros(num_envs, np.float64)

    def update(self, rewards: np.ndarray, dones: np.ndarray) -> None:
        """rewards, dones: [T, N] in time order."""
        for r, d in zip(np.asarray(rewards), np.asarray(dones), strict=True):
            self.ret = self.ret * self.gamma + r
            self.rms.update(self.ret)
            self.ret = self.ret * (1.0 - d)

    def scale(self, rewards: Tensor) -> Tensor:
        out = rewards / float(np.sqrt(self.rms.var + 1e-8))
        return out.clamp(-self.clip, self.clip) if self.clip is not None else out

    def state_dict(self) -> dict[str, Any]:
        return {"rms": self.rms.state_dict(), "ret": self.ret.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rms.load_state_dict(state["rms"])
        self.ret = np.array(state["ret"], np.float64)


# ---------------------------------------------------------------------------------------------
# rollouts


@dataclass
class RolloutBuffer:
    """One rollout, time-major. T time steps x N envs (groups concatenated in order).

    obs[T, N, *obs_shape]         what the policy saw (normalised when a normaliser was used)
    actions[T, N, *action_shape]  as sampled (before the env clipped them)
    logp, values, rewards[T, N]   rewards are the env's, unscaled
    terminated, truncated[T, N]   bool; an env failure counts as truncated
    final_values[T, N]            V(final observation) where truncated, else 0: a time limit is
                                  not a terminal state, so its value is bootstrapped
    last_value[N]                 V(observation after the last step)
    """

    obs: Tensor
    actions: Tensor
    logp: Tensor
    values: Tensor
    rewards: Tensor
    terminated: Tensor
    truncated: Tensor
    final_values: Tensor
    last_value: Tensor
    episodes: EpisodeStats = field(default_factory=EpisodeStats)
    timing: dict[str, float] = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.rewards.shape[1])

    @property
    def dones(self) -> Tensor:
        return self.terminated | self.truncated


def _accepts_generators(policy: Any) -> bool:
    try:
        return "generators" in inspect.signature(policy.act).parameters
    except (TypeError, ValueError):
        return False


def _value_of(policy: Any, obs: Tensor) -> Tensor:
    if hasattr(policy, "value"):
        return policy.value(obs)
    with torch.no_grad():
        return policy.act(obs)[2]


def collect(
    env: VecEnv | Sequence[VecEnv],
    policy: Any,
    steps: int,
    groups: int = 1,
    *,
    normalizer: RunningMeanStd | None = None,
    obs_clip: float | None = 10.0,
) -> RolloutBuffer:
    """Run the env<->policy cycle for ``steps`` time steps of every env -> RolloutBuffer [steps, N].

    The envs are split into ``groups`` (contiguous slices of one VecEnv, or one VecEnv per
    group when a sequence is given) visited in ring order: act(group 0), step(group 0),
    act(group 1), step(group 1), ... This is the sequential reference of the pipelined
    schedule, where group g's simulators step while the policy infers for group g+1. With a
    batch-invariant policy (the built-ins) and per-row generators the trajectories do not
    depend on ``groups`` (tested), which is what makes pipelining safe.

    ``normalizer`` is read-only during the rollout and updated once at the end with every raw
    observation seen: stats that changed between groups would make the result depend on the
    grouping. Episode statistics are popped from the envs into ``buffer.episodes``.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(
            [f"steps={steps!r}: a rollout needs a whole number of steps >= 1 of every env"],
            source="collect",
        )
    parts = _split_groups(env, groups)
    n_total = sum(len(range(v.num_envs)[s]) for v, s in parts)
    per_row = _accepts_generators(policy)
    seed = parts[0][0].cfg.seed

    cur: list[np.ndarray] = []
    for venv, sl in parts:
        if venv.obs is None:
            venv.reset()
        cur.append(venv.obs[sl])  # type: ignore[index]

    def prep(raw: np.ndarray) -> Tensor:
        if normalizer is None:
            return torch.as_tensor(raw)
        return torch.as_tensor(normalizer.normalize(raw, obs_clip))

    obs_l, act_l, logp_l, val_l, rew_l, term_l, trunc_l, fin_l, raw_l = ([] for _ in range(9))
    t_env = t_pol = 0.0
    for _ in range(steps):
        row = [[] for _ in range(9)]
        for g, (venv, sl) in enumerate(parts):
            t0 = time.perf_counter()
            o = prep(cur[g])
            if per_row:
                gens = row_generators(seed, *venv.row_ids(sl))
                a, logp, v = policy.act(o, generators=gens)
            else:
                with torch.no_grad():
                    a, logp, v = policy.act(o)
            t1 = time.perf_counter()
            res = venv.step(a, sl)
            t2 = time.perf_counter()
            trunc = res.truncated | res.failed
            fin = torch.zeros(len(trunc))
            if trunc.any():
                # Bootstrapping a time limit needs V(final obs); failures reuse the last obs.
                idx = np.flatnonzero(trunc)
                fin[idx] = _value_of(policy, prep(res.final_obs[idx])).float()
            t3 = time.perf_counter()
            t_env += t2 - t1
            t_pol += (t1 - t0) + (t3 - t2)
            for lst, x in zip(
                row,
                (
                    o,
                    a,
                    logp,
                    v,
                    torch.as_tensor(res.reward),
                    torch.as_tensor(res.terminated),
                    torch.as_tensor(trunc),
                    fin,
                    cur[g],
                ),
                strict=True,
            ):
                lst.append(x)
            cur[g] = res.obs
        for lst, parts_t in zip(
            (obs_l, act_l, logp_l, val_l, rew_l, term_l, trunc_l, fin_l), row[:8], strict=True
        ):
            lst.append(torch.cat([torch.as_tensor(p) for p in parts_t]))
        raw_l.append(np.concatenate(row[8]))

    last = torch.cat([_value_of(policy, prep(c)).float() for c in cur])
    if normalizer is not None:
        normalizer.update(np.stack(raw_l).reshape(steps * n_total, -1) if raw_l else np.zeros((0,)))
    from loomrl.cycle import merge_episodes

    popped = [vars(venv.pop_episode_stats()) for venv in dict.fromkeys(v for v, _ in parts)]
    episodes = EpisodeStats(*merge_episodes(popped))
    return RolloutBuffer(
        obs=torch.stack(obs_l),
        actions=torch.stack(act_l),
        logp=torch.stack(logp_l).float(),
        values=torch.stack(val_l).float(),
        rewards=torch.stack(rew_l).float(),
        terminated=torch.stack(term_l),
        truncated=torch.stack(trunc_l),
        final_values=torch.stack(fin_l),
        last_value=last,
        episodes=episodes,
        timing={"env_s": t_env, "policy_s": t_pol},
    )


def _split_groups(env: VecEnv | Sequence[VecEnv], groups: int) -> list[tuple[VecEnv, slice]]:
    if isinstance(env, VecEnv):
        if not 1 <= groups <= env.num_envs:
            raise ConfigError(
                [
                    f"groups={groups}: must be between 1 and num_envs={env.num_envs} (each group needs an env)"
                ],
                source="collect",
            )
        bounds = np.linspace(0, env.num_envs, groups + 1).round().astype(int)
        return [(env, slice(int(a), int(b))) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    envs = list(env)
    if groups not in (1, len(envs)):
        raise ConfigError(
            [
                f"groups={groups}: with a list of {len(envs)} VecEnvs each VecEnv is one group; pass groups={len(envs)}"
            ],
            source="collect",
        )
    return [(v, slice(None)) for v in envs]


# ---------------------------------------------------------------------------------------------
# PPO


@dataclass
class PPOConfig:
    """PPO for continuous control. Defaults are the usual MuJoCo settings (2048 transitions per
    update, 10 epochs of 32 minibatches, lr 3e-4 annealed, gamma 0.99, lambda 0.95, clip 0.2)."""

    rollout_steps: int = 2048  # transitions per update, over all envs (T = rollout_steps // N)
    epochs: int = 10
    num_minibatches: int = 32
    lr: float = 3e-4
    anneal_lr: bool = True
    adam_eps: float = 1e-5
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip: float = 0.2
    value_clip: float | None = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    max_grad_norm: float = 0.5
    norm_adv: bool = True
    target_kl: float | None = None
    normalize_obs: bool = True
    obs_clip: float = 10.0
    normalize_reward: bool = True
    reward_clip: float = 10.0
    hidden: tuple[int, ...] = (64, 64)
    seed: int = 0

    def __post_init__(self) -> None:
        p = []
        if self.rollout_steps < 1:
            p.append(f"rollout_steps={self.rollout_steps}: must be >= 1")
        if self.epochs < 1:
            p.append(f"epochs={self.epochs}: must be >= 1")
        if not 1 <= self.num_minibatches <= max(self.rollout_steps, 1):
            p.append(
                f"num_minibatches={self.num_minibatches}: must be in [1, rollout_steps={self.rollout_steps}]"
            )
        # Every float must be finite as well as in range: NaN passes every `x <= 0` test and
        # inf passes `x > 0`, and either one turns the first update's weights NaN (a run that
        # starts, then dies in a tensor dump instead of saying which setting was wrong).
        if not finite_in(self.lr, lambda x: x > 0):
            p.append(f"lr={self.lr}: must be a finite number > 0, e.g. 3e-4")
        if not finite_in(self.gamma, lambda x: 0 <= x <= 1):
            p.append(f"gamma={self.gamma}: must be a finite number in [0, 1], e.g. 0.99")
        if not finite_in(self.gae_lambda, lambda x: 0 <= x <= 1):
            p.append(f"gae_lambda={self.gae_lambda}: must be a finite number in [0, 1], e.g. 0.95")
        if not finite_in(self.clip, lambda x: 0 < x < 1):
            p.append(f"clip={self.clip}: must be a finite number in (0, 1), e.g. 0.2")
        if self.value_clip is not None and not finite_in(self.value_clip, lambda x: x > 0):
            p.append(
                f"value_clip={self.value_clip}: must be a finite number > 0, or None to disable"
            )
        if not finite_in(self.max_grad_norm, lambda x: x > 0):
            p.append(
                f"max_grad_norm={self.max_grad_norm}: must be a finite number > 0 (gradients "
                "are clipped to that norm; a large value such as 1e6 leaves them alone)"
            )
        if not finite_in(self.adam_eps, lambda x: x > 0):
            p.append(
                f"adam_eps={self.adam_eps}: must be a finite number > 0 (it keeps Adam's step "
                "finite), e.g. 1e-5"
            )
        if self.target_kl is not None and not finite_in(self.target_kl, lambda x: x > 0):
            p.append(
                f"target_kl={self.target_kl}: must be a finite number > 0 (an update stops early "
                "past it), or None to run every epoch"
            )
        # Clipping to [-c, c] with c <= 0 would flatten every observation or reward to one value.
        if not finite_in(self.obs_clip, lambda x: x > 0):
            p.append(
                f"obs_clip={self.obs_clip}: must be a finite number > 0 (normalised observations "
                "lie in ±it; a large value such as 1e6 clips nothing)"
            )
        if not finite_in(self.reward_clip, lambda x: x > 0):
            p.append(
                f"reward_clip={self.reward_clip}: must be a finite number > 0 (scaled rewards lie "
                "in ±it; a large value such as 1e6 clips nothing)"
            )
        if not (
            finite_in(self.vf_coef, lambda x: x >= 0) and finite_in(self.ent_coef, lambda x: x >= 0)
        ):
            p.append(
                f"vf_coef={self.vf_coef}, ent_coef={self.ent_coef}: must be >= 0 and finite (a "
                "negative weight would push the value loss up, or the entropy down)"
            )
        if any(type(h) is not int or h < 1 for h in self.hidden):
            p.append(f"hidden={list(self.hidden)}: layer widths must be positive integers")
        # torch seeds from a 64-bit integer: past that range the policy worker failed to start
        # with torch's "Overflow when unpacking long long", naming no key.
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)):
            p.append(f"seed={self.seed!r}: must be a whole number, e.g. 0")
        elif not -(2**63) <= self.seed < 2**64:
            p.append(
                f"seed={self.seed}: must fit torch's 64-bit seed, in [0, 2**64 = {2**64}), e.g. 0"
            )
        if p:
            raise ConfigError(p, source="PPOConfig")


def compute_advantages(
    buffer: RolloutBuffer, gamma: float, lam: float, rewards: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """GAE over the buffer -> (advantages [T, N], returns [T, N]).

    Truncated steps get ``gamma * V(final obs)`` added to their reward and are then cut like
    terminal ones, which bootstraps through a time limit without crossing into the next episode.
    A step both terminal and truncated (gymnasium's TimeLimit truncates on its last step whether
    or not the episode also ended there) is terminal: nothing follows it to bootstrap from.
    """
    r = buffer.rewards if rewards is None else rewards
    cut = buffer.truncated & ~buffer.terminated
    r = r + gamma * buffer.final_values * cut.float()
    return gae(r, buffer.values, buffer.dones.float(), buffer.last_value, gamma, lam)


UPDATE_STATS = (
    "policy_loss",
    "value_loss",
    "entropy",
    "approx_kl",
    "clip_frac",
    "grad_norm",
    "skipped",
)
_KL = UPDATE_STATS.index("approx_kl")
_GN = UPDATE_STATS.index("grad_norm")
_SKIP = UPDATE_STATS.index("skipped")
# A minibatch step whose gradient norm is not finite is skipped (weights and Adam's moments
# kept); this many in a row, across updates, end training: the run has diverged rather than
# met one bad minibatch.
MAX_NONFINITE_STEPS = 3


def ppo_step(
    policy: Any,
    optimizer: torch.optim.Optimizer,
    cfg: PPOConfig,
    mb: dict[str, Tensor],
    *,
    validate: bool | None = None,
) -> Tensor:
    """One clipped-PPO step on a minibatch: forward, losses, backward, gradient clipping and the
    optimizer's step. ``mb`` holds ``obs``, ``actions``, ``old_logp``, ``adv``, ``ret`` and
    ``old_v`` ([M, ...] each). Returns the step's ``UPDATE_STATS`` as one tensor [6] on the
    device, unread (reading it waits for the device). ``validate`` goes to ``policy.evaluate``
    when given (False skips torch.distributions' checks, which read the device)."""
    kw = {} if validate is None else {"validate": validate}
    logp, ent, v = evaluated(policy, mb["obs"], mb["actions"], **kw)
    if not (logp.requires_grad or v.requires_grad):
        # Else the backward below fails with autograd's bare "does not require grad".
        raise ConfigError(
            [
                "the policy's evaluate() returned log-probs and values that carry no gradient "
                "(detached, or computed under torch.no_grad()): PPO trains through them; "
                "return them with their autograd graph"
            ]
        )
    a = mb["adv"]
    if cfg.norm_adv and a.shape[0] > 1:
        a = (a - a.mean()) / (a.std() + 1e-8)
    ones = torch.ones_like(a)
    pg, st = ppo_policy_loss(logp, mb["old_logp"], a, ones, cfg.clip, cfg.clip, sync_stats=False)
    vl = value_loss(v, mb["old_v"], mb["ret"], ones, cfg.value_clip)
    entropy = ent.mean()
    loss = pg - cfg.ent_coef * entropy + cfg.vf_coef * vl
    optimizer.zero_grad()
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
    bad = ~torch.isfinite(gn)
    _step_unless(optimizer, bad)
    parts = (pg, vl, entropy, st["approx_kl"], st["clip_frac"], gn, bad)
    return torch.stack([x.detach().float().reshape(()) for x in parts])


def _step_unless(optimizer: torch.optim.Optimizer, bad: Tensor) -> None:
    """The optimizer's step, unless ``bad`` (a bool tensor) is set: then weights, moments and
    step count stay as they were. A fused optimizer takes the flag on the device, as it does
    from a gradient scaler, so that the step neither waits for the device nor stops a CUDA
    graph from recording it; any other reads it (on the host: no wait)."""
    if any(g.get("fused") for g in optimizer.param_groups):
        optimizer.found_inf = bad.float()  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf  # type: ignore[attr-defined]
    elif not bool(bad):
        optimizer.step()


def evaluated(policy: Any, obs: Tensor, actions: Tensor, **kw: Any) -> tuple:
    """``policy.evaluate(obs, actions, **kw)``: (log-probs, entropies, values), or a
    ``ConfigError`` saying what a user's policy returned instead (a bare unpacking error, or a
    shape error deep in a loss, would not name evaluate())."""
    out = three_tensors(
        policy.evaluate(obs, actions, **kw),
        "the policy's evaluate(obs, actions)",
        "log-probs, entropies, values",
    )
    _check_evaluated(len(actions), *out)
    return out


def three_tensors(out: Any, call: str, names: str) -> tuple:
    """``out`` as a tuple of three tensors, or a ``ConfigError``: ``call`` must return
    (``names``), and what it returned instead."""
    if isinstance(out, (tuple, list)) and len(out) == 3:
        if all(isinstance(x, Tensor) for x in out):
            return tuple(out)
        got = "(" + ", ".join(type(x).__name__ for x in out) + ")"
    elif isinstance(out, (tuple, list)):
        got = f"{type(out).__name__} of {len(out)} values"
    else:
        got = type(out).__name__
    raise ConfigError([f"{call} must return ({names}) as three torch tensors, got {got}"])


def _check_evaluated(n: int, logp: Any, ent: Any, v: Any) -> None:
    """A policy's evaluate() gives log-probs [n], entropies [n] (or one) and values [n]. A
    value of [n, 1], the usual slip, would otherwise end in a loss's bare shape error, or
    broadcast to [n, n] and train on nonsense."""
    shapes = [tuple(getattr(x, "shape", ())) for x in (logp, ent, v)]
    want = [[(n,)], [(n,), ()], [(n,)]]
    bad = [
        f"{k} of shape {list(got)}, expected [{n}]"
        for k, got, ok in zip(("log-probs", "entropies", "values"), shapes, want, strict=True)
        if got not in ok
    ]
    if bad:
        raise ConfigError(
            [
                f"the policy's evaluate() on {n} observations returned "
                + "; ".join(bad)
                + " (it returns log-probs, entropies and values, one row per observation)"
            ]
        )


def capturable_adam(params: Any, lr: float, eps: float, device: Any) -> torch.optim.Adam:
    """Adam that a ``GraphedPPOStep`` can record: fused (one kernel per step), capturable, and
    with its learning rate a tensor on ``device``, changed in place (``set_lr``)."""
    lr_t = torch.tensor(lr, device=device)
    return torch.optim.Adam(params, lr=lr_t, eps=eps, fused=True, capturable=True)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every group's learning rate: in place where it is a tensor (a recorded step reads
    it there), else replaced."""
    for g in optimizer.param_groups:
        if isinstance(g["lr"], Tensor):
            g["lr"].fill_(lr)
        else:
            g["lr"] = lr


class GraphedPPOStep:
    """``ppo_step`` recorded once as a CUDA graph (forward, backward, clipping and the optimizer
    step) and replayed for each minibatch.

    The minibatch step of a small policy is a few hundred kernels of microseconds each; launched
    one by one from Python, a pixel policy's update took 3.5-4x as long as replaying them
    (``scripts/gpu/update_profile.py``).

    Needs a capturable optimizer (``capturable_adam``) and a policy whose ``evaluate`` takes
    ``validate=False``. A replay reads tensors only: the learning rate must be a tensor changed
    in place (a float would be recorded into the graph), and every other setting (clip,
    coefficients, max_grad_norm, Adam's betas and eps) is fixed when the step is recorded. The
    first ``warmup`` (>= 1) steps of each layout run eagerly on a side stream, as recording
    requires (they are real steps, and create the optimizer's state); a minibatch of another
    shape, or parameters or optimizer state at new addresses (moved off the device and back),
    record again. If recording fails, every later step runs eagerly and ``failed`` says why.
    """

    def __init__(
        self, policy: Any, optimizer: torch.optim.Optimizer, cfg: PPOConfig, warmup: int = 2
    ):
        if warmup < 1:
            raise ValueError(
                f"GraphedPPOStep: warmup={warmup} must be >= 1 (the optimizer's state has to "
                "exist before the step is recorded)"
            )
        self.policy, self.optimizer, self.cfg, self.warmup = policy, optimizer, cfg, warmup
        self.graph: torch.cuda.CUDAGraph | None = None
        self.key: tuple | None = None
        self.static_in: dict[str, Tensor] = {}
        self.static_out: Tensor | None = None
        self.warm = 0
        self.captures = 0
        self.failed: str | None = None

    def release(self) -> None:
        """Drop the recorded graph and the device memory it holds."""
        self.graph, self.key, self.static_in, self.static_out, self.warm = None, None, {}, None, 0

    def _key(self, mb: dict[str, Tensor]) -> tuple:
        state = [t for st in self.optimizer.state.values() for t in st.values()]
        return (
            tuple((k, tuple(v.shape), v.dtype, v.device) for k, v in mb.items()),
            tuple(p.data_ptr() for p in self.policy.parameters()),
            tuple(t.data_ptr() for t in state if isinstance(t, Tensor)),
        )

    def __call__(self, mb: dict[str, Tensor]) -> Tensor:
        if self.failed is not None:
            return ppo_step(self.policy, self.optimizer, self.cfg, mb)
        if self.graph is not None and self._key(mb) == self.key:
            for k, v in mb.items():
                self.static_in[k].copy_(v)
            self.graph.replay()
            return self.static_out.clone()  # type: ignore[union-attr]
        if self.graph is not None:
            self.release()
        device = mb["obs"].device
        main = torch.cuda.current_stream(device)
        if self.warm < self.warmup:
            self.warm += 1
            side = torch.cuda.Stream(device)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                row = ppo_step(self.policy, self.optimizer, self.cfg, mb, validate=False)
            main.wait_stream(side)
            return row.clone()
        self.static_in = {k: v.clone() for k, v in mb.items()}
        self.optimizer.zero_grad(set_to_none=True)  # gradients are allocated by the recording
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                out = ppo_step(
                    self.policy, self.optimizer, self.cfg, self.static_in, validate=False
                )
        except RuntimeError as e:  # an op that cannot be recorded
            self.failed = f"{type(e).__name__}: {e}"
        if self.failed is not None:
            # Out of the except block, so that the failed recording's autograd graph (held by
            # the exception's frames there) is gone before the eager step runs.
            self.release()
            self.optimizer.zero_grad(set_to_none=True)
            warnings.warn(
                f"the PPO step runs eagerly: recording it as a CUDA graph failed ({self.failed}); "
                "policy_step_graph: false skips the attempt",
                stacklevel=2,
            )
            return ppo_step(self.policy, self.optimizer, self.cfg, mb)
        self.graph, self.static_out, self.key = graph, out, self._key(mb)
        self.captures += 1
        graph.replay()  # recording ran nothing: this is the step of this minibatch
        return out.clone()


def ppo_update(
    policy: Any,
    optimizer: torch.optim.Optimizer,
    buffer: RolloutBuffer,
    cfg: PPOConfig,
    *,
    rewards: Tensor | None = None,
    generator: torch.Generator | None = None,
    step: Callable[[dict[str, Tensor]], Tensor] | None = None,
    nonfinite_before: int = 0,
) -> dict[str, float]:
    """``cfg.epochs`` passes of clipped PPO over the buffer in ``cfg.num_minibatches`` minibatches.

    ``rewards`` [T, N] replaces ``buffer.rewards`` (e.g. scaled rewards). ``generator`` drives
    the minibatch shuffle. ``step`` runs one minibatch (default ``ppo_step`` with ``policy`` and
    ``optimizer``; e.g. a ``GraphedPPOStep`` on them). Returns mean losses, approx_kl,
    clip_frac, explained_variance, grad_norm (of the steps taken), the number of epochs run
    (fewer when ``target_kl`` stops early), ``skipped`` (minibatch steps whose gradient norm was
    not finite, not applied) and ``nonfinite_in_a_row`` (such steps at the end, counting the
    ``nonfinite_before`` that ended the previous update). ``MAX_NONFINITE_STEPS`` in a row raise
    ``TrainingError``.
    """
    adv, ret = compute_advantages(buffer, cfg.gamma, cfg.gae_lambda, rewards)
    T, N = buffer.num_steps, buffer.num_envs
    B = T * N
    old_v = buffer.values.reshape(B)
    data = {
        "obs": buffer.obs.reshape(B, *buffer.obs.shape[2:]),
        "actions": buffer.actions.reshape(B, *buffer.actions.shape[2:]),
        "old_logp": buffer.logp.reshape(B),
        "adv": adv.reshape(B),
        "ret": ret.reshape(B),
        "old_v": old_v,
    }
    if step is None:
        step = functools.partial(ppo_step, policy, optimizer, cfg)
    mb = max(B // cfg.num_minibatches, 1)
    # Each minibatch's stats stay on the device, read once at the end (and the KL once per
    # epoch under target_kl): a read per minibatch would make the host wait for the device
    # every step instead of queueing the next one while it works.
    rows: list[Tensor] = []
    epochs_run = 0
    for _epoch in range(cfg.epochs):
        epochs_run += 1
        # Drawn on the host (the generator's stream is the same on every device), indexed
        # where the data is.
        perm = torch.randperm(B, generator=generator).to(data["obs"].device)
        first = len(rows)
        for start in range(0, B - mb + 1, mb):
            idx = perm[start : start + mb]
            rows.append(step({k: v[idx] for k, v in data.items()}))
        if cfg.target_kl is not None:
            if float(torch.stack(rows[first:])[:, _KL].mean()) > cfg.target_kl:
                break
    table = torch.stack(rows)
    k = len(UPDATE_STATS)
    # One read from the device for the means, each step's skip flag and the return variances.
    spread = torch.stack([data["ret"].var(), (data["ret"] - old_v).var()])
    read = torch.cat([table.mean(0), table[:, _SKIP], spread.to(table.dtype)]).tolist()
    stats = dict(zip(UPDATE_STATS, read[:k], strict=True))
    skipped, (var_r, var_err) = read[k:-2], read[-2:]
    if any(skipped):  # the steps taken's norm: a skipped one's is NaN or inf
        taken = table[:, _GN][table[:, _SKIP] == 0]
        stats["grad_norm"] = float(taken.mean()) if len(taken) else float("nan")
    stats["skipped"] = float(sum(skipped))
    stats["nonfinite_in_a_row"] = float(nonfinite_streak(nonfinite_before, skipped, table))
    stats["explained_variance"] = float("nan") if var_r == 0 else 1.0 - var_err / var_r
    stats["epochs"] = float(epochs_run)
    return stats


def nonfinite_streak(before: int, skipped: Sequence[float], table: Tensor | None = None) -> int:
    """Skipped steps in a row at the end of ``skipped`` (1.0 per skipped step, in order), after
    ``before`` at the end of the previous update. ``MAX_NONFINITE_STEPS`` in a row anywhere is a
    ``TrainingError`` (``table``: the update's stats rows, for the losses it names)."""
    run = before
    for i, s in enumerate(skipped):
        run = run + 1 if s else 0
        if run >= MAX_NONFINITE_STEPS:
            from loomrl.errors import TrainingError

            losses = (
                ""
                if table is None
                else f" (policy loss {table[i, 0]:.4g}, value loss {table[i, 1]:.4g})"
            )
            raise TrainingError(
                f"{run} PPO steps in a row had a non-finite gradient norm{losses} and were "
                f"skipped ({MAX_NONFINITE_STEPS} end training): it has diverged. The weights are "
                "those of the last finite step. Lower ppo.lr or ppo.max_grad_norm, or check the "
                "rewards and observations for NaN or huge values"
            )
    return run


# ---------------------------------------------------------------------------------------------
# single-process training loop


@dataclass
class TrainResult:
    """curve: one dict per update: steps, time_s, mean_return (last ``window`` episodes), episodes."""

    curve: list[dict[str, float]]
    steps: int
    time_s: float
    steps_per_s: float
    reached_target: bool
    target_step: int | None
    target_time_s: float | None
    final_mean_return: float
    policy: Any = None
    normalizer: RunningMeanStd | None = None


def train_ppo(
    env_cfg: EnvConfig,
    ppo_cfg: PPOConfig,
    total_steps: int,
    time_limit_s: float | None = None,
    *,
    target_return: float | None = None,
    window: int = 10,
    groups: int = 1,
    torch_threads: int | None = 1,
    log: Any = None,
) -> TrainResult:
    """Train PPO on ``env_cfg`` for ``total_steps`` transitions (or until ``time_limit_s`` or the
    mean of the last ``window`` episode returns reaches ``target_return``).

    ``torch_threads`` is torch's intra-op thread count while training (restored afterwards;
    None leaves it alone): 64-unit MLPs run fastest on one thread.
    """
    before = torch.get_num_threads()
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    try:
        return _train_ppo(
            env_cfg, ppo_cfg, total_steps, time_limit_s, target_return, window, groups, log
        )
    finally:
        torch.set_num_threads(before)


def _train_ppo(
    env_cfg: EnvConfig,
    ppo_cfg: PPOConfig,
    total_steps: int,
    time_limit_s: float | None,
    target_return: float | None,
    window: int,
    groups: int,
    log: Any,
) -> TrainResult:
    bad = []
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        bad.append(
            f"total_steps={total_steps!r}: must be a whole number >= 1 (transitions to train on; "
            f"updates of ppo.rollout_steps={ppo_cfg.rollout_steps} each, at least one)"
        )
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        bad.append(f"window={window!r}: must be a whole number >= 1 (episodes in mean_return)")
    if bad:
        raise ConfigError(bad, source="train_ppo")
    torch.manual_seed(ppo_cfg.seed)
    env = VecEnv(env_cfg)
    if ppo_cfg.rollout_steps % env.num_envs:
        raise ConfigError(
            [
                f"rollout_steps={ppo_cfg.rollout_steps} is not a multiple of num_envs={env.num_envs}; "
                "pick values whose ratio is the steps per env per update"
            ],
            source="PPOConfig",
        )
    problem = rollout_memory_problem(
        env_cfg, ppo_cfg.rollout_steps, ppo_cfg.normalize_obs, env.obs_shape, NodeMemory()
    )
    if problem is not None:  # the buffers are allocated lazily: they would fill it mid-rollout
        env.close()
        raise ConfigError([problem], source="train_ppo")
    T = ppo_cfg.rollout_steps // env.num_envs
    policy = make_policy(
        env.single_observation_space,
        env.single_action_space,
        seed=ppo_cfg.seed,
        **({"hidden": ppo_cfg.hidden} if len(env.obs_shape) == 1 else {}),
    )
    optimizer = torch.optim.Adam(policy.parameters(), lr=ppo_cfg.lr, eps=ppo_cfg.adam_eps)
    pixels = len(env.obs_shape) == 3
    normalizer = RunningMeanStd(env.obs_shape) if ppo_cfg.normalize_obs and not pixels else None
    scaler = (
        RewardScaler(env.num_envs, ppo_cfg.gamma, ppo_cfg.reward_clip)
        if ppo_cfg.normalize_reward
        else None
    )
    shuffle = torch.Generator().manual_seed(ppo_cfg.seed)
    nonfinite = 0  # minibatch steps skipped in a row for a non-finite gradient
    num_updates = max(total_steps // ppo_cfg.rollout_steps, 1)
    recent: deque[float] = deque(maxlen=window)
    curve: list[dict[str, float]] = []
    t_start, steps = time.perf_counter(), 0
    target_step = target_time = None
    for update in range(num_updates):
        if ppo_cfg.anneal_lr:
            set_lr(optimizer, ppo_cfg.lr * (1.0 - update / num_updates))
        buf = collect(env, policy, T, groups, normalizer=normalizer, obs_clip=ppo_cfg.obs_clip)
        rewards = None
        if scaler is not None:
            scaler.update(buf.rewards.numpy(), buf.dones.numpy())
            rewards = scaler.scale(buf.rewards)
        stats = ppo_update(
            policy,
            optimizer,
            buf,
            ppo_cfg,
            rewards=rewards,
            generator=shuffle,
            nonfinite_before=nonfinite,
        )
        nonfinite = int(stats["nonfinite_in_a_row"])
        steps += T * env.num_envs
        recent.extend(buf.episodes.returns)
        elapsed = time.perf_counter() - t_start
        mean_ret = float(np.mean(recent)) if recent else float("nan")
        point = {
            "steps": steps,
            "time_s": elapsed,
            "mean_return": mean_ret,
            "episodes": len(buf.episodes.returns),
            **stats,
        }
        curve.append(point)
        if log is not None:
            log(point)
        if target_return is not None and len(recent) == window and mean_ret >= target_return:
            target_step, target_time = steps, elapsed
            break
        if time_limit_s is not None and elapsed > time_limit_s:
            break
    env.close()
    elapsed = time.perf_counter() - t_start
    return TrainResult(
        curve=curve,
        steps=steps,
        time_s=elapsed,
        steps_per_s=steps / max(elapsed, 1e-9),
        reached_target=target_step is not None,
        target_step=target_step,
        target_time_s=target_time,
        final_mean_return=curve[-1]["mean_return"] if curve else float("nan"),
        policy=policy,
        normalizer=normalizer,
    )


def _main(argv: Sequence[str] | None = None) -> None:
    import argparse
    import sys

    p = argparse.ArgumentParser(description="Single-process PPO on a gymnasium MuJoCo env.")
    p.add_argument("env_id")
    p.add_argument("--total-steps", type=int, default=1_000_000)
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-limit", type=float, default=None)
    p.add_argument("--target-return", type=float, default=None)
    p.add_argument("--groups", type=int, default=1)
    a = p.parse_args(argv)

    def log(pt: dict[str, float]) -> None:
        print(
            f"steps={pt['steps']:>8} t={pt['time_s']:7.1f}s return={pt['mean_return']:9.2f} "
            f"kl={pt['approx_kl']:.4f} ev={pt['explained_variance']:.3f}",
            flush=True,
        )

    try:
        r = train_ppo(
            EnvConfig(a.env_id, num_envs=a.num_envs, seed=a.seed),
            PPOConfig(seed=a.seed),
            a.total_steps,
            a.time_limit,
            target_return=a.target_return,
            groups=a.groups,
            log=log,
        )
    except ConfigError as e:  # a mistyped env id or flag: said as `loomrl run` says it
        print(f"python -m loomrl.embodied: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(
        f"done: {r.steps} steps in {r.time_s:.1f}s ({r.steps_per_s:.0f} steps/s), "
        f"final mean return {r.final_mean_return:.1f}, target at {r.target_step} steps / {r.target_time_s} s"
    )


if __name__ == "__main__":
    _main()
