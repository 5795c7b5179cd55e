"""The policy worker: batched inference for the env <-> policy cycle, and the PPO learner.

One process holds the policy (any ``torch.nn.Module`` with ``act`` / ``evaluate``, see
``loomrl.policies``), its optimizer, the observation normaliser and the reward scaler. During a
rollout it receives the env workers' replies (``loomrl.workers.env.StepReply``) group by group,
records every transition straight into a [steps, num_envs] rollout buffer indexed by global env
id, and answers with actions. Keeping the buffer here means the driver only passes object
references around: no trajectory data goes through it, and the update needs no transfer.

Recording follows ``loomrl.embodied.collect`` exactly (the sequential reference): the normaliser
is read-only during a rollout and updated once at its end with every raw observation in
(time, env) order; truncated steps get V(final obs) for bootstrapping; a row's action is drawn
from a generator keyed by (env seed, global env id, env step). So the buffer cannot depend on how
the envs were grouped, spread over workers, or pipelined.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib
import inspect
import statistics
import time
from dataclasses import fields, replace
from typing import Any

import numpy as np

from loomrl.errors import ConfigError, LoomError
from loomrl.worker import Worker

__all__ = [
    "BUILT_IN_POLICIES",
    "HandoffError",
    "PolicyWorker",
    "build_policy",
    "policy_spec_problems",
]

BUILT_IN_POLICIES = ("auto", "mlp", "cnn")


class HandoffError(LoomError, RuntimeError):
    """A rollout over sockets (``serve_pipe``) stopped: an env worker raised, died or went
    silent; the message names which, and at which step. One of loomrl's own errors: its
    message says what happened (an env worker's error, such as too many simulator failures,
    in full), and serve_pipe's traceback under it on the command line was no news."""


def policy_spec_problems(spec: Any) -> list[str]:
    """Problems with the *form* of a policy name: one of ``BUILT_IN_POLICIES``, or
    ``package.module:factory`` with a dotted module path and a factory name that are Python
    identifiers. Pure: a factory's module is imported where the policy is built (the policy
    worker), but a malformed name is the config's, found before anything starts."""
    if isinstance(spec, str) and spec in BUILT_IN_POLICIES:
        return []
    use = "use 'auto', 'mlp', 'cnn', or 'package.module:factory' for a policy of your own"
    if not isinstance(spec, str) or ":" not in spec:
        import difflib

        close = difflib.get_close_matches(str(spec).lower(), BUILT_IN_POLICIES, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return [f"policy={spec!r}: not a built-in policy nor a factory; {hint}{use}"]
    module, _, factory = spec.partition(":")
    if not (all(part.isidentifier() for part in module.split(".")) and factory.isidentifier()):
        return [
            f"policy={spec!r}: a factory is named 'package.module:factory', a dotted module path "
            f"and a callable in it, each part a Python identifier (got module {module!r} and "
            f"factory {factory!r}); {use}"
        ]
    return []


def build_policy(
    spec: str,
    observation_space: Any,
    action_space: Any,
    seed: int,
    hidden: tuple[int, ...] = (64, 64),
    kwargs: dict[str, Any] | None = None,
) -> Any:
    """``spec``: "auto" (MLP for vectors, CNN for images), "mlp", "cnn", or "package.module:factory"
    (called as ``factory(observation_space, action_space, seed=seed, **kwargs)``)."""
    from loomrl.policies import CNNActorCritic, MLPActorCritic, make_policy

    if bad := policy_spec_problems(spec):
        raise ConfigError(bad)
    given, kwargs = dict(kwargs or {}), dict(kwargs or {})
    shape = tuple(observation_space.shape)
    image = len(shape) == 3 and observation_space.dtype == np.uint8
    if (spec == "cnn" and not image) or (spec == "auto" and not image and len(shape) != 1):
        raise ConfigError(
            [
                f"policy={spec!r}: no built-in policy for observations of shape {shape} "
                f"({observation_space.dtype}); the CNN takes uint8 images [C, H, W] "
                "(env.pixels=true, or an env whose observations are images), the MLP flat "
                "vectors; or give policy=package.module:factory"
            ]
        )
    import gymnasium as gym

    # Said here, naming the key, rather than by the policy's constructor inside the worker.
    if spec in BUILT_IN_POLICIES and not isinstance(
        action_space, (gym.spaces.Box, gym.spaces.Discrete)
    ):
        raise ConfigError(
            [
                f"policy={spec!r}: the built-in policies act in Box and Discrete action spaces, "
                f"and the env's is {action_space}; give policy=package.module:factory, an "
                "nn.Module with act()/evaluate() for that space"
            ]
        )
    if spec == "auto":
        if len(shape) == 1:
            kwargs.setdefault("hidden", hidden)
        make: Any = functools.partial(make_policy, observation_space)
    elif spec == "mlp":
        kwargs.setdefault("hidden", hidden)
        make = functools.partial(MLPActorCritic, int(np.prod(shape)))
    elif spec == "cnn":
        make = functools.partial(CNNActorCritic, shape)
    else:  # package.module:factory (its form checked above)
        mod_name, fn_name = spec.split(":", 1)
        try:
            fn = getattr(importlib.import_module(mod_name), fn_name)
        except (ImportError, AttributeError) as e:
            raise ConfigError(
                [f"policy={spec!r}: cannot import {fn_name!r} from {mod_name!r} ({e})"]
            ) from None
        if not callable(fn):
            raise ConfigError(
                [
                    f"policy={spec!r}: {mod_name}.{fn_name} is of type {type(fn).__name__}, "
                    "not a callable; name a function or class that builds the policy from "
                    "(observation_space, action_space, seed=..., **policy_kwargs)"
                ]
            )
        make = functools.partial(fn, observation_space)
    try:  # keywords that do not fit are the user's config; errors inside are the policy's own
        inspect.signature(make).bind(action_space, seed=seed, **kwargs)
    except TypeError as e:
        raise ConfigError(
            [
                f"policy={spec!r}: policy_kwargs={given} do not fit its arguments ({e}); it is "
                "called as (observation_space, action_space, seed=ppo.seed, **policy_kwargs)"
            ]
        ) from None

    def sizes() -> str:  # from the config: the allocator's traceback would not say which key
        if "hidden" in kwargs:
            src = "policy_kwargs.hidden" if "hidden" in given else "ppo.hidden"
            h = kwargs["hidden"]
            return f"{src}={list(h) if isinstance(h, (list, tuple)) else repr(h)}"
        return f"policy_kwargs={given}, observations of shape {list(shape)}"

    if spec == "mlp" or (spec == "auto" and len(shape) == 1):  # the built-in MLP
        # Compared before building: on a GPU host, a test's 2**40-unit layer, which this
        # project's CPU allocator refuses at once, was still running at a 90 s cap.
        need = mlp_training_bytes(int(np.prod(shape)), kwargs["hidden"], action_space)
        have = _host_memory_bytes()
        if need is not None and have and need > have:
            raise ConfigError(
                [
                    f"policy={spec!r}: the policy built with {sizes()} does not fit in the "
                    f"policy worker's memory (its weights, gradients and Adam's two moments "
                    f"take about {need / 1e9:.3g} GB, and this machine has {have / 1e9:.3g} GB); "
                    "use smaller layers"
                ]
            )
    try:
        net = make(action_space, seed=seed, **kwargs)
    except (MemoryError, RuntimeError) as e:
        if spec not in BUILT_IN_POLICIES or not _out_of_memory(e):
            raise
        raise ConfigError(
            [
                f"policy={spec!r}: the policy built with {sizes()} does not fit in the policy "
                f"worker's memory ({str(e).splitlines()[0][:200]}); use smaller layers"
            ]
        ) from None
    import torch

    missing = [m for m in ("act", "evaluate", "parameters") if not callable(getattr(net, m, None))]
    # The worker moves it to its device, saves and loads its state_dict: an nn.Module's.
    if missing or not isinstance(net, torch.nn.Module):
        raise ConfigError(
            [
                f"policy={spec!r} built a {type(net).__name__}"
                + (f" without {missing}" if missing else ", not a torch.nn.Module")
                + "; a policy is a torch.nn.Module with act(obs) -> (action, logp, value) and "
                "evaluate(obs, action) -> (logp, entropy, value)"
            ]
        )
    # Adam refuses an empty parameter list with a bare ValueError from inside the worker.
    if not any(getattr(p, "requires_grad", False) for p in net.parameters()):
        raise ConfigError(
            [
                f"policy={spec!r} built a {type(net).__name__} with no trainable parameters "
                "(parameters() is empty, or every one has requires_grad=False): PPO trains the "
                "policy's parameters; keep its layers as attributes of the nn.Module"
            ]
        )
    return net


def mlp_training_bytes(obs_dim: int, hidden: Any, action_space: Any) -> int | None:
    """Bytes the built-in MLP policy takes to train in float32: its actor's and critic's
    weights and biases, their gradients and Adam's two moments (4 copies). None when ``hidden``
    is no sequence of whole numbers (the constructor names that)."""
    try:
        layers = [int(h) for h in hidden]
    except (TypeError, ValueError):
        return None
    n = getattr(action_space, "n", None)
    out = int(n) if n is not None else int(np.prod(getattr(action_space, "shape", ()) or (1,)))
    params = 0 if n is not None else out  # a Box's actions have a log-std each
    for last in (out, 1):  # actor, critic
        sizes = [obs_dim, *layers, last]
        params += sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:], strict=True))
    return 4 * 4 * params


