"""The env <-> policy cycle of embodied RL: S steps per iteration over k ring groups, and its plan.

**Running it.** ``EnvPolicyCycle.collect(S)`` runs S steps of every env. The envs are cut into
``k`` groups; each step of each group is two worker calls, ``policy.act`` then ``env.step`` on
the group's envs, chained by Ray object references (the driver submits every call without
waiting; a small result returns to the driver, its owner, which sends it on inside the next
call). Where every group lies on one env worker, ``handoff="direct"`` has each env worker drive
its own groups and call the policy itself (``EnvWorker.run_groups``): one message per hand-off
instead of two, the same calls in the same order per group. Calls to one worker
run in submission order, so submitting group 0, group 1, ... step after step gives the ring
pipeline of PLANNER.md: while the env workers step group g the policy already infers for group
g + 1, and k groups are in flight. With k = 1 (and always when env and policy share devices) the
chain leaves no choice: the two sides alternate. ``pipelined=False`` waits after every env step,
which is the unpipelined loop ``loomrl.embodied.collect`` performs in one process; both give the
same trajectories as that reference (tested), because every row's action depends only on its
observation and a generator keyed by (seed, env id, env step).

A group is one slice of every env worker's envs (``k <= envs per worker``), so every env worker
steps its share of each group in parallel, matching the cost model's ``t_env(n_env, M / k)``;
``layout="blocks"`` puts each group on whole env workers instead.

**Planning it.** ``measure_costs`` times a few calls of ``env.step`` / ``policy.act`` at the group
sizes that matter and one PPO minibatch; ``cycle_profile`` turns them into a workload profile
with the declared cycle ``env <-> policy`` (S steps) and a training component ``actor_train``;
``loomrl.plan`` chooses co-located vs split and k; ``placement_from_plan`` maps the plan to env
workers, the policy's device and k; ``check_cores`` refuses a placement whose env workers reserve
more CPU cores than a node has.

**Where env workers run.** Where the devices are CPU slots, env on n devices is n env workers,
one per slot. Beside accelerators a simulator computes on host cores whatever device it is
"on", so ``cycle_profile(host_env_workers=W)`` models env as W workers on host cores at every
device count, including 0: the planner may then split the cycle as env on host cores | policy
on the accelerators, which pipelines env and policy on one GPU. ``host_env_workers`` gives the
W a node's cores afford.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loomrl.errors import ConfigError, LoomError, PlacementError, WorkerDiedError
from loomrl.plan.profile import fit_line as _fit_line
from loomrl.worker import Handle, WorkerGroup, read_done, wait

__all__ = [
    "ENV",
    "POLICY",
    "TRAIN",
    "CollectResult",
    "CyclePlacement",
    "EnvPolicyCycle",
    "best_split_plan",
    "split_plans",
    "split_plans_and_past",
    "check_cores",
    "cycle_profile",
    "hop_latency",
    "pipe_hop",
    "CYCLE_MODELS",
    "CYCLE_MODEL_KEYS",
    "host_env_workers",
    "measure_costs",
    "merge_episodes",
    "overlap_slowdown",
    "placement_from_plan",
    "time_chain",
    "time_pipe",
    "pipe_rollout",
    "HANDOFFS",
    "RING_LAYOUTS",
    "resolve_handoff",
    "ring_groups",
]

ENV, POLICY, TRAIN = "env", "policy", "actor_train"  # component names in cycle profiles
BOTH = "both"  # measure_costs: env and policy chains timed running at once
# measure_costs: per chain also the seconds per call the side kept its worker(s) busy
BUSY = {ENV: "env_busy", POLICY: "policy_busy", BOTH: "both_busy"}
# measure_costs(handoff="pipe"): seconds per step of one-group pipe rollouts, and per step the
# seconds the busiest env worker and the policy were busy inside them
PIPE = {"step": "pipe", ENV: "pipe_env_busy", POLICY: "pipe_policy_busy"}


# ---------------------------------------------------------------------------------------------
# groups


@dataclass(frozen=True)
class Part:
    """Local envs [lo, hi) of env worker ``worker``."""

    worker: int
    lo: int
    hi: int


RING_LAYOUTS = ("slices", "blocks")


def ring_groups(
    workers: int, envs_per_worker: int, k: int, layout: str = "slices"
) -> list[list[Part]]:
    """Cut ``workers * envs_per_worker`` envs into ``k`` groups.

    ``slices``: with ``k <= envs_per_worker`` group g is slice g of every worker (all env
    workers step every group together, each making k calls a step); otherwise, as ``blocks``,
    groups are contiguous slices of the global env order, so a group spans whole workers where
    k divides the worker count (each worker then makes one call a step, and only the workers of
    one group step at a time).
    """
    n = workers * envs_per_worker
    if not 1 <= k <= n:
        raise ConfigError(
            [f"groups={k}: must be between 1 and the number of envs ({n}); each group needs an env"]
        )
    if layout not in RING_LAYOUTS:
        raise ConfigError([f"layout={layout!r}: must be one of {', '.join(RING_LAYOUTS)}"])
    if k <= envs_per_worker and layout == "slices":
        b = np.linspace(0, envs_per_worker, k + 1).round().astype(int)
        return [[Part(w, int(b[g]), int(b[g + 1])) for w in range(workers)] for g in range(k)]
    b = np.linspace(0, n, k + 1).round().astype(int)
    groups = []
    for g in range(k):
        parts = []
        for w in range(workers):
            lo, hi = max(b[g], w * envs_per_worker), min(b[g + 1], (w + 1) * envs_per_worker)
            if hi > lo:
                parts.append(Part(w, int(lo - w * envs_per_worker), int(hi - w * envs_per_worker)))
        groups.append(parts)
    return groups


# ---------------------------------------------------------------------------------------------
# the cycle


@dataclass
class CollectResult:
    """One rollout: finished episodes (undiscounted returns), env events, busy and wall times."""

    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    successes: list[float] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    env_busy_s: float = 0.0  # summed over env workers
    env_wait_s: float = 0.0  # waiting for actions (pipe, direct), summed over env workers
    # Pipe hand-offs: from the first act to the last closing reply (the rollout's steps without
    # starting and closing it); 0 for the others.
    span_s: float = 0.0
    env_render_s: float = 0.0  # of which drawing pixel observations, summed over env workers
    env_render_reads: int = 0  # read-backs of drawn frames (GPU waits), over env workers
    policy_busy_s: float = 0.0
    policy_idle_s: float = 0.0  # pipe: waiting for env replies and reading them
    steps: int = 0
    env_steps: int = 0  # transitions over all envs
    env_calls: int = 0  # env.step calls, over env workers
    policy_calls: int = 0  # policy.act calls
    policy_graph_captures: int = 0  # forwards recorded as CUDA graphs so far (cumulative)


HANDOFFS = ("auto", "driver", "direct", "pipe")
BATCHES = ("ready", "group")
# After a failed direct rollout: how long the driver waits for the other env workers' calls, and
# an env worker for its own policy calls, before reporting the error anyway (a rollout that
# takes longer has bigger problems).
SETTLE_S = 60.0
BOOKKEEPING_S = 5.0


def settle(refs: list[Any], timeout: float = SETTLE_S) -> None:
    """Wait until ``refs`` are done, failed or not, or ``timeout`` passes; read none of them.
    After a rollout failed because a side stayed silent past the cycle's timeout, its callers
    wait no longer than that timeout: a worker stuck in a simulator never ends its call."""
    import ray

    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=timeout)


def _abort_pipe(address: str, token: str, reason: str) -> None:
    """Tell a policy worker still waiting for rollout ``token``'s env workers to stop."""
    from loomrl.transport._socket import connect

    try:
        conn = connect(address, 5.0)
        try:
            conn.send(("abort", token, reason))
        finally:
            conn.close()
    except OSError:  # nothing listens (on another node, or gone): nothing waits either
        pass


