"""PLANNER.md read sentence by sentence, checked from outside: the cost algebra re-derived here
from the text alone (not from loomrl.plan.cost), the JSON output's fields and types, plan files
that load back to the same plan, and one-line errors with exit status 2 on bad input."""

from __future__ import annotations

import functools
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from loomrl.plan import Plan, exhaustive, fixed_plan, load_profile, search_all
from loomrl.plan.cli import plan_main

sys.path.insert(0, str(Path(__file__).parent))
from _plan_random import random_profile  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "profiles"
MODES = ("temporal", "spatial", "hybrid")


# ----------------------------------------------------------------- the algebra, from the text


def _cuts(s: frozenset, edges) -> list[frozenset]:
    """Upstream sides A of s: non-empty proper subsets with every edge between A and s \\ A going
    from A to B."""
    out = []
    items = sorted(s)
    for r in range(1, len(items)):
        for a in itertools.combinations(items, r):
            a = frozenset(a)
            b = s - a
            if not any(x in b and y in a for x, y in edges):
                out.append(a)
    return out


def _mode(kinds: frozenset) -> str:
    if kinds == {"T", "S"}:
        return "hybrid"
    return "spatial" if kinds == {"S"} else "temporal"


def reference(prof) -> dict[str, float | None]:
    """Best predicted seconds per mode and overall by brute force over every plan PLANNER.md
    allows (declared 2-cycles in the baseline model only): Leaf on any valid n' <= n that fits, Temporal on the same
    devices, Spatial on n_A + n_B = n, every s-t cut and every m."""
    comps, edges = prof.components, prof.edges
    cap = prof.device_memory_gb
    core_cap = math.inf if prof.cpu_cores_per_node is None else prof.cpu_core_budget
    M = prof.batch

    def fits(mem, cores):
        return mem <= cap + 1e-9 and cores <= core_cap + 1e-9

    def t(c, n, x):
        return comps[c].alpha + x * comps[c].per_item[n]

    # A declared 2-cycle is one node named 'a<->b', which takes part in cuts like a leaf.
    cycles = {f"{c.members[0]}<->{c.members[1]}": c for c in prof.cycles}
    owner = {m: name for name, c in cycles.items() for m in c.members}
    nodes = frozenset(owner.get(c, c) for c in comps)
    edges = {(owner.get(a, a), owner.get(b, b)) for a, b in edges}
    edges = {(a, b) for a, b in edges if a != b}
    switches = {x: sum(comps[c].switch_s for c in cycles[x].members) for x in cycles}
    switches.update({c: comps[c].switch_s for c in comps if c not in owner})

    def cycle_opts(name, n, x):
        """PLANNER.md's baseline 2-cycle model on x items: co-located on n' devices valid for
        both (S (t_A + t_B)), or split n_A + n_B <= n in k groups (k divides x)."""
        cyc = cycles[name]
        a, b = cyc.members
        S = cyc.steps
        for v in comps[a].valid_devices:
            if 1 <= v <= n and v in comps[b].valid_devices:
                mem = comps[a].memory_gb[v] + comps[b].memory_gb[v]  # both stay resident
                yield S * (t(a, v, x) + t(b, v, x)), mem, 0, frozenset({"T"})
        for na in comps[a].valid_devices:
            for nb in comps[b].valid_devices:
                if not 1 <= na + nb <= n:
                    continue
                mem = max(comps[a].memory_gb[na], comps[b].memory_gb[nb])
                for k in range(1, int(x) + 1):
                    if x % k:
                        continue
                    if k == 1:
                        yield S * (t(a, na, x) + t(b, nb, x)), mem, 0, frozenset({"S"})
                        continue
                    ta, tb = t(a, na, x / k), t(b, nb, x / k)
                    yield S * k * max(ta, tb) + min(ta, tb), mem, 0, frozenset({"S"})

    def leaf(c, n, x):
        """(seconds, memory, cores, kinds) of each way to run graph node c on n devices."""
        if c in cycles:
            yield from (o for o in cycle_opts(c, n, x) if fits(o[1], o[2]))
            return
        comp = comps[c]
        for v in comp.valid_devices:
            if 1 <= v <= n:
                mem, cores = comp.memory_gb[v], comp.cores(v)
                if fits(mem, cores):
                    yield comp.alpha + x * comp.per_item[v], mem, cores, frozenset()

    @functools.cache
    def stream(s, n, m):
        """(F, P, memory, cores, kinds) of every stream-context subtree of s on n devices."""
        out = set()
        if len(s) == 1:
            (c,) = s
            return {(x, x, mem, cores, k) for x, mem, cores, k in leaf(c, n, m)}
        for a in _cuts(s, edges):
            b = s - a
            for na in range(1, n):
                for fa, pa, ma, ca, ka in stream(a, na, m):
                    for fb, pb, mb, cb, kb in stream(b, n - na, m):
                        v = (fa + fb, max(pa, pb), max(ma, mb), ca + cb, ka | kb | {"S"})
                        if fits(v[2], v[3]):
                            out.add(v)
            for fa, pa, ma, ca, ka in stream(a, n, m):  # co-resident, alternating
                for fb, pb, mb, cb, kb in stream(b, n, m):
                    v = (fa + fb, pa + pb, ma + mb, max(ca, cb), ka | kb | {"T"})
                    if fits(v[2], v[3]):
                        out.add(v)
        return out

    def phase(s, n, m):
        """(T, switches paid, kinds) of every phase-context subtree of s on n devices."""
        out = set()
        if len(s) == 1:
            (c,) = s
            return {(x, 0.0, k) for x, _, _, k in leaf(c, n, M)}
        K = M // m
        for a in _cuts(s, edges):
            b = s - a
            for ta, _, ka in phase(a, n, m):
                for tb, _, kb in phase(b, n, m):
                    # every leaf below a phase-context temporal node pays its switch once
                    paid = sum(switches[c] for c in s)
                    out.add((ta + tb, paid, ka | kb | {"T"}))
        # a spatial root of s: the stream results whose top node is spatial
        for a in _cuts(s, edges):
            b = s - a
            for na in range(1, n):
                for fa, pa, ma, ca, ka in stream(a, na, m):
                    for fb, pb, mb, cb, kb in stream(b, n - na, m):
                        if fits(max(ma, mb), ca + cb):
                            f, p = fa + fb, max(pa, pb)
                            out.add((f + (K - 1) * p, 0.0, ka | kb | {"S"}))
        return out

    best: dict[str, float | None] = {k: None for k in ("best", *MODES)}
    for m in prof.granularities:
        for x, paid, kinds in phase(nodes, prof.devices, m):
            total = x + paid + prof.iteration_overhead_s
            for mode in ("best", _mode(kinds)):
                if best[mode] is None or total < best[mode]:
                    best[mode] = total
    return best


