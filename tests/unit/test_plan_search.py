"""The DP is exact (equals brute force), plans round-trip, and the classic cases come out right."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

from loomrl.errors import PlanError
from loomrl.plan import (
    Plan,
    evaluate,
    exhaustive,
    fixed_plan,
    leaf,
    load_profile,
    plan_for_mode,
    search,
    search_all,
    spatial,
    temporal,
)
from loomrl.plan.search import exhaustive_times

sys.path.insert(0, str(Path(__file__).parent))
from _plan_random import random_profile  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "profiles"


def _instances(seed: int, count: int):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        v = int(rng.integers(1, 5))
        n = int(rng.integers(1, 13 if v < 4 else 7))
        yield random_profile(
            rng,
            v,
            n,
            dag=bool(rng.random() < 0.4),
            cycle=bool(rng.random() < 0.25),
            cores=bool(rng.random() < 0.25),
        )


def _ring_groups(node, batch: int, m: int, stream: bool = False):
    """(items, k) of every split cycle in a plan tree: a cycle below a spatial node handles a
    micro-batch of m items at a time, elsewhere the whole batch."""
    if node.op == "cycle" and node.split is not None:
        yield (m if stream else batch), node.groups
    for c in node.children:
        yield from _ring_groups(c, batch, m, stream or node.op == "spatial")


def _dp_times(prof):
    try:
        plans = search_all(prof)
    except PlanError:
        return {k: None for k in ("best", "temporal", "spatial", "hybrid")}, {}
    return {k: (p.predicted_s if p else None) for k, p in plans.items()}, plans


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dp_equals_exhaustive_on_random_instances(seed):
    """>= 300 random chains / DAGs / cycles with memory and core caps, every mode."""
    checked = infeasible = 0
    for prof in _instances(seed, 100):
        dp, plans = _dp_times(prof)
        ex = exhaustive_times(prof)
        for mode in dp:
            if ex[mode] is None:
                assert dp[mode] is None, (mode, prof)
                infeasible += 1
            else:
                assert dp[mode] == pytest.approx(ex[mode], rel=1e-9, abs=1e-12), (mode, prof)
        for plan in plans.values():
            if plan is not None:  # the returned tree really costs what the DP said
                assert evaluate(plan.tree, prof, plan.micro_batch).predicted_s == pytest.approx(
                    plan.predicted_s, rel=1e-12
                )
                for items, k in _ring_groups(plan.tree, prof.batch, plan.micro_batch):
                    assert k in prof.cycles[0].group_counts(items), (plan, prof)
        checked += 1
    assert checked == 100 and infeasible > 0


search_mod = importlib.import_module("loomrl.plan.search")


def _assert_same_times(got: dict, want: dict, prof) -> None:
    for mode in want:
        if want[mode] is None:
            assert got[mode] is None, (mode, prof)
        else:
            assert got[mode] == pytest.approx(want[mode], rel=1e-9, abs=1e-12), (mode, prof)


@pytest.mark.parametrize("poor_scout", [False, True])
def test_dense_path_equals_exhaustive(monkeypatch, poor_scout):
    """Every instance takes the many-counts path: the scout's grids and zoom, the bound's
    windows of pairs and the co-resident rule; still equal to brute force. A scout that keeps
    only the smallest count of each node (poor bounds, or none) must not change the result."""
    monkeypatch.setattr(search_mod, "_DENSE_OPTIONS", 0)
    monkeypatch.setattr(search_mod, "_ALL_PAIRS", 0)
    monkeypatch.setattr(search_mod, "_NARROW_ABOVE", 0)
    monkeypatch.setattr(search_mod, "_REFINE_ABOVE", 0)
    if poor_scout:
        monkeypatch.setattr(search_mod, "_spread", lambda counts, n: frozenset(counts[:1]))
    for prof in _instances(7 if poor_scout else 8, 120):
        dp, plans = _dp_times(prof)
        _assert_same_times(dp, exhaustive_times(prof), prof)
        for plan in plans.values():
            if plan is not None:
                assert evaluate(plan.tree, prof, plan.micro_batch).predicted_s == pytest.approx(
                    plan.predicted_s, rel=1e-12
                )


def _unbounded_times(monkeypatch, prof) -> dict:
    """The plain DP: no scout, no bound, every pair made."""
    with monkeypatch.context() as mp:
        mp.setattr(search_mod, "_scout", lambda dp, grans: (np.full(2, np.inf), []))
        mp.setattr(search_mod, "_ALL_PAIRS", 1 << 62)
        mp.setattr(search_mod._DP, "_hybrid", lambda self, s, out, F, *a: np.ones(len(F), bool))
        return _dp_times(prof)[0]


def test_dense_search_equals_unbounded_dp(monkeypatch):
    """Larger instances with most device counts valid (beyond brute force): the search with
    its scout and bounds equals the plain DP in every mode."""
    rng = np.random.default_rng(11)
    for _ in range(12):
        v = int(rng.integers(2, 5))
        prof = random_profile(
            rng,
            v,
            int(rng.integers(24, 72)),
            dag=bool(rng.random() < 0.4),
            cycle=bool(rng.random() < 0.3),
            cores=bool(rng.random() < 0.25),
            dense=True,
        )
        _assert_same_times(_dp_times(prof)[0], _unbounded_times(monkeypatch, prof), prof)


def _chain3_on_96(comps: dict) -> object:
    """rollout -> inference -> actor with these components' costs, on 96 devices."""
    return load_profile(
        {
            "devices": 96,
            "device_memory_gb": 80,
            "batch": 512,
            "granularities": [1, 4, 16, 64, 256, 512],
            "components": comps,
            "edges": [["rollout", "inference"], ["inference", "actor"]],
        }
    )