def parts_by_worker(
    groups: list[list[tuple[int, int, int]]], workers: int
) -> dict[int, list[tuple[int, int]]]:
    """Every env worker's (lo, hi) parts of ring ``groups`` of (worker, lo, hi) parts, in the
    order the ring visits them. Pure."""
    mine: dict[int, list[tuple[int, int]]] = {w: [] for w in range(workers)}
    for parts in groups:
        for w, lo, hi in parts:
            mine[w].append((lo, hi))
    return mine


def pipe_rollout(
    policy: Any,
    envs: list[Any],
    address: str,
    groups: list[list[tuple[int, int, int]]],
    steps: int,
    timeout: float,
    min_rows: int = 0,
    whole: bool = False,
) -> dict[str, Any]:
    """Run one rollout of ``steps`` steps over the policy's socket at ``address``: the policy
    view's ``serve_pipe`` and each env worker view's ``run_pipe`` in ``envs`` (by rank), ring
    ``groups`` as (env worker, lo, hi) parts; returns ``serve_pipe``'s timing. The policy's
    buffer must be ready (``begin``), unless ``whole``: then the policy begins and finishes the
    rollout itself (its ``finish()`` under "finish") and the env workers driving parts return
    their ``pop_stats()`` (under "env_stats", by rank), one call each for the whole rollout
    where there were three. On an error both sides are stopped (once connected the
    error travels over the socket; a policy still waiting for connections is told here) and
    every call has ended, or ``SETTLE_S`` (``timeout`` when shorter) passed, before it is
    raised."""
    import uuid

    token = uuid.uuid4().hex  # this rollout's: a late connection of a failed one is refused
    mine = parts_by_worker(groups, len(envs))
    # The options go as keywords, and only where set: a rollout without them is the same call
    # to either side as before they existed.
    extra: dict[str, Any] = {"begin": True, "finish": True} if whole else {}
    if min_rows:
        extra["min_rows"] = min_rows
    serve = policy.serve_pipe(token, steps, groups, len(envs), timeout, **extra)
    stats = {"stats": True} if whole else {}
    runs = [
        envs[w].run_pipe(address, token, w, m, steps, timeout, **stats) for w, m in mine.items()
    ]
    try:
        (timing,), *ends = wait(serve, *runs)
    except BaseException as e:
        _abort_pipe(address, token, f"{type(e).__name__}: {str(e)[:500]}")
        settle([r for h in (serve, *runs) for r in h.refs], min(SETTLE_S, timeout))
        # The cause, whichever side reported first: a user's mistake the policy found (its
        # policy's outputs; the env workers only say that the policy stopped), then an env
        # worker whose process died (the policy only says that its connection closed). Each
        # read is bounded: a call settle left running, a hung simulator's, must not hang this.
        deadline = time.monotonic() + 1.0  # one second for all reads, not one each
        for h, cause in ((serve, ConfigError), *((r, WorkerDiedError) for r in runs)):
            try:
                wait(h, timeout=max(deadline - time.monotonic(), 0.0))
            except cause:
                raise
            except BaseException:
                pass
        raise
    if whole:
        timing["env_stats"] = {w: e[0] for w, e in zip(mine, ends, strict=True)}
    return timing


def resolve_handoff(handoff: str, groups: list[list[Part]], pipelined: bool) -> str:
    """How results pass between env workers and the policy: ``driver`` (the driver submits every
    call, each result passed on as an object reference), ``direct`` (each env worker calls the
    policy itself, one message per hand-off instead of two; only where every group lies on one
    env worker, pipelined) or ``pipe`` (each env worker and the policy exchange replies and
    actions over a socket for the whole rollout, no Ray call per step; one node, pipelined).
    ``auto``: direct where it applies, else driver."""
    if handoff not in HANDOFFS:
        raise ConfigError([f"handoff={handoff!r}: must be one of {', '.join(HANDOFFS)}"])
    split = [g for g, parts in enumerate(groups) if len(parts) > 1]
    if handoff == "pipe" and not pipelined:
        raise ConfigError(
            [
                "handoff='pipe': the cycle is not pipelined (pipelined=false); pipe hand-offs "
                "run the ring pipeline. Use handoff='driver'"
            ]
        )
    if handoff == "direct" and (split or not pipelined):
        why = (
            f"group {split[0]} spans env workers {[p.worker for p in groups[split[0]]]}"
            if split
            else "the cycle is not pipelined (pipelined=false)"
        )
        raise ConfigError(
            [
                f"handoff='direct': {why}; direct hand-offs need every group on one env "
                "worker and a pipelined cycle. Use handoff='auto' (direct where it applies)"
            ]
        )
    if handoff == "auto":
        return "direct" if pipelined and not split else "driver"
    return handoff


