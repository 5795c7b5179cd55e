"""A cycle's options searched as blocks of counts (loomrl.plan._cycles) against the full list
``cost.cycle_options`` makes, on random members: the same options, floats and order."""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest

from loomrl.plan._cycles import (
    CycleSpace,
    _ends_on_a,
    _ends_on_a_floor,
    digest_options,
)
from loomrl.plan.cost import KIND_S, cycle_options, ring_span
from loomrl.plan.profile import ComponentProfile


def _member(rng, name: str, n: int) -> ComponentProfile:
    k = int(rng.integers(1, n + 1))
    valid = sorted(set(int(x) for x in rng.choice(np.arange(1, n + 1), size=k, replace=False)))
    if rng.random() < 0.15:  # host cores alone
        valid = [0, *valid]
    base, p = float(rng.uniform(0.2, 3)), float(rng.uniform(0.3, 1.0))
    jitter = rng.random() < 0.5
    per = {
        d: round(base * max(d, 1) ** -p * (float(rng.uniform(0.7, 1.3)) if jitter else 1), 3)
        for d in valid
    }
    mem = {d: round(float(rng.uniform(5, 60)) / max(d, 1) ** 0.5, 1) for d in valid}
    cores = {d: int(rng.integers(0, 6)) * max(d, 1) for d in valid} if rng.random() < 0.3 else None
    cv = float(rng.uniform(0, 0.5)) if rng.random() < 0.1 else 0.0
    return ComponentProfile(
        name, tuple(valid), round(float(rng.uniform(0, 1)), 2), per, mem, 0.0, cores, cv
    )


def _case(seed: int):
    """A random cycle, its fitting options as ``cycle_options`` lists them, and its space."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 30))
    a, b = _member(rng, "a", n), _member(rng, "b", n)
    steps, items = int(rng.integers(1, 5)), int(rng.choice([1, 4, 6, 12]))
    groups = [k for k in range(1, items + 1) if items % k == 0]
    slowdown, hop = float(rng.choice([1.0, 1.3])), float(rng.choice([0.0, 0.7]))
    last_b = bool(rng.random() < 0.7)
    cap = float(rng.uniform(10, 80))
    core_cap = float(rng.choice([math.inf, float(rng.integers(2, 40))]))
    every = cycle_options(a, b, steps, n, items, groups, slowdown, hop, last_b)
    fits = [o for o in every if o.mem <= cap and o.cores <= core_cap and o.used <= n]
    args = (a, b, steps, items, groups, slowdown, hop, last_b, n, cap, core_cap)
    return fits, CycleSpace(*args), args


def _options(space: CycleSpace, found) -> list:
    return [space.option(*x) for x in zip(*found, strict=True)]


@pytest.mark.parametrize("seed", range(0, 120, 3))
def test_block_search_finds_exactly_the_options_a_monotone_test_passes(seed):
    fits, space, _ = _case(seed)
    splits = [o for o in fits if o.spec[0] == "split"]
    assert space.coloc == [o for o in fits if o.spec[0] == "coloc"]
    assert _options(space, space.passing(lambda F, u, m: F == F)) == splits
    if not splits:
        return
    n = space.n
    t0 = float(np.median([o.time for o in splits]))
    m0 = float(np.median([o.mem for o in splits]))

    def test(F, u, m):  # monotone: passes at any lower values
        return (F <= t0 * (1 + 0.5 * (u < n / 2))) & (m <= m0)

    want = [o for o in splits if test(np.array(o.time), np.array(o.used), np.array(o.mem))]
    assert _options(space, space.passing(test)) == want


@pytest.mark.parametrize("seed", range(1, 120, 3))
def test_summary_keeps_every_aggregate_the_search_takes(seed):
    fits, space, _ = _case(seed)
    splits = [o for o in fits if o.spec[0] == "split"]
    summary = _options(space, space.summary())
    # the fastest on at most u devices, per u
    stair = np.full(space.n + 1, np.inf)
    for o in splits:
        stair[o.used] = min(stair[o.used], o.time)
    stair = np.minimum.accumulate(stair)
    best, _ = space.staircase()
    assert np.array_equal(best, stair)
    got = np.full(space.n + 1, np.inf)
    for o in summary:
        got[o.used] = min(got[o.used], o.time)
    assert np.array_equal(np.minimum.accumulate(got), stair)
    # in list order, with the leanest and the first of the fastest
    assert [splits.index(o) for o in summary] == sorted(splits.index(o) for o in summary)
    if splits:
        assert min(o.mem for o in summary) == min(o.mem for o in splits)
        fastest = min(o.time for o in splits)
        first = next(o for o in splits if o.time == fastest)
        assert next(o for o in summary if o.time == fastest) == first
    assert space.count() == len(fits)
    want = [sorted({o.spec[1] for o in fits}), sorted({o.spec[2] for o in splits})]
    assert space.coords() == want


@pytest.mark.parametrize("seed", range(2, 120, 3))
def test_digest_answers_as_every_option_does(seed):
    """What a no-fit message takes of a cycle's options, from the digest and from them all."""
    _, _, (a, b, steps, items, groups, slowdown, hop, last_b, n, cap, _) = _case(seed)
    every = cycle_options(a, b, steps, n, items, groups, slowdown, hop, last_b)
    digest = digest_options(a, b, steps, n, items, slowdown, hop, last_b, cap)

    def answers(opts):
        fit = [o for o in opts if o.mem <= cap]
        split = [o for o in fit if o.kind & KIND_S]
        return (
            bool(opts),
            sorted({o.used for o in opts}),
            min((o.mem for o in opts), default=None),
            min((o.cores for o in fit), default=None),
            min((o.used for o in split), default=None),
            min((o.cores for o in split), default=None),
        )

    assert answers(digest) == answers(every)
    assert [every.index(o) for o in digest] == sorted(every.index(o) for o in digest)