@pytest.mark.parametrize("jitter", [0.0, 0.3])
def test_dense_chain_every_count_equals_unbounded_dp(monkeypatch, jitter):
    """The benchmark's 3-chain with every count 1..96 valid, with smooth costs and with each
    count's cost off the curve by up to 30% (the scout then also tries every count faster
    than all smaller ones, ``stair_grid``)."""
    valid = list(range(1, 97))
    rng = np.random.default_rng(5)
    off = {d: 1 + jitter * rng.uniform(-1, 1) for d in valid}
    stairs = []
    real = search_mod._DP.stair_grid

    def spy(self, grid):
        out = real(self, grid)
        stairs.append((self, out))
        return out

    monkeypatch.setattr(search_mod._DP, "stair_grid", spy)
    comps = {
        name: {
            "valid_devices": valid,
            "time": {"alpha": a, "per_item": {d: sc * d**-0.9 * off[d] for d in valid}},
            "memory_gb": {d: 10 + mm / d for d in valid},
            "switch_s": sw,
        }
        for name, a, sc, mm, sw in (
            ("rollout", 0.5, 400, 300, 3.0),
            ("inference", 0.1, 60, 200, 1.0),
            ("actor", 0.3, 200, 400, 4.0),
        )
    }
    prof = _chain3_on_96(comps)
    got = _dp_times(prof)[0]
    assert got["hybrid"] is not None and got["spatial"] is not None
    # smooth costs: every count is faster than the smaller ones, nothing to add
    assert stairs and all((g is None) == (jitter == 0.0) for _, g in stairs)
    mem = {"rollout": 300, "inference": 200, "actor": 400}
    for dp, grid in stairs if jitter else ():
        for i, node in enumerate(dp.graph.nodes):
            fits = [d for d in valid if 10 + mem[node.name] / d <= 80]  # the counts that fit
            t = [off[d] * d**-0.9 for d in fits]
            record = {d for j, d in enumerate(fits) if t[j] < min(t[:j], default=np.inf)}
            assert len(record) < len(fits) / 4 and record <= grid[i][0], node.name
    _assert_same_times(got, _unbounded_times(monkeypatch, prof), prof)


def test_flat_chain_equals_unbounded_dp_and_one_node_outside_shares_nothing(monkeypatch):
    """Costs that hardly change with the count (a fixed 0.3 s beside small per-item costs) make
    wide fronts. A point of two nodes of a 3-chain cannot share devices with the third below a
    spatial node (none is left to stand beside them), so that case bounds nothing there, and
    the search still equals the plain DP."""
    valid = list(range(1, 97))
    comps = {
        name: {
            "valid_devices": valid,
            "time": {"alpha": 0.3, "per_item": {d: b * d**-0.9 for d in valid}},
            "memory_gb": {d: 10 + 60 / d for d in valid},
            "switch_s": 1.0,
        }
        for name, b in (("rollout", 1.0), ("inference", 0.5), ("actor", 1.5))
    }
    prof = _chain3_on_96(comps)
    dp = search_mod._DP(prof, 96)
    dp.K = 1
    dp._lower_bounds(512)
    assert np.isinf(dp._outside(0b011)[5]).all() and np.isinf(dp._outside(0b110)[5]).all()
    assert np.isfinite(dp._outside(0b001)[5]).all()  # two nodes outside: they may share
    _assert_same_times(_dp_times(prof)[0], _unbounded_times(monkeypatch, prof), prof)


def test_exhaustive_plan_matches_search_on_example():
    prof = load_profile(EXAMPLES / "grpo_long_rollout.yaml", devices=4)
    a, b = search(prof), exhaustive(prof)
    assert a.predicted_s == pytest.approx(b.predicted_s)
    assert b.method == "exhaustive"


def test_classic_cases_from_example_profiles():
    grpo = search_all(load_profile(EXAMPLES / "grpo_long_rollout.yaml"))
    assert grpo["best"].mode == "temporal"
    ppo = search_all(load_profile(EXAMPLES / "ppo_actor_critic.yaml"))
    assert ppo["best"].mode == "spatial"
    assert ppo["best"].modes["temporal"] > 1.5 * ppo["best"].predicted_s
    emb = search_all(load_profile(EXAMPLES / "embodied_cycle_gpu_sim.yaml"))
    assert emb["best"].mode == "hybrid"
    cyc = [x for x in emb["best"].tree.leaves() if x.op == "cycle"][0]
    assert cyc.split is not None and cyc.groups >= 2
    cpu = search_all(load_profile(EXAMPLES / "embodied_cpu_sim.yaml"))
    assert cpu["best"].mode == "temporal"
    assert cpu["spatial"] is None  # the simulator takes every core: nothing can run beside it