def evaluate_tree(d: dict, prof, m: int) -> tuple[float, float]:
    """(predicted seconds, resident memory) of a plan's JSON tree by PLANNER.md's algebra, and
    its structure checked: leaves on a valid count that fits, spatial children on disjoint
    devices inside their parent's, temporal children on their parent's, cuts downstream."""
    M, K = prof.batch, prof.batch // m
    edges = prof.edges

    def comps_of(t):
        if t["op"] == "leaf":
            return {t["component"]}
        return set().union(*(comps_of(c) for c in t["children"]))

    def t_of(t, x):
        comp = prof.components[t["component"]]
        v = t["used"]
        assert v in comp.valid_devices and v <= t["n"], t
        assert t["devices"] == list(range(t["devices"][0], t["devices"][0] + v)), t
        return comp.alpha + x * comp.per_item[v], comp.memory_gb[v]

    def check_node(t):
        a, b = t["children"]
        ca, cb = comps_of(a), comps_of(b)
        assert not any(x in cb and y in ca for x, y in edges), "a cut against the edges"
        mine = set(t["devices"])
        da, db = set(a["devices"]), set(b["devices"])
        assert da <= mine and db <= mine, t
        if t["op"] == "spatial":
            assert not da & db, "spatial children share devices"
        return a, b

    def stream(t):
        if t["op"] == "leaf":
            x, mem = t_of(t, m)
            return x, x, mem
        a, b = check_node(t)
        fa, pa, ma = stream(a)
        fb, pb, mb = stream(b)
        if t["op"] == "spatial":
            return fa + fb, max(pa, pb), max(ma, mb)
        return fa + fb, pa + pb, ma + mb

    def phase(t):
        if t["op"] == "leaf":
            return t_of(t, M)
        if t["op"] == "spatial":
            f, p, mem = stream(t)
            return f + (K - 1) * p, mem
        a, b = check_node(t)
        (ta, ma), (tb, mb) = phase(a), phase(b)
        return ta + tb, max(ma, mb)

    t, mem = phase(d)
    assert mem <= prof.device_memory_gb + 1e-9
    if d["op"] == "temporal":
        t += sum(c.switch_s for c in prof.components.values())
    return t + prof.iteration_overhead_s, mem