class EnvPolicyCycle:
    """Drives env workers and one policy worker through S steps per ``collect``."""

    def __init__(
        self,
        envs: WorkerGroup,
        policy: WorkerGroup,
        envs_per_worker: int,
        groups: int = 1,
        pipelined: bool = True,
        layout: str = "slices",
        handoff: str = "driver",
        timeout_s: float = 600.0,
        on_events: Any = None,
        batch: str = "ready",
    ):
        """``on_events``: called with the env events (failures recovered from) of each rollout,
        finished or failed; rollouts whose results are not kept (trials) pass theirs on so.
        ``batch``: what a pipelined pipe cycle's policy acts on (``BATCHES``): "ready", the
        parts that have replied; "group", at least a ring group's rows of them, unless no env
        worker has work left to send."""
        self.envs, self.policy = envs, policy
        self.on_events = on_events
        self.workers = envs.world_size
        self.num_envs = self.workers * envs_per_worker
        self.groups = ring_groups(self.workers, envs_per_worker, groups, layout)
        self.pipelined = pipelined
        self.handoff = resolve_handoff(handoff, self.groups, pipelined)
        if not timeout_s > 0:
            raise ConfigError([f"timeout_s={timeout_s!r}: must be a positive number of seconds"])
        self.timeout_s = float(timeout_s)
        if batch not in BATCHES:
            raise ConfigError([f"batch={batch!r}: not one of {', '.join(BATCHES)}"])
        self.batch = batch
        self.failed_events: list[dict[str, Any]] = []  # env events of the last failed rollout
        # Views per rank, made once: building a view costs more than a call.
        self._env = [envs.on(w) for w in range(self.workers)]
        self._socket: str | None = None  # the policy worker's, for handoff="pipe"

    def collect(self, steps: int) -> CollectResult:
        """Run ``steps`` steps of every env; the policy worker keeps the buffer (its ``finish``)."""
        if steps < 1:
            raise ConfigError([f"steps={steps}: a rollout needs at least one step"])
        self.failed_events = []
        t0 = time.perf_counter()
        if self.handoff == "direct":
            return self._collect_direct(steps, t0)
        if self.handoff == "pipe":
            return self._collect_pipe(steps, t0)
        self.policy.begin(steps)
        cur = [[self._ref(self._env[p.worker].observe(p.lo, p.hi)) for p in g] for g in self.groups]
        for t in range(steps):
            for g, parts in enumerate(self.groups):
                actions = self._ref(self.policy.act(t, *cur[g]))
                handles = [
                    self._env[p.worker].step(actions, j, p.lo, p.hi) for j, p in enumerate(parts)
                ]
                if not self.pipelined:
                    wait(*handles)
                cur[g] = [self._ref(h) for h in handles]
        # Waiting on close_group too surfaces a failure anywhere in the chain (it depends on
        # every group's last step, which depends on all before it), naming the worker that raised.
        closes = [self.policy.close_group(*cur[g]) for g in range(len(self.groups))]
        try:
            wait(*closes)
        except BaseException:
            self._abandon(closes)  # the other groups' chains end in their closes
            raise
        pol, env_stats = wait(self.policy.finish(), self.envs.pop_stats())
        return self._result(steps, t0, pol, env_stats)

    def _collect_direct(self, steps: int, t0: float) -> CollectResult:
        """Each env worker drives its own groups and calls the policy itself (run_groups)."""
        # Calls from different processes reach the policy in no set order: its buffer must be
        # ready before any env worker calls, and finish() must wait for every group's last step.
        wait(self.policy.begin(steps))
        actor = self.policy.actors[0]
        runs = [
            self._env[w].run_groups(actor, parts, steps)
            for w, parts in self._parts_by_worker().items()
            if parts
        ]
        try:
            wait(*runs)
        except BaseException:
            # The other env workers may still be calling the policy: let them finish first.
            self._abandon(runs)
            raise
        pol, env_stats = wait(self.policy.finish(), self.envs.pop_stats())
        return self._result(steps, t0, pol, env_stats)

    def _collect_pipe(self, steps: int, t0: float) -> CollectResult:
        """Each env worker and the policy worker pass replies and actions over a socket
        (``EnvWorker.run_pipe``, ``PolicyWorker.serve_pipe``) for the whole rollout."""
        if self._socket is None:
            (self._socket,) = wait(self.policy.listen())
        try:
            timing = pipe_rollout(
                self.policy,
                self._env,
                self._socket,
                self._tuples(),
                steps,
                self.timeout_s,
                min_rows=self.num_envs // len(self.groups) if self.batch == "group" else 0,
                whole=True,  # begin, finish and the env workers' statistics in the same calls
            )
        except BaseException:
            self._abandon([])  # the rollout's calls have ended: drop it
            raise
        # Every env worker drives a part (ring_groups covers every env), so every one reported.
        env_stats = [timing["env_stats"][w] for w in range(self.workers)]
        out = self._result(steps, t0, [timing["finish"]], env_stats)
        out.span_s = timing["span_s"]
        return out

    def _parts_by_worker(self) -> dict[int, list[tuple[int, int]]]:
        """Every env worker's (lo, hi) parts, in the order the ring visits them."""
        return parts_by_worker(self._tuples(), self.workers)

    def _tuples(self) -> list[list[tuple[int, int, int]]]:
        """The ring groups as (env worker, lo, hi) parts."""
        return [[(p.worker, p.lo, p.hi) for p in g] for g in self.groups]

    def _abandon(self, handles: list[Handle]) -> None:
        """After a failed rollout: let ``handles`` end, then drop the rollout (the policy's
        ``abandon``: no buffer, the normaliser not fed the steps never reached) and pop the
        env workers' statistics, so the next starts on clean counters. Bounded (``settle``), so
        that a hung worker cannot hide the error."""
        settle([r for h in handles for r in h.refs], min(SETTLE_S, self.timeout_s))
        # Bookkeeping calls answer at once, unless their worker is stuck in a call that never
        # ends: a short bound, not a second SETTLE_S, and never past the cycle's own time limit.
        pops = self.envs.pop_stats().refs
        settle([*self.policy.abandon().refs, *pops], timeout=min(BOOKKEEPING_S, self.timeout_s))
        # The env failures recorded before the rollout failed (often what stopped it): kept for
        # the run's record, from the env workers that answered.
        self.failed_events = [e for s in read_done(pops) for e in s["events"]]
        if self.on_events is not None and self.failed_events:
            self.on_events(self.failed_events)

    def _result(self, steps: int, t0: float, pol: list, env_stats: list) -> CollectResult:
        out = CollectResult(wall_s=time.perf_counter() - t0, steps=steps)
        out.policy_busy_s = pol[0]["policy_busy_s"]
        out.policy_idle_s = pol[0].get("policy_idle_s", 0.0)
        out.policy_calls = int(pol[0]["policy_calls"])
        out.policy_graph_captures = int(pol[0]["graph_captures"])
        out.returns, out.lengths, out.successes = merge_episodes(env_stats)
        for s in env_stats:
            out.env_calls += s["calls"]
            out.events += s["events"]
            out.env_busy_s += s["busy_s"]
            out.env_wait_s += s.get("wait_s", 0.0)
            out.env_render_s += s.get("render_s", 0.0)
            out.env_render_reads += s.get("render_reads", 0)
        out.env_steps = steps * self.num_envs
        if self.on_events is not None and out.events:
            self.on_events(out.events)
        return out

    @staticmethod
    def _ref(h: Handle) -> Any:
        # A top-level ObjectRef argument is resolved by Ray before the call runs, while the
        # driver goes on submitting. Objects under Ray's inline limit (100 KiB by default) come
        # back to the driver, their owner, and go out again inside the next call; larger ones
        # travel worker to worker through the object store.
        return h.refs[0]