def test_plan_fields_round_trip_and_assignment(tmp_path):
    prof = load_profile(EXAMPLES / "ppo_actor_critic.yaml")
    plan = search(prof)
    d = plan.to_dict()
    for key in ("predicted_s", "micro_batch", "tree", "assignment", "modes", "search_s"):
        assert key in d
    assert set(d["modes"]) == {"temporal", "spatial", "hybrid"}
    assert d["tree"]["op"] in ("leaf", "temporal", "spatial")
    assert {"op", "devices", "children"} <= set(d["tree"])
    used = [dev for devs in plan.assignment().values() for dev in devs]
    assert len(used) == len(set(used))  # spatial plan: disjoint devices
    for suffix in (".json", ".yaml"):
        path = tmp_path / f"plan{suffix}"
        plan.save(path)
        back = Plan.load(path)
        assert back == plan
        assert back.assignment() == plan.assignment()
    assert "spatial" in str(plan) and "rollout" in str(plan)


def test_plan_for_mode_and_fixed_plan():
    prof = load_profile(EXAMPLES / "grpo_long_rollout.yaml")
    for mode in ("temporal", "spatial", "hybrid"):
        p = plan_for_mode(prof, mode)
        assert p.mode == mode
        assert p.predicted_s == pytest.approx(p.modes[mode])
    n = prof.devices
    tree = temporal(leaf("rollout", n), temporal(leaf("logprob", n), leaf("actor", n)))
    fp = fixed_plan(prof, tree, prof.batch)
    assert fp.predicted_s == pytest.approx(search(prof, mode="temporal").predicted_s)
    with pytest.raises(PlanError, match="does not fit"):
        # co-resident rollout + logprob: 70 + 20 GB on one device
        fixed_plan(
            prof, spatial(temporal(leaf("rollout", 1), leaf("logprob", 1)), leaf("actor", 1)), 8
        )


def test_node_aligned_layout():
    raw = load_profile(EXAMPLES / "ppo_actor_critic.yaml").to_dict()
    raw["devices_per_node"] = 8
    plan = search(load_profile(raw))
    for comp, devs in plan.assignment().items():
        assert devs == list(range(devs[0], devs[0] + len(devs))), comp


def test_three_chain_1024_devices_equals_unbounded_dp(monkeypatch):
    """The speed benchmark's chain (its timing is in benchmarks/planner_speed.py)."""
    valid = [2**i for i in range(11)]
    comps = {
        name: {
            "valid_devices": valid,
            "time": {"alpha": a, "per_item": {d: s * d**-0.9 for d in valid}},
            "memory_gb": {d: 10 + mm / d for d in valid},
            "switch_s": 2.0,
        }
        for name, a, s, mm in (
            ("rollout", 0.5, 400, 300),
            ("inference", 0.1, 60, 200),
            ("actor", 0.3, 200, 400),
        )
    }
    prof = load_profile(
        {
            "devices": 1024,
            "device_memory_gb": 80,
            "batch": 512,
            "granularities": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
            "components": comps,
            "edges": [["rollout", "inference"], ["inference", "actor"]],
        }
    )
    got = _dp_times(prof)[0]
    assert got["best"] is not None and got["hybrid"] is not None
    _assert_same_times(got, _unbounded_times(monkeypatch, prof), prof)


def _points(rng, k: int, lattice: int, cores: bool):
    """k random stream points on a small lattice (ties and duplicates), mixed kinds."""
    col = lambda: rng.integers(0, lattice, k).astype(np.float64)  # noqa: E731
    i = np.zeros(k, dtype=np.int64)
    return search_mod._Points(
        col(),
        col(),
        col(),
        col() if cores else np.zeros(k),
        rng.integers(1, 64, k),
        rng.integers(0, 4, k),
        i,
        i,
        i,
        i,
    )


@pytest.mark.parametrize("k", [90, 300, 2500])
def test_pareto_front_equals_the_all_pairs_test(k):
    """The blocked front with its no-test shortcut keeps exactly what the all-pairs test keeps,
    on sets with ties, duplicates, four kinds, with and without cores, and leaf-like sets
    (faster and leaner on more devices: all on the front)."""
    rng = np.random.default_rng(k)
    for lattice, cores in ((4, False), (9, True), (40, False)):
        pts = _points(rng, k, lattice, cores)
        rows = [pts.F, pts.P, pts.mem] + ([pts.cores] if cores else []) + [pts.u.astype(float)]
        want = set(search_mod._pareto_matrix(rows, pts.kind).tolist())
        got = search_mod._pareto_idx(pts)
        assert set(got.tolist()) == want and len(got) == len(want), (k, lattice, cores)
    u = np.arange(1, k + 1)
    z = np.zeros(k, dtype=np.int64)
    t = 5.0 + 100.0 / u
    leafy = search_mod._Points(t, t, 10 + 50.0 / u, np.zeros(k), u, z, z, z, z, z)
    assert len(search_mod._pareto_idx(leafy)) == k


