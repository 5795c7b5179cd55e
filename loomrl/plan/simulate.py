"""Discrete-event simulation of one iteration of a plan.

Every leaf call draws its duration (deterministic, or log-normal around the
profile's time with ``sigma`` for long-tailed response lengths). Leaves are
FIFO servers; a spatial node is a tandem of its children linked by a channel
of ``channel_capacity`` micro-batches (None or 0: unbounded): the producer starts
micro-batch j only once its consumer has started j - capacity, the same hold as
``Flow(channel_capacity=...)`` puts on a run (where a side is itself a subtree, the
simulation holds its first stage, the run the stage that feeds the hop); a stream-context
temporal node shares its devices between its children, serving micro-batch j
with latency F_j and interval P_j computed from the drawn durations; a cycle
node runs its steps, and with k >= 2 groups the two members take turns in a
ring. Offload/onload switches are paid once per leaf when the root is temporal,
just before the leaf's first block runs. With ``sigma == 0`` and an unbounded
channel the result equals ``evaluate`` (tests check this to 1e-9).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from loomrl.plan.cost import evaluate
from loomrl.plan.plan import Interval, Node, Plan
from loomrl.plan.profile import WorkloadProfile

__all__ = [
    "MAX_ITERATIONS",
    "MAX_SIGMA",
    "MAX_TIMELINE",
    "TIMELINE_CALLS",
    "SimResult",
    "SimulationTooLong",
    "calls_per_iteration",
    "capacity_problems",
    "coarsen",
    "predicted_timeline",
    "simulate",
]

# The widest log-normal spread simulated. At sigma the median call takes exp(-sigma**2 / 2) of
# its profiled time and the mean rests on ever rarer long draws: at 5 the median is 4e-6 of it
# and a mean estimated from any feasible number of iterations says nothing (the default spread
# is 0.3). The bound also keeps exp() of a draw finite.
MAX_SIGMA = 5.0

# The most intervals a plan's predicted timeline keeps (``coarsen`` joins the rest): a figure
# 12 inches wide shows no more, and every returned plan carries its timeline (10**5 ring groups
# of a 2-cycle made 400,000 intervals, 71 MB of JSON).
MAX_TIMELINE = 10_000

# The most calls ``predicted_timeline`` plays out one by one (0.5 s or so): past it, an iteration
# is drawn in closed form (``_Coarse``). 10**7 micro-batches took 100 s and 6 GB per plan, and a
# ring of 10**6 groups 11 s; every returned plan carries its timeline.
TIMELINE_CALLS = 200_000

# The most iterations simulated in one call: their times are all kept, and the p95 of 100,000
# is already within a fraction of a percent.
MAX_ITERATIONS = 100_000


@dataclass(frozen=True)
class SimResult:
    """Iteration times over ``iterations`` simulated iterations, and the analytic prediction."""

    times: tuple[float, ...]
    analytic_s: float
    intervals: tuple[Interval, ...]  # of the last simulated iteration

    @property
    def mean_s(self) -> float:
        return float(np.mean(self.times))

    @property
    def p95_s(self) -> float:
        return float(np.percentile(self.times, 95))


class SimulationTooLong(ValueError):
    """A simulation would play out more calls than its ``max_calls``."""


class _Sim:
    def __init__(
        self,
        profile: WorkloadProfile,
        m: int,
        rng,
        sigma: float,
        capacity: int | None,
        budget: int | None = None,
    ):
        self.prof = profile
        # calls played out so far, and the most allowed (None: any number)
        self.spent, self.budget = 0, budget
        self.m = m
        self.K = profile.batch // m
        self.rng = rng
        self.sigma = sigma
        self.capacity = capacity
        self.draws: dict[tuple, float] = {}
        # busy spans [component, devices, start, end, micro_batch, kind], and for each row
        # (component, devices, kind) the index of its latest span
        self.spans: list[list] = []
        self.latest: dict[tuple, int] = {}

    def record(
        self, comp: str, devs: tuple[int, int], start: float, end: float, j: int, kind: str = "run"
    ) -> None:
        """Add a busy span. One that starts where its row's latest span ends, for the same
        micro-batch, extends that span instead: a ring's back-to-back calls (10**5 groups) are
        one busy stretch, and their union, which is all a timeline shows, is unchanged."""
        key = (comp, devs, kind)
        i = self.latest.get(key)
        if i is not None and self.spans[i][4] == j and start <= self.spans[i][3]:
            self.spans[i][3] = max(self.spans[i][3], end)
            return
        self.latest[key] = len(self.spans)
        self.spans.append([comp, devs, start, end, j, kind])

    @property
    def intervals(self) -> list[Interval]:
        return [Interval(*x) for x in self.spans]

    # -- durations are drawn once per (call site, micro-batch) so that re-running a
    #    subtree (channel back-pressure fixed point) sees the same randomness.
    def draw(self, key: tuple, nominal: float) -> float:
        if self.sigma == 0:  # deterministic: nothing to remember (a ring makes 10**5 keys)
            return nominal
        v = self.draws.get(key)
        if v is None:
            # mean-preserving log-normal factor: E[exp(s z - s^2/2)] = 1
            v = nominal * math.exp(self.sigma * self.rng.standard_normal() - self.sigma**2 / 2)
            self.draws[key] = v
        return v

    def leaf_time(self, node: Node, items: int, j: int) -> float:
        comp = self.prof.components[node.component]  # type: ignore[index]
        return self.draw((id(node), j), comp.time(node.used or node.n, items))

    def spend(self, calls: int) -> None:
        """Count ``calls`` played out; past the budget, stop with ``SimulationTooLong``."""
        self.spent += calls
        if self.budget is not None and self.spent > self.budget:
            raise SimulationTooLong(f"more than {self.budget:,} calls")

    # -- a cycle node as one call: run its steps (and ring groups) event by event
    def cycle_run(self, node: Node, items: int, j: int, t0: float, record: bool) -> float:
        spec = _cycle_spec(node)
        cyc = next(c for c in self.prof.cycles if c.name == node.component)
        self.spend(2 * cyc.steps * (spec[3] if spec[0] == "split" else 1))
        a, b = (self.prof.components[x] for x in cyc.members)
        devs = node.member_devices()
        ra, rb = (_rng(devs[x]) for x in cyc.members)
        if spec[0] == "coloc" or spec[3] == 1:
            na = spec[1]
            nb = spec[1] if spec[0] == "coloc" else spec[2]
            half = cyc.hop_s / 2  # each hand-off, a -> b and b -> a, is half a round trip
            t = t0
            for s in range(cyc.steps):
                da = self.draw((id(node), j, s, "a"), a.time(na, items))
                t += half if s else 0.0
                if record:
                    self.record(a.name, ra, t, t + da, j)
                if s + 1 == cyc.steps and not cyc.last_b:  # the cycle ends on a's call
                    t += da
                    break
                db = self.draw((id(node), j, s, "b"), b.time(nb, items))
                if record:
                    self.record(b.name, rb, t + da + half, t + da + half + db, j)
                t += da + half + db
            return t - t0
        _, na, nb, k = spec
        c, half = cyc.overlap_slowdown, cyc.hop_s / 2
        free_a = free_b = t0
        done_b = [t0] * k
        for s in range(cyc.steps):
            for g in range(k):
                da = self.draw((id(node), j, s, g, "a"), c * a.time(na, items / k))
                db = self.draw((id(node), j, s, g, "b"), c * b.time(nb, items / k))
                sa = max(free_a, done_b[g] + (half if s else 0.0))
                free_a = sa + da
                if record:
                    self.record(a.name, ra, sa, sa + da, j)
                if s + 1 == cyc.steps and not cyc.last_b:  # the cycle ends on a's call
                    continue
                sb = max(free_b, free_a + half)
                free_b = sb + db
                done_b[g] = free_b
                if record:
                    self.record(b.name, rb, sb, sb + db, j)
        return (max(done_b) if cyc.last_b else free_a) - t0

    def single_time(self, node: Node, items: int, j: int) -> float:
        if node.op == "leaf":
            return self.leaf_time(node, items, j)
        return self.draws.get((id(node), j, "total")) or self._cycle_total(node, items, j)

    def _cycle_total(self, node: Node, items: int, j: int) -> float:
        v = self.cycle_run(node, items, j, 0.0, record=False)
        self.draws[(id(node), j, "total")] = v
        return v

    # -- stream context: arrivals -> departures (one entry per micro-batch)
    def stream(self, node: Node, arr: list[float], record: bool) -> list[float]:
        if node.op in ("leaf", "cycle"):
            if node.op == "leaf":
                self.spend(len(arr))
            out, free = [], -math.inf
            for j, a in enumerate(arr):
                start = max(a, free)
                d = self.single_time(node, self.m, j)
                free = start + d
                out.append(free)
                if record:
                    self._record_single(node, start, d, j, self.m)
            return out
        a, b = node.children
        if node.op == "spatial":
            if self.capacity is None:
                return self.stream(b, self.stream(a, arr, record), record)
            # Back-pressure: a may not start micro-batch j before b has started j - capacity
            # (Flow's hold). Held here: a's first stage, which is the hop's producer only when
            # a is a single stage; a run holds the stage that feeds b.
            gated = list(arr)
            for _ in range(len(arr) + 1):
                da = self.stream(a, gated, False)
                db = self.stream(b, da, False)
                starts_b = self._starts(b, da)
                new = [
                    max(arr[j], starts_b[j - self.capacity]) if j >= self.capacity else arr[j]
                    for j in range(len(arr))
                ]
                if new == gated:
                    break
                gated = new
            if record:
                da = self.stream(a, gated, True)
                db = self.stream(b, da, True)
            return db
        # co-resident temporal: a server with latency F_j and interval P_j
        out, prev = [], -math.inf
        for j, x in enumerate(arr):
            f, p = self.fp(node, j)
            d = max(x + f, prev + p)
            out.append(d)
            prev = d
            if record:
                self._record_sequential(node, d, j)
        return out

    def _starts(self, node: Node, arr: list[float]) -> list[float]:
        """When ``node`` takes micro-batch j off its input channel."""
        if node.op in ("leaf", "cycle"):
            starts, free = [], -math.inf
            for j, a in enumerate(arr):
                s = max(a, free)
                starts.append(s)
                free = s + self.single_time(node, self.m, j)
            return starts
        if node.op == "spatial":
            return self._starts(node.children[0], arr)
        dep = self.stream(node, arr, False)
        return [d - self.fp(node, j)[0] for j, d in enumerate(dep)]

    def fp(self, node: Node, j: int) -> tuple[float, float]:
        if node.op in ("leaf", "cycle"):
            d = self.single_time(node, self.m, j)
            return d, d
        (fa, pa), (fb, pb) = self.fp(node.children[0], j), self.fp(node.children[1], j)
        if node.op == "spatial":
            return fa + fb, max(pa, pb)
        return fa + fb, pa + pb

    def _record_single(self, node: Node, start: float, d: float, j: int, items: int) -> None:
        if node.op == "leaf":
            self.record(node.component, _leaf_range(node), start, start + d, j)  # type: ignore[arg-type]
        else:
            self.cycle_run(node, items, j, start, record=True)

    def _record_sequential(self, node: Node, end: float, j: int) -> None:
        # Exact when the children are single servers; for nested subtrees the
        # leaves are drawn back to back, which is where the time goes on the devices.
        leaves = node.leaves()
        durs = [self.single_time(x, self.m, j) for x in leaves]
        t = end - sum(durs)
        for x, d in zip(leaves, durs, strict=True):
            self._record_single(x, t, d, j, self.m)
            t += d

    # -- phase context: the whole batch, then yield
    def phase(self, node: Node, t0: float, root: bool) -> float:
        if root and node.op == "temporal":
            t = t0
            for block in _temporal_spine(node):
                for comp, devs, sw in _switches(self.prof, block):
                    self.record(comp, devs, t, t + sw, -1, "switch")
                    t += sw
                t = self.phase(block, t, False)
            return t
        if node.op == "leaf":
            d = self.leaf_time(node, self.prof.batch, -1)
            self.record(node.component, _leaf_range(node), t0, t0 + d, 0)  # type: ignore[arg-type]
            return t0 + d
        if node.op == "cycle":
            return t0 + self.cycle_run(node, self.prof.batch, -1, t0, record=True)
        if node.op == "temporal":
            return self.phase(node.children[1], self.phase(node.children[0], t0, False), False)
        return max(self.stream(node, [t0] * self.K, True))


class _Coarse:
    """One deterministic iteration in closed form, for ``predicted_timeline`` past
    ``TIMELINE_CALLS`` calls: each leaf's (or cycle member's) calls under a node as one span
    that keeps their busy seconds and ends where the last of them ends.

    In stream context, micro-batch j reaches a node at a + j r (all at t0 at a spatial root).
    A leaf taking d a call starts j at a + j max(r, d) and passes it on d later; a co-resident
    temporal node of latency F and interval P passes j on at a + F + j max(r, P): the form is
    kept, so the K-th micro-batch's times follow from the first's. A cycle's ring ends come
    from ``cost.ring_ends``.
    """

    def __init__(self, profile: WorkloadProfile, m: int):
        self.prof = profile
        self.m = m
        self.K = profile.batch // m
        self.spans: list[list] = []

    def add(self, comp: str, devs: tuple[int, int], end: float, busy: float, j: int) -> None:
        self.spans.append([comp, devs, end - busy, end, j, "run"])

    def cycle_parts(self, node: Node, items: int) -> tuple[float, list[tuple]]:
        """One call of a cycle node on ``items``: its seconds, and per member (name, devices,
        busy seconds, when its last call ends from the call's start)."""
        from loomrl.plan.cost import ring_ends

        cyc = next(c for c in self.prof.cycles if c.name == node.component)
        a, b = (self.prof.components[x] for x in cyc.members)
        spec = _cycle_spec(node)
        if spec[0] == "coloc" or spec[3] == 1:  # the two sides alternate, as _Sim plays them
            na, nb = spec[1], spec[1] if spec[0] == "coloc" else spec[2]
            ta, tb, k = a.time(na, items), b.time(nb, items), 1
        else:
            _, na, nb, k = spec
            c = cyc.overlap_slowdown
            ta, tb = c * a.time(na, items / k), c * b.time(nb, items / k)
        end_a, end_b = ring_ends(ta, tb, cyc.steps, k, cyc.hop_s, cyc.last_b)
        total = end_b if cyc.last_b and end_b is not None else end_a
        devs = node.member_devices()
        parts = [(a.name, _rng(devs[a.name]), cyc.steps * k * ta, end_a)]
        if end_b is not None:
            calls_b = cyc.steps if cyc.last_b else cyc.steps - 1
            parts.append((b.name, _rng(devs[b.name]), calls_b * k * tb, end_b))
        return total, parts

    def single(self, node: Node, items: int) -> float:
        if node.op == "leaf":
            comp = self.prof.components[node.component]  # type: ignore[index]
            return comp.time(node.used or node.n, items)
        return self.cycle_parts(node, items)[0]

    def record(self, node: Node, start: float, items: int, calls: int, j: int) -> None:
        """Spans of ``calls`` calls of a leaf or cycle on ``items``, the last one at ``start``."""
        if node.op == "leaf":
            d = self.single(node, items)
            self.add(node.component, _leaf_range(node), start + d, calls * d, j)  # type: ignore[arg-type]
            return
        _, parts = self.cycle_parts(node, items)
        for name, devs, busy, end in parts:
            self.add(name, devs, start + end, calls * busy, j)

    def fp(self, node: Node) -> tuple[float, float]:
        if node.op in ("leaf", "cycle"):
            d = self.single(node, self.m)
            return d, d
        (fa, pa), (fb, pb) = self.fp(node.children[0]), self.fp(node.children[1])
        if node.op == "spatial":
            return fa + fb, max(pa, pb)
        return fa + fb, pa + pb

    def stream(self, node: Node, a: float, r: float) -> tuple[float, float]:
        """Micro-batch j arrives at a + j r; returns when it leaves, as (a', r')."""
        K, j = self.K, (0 if self.K == 1 else -1)
        if node.op in ("leaf", "cycle"):
            d = self.single(node, self.m)
            rate = max(r, d)
            self.record(node, a + (K - 1) * rate, self.m, K, j)
            return a + d, rate
        if node.op == "spatial":
            return self.stream(node.children[1], *self.stream(node.children[0], a, r))
        f, p = self.fp(node)  # co-resident: its leaves back to back, ending as j leaves
        rate = max(r, p)
        end = a + f + (K - 1) * rate
        for x in reversed(node.leaves()):
            d = self.single(x, self.m)
            self.record(x, end - d, self.m, K, j)
            end -= d
        return a + f, rate

    def phase(self, node: Node, t0: float, root: bool) -> float:
        if root and node.op == "temporal":
            t = t0
            for block in _temporal_spine(node):
                for comp, devs, sw in _switches(self.prof, block):
                    self.spans.append([comp, devs, t, t + sw, -1, "switch"])
                    t += sw
                t = self.phase(block, t, False)
            return t
        if node.op in ("leaf", "cycle"):
            self.record(node, t0, self.prof.batch, 1, 0 if node.op == "leaf" else -1)
            return t0 + self.single(node, self.prof.batch)
        if node.op == "temporal":
            return self.phase(node.children[1], self.phase(node.children[0], t0, False), False)
        a, r = self.stream(node, t0, 0.0)
        return a + (self.K - 1) * r  # the last micro-batch leaves last


def _switches(
    profile: WorkloadProfile, block: Node
) -> Iterator[tuple[str, tuple[int, int], float]]:
    """(component, devices, seconds) of each switch a temporal block pays before its phase,
    in its leaves' order (a cycle's members in turn)."""
    for x in block.leaves():
        for comp in x.members if x.op == "cycle" else (x.component,):
            sw = profile.components[comp].switch_s
            if sw > 0:
                yield comp, _rng(x.member_devices()[comp]), sw


def _temporal_spine(node: Node) -> list[Node]:
    if node.op != "temporal":
        return [node]
    return _temporal_spine(node.children[0]) + _temporal_spine(node.children[1])


def _cycle_spec(node: Node) -> tuple:
    if node.split is None:
        return ("coloc", node.used or node.n)
    return ("split", node.split[0], node.split[1], node.groups)


def _leaf_range(node: Node) -> tuple[int, int]:
    """A leaf's devices as [first, last + 1), as ``_rng(node.devices)`` without the list."""
    n = node.used or node.n
    return (node.start, node.start + n) if n else (0, 0)


def _rng(devs: list[int]) -> tuple[int, int]:
    return (devs[0], devs[-1] + 1) if devs else (0, 0)


def simulate(
    plan: Plan | Node,
    profile: WorkloadProfile,
    micro_batch: int | None = None,
    sigma: float = 0.0,
    iterations: int = 1,
    channel_capacity: int | None = None,
    seed: int | None = 0,
    max_calls: int | None = None,
) -> SimResult:
    """Simulate ``iterations`` iterations of a plan (or a laid-out, resolved tree).

    sigma: log-normal spread of every call's duration (0: deterministic).
    channel_capacity: micro-batches a producer may run ahead of its consumer on a spatial
    hop: it starts micro-batch j only once the consumer has started j - channel_capacity
    (None or 0: unbounded). ``Flow(channel_capacity=...)`` holds a run's stages the same way.
    max_calls: the most calls to play out over all iterations (None: no limit); past it,
    ``SimulationTooLong``. A bounded channel replays its upstream side until the back-pressure
    settles, up to once per micro-batch: with capacity 1, 1,000 micro-batches through three
    components played out 10**9 calls.
    """
    problems = simulation_problems(sigma, iterations) + capacity_problems(channel_capacity)
    if problems:
        raise ValueError("; ".join(problems))
    tree = plan.tree if isinstance(plan, Plan) else plan
    m = micro_batch or (plan.micro_batch if isinstance(plan, Plan) else profile.batch)
    rng = np.random.default_rng(seed)
    times = []
    sim = None
    spent = 0
    for _ in range(iterations):
        left = None if max_calls is None else max_calls - spent
        sim = _Sim(profile, m, rng, sigma, channel_capacity or None, left)
        times.append(sim.phase(tree, 0.0, root=True) + profile.iteration_overhead_s)
        spent += sim.spent
    analytic = evaluate(tree, profile, m).predicted_s
    return SimResult(tuple(times), analytic, tuple(sim.intervals))  # type: ignore[union-attr]


def simulation_problems(
    sigma: float, iterations: int, sigma_key: str = "sigma", iterations_key: str = "iterations"
) -> list[str]:
    """What is wrong with a simulation's ``sigma`` and ``iterations`` (empty: nothing), each
    naming its key (``--sigma`` for the command line) and the allowed range."""
    out = []
    if not (isinstance(sigma, numbers.Real) and 0 <= sigma <= MAX_SIGMA):  # nan fails too
        out.append(
            f"{sigma_key} must be a finite log-normal spread from 0 to {MAX_SIGMA:g} (0: "
            f"deterministic; beyond {MAX_SIGMA:g} almost every call takes ~0 s and the mean "
            f"rests on rare draws), got {sigma!r}"
        )
    if isinstance(iterations, bool) or not isinstance(iterations, numbers.Integral):
        out.append(f"{iterations_key} must be a whole number, got {iterations!r}")
    elif not 1 <= iterations <= MAX_ITERATIONS:
        out.append(
            f"{iterations_key} must be from 1 to {MAX_ITERATIONS:,} (every iteration's time is "
            f"kept; p95 settles long before), got {iterations:,}"
        )
    return out


def capacity_problems(value: object, key: str = "channel_capacity") -> list[str]:
    """What is wrong with a channel capacity (empty: nothing), naming ``key``. A capacity is
    the micro-batches a producer may run ahead of its consumer on a hop whose two stages run at
    once: a whole number >= 1, or 0 / None for unbounded."""
    if value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return [
            f"{key}={value!r}: a channel capacity is a whole number of micro-batches a producer "
            f"may run ahead of its consumer; use an integer >= 1 (e.g. {key}=2), or 0 for "
            "unbounded"
        ]
    if value < 0:
        return [
            f"{key}={value!r}: a channel capacity cannot be negative; use an integer >= 1 "
            f"micro-batches a producer may run ahead of its consumer (e.g. {key}=2), or 0 for "
            "unbounded"
        ]
    return []


def calls_per_iteration(tree: Node, profile: WorkloadProfile, micro_batch: int) -> int:
    """The calls one simulated iteration of ``tree`` plays out: a leaf's one per micro-batch
    in stream context (K = batch / micro_batch of them), a cycle's steps x groups of each
    member per call. A whole number, however large (batch 10**12 at micro-batch 1)."""
    K = profile.batch // micro_batch
    steps = {c.name: c.steps for c in profile.cycles}

    def one(node: Node) -> int:
        if node.op == "leaf":
            return 1
        return 2 * steps[node.component] * (node.groups if node.split else 1)  # type: ignore[index]

    def stream(node: Node) -> int:
        if node.op in ("leaf", "cycle"):
            return one(node)
        return stream(node.children[0]) + stream(node.children[1])

    def phase(node: Node) -> int:
        if node.op in ("leaf", "cycle"):
            return one(node)
        if node.op == "temporal":
            return phase(node.children[0]) + phase(node.children[1])
        return K * stream(node)

    return phase(tree)


def predicted_timeline(
    tree: Node, profile: WorkloadProfile, micro_batch: int, limit: int | None = None
) -> list[Interval]:
    """Busy intervals of every component in one deterministic iteration, sorted by start.

    Back-to-back calls of one micro-batch are one interval. At most ``limit`` intervals
    (default ``MAX_TIMELINE``) are kept: beyond it, ``coarsen`` joins each row's consecutive
    intervals into as few as fit, keeping every row's busy seconds and its last end. An
    iteration of more than ``TIMELINE_CALLS`` calls is not played out call by call: each
    leaf's or cycle member's calls under one node are one interval, with the same busy
    seconds and last end (``_Coarse``).
    """
    big = calls_per_iteration(tree, profile, micro_batch) > TIMELINE_CALLS
    sim = _Coarse(profile, micro_batch) if big else _Sim(profile, micro_batch, None, 0.0, None)
    sim.phase(tree, 0.0, root=True)
    out = coarsen(sim.spans, MAX_TIMELINE if limit is None else limit)
    return sorted(out, key=lambda i: (i.start, i.devices, i.component))


def coarsen(spans: Sequence[Sequence], limit: int) -> list[Interval]:
    """At most ``limit`` intervals (or one per row, if there are more rows) standing for
    ``spans``, each (component, devices, start, end, micro_batch, kind) as in ``Interval``.

    Each row (component, devices, kind) joins runs of ``f`` consecutive spans into one, ``f``
    the smallest that fits. A joined interval lasts as long as its parts together and ends where
    the last one ends, so a row's busy seconds and the iteration's end are kept and a part moves
    by at most the gaps inside its run; it belongs to one micro-batch only if all its parts do
    (else -1, drawn without a label). Within ``limit``, every span is kept as it is.
    """
    if len(spans) <= limit:
        return [Interval(*x) for x in spans]
    rows: dict[tuple, list[Sequence]] = {}
    for x in spans:
        rows.setdefault((x[0], x[1], x[5]), []).append(x)
    room = max(limit - len(rows), 1)  # a row's last run may be short: one spare per row
    f = -(-len(spans) // room)
    out: list[Interval] = []
    for (comp, devs, kind), row in rows.items():
        row.sort(key=lambda x: x[2])
        for k in range(0, len(row), f):
            run = row[k : k + f]
            busy = sum(x[3] - x[2] for x in run)
            mbs = {x[4] for x in run}
            mb = mbs.pop() if len(mbs) == 1 else -1
            out.append(Interval(comp, devs, run[-1][3] - busy, run[-1][3], mb, kind))
    return out
