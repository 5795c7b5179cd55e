"""The cost algebra of plan trees (PLANNER.md), for one explicit tree.

Phase context: the subtree processes the whole batch (M items) and yields.
Stream context: the subtree handles one micro-batch (m items) at a time; F is
the time for the first micro-batch to pass, P the steady interval.

=================  ==================  =========================  =================
node               phase T             stream (F, P)              resident memory
=================  ==================  =========================  =================
leaf(c, n)         t_c(n', M)          t_c(n', m), t_c(n', m)     mem_c[n']
temporal(A, B)     T_A + T_B (+switch) F_A + F_B, P_A + P_B       phase: max, stream: sum
spatial(A, B)      F + (K-1) P         F_A + F_B, max(P_A, P_B)   max
=================  ==================  =========================  =================

Every leaf below at least one phase-context temporal node pays its switch_s once.
Phase-context temporal nodes are exactly the temporal nodes reachable from the
root through temporal nodes only, so that set is non-empty iff the root is
temporal, and then it covers every leaf: the switch bill is the sum of all
switch_s when the root is temporal, else zero.

CPU cores of concurrently running components: spatial sums, temporal takes the max.
This module does not search; ``loomrl.plan.search`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NamedTuple

from loomrl.errors import PlanError
from loomrl.plan.plan import Node
from loomrl.plan.profile import ComponentProfile, CycleSpec, WorkloadProfile

__all__ = [
    "Evaluation",
    "Option",
    "cycle_options",
    "cycle_time",
    "evaluate",
    "leaf_options",
    "node_options",
    "pareto",
    "ring_ends",
    "ring_span",
    "switch_total",
]

KIND_T, KIND_S = 1, 2  # bit flags: the subtree uses temporal / spatial placement
EPS = 1e-9


class Option(NamedTuple):
    """One way to run a leaf or cycle node: cost, resident memory, cores, devices used, kind, spec."""

    time: float
    mem: float
    cores: float
    used: int
    kind: int
    spec: tuple  # ("leaf", n') | ("coloc", n') | ("split", n_a, n_b, k)


def leaf_options(
    comp: ComponentProfile, n: int, items: float, only: int | None = None
) -> list[Option]:
    """Every valid device count n' <= n (the rest idle), unfiltered by memory; with ``only``,
    just that count (none if it is not valid)."""
    counts = comp.valid_devices if only is None else [v for v in (only,) if v in comp.valid_devices]
    return [
        Option(comp.time(v, items), comp.memory_gb[v], comp.cores(v), v, 0, ("leaf", v))
        for v in counts
        if v <= n
    ]


def cycle_time(
    a: ComponentProfile,
    b: ComponentProfile,
    steps: int,
    items: int,
    spec: tuple,
    slowdown: float = 1.0,
    hop: float = 0.0,
    last_b: bool = True,
) -> float:
    """Iteration time of the 2-cycle a <-> b on ``items`` items (PLANNER.md's baseline model
    when ``hop`` is 0); ``slowdown`` stretches both sides' calls where they overlap (split,
    k >= 2); ``hop`` is the latency per step of a group's round trip, in which neither is busy.

    With per-group call times ta, tb (k groups; k = 1 when co-located) a step of the ring takes
    P = max(k * max(ta, tb), ta + tb + hop): the busier side's k calls, unless one group's
    round trip is longer. The first step has no hop before its first call and the last ends on
    b's call, so T = (S - 1) * P + (k - 1) * max(ta, tb) + ta + tb + hop / 2, which is
    S * k * max + min at hop 0 (the simulator runs the same ring event by event).

    ``last_b=False`` (a cycle that ``ends_with`` its first member: S calls of a, S - 1 of b per
    group) is priced by playing the ring out (``ring_span``), O(S * k).
    """
    if spec[0] == "coloc":
        n = spec[1]
        ta, tb, k = a.time(n, items), b.time(n, items), 1
    else:
        _, na, nb, k = spec
        ta, tb = a.time(na, items / k), b.time(nb, items / k)
        if k >= 2:
            ta, tb = slowdown * ta, slowdown * tb
    if not last_b:
        return ring_span(ta, tb, steps, k, hop, last_b=False)
    if not hop:  # the same value, in the baseline's own arithmetic: existing plans keep theirs
        return steps * (ta + tb) if k == 1 else steps * k * max(ta, tb) + min(ta, tb)
    period = max(k * max(ta, tb), ta + tb + hop)
    return (steps - 1) * period + (k - 1) * max(ta, tb) + ta + tb + hop / 2


# A ring of more calls than this (steps x groups) is priced by ``ring_ends``' closed form, not
# played out: a cycle ending on its first member took minutes to price at 10**4 items x 1,000
# steps (one play-out per split, group count and micro-batch size). At or below it the play-out
# keeps the exact floats plans were always priced with.
RING_PLAYOUT = 4096


def ring_ends(
    ta: float, tb: float, steps: int, k: int, hop: float = 0.0, last_b: bool = True
) -> tuple[float, float | None]:
    """When a's last call and b's last call end (seconds from the first call) in the ring that
    ``ring_span`` plays out, in closed form: O(1) for any steps and groups. b's end is None when
    b makes no call (one step that ends on a).

    With M = max(ta, tb) and P = max(k M, ta + tb + hop) (k = 1: the sides alternate), b's calls
    of step s end P later than those of step s - 1, the last at s P + hop / 2 + ta + tb +
    (k - 1) M. a is one worker taking its calls in order, each once b's call of the step before
    has ended and half a hop has passed: its last call ends when the calls after some call's
    release are done, the latest of S k ta (from the start) and the release of its very last
    call plus ta (any later release comes with fewer calls left, and releases gain P >= k ta a
    step). Leaving out the last step's calls of b (``last_b=False``) moves none of a's.
    """
    big = max(ta, tb)
    period = max(k * big, ta + tb + hop)
    b_first = hop / 2 + ta + tb + (k - 1) * big  # b's last call of the first step ends
    a_end = steps * k * ta  # a never waits
    if steps >= 2:  # or a waits, last, for b's last call of the step before
        a_end = max(a_end, (steps - 2) * period + b_first + hop / 2 + ta)
    b_steps = steps if last_b else steps - 1
    b_end = (b_steps - 1) * period + b_first if b_steps >= 1 else None
    return a_end, b_end


def ring_span(
    ta: float, tb: float, steps: int, k: int, hop: float = 0.0, last_b: bool = True
) -> float:
    """Seconds from the first call to the last of k ring groups taking ``steps`` steps of
    a -> b (each side one worker, calls in ring order, each hand-off half of ``hop``), the
    schedule played out as the simulator plays it; ``last_b=False`` leaves out every group's
    last call of b (the cycle ends on a). With ``last_b`` it equals ``cycle_time``'s closed form.
    Past ``RING_PLAYOUT`` calls, ``ring_ends``' closed form (equal but for rounding).
    """
    if steps * k > RING_PLAYOUT:
        a_end, b_end = ring_ends(ta, tb, steps, k, hop, last_b)
        return b_end if last_b and b_end is not None else a_end
    half = hop / 2
    free_a = free_b = 0.0
    done_b = [0.0] * k
    for s in range(steps):
        for g in range(k):
            free_a = max(free_a, done_b[g] + (half if s else 0.0)) + ta
            if s + 1 == steps and not last_b:
                continue
            free_b = max(free_b, free_a + half) + tb
            done_b[g] = free_b
    return max(done_b) if last_b else free_a


def cycle_options(
    a: ComponentProfile,
    b: ComponentProfile,
    steps: int,
    n: int,
    items: int,
    groups: list[int],
    slowdown: float = 1.0,
    hop: float = 0.0,
    last_b: bool = True,
    only: tuple | None = None,
) -> list[Option]:
    """Co-located on a common valid count, or split over n_a + n_b <= n in k ring groups, for
    each k in ``groups`` (divisors of items: ``CycleSpec.group_counts``).

    A member with 0 among its valid counts may run on host cores beside the other's devices
    (n_a = 0 or n_b = 0); its memory is host memory and counts against no device.

    ``only``: ("coloc",) for the co-located options alone, ("split", n_a, n_b, k) for that
    split alone (if it is one), so that costing one tree does not list O(N^2 K) options.
    """
    out: list[Option] = []
    coloc = only is None or only[0] == "coloc"
    for v in a.valid_devices if coloc else ():
        if 1 <= v <= n and v in b.memory_gb:
            spec = ("coloc", v)
            out.append(
                Option(
                    cycle_time(a, b, steps, items, spec, hop=hop, last_b=last_b),
                    a.memory_gb[v]
                    + b.memory_gb[v],  # both stay resident: they alternate every step
                    max(a.cores(v), b.cores(v)),
                    v,
                    KIND_T,
                    spec,
                )
            )
    split = only is None or only[0] == "split"
    for na in a.valid_devices if split else ():
        if only is not None and na != only[1]:
            continue
        for nb in b.valid_devices:
            if na + nb > n or na + nb == 0 or (only is not None and nb != only[2]):
                continue
            mem = max(a.memory_gb[na] if na else 0.0, b.memory_gb[nb] if nb else 0.0)
            for k in groups:
                if only is not None and k != only[3]:
                    continue
                spec = ("split", na, nb, k)
                cores = max(a.cores(na), b.cores(nb)) if k == 1 else a.cores(na) + b.cores(nb)
                out.append(
                    Option(
                        cycle_time(a, b, steps, items, spec, slowdown, hop, last_b),
                        mem,
                        cores,
                        na + nb,
                        KIND_S,
                        spec,
                    )
                )
    return out


def node_options(
    profile: WorkloadProfile,
    name: str,
    n: int,
    items: int,
    any_groups: bool = False,
    only: tuple | None = None,
) -> list[Option]:
    """Options of a graph node (a component, or a cycle named 'a<->b') on n devices. A cycle's
    ring-group counts are those its ``min_group`` allows, or every divisor with ``any_groups``
    (a tree that names its k is costed as asked). ``only``: a cycle's layout alone
    (``cycle_options``)."""
    if name in profile.components:
        return leaf_options(profile.components[name], n, items)
    cyc = _cycle_by_name(profile, name)
    a, b = (profile.components[x] for x in cyc.members)
    groups = cyc.group_counts(items, limited=not any_groups)
    return cycle_options(
        a, b, cyc.steps, n, items, groups, cyc.overlap_slowdown, cyc.hop_s, cyc.last_b, only
    )


def _cycle_by_name(profile: WorkloadProfile, name: str) -> CycleSpec:
    for c in profile.cycles:
        if c.name == name:
            return c
    raise PlanError(f"the profile declares no cycle {name!r}")


def switch_total(profile: WorkloadProfile) -> float:
    return sum(c.switch_s for c in profile.components.values())


def pareto(points: list[tuple], dims: int) -> list[tuple]:
    """Keep the points not dominated (<= in the first ``dims`` fields) by another point."""
    pts = sorted(points, key=lambda p: p[:dims])
    kept: list[tuple] = []
    for p in pts:
        if not any(all(q[i] <= p[i] for i in range(dims)) for q in kept):
            kept.append(p)
    return kept


# ----------------------------------------------------------------------- evaluate


@dataclass(frozen=True)
class Evaluation:
    """Cost of one explicit tree at micro-batch m."""

    predicted_s: float
    memory: float
    feasible: bool
    reason: str = ""
    cores: float = 0.0
    tree: Node | None = None  # the tree with every free choice (leaf device counts) resolved


def _spec_node(node: Node, spec: tuple) -> Node:
    if spec[0] == "leaf":
        return replace(node, used=spec[1])
    if spec[0] == "coloc":
        return replace(node, used=spec[1], split=None, groups=1)
    return replace(node, split=(spec[1], spec[2]), groups=spec[3], used=spec[1] + spec[2])


def _fixed_options(profile: WorkloadProfile, node: Node, items: int) -> list[Option]:
    """Options of a leaf/cycle node, restricted to what the node pins down."""
    if node.op == "leaf":
        comp = profile.components[node.component]  # type: ignore[index]
        return leaf_options(comp, node.n, items, only=node.used)
    only = ("coloc",) if node.split is None else ("split", *node.split, node.groups)
    opts = node_options(profile, node.component, node.n, items, any_groups=True, only=only)  # type: ignore[arg-type]
    if node.split is None:
        opts = [o for o in opts if o.spec[0] == "coloc"]
        if node.used is not None:
            opts = [o for o in opts if o.used == node.used]
    else:
        opts = [
            o
            for o in opts
            if o.spec[0] == "split"
            and (o.spec[1], o.spec[2]) == tuple(node.split)
            and o.spec[3] == node.groups
        ]
    return opts


def _check_tree(profile: WorkloadProfile, tree: Node, m: int) -> None:
    from loomrl.plan.graph import WorkGraph

    problems: list[str] = []
    if m < 1 or profile.batch % m:
        problems.append(f"micro-batch {m} does not divide batch {profile.batch}")
    comps = tree.components()
    want = sorted(profile.components)
    if sorted(comps) != want:
        problems.append(f"the tree covers components {sorted(comps)}, the profile has {want}")
    if tree.n > profile.devices:
        problems.append(f"the tree uses {tree.n} devices, the profile has {profile.devices}")
    graph = WorkGraph.from_profile(profile)
    cyc_members = {m_ for c in profile.cycles for m_ in c.members}

    def walk(node: Node) -> set[str]:
        if node.op == "leaf":
            if node.component in cyc_members:
                problems.append(
                    f"component {node.component!r} is in a declared cycle; use a cycle node"
                )
            if node.used is not None and node.used > node.n:
                problems.append(f"leaf {node.component!r} uses {node.used} > its {node.n} devices")
            return {node.component}  # type: ignore[arg-type]
        if node.op == "cycle":
            if node.component not in graph.index:
                problems.append(f"cycle {node.component!r} is not declared in the profile")
            if node.split is not None and sum(node.split) > node.n:
                problems.append(
                    f"cycle {node.component!r} split {node.split} exceeds its {node.n} devices"
                )
            return {node.component}  # type: ignore[arg-type]
        a, b = node.children
        if node.op == "spatial":
            if a.n + b.n > node.n:
                problems.append(
                    f"spatial node has {node.n} devices but children need {a.n} + {b.n}"
                )
            if a.n < 1 or b.n < 1:
                problems.append("each side of a spatial node needs at least 1 device")
        else:
            if a.n > node.n or b.n > node.n:
                problems.append(
                    f"temporal node has {node.n} devices but a child has {max(a.n, b.n)}"
                )
        sa, sb = walk(a), walk(b)
        ia = sum(1 << graph.index[x] for x in sa if x in graph.index)
        ib = sum(1 << graph.index[x] for x in sb if x in graph.index)
        for i in graph.members(ia):
            if graph.pred[i] & ib:
                src = [graph.nodes[j].name for j in graph.members(graph.pred[i] & ib)]
                problems.append(
                    f"{node.op} node runs {sorted(sa)} before {sorted(sb)} but edges go from {src} "
                    f"to {graph.nodes[i].name!r}; swap the children"
                )
        return sa | sb

    walk(tree)
    if problems:
        raise PlanError("invalid plan tree: " + "; ".join(problems))


def evaluate(tree: Node, profile: WorkloadProfile, m: int) -> Evaluation:
    """Predicted iteration time of ``tree`` at micro-batch ``m`` (root in phase context).

    Free choices (a leaf's ``used`` left None) are resolved optimally. A
    structurally wrong tree (missing component, backward cut) raises PlanError;
    a tree that does not fit memory, devices or cores returns ``feasible=False``
    with the reason.
    """
    _check_tree(profile, tree, m)
    cap, core_cap = profile.device_memory_gb, profile.cpu_core_budget
    M = profile.batch
    K = M // m
    reasons: list[str] = []

    def ok(mem: float, cores: float, what: str) -> bool:
        if mem > cap + EPS:
            reasons.append(f"{what} needs {mem:g} GB per device > device_memory_gb {cap:g}")
            return False
        if cores > core_cap + EPS:
            reasons.append(
                f"{what} needs {cores:g} CPU cores > cpu_cores_per_node*nodes = {core_cap:g}"
            )
            return False
        return True

    def single(node: Node, items: int) -> list[tuple]:
        opts = _fixed_options(profile, node, items)
        if not opts:
            reasons.append(
                f"{node.component!r} has no valid device count <= {node.n} matching the node"
            )
        return [
            (o.time, o.time, o.mem, o.cores, _spec_node(node, o.spec))
            for o in opts
            if ok(o.mem, o.cores, f"{node.component!r} on {o.used} device(s)")
        ]

    def stream(node: Node) -> list[tuple]:
        """Pareto set of (F, P, mem, cores, resolved node)."""
        if node.op in ("leaf", "cycle"):
            return pareto(single(node, m), 4)
        a, b = node.children
        sa, sb = stream(a), stream(b)
        out = []
        for fa, pa, ma, ca, na in sa:
            for fb, pb, mb, cb, nb in sb:
                if node.op == "spatial":
                    v = (fa + fb, max(pa, pb), max(ma, mb), ca + cb)
                else:
                    v = (fa + fb, pa + pb, ma + mb, max(ca, cb))
                if ok(v[2], v[3], f"{node.op} node over {node.components()}"):
                    out.append((*v, replace(node, children=(na, nb))))
        return pareto(out, 4)

    def phase(node: Node) -> tuple | None:
        """(T, mem, cores, resolved node) with the least T among feasible resolutions."""
        if node.op in ("leaf", "cycle"):
            cands = [(t, mem, c, nd) for t, _, mem, c, nd in single(node, M)]
        elif node.op == "spatial":
            cands = [(f + (K - 1) * p, mem, c, nd) for f, p, mem, c, nd in stream(node)]
        else:
            ra, rb = phase(node.children[0]), phase(node.children[1])
            if ra is None or rb is None:
                return None
            cands = [
                (
                    ra[0] + rb[0],
                    max(ra[1], rb[1]),
                    max(ra[2], rb[2]),
                    replace(node, children=(ra[3], rb[3])),
                )
            ]
        return min(cands, key=lambda c: c[0]) if cands else None

    res = phase(tree)
    if res is None:
        reason = reasons[-1] if reasons else "no feasible resolution"
        return Evaluation(math.inf, math.inf, False, reason)
    t, mem, cores, resolved = res
    if tree.op == "temporal":
        t += switch_total(profile)
    return Evaluation(t + profile.iteration_overhead_s, mem, True, "", cores, resolved)