def test_leaf_option_arrays_equal_leaf_options():
    """The vectorised leaf options are the same floats, in the same order, as ``leaf_options``,
    with unsorted valid counts and with a long-tail term."""
    from loomrl.plan.cost import leaf_options

    valid = [6, 1, 4, 3, 12, 2]
    for cv in (0.0, 0.3):
        comp = load_profile(
            {
                "devices": 12,
                "device_memory_gb": 80,
                "batch": 8,
                "granularities": [1, 8],
                "components": {
                    "c": {
                        "valid_devices": valid,
                        "time": {
                            "alpha": 0.37,
                            "per_item": {d: 1.3 / d**0.7 for d in valid},
                            "item_cv": cv,
                        },
                        "memory_gb": {d: 3 + 9.0 / d for d in valid},
                        "cpu_cores": {d: 2 * d for d in valid},
                    }
                },
                "edges": [],
            }
        ).components["c"]
        assert comp.item_cv == cv
        for n, items in ((12, 8), (5, 1), (12, 3)):
            want = leaf_options(comp, n, items)
            got = search_mod._OptSet.leaf(comp, n, items)
            assert [got.option(j) for j in range(len(got))] == want
            assert got.time.tolist() == [o.time for o in want]
            assert got.used.tolist() == [o.used for o in want]


_PPO_NAMES = ["rollout", "reward", "ref", "value", "actor", "critic"]
_PPO_EDGES = [["rollout", x] for x in ("reward", "ref", "value")] + [
    ["reward", "actor"],
    ["ref", "actor"],
    ["value", "actor"],
    ["value", "critic"],
    ["reward", "critic"],
]


def test_scout_finds_plans_of_a_dense_six_node_graph():
    """The scout's few points per state are spread over device counts: kept by time alone,
    they all used the most devices, no two fitted side by side, and the scout found no
    spatial or hybrid plan to bound the exact pass with."""
    valid = list(range(1, 33))
    comps = {
        n: {
            "valid_devices": valid,
            "time": {"alpha": 0.2, "per_item": {d: (0.05 + 0.03 * i) * d**-0.5 for d in valid}},
            "memory_gb": {d: 42 + 30 / d for d in valid},
            "switch_s": 4.0,
        }
        for i, n in enumerate(_PPO_NAMES)
    }
    prof = load_profile(
        {
            "devices": 32,
            "device_memory_gb": 80,
            "batch": 256,
            "granularities": [16, 64, 256],
            "components": comps,
            "edges": _PPO_EDGES,
        }
    )
    dp = search_mod._DP(prof, 32)
    bounds, first = search_mod._scout(dp, [256, 64, 16])
    assert first and set(first) <= {256, 64, 16}
    assert np.isfinite(bounds).all(), bounds
    best = search_all(prof)
    assert bounds[0] >= best["spatial"].predicted_s * (1 - 1e-9)
    assert bounds[1] >= best["hybrid"].predicted_s * (1 - 1e-9)


def _ppo_graph(devices: int, cap: float, seed: int):
    """A 6-node PPO-shaped DAG with every count 1..devices valid."""
    rng = np.random.default_rng(seed)
    valid = list(range(1, devices + 1))
    comps = {}
    for n in _PPO_NAMES:
        scale, p, mem = rng.uniform(0.02, 0.3), rng.uniform(0.3, 0.9), rng.uniform(20, 45)
        comps[n] = {
            "valid_devices": valid,
            "time": {"alpha": 0.2, "per_item": {d: scale * d**-p for d in valid}},
            "memory_gb": {d: mem + 30 / d for d in valid},
            "switch_s": float(rng.uniform(0.5, 4.0)),
        }
    return load_profile(
        {
            "devices": devices,
            "device_memory_gb": cap,
            "batch": 1024,
            "granularities": [64, 256, 1024],
            "components": comps,
            "edges": _PPO_EDGES,
        }
    )


@pytest.mark.parametrize("cap", [80.0, 200.0])
def test_dense_dag_equals_unbounded_dp(monkeypatch, cap):
    """The hybrid bound's cases on a dense 6-node DAG: two outside nodes sharing devices (80
    GB: some pairs do not fit together; 200: all do) and a phase part no faster than the
    scout's plan of its sub-graph. Every mode equals the plain DP."""
    for seed in range(3):
        prof = _ppo_graph(12, cap, seed)
        got = _dp_times(prof)[0]
        assert got["hybrid"] is not None, seed
        _assert_same_times(got, _unbounded_times(monkeypatch, prof), prof)


def test_root_pairs_keep_hybrid_pairs_of_a_spatial_only_side(monkeypatch):
    """At the root, a point with no temporal placement paired with a co-resident one makes a
    hybrid plan: its window of pairs answers to the hybrid bound, not the spatial one (the
    hybrid optimum, c0 beside c1 and c2 sharing 3 devices, was lost with fewer points)."""
    monkeypatch.setattr(search_mod, "_DENSE_OPTIONS", 0)
    monkeypatch.setattr(search_mod, "_ALL_PAIRS", 0)
    monkeypatch.setattr(search_mod, "_NARROW_ABOVE", 0)
    monkeypatch.setattr(search_mod, "_REFINE_ABOVE", 0)
    prof = load_profile(
        {
            "devices": 4,
            "device_memory_gb": 52.36,
            "batch": 8,
            "granularities": [1, 2, 8],
            "components": {
                "c0": {
                    "valid_devices": [1],
                    "time": {"alpha": 0.257, "per_item": {1: 1.5411}},
                    "memory_gb": {1: 15.16},
                    "switch_s": 0.388,
                },
                "c1": {
                    "valid_devices": [2, 3, 4],
                    "time": {"alpha": 0.647, "per_item": {2: 1.0636, 3: 0.7683, 4: 0.61}},
                    "memory_gb": {2: 38.98, 3: 7.66, 4: 12.71},
                    "switch_s": 0.569,
                },
                "c2": {
                    "valid_devices": [1, 2, 4],
                    "time": {"alpha": 0.452, "per_item": {1: 1.3013, 2: 0.7431, 4: 0.4243}},
                    "memory_gb": {1: 38.4, 2: 12.21, 4: 6.18},
                    "switch_s": 0.659,
                },
            },
            "edges": [["c0", "c1"], ["c1", "c2"]],
        }
    )
    got = _dp_times(prof)[0]
    _assert_same_times(got, exhaustive_times(prof), prof)
    assert got["hybrid"] == pytest.approx(19.8264)