def _random_raw(rng: np.random.Generator, cycle: bool = False) -> dict:
    v = int(rng.integers(1, 5))
    n = int(rng.integers(1, {1: 6, 2: 6, 3: 5, 4: 4}[v]))
    batch = int(rng.choice([2, 4, 6]))
    names = [f"c{i}" for i in range(v)]
    comps = {}
    for name in names:
        valid = sorted(
            {
                int(x)
                for x in rng.integers(1, n + 1 + (rng.random() < 0.2), size=int(rng.integers(1, 4)))
            }
        )
        comps[name] = {
            "valid_devices": valid,
            "time": {
                "alpha": round(float(rng.uniform(0, 1)), 2),
                # not monotone in the count on purpose: more devices may be slower
                "per_item": {d: round(float(rng.uniform(0.1, 3)), 2) for d in valid},
            },
            "memory_gb": {d: round(float(rng.uniform(1, 45)), 1) for d in valid},
            "switch_s": round(float(rng.uniform(0, 1.5)), 2),
        }
        if rng.random() < 0.3:
            comps[name]["cpu_cores"] = {d: int(rng.integers(0, 6)) for d in valid}
    edges = [[a, b] for a, b in itertools.combinations(names, 2) if rng.random() < 0.6]
    raw = {
        "devices": n,
        "device_memory_gb": round(float(rng.uniform(30, 100)), 1),
        "batch": batch,
        "granularities": [g for g in (1, 2, 3, 6, 4) if batch % g == 0][: int(rng.integers(1, 4))]
        or [batch],
        "components": comps,
        "edges": edges,
    }
    if rng.random() < 0.3:
        raw["cpu_cores_per_node"] = int(rng.integers(4, 12))
    if rng.random() < 0.2:
        raw["iteration_overhead_s"] = 0.5
    if cycle and v >= 2:  # the last two components: a 2-cycle of 1-3 steps
        a, b = names[-2], names[-1]
        raw["edges"] = [e for e in edges if set(e) != {a, b}] + [[a, b], [b, a]]
        raw["cycles"] = [{"members": [a, b], "steps": int(rng.integers(1, 4))}]
        for c in (a, b):
            comps[c].pop("cpu_cores", None)  # cores of a cycle: not in the baseline
        raw.pop("cpu_cores_per_node", None)
    return raw


@pytest.mark.parametrize("seed", range(80))
def test_search_equals_the_algebra_read_from_the_contract(seed):
    """The DP and --exhaustive agree with a brute force written from PLANNER.md's text alone,
    per mode; every returned plan's tree costs what the plan says by the same text."""
    prof = load_profile(_random_raw(np.random.default_rng(1000 + seed)))
    want = reference(prof)
    try:
        plans = search_all(prof)
    except Exception as e:  # noqa: BLE001 - only "no plan fits" is allowed, and only then
        assert want["best"] is None, (e, want)
        return
    for mode in ("best", *MODES):
        p = plans[mode]
        assert (p is None) == (want[mode] is None), (mode, p, want)
        if p is None:
            continue
        assert p.predicted_s == pytest.approx(want[mode], rel=1e-9, abs=1e-12), mode
        if mode != "best":
            assert p.mode == mode
            assert p.modes[mode] == pytest.approx(p.predicted_s)
        got, mem = evaluate_tree(p.to_dict()["tree"], prof, p.micro_batch)
        assert got == pytest.approx(p.predicted_s, rel=1e-9, abs=1e-12), mode
        assert mem == pytest.approx(p.memory_gb)
    ex = exhaustive(prof)
    assert ex.predicted_s == pytest.approx(want["best"], rel=1e-9, abs=1e-12)


def test_the_reference_itself_on_a_hand_computed_case():
    """Two components A -> B on 2 devices, batch 4: temporal on both devices 5 + 2 + switches
    0.75 = 7.75; spatial 1 + 1 at m = 1: F = 3 + 1, P = 3, T = 4 + 3 * 3 = 13."""
    prof = load_profile(
        {
            "devices": 2,
            "device_memory_gb": 80,
            "batch": 4,
            "granularities": [1, 4],
            "components": {
                "A": {
                    "valid_devices": [1, 2],
                    "time": {"alpha": 1, "per_item": {1: 2, 2: 1}},
                    "switch_s": 0.5,
                },
                "B": {
                    "valid_devices": [1, 2],
                    "time": {"per_item": {1: 1, 2: 0.5}},
                    "switch_s": 0.25,
                },
            },
            "edges": [["A", "B"]],
        }
    )
    want = reference(prof)
    # spatial at m = 4 (K = 1): 1 + 8 + 4 = 13 too; at m = 1: 3 + 1 + 3 * 3 = 13
    assert want == {"best": 7.75, "temporal": 7.75, "spatial": 13.0, "hybrid": None}


