"""A 2-cycle node's split options searched as blocks of device counts, never listed one by one.

A cycle a <-> b split over n_a + n_b devices in k ring groups has one option per (n_a, n_b, k):
O(N^2 K) of them when both members allow every count, which took the planner minutes and
gigabytes at 1,024 devices to list and price. The search needs few of them: per device
budget the fastest (``CycleSpace.summary``: what bounds the other nodes), the leanest, the first
of the fastest overall, and the options that pass its bound test (``CycleSpace.passing``).

Why blocks work: a split option's time is a non-decreasing function of each side's call time
(``cycle_time``: sums, maxima and products by non-negative numbers, also in floating point,
where rounding is monotone), its memory the maximum, its cores the sum or the maximum of the
sides', its devices their sum. So over a block of options (a range of a's counts by a range of
b's, one k) the values built from each side's least call time, memory, cores and count are a
lower bound of every option in the block, field by field, and a test that is monotone in those
fields rules the whole block out at once. (A ring that ends on a is priced by playing it out,
O(steps k) a time; a block takes a closed-form floor of it instead, ``_ends_on_a_floor``.) Blocks halve until they are single options, whose
values are exact: the options found are exactly those the test passes, in the order
``cost.cycle_options`` lists them. Co-located options (one per common count) are few and are
listed as ``cycle_options`` lists them.

This module knows nothing of the dynamic programme: tests come in as functions.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from loomrl.plan.cost import KIND_S, KIND_T, RING_PLAYOUT, Option, cycle_time
from loomrl.plan.profile import ComponentProfile

__all__ = ["CycleSpace", "digest_options", "ring_times"]

# (time, devices, memory) lower bounds of blocks -> whether some option there may pass
BlockTest = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def ring_times(
    ta: np.ndarray, tb: np.ndarray, k: np.ndarray, steps: int, hop: float, last_b: bool
) -> np.ndarray:
    """``cycle_time`` of split options from the sides' call times (already slowed where k >= 2),
    for arrays, in the same floating-point operations (so the same floats)."""
    ta, tb, k = np.broadcast_arrays(
        np.asarray(ta, np.float64), np.asarray(tb, np.float64), np.asarray(k, np.int64)
    )
    if not last_b:
        out = np.empty(ta.shape)
        for kv in np.unique(k):
            sel = k == kv
            out[sel] = _ends_on_a(ta[sel], tb[sel], steps, int(kv), hop)
        return out
    big, small = np.maximum(ta, tb), np.minimum(ta, tb)
    if not hop:
        return np.where(k == 1, steps * (ta + tb), steps * k * big + small)
    period = np.maximum(k * big, ta + tb + hop)
    return (steps - 1) * period + (k - 1) * big + ta + tb + hop / 2


def _ends_on_a(ta: np.ndarray, tb: np.ndarray, steps: int, k: int, hop: float) -> np.ndarray:
    """``ring_span(ta, tb, steps, k, hop, last_b=False)`` for arrays: the play-out below
    ``RING_PLAYOUT`` calls, ``ring_ends``' closed form above, operation for operation."""
    if steps * k > RING_PLAYOUT:
        big = np.maximum(ta, tb)
        period = np.maximum(k * big, ta + tb + hop)
        b_first = hop / 2 + ta + tb + (k - 1) * big
        a_end = steps * k * ta
        if steps >= 2:
            a_end = np.maximum(a_end, (steps - 2) * period + b_first + hop / 2 + ta)
        return a_end
    half = hop / 2
    free_a = np.zeros(ta.shape)
    free_b = np.zeros(ta.shape)
    done_b = [np.zeros(ta.shape) for _ in range(k)]
    for s in range(steps):
        for g in range(k):
            free_a = np.maximum(free_a, done_b[g] + (half if s else 0.0)) + ta
            if s + 1 == steps:
                continue
            free_b = np.maximum(free_b, free_a + half) + tb
            done_b[g] = free_b
    return free_a