def test_search_reports_its_passes():
    """``progress`` hears of every pass, the scout first, ending at the total; the result is
    the same as without it."""
    prof = _ppo_graph(12, 80.0, 0)
    calls: list[tuple[int, int]] = []
    plans = search_all(prof, progress=lambda done, total: calls.append((done, total)))
    total = len(prof.granularities) + 1
    assert calls == [(i, total) for i in range(total + 1)]
    assert plans["best"].predicted_s == search_all(prof)["best"].predicted_s


def test_a_lone_component_has_only_a_temporal_plan():
    """A single leaf runs nothing side by side: ``mode_of`` calls it temporal, and no mode
    table may call it spatial too."""
    prof = load_profile(
        {
            "devices": 4,
            "device_memory_gb": 80,
            "batch": 8,
            "granularities": [2, 8],
            "components": {
                "c0": {
                    "valid_devices": [1, 2],
                    "time": {"alpha": 0.1, "per_item": {1: 1.0, 2: 0.6}},
                    "memory_gb": 10,
                }
            },
        }
    )
    plans = search_all(prof)
    assert plans["spatial"] is None and plans["hybrid"] is None
    assert plans["best"].mode == plans["temporal"].mode == "temporal"
    assert plans["best"].modes == {
        "temporal": plans["best"].predicted_s,
        "spatial": None,
        "hybrid": None,
    }
    with pytest.raises(PlanError, match="no spatial plan exists"):
        search(prof, mode="spatial")
    with pytest.raises(PlanError, match="no spatial plan exists"):
        exhaustive(prof, mode="spatial")
    assert exhaustive_times(prof)["spatial"] is None


def test_modes_and_brute_force_times_carry_the_iteration_overhead():
    raw = load_profile(EXAMPLES / "grpo_long_rollout.yaml", devices=4).to_dict()
    bare = search_all(load_profile(raw))
    raw["iteration_overhead_s"] = 0.5
    prof = load_profile(raw)
    plans = search_all(prof)
    for mode, t in plans["best"].modes.items():
        if t is None:
            assert plans[mode] is None
            continue
        assert t == plans[mode].predicted_s == pytest.approx(bare[mode].predicted_s + 0.5)
    assert plans["best"].predicted_s == min(t for t in plans["best"].modes.values() if t)
    ex = exhaustive_times(prof)
    for mode, plan in plans.items():
        assert (plan.predicted_s if plan else None) == pytest.approx(ex[mode])


def test_a_cycle_of_two_host_only_members_says_so():
    from loomrl.errors import PlanError
    from loomrl.plan import load_profile, search_all

    comp = {"valid_devices": [0], "time": {"per_item": {0: 1.0}}}
    raw = {
        "devices": 2,
        "device_memory_gb": 10,
        "batch": 4,
        "components": {"a": comp, "b": dict(comp)},
        "edges": [["a", "b"], ["b", "a"]],
        "cycles": [{"members": ["a", "b"], "steps": 2}],
    }
    with pytest.raises(PlanError, match="'a' and 'b' are both host-only"):
        search_all(load_profile(raw))


def test_next_better_is_the_nearest_later_point_as_good():
    """``_next_better`` against its definition: in order of u, the first of the next ``look``
    points that is <= in F, P, memory and cores (its u), else N + 1."""
    rng = np.random.default_rng(3)
    for lattice in (3, 12):
        pts = _points(rng, 400, lattice, cores=True)
        got = search_mod._next_better(pts, 64, look=32)
        order = np.argsort(pts.u, kind="stable")
        cols = np.stack([pts.F, pts.P, pts.mem, pts.cores])[:, order]
        for x, i in enumerate(order):
            want = next(
                (
                    int(pts.u[order[y]])
                    for y in range(x + 1, min(x + 33, len(order)))
                    if (cols[:, y] <= cols[:, x]).all()
                ),
                65,
            )
            assert got[i] == want, (lattice, i)


def test_alone_in_a_pair_of_rows_against_its_definition():
    """``_alone_in``: no other point of its kind is <= in both rows (ties, duplicates, inf)."""
    rng = np.random.default_rng(9)
    for _ in range(300):
        k = int(rng.integers(1, 40))
        a, b = (rng.integers(0, 5, k).astype(float) for _ in range(2))
        a[rng.random(k) < 0.1] = np.inf
        kind = rng.integers(0, 3, k)
        want = [
            not any(
                j != i and kind[j] == kind[i] and a[j] <= a[i] and b[j] <= b[i] for j in range(k)
            )
            for i in range(k)
        ]
        assert search_mod._alone_in(a, b, kind).tolist() == want