@pytest.mark.parametrize("seed", range(40))
def test_cycles_equal_the_baseline_two_cycle_model(seed):
    """A declared 2-cycle: co-located S (t_A(n, M) + t_B(n, M)); split with k = 1
    S (t_A(n_A, M) + t_B(n_B, M)); k >= 2 ring groups S k max(a, b) + min(a, b); a cycle node
    takes part in cuts like a leaf. The search's optimum per mode is the brute force's."""
    raw = _random_raw(np.random.default_rng(3000 + seed), cycle=True)
    if "cycles" not in raw:
        raw = _random_raw(np.random.default_rng(3000 + seed + 10_000), cycle=True)
    prof = load_profile(raw)
    want = reference(prof)
    try:
        plans = search_all(prof)
    except Exception as e:  # noqa: BLE001 - only "no plan fits" is allowed, and only then
        assert want["best"] is None, (e, want)
        return
    for mode in ("best", *MODES):
        p = plans[mode]
        assert (p is None) == (want[mode] is None), (mode, p, want)
        if p is not None:
            assert p.predicted_s == pytest.approx(want[mode], rel=1e-9, abs=1e-12), mode


def _rows(intervals) -> dict:
    """Per row (component, devices, kind): busy seconds (the union of its intervals) and the
    end of its last interval."""
    from loomrl.report import busy_seconds

    rows: dict = {}
    for i in intervals:
        rows.setdefault((i.component, tuple(i.devices), i.kind), []).append((i.start, i.end))
    return {k: (busy_seconds(v), max(e for _, e in v)) for k, v in rows.items()}


@pytest.mark.parametrize("seed", range(30))
def test_a_timeline_in_closed_form_keeps_every_rows_busy_seconds_and_end(seed, monkeypatch):
    """Past TIMELINE_CALLS calls an iteration is drawn in closed form, not call by call: each
    row keeps its busy seconds and its last end, and the iteration ends where the plan says."""
    import importlib

    sim = importlib.import_module("loomrl.plan.simulate")
    rng = np.random.default_rng(7000 + seed)
    prof = random_profile(
        rng, int(rng.integers(2, 5)), int(rng.integers(2, 9)), dag=bool(seed % 2), cycle=True
    )
    if rng.random() < 0.5 and prof.cycles:  # rings that end on their first member
        raw = prof.to_dict()
        raw["cycles"][0]["ends_with"] = raw["cycles"][0]["members"][0]
        raw["cycles"][0]["overlap_slowdown"] = 1.25
        prof = load_profile(raw)
    try:
        plans = search_all(prof)
    except Exception:  # noqa: BLE001 - nothing fits: nothing to draw
        return
    for plan in {id(p): p for p in plans.values() if p is not None}.values():
        fine = sim.predicted_timeline(plan.tree, prof, plan.micro_batch, limit=10**9)
        monkeypatch.setattr(sim, "TIMELINE_CALLS", -1)
        coarse = sim.predicted_timeline(plan.tree, prof, plan.micro_batch, limit=10**9)
        monkeypatch.undo()
        want, got = _rows(fine), _rows(coarse)
        assert set(got) == set(want)
        for row, (busy, end) in want.items():
            assert got[row][0] == pytest.approx(busy, rel=1e-9, abs=1e-9), row
            assert got[row][1] == pytest.approx(end, rel=1e-9, abs=1e-9), row
        top = max(i.end for i in coarse) + prof.iteration_overhead_s
        assert top == pytest.approx(plan.predicted_s, rel=1e-9)


# ----------------------------------------------------------------- `loomrl plan --json` fields


def _nodes(t: dict):
    yield t
    for c in t["children"]:
        yield from _nodes(c)