def test_ring_ending_on_a_played_out_for_arrays_and_bounded_below():
    rng = np.random.default_rng(0)
    for _ in range(60):
        steps, k = int(rng.integers(1, 9)), int(rng.choice([1, 2, 3, 8, 600]))
        hop = float(rng.choice([0.0, rng.uniform(0, 3)]))
        ta, tb = rng.uniform(0, 5, 20), rng.uniform(0, 5, 20) * float(rng.choice([0.01, 1, 100]))
        got = _ends_on_a(ta, tb, steps, k, hop)
        want = [ring_span(x, y, steps, k, hop, last_b=False) for x, y in zip(ta, tb, strict=True)]
        assert got.tolist() == want
        assert (_ends_on_a_floor(ta, tb, np.full(20, k), steps, hop) <= got).all()


def test_front_by_device_budget_is_the_pareto_front_in_its_order():
    """``_front_by_u`` (a cycle's many stream points) against ``_pareto_idx``: the same
    indices in the same order, ties and duplicates included, with and without cores."""
    search = importlib.import_module("loomrl.plan.search")  # the module, not the function
    for seed in range(40):
        rng = np.random.default_rng(seed)
        k, n = int(rng.integers(129, 5000)), int(rng.integers(1, 300))
        F = rng.integers(0, int(rng.integers(2, 60)), k).astype(float)
        mem = rng.integers(0, int(rng.integers(2, 40)), k).astype(float)
        cores = rng.integers(0, int(rng.integers(1, 30)), k).astype(float)
        if seed % 2:
            cores[:] = 0.0
        zero = np.zeros(k, dtype=np.int64)
        pts = search._Points(
            F,
            F,
            mem,
            cores,
            rng.integers(0, n + 1, k),
            rng.choice([1, 2], k),
            zero,
            zero,
            np.arange(k),
            zero,
        )
        assert search._front_by_u(pts, n).tolist() == search._pareto_idx(pts).tolist(), seed