@pytest.mark.parametrize("k", [90, 300, 2500])
def test_pareto_front_order_is_the_tie_break(k):
    """``_pareto_idx`` returns the front in a fixed order, which decides ties downstream (the
    first of the fastest is kept): by index up to ``_BLOCK`` points, else by kind, then the
    rows (F, P, memory, cores, u), index last. Also for leaf-like sets whose P is F, where the
    search leaves the equal row out, and with irregular, tied times."""
    rng = np.random.default_rng(k + 1)
    u = rng.permutation(np.arange(1, k + 1))
    z = np.zeros(k, dtype=np.int64)
    t = np.round((5.0 + 100.0 / u) * rng.uniform(0.7, 1.3, k), 1)  # off the curve, with ties
    leafy = search_mod._Points(t, t, np.round(10 + 50.0 / u, 1), np.zeros(k), u, z, z, z, z, z)
    sets = [leafy, _points(rng, k, 5, False), _points(rng, k, 9, True)]
    for pts in sets:
        rows = [pts.F, pts.P, pts.mem] + ([pts.cores] if pts.cores.any() else [])
        rows.append(pts.u.astype(float))
        front = set(search_mod._pareto_matrix(rows, pts.kind).tolist())
        if k <= search_mod._BLOCK:
            want = sorted(front)
        else:
            order = np.lexsort(tuple(reversed(rows)) + (pts.kind,))
            want = [int(i) for i in order if int(i) in front]
        assert search_mod._pareto_idx(pts).tolist() == want


def test_next_better_on_irregular_leaves_and_tiny_sets():
    """``_next_better`` against its definition where the next count is rarely as good (a
    leaf's irregular times, P is F, no cores) and on sets of one to three points."""
    rng = np.random.default_rng(4)
    cases = []
    for k in (1, 2, 3, 700):
        u = rng.permutation(np.arange(1, k + 1))
        z = np.zeros(k, dtype=np.int64)
        t = np.round((5.0 + 100.0 / u) * rng.uniform(0.7, 1.3, k), 1)
        mem = np.round(10 + 50.0 / u, 1)
        cases.append(search_mod._Points(t, t, mem, np.zeros(k), u, z, z, z, z, z))
    for pts in cases:
        for look in (1, 2, 32):
            got = search_mod._next_better(pts, 800, look=look)
            order = np.argsort(pts.u, kind="stable")
            cols = np.stack([pts.F, pts.mem])[:, order]
            for x, i in enumerate(order):
                want = next(
                    (
                        int(pts.u[order[y]])
                        for y in range(x + 1, min(x + 1 + look, len(order)))
                        if (cols[:, y] <= cols[:, x]).all()
                    ),
                    801,
                )
                assert got[i] == want, (len(pts), look, i)
            pts.__dict__.pop("_next_better")  # cached per set: recompute for the next look


def test_scout_grid_keeps_exactly_the_options_on_it():
    """Under a scout grid each node keeps exactly its options whose device counts are on the
    grid (split cycles: both counts), in their order; lifting the grid restores them all."""
    rng = np.random.default_rng(8)

    def options(dp, i, items):
        """Every fitting option of node i (a cycle's: all of its space's, not its summary)."""
        if not dp.graph.nodes[i].is_cycle:
            return dp._node_opts(i, items)
        space = dp._cycle_space(i, items)
        return search_mod._OptSet.cycle(space, *space.passing(lambda F, u, m: F == F))

    def specs(opts, sel=None):
        return [opts.option(j).spec for j in (range(len(opts)) if sel is None else sel)]

    for seed in range(20):
        prof = random_profile(np.random.default_rng(seed), 3, 12, cycle=True, dense=True)
        dp = search_mod._DP(prof, 12)
        every = {i: options(dp, i, prof.batch) for i in range(len(dp.graph))}
        summary = {i: dp._node_opts(i, prof.batch) for i in range(len(dp.graph))}
        grid = {
            i: [frozenset(int(x) for x in rng.choice(13, 5, replace=False)) for _ in (0, 1)]
            for i in every
        }
        dp.use_grid(grid)
        for i, opts in every.items():
            ok = np.ones(len(opts), dtype=bool)
            for p in (0, 1):
                col = opts.counts[:, p]
                ok &= (col < 0) | np.isin(col, sorted(grid[i][p]))
            got = options(dp, i, prof.batch)
            assert specs(got) == specs(opts, np.flatnonzero(ok)), (seed, i)
        dp.use_grid(None)
        assert all(dp._node_opts(i, prof.batch) is summary[i] for i in every)


def test_pairs_are_made_and_tested_in_chunks_with_the_same_plans(monkeypatch):
    """A pairing of two point sets lists and tests its pairs a chunk at a time (the pairs of a
    dense 5-node graph at 512 devices took 5 GB listed at once), and the plans come out the
    same as with every pairing in one chunk: the same points, in the same order."""

    def plans() -> dict:
        out = search_all(_ppo_graph(16, 80.0, 1))
        return {k: p.to_dict() | {"search_s": 0} for k, p in out.items() if p is not None}

    with monkeypatch.context() as mp:
        mp.setattr(search_mod, "_PAIR_CHUNK", 1 << 62, raising=False)
        want = plans()
    chunk, made, tested = 256, [], []
    pairs, keep = search_mod._DP._pairs, search_mod._DP._keep

    def spy_pairs(self, A, B, s, spatial):
        sizes = [ia.size for ia, _ in pairs(self, A, B, s, spatial)]
        # a chunk holds whole rows of pairs: one may hold a single row of more
        made.append((sum(sizes), max(sizes, default=0), max(chunk, len(A), len(B))))
        yield from pairs(self, A, B, s, spatial)

    def spy_keep(self, s, F, *rest):
        tested.append(len(F))
        return keep(self, s, F, *rest)

    monkeypatch.setattr(search_mod, "_PAIR_CHUNK", chunk, raising=False)
    monkeypatch.setattr(search_mod._DP, "_pairs", spy_pairs)
    monkeypatch.setattr(search_mod._DP, "_keep", spy_keep)
    got = plans()
    assert max(total for total, _, _ in made) > 8 * chunk  # pairings of many chunks
    assert all(largest <= most for _, largest, most in made)
    assert max(tested) <= max(most for _, _, most in made)
    assert got == want


