"""Plan search: an exact dynamic programme over (sub-graph, context), and a brute-force reference.

Stream-context results combine by sums and maxima, so a sub-graph keeps the
Pareto set of points (F, P, memory, cores, devices used u, kind) rather than
one minimum. Because a plan on n devices can always run on n + 1 (the extra
device idles), "the best plans on n devices" are the points with u <= n: one
point set per sub-graph serves every n, and a spatial split is the sum of the
children's u. Phase context only ever appears along the temporal spine from the
root, where the device count is N; there each sub-graph keeps one minimum T per
kind (memory there combines by max, so feasibility is all that matters).

``kind`` is a 2-bit mask (1: uses temporal placement, 2: uses spatial
placement) so one pass yields the best all-temporal, all-spatial and hybrid
plans together.

Branch and bound, exact: a quick scout finds real plans of each mode (on large graphs
with a few points per state; on nodes with many valid device counts on a few spread-out
counts, then zooming in on those its plans use). Their times bound the exact pass, which
drops every stream point whose lower bound (``_DP._lower_bound``: its own F + (K-1) P plus
the least the nodes outside it can add) exceeds them, and makes only the pairs of points
that can pass that test (``_DP._pairs``), a chunk at a time, so that memory follows the
chunk and not the pairs. With every count of 1..4,096 valid the points
and pairs would otherwise grow with the square of the count. Points that could only end in
a hybrid plan are held to that plan's needs (``_DP._hybrid``): two other nodes sharing
devices that fit one device's memory together, or, in a phase part, a plan of that part's
sub-graph as fast as the scout's.

A 2-cycle node has O(N^2 K) split options when its members allow many counts: they are never
listed, but searched as blocks of counts (``loomrl.plan._cycles``) for those the search takes,
the same options and floats in the same order as the full list would give. Never imports torch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from loomrl.errors import PlanError
from loomrl.plan._cycles import CycleSpace, digest_options
from loomrl.plan.cost import (
    EPS,
    KIND_S,
    KIND_T,
    Option,
    evaluate,
    node_options,
    switch_total,
)
from loomrl.plan.graph import WorkGraph, check_search_size
from loomrl.plan.plan import Node, Plan, layout, mode_of
from loomrl.plan.profile import ComponentProfile, WorkloadProfile

__all__ = [
    "MODES",
    "ExhaustiveTooLong",
    "exhaustive",
    "exhaustive_all",
    "exhaustive_times",
    "fixed_plan",
    "plan_for_mode",
    "search",
    "search_all",
]

MODES = ("temporal", "spatial", "hybrid")
Progress = Callable[[int, int], None]  # (passes done, passes in all)
# The kinds of root result each mode takes. Kind 0 (neither placement) is a lone component's
# leaf: ``mode_of`` calls it temporal, and it runs nothing side by side, so no spatial plan.
_MODE_KINDS = {"best": (0, 1, 2, 3), "temporal": (0, 1), "spatial": (2,), "hybrid": (3,)}


# ----------------------------------------------------------------------- point sets


@dataclass
class _Points:
    """A Pareto set of stream-context results of one sub-graph (struct of arrays)."""

    F: np.ndarray
    P: np.ndarray
    mem: np.ndarray
    cores: np.ndarray
    u: np.ndarray
    kind: np.ndarray
    op: np.ndarray  # 0 leaf option, 1 spatial, 2 temporal
    cut: np.ndarray  # upstream mask of the cut (internal nodes)
    ia: np.ndarray  # leaf: option index; internal: index into A's merged set
    ib: np.ndarray

    def __len__(self) -> int:
        return len(self.F)

    def take(self, idx: np.ndarray) -> _Points:
        return _Points(*(getattr(self, f)[idx] for f in _FIELDS))

    @staticmethod
    def concat(parts: list[_Points]) -> _Points:
        parts = [p for p in parts if len(p)]
        if not parts:
            return _empty()
        return _Points(*(np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS))


_FIELDS = ("F", "P", "mem", "cores", "u", "kind", "op", "cut", "ia", "ib")


def _empty() -> _Points:
    f = np.zeros(0)
    i = np.zeros(0, dtype=np.int64)
    return _Points(f, f, f, f, i, i, i, i, i, i)


def _pareto_idx(pts: _Points, lex: bool = False) -> np.ndarray:
    """Indices of points not dominated within their kind (<= in F, P, mem, cores, u): in index
    order up to ``_BLOCK`` points, else in order of kind, then the rows (F first), index last.
    ``lex``: in that second order however few, for a set cut down from more than ``_BLOCK``
    (``_chunk_front``), so that the order is that of the whole set."""
    k = len(pts)
    if k <= 1:
        return np.arange(k)
    # A leaf's P is its F: a row equal to an earlier one changes neither the order nor any
    # comparison, so it is left out.
    leafy = pts.P is pts.F or np.array_equal(pts.P, pts.F)
    rows = [pts.F] if leafy else [pts.F, pts.P]
    rows.append(pts.mem)
    if pts.cores.any():
        rows.append(pts.cores)
    rows.append(pts.u.astype(np.float64))
    if k <= _BLOCK and not lex:
        return _pareto_matrix(rows, pts.kind)
    # A pairing's points by tables of ranks. Not a leaf's options: most of those are on the
    # front, which ``_certain`` below finds with no pairwise test.
    if k > _EXACT_ABOVE and not leafy:
        front = _front_by_ranks(rows, pts.kind)
        if front is not None:
            return front
    # Lexicographic order: a point can only be dominated by points before it, so
    # the front grows block by block and never loses a member.
    order = np.lexsort(tuple(reversed(rows)) + (pts.kind,))
    X = np.stack(rows)[:, order]
    kd = pts.kind[order]
    if k > _TABLE_ABOVE and len(rows) == 4:  # F, P and memory (or memory and cores), u
        # Points an earlier one surely dominates leave first: the pairwise test below costs
        # k times the front, and of the 10^5 points a dense graph's pairings pass, most go.
        # They are dominated, so the front, and its order, are the same without them.
        left = np.flatnonzero(~_dominated_early(X, kd))
        order, X, kd, k = order[left], X[:, left], kd[left], left.size
    cert = _certain(X, kd)
    front = np.zeros(0, dtype=np.int64)
    lo, size = 0, _BLOCK
    while lo < k:
        hi = min(lo + size, k)
        blk = np.arange(lo, hi)
        sure_b = cert[lo:hi]
        test = blk[~sure_b]
        if front.size and test.size:
            dom = kd[front][:, None] == kd[test][None, :]
            for r in range(X.shape[0]):
                dom &= X[r, front][:, None] <= X[r, test][None, :]
            test = test[~dom.any(axis=0)]
        left = int(np.count_nonzero(sure_b)) + test.size
        # the block's survivors so far (sure, or tested and left), in order
        alive = sure_b.copy()
        alive[test - lo] = True
        if test.size:  # nor by an earlier point of the block that the front left
            cand = blk[alive]
            dom = (kd[cand][:, None] == kd[test][None, :]) & (cand[:, None] < test[None, :])
            for r in range(X.shape[0]):
                dom &= X[r, cand][:, None] <= X[r, test][None, :]
            alive[test[dom.any(axis=0)] - lo] = False
        kept = blk[alive]
        lo = hi
        # Large inputs often have small fronts: once few of a block survive the front,
        # take bigger blocks (fewer passes); when many do, smaller ones (cheaper all-pairs).
        size = min(size * 2, _BLOCK_MAX) if left * 8 <= size else max(size // 2, _BLOCK)
        front = np.concatenate([front, kept])
    return order[front]


def _front_by_u(pts: _Points, N: int) -> np.ndarray | None:
    """``_pareto_idx(pts)`` for a large set of leaf points (P = F, u <= N); None for any other
    set, or one too costly for this way.

    In ``_pareto_idx``'s order a point is dominated exactly when an earlier point of its kind
    has no more memory and no more cores on no more devices (being earlier, it is no slower).
    So a table of the least memory of the points kept so far, per device budget and cores
    budget, answers for each point at once; only the points that pass it are compared
    pairwise, within their chunk. O(k log k + (k / c) N C) for C distinct core counts, where
    ``_pareto_idx`` compares each point with the front: seconds for the 10^5 options a dense
    cycle can pass its bounds with."""
    k = len(pts)
    if k <= _BLOCK or not np.array_equal(pts.P, pts.F):
        return None
    levels = np.unique(pts.cores)
    cells = (N + 1) * len(levels)
    if cells * -(-k // _FRONT_CHUNK) > _FRONT_WORK:
        return None
    order = np.lexsort((pts.u, pts.cores, pts.mem, pts.F, pts.kind))  # ``_pareto_idx``'s order
    kd, mem, u = pts.kind[order], pts.mem[order], pts.u[order]
    cores = pts.cores[order]
    rank = np.searchsorted(levels, cores)
    cuts = [0, *(np.flatnonzero(kd[1:] != kd[:-1]) + 1), k]
    kept: list[np.ndarray] = []
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
        # the least memory of a kept point on <= u devices with <= cores (by rank)
        least = np.full((N + 1, len(levels)), np.inf)
        c0, size = lo, _FRONT_CHUNK
        while c0 < hi:
            pos = np.arange(c0, min(c0 + size, hi))
            c0 += size
            pos = pos[least[u[pos], rank[pos]] > mem[pos]]
            # few pass once the table fills: then larger chunks, fewer table updates
            size = min(size * 2, _FRONT_CHUNK * 8) if pos.size * 8 <= size else _FRONT_CHUNK
            if pos.size > 1:  # nor by an earlier point of the chunk that passed too
                m, uu, c = mem[pos], u[pos], cores[pos]
                dom = (m[None, :] <= m[:, None]) & (uu[None, :] <= uu[:, None])
                dom &= c[None, :] <= c[:, None]
                dom &= np.tri(pos.size, k=-1, dtype=bool)  # [i, j]: j before i
                pos = pos[~dom.any(axis=1)]
            if pos.size:
                np.minimum.at(least, (u[pos], rank[pos]), mem[pos])
                # only cells at or past the least budgets just added can change
                part = least[u[pos].min() :, rank[pos].min() :]
                np.minimum.accumulate(part, axis=0, out=part)
                np.minimum.accumulate(part, axis=1, out=part)
                kept.append(pos)
    return order[np.concatenate(kept)] if kept else order[:0]


_FRONT_CHUNK = 1024
_FRONT_WORK = 1 << 28  # table cells updated in all, past which _pareto_idx is cheaper


def _front_by_ranks(rows: list[np.ndarray], kind: np.ndarray) -> np.ndarray | None:
    """``_pareto_idx(pts)`` for its ``rows`` (F first, u last) and kinds, in its order; None
    where the tables below would be too large for this way to pay.

    In ``_pareto_idx``'s order (kind, then the rows) a point is dominated exactly when an
    earlier point of its kind is <= in every row after F (being earlier, it is no slower). A
    pairing's points take few distinct values in those rows (P and memory are maxima or sums
    of a few leaves' values, u a device count), so tables indexed by their ranks answer
    exactly, in two steps:
    - a cube over all of them holding, per cell, the least F of the points in cells with no
      more of each: a point slower than that is dominated by a faster point, and leaves
      (with no sort; most points of a large pairing go here);
    - a sweep of the rest in order, a chunk at a time, over a table indexed by the ranks of
      all those rows but one, holding the least of that one over the points kept so far with
      no more of each of the others; only the points that pass are compared pairwise, within
      their chunk.
    A point the first step drops is dominated by a front point, which stays: the front and its
    order are the same. O(k log d + C + (s / c) T) for d distinct values a row, C cells of the
    cube, s points left, T cells of the table and chunks of c, where the blocked test costs k
    times the front (at 512 devices, fronts of 10^4 points out of 10^6)."""
    k = len(kind)
    rest = rows[1:]
    # ranks by the distinct values: found by hashing (no sort of all k), then looked up; u's
    # (the last row, device counts) by a table
    distinct = [np.sort(_distinct(r)) for r in rest[:-1]]
    u = rest[-1].astype(np.int64)
    seen = np.zeros(int(u.max()) + 1 if k else 1, dtype=bool)
    seen[u] = True
    distinct.append(np.flatnonzero(seen).astype(np.float64))
    sizes = [len(d) for d in distinct]
    # the sweep's table: its value is the row of most distinct values, its axes the others
    v = int(np.argmax(sizes))
    ax = [j for j in range(len(rest)) if j != v]
    shape = tuple(sizes[j] for j in ax)
    cells = math.prod(shape)
    if cells > min(_EXACT_CELLS, _EXACT_PER_POINT * k) or (
        cells * -(-k // (_EXACT_CHUNK * 8)) > _EXACT_WORK
    ):
        return None
    ranks = [np.searchsorted(d, r) for d, r in zip(distinct[:-1], rest[:-1], strict=True)]
    rank_of_u = np.cumsum(seen) - 1
    ranks.append(rank_of_u[u])
    F = rows[0]
    sub = np.arange(k)
    # the cube pays where it has no more cells than a few per point
    if math.prod(sizes) <= min(_CUBE_CELLS, _CUBE_PER_POINT * k):
        key = _flat_key(ranks, sizes)
        keep = np.ones(k, dtype=bool)
        for kk in np.flatnonzero(np.bincount(kind)):  # kinds are 0..3
            sel = np.flatnonzero(kind == kk) if kind.min() != kind.max() else sub
            cone = np.full(math.prod(sizes), np.inf)
            np.minimum.at(cone, key[sel], F[sel])
            cube = cone.reshape(sizes)
            for d in range(cube.ndim):
                np.minimum.accumulate(cube, axis=d, out=cube)
            keep[sel] = F[sel] <= cone[key[sel]]
        sub = np.flatnonzero(keep)
        kind, F = kind[sub], F[sub]
        rest = [r[sub] for r in rest]
        ranks = [r[sub] for r in ranks]
    # The rows after F as one key, each rank keeping its row's order and ties: ``np.lexsort``
    # on kind, F and that key is its order on kind and the rows.
    keys = (_flat_key(ranks, sizes),) if math.prod(sizes) < 1 << 62 else tuple(reversed(ranks))
    keys += (F,) if kind.min() == kind.max() else (F, kind)
    order = np.lexsort(keys)
    # equal points (a node's plans often come out alike from two cuts) are adjacent now: the
    # first of each is the one that stays
    same = np.ones(len(order), dtype=bool)
    same[0:1] = False
    for x in keys:
        xo = x[order]
        same[1:] &= xo[1:] == xo[:-1]
    order = order[~same]
    kd = kind[order]
    value = rest[v][order]
    axes = [ranks[j][order] for j in ax]
    X = np.stack([r[order] for r in rest])
    cuts = [0, *(np.flatnonzero(kd[1:] != kd[:-1]) + 1), len(kd)]
    kept: list[np.ndarray] = []
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
        # least[ranks]: the least value of a kept point of this kind with no more in each axis
        least = np.full(shape, np.inf)
        c0, size = lo, _EXACT_CHUNK
        while c0 < hi:
            pos = np.arange(c0, min(c0 + size, hi))
            c0 += size
            pos = pos[least[tuple(a[pos] for a in axes)] > value[pos]]
            # Few pass once the table fills: then larger chunks, fewer table updates. Where most
            # pass (as after the cube), smaller ones: the pairwise test costs the chunk squared.
            if pos.size * 8 <= size:
                size = min(size * 2, _EXACT_CHUNK * 8)
            elif pos.size * 2 > size:
                size = max(size // 2, _EXACT_CHUNK // 8, 1)
            if pos.size > 1:  # nor by an earlier point of the chunk
                pos = pos[_first_of_chunk(X[:, pos])]
            if pos.size:
                idx = tuple(a[pos] for a in axes)
                np.minimum.at(least, idx, value[pos])
                # only cells at or past the least ranks just added can change
                part = least[tuple(slice(int(i.min()), None) for i in idx)]
                for d in range(part.ndim):
                    np.minimum.accumulate(part, axis=d, out=part)
                kept.append(pos)
    return sub[order[np.concatenate(kept)]] if kept else sub[:0]


def _flat_key(ranks: list[np.ndarray], sizes: list[int]) -> np.ndarray:
    """The ranks as one int64, lexicographically (the product of ``sizes`` must fit)."""
    key = ranks[0].astype(np.int64)
    for r, n in zip(ranks[1:], sizes[1:], strict=True):
        key = key * n + r
    return key


def _distinct(x: np.ndarray) -> np.ndarray:
    """The distinct values of x, in no order: by hashing where numpy can (2.3 on), which costs
    O(k) where a sort costs O(k log k)."""
    try:
        return np.unique(x, sorted=False)
    except TypeError:  # numpy before 2.3
        return np.unique(x)


def _first_of_chunk(rows: np.ndarray) -> np.ndarray:
    """Per column of ``rows`` [d][c]: whether no earlier column is <= it in every row. In
    blocks of ``_EXACT_CHUNK`` columns against those before, so memory stays c times that."""
    c = rows.shape[1]
    ok = np.ones(c, dtype=bool)
    for b0 in range(0, c, _EXACT_CHUNK):
        b1 = min(b0 + _EXACT_CHUNK, c)
        # [i, j]: column j (of the first b1) is before column i (of this block)
        dom = np.arange(b1)[None, :] < np.arange(b0, b1)[:, None]
        for r in rows:
            dom &= r[None, :b1] <= r[b0:b1, None]
        ok[b0:b1] = ~dom.any(axis=1)
    return ok


_EXACT_ABOVE = 512
_EXACT_CHUNK = 512
_EXACT_CELLS = 1 << 22  # 32 MB of table
_EXACT_PER_POINT = 64  # table cells a point, past which filling the table costs more
_CUBE_CELLS = 1 << 23  # 64 MB of cube
_CUBE_PER_POINT = 4
_CHUNK_FRONT_ABOVE = 4096  # passing pairs of a chunk, past which only its front is kept
_EXACT_WORK = 1 << 30  # table cells updated in all (at most), past which the blocked test


def _dominated_early(X: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """Per point of a lexicographically ordered set (rows X: F, two more, u last; kind first):
    whether some point of its kind in an earlier chunk of ``_TABLE_CHUNK`` is below it in
    every row, found by tables. Such a point is earlier, so no slower (F), and dominates it.
    True only for dominated points; a dominated point may be missed.

    Two tables per kind, indexed by u and by the bucket of one of the middle rows (P and
    memory, say; of ``_TABLE_BUCKETS``, split at its quantiles): the least of the other over
    the points seen so far on at most u devices and in a lower bucket, so with strictly less of
    the first.
    O(k + (k / c) N B) for N the largest u, B buckets and chunks of c, where a pairwise test
    costs k times the front."""
    k = X.shape[1]
    out = np.zeros(k, dtype=bool)
    u = X[3].astype(np.int64)
    cuts = [0, *(np.flatnonzero(kind[1:] != kind[:-1]) + 1), k]
    for by, value in ((X[1], X[2]), (X[2], X[1])):  # P's buckets, least memory, and back
        edges = np.unique(np.quantile(by, np.linspace(0, 1, _TABLE_BUCKETS + 1)[:-1]))
        b = np.searchsorted(edges, by, side="right")  # 1..: bucket b - 1 holds edges[b - 1]
        for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
            # least[v, c]: the least value of the points seen on <= v devices, bucket < c
            least = np.full((int(u[lo:hi].max()) + 1, len(edges) + 1), np.inf)
            for c0 in range(lo, hi, _TABLE_CHUNK):
                sl = slice(c0, min(c0 + _TABLE_CHUNK, hi))
                out[sl] |= least[u[sl], b[sl] - 1] <= value[sl]
                np.minimum.at(least, (u[sl], b[sl]), value[sl])
                part = least[u[sl].min() :, b[sl].min() :]  # only these cells can change
                np.minimum.accumulate(part, axis=0, out=part)
                np.minimum.accumulate(part, axis=1, out=part)
    return out


_TABLE_ABOVE = 4096
_TABLE_BUCKETS = 256
_TABLE_CHUNK = 512


def _certain(X: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """Per point of a lexicographically ordered set (rows X [d][k], kind first): whether no
    earlier point can dominate it, being below every earlier point of its kind in some row
    after the first. Only earlier points can dominate (the order), so those are on the front:
    a leaf's counts, faster and leaner on more devices, all are, and need no pairwise test."""
    out = np.zeros(len(kind), dtype=bool)
    cuts = [0, *(np.flatnonzero(kind[1:] != kind[:-1]) + 1), len(kind)]
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
        x = X[1:, lo:hi]
        before = np.empty_like(x)
        before[:, 0] = np.inf
        np.minimum.accumulate(x[:, :-1], axis=1, out=before[:, 1:])
        out[lo:hi] = (x < before).any(axis=0)
    # The same test in other pairs of rows. A leaf's memory falls as its count grows, so no
    # count is below another in both; with irregular times the order by time leaves most of
    # them untested above, and the pairwise test would cost O(k^2).
    # Only for many untested points: on fewer the extra sorts cost more than the test.
    rows = [r for r in range(1, X.shape[0]) if not np.array_equal(X[r], X[0])]
    for x, r in enumerate(rows):
        for c in rows[x + 1 :]:
            if len(out) - np.count_nonzero(out) < _PAIRS_ABOVE:
                return out
            out |= _alone_in(X[r], X[c], kind)
    return out