def merge_episodes(env_stats: list[dict]) -> tuple[list[float], list[int], list[float]]:
    """The returns, lengths and successes of the episodes in env workers' ``pop_stats``, in the
    order they ended (the env's step count, then its global index) rather than worker by
    worker: the same under every placement, however many env workers and ring groups, so the
    recipe's window of recent returns (and a run's stop at ``target_return``) is too."""
    episodes: list = []
    successes: list = []
    for s in env_stats:
        episodes += zip(map(tuple, s["ends"]), s["returns"], s["lengths"], strict=True)
        successes += zip(map(tuple, s["success_ends"]), s["successes"], strict=True)
    episodes.sort(key=lambda e: e[0])
    successes.sort(key=lambda e: e[0])
    return [r for _, r, _ in episodes], [n for _, _, n in episodes], [x for _, x in successes]


# ---------------------------------------------------------------------------------------------
# costs -> profile -> plan -> placement


def measure_costs(
    env: WorkerGroup,
    policy: WorkerGroup,
    num_envs: int,
    sizes: list[int],
    steps: int,
    reps: int = 5,
    min_chain_s: float = 0.1,
    handoff: str = "driver",
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """Seconds per ``env.step`` and per ``policy.act`` at each group size in ``sizes``, and the
    estimated seconds of one PPO update on a [steps, num_envs] rollout, called from the driver
    (``PolicyWorker.time_update`` plus a call's round trip).

    Each side is timed as ``reps`` calls chained the way the cycle chains them (every call waits
    for the previous one's result, passed worker to worker by reference), so the per-call costs
    include Ray's hop between calls. A chain holds at least ``reps`` calls and, for calls of a
    few milliseconds, as many more (up to 16x) as ``min_chain_s`` of chain needs: five such calls
    measured mostly scheduling jitter (the fitted policy cost varied by 20-65% between probes).
    ``env`` holds W >= 1 env workers of ``num_envs`` envs each;
    a group of x envs is stepped as x / W envs on every worker at once, each step waiting for
    all of the previous one (as the cycle does), so the samples carry whatever W simulators
    running side by side cost each other (shared renderer, memory bandwidth); sizes W does not
    divide are skipped. ``policy`` is a policy worker. ``samples["both"]`` times the two chains
    running at once (as the sides of a split cycle overlap): its ratio to the slower side alone
    is the overlap slowdown. ``samples["env_busy"]`` etc. hold, for the same chains, the seconds
    per call the side's worker was busy inside the call (the busiest env worker; for "both_busy"
    the busier side): the rest of a chain's call is the hand-off around it (``hop_latency``).

    ``handoff="pipe"``: the cycle will pass replies and actions over sockets, whose hand-offs
    cost neither what a chain's do nor nothing, so at each size rollouts of one ring group are
    also run over the pipe itself (``time_pipe``, as long as ``min_chain_s`` needs, the median
    of three): ``samples[PIPE[...]]`` hold their seconds per step and per step the busy seconds
    of each side; the rest of a step is the pipe's round trip (``pipe_hop``). On one H200 at 96
    pixel envs a cycle costed from the chains came out about twice the pipe cycle's time, on
    the 2-core host 2-3x. ``timeout_s`` bounds a silent pipe (the cycle's ``timeout_s``).
    The probe advances the probe envs: use throw-away workers.
    """
    import ray

    w = env.world_size
    ranks, p = [env.on(r) for r in range(w)], policy.on(0)
    if handoff not in ("driver", "pipe"):
        raise ConfigError([f"handoff={handoff!r}: the probe times 'driver' chains or a 'pipe'"])
    keys = (*BUSY, *BUSY.values(), *(PIPE.values() if handoff == "pipe" else ()))
    samples: dict[str, list[tuple[int, float]]] = {k: [] for k in keys}
    address = (
        _probe_wait(timeout_s, "the policy worker", p.listen())[0] if handoff == "pipe" else None
    )
    for x in sorted(x for x in set(sizes) if x % w == 0):
        per = x // w
        actions = [_probe_wait(timeout_s, "an env worker", r.sample_actions(per))[0] for r in ranks]
        # The policy acts on all x rows at once, gathered from every worker once and stored.
        parts = [_probe_wait(timeout_s, "an env worker", r.observe(0, per))[0] for r in ranks]
        reply = ray.put({k: np.concatenate([q[k] for q in parts]) for k in parts[0]})

        time_chain(ranks, p, per, actions, reply, BOTH, 1, timeout_s)  # warm-up
        for side in (ENV, POLICY, BOTH):
            per_call = time_chain(ranks, p, per, actions, reply, side, reps, timeout_s)[0]
            n = min(16 * reps, max(reps, math.ceil(min_chain_s / max(per_call, 1e-6))))
            for _ in range(3):  # the median of three chains shrugs off one stalled chain
                took, env_busy, pol_busy = time_chain(
                    ranks, p, per, actions, reply, side, n, timeout_s
                )
                samples[side].append((x, took))
                busy = {ENV: env_busy, POLICY: pol_busy, BOTH: max(env_busy, pol_busy)}[side]
                samples[BUSY[side]].append((x, busy))
        if address is not None:
            # A step of one group is about one call of each side: as many steps as the chains'
            # calls, so that the fixed cost of connecting and closing stays out of the span.
            chains = _medians(samples[ENV])[x] + _medians(samples[POLICY])[x]
            n = min(16 * reps, max(reps, math.ceil(min_chain_s / max(chains, 1e-6))))
            time_pipe(ranks, p, address, per, 2, timeout_s)  # warm-up: connections, graphs
            for _ in range(3):
                step_s, env_busy, pol_busy = time_pipe(ranks, p, address, per, n, timeout_s)
                for key, v in zip(PIPE.values(), (step_s, env_busy, pol_busy), strict=True):
                    samples[key].append((x, v))
    update_s = wait(p.time_update(steps))[0]  # unbounded, as the run's own updates are
    # An iteration calls the update from the driver and waits for it: its round trip is part of
    # the time outside the rollout too (the median of a few calls that do nothing).
    trips = []
    for _ in range(5):
        t = time.perf_counter()
        wait(p.pop_busy())
        trips.append(time.perf_counter() - t)
    update_s += statistics.median(trips)
    return {
        "samples": samples,
        "update_s": update_s,
        "num_envs": num_envs,
        "env_workers": w,
        "handoff": handoff,
    }


def _probe_wait(timeout_s: float, what: str, *handles: Handle) -> Any:
    """``wait`` for the cost probe's calls, bounded: a simulator or policy that hangs while its
    costs are measured stops the run with an error naming it, as it would in a rollout."""
    try:
        return wait(*handles, timeout=timeout_s)
    except TimeoutError:
        raise LoomError(
            f"measuring the cycle's costs: no reply from {what} within {timeout_s:g} s "
            "(cycle_timeout_s); an env step or policy call that hangs stops the probe. Raise "
            "cycle_timeout_s if a call really takes that long"
        ) from None


def time_pipe(
    ranks: list[Any], policy: Any, address: str, per: int, n: int, timeout: float
) -> tuple[float, float, float]:
    """Seconds per step of an n-step pipe rollout (``EnvWorker.run_pipe``, ``PolicyWorker.
    serve_pipe``) of one ring group, the first ``per`` envs of every env worker view in
    ``ranks``, and per step the seconds the busiest env worker was busy stepping and the
    policy acting in it. The span runs from the first act to the last reply: connecting,
    the first observations and closing the group are left out. ``address``: the policy's
    ``listen()``. The rollout goes to the policy's buffer, which the next ``begin`` drops."""
    wait(*[r.pop_busy() for r in ranks], policy.pop_busy())
    wait(policy.begin(n))
    group = [(w, 0, per) for w in range(len(ranks))]
    span = pipe_rollout(policy, ranks, address, [group], n, timeout)
    *env_busy, _ = (b[0] for b in wait(*[r.pop_busy() for r in ranks], policy.pop_busy()))
    return span["span_s"] / n, max(env_busy) / n, span["act_busy_s"] / n


def time_chain(
    ranks: list[Any],
    policy: Any,
    per: int,
    actions: list[Any],
    reply: Any,
    side: str,
    n: int,
    timeout_s: float | None = None,
) -> tuple[float, float, float]:
    """Seconds per call of a chain of n calls of ``side`` (ENV, POLICY or BOTH at once), and the
    seconds per call the env workers (the busiest) and the policy were busy inside their calls.

    An env call steps the first ``per`` envs of every env worker view in ``ranks`` with
    ``actions[r]``; a policy call is ``policy.probe(reply)`` on stored observations. Every call
    waits for the previous one's result, passed worker to worker by reference, as the cycle
    chains them. ``timeout_s`` bounds each call: a side that stays silent that long stops the
    probe with an error naming it (the whole chain is submitted at once, so each call's
    result is awaited in turn)."""
    wait(*[r.pop_busy() for r in ranks], policy.pop_busy())
    last_e: list[Handle] = []
    last_p: list[Handle] = []
    calls: list[tuple[str, list[Handle]]] = []
    t = time.perf_counter()
    for _ in range(n):
        if side != POLICY:
            prev = _refs(last_e)
            last_e = [r.step([a], 0, 0, per, *prev) for r, a in zip(ranks, actions, strict=True)]
            calls.append(("an env worker's step", last_e))
        if side != ENV:
            last_p = [policy.probe(reply, *_refs(last_p))]
            calls.append(("the policy worker's act", last_p))
    if timeout_s is None:
        wait(*last_e, *last_p)
    else:
        for what, handles in calls:
            _probe_wait(timeout_s, what, *handles)
    took = (time.perf_counter() - t) / n
    *env_busy, pol_busy = (b[0] for b in wait(*[r.pop_busy() for r in ranks], policy.pop_busy()))
    return took, max(env_busy) / n, pol_busy / n


# Where a chained call's hand-off goes in the cycle's profile (see cycle_profile), and the key
# under which a run's cycle_costs.json keeps each model's prediction of the plan that ran
# (busy_hops keeps the name it had before it had one).
CYCLE_MODEL_KEYS = {
    "fixed_hops": "model_fixed_hops_s",
    "chained": "model_chained_s",
    "busy_hops": "model_split_hops_s",
}
CYCLE_MODELS = tuple(CYCLE_MODEL_KEYS)


def overlap_slowdown(samples: dict[str, list[tuple[int, float]]]) -> float:
    """Median over sizes of (both chains at once) / (the slower chain alone), at least 1; 1 when
    nothing was timed at once. Pure: samples are (size, seconds per call) rows."""

    both, env, pol = (_medians(samples.get(k, [])) for k in (BOTH, ENV, POLICY))
    ratios = [both[x] / max(env[x], pol[x]) for x in both if x in env and x in pol]
    return max(1.0, float(np.median(ratios))) if ratios else 1.0


def hop_latency(samples: dict[str, list[tuple[int, float]]]) -> float:
    """Seconds per step of a round trip env -> policy -> env spent outside either side's call:
    for each side, the median over sizes of (chain seconds per call - busy seconds per call),
    at least 0, summed over the two sides (each chained call pays one hand-off, and a step of
    the cycle has two). 0 when the samples have no busy times. Pure."""
    total = 0.0
    for side in (ENV, POLICY):
        chain, busy = _medians(samples.get(side, [])), _medians(samples.get(BUSY[side], []))
        gaps = [chain[x] - busy[x] for x in chain if x in busy]
        if gaps:
            total += max(0.0, float(np.median(gaps)))
    return total


def pipe_hop(samples: dict[str, list[tuple[int, float]]]) -> float:
    """Seconds per step of a pipe round trip env -> policy -> env spent outside either side's
    call: the median over sizes of (a one-group pipe step - its env busy - its policy busy),
    at least 0; 0 without pipe samples. Pure."""
    step, e, p = (_medians(samples.get(k, [])) for k in PIPE.values())
    gaps = [step[x] - e[x] - p[x] for x in step if x in e and x in p]
    return max(0.0, float(np.median(gaps))) if gaps else 0.0


def _medians(rows: list[tuple[int, float]]) -> dict[int, float]:
    """Median seconds per size of (size, seconds) rows."""
    by: dict[int, list[float]] = {}
    for x, t in rows:
        by.setdefault(x, []).append(t)
    return {x: float(np.median(v)) for x, v in by.items()}


def _refs(handles: list[Handle]) -> list[Any]:
    return [h.refs[0] for h in handles]


def host_env_workers(num_envs: int, env_cores: float, node_cores: float) -> int:
    """Env workers on host cores: the largest divisor of ``num_envs`` whose workers, at
    ``env_cores`` each, fit in ``node_cores``, and that is at most ``node_cores`` (at least 1;
    check_cores refuses what does not fit).

    The bound on the count, not only on the cores reserved: a simulator process keeps a core
    busy while it steps, so workers beyond the node's cores only time-share them (no more
    steps per second) while each adds a process's memory and start-up. Without it a small
    share such as env.cpu_cores=0.01 started one process per env (100 envs, 100 processes on
    a 16-core node). A fraction below 1 still counts: the workers reserve less than the node
    and leave cores to the policy and the driver."""
    cap = max(int(node_cores), 1)
    fit = [
        w
        for w in range(1, min(num_envs, cap) + 1)
        if num_envs % w == 0 and w * env_cores <= node_cores
    ]
    return max(fit, default=1)


def cycle_profile(
    costs: dict[str, Any],
    num_envs: int,
    steps: int,
    devices: int,
    env_cores: float,
    cpu_cores_per_node: int | None,
    devices_per_node: int | None = None,
    host_env_workers: int | None = None,
    hops: str = "fixed_hops",
    env_renders: bool = False,
) -> Any:
    """A workload profile of env <-> policy (S = ``steps``) followed by ``actor_train``.

    env on n devices is n env workers stepping their share of a group in parallel, so its
    per-env cost divides by n; the policy is one process, so more devices do not speed it up
    (co-locating it with n env workers is still allowed). Env workers reserve
    ``ceil(n * env_cores)`` cores, which the planner keeps within ``cpu_cores_per_node``.
    With ``host_env_workers=W`` (accelerators: env computes on host cores) env is W workers at
    every device count from 0 (host cores only, beside the policy's devices) to ``devices``.
    Env samples taken with ``costs["env_workers"]`` workers side by side already carry that
    parallelism: per-env costs divide by workers / that. ``env_renders``: the host-core env
    workers render on the GPU they are launched on, so with two devices or more env is not
    offered 0 devices (beside the policy it would render on the policy's GPU, which slowed both
    sides of a split cycle by 1.21-1.24x against 1.00-1.08x on a GPU of its own; the probe times
    env and policy on different devices, the case that remains). On one device it is the only
    split there is, and the probe measured it there.

    ``hops`` (``CYCLE_MODELS``) says where a call's hand-off goes. "fixed_hops" (default here;
    the embodied recipe's ``cycle_model`` auto takes "chained", which has ranked plans better on
    one H200, see its ``Config``): a chained call's fixed cost, the intercept of its fit over
    group sizes (dispatch, handing the result over), is latency per step of the cycle
    (``hop_s``) that ring groups overlap, and the per-env part is what occupies a side; over 87
    split-cycle trials of calls Y-AL (mostly two H200s) at group sizes the probes timed it was
    7.5% off on average where "chained" was 26.2%, and it ranked the fastest plan first in 49 of
    50 trial sets against 21 (scripts/gpu/RESULTS.md, scripts/gpu/cycle_model_fit.py). "chained":
    components cost the whole chained call (hop 0), which alternation pays in full but rings
    partly hide. "busy_hops": components cost their busy time inside the call and the rest is
    the hop. Co-located cycles (k = 1) cost the same under all three, to within hop / 2 (the
    first step has no hand-off before it). Under every model the cycle's ``min_group`` is the
    smallest group size the probe timed: a fit says nothing below it, and fixed_hops carried
    below it planned k = 32 and 64 (groups of 2 and 1 envs) whose rollouts ran 1.9-4.5x those at
    k = 4 in the next runs (scripts/gpu/RESULTS.md, calls AG-AI).

    Costs with pipe samples (``measure_costs(handoff="pipe")``) price the pipe the cycle runs
    over instead of the chains: components cost their busy time in the pipe rollouts, the hop
    is the pipe's round trip (``pipe_hop``; "chained" gives each side's call half of it,
    "fixed_hops" adds the busy fits' intercepts to it), and the overlap slowdown is the chains'
    ratio of busy times.
    """
    from loomrl.plan import load_profile

    if hops not in CYCLE_MODELS:
        raise ValueError(f"cycle_profile: hops={hops!r}; use one of {CYCLE_MODELS}")
    samples = costs["samples"]
    if samples.get(PIPE["step"]):  # a pipe cycle's probe: its own busy times and round trip
        a_e, p_e = _fit_line(samples[PIPE[ENV]])
        a_p, p_p = _fit_line(samples[PIPE[POLICY]])
        slowdown = overlap_slowdown({side: samples.get(BUSY[side], []) for side in BUSY})
        hop = pipe_hop(samples)
        if hops == "chained":  # each side's call carries half of the round trip
            a_e, a_p, hop = a_e + hop / 2, a_p + hop / 2, 0.0
    else:
        busy = bool(hops == "busy_hops" and samples.get(BUSY[ENV]) and samples.get(BUSY[POLICY]))
        fit = {side: samples.get(BUSY[side], []) for side in BUSY} if busy else samples
        a_e, p_e = _fit_line(fit[ENV])
        a_p, p_p = _fit_line(fit[POLICY])
        slowdown, hop = overlap_slowdown(fit), (hop_latency(samples) if busy else 0.0)
    if hops == "fixed_hops":  # the fits' intercepts join the cycle's hop
        # A side whose fit found no cost per env (slope clamped to 0) cannot tell its fixed
        # cost from its work: it keeps its chained cost, or every k would look the same.
        grows_e, grows_p = p_e > 1e-9, p_p > 1e-9  # s per env: below a nanosecond is a flat fit
        hop += (a_e if grows_e else 0.0) + (a_p if grows_p else 0.0)
        a_e, a_p = (0.0 if grows_e else a_e), (0.0 if grows_p else a_p)
    valid = [n for n in range(1, devices + 1) if num_envs % n == 0]
    if host_env_workers is None:
        env_valid, workers = valid, {n: n for n in valid}
    else:
        env_valid = [*([0] if devices == 1 or not env_renders else []), *range(1, devices + 1)]
        workers = {n: host_env_workers for n in env_valid}
    probed = costs.get("env_workers", 1)
    tiny = 0.01  # GB: memory is not what limits a CPU simulator or a small policy
    raw: dict[str, Any] = {
        "devices": devices,
        "device_memory_gb": 1000.0,
        "batch": num_envs,
        "granularities": [num_envs],
        "components": {
            ENV: {
                "valid_devices": env_valid,
                "time": {
                    "alpha": a_e,
                    "per_item": {n: p_e * probed / workers[n] for n in env_valid},
                },
                "memory_gb": tiny,
                "cpu_cores": {n: int(math.ceil(workers[n] * env_cores - 1e-9)) for n in env_valid},
            },
            POLICY: {
                "valid_devices": valid if host_env_workers is None else list(range(1, devices + 1)),
                "time": {"alpha": a_p, "per_item": {n: p_p for n in range(1, devices + 1)}},
                "memory_gb": tiny,
                # Where devices are CPU slots, the policy's process holds a core of its own
                # (``check_cores``): beside env workers it counts, shared with them it does not.
                "cpu_cores": 1 if host_env_workers is None else 0,
            },
            TRAIN: {
                "valid_devices": [1],
                "time": {"alpha": float(costs["update_s"]), "per_item": {1: 0.0}},
                "memory_gb": tiny,
                "cpu_cores": {1: 0},
            },
        },
        "edges": [[ENV, POLICY], [POLICY, ENV], [POLICY, TRAIN]],
        "cycles": [
            {
                "members": [ENV, POLICY],
                "steps": steps,
                "overlap_slowdown": slowdown,
                "hop_s": hop,
                # the fits hold over the group sizes the probe timed: no smaller ring groups
                "min_group": min((x for x, _ in samples.get(ENV, [])), default=1),
            }
        ],
    }
    if cpu_cores_per_node is not None:
        raw["cpu_cores_per_node"] = int(cpu_cores_per_node)
    if devices_per_node is not None:
        raw["devices_per_node"] = int(devices_per_node)
    return load_profile(raw)


def check_profile(profile: Any, where: str) -> None:
    """A profile driving this cycle must name its cycle members ``env`` and ``policy``."""
    names = {tuple(c.members) for c in profile.cycles}
    if (ENV, POLICY) not in names:
        raise ConfigError(
            [
                f"{where}: the profile declares cycles {sorted(names) or 'none'}; the embodied "
                f"recipe needs components {ENV!r} and {POLICY!r} in a cycle "
                f"`cycles: [{{members: [{ENV}, {POLICY}], steps: S}}]`"
            ]
        )


def best_split_plan(profile: Any) -> Any:
    """The fastest plan whose cycle runs env and policy on disjoint devices, the rest of the
    workflow time-sharing all devices after it (a hybrid plan), or None when none fits.

    The planner's own "hybrid" optimum may instead co-locate the cycle and place another
    component beside it; a run asked for ``placement=hybrid`` wants the split cycle.
    """
    plans = split_plans(profile)
    return plans[0] if plans else None


def split_plans(profile: Any) -> list[Any]:
    """For each number of ring groups k, the fastest split-cycle plan (see ``best_split_plan``),
    fastest first. The choice of k rests on per-call fixed costs that a ring hides partly
    (a hand-off of one group overlaps the other's work), so runs time the close ones."""
    return _split_plans(profile, _env_policy_cycle(profile).group_counts(profile.batch))


def split_plans_and_past(profile: Any) -> tuple[list[Any], list[Any]]:
    """(``split_plans(profile)``; the fastest plan at the first k whose groups are smaller than
    the cycle's ``min_group``, in a list of at most one: priced by carrying the fits below the
    sizes measured, for a trial to time, not to trust)."""
    cyc = _env_policy_cycle(profile)
    ks = cyc.group_counts(profile.batch)
    past = [k for k in cyc.group_counts(profile.batch, limited=False) if k > ks[-1]][:1]
    return _split_plans(profile, ks), _split_plans(profile, past)


def _env_policy_cycle(profile: Any) -> Any:
    return next(c for c in profile.cycles if tuple(c.members) == (ENV, POLICY))


def _split_plans(profile: Any, ks: list[int]) -> list[Any]:
    """The fastest split-cycle plan for each k in ``ks``, fastest first."""
    from loomrl.errors import PlanError
    from loomrl.plan import cycle, fixed_plan, leaf, temporal

    n = profile.devices
    a, b = profile.components[ENV], profile.components[POLICY]
    rest = [c for c in profile.components if c not in (ENV, POLICY)]
    by_k: dict[int, Any] = {}
    for na in a.valid_devices:
        for nb in b.valid_devices:
            if na + nb > n:
                continue
            for k in ks:
                tree = cycle(ENV, POLICY, n, split=(na, nb), groups=k)
                if rest:
                    chain = leaf(rest[-1], n)
                    for c in reversed(rest[:-1]):
                        chain = temporal(leaf(c, n), chain)
                    tree = temporal(tree, chain)
                try:
                    plan = fixed_plan(
                        profile, tree, max(profile.granularities), method="split-cycle"
                    )
                except PlanError:
                    continue
                if k not in by_k or plan.predicted_s < by_k[k].predicted_s - 1e-12:
                    by_k[k] = plan
    return sorted(by_k.values(), key=lambda p: p.predicted_s)


@dataclass(frozen=True)
class CyclePlacement:
    """Where the cycle runs: env workers (one per env device, or ``env_workers`` on host cores
    beside the devices), the policy on one device, k groups."""

    env_devices: tuple[int, ...]
    policy_devices: tuple[int, ...]
    groups: int
    colocated: bool
    mode: str
    predicted_s: float | None = None
    env_workers: int = 0  # 0: one per env device

    @property
    def workers(self) -> int:
        return self.env_workers or len(self.env_devices)

    @property
    def launch_devices(self) -> tuple[int, ...]:
        """Devices the env workers are started on (host-core workers go beside the policy)."""
        if self.env_workers:
            return (self.env_devices or self.policy_devices)[:1]
        return self.env_devices

    def describe(self) -> dict[str, Any]:
        return {
            "env_devices": list(self.env_devices),
            "env_workers": self.workers,
            "policy_devices": list(self.policy_devices),
            "groups": self.groups,
            "colocated": self.colocated,
            "mode": self.mode,
        }


def placement_from_plan(
    plan: Any, num_envs: int, host_env_workers: int | None = None
) -> CyclePlacement:
    """Map a plan with a cycle node ``env<->policy`` to workers, devices and k.

    ``host_env_workers``: env workers on host cores (what ``cycle_profile`` modelled with it);
    None: one env worker per env device, and a plan with env on host cores is refused.
    """
    cyc = [x for x in plan.tree.leaves() if x.op == "cycle" and set(x.members) == {ENV, POLICY}]
    if not cyc:
        raise PlacementError(
            f"the plan has no cycle node over {ENV!r} and {POLICY!r} (components: "
            f"{plan.tree.components()}); plan a profile that declares that cycle"
        )
    node = cyc[0]
    md = node.member_devices()
    env_devs, pol_devs = tuple(md[ENV]), tuple(md[POLICY][:1])
    if host_env_workers is not None:
        if num_envs % host_env_workers:
            raise PlacementError(
                f"{host_env_workers} env workers do not divide env.num_envs={num_envs}; use a "
                f"num_envs that is a multiple of {host_env_workers}"
            )
    elif not env_devs:
        raise PlacementError(
            f"the plan runs {ENV!r} on host CPU cores beside the devices, which this cluster's "
            f"profile did not model (its env workers run one per device); plan with "
            f"placement=auto on this cluster, or pin a plan that gives {ENV!r} devices"
        )
    elif num_envs % len(env_devs):
        raise PlacementError(
            f"the plan runs {ENV!r} on {len(env_devs)} devices (one env worker each), which does "
            f"not divide env.num_envs={num_envs}; use a num_envs that is a multiple of "
            f"{len(env_devs)}, or a plan with a divisor of {num_envs} env devices"
        )
    k = min(1 if node.split is None else node.groups, num_envs)
    return CyclePlacement(
        env_devs,
        pol_devs,
        k,
        node.split is None,
        plan.mode,
        getattr(plan, "predicted_s", None),
        env_workers=host_env_workers or 0,
    )


def check_cores(placement: CyclePlacement, env_cores: float, cluster: Any) -> None:
    """Refuse a placement whose env workers reserve more CPU cores than their node has. Where
    devices are CPU slots (a slot is a core), a policy on a slot apart from the env workers'
    that runs while they step (k >= 2 ring groups) holds one more core of that node; one that
    shares their slots, or takes turns with them (k = 1), does not. The planner counts the
    same (``cycle_profile``, ``plan.cost.node_options``)."""
    # One launch device per env worker (host-core workers all start beside the policy).
    devices = placement.launch_devices * (placement.env_workers or 1)
    per_node: dict[int, list[int]] = {}
    for d in devices:
        per_node.setdefault(cluster.devices[d].node, []).append(d)
    policy_slot: dict[int, int] = {}
    for d in placement.policy_devices:
        dev = cluster.devices[d]
        if dev.kind == "cpu" and d not in placement.env_devices and placement.groups >= 2:
            policy_slot[dev.node] = 1
    for node_idx, devs in per_node.items():
        beside = policy_slot.get(node_idx, 0)
        need = len(devs) * env_cores + beside
        have = cluster.nodes[node_idx].num_cpus
        if need > have + 1e-9:
            fit = int(max(have - beside, 0) // env_cores)
            policy = (
                f" and the policy's core on device {placement.policy_devices[0]}" if beside else ""
            )
            raise PlacementError(
                f"the plan puts {len(devs)} env worker(s) on node {node_idx} (devices "
                f"{sorted(set(devs))}), each reserving env.cpu_cores={env_cores:g} CPU core(s)"
                f"{policy}: {need:g} cores, but the node has {have:g}. Lower env.cpu_cores, or "
                f"use a plan with at most {fit} env worker(s) on that node (placement=auto plans "
                f"within the cores)"
            )