@pytest.mark.parametrize("lattice", [5, 40, 1000])
def test_dominated_early_marks_only_dominated_points(monkeypatch, lattice):
    """``_dominated_early`` (small chunks and few buckets, so that tables do the work): every
    point it marks has an earlier point of its kind <= in every row, it finds most such
    points, and ``_pareto_idx`` with it returns the same front in the same order (ties and
    duplicates on the small lattices, four kinds)."""
    monkeypatch.setattr(search_mod, "_TABLE_CHUNK", 16)
    monkeypatch.setattr(search_mod, "_TABLE_BUCKETS", 8)
    rng = np.random.default_rng(lattice)
    k = 1500
    pts = _points(rng, k, lattice, False)
    rows = [pts.F, pts.P, pts.mem, pts.u.astype(float)]
    order = np.lexsort(tuple(reversed(rows)) + (pts.kind,))
    X, kd = np.stack(rows)[:, order], pts.kind[order]
    le = (X[:, None, :] <= X[:, :, None]).all(axis=0)  # [i, j]: j <= i in every row
    le &= (kd[None, :] == kd[:, None]) & np.tri(k, k=-1, dtype=bool)  # j earlier, same kind
    dominated = le.any(axis=1)
    got = search_mod._dominated_early(X, kd)
    assert not (got & ~dominated).any()
    assert got.sum() >= 0.5 * dominated.sum(), (got.sum(), dominated.sum())
    with monkeypatch.context() as mp:
        mp.setattr(search_mod, "_TABLE_ABOVE", 1 << 62)
        want = search_mod._pareto_idx(pts)
    monkeypatch.setattr(search_mod, "_TABLE_ABOVE", 0)
    assert search_mod._pareto_idx(pts).tolist() == want.tolist()


# 60, as 200 did: the set with cores has too many cells for the cube (60^3 x 63 > _CUBE_CELLS),
# so its tables work alone; 12 has a cube for every set. (200 took 12 s for the same paths.)
@pytest.mark.parametrize("lattice", [3, 12, 60])
def test_front_by_ranks_is_the_blocked_front(monkeypatch, lattice):
    """``_front_by_ranks`` (exact tables by rank; chunks of 4 to 32 points, so that the tables
    and the within-chunk test both do work; with its cube and without) returns
    ``_pareto_idx``'s blocked front in its order: ties and duplicates on the small lattices,
    four kinds, with and without cores, and leaf-like sets whose P is F."""
    rng = np.random.default_rng(lattice)
    k = 1200
    u = rng.permutation(np.arange(1, k + 1)) % 97 + 1
    z = np.zeros(k, dtype=np.int64)
    t = np.round((5.0 + 100.0 / u) * rng.uniform(0.7, 1.3, k), 1)
    leafy = search_mod._Points(t, t, np.round(10 + 50.0 / u, 1), np.zeros(k), u, z, z, z, z, z)
    sets = [leafy, _points(rng, k, lattice, False), _points(rng, k, lattice, True)]
    monkeypatch.setattr(search_mod, "_EXACT_PER_POINT", 1 << 30)  # tables however sparse
    monkeypatch.setattr(search_mod, "_CUBE_PER_POINT", 1 << 30)
    for chunk, cube in ((4, 1 << 23), (32, 1 << 23), (4, 0)):  # cube 0: the sweep alone
        monkeypatch.setattr(search_mod, "_EXACT_CHUNK", chunk)
        monkeypatch.setattr(search_mod, "_CUBE_CELLS", cube)
        for pts in sets:
            with monkeypatch.context() as mp:
                mp.setattr(search_mod, "_EXACT_ABOVE", 1 << 62)
                want = search_mod._pareto_idx(pts)
            rows = [pts.F] + ([] if pts.P is pts.F else [pts.P]) + [pts.mem]
            rows += ([pts.cores] if pts.cores.any() else []) + [pts.u.astype(float)]
            got = search_mod._front_by_ranks(rows, pts.kind)
            assert got is not None and got.tolist() == want.tolist(), (lattice, chunk)
            monkeypatch.setattr(search_mod, "_EXACT_ABOVE", 0)
            assert search_mod._pareto_idx(pts).tolist() == want.tolist()
            monkeypatch.setattr(search_mod, "_EXACT_ABOVE", 4096)


def test_front_by_ranks_declines_tables_too_large():
    """Rows of many distinct values would need a table of more than ``_EXACT_CELLS`` cells:
    ``_front_by_ranks`` declines (None) and ``_pareto_idx`` takes its blocked test."""
    rng = np.random.default_rng(5)
    k = 5000
    rows = [rng.random(k), rng.random(k), rng.random(k), rng.integers(1, 4000, k).astype(float)]
    assert search_mod._front_by_ranks(rows, np.zeros(k, dtype=np.int64)) is None