def _check_json(d: dict, prof) -> None:
    """PLANNER.md's JSON fields, with their types and what ties them together."""
    assert isinstance(d["predicted_s"], float) and math.isfinite(d["predicted_s"])
    m = d["micro_batch"]
    assert isinstance(m, int) and not isinstance(m, bool) and prof.batch % m == 0
    assert m in prof.granularities
    assert d["num_micro_batches"] == prof.batch // m and d["batch"] == prof.batch
    assert d["devices"] == prof.devices
    # modes: each pure mode's best predicted seconds, null where it has no plan
    assert set(d["modes"]) == set(MODES)
    for k, v in d["modes"].items():
        assert v is None or isinstance(v, float), (k, v)
        p = d["plans"][k]
        assert (p is None) == (v is None) and (p is None or p["predicted_s"] == v)
    best = min(v for v in d["modes"].values() if v is not None)
    assert d["predicted_s"] == best and d["modes"][d["mode"]] == best
    # the tree: the four keys on every node, only PLANNER.md's three ops (a cycle is its
    # members' leaves under a spatial or temporal node), devices as ascending contiguous indices
    leaves: dict[str, list[int]] = {}
    for t in _nodes(d["tree"]):
        assert {"op", "component", "devices", "children"} <= set(t), t
        assert t["op"] in ("leaf", "temporal", "spatial"), t
        devs = t["devices"]
        assert all(isinstance(x, int) for x in devs)
        assert devs == list(range(devs[0], devs[0] + len(devs))) if devs else True
        assert all(0 <= x < prof.devices for x in devs)
        if t["op"] in ("temporal", "spatial"):
            assert t["component"] is None and len(t["children"]) == 2
            a, b = (set(c["devices"]) for c in t["children"])
            assert a <= set(devs) and b <= set(devs)
            if t["op"] == "spatial":
                assert not a & b
        else:
            assert t["component"] in prof.components and t["children"] == []
            assert t["component"] not in leaves, "a component appears in two leaves"
            leaves[t["component"]] = devs
            assert len(devs) in prof.components[t["component"]].valid_devices
    # the mode read from the tree's ops alone, as a reader of the JSON would
    ops = {t["op"] for t in _nodes(d["tree"])} - {"leaf"}
    assert d["mode"] == ("hybrid" if len(ops) == 2 else ops.pop() if ops else "temporal")
    # assignment: every component -> the device indices it runs on, as in the tree
    assert d["assignment"] == leaves
    assert set(d["assignment"]) == set(prof.components)
    for devs in d["assignment"].values():
        assert devs == sorted(devs) and all(isinstance(x, int) for x in devs)