def _host_memory_bytes() -> int | None:
    """This machine's physical memory, or None where the OS does not say."""
    import os

    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def _out_of_memory(e: BaseException) -> bool:
    """An allocation failure: Python's, torch's (a device's), or the CPU allocator's, which
    torch raises as a plain RuntimeError."""
    import torch

    return isinstance(e, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in str(e)


class PolicyWorker(Worker):
    """Policy inference and PPO updates for ``num_envs`` envs (all env workers together)."""

    def __init__(
        self,
        observation_space: Any,
        action_space: Any,
        num_envs: int,
        ppo: Any,
        row_seed: int,
        policy: str = "auto",
        policy_kwargs: dict[str, Any] | None = None,
        threads: int | None = None,
        cuda_graphs: bool = True,
        step_graph: bool = True,
    ) -> None:
        super().__init__()
        import torch

        from loomrl.embodied import RewardScaler, RunningMeanStd, _accepts_generators

        self.ppo = ppo
        self.num_envs = num_envs
        self.row_seed = row_seed
        self.obs_shape = tuple(observation_space.shape)
        self.pixels = len(self.obs_shape) == 3
        self.device = self.torch_device
        if threads is None and not self.pixels:
            threads = 1  # 64-unit MLPs are fastest on one thread; more only adds contention
        if threads:
            torch.set_num_threads(threads)
        self.spec = policy
        self.net = build_policy(
            policy, observation_space, action_space, ppo.seed, tuple(ppo.hidden), policy_kwargs
        ).to(self.device)
        # Built-in policies only: a user's act() may draw on the host mid-forward.
        self.graphs = bool(
            cuda_graphs
            and self.device != "cpu"
            and callable(getattr(self.net, "use_cuda_graphs", None))
        )
        if self.graphs:
            self.net.use_cuda_graphs()
        self.step_graph = self.graphs and step_graph
        self.optimizer, self.train_step = self._trainer(self.net)
        self.normalizer = (
            RunningMeanStd(self.obs_shape) if ppo.normalize_obs and not self.pixels else None
        )
        self.scaler = (
            RewardScaler(num_envs, ppo.gamma, ppo.reward_clip) if ppo.normalize_reward else None
        )
        self.shuffle = torch.Generator().manual_seed(ppo.seed)
        self.per_row = _accepts_generators(self.net)
        self._gens: list[Any] = []  # re-seeded every act (row_generators' reuse)
        # Row counts of the calls the layouts served since the graphs were last released can make.
        self._call_sizes: set[int] = set()
        # Of those, the ones whose graphs are recorded at the next act, before it acts.
        self._to_record: set[int] = set()
        self.action_shape = tuple(getattr(action_space, "shape", ()) or ())
        import gymnasium as gym

        from loomrl.envs.vec import int_action_bounds

        # Integer actions' [low, high) per element (Discrete, MultiDiscrete, MultiBinary): a user
        # policy's actions are checked against them here, where the error can name the policy,
        # not in the env worker that steps them.
        self.action_space = action_space
        self.int_bounds = (
            tuple(torch.as_tensor(x) for x in int_action_bounds(action_space))
            if isinstance(
                action_space,
                (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary),
            )
            else None
        )
        # A float Box's actions are stored as the policy returns them and evaluated again in the
        # update: integer ones are not the actions act() gave log-probs for.
        self.float_box = isinstance(action_space, gym.spaces.Box) and np.issubdtype(
            action_space.dtype, np.floating
        )
        self.buffer: Any = None
        self._listener: Any = None  # serve_pipe's socket, made by listen()
        self.busy_s = 0.0
        # Pipe rollouts: seconds waiting for env replies and reading them, for the cycle's
        # timing report beside busy_s.
        self.idle_s = 0.0
        self.calls = 0
        self.updates = 0
        self.nonfinite_in_a_row = 0  # PPO steps skipped for a non-finite gradient, at the end

    # -- helpers ----------------------------------------------------------------------------------
    def _trainer(self, net: Any) -> tuple[Any, Any]:
        """The optimizer for ``net`` and the PPO step that drives it (None: eager ``ppo_step``).

        On a GPU, Adam is fused (one kernel per step rather than a dozen over the parameters),
        and with ``cuda_graphs``, ``step_graph`` and a built-in policy the whole minibatch step
        is recorded as a CUDA graph (``GraphedPPOStep``; Adam then capturable, its learning rate
        a tensor): the update of a small policy is bound by kernel launches, not arithmetic."""
        import torch

        from loomrl.embodied import GraphedPPOStep, capturable_adam

        lr, eps = self.ppo.lr, self.ppo.adam_eps
        if not str(self.device).startswith("cuda"):
            return torch.optim.Adam(net.parameters(), lr=lr, eps=eps), None
        if not (self.step_graph and callable(getattr(net, "use_cuda_graphs", None))):
            return torch.optim.Adam(net.parameters(), lr=lr, eps=eps, fused=True), None
        opt = capturable_adam(net.parameters(), lr, eps, self.device)
        return opt, GraphedPPOStep(net, opt, self.ppo)

    def _prep(self, raw: np.ndarray) -> Any:
        import torch

        if self.normalizer is None:
            return torch.as_tensor(raw)
        return torch.as_tensor(self.normalizer.normalize(raw, self.ppo.obs_clip))

    def _value(self, obs: Any) -> Any:
        from loomrl.embodied import _value_of

        return _value_of(self.net, obs.to(self.device)).float().cpu()

    def _act(self, raw: np.ndarray, env_ids: np.ndarray, env_steps: np.ndarray) -> tuple:
        import torch

        from loomrl.policies import row_generators

        o = self._prep(raw)
        with torch.no_grad():
            if self.per_row:
                gens = row_generators(self.row_seed, env_ids, env_steps, self._gens)
                if self.graphs:  # built-in, on a GPU: one graph, one copy each way, one wait
                    if self._to_record:  # every count the layout can call with (warm-up)
                        record = getattr(self.net, "record_act_graphs", None)
                        if callable(record):
                            record(self._to_record, o)
                        self._to_record.clear()
                    return (o, *self.net.act_host(o, gens))
                out = self.net.act(o.to(self.device), generators=gens)
            else:
                out = self.net.act(o.to(self.device))
        a, logp, v = self._three_tensors(out)
        # numpy has no bfloat16: a policy run in bf16 would fail at the actions' first .numpy()
        # with torch's words; float32 holds every bfloat16 value exactly.
        a = a.float().cpu() if a.dtype == torch.bfloat16 else a.cpu()
        logp, v = logp.float().cpu(), v.float().cpu()
        self._check_outputs(len(raw), a, logp, v)
        return o, a, logp, v

    def _three_tensors(self, out: Any) -> tuple:
        """act()'s (actions, log-probs, values), or a ConfigError saying what came instead."""
        from loomrl.embodied import three_tensors

        return three_tensors(out, f"policy={self.spec!r}: act()", "actions, log-probs, values")

    def _check_outputs(self, n: int, a: Any, logp: Any, v: Any) -> None:
        """A policy's act() gives actions [n, *action shape], log-probs [n] and values [n];
        anything else (a value of [n, 1] is the usual slip) would break the rollout's buffer
        with a bare broadcasting error, or fill it wrongly."""
        got = (tuple(a.shape), tuple(logp.shape), tuple(v.shape))
        want = ((n, *self.action_shape), (n,), (n,))
        if got == want:
            # Log-probs and values too: a NaN there makes the update's advantages and ratios
            # NaN, and every weight with them (then blamed on the actions of the next rollout).
            # Through numpy (the tensors are on the host here): a third of torch's time a call.
            bad = [
                k
                for k, x in (("actions", a), ("log-probs", logp), ("values", v))
                if x.is_floating_point() and not np.isfinite(x.detach().numpy()).all()
            ]
            if bad:
                raise ConfigError(
                    [
                        f"policy={self.spec!r}: act() returned NaN or infinite "
                        f"{' and '.join(bad)} (a diverged update? lower ppo.lr or check the "
                        "policy's outputs)"
                    ]
                )
            if self.int_bounds is not None and len(a) and (problem := self._discrete_problem(a)):
                raise ConfigError([f"policy={self.spec!r}: act() returned {problem}"])
            if self.float_box and not (a.is_floating_point() or a.is_complex()):
                raise ConfigError(
                    [
                        f"policy={self.spec!r}: act() returned actions of dtype {a.dtype} for "
                        f"{self.action_space}: the update evaluates the actions stored, so return "
                        "the float actions that act()'s log-probs are of"
                    ]
                )
            return
        bad = [
            f"{k} of shape {list(g)}, expected {list(w)}"
            for k, g, w in zip(("actions", "log-probs", "values"), got, want, strict=True)
            if g != w
        ]
        raise ConfigError(
            [
                f"policy={self.spec!r}: act() on {n} observations returned "
                + "; ".join(bad)
                + " (it returns actions, log-probs and values, one row per observation)"
            ]
        )

    def _discrete_problem(self, a: Any) -> str | None:
        """What is wrong with actions ``a`` for a Discrete, MultiDiscrete or MultiBinary space,
        or None: integer indices within the space's bounds, not floats, booleans or one-hot
        rows (those the shape check finds)."""
        import torch

        lo, hi = self.int_bounds  # type: ignore[misc]
        space = self.action_space
        if a.is_floating_point() or a.is_complex() or a.dtype == torch.bool:
            return (
                f"actions of dtype {a.dtype} for {space}: return integer indices "
                "(e.g. torch.long), such as a Categorical's sample()"
            )
        if not lo.shape:  # Discrete
            first, last = (int(x) for x in torch.aminmax(a))
            if first < int(lo) or last >= int(hi):
                return (
                    f"actions from {first} to {last} for {space}, whose actions lie in "
                    f"[{int(lo)}, {int(hi)})"
                )
            return None
        out = (a < lo) | (a >= hi)
        if bool(out.any()):
            row = int(out.reshape(len(a), -1).any(1).nonzero()[0])
            return (
                f"actions outside {space}'s bounds, e.g. row {row}: {a[row].tolist()}; each "
                f"element lies in [{lo.tolist()}, {hi.tolist()})"
            )
        return None

    # -- the rollout ------------------------------------------------------------------------------
    def begin(self, steps: int) -> None:
        """Allocate the [steps, num_envs] buffer of the next rollout."""
        import torch

        S, N = steps, self.num_envs
        obs_dtype = torch.uint8 if self.normalizer is None and self.pixels else torch.float32
        self._S = S
        self._obs = torch.zeros((S, N, *self.obs_shape), dtype=obs_dtype)
        # Raw observations feed the normaliser's update at the end; pixels have none.
        self._raw = (
            None if self.normalizer is None else np.zeros((S, N, *self.obs_shape), np.float32)
        )
        self._act_buf: Any = None  # dtype/shape known at the first act
        self._logp = torch.zeros(S, N)
        self._val = torch.zeros(S, N)
        self._rew = torch.zeros(S, N)
        self._term = torch.zeros(S, N, dtype=torch.bool)
        self._trunc = torch.zeros(S, N, dtype=torch.bool)
        self._fin = torch.zeros(S, N)
        self._last = torch.zeros(N)
        # Rows are stored through numpy views of the buffers: torch's indexed store of a pixel
        # group (index_put) took 0.53 ms for 32 rows of 64x64x3 on one core, numpy's 0.02.
        self._np = {
            k: getattr(self, k).numpy()
            for k in ("_obs", "_logp", "_val", "_rew", "_term", "_trunc", "_fin", "_last")
        }
        self.buffer = None

    def _record(self, ts: Any, parts: tuple[dict, ...]) -> None:
        """Store the outcome of step ``ts[i]`` of ``parts[i]`` (rewards, dones, V(final obs)
        where truncated)."""
        rows = np.concatenate([p["env_ids"] for p in parts])
        tt = _per_row(ts, parts)
        trunc = np.concatenate([p["truncated"] for p in parts]) | np.concatenate(
            [p["failed"] for p in parts]
        )
        b = self._np
        b["_rew"][tt, rows] = np.concatenate([p["reward"] for p in parts])  # as float32
        b["_term"][tt, rows] = np.concatenate([p["terminated"] for p in parts])
        b["_trunc"][tt, rows] = trunc
        if trunc.any():
            idx = np.flatnonzero(trunc)
            final = np.concatenate([p["final_obs"] for p in parts])[idx]
            b["_fin"][tt[idx], rows[idx]] = self._value(self._prep(final)).numpy()

    def act(self, t: int, *parts: dict) -> list[np.ndarray]:
        """Act at step ``t`` on the rows of ``parts`` (env replies of one group, in order); when
        the replies are step results, first record them as the outcome of step t - 1.
        Returns one action array per part."""
        return self.act_parts([t] * len(parts), parts)

    def act_parts(self, ts: list[int], parts: Any) -> list[np.ndarray]:
        """``act`` on parts each at its own step: part i at step ``ts[i]``, all in one call."""
        import torch

        t0 = time.perf_counter()
        stepped = [i for i, p in enumerate(parts) if "reward" in p]
        if stepped:
            self._record([ts[i] - 1 for i in stepped], tuple(parts[i] for i in stepped))
        raw = np.concatenate([p["obs"] for p in parts])
        ids = np.concatenate([p["env_ids"] for p in parts])
        steps = np.concatenate([p["env_steps"] for p in parts])
        o, a, logp, v = self._act(raw, ids, steps)
        if self._act_buf is None:
            self._act_buf = torch.zeros((self._S, self.num_envs, *a.shape[1:]), dtype=a.dtype)
            self._np["_act_buf"] = self._act_buf.numpy()
        b, tt = self._np, _per_row(ts, parts)
        b["_obs"][tt, ids] = o.numpy()  # cast as torch's .to() would (float64 -> float32)
        if self._raw is not None:
            self._raw[tt, ids] = raw
        b["_act_buf"][tt, ids] = a.numpy()
        b["_logp"][tt, ids] = logp.numpy()
        b["_val"][tt, ids] = v.numpy()
        out = np.split(a.numpy(), np.cumsum([len(p["env_ids"]) for p in parts])[:-1])
        self.busy_s += time.perf_counter() - t0
        self.calls += 1
        return out

    def close_group(self, *parts: dict) -> None:
        """Record the last step of a group and the values of the observations it reached."""

        t0 = time.perf_counter()
        self._record([self._S - 1] * len(parts), parts)
        ids = np.concatenate([p["env_ids"] for p in parts])
        self._np["_last"][ids] = self._value(
            self._prep(np.concatenate([p["obs"] for p in parts]))
        ).numpy()
        self.busy_s += time.perf_counter() - t0

    # -- the rollout over sockets (EnvPolicyCycle(handoff="pipe")) ------------------------------
    def listen(self) -> str:
        """The address of this worker's socket for ``serve_pipe`` (made on first call)."""
        from loomrl.transport._socket import Listener

        if self._listener is None:
            self._listener = Listener()
        return self._listener.address

    def _accept_pipe(self, token: str, workers: int, timeout: float) -> dict[int, Any]:
        """One connection per env worker rank of rollout ``token``, within ``timeout`` seconds
        in all. Connections of earlier rollouts still queued (an env worker that connected after
        its rollout failed) and anything else that is not this rollout's hello are closed; the
        driver's ``("abort", token, reason)`` stops the wait."""
        conns: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        try:
            while len(conns) < workers:
                conn = None
                try:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError
                    conn = self._listener.accept(left, timeout)
                    left = deadline - time.monotonic()
                    hello = conn.recv(max(left, 0.1), max_bytes=1 << 16)
                except TimeoutError:
                    if conn is not None:
                        conn.close()
                    missing = sorted(set(range(workers)) - set(conns))
                    raise HandoffError(
                        f"env workers {missing} did not connect within {timeout:g} s "
                        "(cycle_timeout_s)"
                    ) from None
                except Exception:  # a stray (closed early, another user's, not a pickle)
                    if conn is not None:
                        conn.close()
                    continue
                ok = isinstance(hello, tuple) and len(hello) == 3 and hello[1] == token
                if ok and hello[0] == "abort":
                    conn.close()
                    raise HandoffError(f"the driver stopped the rollout: {hello[2]}")
                if (
                    ok
                    and hello[0] == "hello"
                    and hello[2] in range(workers)
                    and hello[2] not in conns
                ):
                    conns[hello[2]] = conn
                else:
                    conn.close()
        except BaseException as e:
            _tell_and_close(conns.values(), e)
            raise
        return conns

    def serve_pipe(
        self,
        token: str,
        steps: int,
        groups: list[list[tuple[int, int, int]]],
        workers: int,
        timeout: float,
        min_rows: int = 0,
        begin: bool = False,
        finish: bool = False,
    ) -> dict[str, Any]:
        """Serve rollout ``token`` of ``steps`` steps to ``workers`` env workers connecting to
        ``listen()``'s socket (``EnvWorker.run_pipe``). ``groups``: per ring group, its parts as
        (env worker rank, lo, hi). The groups are visited in the driver's order, group after
        group each step, with the same ``act`` and ``close_group`` calls, so the buffer is the
        driver cycle's. An env worker that raises, dies or stays silent for ``timeout`` seconds
        stops the rollout with ``HandoffError`` naming it; an error here is sent to every env
        worker first, so none waits for actions that will not come. ``min_rows``: for a pipelined
        cycle, the rows to gather before acting (``_serve_ready``). ``begin`` and ``finish``: run
        ``begin(steps)`` first and ``finish()`` after, its result returned under "finish", so that
        a rollout costs the driver one call to the policy, not three.

        Returns the rollout's steps alone, without connecting or closing: ``span_s``, seconds
        from the start of the first act to the arrival of the last closing reply (the envs'
        results of the last step; for one group, ``steps`` round trips policy -> env ->
        policy), and ``act_busy_s``, the seconds of act calls in that span (``measure_costs``
        times the pipe's hand-offs with them)."""
        from loomrl.transport._socket import PeerClosed

        clock = {"first": 0.0, "last": 0.0, "busy0": 0.0, "busy1": 0.0}
        if begin:
            self.begin(steps)

        merged = len(groups) > 1 and self.rows_independent
        rows = [[hi - lo for _, lo, hi in parts] for parts in groups]
        self._expect_calls(
            call_sizes([r for g in rows for r in g]) if merged else {sum(g) for g in rows}
        )
        conns = self._accept_pipe(token, workers, timeout)

        def silent(w: int, t: int) -> HandoffError:
            return HandoffError(
                f"no reply from env worker {w} (its observations to act on at step {t}) within "
                f"{timeout:g} s (cycle_timeout_s; a stuck simulator?)"
            )

        def reply(w: int, t: int) -> dict:
            where = f"env worker {w} (its observations to act on at step {t})"
            w0 = time.perf_counter()
            try:
                kind, payload = conns[w].recv(timeout)
            except TimeoutError:
                raise silent(w, t) from None
            except PeerClosed:
                raise HandoffError(
                    f"{where} closed its connection (its process exited or died)"
                ) from None
            self.idle_s += time.perf_counter() - w0  # reading it, and in lockstep the wait
            if kind == "error":
                raise HandoffError(f"{where} failed: {payload}")
            if t == steps:  # a closing reply: the last one to arrive ends the span
                clock["last"], clock["busy1"] = time.perf_counter(), self.busy_s
            return payload

        def act(ts: list[int], ws: list[int], replies: list[dict], where: str) -> None:
            span = f"{min(ts)}" + (f" to {max(ts)}" if max(ts) != min(ts) else "")
            if not clock["first"]:
                clock["first"], clock["busy0"] = time.perf_counter(), self.busy_s
            try:
                actions = self.act_parts(ts, replies)
            except ConfigError:
                raise  # a user policy's mistake, already named (the env workers are told)
            except Exception as e:
                if len(set(ts)) == 1:
                    who = f"env workers {ws}"
                else:  # mixed steps: say which part was at which step
                    who = ", ".join(
                        f"env worker {w} at step {t}" for t, w in zip(ts, ws, strict=True)
                    )
                raise HandoffError(
                    f"policy.act at step {span} on {where} ({who}): {type(e).__name__}: {e}"
                ) from e
            for t, w, a in zip(ts, ws, actions, strict=True):
                try:
                    conns[w].send(("actions", a))
                except OSError:  # the env worker closed its end: say why, if it did
                    reason = conns[w].last_error()
                    raise HandoffError(
                        f"env worker {w} (its actions for step {t}) "
                        + (
                            f"failed: {reason}"
                            if reason is not None
                            else "closed its connection (its process exited or died)"
                        )
                    ) from None

        try:
            if merged:
                self._serve_ready(conns, steps, groups, reply, act, silent, timeout, min_rows)
            else:
                for t in range(steps):
                    for g, parts in enumerate(groups):
                        ws = [w for w, _, _ in parts]
                        act([t] * len(ws), ws, [reply(w, t) for w in ws], f"ring group {g}")
                for parts in groups:
                    self.close_group(*[reply(w, steps) for w, _, _ in parts])
        except BaseException as e:
            _tell_and_close(conns.values(), e)
            raise
        finally:
            for conn in conns.values():
                conn.close()
        out: dict[str, Any] = {
            "span_s": clock["last"] - clock["first"],
            "act_busy_s": clock["busy1"] - clock["busy0"],
        }
        if finish:
            out["finish"] = self.finish()
        return out

    def _expect_calls(self, sizes: set[int]) -> None:
        """Make the policy keep a recorded graph for every row count in ``sizes`` beside those
        of the layouts served since the graphs were last released (a trial's cycles take turns
        on these workers). Built-in policies round a graphed call's rows up to whole blocks, so
        fewer graphs are recorded than announced here; the limit only has to cover them. With
        room for 8 and no rounding, a pipelined cycle of more than 8 parts recorded graphs on
        nearly every call: on one H200 at 96 envs on 4 env workers, k = 3 (12 parts, 12 row
        counts) ran its trial rollouts at 0.28-0.41 s against k = 2's 0.19-0.25 back to back (8
        parts, 8 captures a run), and k = 2 right after k = 3 in a trial's turns at up to 0.35 s
        (scripts/gpu/RESULTS.md, calls CI and CK)."""
        self._to_record |= sizes - self._call_sizes
        self._call_sizes |= sizes
        reserve = getattr(self.net, "reserve_graph_shapes", None)
        if self.graphs and callable(reserve):  # a user's policy may record graphs its own way
            reserve(GRAPH_ROOM + len(self._call_sizes))

    @property
    def rows_independent(self) -> bool:
        """Whether a row's action depends on nothing but its observation and its generator, so
        that rows may be acted on in any company and order (built-in policies with
        ``batch_invariant``: blocks that passed their check, or rows one by one)."""
        return self.per_row and bool(getattr(self.net, "batch_invariant", False))

    def _serve_ready(
        self,
        conns: dict[int, Any],
        steps: int,
        groups: list[list[tuple[int, int, int]]],
        reply: Any,
        act: Any,
        silent: Any,
        timeout: float,
        min_rows: int = 0,
    ) -> None:
        """``serve_pipe`` for a pipelined cycle: act on whatever parts have replied, together,
        instead of ring group after ring group. In lockstep each group waits for its slowest
        env worker (a read-back queued behind other work on a shared GPU, say) and every
        worker waits for that group; here each env worker runs at its own pace, and when the
        policy falls behind, the parts that queued up go in one call. Rows are independent
        (``rows_independent``), so the buffer is the lockstep cycle's, bit for bit.

        ``min_rows`` > 0 gathers replies until they hold that many rows before acting, for
        fewer, larger calls where a call's fixed cost dominates. It never waits on replies
        that cannot come: once every env worker has sent all it can before its next actions,
        the policy acts on what it holds.

        An env worker's replies come in its parts' ring order, step after step: the n-th
        reply of a worker with p parts is part n % p's observation to act on at step n // p,
        step ``steps`` closing the part. A worker holding no unread actions (sent + p = got)
        waits for the policy."""
        import selectors

        nparts = {w: 0 for w in conns}
        for parts in groups:
            for w, _, _ in parts:
                nparts[w] += 1
        got = dict.fromkeys(conns, 0)
        sent = dict.fromkeys(conns, 0)  # actions sent to each env worker
        left = sum(nparts.values()) * (steps + 1)
        held: list[tuple[int, int, dict]] = []  # (step, env worker, reply) not acted on yet
        rows = 0  # in held

        def working() -> bool:  # some env worker has actions it has not answered yet
            return any(sent[w] + nparts[w] > got[w] for w in conns)

        with selectors.DefaultSelector() as sel:
            for w, conn in conns.items():
                sel.register(conn.sock, selectors.EVENT_READ, w)
            while left:
                ready: list[tuple[int, int, dict]] = []
                w0 = time.perf_counter()
                events = sel.select(timeout)
                self.idle_s += time.perf_counter() - w0
                while events:  # take every reply already here before acting
                    for key, _ in events:
                        w = key.data
                        t = got[w] // nparts[w]
                        ready.append((t, w, reply(w, t)))
                        got[w] += 1
                        if got[w] == nparts[w] * (steps + 1):
                            sel.unregister(key.fileobj)
                    events = sel.select(0) if len(ready) < left else []
                if not ready:  # nothing for ``timeout`` s: name the env worker furthest behind
                    w = min((w for w in conns if got[w] < nparts[w] * (steps + 1)), key=got.get)
                    raise silent(w, got[w] // nparts[w])
                left -= len(ready)
                closing = [r for t, _, r in ready if t == steps]
                if closing:
                    self.close_group(*closing)
                for x in ready:
                    if x[0] < steps:
                        held.append(x)
                        rows += len(x[2]["env_ids"])
                if held and (rows >= min_rows or not working()):
                    # A worker's actions go out in the order of its replies, its ring order.
                    ts, ws, replies = (list(c) for c in zip(*held, strict=True))
                    act(ts, ws, replies, "the parts that had replied")
                    for w in ws:
                        sent[w] += 1
                    held, rows = [], 0

    def finish(self) -> dict[str, float]:
        """Close the rollout: update the normaliser, assemble the RolloutBuffer."""
        from loomrl.embodied import RolloutBuffer
        from loomrl.envs.vec import EpisodeStats

        S, N = self._S, self.num_envs
        if self.normalizer is not None:
            self.normalizer.update(self._raw.reshape(S * N, -1))
        self.buffer = RolloutBuffer(
            obs=self._obs,
            actions=self._act_buf,
            logp=self._logp,
            values=self._val,
            rewards=self._rew,
            terminated=self._term,
            truncated=self._trunc,
            final_values=self._fin,
            last_value=self._last,
            episodes=EpisodeStats(),
            timing={"policy_s": self.busy_s},
        )
        # Graphs recorded so far (cumulative; 0 without CUDA graphs): a rollout that records
        # any after the first met a row count for the first time, one the cache had dropped, or
        # weights at new addresses.
        captures = float(getattr(self.net, "graph_captures", 0))
        out = {
            "policy_busy_s": self.busy_s,
            "policy_calls": float(self.calls),
            "graph_captures": captures,
            "policy_idle_s": self.idle_s,
        }
        self.busy_s, self.idle_s, self.calls = 0.0, 0.0, 0
        return out

    def abandon(self) -> None:
        """Drop a rollout that failed part way: no buffer (``update`` refuses until a rollout
        finishes), the normaliser untouched (the steps never reached hold zeros), the counters
        reset as ``finish`` resets them."""
        self.buffer = None
        self.busy_s, self.idle_s, self.calls = 0.0, 0.0, 0

    def rollout(self) -> dict[str, Any]:
        """The last rollout's buffer as a dict of CPU tensors (tests compare it to ``collect``)."""
        b = self.buffer
        return {
            f.name: getattr(b, f.name) for f in fields(b) if f.name not in ("episodes", "timing")
        }

    # -- learning ---------------------------------------------------------------------------------
    def update(self, lr_frac: float = 1.0) -> dict[str, float]:
        """PPO on the last rollout (GAE, clipped policy and value losses); ``lr_frac`` scales lr."""
        import torch

        from loomrl.embodied import ppo_update, set_lr

        if self.buffer is None:
            raise RuntimeError("update() before a rollout finished; run the cycle first")
        t0 = time.perf_counter()
        set_lr(self.optimizer, self.ppo.lr * lr_frac)
        buf = self.buffer
        rewards = None
        if self.scaler is not None:
            self.scaler.update(buf.rewards.numpy(), buf.dones.numpy())
            rewards = self.scaler.scale(buf.rewards)
        if self.device != "cpu":
            buf = _to_device(buf, self.device)
            rewards = rewards.to(self.device) if rewards is not None else None
        stats = ppo_update(
            self.net,
            self.optimizer,
            buf,
            self.ppo,
            rewards=rewards,
            generator=self.shuffle,
            step=self.train_step,
            nonfinite_before=self.nonfinite_in_a_row,
        )
        self.nonfinite_in_a_row = int(stats["nonfinite_in_a_row"])
        self.updates += 1
        if self.device != "cpu":
            torch.cuda.synchronize()
        stats["update_s"] = time.perf_counter() - t0
        return stats

    # -- cost probes for the planner ----------------------------------------------------------------
    def probe(self, reply: dict, *after: Any) -> np.ndarray:
        """Act on one env reply without recording anything (timing); ``after`` is ignored."""
        t0 = time.perf_counter()
        out = self._act(reply["obs"], reply["env_ids"], reply["env_steps"])[1].numpy()
        self.busy_s += time.perf_counter() - t0
        return out

    def pop_busy(self) -> float:
        """Seconds spent inside act / probe calls since the last pop (the cost probe's measure of
        how long a call keeps this worker busy, apart from the hand-off around it); the wait for
        replies restarts too, as ``EnvWorker.pop_busy``'s wait for actions does, so that the
        next ``finish`` counts from here, not from the probe's rollouts."""
        busy, self.busy_s, self.idle_s = self.busy_s, 0.0, 0.0
        return busy

    def time_act(self, n: int, reps: int) -> float:
        """Median seconds of one act on ``n`` rows, inside the worker (nothing is recorded)."""
        import torch

        gen = np.random.default_rng(0)
        if self.pixels:
            raw = gen.integers(0, 255, (n, *self.obs_shape), dtype=np.uint8)
        else:
            raw = gen.standard_normal((n, *self.obs_shape)).astype(np.float32)
        ids, steps = np.arange(n), np.zeros(n, np.int64)
        out = []
        for _ in range(reps):
            t = time.perf_counter()
            self._act(raw, ids, steps)
            if self.device != "cpu":
                torch.cuda.synchronize()
            out.append(time.perf_counter() - t)
        return float(np.median(out))

    def time_update(self, steps: int) -> float:
        """Estimated seconds of one ``update`` on a [steps, num_envs] rollout: PPO (every epoch,
        no early stop) on a throw-away copy of the policy over random data, after a warm-up
        epoch, and on an accelerator the rollout's copy from host memory, which ``update``
        makes first."""
        import torch

        from loomrl.embodied import RolloutBuffer, evaluated, ppo_update
        from loomrl.envs.vec import EpisodeStats

        S, N = steps, self.num_envs
        gen = np.random.default_rng(0)
        if self.pixels:
            raw = gen.integers(0, 255, (S * N, *self.obs_shape), dtype=np.uint8)
        else:
            raw = gen.standard_normal((S * N, *self.obs_shape)).astype(np.float32)
        net = copy.deepcopy(self.net)
        if callable(getattr(net, "use_cuda_graphs", None)):
            net.use_cuda_graphs(False)  # a throw-away copy: recording a graph would be waste
        opt, step = self._trainer(net)  # as the updates will run (a graph is recorded below)
        obs = torch.as_tensor(raw).to(self.device)
        with torch.no_grad():
            # Row-wise act would take as long as a rollout; one action repeated is enough here.
            a0 = net.act(obs[:1])[0]
            a = a0.expand(S * N, *a0.shape[1:]).clone()
            logp, _, v = evaluated(net, obs, a)
        zeros = torch.zeros(S, N, device=self.device)
        buf = RolloutBuffer(
            obs=obs.reshape(S, N, *self.obs_shape),
            actions=a.reshape(S, N, *a.shape[1:]),
            logp=logp.float().reshape(S, N),
            values=v.float().reshape(S, N),
            rewards=torch.ones(S, N, device=self.device),
            terminated=zeros.bool(),
            truncated=zeros.bool(),
            final_values=zeros,
            last_value=torch.zeros(N, device=self.device),
            episodes=EpisodeStats(),
        )
        one_epoch = replace(self.ppo, epochs=1, target_kl=None)
        # The process's first backward sets autograd up (on a GPU it also loads kernels and
        # tunes convolutions, about a second for the pixel CNN), a cost the run pays once, not
        # per update: keep it out. On the 2-core host, timed without it (and as one epoch times
        # ppo.epochs), the estimate came out above the runs' time outside the rollout in 40 of
        # 48 rounds, by 5.5 ms (5.3% of the iteration) on average (CPU runs 26-33).
        ppo_update(net, opt, buf, one_epoch, step=step)
        if self.device != "cpu":
            # A step is recorded after its warm-up steps: go on until it is (every minibatch
            # brings that closer, or fails it), so that the timed update replays as updates will.
            while step is not None and not (step.captures or step.failed):
                ppo_update(net, opt, buf, one_epoch, step=step)
            torch.cuda.synchronize()
        copy_s = 0.0
        if self.device != "cpu":
            # The rollout sits in host memory as the cycle filled it (pixels: S x N frames, 50 MB
            # at 128 envs and S = 32); without this the GPU runs' time outside the rollout came
            # out 5-7 ms over the estimate at 128 envs in 23 of 24 runs (calls CE-CG).
            host = _to_device(buf, "cpu")
            _to_device(host, self.device)  # the allocator's first blocks, which runs reuse
            torch.cuda.synchronize()
            t = time.perf_counter()
            _to_device(host, self.device)
            torch.cuda.synchronize()
            copy_s = time.perf_counter() - t
        # Every epoch, as update runs them: the advantages are computed once an update, not
        # once an epoch (no early stop: random data says nothing of a real rollout's KL); the
        # reward scaler's pass over the rollout (a Python loop over its steps) too. The median
        # of two, or of three within a second: one alone was 30% off on 2 cores.
        full = replace(self.ppo, target_kl=None)
        scaler = copy.deepcopy(self.scaler)  # None without reward scaling
        ones, done = np.ones((S, N), np.float32), np.zeros((S, N), dtype=bool)
        took: list[float] = []
        while len(took) < 2 or (len(took) < 3 and sum(took) < 1.0):
            t = time.perf_counter()
            rewards = None
            if scaler is not None:
                scaler.update(ones, done)
                rewards = scaler.scale(buf.rewards.cpu()).to(self.device)
            ppo_update(net, opt, buf, full, rewards=rewards, step=step)
            if self.device != "cpu":
                torch.cuda.synchronize()
            took.append(time.perf_counter() - t)
        return copy_s + statistics.median(took)

    # -- weights ------------------------------------------------------------------------------------
    def param_sha256(self) -> str:
        """SHA-256 over every parameter (name, dtype, shape, bytes) in sorted-name order."""
        h = hashlib.sha256()
        for name, p in sorted(self.net.named_parameters(), key=lambda kv: kv[0]):
            t = p.detach().to("cpu").contiguous()
            h.update(name.encode())
            h.update(str(t.dtype).encode())
            h.update(str(tuple(t.shape)).encode())
            h.update(t.numpy().tobytes())
        return h.hexdigest()

    def get_weights(self) -> dict[str, Any]:
        """Policy parameters and normaliser state (CPU numpy), e.g. for an evaluation copy."""
        return {
            "params": {k: v.detach().cpu().numpy() for k, v in self.net.state_dict().items()},
            "normalizer": None if self.normalizer is None else self.normalizer.state_dict(),
        }

    def set_weights(self, weights: dict[str, Any]) -> None:
        import torch

        self.net.load_state_dict({k: torch.as_tensor(v) for k, v in weights["params"].items()})
        if self.normalizer is not None and weights.get("normalizer") is not None:
            self.normalizer.load_state_dict(weights["normalizer"])

    def graph_status(self) -> dict[str, Any]:
        """Whether act replays CUDA graphs (GPU, ``cuda_graphs``, a built-in policy), how many
        forwards were recorded, and why recording failed if it did (act then runs eagerly); the
        same for the PPO step of updates (``update_captures``, ``update_failed``)."""
        cache = getattr(self.net, "_graphs", None)
        step = self.train_step
        return {
            "enabled": self.graphs and cache is not None and cache.failed is None,
            "captures": int(getattr(self.net, "graph_captures", 0)),
            "failed": None if cache is None else cache.failed,
            # The PPO step of updates (GraphedPPOStep): recorded graphs, and why recording failed.
            "update_captures": 0 if step is None else step.captures,
            "update_failed": None if step is None else step.failed,
        }

    # -- time-sharing -------------------------------------------------------------------------------
    def onload(self) -> None:
        if self.device != "cpu":
            self.net.to(self.device)

    def offload(self) -> None:
        if self.device != "cpu":
            import torch

            self._release_graphs()  # recorded on the device copy of the weights, which goes
            self.net.to("cpu")
            torch.cuda.empty_cache()

    def close(self) -> None:
        """Release the recorded graphs (``_loom_rebuild`` calls this before rebuilding) and the
        hand-off socket."""
        self._release_graphs()
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def _release_graphs(self) -> None:
        self._call_sizes.clear()  # the next layouts start an empty cache
        self._to_record.clear()
        release = getattr(self.net, "release_graphs", None)
        if callable(release):
            release()
        if self.train_step is not None:
            self.train_step.release()


# Graphs kept beyond the row counts the served layouts can call with (other callers of act).
GRAPH_ROOM = 8


def call_sizes(rows: list[int]) -> set[int]:
    """Every row count a call acting on the parts that have replied can have (``_serve_ready``):
    the sums of the non-empty subsets of the parts' row counts ``rows`` (each part replies once
    per step). Equal parts of r rows give r, 2r, ..., len(rows) x r. Pure."""
    reach = 1  # bit s set: some subset sums to s
    for r in rows:
        reach |= reach << r
    return {s for s in range(1, reach.bit_length()) if reach >> s & 1}


def _per_row(ts: Any, parts: Any) -> np.ndarray:
    """Each row's step, from each part's step ``ts[i]``."""
    return np.repeat(np.asarray(ts, dtype=np.int64), [len(p["env_ids"]) for p in parts])


def _tell_and_close(conns: Any, error: BaseException) -> None:
    """Send ``error`` to env workers waiting for actions, so that they stop now with its
    reason rather than at their timeout, and close their connections."""
    for conn in conns:
        conn.timeout = 1.0  # a worker that is not reading must not hold this up
        try:
            conn.send(("error", f"{type(error).__name__}: {error}"))
        except OSError:
            pass
        conn.close()


def _to_device(buf: Any, device: str) -> Any:
    import torch

    return replace(
        buf,
        **{
            f.name: getattr(buf, f.name).to(device)
            for f in fields(buf)
            if isinstance(getattr(buf, f.name), torch.Tensor)
        },
    )