def _alone_in(a: np.ndarray, b: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """Per point: whether no other point of its kind is <= it in both a and b. Such a point
    is dominated by none, whatever its other rows."""
    order = np.lexsort((b, a, kind))
    ka, aa, bb = kind[order], a[order], b[order]
    cuts = [0, *(np.flatnonzero(ka[1:] != ka[:-1]) + 1), len(ka)]
    # the least b of the earlier points of the same kind (they are <= in a)
    before = np.full(len(ka), np.inf)
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
        np.minimum.accumulate(bb[lo : hi - 1], out=before[lo + 1 : hi])
    # a later point equal in both rows is <= too
    twin = np.zeros(len(ka), dtype=bool)
    twin[:-1] = (ka[1:] == ka[:-1]) & (aa[1:] == aa[:-1]) & (bb[1:] == bb[:-1])
    alone = np.zeros(len(ka), dtype=bool)
    alone[order] = (bb < before) & ~twin
    return alone


_BLOCK = 128
_PAIRS_ABOVE = 512
_BLOCK_MAX = 8192


def _pareto_matrix(rows: list[np.ndarray], kind: np.ndarray) -> np.ndarray:
    """All-pairs dominance test, O(k^2 d) in a few vector operations. Shapes: rows [d][k]."""
    k = len(kind)
    a, b = rows[0][None, :], rows[0][:, None]
    le = a <= b
    lt = a < b
    if kind.min() != kind.max():
        le &= kind[None, :] == kind[:, None]  # [i, j]: j is comparable with i
    for r in rows[1:]:
        a, b = r[None, :], r[:, None]
        le &= a <= b
        lt |= a < b
    # j dominates i when j <= i everywhere and (j < i somewhere, or j is an earlier duplicate)
    idx = np.arange(k)
    dom = le & (lt | (idx[None, :] < idx[:, None]))
    return np.nonzero(~dom.any(axis=1))[0]


def _prune(pts: _Points, lex: bool = False) -> _Points:
    return pts.take(_pareto_idx(pts, lex))


class _DP:
    """The dynamic programme for one profile and device count, all micro-batch sizes."""

    def __init__(self, profile: WorkloadProfile, devices: int):
        self.profile = profile
        self.N = devices
        self.graph = WorkGraph.from_profile(profile)
        self.cap = profile.device_memory_gb + EPS
        self.core_cap = profile.cpu_core_budget + EPS
        self.order = self.graph.reachable_subgraphs()
        self.truncate: int | None = None
        # Scout passes: per node, the device counts its options may use (None: all of them).
        self.grid: dict[int, list[frozenset[int]]] | None = None
        self._on_grid: dict[tuple[int, int], _OptSet] = {}
        self.switch = switch_total(profile)
        self._fitting: dict[tuple[int, int], _OptSet] = {}
        self._arrays: dict[str, tuple] = {}
        # Per m, per sub-graph (not the whole graph): the fastest plan with spatial placement
        # that a run found, in phase context on N devices (``_apart_ok``).
        self._phase_seen: dict[int, dict[int, float]] = {}
        # ``_hybrid``'s cases prune little on small graphs, where the test costs more than it
        # saves
        self._refine = len(self.graph) > _REFINE_ABOVE
        self._coord_cache: dict[int, list[list[int]]] = {}
        # A cycle's options per (node, items, on the scout's grid), searched as blocks of
        # counts (``CycleSpace``): listing every split took minutes at 1,024 devices.
        self._spaces: dict[tuple[int, int, bool], CycleSpace] = {}
        # Leaf / cycle options in phase context (M items) do not depend on m.
        self._phase_all = {i: self._node_opts(i, profile.batch) for i in range(len(self.graph))}
        self.phase_opts = self._phase_all
        self._phase_best: dict[int, tuple[np.ndarray, list]] = {}

    def _node_opts(self, i: int, items: int) -> _OptSet:
        """Node i's options on items, those that fit memory, cores and N (and the scout's grid)."""
        key = (i, items)
        if self.graph.nodes[i].name not in self.profile.components:
            return self._cycle_opts(i, items)
        opts = self._fitting.get(key)
        if opts is None:
            name = self.graph.nodes[i].name
            if name in self.profile.components:
                comp = self.profile.components[name]
                if name not in self._arrays:
                    self._arrays[name] = _leaf_arrays(comp)
                every = _OptSet.leaf(comp, self.N, items, self._arrays[name])
            else:
                every = _OptSet.of(node_options(self.profile, name, self.N, items))
            fits = (every.mem <= self.cap) & (every.cores <= self.core_cap) & (every.used <= self.N)
            opts = every.take(np.nonzero(fits)[0])
            self._fitting[key] = opts
        if self.grid is not None:
            if key not in self._on_grid:
                ok = np.ones(len(opts), dtype=bool)
                for p, grid in enumerate(self.grid[i]):
                    col = opts.counts[:, p]
                    # a lookup table by count: one gather per option, not a set search
                    table = np.zeros(max(int(col.max(initial=0)), max(grid, default=0)) + 1, bool)
                    table[np.fromiter(grid, dtype=np.int64, count=len(grid))] = True
                    ok &= (col < 0) | table[np.maximum(col, 0)]
                self._on_grid[key] = opts.take(np.nonzero(ok)[0])
            opts = self._on_grid[key]
        return opts

    def _cycle_space(self, i: int, items: int) -> CycleSpace:
        """Cycle node i's fitting options on ``items`` items (on the scout's grid, if any)."""
        key = (i, items, self.grid is not None)
        space = self._spaces.get(key)
        if space is None:
            name = self.graph.nodes[i].name
            cyc = next(c for c in self.profile.cycles if c.name == name)
            a, b = (self.profile.components[x] for x in cyc.members)
            allow = self.grid[i] if self.grid is not None else (None, None)
            space = CycleSpace(
                a,
                b,
                cyc.steps,
                items,
                cyc.group_counts(items),
                cyc.overlap_slowdown,
                cyc.hop_s,
                cyc.last_b,
                self.N,
                self.cap,
                self.core_cap,
                allow[0],
                allow[1],
            )
            self._spaces[key] = space
        return space

    def _cycle_opts(self, i: int, items: int) -> _OptSet:
        """What the search takes of cycle node i's options over all of them (the fastest per
        device budget, the leanest, the first of the fastest, every co-located one), in
        ``node_options``' order; the stream points themselves come from ``_cycle_stream``."""
        cache = self._on_grid if self.grid is not None else self._fitting
        opts = cache.get((i, items))
        if opts is None:
            space = self._cycle_space(i, items)
            opts = cache[(i, items)] = _OptSet.cycle(space, *space.summary())
        return opts

    def _cycle_stream(self, i: int, m: int, s: int) -> _OptSet:
        """Cycle node i's options at m items that ``_keep`` passes (and every co-located one,
        which ``_bounded`` tests as before): ``_keep`` is monotone in F, P, u and memory, so
        blocks of options whose least values fail it hold none that passes."""
        space = self._cycle_space(i, m)

        def test(F, u, mem):
            return self._keep(s, F, F, u, mem, np.full(len(F), KIND_S, dtype=np.int64))

        return _OptSet.cycle(space, *space.passing(test))

    def _size(self, i: int) -> int:
        """How many options of node i fit (M items, no grid)."""
        if self.graph.nodes[i].name in self.profile.components:
            return len(self._phase_all[i])
        return self._spaces[(i, self.profile.batch, False)].count()

    def use_grid(self, grid: dict[int, list[frozenset[int]]] | None) -> None:
        """Restrict each node's options to the device counts in ``grid`` (None: lift it)."""
        self.grid = None
        self.phase_opts = self._phase_all
        self._on_grid = {}
        self._spaces = {k: v for k, v in self._spaces.items() if not k[2]}
        self._phase_best = {}
        if grid is not None:
            self.grid = grid
            self.phase_opts = {i: self._node_opts(i, self.profile.batch) for i in self._phase_all}

    def _leaf_phase(self, i: int) -> tuple[np.ndarray, list]:
        """Node i's best phase option per kind (values, sources), fresh copies. They do not
        depend on m, so each is found once per grid."""
        got = self._phase_best.get(i)
        if got is None:
            ph = self.phase_opts[i]
            vals = np.full(4, np.inf)
            src: list = [None] * 4
            for kk in range(4):
                sel = np.nonzero(ph.kind == kk)[0]
                if sel.size:  # the first of the fastest, as a scan would keep
                    j = int(sel[np.argmin(ph.time[sel])])
                    vals[kk], src[kk] = ph.time[j], ("leaf", j)
            got = self._phase_best[i] = (vals, src)
        return got[0].copy(), list(got[1])

    def _coords(self, i: int) -> list[list[int]]:
        """The device counts node i's options name, per position (n', or n_a and n_b)."""
        if i not in self._coord_cache and self.graph.nodes[i].name not in self.profile.components:
            self._coord_cache[i] = self._spaces[(i, self.profile.batch, False)].coords()
        if i not in self._coord_cache:
            col = self._phase_all[i].counts
            self._coord_cache[i] = [
                [int(x) for x in np.unique(col[:, p]) if x >= 0] for p in (0, 1)
            ]
        return self._coord_cache[i]

    def spread_grid(self) -> dict[int, list[frozenset[int]]]:
        """A few device counts per node, spread over 1..N."""
        return {i: [_spread(c, self.N) for c in self._coords(i)] for i in self._phase_all}

    def grid_around(self, trees: list[Node], step: int) -> dict[int, list[frozenset[int]]]:
        """Per node, the counts nearest to c + j * step (|j| <= 4) for each count c the plans use."""
        index = {nd.name: i for i, nd in enumerate(self.graph.nodes)}
        used: dict[int, list[set[int]]] = {i: [set(), set()] for i in self._phase_all}
        for tree in trees:
            for leaf in tree.leaves():
                counts = leaf.split if leaf.split else (leaf.used,)
                for p, c in enumerate(counts):
                    used[index[leaf.component]][p].add(c)
        offsets = step * np.arange(-_NEAR, _NEAR + 1)
        grid = {}
        for i in self._phase_all:
            near = []
            for p, c in enumerate(self._coords(i)):
                if not c or not used[i][p]:
                    near.append(frozenset(c))
                    continue
                targets = (np.array(sorted(used[i][p]))[:, None] + offsets[None, :]).ravel()
                cs = np.asarray(c)
                pick = np.abs(cs[None, :] - targets[:, None]).argmin(axis=1)
                near.append(frozenset(int(x) for x in cs[np.unique(pick)]))
            grid[i] = near
        return grid

    def stair_grid(self, grid: dict[int, list[frozenset[int]]]) -> dict | None:
        """``grid`` with, per leaf, every count faster than all smaller ones (at M items).

        Where memory allows, a plan never gains from a count with a faster smaller one beside
        it. With irregular costs few counts are such (at 4,096 counts off a smooth curve by up
        to 30%, about 170), and the optimum often sits far from the scout's counts; with smooth
        ones every count is, and the zoom has found them (None: nothing to add).
        """
        out, added = {}, False
        for i, opts in self._phase_all.items():
            out[i] = list(grid[i])
            if self.graph.nodes[i].name not in self.profile.components or not len(opts):
                continue
            order = np.lexsort((opts.time, opts.used))
            t = opts.time[order]
            faster = t < np.minimum.accumulate(np.r_[np.inf, t[:-1]])
            stair = {int(c) for c in opts.used[order][faster]}
            if len(stair) * 4 > len(opts) or stair <= grid[i][0]:
                continue
            out[i][0] = grid[i][0] | stair
            added = True
        return out if added else None

    def dense(self) -> bool:
        """Whether some node has so many options that the exact pass benefits from a scout."""
        return any(self._size(i) > _DENSE_OPTIONS for i in self._phase_all)

    def _lower_bounds(self, m: int) -> None:
        """Per node, the fastest feasible call on at most n devices (n = 0..N), at m and M items.

        They bound from below what the nodes outside a sub-graph add to any plan that contains
        one of its stream points (``_lower_bound``).
        """
        self._tm, self._tM, self._te, self._mm, self._alone_t = {}, {}, {}, {}, {}
        for i in range(len(self.graph)):
            best = np.full(self.N + 1, np.inf)
            opts = self._node_opts(i, m)
            np.minimum.at(best, opts.used, opts.time)
            best = np.minimum.accumulate(best)
            self._tm[i] = best
            self._mm[i] = float(opts.mem.min()) if len(opts) else math.inf
            ph = self.phase_opts[i]
            self._tM[i] = float(ph.time.min()) if len(ph) else math.inf
            self._te[i] = min(best[self.N], self._tM[i])
            # whether node i can bring temporal placement alone (a co-located cycle)
            self._alone_t[i] = bool((opts.kind & KIND_T).any() or (ph.kind & KIND_T).any())
        self._rest: dict[int, tuple | None] = {}
        self._above_cache: dict[int, list | None] = {}
        self._scout_phase = self._phase_seen.get(m, {})

    def _lower_bound(self, s: int, F: np.ndarray, P: np.ndarray, u: np.ndarray, mem: np.ndarray):
        """A lower bound on the iteration time of any plan holding these stream points of s.

        With t_c(n) the fastest call of node c on at most n devices (m items; ``_tm``) and e_c
        its fastest call at m or M items on any count (``_te``), each node c outside s ends
        in one of three places:
        (a) In the same stream subtree S as s, on devices disjoint from s's: it adds its call,
            at least t_c(N - u), to F, and P is at least that call. If every outside node is
            there, T >= F + sum t_c(N - u) + (K-1) max(P, max t_c(N - u)).
        (b) In S, sharing devices with s below a co-resident temporal node: it adds t_c(N) to F
            and at least as much to P, K t_c(N) in all; its memory adds to the point's there, so
            the smallest memory of its options must fit beside the point's.
        (c) Outside S: the root is then a phase temporal node, which pays every switch, and the
            phase part holding c takes at least g_c = min(t_c(N, M), K t_c(N)) (a spatial part
            pays K times its slowest member, and at least e of every other).
        Every other outside node adds at least its e, whatever its place.

        Returns, per point, T = F + (K-1) P, the bound in case (a) for every outside node
        (``beside``: the only case an all-spatial plan has), and what one node in case (b) adds
        to T at the least (``sharing``); case (c) adds ``_outside``'s ``apart``.
        """
        T = F + (self.K - 1) * P
        out = self._outside(s)
        if out is None:
            return T, T, np.full(len(T), np.inf)
        total, slowest, _, _, _, share, share_mem, _, _ = out
        beside = self._beside(F, P, np.minimum(u, self.N), total, slowest)
        return T, beside, self._sharing(mem, share, share_mem)

    def _beside(self, F, P, uu, total, slowest) -> np.ndarray:
        """``_lower_bound`` (a): F + sum t_c(N - u) + (K-1) max(P, max t_c(N - u)), from the sum
        and the slowest of the other nodes' fastest calls on N - u devices."""
        out = F + total[uu]
        if self.K > 1:  # (K-1) * inf would be nan when a node has no call on N - u devices
            out = out + (self.K - 1) * np.maximum(P, slowest[uu])
        return out

    def _sharing(self, mem, share, share_mem) -> np.ndarray:
        """``_lower_bound`` (b): the least ``share`` of the nodes whose least memory fits beside
        the point's (co-resident memory adds); inf where none fits."""
        if len(share) == 1:  # the common case of one outside node (or none that can share)
            return np.where(mem + share_mem[0] <= self.cap, share[0], np.inf)
        fits = mem[:, None] + share_mem[None, :] <= self.cap
        return np.where(fits, share[None, :], np.inf).min(axis=1)

    def _keep(self, s: int, F, P, u, mem, kind) -> np.ndarray:
        """Which stream points of s can still be part of the best spatial or hybrid plan.

        Monotone: a point that passes passes with any lower F, P, u or memory (of its kind).
        ``_cycle_stream`` tests whole blocks of a cycle's options by their least values on it.

        A point with temporal placement in it ends in a hybrid plan. One without ends in an
        all-spatial plan (every outside node beside it) or, if there are outside nodes, in a
        hybrid one.
        """
        T, beside, sharing = self._lower_bound(s, F, P, u, mem)
        spatial_only = (kind & KIND_T) == 0
        spatial = spatial_only & (beside <= self.bound[0])
        out = self._outside(s)
        if out is None:
            return spatial | (~spatial_only & (T <= self.bound[1]))
        hybrid = np.minimum(beside, T + np.minimum(sharing, out[7])) <= self.bound[1]
        if self._refine and (out[8] is not None or self._scout_phase):
            j = np.flatnonzero(hybrid & ~spatial)  # the others stay for the spatial plan
            if j.size:
                hybrid[j] = self._hybrid(
                    s, out, F[j], P[j], u[j], mem[j], spatial_only[j], T[j], beside[j], sharing[j]
                )
        return hybrid | spatial

    def _hybrid(self, s: int, out, F, P, u, mem, spatial_only, T, beside, sharing) -> np.ndarray:
        """``_lower_bound``'s hybrid test, case by case, for points that pass it as a whole
        (``T``, ``beside``, ``sharing``: its values for these points).

        (a) A point with no temporal placement in it, every outside node beside it: the plan
            is hybrid only if two outside nodes share devices there (no outside node brings
            temporal placement alone, ``_outside``'s ``pair``). Their co-resident node's P is
            P_A + P_B >= t_i + t_j, and their memory adds, so the two must fit one device's
            memory together; with no such pair there is no such plan.
        (c) The point's stream subtree, over a sub-graph S, runs in phase context. Any plan of
            S with spatial placement as fast does as well there, so the point matters only if
            what it makes of S can be as fast as the best such plan of S the scout found
            (``_apart_ok``).
        """
        K, bh = self.K, self.bound[1]
        total, slowest, apart, pair = out[0], out[1], out[7], out[8]
        if pair is not None:
            uu = np.minimum(u, self.N)
            two = pair[uu]
            if K > 1:
                via = F + total[uu] + (K - 1) * np.maximum(np.maximum(P, slowest[uu]), two)
            else:
                via = np.where(np.isfinite(two), beside, np.inf)
            beside = np.where(spatial_only, via, beside)
        ok = np.minimum(beside, T + sharing) <= bh
        need = np.flatnonzero(~ok & (T + apart <= bh))
        if need.size:
            ok[need] = self._apart_ok(s, F[need], P[need], u[need], mem[need])
        return ok

    def _apart_ok(self, s: int, F, P, u, mem) -> np.ndarray:
        """Case (c) of ``_hybrid``: whether some sub-graph S from s up (not the whole graph) can
        hold these points in a plan of S as fast as the best plan of S with spatial placement
        that the scout found at this m (``_scout_phase``). What the nodes of S outside s add
        is bounded as in ``_lower_bound`` (a) and (b), on S's N devices."""
        parts = self._above(s)
        if parts is None:  # some S has no scouted plan: no bound
            return np.ones(len(F), dtype=bool)
        T = F + (self.K - 1) * P
        uu = np.minimum(u, self.N)
        ok = np.zeros(len(F), dtype=bool)
        for best, total, slowest, share, share_mem in parts:
            if share is None:  # S = s
                ok |= T <= best
                continue
            beside = self._beside(F, P, uu, total, slowest)
            ok |= np.minimum(beside, T + self._sharing(mem, share, share_mem)) <= best
        return ok

    def _above(self, s: int):
        """Per sub-graph S from s up but not the whole graph (``_apart_ok``): the best time of a
        plan of S with spatial placement the scout found, and for the nodes of S outside s
        the sum and slowest of their fastest calls on N - u devices, and per node what they add
        at the least when it shares devices with s, with its least memory (as ``_outside``).
        None if some S has no such plan."""
        if s in self._above_cache:
            return self._above_cache[s]
        N = self.N
        parts: list | None = []
        left = N - np.arange(N + 1)
        for S in self.order:
            # A point of s may top the phase part itself (S = s); a single node's may not: in
            # phase context a node runs its phase options.
            if S == self.graph.full or S & s != s or (S == s and s & (s - 1) == 0):
                continue
            best = self._scout_phase.get(S, math.inf)
            if not math.isfinite(best):
                parts = None
                break
            rest = [i for i in range(len(self.graph)) if S >> i & 1 and not s >> i & 1]
            slack = 1e-9 * abs(best) + 1e-12  # ties stay: the bound never changes the optimum
            if not rest:  # S = s: the point is the phase part
                parts.append((best + slack, None, None, None, None))
                continue
            calls = np.stack([self._tm[i][left] for i in rest])
            e = [self._te[i] for i in rest]
            share, share_mem = self._share(rest, e, sum(e))
            parts.append((best + slack, calls.sum(axis=0), calls.max(axis=0), share, share_mem))
        self._above_cache[s] = parts
        return parts

    def _share(
        self, rest: list[int], e: list[float], floor: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """``_lower_bound`` (b) per node of ``rest`` (the nodes outside a point, ``e`` theirs):
        what they add at the least when that node shares the point's devices, and its least
        memory. A co-resident node is in stream context, so under a spatial node with some
        other node on its far side; with one node in ``rest`` there is none, and the two
        together would be the root, which is in phase context: no case (b), inf."""
        share_mem = np.array([self._mm[i] for i in rest])
        if len(rest) == 1:
            return np.full(1, np.inf), share_mem
        top = self.K * np.array([self._tm[i][self.N] for i in rest])
        return floor + top - np.array(e), share_mem

    def _outside(self, s: int):
        """For the nodes outside s (None if there are none), indexed by the devices u s uses:
        the sum and the slowest of their fastest calls on N - u devices; what they add at the
        least when some share s's devices or run outside its stream subtree; and what they add
        at the least wherever they run (the sum of their e). See ``_lower_bound``."""
        if s in self._rest:
            return self._rest[s]
        rest = [i for i in range(len(self.graph)) if not s >> i & 1]
        if not rest:
            self._rest[s] = None
            return None
        N, K = self.N, self.K
        calls = np.stack([self._tm[i][::-1] for i in rest])  # [x, u]: t on N - u devices
        e = {i: self._te[i] for i in rest}
        floor = sum(e.values())
        if math.isfinite(floor):
            # (b), per outside node: it must fit in memory beside the point (``_lower_bound``)
            share, share_mem = self._share(rest, list(e.values()), floor)
            apart = (
                floor + self.switch + min(min(self._tM[i], K * self._tm[i][N]) - e[i] for i in rest)
            )
        else:  # some outside node fits nowhere: no plan holds any point of s
            share, share_mem, apart = np.array([math.inf]), np.array([0.0]), math.inf
        shared = min(float(share.min()), apart)
        total, slowest = calls.sum(axis=0), calls.max(axis=0)
        if K > 1:
            h = total + (K - 1) * slowest
        else:
            h = total
        # Two outside nodes sharing devices (``_hybrid``): per u, the least t_i + t_j of
        # the pairs that fit one device's memory together (inf: none does). None when some
        # outside node can bring temporal placement alone (a co-located cycle).
        pair = None
        if not any(self._alone_t[i] for i in rest):
            pair = np.full(N + 1, np.inf)
            for x in range(len(rest)):
                for y in range(x + 1, len(rest)):
                    if self._mm[rest[x]] + self._mm[rest[y]] <= self.cap:
                        pair = np.minimum(pair, calls[x] + calls[y])
        # h is non-decreasing in u (for searchsorted): the calls only slow on fewer devices
        self._rest[s] = (total, slowest, shared, floor, h, share, share_mem, apart, pair)
        return self._rest[s]

    def run(self, m: int, bound: np.ndarray | None = None):
        """Return (best per kind at the root, back-pointer tables) for micro-batch m.

        ``bound``: (spatial, hybrid), the times of real plans of those modes (``_bounds``).
        A stream point sits below a spatial node, so it ends in an all-spatial or a hybrid
        plan; when its lower bounds exceed both bounds (``_keep``), it cannot be part of any
        plan we still want, and it is dropped.
        """
        g, prof = self.graph, self.profile
        K = prof.batch // m
        self.K = K
        self.bound = bound if bound is not None else np.full(2, np.inf)
        self._lower_bounds(m)
        stream: dict[int, _Points] = {}
        spat: dict[int, _Points] = {}
        leaf_opts: dict[int, _OptSet] = {}
        # phase[s] = (values[4], source[4]) with source ("leaf", idx) | ("spat", idx) | ("temp", cut, ka, kb)
        phase: dict[int, tuple[np.ndarray, list]] = {}
        root_other = root_temp = None
        for s in self.order:
            vals = np.full(4, np.inf)
            src: list = [None] * 4
            if s & (s - 1) == 0:  # a single graph node
                i = s.bit_length() - 1
                if g.nodes[i].is_cycle:
                    opts = self._cycle_stream(i, m, s)
                else:
                    opts = self._node_opts(i, m)
                leaf_opts[s] = opts
                if len(opts):
                    pts = _Points(
                        opts.time,
                        opts.time,
                        opts.mem,
                        opts.cores,
                        opts.used,
                        opts.kind,
                        np.zeros(len(opts), dtype=np.int64),
                        np.zeros(len(opts), dtype=np.int64),
                        np.arange(len(opts), dtype=np.int64),
                        np.zeros(len(opts), dtype=np.int64),
                    )
                    pts = self._bounded(pts, s)
                    # A cycle's options can be 10^5 after the bounds: the front by device budget
                    front = _front_by_u(pts, self.N) if g.nodes[i].is_cycle else None
                    stream[s] = self._prune(pts, front)
                else:
                    stream[s] = _empty()
                spat[s] = _empty()
                vals, src = self._leaf_phase(i)
                phase[s] = (vals, src)
                if s == g.full:
                    root_other = (vals.copy(), list(src))
                    root_temp = (np.full(4, np.inf), [None] * 4)
                continue
            sp_parts, tp_parts = [], []
            made = [0, 0]  # pairs passing, spatial and co-resident, before chunks' fronts
            tvals = np.full(4, np.inf)
            tsrc: list = [None] * 4
            is_root = s == g.full
            for a in g.cuts(s):
                b = s & ~a
                A, B = stream[a], stream[b]
                if len(A) and len(B):
                    pts, n = self._combine(A, B, a, b, spatial=True)
                    sp_parts.append(pts)
                    made[0] += n
                    if (
                        not is_root
                    ):  # the root is in phase context: no co-resident stream node there
                        pts, n = self._combine(A, B, a, b, spatial=False)
                        tp_parts.append(pts)
                        made[1] += n
                va, vb = phase[a][0], phase[b][0]
                for ka in range(4):
                    if not math.isfinite(va[ka]):
                        continue
                    for kb in range(4):
                        t = va[ka] + vb[kb]
                        kk = ka | kb | KIND_T
                        if t < tvals[kk]:
                            tvals[kk], tsrc[kk] = t, ("temp", a, ka, kb)
            if is_root:
                # Only min over F + (K-1) P is needed here, so pruning would cost more than it saves.
                sp = _Points.concat(sp_parts)
                stream[s] = _empty()
            else:
                # in the order of all the pairs that passed, however few their chunks kept
                sp = self._prune(_Points.concat(sp_parts), lex=made[0] > _BLOCK)
                tp = self._prune(_Points.concat(tp_parts), lex=made[1] > _BLOCK)
                # A front is its own front, in its order, so with no co-resident points (often
                # none fit memory) the spatial front is the stream set.
                stream[s] = self._prune(_Points.concat([sp, tp])) if len(tp) else sp
            spat[s] = sp
            ovals = np.full(4, np.inf)
            osrc: list = [None] * 4
            if len(sp):
                T = sp.F + (K - 1) * sp.P
                for kk in range(4):
                    sel = np.nonzero(sp.kind == kk)[0]
                    if sel.size:
                        j = sel[np.argmin(T[sel])]
                        ovals[kk], osrc[kk] = T[j], ("spat", int(j))
            for kk in range(4):
                if ovals[kk] <= tvals[kk]:
                    vals[kk], src[kk] = ovals[kk], osrc[kk]
                else:
                    vals[kk], src[kk] = tvals[kk], tsrc[kk]
            phase[s] = (vals, src)
            if s == g.full:
                root_other = (ovals, osrc)
                root_temp = (tvals + self.switch, tsrc)
        seen = self._phase_seen.setdefault(m, {})
        for s_, (vals, _) in phase.items():
            if s_ != g.full:
                seen[s_] = min(seen.get(s_, math.inf), float(min(vals[KIND_S], vals[3])))
        tables = (stream, spat, leaf_opts, phase, self.phase_opts)
        return root_other, root_temp, tables

    def _combine(
        self, A: _Points, B: _Points, cut: int, other: int, spatial: bool
    ) -> tuple[_Points, int]:
        """Every pairing of A's and B's points under a spatial or co-resident temporal node
        that fits and whose lower bound (``_lower_bound``) does not exceed the bound, in
        row-major order of (a, b), less those dominated within their chunk of pairs when it
        has many (``_chunk_front``), and how many passed before that.

        The pairs come in chunks (``_pairs``) and only those that pass are kept: both tests are
        per pair, and few pass them (on a 5-node graph with every count valid at 512 devices,
        7,288 of 25 million), where listing them all at once took 5 GB."""
        s = cut | other
        parts, made = [], 0
        for ia, ib in self._pairs(A, B, s, spatial):
            got = self._passing(A, B, ia, ib, s, spatial)
            if got is None:
                continue
            made += got[0].size
            if got[0].size > _CHUNK_FRONT_ABOVE and s != self.graph.full:
                got = _chunk_front(got, len(B))
            parts.append(got)
        if not parts:
            return _empty(), 0
        ia, ib, F, P, mem, cores, u, kind = (np.concatenate(x) for x in zip(*parts, strict=True))
        if len(ia) > 1:  # windows run in order of u, and interleave: row-major order
            order = np.argsort(ia * len(B) + ib)  # each pair comes once (disjoint windows)
            ia, ib, F, P, mem, cores, u, kind = (
                x[order] for x in (ia, ib, F, P, mem, cores, u, kind)
            )
        k = len(ia)
        pts = _Points(
            F,
            P,
            mem,
            cores,
            u,
            kind,
            np.full(k, 1 if spatial else 2, dtype=np.int64),
            np.full(k, cut, dtype=np.int64),
            ia,
            ib,
        )
        return pts, made

    def _passing(self, A: _Points, B: _Points, ia, ib, s: int, spatial: bool):
        """The pairs (ia, ib) that fit and pass ``_keep``, with their (F, P, mem, cores, u,
        kind); None if none does."""
        if not ia.size:
            return None
        if spatial:
            u = A.u[ia] + B.u[ib]
            mem = np.maximum(A.mem[ia], B.mem[ib])
            cores = A.cores[ia] + B.cores[ib]
        else:
            u = np.maximum(A.u[ia], B.u[ib])
            mem = A.mem[ia] + B.mem[ib]
            cores = np.maximum(A.cores[ia], B.cores[ib])
        ok = (u <= self.N) & (mem <= self.cap)
        if self.core_cap < math.inf:
            ok &= cores <= self.core_cap
        fit = np.nonzero(ok)[0]  # the bound's test only on pairs that fit
        if not fit.size:  # often so on many-node graphs, where the test costs the most
            return None
        ia, ib, u, mem, cores = ia[fit], ib[fit], u[fit], mem[fit], cores[fit]
        F = A.F[ia] + B.F[ib]
        P = np.maximum(A.P[ia], B.P[ib]) if spatial else A.P[ia] + B.P[ib]
        kind = A.kind[ia] | B.kind[ib] | (KIND_S if spatial else KIND_T)
        keep = np.nonzero(self._keep(s, F, P, u, mem, kind))[0]
        if not keep.size:
            return None
        return tuple(x[keep] for x in (ia, ib, F, P, mem, cores, u, kind))

    def _pairs(
        self, A: _Points, B: _Points, s: int, spatial: bool
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Index pairs (a, b) that can pass ``_lower_bound``'s test, each once, in chunks of at
        most ``_PAIR_CHUNK`` pairs (or one row of a window), in no order across chunks.

        A stream point has F >= P and the outside nodes add at least ``floor``, so
        T >= F_a + floor + K P_b (co-resident, where P = P_a + P_b: also + (K-1) P_a): that
        caps P_b. Unless the outside nodes can share devices or run
        apart (``shared``), they run beside the pair on N - u devices, and T >= F_a + min F_B +
        h(u) with h(u) = sum + (K-1) max of their fastest calls there, non-decreasing in u:
        that caps u. With B in order of u, the first cap leaves a suffix (B's running minimum
        of P) and the second a prefix: each a pairs with one window of B.
        """
        K, N = self.K, self.N
        nA, nB = len(A), len(B)
        if nA * nB <= _ALL_PAIRS:  # windows cost more than they save on small sets
            rows = max(_PAIR_CHUNK // nB, 1)
            for r in range(0, nA, rows):
                yield np.divmod(np.arange(r * nB, min(r + rows, nA) * nB, dtype=np.int64), nB)
            return
        out = self._outside(s)
        floor, shared = (out[3], out[2]) if out is not None else (0.0, 0.0)  # no memory gate
        if not math.isfinite(floor):
            return
        b_spatial, b_hybrid = self.bound
        # The bound a pairing with a answers to (``_keep``): a co-resident pair, or one with
        # temporal placement in it, ends in a hybrid plan; another in either mode (at the
        # root, with nothing outside, only in an all-spatial one).
        spatial_only = spatial & ((A.kind & KIND_T) == 0)
        if out is None:
            # at the root, a with no temporal placement ends in an all-spatial plan, unless its
            # b has some: then in a hybrid one
            b_t = bool((B.kind & KIND_T).any())
            loose = np.where(spatial_only, max(b_spatial, b_hybrid) if b_t else b_spatial, b_hybrid)
        else:
            # With two outside nodes sharing devices ruled out (``_hybrid``: no pair of them fits
            # one device's memory, and none brings temporal placement alone), a pair with no
            # temporal placement in it ends beside them only in an all-spatial plan; it ends in a
            # hybrid one only by sharing or apart, the second window.
            b_t = bool((B.kind & KIND_T).any())
            pair = out[8]
            alone = self._refine and pair is not None and bool(np.isinf(pair).all()) and not b_t
            loose = np.where(
                spatial_only, b_spatial if alone else max(b_spatial, b_hybrid), b_hybrid
            )
        # rounding: the exact test sums the same terms in another order
        slack = 1e-9 * max(abs(b_spatial), abs(b_hybrid)) + 1e-12
        left = loose - A.F - (K - 1) * A.P + slack
        left_h = b_hybrid - A.F - (K - 1) * A.P + slack  # sharing or apart: hybrid only
        min_fb = float(B.F.min())
        order, Bu, run_min = _by_u(B)
        # K P_b <= T - F_a - (what the outside adds), and co-resident also - (K-1) P_a
        cap_b = left if not spatial else left + (K - 1) * A.P
        cap_h = left_h if not spatial else left_h + (K - 1) * A.P
        gate = left - min_fb  # T - F_a - (K-1) P_a - min F_B, before the outside's share
        gate_h = left_h - min_fb

        def u_b(u_max: np.ndarray) -> np.ndarray:
            """The most devices b may use when the pair may use u_max."""
            return u_max - A.u if spatial else np.where(A.u <= u_max, u_max, -1)

        windows = []
        zero = np.zeros(N + 1)
        if out is None:
            lo = np.searchsorted(-K * run_min, -cap_b, side="left")
            hi = np.searchsorted(Bu, u_b(np.full(nA, N)), side="right")
            hi = np.where(gate >= 0, hi, 0)
            if spatial:  # T = F + (K-1) P itself, nothing outside
                lo, hi = _narrow(lo, hi, A, B, K, loose + slack, zero, zero)
            windows.append((lo, hi))
        else:
            # beside the pair: the outside adds >= floor, and h(u) caps the devices
            neg_p = -K * run_min
            lo = np.searchsorted(neg_p, -(cap_b - floor), side="left")
            u_max = np.searchsorted(out[4], gate + (K - 1) * A.P, side="right") - 1
            hi_u = np.searchsorted(Bu, u_b(u_max), side="right")
            hi = np.where(gate - floor >= 0, hi_u, 0)
            # sharing devices or apart: the outside adds >= shared, on any number of devices
            lo_s = np.searchsorted(neg_p, -(cap_h - shared), side="left")
            hi_s = np.searchsorted(Bu, u_b(np.full(nA, N)), side="right")
            hi_s = np.where(gate_h - shared >= 0, hi_s, 0)
            if not spatial:
                windows.append((lo, hi))
                windows.append((np.maximum(lo_s, hi_u), hi_s))
            else:
                # Each window narrowed to the b that can pass its test by the F and P of
                # the b around them; what leaves the first may still pass the second, so the
                # second takes the rest of its own, either side of the first.
                lo, hi = _narrow(lo, hi, A, B, K, loose + slack, out[0], out[1])
                hi = np.maximum(hi, lo)
                lo_s, hi_s = self._apart_window(A, B, s, out, lo_s, hi_s, b_hybrid + slack)
                windows.append((lo, hi))
                windows.append((lo_s, np.minimum(hi_s, lo)))
                windows.append((np.maximum(lo_s, hi), hi_s))
        # (lo, hi, order, whether a row is one of B's): each row i pairs with order[lo:hi]
        pieces = []
        for lo, hi in windows:
            if spatial:
                pieces.append((lo, hi, order, False))
                continue
            # Co-resident, u = max(u_a, u_b): when u_a <= u_b, an a' with u_a < u_a' <= u_b
            # that is as good as a in F, P, memory and cores gives a pair as good (same u), so
            # a pairs only with the b whose u lies in [u_a, next_a) (next: ``_next_better``).
            lo = np.maximum(lo, np.searchsorted(Bu, A.u, side="left"))
            hi = np.minimum(hi, np.searchsorted(Bu, _next_better(A, N), side="left"))
            # co-resident memory adds: a row that does not fit beside B's leanest pairs with none
            hi = np.where(A.mem + B.mem.min() <= self.cap, hi, lo)
            pieces.append((lo, hi, order, False))
        if not spatial:  # the pairs with u_b < u_a, by the same rule from b's side
            orderA, Au, _ = _by_u(A)
            lo2 = np.searchsorted(Au, B.u, side="right")
            hi2 = np.searchsorted(Au, _next_better(B, N), side="left")
            hi2 = np.where(B.mem + A.mem.min() <= self.cap, hi2, lo2)
            pieces.append((lo2, hi2, orderA, True))
        # The windows are disjoint, so each pair comes once.
        for lo, hi, idx, of_b in pieces:
            for rows, cols in _window_chunks(lo, hi, idx, _PAIR_CHUNK):
                yield (cols, rows) if of_b else (rows, cols)

    def _apart_window(self, A: _Points, B: _Points, s: int, out, lo, hi, bound: float):
        """The second window of a spatial pairing (``_pairs``), [lo, hi) per point a of A in
        B's order of u, narrowed to the b whose pair can end in a hybrid plan by sharing
        devices with an outside node or running apart from them (``_hybrid``): T + sharing
        <= the bound, or T + apart <= the bound and, where ``_apart_ok`` tests it, some
        sub-graph S above s that can hold the pair as fast as the scout's plan of S. Each test
        is bounded by ``_narrow``; the window covers their union."""
        if not math.isfinite(bound) or int(np.maximum(hi - lo, 0).sum()) <= _NARROW_ABOVE:
            return lo, hi  # no hybrid plan known (every pair may end in one), or few pairs
        nA, K, zero = len(A), self.K, np.zeros(self.N + 1)

        def under(limit) -> np.ndarray:  # per row (-inf: none passes)
            return np.broadcast_to(np.asarray(limit, dtype=np.float64), (nA,))

        def up(x: float) -> float:  # rounding: ``_narrow`` sums the terms in another order
            return x + 1e-9 * abs(x) + 1e-12 if math.isfinite(x) else x

        sharing = self._sharing(A.mem, out[5], out[6])  # inf where no outside node fits beside
        found = [_narrow(lo, hi, A, B, K, under(bound - sharing), zero, zero)]
        alo, ahi = _narrow(lo, hi, A, B, K, under(bound - out[7]), zero, zero)
        parts = None
        if self._refine and (out[8] is not None or self._scout_phase):
            parts = self._above(s)
        if parts is None:
            found.append((alo, ahi))
        else:
            for best, total, slowest, share, share_mem in parts:
                best = up(best)
                if share is None:  # S = s
                    found.append(_narrow(alo, ahi, A, B, K, under(best), zero, zero))
                    continue
                found.append(_narrow(alo, ahi, A, B, K, under(best), total, slowest))
                room = under(best - self._sharing(A.mem, share, share_mem))
                found.append(_narrow(alo, ahi, A, B, K, room, zero, zero))
        # the least interval holding every non-empty one (none: empty)
        new_lo, new_hi = np.full(nA, np.iinfo(np.int64).max), np.full(nA, -1)
        for a, b in found:
            some = a < b
            new_lo = np.where(some, np.minimum(new_lo, a), new_lo)
            new_hi = np.where(some, np.maximum(new_hi, b), new_hi)
        empty = new_hi < 0
        return np.where(empty, lo, new_lo), np.where(empty, lo, new_hi)

    def _prune(self, pts: _Points, front: np.ndarray | None = None, lex: bool = False) -> _Points:
        """The Pareto set of ``pts`` (``front``: its indices, when already known; ``lex``: as
        ``_pareto_idx``'s), thinned on heuristic passes."""
        pts = _prune(pts, lex) if front is None else pts.take(front)
        if self.truncate and len(pts) > self.truncate:
            # Heuristic pass only: keep a few promising points per kind, spread over the device
            # counts (the fastest alone all use the most devices, and no two of them fit side
            # by side): the staircase of the best time on at most u devices, thinned evenly.
            score = pts.F + (self.K - 1) * pts.P
            keep = []
            for kk in range(4):
                sel = np.nonzero(pts.kind == kk)[0]
                if sel.size <= self.truncate:
                    keep.append(sel)
                    continue
                sel = sel[np.lexsort((score[sel], pts.u[sel]))]
                s = score[sel]
                stair = sel[s < np.minimum.accumulate(np.r_[np.inf, s[:-1]])]
                pick = np.unique(np.linspace(0, stair.size - 1, self.truncate).round().astype(int))
                keep.append(stair[pick])
            pts = pts.take(np.sort(np.concatenate(keep)))
        return pts

    def _bounded(self, pts: _Points, s: int) -> _Points:
        return pts.take(np.nonzero(self._keep(s, pts.F, pts.P, pts.u, pts.mem, pts.kind))[0])

    # ------------------------------------------------------------------ reconstruction

    def build(self, tables, root_src, root_is_temp: bool) -> Node:
        stream, spat, leaf_opts, phase, phase_opts = tables
        g, prof = self.graph, self.profile

        def opt_node(s: int, o: Option) -> Node:
            name = g.nodes[s.bit_length() - 1].name
            return _option_node(prof, name, o)

        def st(s: int, pts: _Points, j: int) -> Node:
            op = int(pts.op[j])
            if op == 0:
                return opt_node(s, leaf_opts[s].option(int(pts.ia[j])))
            a = int(pts.cut[j])
            b = s & ~a
            na = st(a, stream[a], int(pts.ia[j]))
            nb = st(b, stream[b], int(pts.ib[j]))
            return Node(
                "spatial" if op == 1 else "temporal",
                na.n + nb.n if op == 1 else max(na.n, nb.n),
                children=(na, nb),
            )

        def ph(s: int, source) -> Node:
            if source[0] == "leaf":
                return opt_node(s, phase_opts[s.bit_length() - 1].option(source[1]))
            if source[0] == "spat":
                return st(s, spat[s], source[1])
            _, a, ka, kb = source
            b = s & ~a
            na, nb = ph(a, phase[a][1][ka]), ph(b, phase[b][1][kb])
            return Node("temporal", max(na.n, nb.n), children=(na, nb))

        return ph(g.full, root_src)


def _chunk_front(got: tuple, nB: int) -> tuple:
    """A chunk of passing pairs (``_DP._passing``'s arrays) less those dominated within it.

    The node's front is taken over all its pairings later, in row-major order of (a, b) per cut
    (``_DP._combine``); in that order here too, a pair dominated within its chunk is dominated
    there by a pair that stays (an equal pair by the first of them, as there), so the front and
    its order come out the same, while the pairs held at once shrink to the chunks' fronts (at
    512 devices, 2 million kept pairs to sets of 10^4). Not at the root, which keeps every pair
    (the first of the fastest wins there)."""
    ia, ib, F, P, mem, cores, u, kind = got
    order = np.argsort(ia * nB + ib)
    z = np.zeros(len(ia), dtype=np.int64)
    pts = _Points(F[order], P[order], mem[order], cores[order], u[order], kind[order], z, z, z, z)
    keep = order[np.sort(_pareto_idx(pts))]
    return tuple(x[keep] for x in got)


class _OptSet:
    """A node's options as arrays (to search); ``option(j)`` rebuilds one as an Option."""

    _FIELDS = ("time", "mem", "cores", "used", "kind", "counts", "index")

    def __init__(self, time, mem, cores, used, kind, counts, make) -> None:
        self.time = np.asarray(time, dtype=np.float64)
        self.mem = np.asarray(mem, dtype=np.float64)
        self.cores = np.asarray(cores, dtype=np.float64)
        self.used = np.asarray(used, dtype=np.int64)
        self.kind = np.asarray(kind, dtype=np.int64)
        # the device counts each option names, -1 where it names fewer than two
        self.counts = np.asarray(counts, dtype=np.int64).reshape(len(self.time), 2)
        self.index = np.arange(len(self.time))  # into what ``make`` was built from
        self._make = make

    @classmethod
    def of(cls, opts: list[Option]) -> _OptSet:
        return cls(
            [o.time for o in opts],
            [o.mem for o in opts],
            [o.cores for o in opts],
            [o.used for o in opts],
            [o.kind for o in opts],
            [(_counts(o) + (-1, -1))[:2] for o in opts],
            opts.__getitem__,
        )

    @classmethod
    def leaf(
        cls, comp: ComponentProfile, n: int, items: int, arrays: tuple | None = None
    ) -> _OptSet:
        """``leaf_options(comp, n, items)`` without making an Option per count (``arrays``:
        ``_leaf_arrays(comp)``, when the caller keeps them)."""
        valid, per_item, mem, cores = arrays if arrays is not None else _leaf_arrays(comp)
        sel = valid <= n
        valid, per_item, mem, cores = valid[sel], per_item[sel], mem[sel], cores[sel]
        k = len(valid)
        if comp.item_cv:  # the long-tail term: rare, and per count anyway
            time = np.array([comp.time(int(v), items) for v in valid], dtype=np.float64)
        else:  # the same operations as ``ComponentProfile.time``, so the same floats
            time = comp.alpha + items * per_item

        def make(j: int) -> Option:
            v = int(valid[j])
            return Option(float(time[j]), float(mem[j]), float(cores[j]), v, 0, ("leaf", v))

        counts = np.stack([valid, np.full(k, -1, dtype=np.int64)], axis=1)
        return cls(time, mem, cores, valid, np.zeros(k, dtype=np.int64), counts, make)

    @classmethod
    def cycle(cls, space: CycleSpace, ia, ib, kk) -> _OptSet:
        """A cycle's co-located options and the split options at these positions of
        ``space``, in ``node_options``' order (co-located first)."""
        coloc = space.coloc
        F, mem, cores, u = space.values(ia, ib, kk)
        nc = len(coloc)

        def make(j: int) -> Option:
            if j < nc:
                return coloc[j]
            j -= nc
            return space.option(int(ia[j]), int(ib[j]), int(kk[j]))

        counts = np.concatenate(
            [
                np.array([[o.used, -1] for o in coloc], dtype=np.int64).reshape(nc, 2),
                np.stack([space.a.count[ia], space.b.count[ib]], axis=1).reshape(len(ia), 2),
            ]
        )
        return cls(
            np.r_[[o.time for o in coloc], F],
            np.r_[[o.mem for o in coloc], mem],
            np.r_[[o.cores for o in coloc], cores],
            np.r_[np.array([o.used for o in coloc], dtype=np.int64), u],
            np.r_[np.full(nc, KIND_T, dtype=np.int64), np.full(len(ia), KIND_S, dtype=np.int64)],
            counts,
            make,
        )

    def __len__(self) -> int:
        return len(self.time)

    def option(self, j: int) -> Option:
        return self._make(int(self.index[j]))

    def take(self, idx: np.ndarray) -> _OptSet:
        out = object.__new__(_OptSet)
        for f in self._FIELDS:
            setattr(out, f, getattr(self, f)[idx])
        out._make = self._make
        return out


def _leaf_arrays(comp: ComponentProfile) -> tuple[np.ndarray, ...]:
    """A component's valid counts, in its order, with their per-item costs, memory and cores."""
    counts = [int(v) for v in comp.valid_devices]
    valid = np.array(counts, dtype=np.int64)
    per_item = np.array(list(map(comp.per_item.__getitem__, counts)), dtype=np.float64)
    mem = np.array(list(map(comp.memory_gb.__getitem__, counts)), dtype=np.float64)
    if comp.cpu_cores is None:  # ``ComponentProfile.cores``: no cores named, none needed
        cores = np.zeros(len(counts), dtype=np.float64)
    else:
        cores = np.array(list(map(comp.cores, counts)), dtype=np.float64)
    return valid, per_item, mem, cores


def _windows(lo: np.ndarray, hi: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (i, order[j]) for every i and lo[i] <= j < hi[i]."""
    counts = np.maximum(hi - lo, 0)
    total = int(counts.sum())
    i = np.repeat(np.arange(len(lo), dtype=np.int64), counts)
    offset = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return i, order[np.repeat(lo, counts) + offset].astype(np.int64)


def _window_chunks(lo: np.ndarray, hi: np.ndarray, order: np.ndarray, limit: int):
    """``_windows(lo, hi, order)`` in chunks of consecutive rows, each of at most ``limit``
    pairs (or one row, if that row alone has more)."""
    counts = np.maximum(hi - lo, 0)
    ends = np.cumsum(counts)
    start, rows = 0, len(lo)
    while start < rows:
        before = int(ends[start - 1]) if start else 0
        stop = max(int(np.searchsorted(ends, before + limit, side="right")), start + 1)
        i, j = _windows(lo[start:stop], hi[start:stop], order)
        if i.size:
            yield i + start, j
        start = stop


def _by_u(X: _Points) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """X's points in order of u (stable): the order, their u, and the running minimum of their
    P (non-increasing). Kept on the set, which is fixed once made and paired several times."""
    cached = X.__dict__.get("_by_u")
    if cached is None:
        order = np.argsort(X.u, kind="stable")
        cached = (order, X.u[order], np.minimum.accumulate(X.P[order]))
        X.__dict__["_by_u"] = cached
    return cached


def _narrow(lo, hi, A: _Points, B: _Points, K: int, L, total, slowest):
    """Per point a of A, its window [lo, hi) of B's points in order of u (``_by_u``) narrowed to
    the positions where a spatial pair (a, b) can meet F + total[u] + (K-1) max(P, slowest[u])
    <= L[a] (F = F_a + F_b, P = max(P_a, P_b), u = u_a + u_b; total and slowest
    non-decreasing in u, as the outside nodes' calls on N - u devices are).

    Both ends by bisection, each on a bound that moves one way along the window: for the
    positions up to j, with F_b and F_b + (K-1) P_b at least their least up to j and u at
    least the window's first; for those from j on, at least their least from j and u at
    least j's. A window that no position can meet comes back empty (hi <= lo)."""
    if int(np.maximum(hi - lo, 0).sum()) <= _NARROW_ABOVE:  # the search costs more than it saves
        return lo, hi
    order, Bu, _ = _by_u(B)
    pf, pg, sf, sg = _u_minima(B, K)
    k1 = K - 1
    n = len(total) - 1
    Fa, Pa = A.F, A.P

    def bound(i, j, u, pre: bool):
        t, f, g = total[u], (pf if pre else sf)[j], (pg if pre else sg)[j]
        if k1 == 0:  # T = F (K - 1 = 0 times an inf would be nan)
            return Fa[i] + t + f
        return Fa[i] + t + np.maximum(f + k1 * np.maximum(Pa[i], slowest[u]), g)

    first_u = np.minimum(A.u + Bu[np.minimum(lo, len(Bu) - 1)], n)
    lo = _first(lo, hi, lambda i, j: bound(i, j, first_u[i], True) <= L[i])
    hi = _first(lo, hi, lambda i, j: bound(i, j, np.minimum(A.u[i] + Bu[j], n), False) > L[i])
    return lo, hi


def _first(lo: np.ndarray, hi: np.ndarray, test) -> np.ndarray:
    """Per row, the first position j in [lo, hi) where ``test(rows, j)`` holds (hi if none),
    by bisection on all rows at once; ``test`` must hold from some position on."""
    lo, hi = lo.astype(np.int64), hi.astype(np.int64)  # copies
    act = np.flatnonzero(lo < hi)
    while act.size:
        mid = (lo[act] + hi[act]) // 2
        t = test(act, mid)
        hi[act[t]] = mid[t]
        lo[act[~t]] = mid[~t] + 1
        act = act[lo[act] < hi[act]]
    return lo


def _u_minima(X: _Points, K: int) -> tuple[np.ndarray, ...]:
    """In X's order of u (``_by_u``): the running minima of F and of F + (K-1) P from the
    first point and from the last (prefix and suffix), for ``_narrow``."""
    cached = X.__dict__.get("_u_minima")
    if cached is not None and cached[0] == K:
        return cached[1]
    order = _by_u(X)[0]
    f = X.F[order]
    g = f + (K - 1) * X.P[order] if K > 1 else f
    out = (
        np.minimum.accumulate(f),
        np.minimum.accumulate(g),
        np.minimum.accumulate(f[::-1])[::-1],
        np.minimum.accumulate(g[::-1])[::-1],
    )
    X.__dict__["_u_minima"] = (K, out)  # a set is fixed once made
    return out


def _next_better(X: _Points, N: int, look: int = 32) -> np.ndarray:
    """Per point, the u of a later point in order of u that is as good in F, P, memory and
    cores (the first of the next ``look``); N + 1 if none is found. Larger than the least such
    u is safe: it only keeps more pairs. Kinds need not match: a co-resident pair always ends
    below a spatial node, in a hybrid plan, whatever its sides' kinds.

    Nearest first, each point until found: with smooth costs the next count is faster and
    leaner and nearly every point is found at once; with irregular ones a good count may be
    followed by dozens of slower ones.
    """
    cached = X.__dict__.get("_next_better")
    if cached is not None and cached[0] == (N, look):
        return cached[1]
    order, u, _ = _by_u(X)
    rows = [X.F, X.mem]
    if not np.array_equal(X.P, X.F):  # a leaf's are equal
        rows.append(X.P)
    if X.cores.any():
        rows.append(X.cores)
    cols = np.stack(rows)[:, order]
    k = len(X)
    found = np.full(k, N + 1, dtype=np.int64)
    span = min(look, k - 1)
    if span >= 1:
        ok = (cols[:, 1:] <= cols[:, :-1]).all(axis=0)
        found[:-1][ok] = u[1:][ok]
        left = np.flatnonzero(~ok)  # positions (< k - 1) the next point does not serve
        if left.size and span >= 2:
            # The rest, every later offset at once: one gather of the next span - 1 points
            # each (those past the end masked out) in place of a pass per offset.
            ahead = left[:, None] + np.arange(2, span + 1)
            inside = ahead < k
            ahead = np.where(inside, ahead, 0)
            better = inside.copy()
            for r in range(len(cols)):
                better &= cols[r][ahead] <= cols[r][left][:, None]
            first = better.argmax(axis=1)
            hit = better[np.arange(left.size), first]
            found[left[hit]] = u[ahead[hit, first[hit]]]
    out = np.empty_like(found)
    out[order] = found
    X.__dict__["_next_better"] = ((N, look), out)  # a set is fixed once made
    return out


def _counts(o: Option) -> tuple[int, ...]:
    """The device counts an option names: (n',) for a leaf or co-located cycle, (n_a, n_b) split."""
    return o.spec[1:2] if o.spec[0] != "split" else o.spec[1:3]


def _spread(counts: list[int], N: int) -> frozenset[int]:
    """A few of ``counts`` spread over 1..N: nearest to a geometric and to a linear grid."""
    if len(counts) <= _DENSE_OPTIONS // 2:
        return frozenset(counts)
    c = np.asarray(counts)
    targets = np.concatenate([np.geomspace(1, max(N, 1), 16), np.linspace(0, N, 17)])
    pick = np.abs(c[None, :] - targets[:, None]).argmin(axis=1)
    return frozenset(int(x) for x in c[np.unique(pick)])


_DENSE_OPTIONS = 48
_ALL_PAIRS = 16384
_NARROW_ABOVE = 1 << 16  # pairs in a pairing's window, past which ``_narrow`` narrows it
# Pairs made and tested at once (``_DP._pairs``): the memory of a pairing grows with the chunk,
# not with the pairs (25 million at 512 devices in ``ppo5_all``), and a chunk's fixed costs
# stay small beside its work.
_PAIR_CHUNK = 1 << 20


def _option_node(profile: WorkloadProfile, name: str, o: Option) -> Node:
    if o.spec[0] == "leaf":
        return Node("leaf", o.used, component=name, used=o.used)
    members = next(c.members for c in profile.cycles if c.name == name)
    if o.spec[0] == "coloc":
        return Node("cycle", o.used, component=name, members=members, used=o.used)
    _, na, nb, k = o.spec
    return Node(
        "cycle", na + nb, component=name, members=members, split=(na, nb), groups=k, used=na + nb
    )


# ----------------------------------------------------------------------- public API


def _diagnose(profile: WorkloadProfile, devices: int, mode: str) -> str:
    """Name the component and the constraint that rules every plan out."""
    g = WorkGraph.from_profile(profile)
    cap, ccap = profile.device_memory_gb, profile.cpu_core_budget
    for nd in g.nodes:
        opts = _diagnosis_options(profile, nd.name, devices)
        what = f"cycle {nd.name!r}" if nd.is_cycle else f"component {nd.name!r}"
        if not opts and nd.is_cycle:
            return _no_cycle_layout(profile, nd.name, devices)
        if not opts:
            valid = list(profile.components[nd.name].valid_devices)
            return (
                f"{what} needs at least {min(valid)} devices (valid_devices {valid}), "
                f"but only {devices} are available (plan for more with --devices N)"
            )
        fits_mem = [o for o in opts if o.mem <= cap + EPS]
        if not fits_mem:
            counts = sorted({o.used for o in opts})
            need = min(o.mem for o in opts)
            return (
                f"{what} needs {need:g} GB per device on every valid device count {counts}, "
                f"but device_memory_gb is {cap:g}"
            )
        if not [o for o in fits_mem if o.cores <= ccap + EPS]:
            need = min(o.cores for o in fits_mem)
            return (
                f"{what} needs {need:g} CPU cores on every device count that fits memory, but "
                f"cpu_cores_per_node*nodes is {ccap:g}"
            )
    if mode == "spatial" and len(g.nodes) < 2 and not g.nodes[0].is_cycle:
        return (
            f"no spatial plan exists: spatial placement runs components side by side on devices "
            f"of their own, which needs at least two components (or a cycle, split); this "
            f"profile has only {g.nodes[0].name!r}, whose plan is temporal; take the best plan"
        )
    if mode == "spatial":
        need_dev, need_cores = {}, {}
        for nd in g.nodes:
            opts = [o for o in _diagnosis_options(profile, nd.name, devices) if o.mem <= cap + EPS]
            # A cycle laid out side by side is split: each member on devices of its own.
            split = [o for o in opts if o.kind & KIND_S] if nd.is_cycle else opts
            need_dev[nd.name] = min((o.used for o in split), default=0)
            need_cores[nd.name] = min((o.cores for o in split), default=0)
        if sum(need_cores.values()) > ccap + EPS:
            return (
                f"no all-spatial plan fits: side by side the components need at least "
                f"{sum(need_cores.values()):g} CPU cores ({need_cores}), but cpu_cores_per_node*nodes is {ccap:g}"
            )
        if sum(need_dev.values()) > devices:
            return (
                f"no all-spatial plan fits: side by side the components need at least "
                f"{sum(need_dev.values())} devices ({need_dev}), but only {devices} are available"
            )
        return (
            f"no all-spatial plan fits on {devices} devices: every side-by-side layout of "
            f"{[nd.name for nd in g.nodes]} exceeds device_memory_gb {cap:g} or the cores"
        )
    if mode == "hybrid":
        if len(g.nodes) < 3 and not any(nd.is_cycle for nd in g.nodes):
            return (
                f"no hybrid plan exists: it mixes temporal and spatial placement, which needs at "
                f"least three graph nodes (or a cycle plus one more); this graph has "
                f"{[nd.name for nd in g.nodes]}"
            )
        return (
            f"no hybrid plan fits on {devices} devices: a hybrid plan runs some components side "
            f"by side, on devices of their own ({_limits(cap, ccap)}); give more "
            "devices, or take the best plan"
        )
    if mode == "temporal":
        for nd in g.nodes:
            if nd.is_cycle and (why := _no_colocated_cycle(profile, nd.name, devices)):
                return f"no all-temporal plan fits: {why}"
    return f"no {mode} plan fits on {devices} devices ({_limits(cap, ccap)})"


def _diagnosis_options(profile: WorkloadProfile, name: str, devices: int) -> list[Option]:
    """A node's options on ``devices`` (M items), or for a cycle those that give ``_diagnose``
    the same answers (``digest_options``): listing every split took minutes at 1,024."""
    if name in profile.components:
        return node_options(profile, name, devices, profile.batch)
    cyc = next(c for c in profile.cycles if c.name == name)
    a, b = (profile.components[x] for x in cyc.members)
    return digest_options(
        a,
        b,
        cyc.steps,
        devices,
        profile.batch,
        cyc.overlap_slowdown,
        cyc.hop_s,
        cyc.last_b,
        profile.device_memory_gb + EPS,
    )


def _limits(cap: float, ccap: float) -> str:
    cores = "no CPU core limit" if math.isinf(ccap) else f"{ccap:g} CPU cores"
    return f"{cap:g} GB of memory per device, {cores}"


def _no_colocated_cycle(profile: WorkloadProfile, name: str, devices: int) -> str | None:
    """Why the 2-cycle ``name`` cannot run co-located on ``devices`` (None: it can), which an
    all-temporal plan needs: one device count valid for both members, on which both stay
    resident (their memory adds) and the cores of the busier fit."""
    cyc = next(c for c in profile.cycles if c.name == name)
    a, b = cyc.members
    ca, cb = profile.components[a], profile.components[b]
    cap, ccap = profile.device_memory_gb, profile.cpu_core_budget
    common = sorted(v for v in set(ca.valid_devices) & set(cb.valid_devices) if 1 <= v <= devices)
    head = f"cycle {name!r} must run co-located (both members on the same devices)"
    if not common:
        return (
            f"{head}, on one device count valid for both of at most {devices}, but {a!r} allows "
            f"{list(ca.valid_devices)} and {b!r} allows {list(cb.valid_devices)}"
        )
    mem = {v: ca.memory_gb[v] + cb.memory_gb[v] for v in common}
    fits = [v for v in common if mem[v] <= cap + EPS]
    if not fits:
        v = min(common, key=lambda x: (mem[x], x))
        return (
            f"{head}, where both stay resident: on {v} device(s), the leanest count valid for "
            f"both, they need {ca.memory_gb[v]:g} + {cb.memory_gb[v]:g} = {mem[v]:g} GB per "
            f"device, but device_memory_gb is {cap:g}"
        )
    cores = {v: max(ca.cores(v), cb.cores(v)) for v in fits}
    if all(c > ccap + EPS for c in cores.values()):
        v = min(fits, key=lambda x: (cores[x], x))
        return (
            f"{head}: on {v} device(s) its members need {cores[v]:g} CPU cores, but "
            f"cpu_cores_per_node*nodes is {ccap:g}"
        )
    return None


def _no_cycle_layout(profile: WorkloadProfile, name: str, devices: int) -> str:
    """Why a 2-cycle has no layout on ``devices``: co-located, both members run on one count
    valid for each; split, on a count valid for one plus a count valid for the other."""
    cyc = next(c for c in profile.cycles if c.name == name)
    a, b = cyc.members
    va, vb = profile.components[a].valid_devices, profile.components[b].valid_devices
    common = sorted(v for v in set(va) & set(vb) if v >= 1)
    if common:
        coloc = f"the smallest count valid for both is {common[0]}"
    else:
        coloc = f"{a!r} allows {list(va)} and {b!r} allows {list(vb)}: none is valid for both"
    pairs = [(x, y) for x in va for y in vb if x + y > 0]
    if not pairs:  # both on host cores alone: no device is ever used
        return (
            f"cycle {name!r} has no member on devices: {a!r} and {b!r} are both host-only "
            "(valid_devices [0]); give one of them device counts >= 1"
        )
    na, nb = min(pairs, key=sum)
    return (
        f"cycle {name!r} fits no layout on {devices} devices: co-located, its members need "
        f"one device count valid for both ({coloc}); split, they need a count valid for {a!r} "
        f"plus one valid for {b!r}, at least {na} + {nb} = {na + nb} devices; give --devices "
        f"{min([na + nb, *common])} or more, or change the members' valid_devices"
    )


@dataclass
class _Best:
    t: float
    m: int
    src: object
    is_temp: bool
    tables: object


def _run_all(
    profile: WorkloadProfile, devices: int, progress: Progress | None = None
) -> dict[str, _Best | None]:
    dp = _DP(profile, devices)
    best: dict[str, _Best | None] = {k: None for k in _MODE_KINDS}
    grans = sorted(profile.granularities, reverse=True)
    total = len(grans) + 1
    if progress:
        progress(0, total)
    bounds, first = _scout(dp, grans)
    if progress:
        progress(1, total)
    # The micro-batch sizes of the scout's best plans first: their exact optima then bound
    # the other sizes' passes. Ties go to the larger m (``_update``), whatever the order, so
    # plans that never stream keep whole-batch calls.
    for i, m in enumerate(first + [m for m in grans if m not in first]):
        (ov, osrc), (tv, tsrc), tables = dp.run(m, np.minimum(bounds, _bounds(best)))
        _update(best, m, ov, osrc, tv, tsrc, tables)
        if progress:
            progress(i + 2, total)
    best["_dp"] = dp  # type: ignore[assignment]
    return best


def _scout(dp: _DP, grans: list[int]) -> tuple[np.ndarray, list[int]]:
    """Times of real plans per mode, found quickly, as bounds for the exact pass, and the
    micro-batch sizes of its best spatial and hybrid plans (the fastest first).

    Large graphs: a few points per state (``truncate``). Nodes with many device counts: first
    a few spread-out counts, then, for the micro-batch sizes of the plans found, the counts
    near theirs, zooming in 4x a round. Small graphs with few counts need no scout.
    """
    dense = dp.dense()
    if len(dp.graph) <= 3 and not dense:
        return np.full(2, np.inf), []
    if len(dp.graph) > 3:
        # more points per state where nodes have many device counts: the exact pass then
        # starts from bounds close enough to the optimum to drop most of its points
        many = any(dp._size(i) > _MANY_OPTIONS for i in dp._phase_all)
        dp.truncate = _HEURISTIC_POINTS_MANY if many else _HEURISTIC_POINTS
    else:
        dp.truncate = None
    scout: dict[str, _Best | None] = {k: None for k in _MODE_KINDS}
    grid = dp.spread_grid() if dense else None
    step = -(-dp.N // 32)  # about the spread grid's spacing

    def scan(grid: dict | None) -> None:
        dp.use_grid(grid)
        for m in grans:
            (ov, osrc), (tv, tsrc), tables = dp.run(m, _bounds(scout))
            _update(scout, m, ov, osrc, tv, tsrc, tables)

    while True:
        scan(grid)
        if grid is None or step == 1:
            break
        step = max(step // 4, 1)
        found = [b for b in scout.values() if b]
        grid = dp.grid_around([dp.build(b.tables, b.src, b.is_temp) for b in found], step)
        grans = sorted({b.m for b in found}, reverse=True)
    stair = dp.stair_grid(grid) if grid is not None else None
    if stair is not None:
        scan(stair)
    dp.truncate = None
    dp.use_grid(None)
    found = sorted((b.t, -b.m) for k in ("spatial", "hybrid") if (b := scout[k]) is not None)
    return _bounds(scout), list(dict.fromkeys(-m for _, m in found))


_HEURISTIC_POINTS = 6
_REFINE_ABOVE = 3  # nodes
_HEURISTIC_POINTS_MANY = 12
_MANY_OPTIONS = 16
_NEAR = 4  # grid steps either side of a scout plan's device counts searched again


def _update(best, m, ov, osrc, tv, tsrc, tables) -> None:
    """Record micro-batch m's root results where they beat the best so far (ties: the larger m,
    then the one found first)."""
    for mode, kinds in _MODE_KINDS.items():
        for kk in kinds:
            for v, srcs, is_temp in ((ov[kk], osrc, False), (tv[kk], tsrc, True)):
                cur = best[mode]
                if not math.isfinite(v):
                    continue
                if (
                    cur is None
                    or v < cur.t * (1 - 1e-12) - 1e-15
                    or (m > cur.m and v <= cur.t * (1 + 1e-12) + 1e-15)
                ):
                    best[mode] = _Best(float(v), m, srcs[kk], is_temp, tables)


def _bounds(best: dict[str, _Best | None]) -> np.ndarray:
    """(spatial, hybrid): the best times found so far of the two modes a stream point can end
    in (it sits below a spatial node), inf where none is known. The slack keeps ties, so the
    bounds never change which optimum is found."""

    def ub(mode: str) -> float:
        b = best[mode]
        return b.t * (1 + 1e-9) + 1e-12 if b is not None else math.inf

    return np.array([ub("spatial"), ub("hybrid")])


def _to_plan(
    profile: WorkloadProfile, devices: int, dp: _DP, b: _Best, search_s: float, method: str
) -> Plan:
    tree = dp.build(b.tables, b.src, b.is_temp)
    return fixed_plan(profile, tree, b.m, devices=devices, search_s=search_s, method=method)


def fixed_plan(
    profile: WorkloadProfile,
    tree: Node,
    micro_batch: int,
    devices: int | None = None,
    search_s: float = 0.0,
    method: str = "fixed",
    modes: dict[str, float | None] | None = None,
) -> Plan:
    """Lay out an explicit tree, cost it with ``evaluate`` and wrap it as a Plan.

    Raises PlanError when the tree does not fit (memory, devices, cores).
    """
    n = int(devices or profile.devices)
    prof = profile if n == profile.devices else profile.with_devices(n)
    ev = evaluate(layout(tree, 0, prof.devices_per_node), prof, micro_batch)
    if not ev.feasible:
        raise PlanError(f"the given plan does not fit: {ev.reason}")
    # The root owns every device; the nodes below keep exactly what they use.
    root = layout(replace(ev.tree, n=n), 0, prof.devices_per_node)  # type: ignore[arg-type]
    from loomrl.plan.simulate import predicted_timeline

    timeline = predicted_timeline(root, prof, micro_batch)
    return Plan(
        tree=root,
        micro_batch=micro_batch,
        predicted_s=ev.predicted_s,
        devices=n,
        batch=prof.batch,
        mode=mode_of(root),
        memory_gb=ev.memory,
        modes=dict(modes or {}),
        search_s=search_s,
        timeline=tuple(timeline),
        method=method,
    )


def search_all(
    profile: WorkloadProfile, devices: int | None = None, progress: Progress | None = None
) -> dict[str, Plan | None]:
    """Best plan overall (``"best"``) and the best all-temporal, all-spatial and hybrid plans.

    A mode with no feasible plan maps to None; when no plan at all fits, raises
    PlanError naming the component and the constraint. Every returned Plan's
    ``modes`` maps each mode to its predicted seconds (None when infeasible).
    ``progress(done, total)`` is called as the search's passes end (the scout, then one per
    micro-batch size), for a progress bar on long searches.
    """
    n = int(devices or profile.devices)
    prof = profile if n == profile.devices else profile.with_devices(n)
    check_search_size(prof)
    t0 = time.perf_counter()
    best = _run_all(prof, n, progress)
    dp = best.pop("_dp")  # type: ignore[arg-type]
    search_s = time.perf_counter() - t0
    if best["best"] is None:
        raise PlanError(_diagnose(prof, n, "best"))
    out: dict[str, Plan | None] = {
        k: (_to_plan(prof, n, dp, b, search_s, "dp") if b is not None else None)  # type: ignore[arg-type]
        for k, b in best.items()
    }
    # Each mode's predicted_s, as its plan states it: with the profile's iteration_overhead_s,
    # which the search leaves out (it shifts every plan alike), so the table and the plans agree.
    modes = {k: (p.predicted_s if (p := out[k]) is not None else None) for k in MODES}
    return {k: (replace(p, modes=modes) if p is not None else None) for k, p in out.items()}


def search(profile: WorkloadProfile, devices: int | None = None, mode: str = "best") -> Plan:
    """The best plan in ``mode`` ("best" | "temporal" | "spatial" | "hybrid")."""
    if mode not in _MODE_KINDS:
        raise PlanError(f"mode must be one of {sorted(_MODE_KINDS)}, got {mode!r}")
    n = int(devices or profile.devices)
    prof = profile if n == profile.devices else profile.with_devices(n)
    plans = search_all(prof, n)
    plan = plans[mode]
    if plan is None:
        raise PlanError(_diagnose(prof, n, mode))
    return plan


def plan_for_mode(profile: WorkloadProfile, mode: str, devices: int | None = None) -> Plan:
    """The best plan restricted to one mode; what the runtime uses to run a fixed mode."""
    return search(profile, devices, mode)


# ----------------------------------------------------------------------- brute force


class ExhaustiveTooLong(PlanError):
    """The brute force ran past its ``deadline`` (``exhaustive(..., deadline=...)``): it grows
    exponentially with the components and devices, so a large instance would not end."""


def exhaustive(
    profile: WorkloadProfile,
    devices: int | None = None,
    mode: str = "best",
    deadline: float | None = None,
) -> Plan:
    """Reference search: every tree, every cut, every split, every device count, every m.

    No memoisation and no Pareto pruning (only exact duplicates of a result are
    merged); exponential, meant for V <= 4 and N <= 12. ``deadline`` (a
    ``time.perf_counter()`` value; None: none): raise ``ExhaustiveTooLong`` once past it.
    """
    if mode not in _MODE_KINDS:
        raise PlanError(f"mode must be one of {sorted(_MODE_KINDS)}, got {mode!r}")
    plans = exhaustive_all(profile, devices, deadline=deadline, modes=(mode,))
    plan = plans[mode]
    assert plan is not None  # exhaustive_all raised PlanError naming the constraint
    return plan


def exhaustive_all(
    profile: WorkloadProfile,
    devices: int | None = None,
    deadline: float | None = None,
    modes: tuple[str, ...] = ("best", *MODES),
) -> dict[str, Plan | None]:
    """``exhaustive`` for every mode of ``modes`` from one brute-force pass (what
    ``search_all`` is to ``search``): mode -> Plan, None where no plan of that mode fits;
    ``PlanError`` naming the constraint when none of ``modes[0]`` fits. Every Plan's ``modes``
    maps each mode of ``MODES`` to its predicted seconds (None: infeasible)."""
    n = int(devices or profile.devices)
    prof = profile if n == profile.devices else profile.with_devices(n)
    check_search_size(prof)
    t0 = time.perf_counter()
    best, to_node = _exhaustive_all(prof, n, deadline)
    search_s = time.perf_counter() - t0
    if best[modes[0]] is None:
        raise PlanError(_diagnose(prof, n, modes[0]))
    out: dict[str, Plan | None] = {
        k: (
            fixed_plan(prof, to_node(b[2]), b[1], devices=n, search_s=search_s, method="exhaustive")
            if (b := best[k]) is not None
            else None
        )
        for k in modes
    }
    times = {
        k: (v[0] + prof.iteration_overhead_s if (v := best[k]) is not None else None) for k in MODES
    }
    # As search_all: each mode's time as its own plan states it
    times = {k: (p.predicted_s if (p := out.get(k)) is not None else v) for k, v in times.items()}
    return {k: (replace(p, modes=times) if p is not None else None) for k, p in out.items()}


def exhaustive_times(
    profile: WorkloadProfile, devices: int | None = None
) -> dict[str, float | None]:
    """Brute-force optimum per mode ("best", "temporal", "spatial", "hybrid"); None when
    infeasible. Seconds as a plan's ``predicted_s`` states them, iteration_overhead_s included."""
    n = int(devices or profile.devices)
    prof = profile if n == profile.devices else profile.with_devices(n)
    check_search_size(prof)
    best, _ = _exhaustive_all(prof, n)
    return {k: (v[0] + prof.iteration_overhead_s if v else None) for k, v in best.items()}


def _exhaustive_all(prof: WorkloadProfile, n: int, deadline: float | None = None):
    g = WorkGraph.from_profile(prof)

    def on_time() -> None:
        if deadline is not None and time.perf_counter() > deadline:
            raise ExhaustiveTooLong(
                f"the brute force over every plan of {len(prof.components)} components on "
                f"{n} devices ran past its time limit"
            )

    cap, ccap = prof.device_memory_gb + EPS, prof.cpu_core_budget + EPS
    M = prof.batch
    switch = switch_total(prof)

    def fits(mem: float, cores: float) -> bool:
        return mem <= cap and cores <= ccap

    def leaf(s: int, nn: int, items: int) -> dict:
        name = g.nodes[s.bit_length() - 1].name
        out = {}
        for o in node_options(prof, name, nn, items):
            if fits(o.mem, o.cores):
                out.setdefault((o.time, o.time, o.mem, o.cores, o.kind, "L"), ("L", name, o))
        return out

    def stream(s: int, nn: int, m: int) -> dict:
        on_time()
        if s & (s - 1) == 0:
            return leaf(s, nn, m)
        out: dict = {}
        for a in g.cuts(s):
            b = s & ~a
            for na in range(1, nn):
                sa, sb = stream(a, na, m), stream(b, nn - na, m)
                for (fa, pa, ma, ca, ka, _), ta in sa.items():
                    on_time()
                    for (fb, pb, mb, cb, kb, _), tb in sb.items():
                        key = (fa + fb, max(pa, pb), max(ma, mb), ca + cb, ka | kb | KIND_S, "S")
                        if fits(key[2], key[3]):
                            out.setdefault(key, ("S", ta, tb))
            sa, sb = stream(a, nn, m), stream(b, nn, m)
            for (fa, pa, ma, ca, ka, _), ta in sa.items():
                on_time()
                for (fb, pb, mb, cb, kb, _), tb in sb.items():
                    key = (fa + fb, pa + pb, ma + mb, max(ca, cb), ka | kb | KIND_T, "T")
                    if fits(key[2], key[3]):
                        out.setdefault(key, ("T", ta, tb))
        return out

    def phase(s: int, nn: int, m: int, root: bool) -> dict:
        """(T, kind) -> tree for every phase-context plan of s on nn devices."""
        on_time()
        if s & (s - 1) == 0:
            return {(k[0], k[4]): t for k, t in leaf(s, nn, M).items()}
        K = M // m
        out: dict = {}
        for (f, p, _mem, _c, kind, op), t in stream(s, nn, m).items():
            if op == "S":
                out.setdefault((f + (K - 1) * p, kind), t)
        for a in g.cuts(s):
            b = s & ~a
            for (tav, ka), ta in phase(a, nn, m, False).items():
                on_time()
                for (tbv, kb), tb in phase(b, nn, m, False).items():
                    v = tav + tbv + (switch if root else 0.0)
                    out.setdefault((v, ka | kb | KIND_T), ("T", ta, tb))
        return out

    best: dict = {k: None for k in _MODE_KINDS}
    for m in sorted(prof.granularities, reverse=True):
        for (v, kind), t in phase(g.full, n, m, True).items():
            for mode, kinds in _MODE_KINDS.items():
                cur = best[mode]
                if kind in kinds and (cur is None or v < cur[0] * (1 - 1e-12) - 1e-15):
                    best[mode] = (v, m, t)

    def to_node(t) -> Node:
        if t[0] == "L":
            return _option_node(prof, t[1], t[2])
        a, b = to_node(t[1]), to_node(t[2])
        if t[0] == "S":
            return Node("spatial", a.n + b.n, children=(a, b))
        return Node("temporal", max(a.n, b.n), children=(a, b))

    return best, to_node