@pytest.mark.parametrize(
    "name", sorted(p.name for p in EXAMPLES.glob("*.yaml")) + ["random-0", "random-1", "random-2"]
)
def test_json_output_fields_types_and_consistency(name, capsys, tmp_path):
    if name.startswith("random"):
        raw = _random_raw(np.random.default_rng(int(name[-1]) + 11), cycle=True)
        raw["devices"] = 4
        for c in raw["components"].values():  # something always fits
            c["valid_devices"] = [1, 2]
            c["time"]["per_item"] = {1: 1.0, 2: 0.6}
            c["memory_gb"] = 10
            c.pop("cpu_cores", None)
        raw.pop("cpu_cores_per_node", None)
        path = tmp_path / "p.yaml"
        path.write_text(yaml.safe_dump(raw))
    else:
        path = EXAMPLES / name
    assert plan_main([str(path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    _check_json(d, load_profile(path))


def test_a_plan_of_zero_costs_is_a_plan_of_zero_seconds(capsys, tmp_path):
    path = tmp_path / "zero.yaml"
    path.write_text(
        "devices: 2\ndevice_memory_gb: 1\nbatch: 4\ngranularities: [1, 4]\ncomponents:\n"
        "  a: {valid_devices: [1, 2], time: {alpha: 0, per_item: {1: 0, 2: 0}}}\n"
        "  b: {valid_devices: [1], time: {per_item: {1: 0.0}}, memory_gb: 0}\n"
        "edges: [[a, b]]\n"
    )
    assert plan_main([str(path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["predicted_s"] == 0.0 and d["modes"]["temporal"] == 0.0
    _check_json(d, load_profile(path))


# ----------------------------------------------------------------- plan files


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".yml", ".plan"])
@pytest.mark.parametrize(
    "profile", ["ppo_actor_critic.yaml", "embodied_cycle_gpu_sim.yaml", "host-only-cycle"]
)
def test_a_saved_plan_loads_back_as_the_plan_printed(profile, suffix, tmp_path, capsys):
    """--save then Plan.load gives the plan --json printed (tree, m, time, devices, modes,
    timeline), and costing the loaded tree again gives its predicted time."""
    if profile == "host-only-cycle":
        path = tmp_path / "cyc.yaml"
        path.write_text(
            "devices: 4\ndevice_memory_gb: 80\nbatch: 8\ngranularities: [1, 2, 4, 8]\n"
            "components:\n"
            "  env: {valid_devices: [0, 1], time: {alpha: 0.01, per_item: {0: 0.05, 1: 0.04}},"
            " memory_gb: {0: 500, 1: 2}}\n"
            "  policy: {valid_devices: [1, 2], time: {alpha: 0.02, per_item: {1: 0.1, 2: 0.06}},"
            " memory_gb: {1: 10, 2: 6}, switch_s: 0.3}\n"
            "  actor: {valid_devices: [1, 2, 4], time: {alpha: 0.1, per_item: {1: 0.4, 2: 0.21,"
            " 4: 0.11}}, memory_gb: 30, switch_s: 0.5}\n"
            "edges: [[env, policy], [policy, env], [policy, actor]]\n"
            "cycles: [{members: [env, policy], steps: 5}]\n"
        )
    else:
        path = EXAMPLES / profile
    out = tmp_path / f"plan{suffix}"
    assert plan_main([str(path), "--json", "--save", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    loaded = Plan.load(out)
    assert loaded == Plan.from_dict(printed)
    again = loaded.to_dict()
    for key in again:
        assert again[key] == printed[key], key
    prof = load_profile(path)
    redo = fixed_plan(prof, loaded.tree, loaded.micro_batch)
    assert redo.predicted_s == loaded.predicted_s and redo.tree == loaded.tree
    if profile == "host-only-cycle":
        assert printed["assignment"]["env"] == []  # host CPU cores: no device


# ----------------------------------------------------------------- errors: one line, exit 2

_OK = (
    "devices: 4\ndevice_memory_gb: 80\nbatch: 8\ngranularities: [1, 2, 4, 8]\ncomponents:\n"
    "  a: {valid_devices: [1, 2], time: {alpha: 0.1, per_item: {1: 1.0, 2: 0.6}}, memory_gb: 10}\n"
    "  b: {valid_devices: [1, 2], time: {per_item: {1: 2.0, 2: 1.1}}, memory_gb: 5}\n"
    "edges: [[a, b]]\n"
)


def _edgeless(v: int) -> str:
    comps = "".join(
        f"  c{i}: {{valid_devices: [1], time: {{per_item: {{1: 1}}}}}}\n" for i in range(v)
    )
    return f"devices: 4\ndevice_memory_gb: 80\nbatch: 8\ncomponents:\n{comps}"


def _chain(v: int) -> str:
    edges = ", ".join(f"[c{i}, c{i + 1}]" for i in range(v - 1))
    return _edgeless(v) + f"edges: [{edges}]\n"


BAD = {
    # what the file holds -> (extra arguments, what the one line must say)
    "nan": (_OK.replace("alpha: 0.1", "alpha: .nan"), [], "components.a.time.alpha must be"),
    "inf": (_OK.replace("1: 2.0", "1: .inf"), [], "per_item[1] must be a number"),
    "negative time": (_OK.replace("1: 2.0", "1: -2.0"), [], ">= 0 and finite"),
    "negative alpha": (_OK.replace("alpha: 0.1", "alpha: -1"), [], "time.alpha must be"),
    "zero devices": (_OK.replace("devices: 4", "devices: 0"), [], "devices must be a whole"),
    "huge devices": (_OK.replace("devices: 4", "devices: 10000000000000"), [], "1,000,000"),
    "huge --devices": (_OK, ["--devices", "99999999999999"], "--devices must be at most"),
    "negative --devices": (_OK, ["--devices", "-1"], "--devices must be a positive integer"),
    "text --devices": (_OK, ["--devices", "many"], "argument --devices: invalid int value"),
    "no valid devices": (
        _OK.replace("a: {valid_devices: [1, 2]", "a: {valid_devices: []"),
        [],
        "valid_devices must be a non-empty list",
    ),
    "too few devices": (
        _OK.replace(
            "valid_devices: [1, 2], time: {alpha", "valid_devices: [8], time: {alpha"
        ).replace("{1: 1.0, 2: 0.6}", "{8: 0.1}"),
        [],
        "component 'a' needs at least 8 devices",
    ),
    "memory that cannot fit": (
        _OK.replace("memory_gb: 10", "memory_gb: 100"),
        [],
        "component 'a' needs 100 GB per device",
    ),
    "huge memory": (
        _OK.replace("memory_gb: 10", "memory_gb: 1e300"),
        [],
        "past the planner's limit",
    ),
    "cores oversubscribed": (
        _OK.replace("memory_gb: 10}", "memory_gb: 10, cpu_cores: 9}") + "cpu_cores_per_node: 8\n",
        [],
        "component 'a' needs 9 CPU cores",
    ),
    "duplicate names": (
        _OK.replace("  b: {", "  a: {"),
        [],
        "duplicate key 'components.a'",
    ),
    "undeclared cycle": (_OK.replace("[[a, b]]", "[[a, b], [b, a]]"), [], "not declared"),
    "three-cycle": (
        _OK.replace("[[a, b]]", "[[a, b], [b, a]]") + "cycles: [{members: [a, b, a], steps: 2}]\n",
        [],
        "exactly 2 components",
    ),
    "self-loop": (_OK.replace("[[a, b]]", "[[a, a]]"), [], "self-loop"),
    "unknown edge": (_OK.replace("[[a, b]]", "[[a, c]]"), [], "unknown component 'c'"),
    "empty graph": (
        "devices: 4\ndevice_memory_gb: 80\nbatch: 8\ncomponents: {}\n",
        [],
        "non-empty",
    ),
    "empty file": ("", [], "must be a mapping"),
    "syntax": ("devices: [4\n", [], "cannot parse"),
    "empty name": (_OK.replace("  b: {", "  '': {").replace("[[a, b]]", "[[a, '']]"), [], "name"),
    "name with a line break": (
        _OK.replace("  b: {", '  "x\\ny": {').replace("[[a, b]]", '[[a, "x\\ny"]]'),
        [],
        "not a usable component name",
    ),
    "granularity not dividing": (_OK.replace("[1, 2, 4, 8]", "[3]"), [], "does not divide"),
    "batch too large": (
        _OK.replace("batch: 8", "batch: 1000000000000000").replace("[1, 2, 4, 8]", "[1]"),
        [],
        "batch must be at most",
    ),
    "edgeless graph too large": (_edgeless(13), [], "graph too large to search"),
    "too many nodes": (_chain(64), [], "more than the planner's 63"),
    "unknown mode": (_OK, ["--mode", "fast"], "invalid choice"),
    "spatial on one device": (_OK, ["--mode", "spatial", "--devices", "1"], "no all-spatial"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_and_exit_2(case, tmp_path, capsys):
    text, extra, said = BAD[case]
    path = tmp_path / "p.yaml"
    path.write_text(text)
    try:
        rc = plan_main([str(path), *extra])
    except SystemExit as e:  # argparse's own refusals
        rc = e.code
    assert rc == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loomrl plan: "), err
    assert said in err and "Traceback" not in err, err


def test_unicode_names_plan_and_print(tmp_path, capsys):
    path = tmp_path / "u.yaml"
    path.write_text(
        _OK.replace("  a:", "  ロールアウト:").replace("[[a, b]]", "[[ロールアウト, b]]")
    )
    assert plan_main([str(path), "--json"]) == 0
    assert "ロールアウト" in json.loads(capsys.readouterr().out)["assignment"]
    assert plan_main([str(path)]) == 0
    assert "ロールアウト" in capsys.readouterr().out


def test_a_chain_of_63_components_is_planned(tmp_path, capsys):
    """The limit is on the graph's cuts, not its size: 63 nodes in a chain are 41,664 cuts."""
    from loomrl.plan.graph import search_size_problem

    names = [f"c{i}" for i in range(63)]
    assert search_size_problem(names, list(zip(names, names[1:], strict=False))) is None
    for v in range(1, 13):  # PLANNER.md: "fine for the <= 12 components of real RL"
        assert search_size_problem(names[:v], []) is None
    assert "531,441" in search_size_problem(names[:13], [])


def test_cut_pairs_count_what_the_search_enumerates():
    import random

    from loomrl.plan.graph import WorkGraph, _cut_pairs

    rng = random.Random(5)
    for _ in range(60):
        v = rng.randint(1, 8)
        names = [f"c{i}" for i in range(v)]
        p = rng.random()
        edges = [(a, b) for a, b in itertools.combinations(names, 2) if rng.random() < p]
        g = WorkGraph(names, edges)
        want = sum(len(g.cuts(s)) for s in g.reachable_subgraphs())
        assert _cut_pairs(WorkGraph(names, edges), 10**9) == want
        assert _cut_pairs(WorkGraph(names, edges), want - 1) > want - 1 if want else True


# ----------------------------------------------------------------- sizes that must not hang


def _play(ta, tb, steps, k, hop, last_b):
    """The ring played out call by call: when a's and b's last calls end (b's None if none)."""
    half, free_a, free_b, done, end_b = hop / 2, 0.0, 0.0, [0.0] * k, None
    for s in range(steps):
        for g in range(k):
            free_a = max(free_a, done[g] + (half if s else 0.0)) + ta
            if s + 1 == steps and not last_b:
                continue
            free_b = max(free_b, free_a + half) + tb
            done[g] = end_b = free_b
    return free_a, end_b


def test_ring_ends_in_closed_form_equal_the_ring_played_out():
    import random

    from loomrl.plan.cost import ring_ends

    rng = random.Random(11)
    for _ in range(4000):
        ta = rng.choice([rng.uniform(0, 3), 1.0, 0.0, rng.uniform(0.9, 1.1)])
        tb = rng.choice([rng.uniform(0, 3), ta, 0.0, rng.uniform(0.9, 1.1)])
        hop = rng.choice([0.0, rng.uniform(0, 4)])
        steps, k, last_b = rng.randint(1, 10), rng.randint(1, 10), rng.random() < 0.5
        a, b = ring_ends(ta, tb, steps, k, hop, last_b)
        pa, pb = _play(ta, tb, steps, k, hop, last_b)
        assert a == pytest.approx(pa, rel=1e-12, abs=1e-12)
        assert (b is None) == (pb is None) and (b is None or b == pytest.approx(pb, rel=1e-12))


def test_a_long_ring_that_ends_on_its_first_member_is_priced_at_once():
    """1,000 steps on 10**4 items, ending on the first member: each split and group count was
    played out call by call (21 s); the closed form gives the same time."""
    import time

    from loomrl.plan.cost import RING_PLAYOUT, ring_span

    raw = yaml.safe_load(_OK)
    raw["batch"], raw["granularities"] = 10_000, [10_000]
    raw["edges"] = [["a", "b"], ["b", "a"]]
    raw["cycles"] = [{"members": ["a", "b"], "steps": 1000, "ends_with": "a"}]
    t = time.perf_counter()
    plan = search_all(load_profile(raw))["spatial"]
    assert time.perf_counter() - t < 5
    assert plan.tree.groups * 1000 > RING_PLAYOUT  # priced by the closed form
    # a: 0.6 s an item on 2 devices, b 2 s on 1... whichever split won, the ring played out
    # call by call agrees
    assert ring_span(1.0, 2.0, 900, 5, 0.3, last_b=False) == pytest.approx(
        _play(1.0, 2.0, 900, 5, 0.3, False)[0], rel=1e-12
    )


def test_many_micro_batches_plan_at_once_with_a_short_timeline():
    """10**6 micro-batches were played out one by one for each returned plan's timeline
    (11 s, 600 MB); past TIMELINE_CALLS the timeline is drawn in closed form."""
    import time

    from loomrl.plan.simulate import MAX_TIMELINE

    raw = yaml.safe_load(_OK)
    raw["batch"], raw["granularities"] = 10**6, [1]
    t = time.perf_counter()
    plan = search_all(load_profile(raw))["spatial"]
    assert time.perf_counter() - t < 5
    assert plan.num_micro_batches == 10**6 and len(plan.timeline) <= MAX_TIMELINE
    assert max(i.end for i in plan.timeline) == pytest.approx(plan.predicted_s, rel=1e-12)


def test_simulate_refuses_what_it_cannot_play_out_in_time(tmp_path, capsys, monkeypatch):
    import loomrl.plan.cli as cli

    raw = yaml.safe_load(_OK)
    raw["batch"], raw["granularities"] = 1000, [1]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    # 200 iterations x 2,000 calls: past a limit of 100,000, said before any is played
    monkeypatch.setattr(cli, "SIM_CALLS", 100_000)
    assert plan_main([str(path), "--mode", "spatial", "--simulate"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "lower --iterations to 50 or fewer" in err
    assert plan_main([str(path), "--mode", "spatial", "--simulate", "--iterations", "50"]) == 0
    capsys.readouterr()
    # a channel of capacity 1 replays its upstream side: counted as it plays
    args = ["--mode", "spatial", "--simulate", "--iterations", "5", "--channel-capacity", "1"]
    assert plan_main([str(path), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "raise --channel-capacity or lower --iterations" in err


def test_no_temporal_plan_names_the_cycle_that_cannot_co_locate(tmp_path, capsys):
    raw = yaml.safe_load(_OK)
    raw["edges"] = [["a", "b"], ["b", "a"]]
    raw["cycles"] = [{"members": ["a", "b"], "steps": 2}]
    raw["device_memory_gb"] = 12  # 10 + 5 co-resident on one device, 10 + 5 on two
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert plan_main([str(path), "--mode", "temporal"]) == 2
    err = capsys.readouterr().err
    assert "no all-temporal plan fits: cycle 'a<->b' must run co-located" in err
    assert "10 + 5 = 15 GB per device, but device_memory_gb is 12" in err
    assert plan_main([str(path)]) == 0  # split, side by side, it fits


def test_names_the_terminal_cannot_encode_print_escaped(tmp_path):
    import os
    import subprocess

    path = tmp_path / "u.yaml"
    path.write_text(
        _OK.replace("  a:", "  ロールアウト:").replace("[[a, b]]", "[[ロールアウト, b]]")
    )
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    proc = subprocess.run(
        [sys.executable, "-m", "loomrl", "plan", str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "\\u30ed" in proc.stdout and "Traceback" not in proc.stderr