def _ends_on_a_floor(ta: np.ndarray, tb: np.ndarray, k: np.ndarray, steps: int, hop: float):
    """A lower bound of ``_ends_on_a``, monotone in ta and tb, in O(1) operations (the play-out
    takes O(steps k)): a's worker makes steps k calls in turn; one group's calls alternate, S
    of a and S - 1 of b with a hop between each; b's worker makes (S - 1) k calls in turn,
    after a's first and before a's last. Exact-arithmetic bounds of the played-out (or closed
    form) time, less 1e-9 of it for the rounding of up to 2 x 4,096 additions."""
    floor = np.maximum(steps * k * ta, steps * ta + (steps - 1) * (tb + hop))
    if steps >= 2:
        floor = np.maximum(floor, 2 * ta + hop + (steps - 1) * k * tb)
    return floor * (1 - 1e-9)


class _Side:
    """One member's counts (those allowed, <= n, in its valid order) with per-count call times
    per group count, memory and cores, and their minima over aligned blocks of 2^l counts."""

    def __init__(
        self,
        comp: ComponentProfile,
        allow: frozenset[int] | None,
        n: int,
        items: int,
        groups: list[int],
        slowdown: float,
        levels: int,
    ):
        pos = [
            j for j, v in enumerate(comp.valid_devices) if v <= n and (allow is None or v in allow)
        ]
        self.pos = np.array(pos, dtype=np.int64)
        self.count = np.array([comp.valid_devices[j] for j in pos], dtype=np.int64)
        self.mem = np.array([comp.memory_gb[int(v)] if v else 0.0 for v in self.count])
        self.cores = np.array([comp.cores(int(v)) for v in self.count], dtype=np.float64)
        per = np.array([comp.per_item[int(v)] for v in self.count], dtype=np.float64)
        self.time = np.empty((len(groups), len(pos)))
        for kk, k in enumerate(groups):
            x = items / k  # as ``cycle_time`` calls ``time``
            if comp.item_cv:
                row = np.array([comp.time(int(v), x) for v in self.count], dtype=np.float64)
            else:  # ``ComponentProfile.time``'s operations
                row = comp.alpha + x * per
            self.time[kk] = slowdown * row if k >= 2 else row
        self.levels = levels
        size = 1 << levels
        L = len(pos)
        pad = size - L

        def padded(x: np.ndarray, fill) -> np.ndarray:
            return np.concatenate([x, np.full(x.shape[:-1] + (pad,), fill, dtype=x.dtype)], axis=-1)

        t = padded(self.time, np.inf)
        big = np.int64(1) << 40
        c, m, r = padded(self.count, big), padded(self.mem, np.inf), padded(self.cores, np.inf)
        # per level l: the least of each field over counts [j 2^l, (j + 1) 2^l)
        self.t_min, self.t_arg, self.c_min, self.m_min, self.r_min, self.blocks = (
            [],
            [],
            [],
            [],
            [],
            [],
        )
        arg = np.broadcast_to(np.arange(size), t.shape)
        for lv in range(levels + 1):
            w = 1 << lv
            tt = t.reshape(len(groups), size // w, w)
            j = tt.argmin(axis=2)
            self.t_arg.append(np.take_along_axis(arg.reshape(tt.shape), j[..., None], 2)[..., 0])
            self.t_min.append(tt.min(axis=2))
            self.c_min.append(c.reshape(-1, w).min(axis=1))
            self.m_min.append(m.reshape(-1, w).min(axis=1))
            self.r_min.append(r.reshape(-1, w).min(axis=1))
            self.blocks.append(-(-L // w))

    def __len__(self) -> int:
        return len(self.pos)


_TABLE_OPTIONS = 1 << 15


class CycleSpace:
    """The options of the 2-cycle ``a <-> b`` on ``items`` items and at most ``n`` devices
    (``cost.cycle_options``), restricted to those that fit ``cap`` GB per device and
    ``core_cap`` cores, and with ``allow_a`` / ``allow_b`` to those counts of each member
    (co-located counts: ``allow_a``)."""

    def __init__(
        self,
        a: ComponentProfile,
        b: ComponentProfile,
        steps: int,
        items: int,
        groups: list[int],
        slowdown: float,
        hop: float,
        last_b: bool,
        n: int,
        cap: float,
        core_cap: float,
        allow_a: frozenset[int] | None = None,
        allow_b: frozenset[int] | None = None,
    ):
        self.steps, self.hop, self.last_b = steps, hop, last_b
        self.n, self.cap, self.core_cap = n, cap, core_cap
        self.groups = np.array(groups, dtype=np.int64)
        la = sum(1 for v in a.valid_devices if v <= n and (allow_a is None or v in allow_a))
        lb = sum(1 for v in b.valid_devices if v <= n and (allow_b is None or v in allow_b))
        self.levels = max(0, (max(la, lb, 1) - 1).bit_length())
        self.a = _Side(a, allow_a, n, items, groups, slowdown, self.levels)
        self.b = _Side(b, allow_b, n, items, groups, slowdown, self.levels)
        self._stride = len(b.valid_devices) * len(groups)
        # A ring that ends on a is played out call by call: on a small space, every option's
        # time once, looked up after
        self._times = None
        if not last_b and len(self.a) * len(self.b) * len(groups) <= _TABLE_OPTIONS:
            kk, ia, ib = np.indices((len(groups), len(self.a), len(self.b)))
            self._times = self._ring(ia, ib, kk)
        self.coloc = [
            o
            for o in _coloc(a, b, steps, n, items, hop, last_b, allow_a)
            if o.mem <= cap and o.cores <= core_cap and o.used <= n
        ]

    # ------------------------------------------------------------------ exact options

    def values(self, ia, ib, kk) -> tuple[np.ndarray, ...]:
        """(time, mem, cores, used) of options given by positions into each side and k."""
        A, B = self.a, self.b
        k = self.groups[kk]
        F = self._ring(ia, ib, kk) if self._times is None else self._times[kk, ia, ib]
        mem = np.maximum(A.mem[ia], B.mem[ib])
        ca, cb = A.cores[ia], B.cores[ib]
        cores = np.where(k == 1, np.maximum(ca, cb), ca + cb)
        return F, mem, cores, A.count[ia] + B.count[ib]

    def _ring(self, ia, ib, kk) -> np.ndarray:
        A, B, k = self.a, self.b, self.groups[kk]
        return ring_times(A.time[kk, ia], B.time[kk, ib], k, self.steps, self.hop, self.last_b)

    def key(self, ia, ib, kk) -> np.ndarray:
        """Each option's place in ``cycle_options``' list (among split options)."""
        return self.a.pos[ia] * self._stride + self.b.pos[ib] * len(self.groups) + kk

    def _fits(self, F, mem, cores, u) -> np.ndarray:
        return (u >= 1) & (u <= self.n) & (mem <= self.cap) & (cores <= self.core_cap)

    # ------------------------------------------------------------------ block search

    def _bounds(self, lv: int, kk, ja, jb) -> tuple[np.ndarray, ...]:
        """Per block, the (time, mem, cores, devices) lower bounds and whether they fit."""
        A, B = self.a, self.b
        k = self.groups[kk]
        ta, tb = A.t_min[lv][kk, ja], B.t_min[lv][kk, jb]
        if lv and not self.last_b:  # a bound is enough for a block; single options exact
            F = _ends_on_a_floor(ta, tb, k, self.steps, self.hop)
        elif not lv and self._times is not None:
            F = self._times[kk, ja, jb]
        else:
            F = ring_times(ta, tb, k, self.steps, self.hop, self.last_b)
        mem = np.maximum(A.m_min[lv][ja], B.m_min[lv][jb])
        ra, rb = A.r_min[lv][ja], B.r_min[lv][jb]
        cores = np.where(k == 1, np.maximum(ra, rb), ra + rb)
        u = A.c_min[lv][ja] + B.c_min[lv][jb]
        fit = (u <= self.n) & (mem <= self.cap) & (cores <= self.core_cap)
        return F, mem, cores, u, fit

    def _search(self, test: Callable, on_level: Callable | None = None):
        """Positions (ia, ib, kk) of every fitting option that ``test(F, u, mem)`` passes, in
        list order. ``test`` is applied to blocks' lower bounds, so it must be monotone
        (passing at some values, it passes at any lower ones). ``on_level(lv, kk, ja, jb)``
        sees each level's blocks before the test (to sample real options from them)."""
        A, B = self.a, self.b
        empty = np.zeros(0, dtype=np.int64)
        if not len(A) or not len(B):
            return empty, empty, empty
        kk = np.arange(len(self.groups), dtype=np.int64)
        ja = np.zeros(len(kk), dtype=np.int64)
        jb = np.zeros(len(kk), dtype=np.int64)
        for lv in range(self.levels, -1, -1):
            if on_level is not None:
                on_level(lv, kk, ja, jb)
            F, mem, _, u, fit = self._bounds(lv, kk, ja, jb)
            if lv == 0:
                fit &= u >= 1
            sel = np.flatnonzero(fit)
            if sel.size:
                sel = sel[test(F[sel], u[sel], mem[sel])]
            kk, ja, jb = kk[sel], ja[sel], jb[sel]
            if lv == 0 or not kk.size:
                break
            # the four halves of each block, those that hold any count
            kk = np.repeat(kk, 4)
            ja = np.repeat(2 * ja, 4) + np.tile([0, 0, 1, 1], len(ja))
            jb = np.repeat(2 * jb, 4) + np.tile([0, 1, 0, 1], len(jb))
            inside = (ja < A.blocks[lv - 1]) & (jb < B.blocks[lv - 1])
            kk, ja, jb = kk[inside], ja[inside], jb[inside]
        if not kk.size:
            return empty, empty, empty
        order = np.argsort(self.key(ja, jb, kk), kind="stable")
        return ja[order], jb[order], kk[order]

    def passing(self, test: BlockTest) -> tuple[np.ndarray, ...]:
        """The fitting split options ``test`` passes (monotone in time, devices, memory)."""
        return self._search(test)

    def staircase(self) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """Per device budget U = 0..n, the fastest fitting split option on at most U devices
        (inf if none), and options that attain each of those times (positions)."""
        n = self.n
        pool: list[tuple[np.ndarray, ...]] = []
        best = np.full(n + 1, np.inf)

        def add(ia, ib, kk) -> None:
            F, mem, cores, u = self.values(ia, ib, kk)
            ok = self._fits(F, mem, cores, u)
            if ok.any():
                pool.append((ia[ok], ib[ok], kk[ok]))
                np.minimum.at(best, u[ok], F[ok])
                np.minimum.accumulate(best, out=best)

        def sample(lv, kk, ja, jb) -> None:
            # each block's option of both sides' fastest counts: no option of the block is faster
            add(self.a.t_arg[lv][kk, ja], self.b.t_arg[lv][kk, jb], kk)

        # an option matters only if faster than every option found on as many devices or fewer
        ia, ib, kk = self._search(lambda F, u, mem: F < best[u], sample)
        add(ia, ib, kk)
        if not pool:
            e = np.zeros(0, dtype=np.int64)
            return best, (e, e, e)
        ia, ib, kk = (np.concatenate([p[x] for p in pool]) for x in range(3))
        F, _, _, u = self.values(ia, ib, kk)
        attain = F <= best[u]  # the fastest on its own budget (only records can be below)
        ia, ib, kk, F, u = ia[attain], ib[attain], kk[attain], F[attain], u[attain]
        before = np.r_[np.inf, best[:-1]]
        rec = F < before[u]
        # one option per record budget
        _, first = np.unique(u[rec], return_index=True)
        idx = np.flatnonzero(rec)[first]
        return best, (ia[idx], ib[idx], kk[idx])

    def first_fastest(self, fastest: float) -> tuple[np.ndarray, ...]:
        """The first split option in list order whose time is ``fastest`` (the least)."""
        ia, ib, kk = self._search(lambda F, u, mem: F <= fastest)
        if ia.size:
            F = self.values(ia, ib, kk)[0]
            j = np.flatnonzero(F == fastest)[:1]
            return ia[j], ib[j], kk[j]
        return ia, ib, kk

    def leanest(self) -> tuple[np.ndarray, ...]:
        """A fitting split option of the least memory (k = 1: every split allows it, and its
        cores are the max of the sides', the fewest)."""
        A, B = self.a, self.b
        e = np.zeros(0, dtype=np.int64)
        ok_a = np.flatnonzero((A.mem <= self.cap) & (A.cores <= self.core_cap))
        ok_b = np.flatnonzero((B.mem <= self.cap) & (B.cores <= self.core_cap))
        if not ok_a.size or not ok_b.size:
            return e, e, e
        # per a-count, the leanest b-count that fits beside it: prefix minima over b's counts
        ob = ok_b[np.argsort(B.count[ok_b], kind="stable")]
        cb, mb = B.count[ob], B.mem[ob]
        run = np.minimum.accumulate(mb)
        rec = mb < np.r_[np.inf, run[:-1]]
        arg = np.maximum.accumulate(np.where(rec, np.arange(len(mb)), 0))
        hi = np.searchsorted(cb, self.n - A.count[ok_a], side="right")
        side_b = np.where(hi > 0, run[np.maximum(hi - 1, 0)], np.inf)
        pick = arg[np.maximum(hi - 1, 0)]
        zero = np.flatnonzero(A.count[ok_a] == 0)
        if zero.size:  # a-count 0 needs a b-count >= 1
            z = zero[0]
            lo = int(np.searchsorted(cb, 1, side="left"))
            if hi[z] > lo:
                j = lo + int(mb[lo : hi[z]].argmin())
                side_b[z], pick[z] = mb[j], j
            else:
                side_b[z] = np.inf
        mem = np.maximum(A.mem[ok_a], side_b)
        if not np.isfinite(mem).any():
            return e, e, e
        j = int(mem.argmin())
        return (np.array([ok_a[j]]), np.array([ob[pick[j]]]), np.zeros(1, dtype=np.int64))

    def summary(self, with_first: bool = True) -> tuple[np.ndarray, ...]:
        """Split options that give every aggregate the search takes over all of them: the
        fastest per device budget, the leanest, and the first of the fastest (list order)."""
        best, rec = self.staircase()
        parts = [rec, self.leanest()]
        if with_first and np.isfinite(best[-1]):
            parts.append(self.first_fastest(float(best[-1])))
        ia, ib, kk = (np.concatenate([p[x] for p in parts]) for x in range(3))
        key = self.key(ia, ib, kk)
        _, idx = np.unique(key, return_index=True)  # sorted by key: list order
        return ia[idx], ib[idx], kk[idx]

    def count(self) -> int:
        """How many options fit (co-located and split)."""
        A, B = self.a, self.b
        ok_a = np.flatnonzero((A.mem <= self.cap) & (A.cores <= self.core_cap))
        ok_b = np.flatnonzero((B.mem <= self.cap) & (B.cores <= self.core_cap))
        total = len(self.coloc)
        if not ok_a.size or not ok_b.size:
            return total
        cb = np.sort(B.count[ok_b])
        per_a = np.searchsorted(cb, self.n - A.count[ok_a], side="right")
        per_a -= (A.count[ok_a] == 0) & (cb[0] == 0)  # 0 + 0 uses no device: no option
        ones = int(per_a.sum())
        wide = int((self.groups >= 2).sum())
        if not wide:
            return total + ones
        if not (A.cores.any() or B.cores.any()) or not np.isfinite(self.core_cap):
            return total + ones * (1 + wide)
        # k >= 2 adds the sides' cores: count the pairs whose sum fits too
        sums = 0
        for lo in range(0, ok_a.size, 256):
            ia = ok_a[lo : lo + 256]
            pair = (A.count[ia][:, None] + B.count[ok_b][None, :] <= self.n) & (
                A.count[ia][:, None] + B.count[ok_b][None, :] >= 1
            )
            pair &= A.cores[ia][:, None] + B.cores[ok_b][None, :] <= self.core_cap
            sums += int(pair.sum())
        return total + ones + sums * wide

    def coords(self) -> list[list[int]]:
        """The device counts fitting options name: [a's (and co-located), b's], ascending."""
        A, B = self.a, self.b
        ok_a = (A.mem <= self.cap) & (A.cores <= self.core_cap)
        ok_b = (B.mem <= self.cap) & (B.cores <= self.core_cap)
        ca, cb = np.sort(A.count[ok_a]), np.sort(B.count[ok_b])
        out = [{o.used for o in self.coloc}, set()]
        if ca.size and cb.size:
            for p, (x, y) in enumerate(((ca, cb), (cb, ca))):
                # x pairs with some y <= n - x; x = 0 only with some y >= 1
                hi = np.searchsorted(y, self.n - x, side="right")
                lo = np.where(x == 0, np.searchsorted(y, 1, side="left"), 0)
                out[p] |= {int(v) for v in x[hi > lo]}
        return [sorted(out[0]), sorted(out[1])]

    def option(self, ia: int, ib: int, kk: int) -> Option:
        """The ``Option`` ``cycle_options`` makes for this split."""
        F, mem, cores, u = self.values(np.array([ia]), np.array([ib]), np.array([kk]))
        na, nb, k = int(self.a.count[ia]), int(self.b.count[ib]), int(self.groups[kk])
        return Option(
            float(F[0]), float(mem[0]), int(cores[0]), int(u[0]), KIND_S, ("split", na, nb, k)
        )


def _coloc(a, b, steps, n, items, hop, last_b, allow) -> list[Option]:
    """``cycle_options``' co-located options, in its order."""
    out = []
    for v in a.valid_devices:
        if 1 <= v <= n and v in b.memory_gb and (allow is None or v in allow):
            spec = ("coloc", v)
            out.append(
                Option(
                    cycle_time(a, b, steps, items, spec, hop=hop, last_b=last_b),
                    a.memory_gb[v] + b.memory_gb[v],
                    max(a.cores(v), b.cores(v)),
                    v,
                    KIND_T,
                    spec,
                )
            )
    return out


def digest_options(
    a: ComponentProfile,
    b: ComponentProfile,
    steps: int,
    n: int,
    items: int,
    slowdown: float,
    hop: float,
    last_b: bool,
    cap: float,
) -> list[Option]:
    """Some of ``cycle_options``' options (every co-located one, splits in one ring group), in
    its order, that agree with all of them on what a message about a plan that does not fit
    takes (``search._diagnose``): whether there are any, the device counts they use, the least
    memory, and among those within ``cap`` GB the fewest cores and the fewest devices a split
    uses. O(N) rows of numpy work in place of O(N^2 K) options."""
    out = _coloc(a, b, steps, n, items, hop, last_b, None)
    ca = np.array([v for v in a.valid_devices if v <= n], dtype=np.int64)
    cb = np.array([v for v in b.valid_devices if v <= n], dtype=np.int64)
    if not ca.size or not cb.size:
        return out
    ma = np.array([a.memory_gb[int(v)] if v else 0.0 for v in ca])
    mb = np.array([b.memory_gb[int(v)] if v else 0.0 for v in cb])
    ra = np.array([a.cores(int(v)) for v in ca], dtype=np.float64)
    rb = np.array([b.cores(int(v)) for v in cb], dtype=np.float64)
    ob = np.argsort(cb, kind="stable")
    sb, fit_b = cb[ob], mb[ob] <= cap
    picks: set[tuple[int, int]] = set()
    seen = np.zeros(n + 1, dtype=bool)  # device counts some split already stands for
    lean = (np.inf, None)
    few_cores = (np.inf, None)
    few_devices = (np.inf, None)
    for i in range(len(ca)):
        x = int(ca[i])
        hi = int(np.searchsorted(sb, n - x, side="right"))
        lo = int(np.searchsorted(sb, 1, side="left")) if x == 0 else 0
        if hi <= lo:
            continue
        js = ob[lo:hi]
        # one split per device count
        u = x + cb[js]
        new = ~seen[u]
        seen[u] = True
        picks.update((i, int(j)) for j in js[new])
        mem = np.maximum(ma[i], mb[js])
        j = int(mem.argmin())
        if mem[j] < lean[0]:
            lean = (float(mem[j]), (i, int(js[j])))
        if ma[i] <= cap:
            ok = np.flatnonzero(fit_b[lo:hi])
            if ok.size:
                cores = np.maximum(ra[i], rb[js[ok]])  # one group: the busier side's cores
                j = int(cores.argmin())
                if cores[j] < few_cores[0]:
                    few_cores = (float(cores[j]), (i, int(js[ok[j]])))
                j = int(ok[0])  # b's fewest devices that fit
                if x + cb[js[j]] < few_devices[0]:
                    few_devices = (x + int(cb[js[j]]), (i, int(js[j])))
    for best in (lean, few_cores, few_devices):
        if best[1] is not None:
            picks.add(best[1])
    pos_b = {int(v): j for j, v in enumerate(b.valid_devices)}
    pos_a = {int(v): j for j, v in enumerate(a.valid_devices)}
    for i, j in sorted(picks, key=lambda p: (pos_a[int(ca[p[0]])], pos_b[int(cb[p[1]])])):
        na, nb = int(ca[i]), int(cb[j])
        spec = ("split", na, nb, 1)
        out.append(
            Option(
                cycle_time(a, b, steps, items, spec, slowdown, hop, last_b),
                max(a.memory_gb[na] if na else 0.0, b.memory_gb[nb] if nb else 0.0),
                max(a.cores(na), b.cores(nb)),
                na + nb,
                KIND_S,
                spec,
            )
        )
    return out