def test_first_of_chunk_against_its_definition(monkeypatch):
    """``_first_of_chunk``: no earlier column <= in every row (blocks of 8 columns, ties)."""
    monkeypatch.setattr(search_mod, "_EXACT_CHUNK", 8)
    rng = np.random.default_rng(2)
    for _ in range(50):
        c = int(rng.integers(1, 40))
        rows = rng.integers(0, 4, (3, c)).astype(float)
        want = [not any((rows[:, j] <= rows[:, i]).all() for j in range(i)) for i in range(c)]
        assert search_mod._first_of_chunk(rows).tolist() == want


def test_first_is_the_first_position_a_test_holds():
    """``_first``: per row, the first j in [lo, hi) from which a monotone test holds, else hi."""
    rng = np.random.default_rng(6)
    lo = rng.integers(0, 30, 200)
    hi = lo + rng.integers(-3, 30, 200)  # some empty windows
    start = rng.integers(-5, 70, 200)  # the test holds from here on
    got = search_mod._first(lo, hi, lambda i, j: j >= start[i])
    want = [
        max(a, min(max(s, a), b)) if a < b else a for a, b, s in zip(lo, hi, start, strict=True)
    ]
    assert got.tolist() == want


@pytest.mark.parametrize("K", [1, 4])
def test_narrow_drops_only_pairs_over_the_limit(monkeypatch, K):
    """``_narrow`` (a spatial pairing's window in B's order of u): every pair it drops from a
    window has F + total[u] + (K-1) max(P, slowest[u]) above the row's limit, as ``_beside``
    sums it (ties, infinite calls on few devices, empty windows), and it drops most of them."""
    monkeypatch.setattr(search_mod, "_NARROW_ABOVE", 0)  # however small the window
    rng = np.random.default_rng(K)
    N, dropped, over = 60, 0, 0
    for _ in range(40):
        A, B = (_points(rng, int(rng.integers(1, 60)), 9, False) for _ in range(2))
        for X in (A, B):
            X.u = rng.integers(1, 30, len(X))
            X.P = np.minimum(X.P, X.F)  # a stream point's P is at most its F
        total = np.sort(rng.integers(0, 8, N + 1).astype(float))
        slowest = np.sort(rng.integers(0, 5, N + 1).astype(float))
        total[N - int(rng.integers(0, 5)) :] = np.inf  # no call on the fewest devices
        order, Bu, _ = search_mod._by_u(B)
        lo = np.zeros(len(A), dtype=np.int64)
        hi = np.searchsorted(Bu, N - A.u, side="right")
        L = rng.uniform(5, 40, len(A))
        nlo, nhi = search_mod._narrow(lo, hi, A, B, K, L, total, slowest)
        for i in range(len(A)):
            for j in range(lo[i], hi[i]):
                b = order[j]
                u = A.u[i] + B.u[b]
                val = (A.F[i] + B.F[b]) + total[u]
                if K > 1:
                    val = val + (K - 1) * max(A.P[i], B.P[b], slowest[u])
                over += val > L[i]
                if not nlo[i] <= j < nhi[i]:
                    dropped += 1
                    assert val > L[i], (i, j)
    assert dropped >= 0.5 * over, (dropped, over)


def test_chunk_fronts_leave_the_front_and_its_order():
    """Pairs kept a chunk at a time, each chunk cut to its own front (``_chunk_front``), give
    the same front, in the same order, as all of them at once (row-major order, ties and
    duplicates on a small lattice, four kinds), when the front of what is left is taken in
    the order of as many points as passed (``lex``: fronts of fewer than ``_BLOCK`` points
    come in index order)."""
    rng = np.random.default_rng(12)
    nA, nB, small = 40, 50, 0
    for _ in range(20):
        pairs = rng.permutation(nA * nB)[: int(rng.integers(200, 1500))]  # any order, as windows
        ia, ib = np.divmod(pairs, nB)
        k = len(ia)
        F, P, mem = (rng.integers(0, 5, k).astype(float) for _ in range(3))
        got = (ia, ib, F, P, mem, np.zeros(k), rng.integers(1, 9, k), rng.integers(0, 4, k))

        def front(parts, k=k):
            x = [np.concatenate(c) for c in zip(*parts, strict=True)]
            order = np.argsort(x[0] * nB + x[1])
            x = [c[order] for c in x]
            z = np.zeros(len(x[0]), dtype=np.int64)
            pts = search_mod._Points(x[2], x[3], x[4], x[5], x[6], x[7], z, z, z, z)
            keep = search_mod._pareto_idx(pts, lex=k > search_mod._BLOCK)
            return list(zip(x[0][keep].tolist(), x[1][keep].tolist(), strict=True))

        chunks = np.array_split(np.arange(k), int(rng.integers(1, 8)))
        parts = [tuple(c[idx] for c in got) for idx in chunks]
        cut = [search_mod._chunk_front(p, nB) for p in parts]
        left = sum(len(c[0]) for c in cut)
        assert left < k
        small += left <= search_mod._BLOCK < k  # the case of the order
        assert front(cut) == front(parts)
    assert small >= 5
