"""The cost algebra on hand-computed 2- and 3-component examples, one rule at a time."""

from __future__ import annotations

import pytest

from loomrl.errors import PlanError
from loomrl.plan import cycle, evaluate, leaf, load_profile, search, search_all, spatial, temporal


def two(**over):
    """A -> B. t_A(n, x) = 1 + x * {1: 2, 2: 1}[n]; t_B(n, x) = x * {1: 1, 2: 0.5}[n]."""
    raw = {
        "devices": 2,
        "device_memory_gb": 80,
        "batch": 4,
        "granularities": [1, 2, 4],
        "components": {
            "A": {
                "valid_devices": [1, 2],
                "time": {"alpha": 1, "per_item": {1: 2, 2: 1}},
                "memory_gb": {1: 30, 2: 20},
                "switch_s": 0.5,
            },
            "B": {
                "valid_devices": [1, 2],
                "time": {"alpha": 0, "per_item": {1: 1, 2: 0.5}},
                "memory_gb": {1: 30, 2: 20},
                "switch_s": 0.25,
            },
        },
        "edges": [["A", "B"]],
    }
    raw.update(over)
    return load_profile(raw)


def three(**over):
    raw = {
        "devices": 2,
        "device_memory_gb": 80,
        "batch": 4,
        "granularities": [1, 2, 4],
        "components": {
            "A": {
                "valid_devices": [1, 2],
                "time": {"alpha": 1, "per_item": {1: 2, 2: 1}},
                "memory_gb": {1: 30, 2: 20},
                "switch_s": 0.5,
            },
            "B": {
                "valid_devices": [1, 2],
                "time": {"alpha": 0, "per_item": {1: 1, 2: 0.5}},
                "memory_gb": {1: 30, 2: 20},
                "switch_s": 0.25,
            },
            "C": {
                "valid_devices": [1, 2],
                "time": {"alpha": 0.5, "per_item": {1: 0.5, 2: 0.25}},
                "memory_gb": {1: 50, 2: 40},
                "switch_s": 1.0,
            },
        },
        "edges": [["A", "B"], ["B", "C"]],
    }
    raw.update(over)
    return load_profile(raw)


def test_phase_temporal_sums_and_pays_switch_once():
    p = two()
    ev = evaluate(temporal(leaf("A", 2), leaf("B", 2)), p, 4)
    # T_A = 1 + 4*1 = 5, T_B = 4*0.5 = 2, switches 0.5 + 0.25
    assert ev.predicted_s == pytest.approx(7.75)
    assert ev.memory == 20  # phase temporal: max, one side is offloaded


def test_spatial_stream_F_plus_K_minus_1_P_and_m_choice():
    p = two()
    tree = spatial(leaf("A", 1), leaf("B", 1))
    # m=1: F = 3 + 1, P = 3, K = 4 -> 13;  m=2: F = 5 + 2, P = 5, K = 2 -> 12;  m=4: 9 + 4 = 13
    assert evaluate(tree, p, 1).predicted_s == pytest.approx(13)
    assert evaluate(tree, p, 2).predicted_s == pytest.approx(12)
    assert evaluate(tree, p, 4).predicted_s == pytest.approx(13)
    plans = search_all(p)
    assert plans["spatial"].predicted_s == pytest.approx(12) and plans["spatial"].micro_batch == 2
    assert plans["best"].predicted_s == pytest.approx(7.75) and plans["best"].mode == "temporal"
    assert plans["spatial"].assignment() == {"A": [0], "B": [1]}


def test_switch_paid_once_however_deep_and_under_spatial_children():
    p = three(devices=3)
    # Temporal(A, Temporal(B, C)) on 2 devices: 5 + 2 + (0.5 + 4*0.25) + (0.5+0.25+1)
    t1 = evaluate(temporal(leaf("A", 2), temporal(leaf("B", 2), leaf("C", 2))), p, 4).predicted_s
    assert t1 == pytest.approx(5 + 2 + 1.5 + 1.75)
    # Temporal(Spatial(A, B), C): A and B are below the root temporal too, so they pay as well.
    # Spatial(A(1), B(1)) at m=2: 12 (see above); C on 2 devices: 1.5
    t2 = evaluate(temporal(spatial(leaf("A", 1), leaf("B", 1)), leaf("C", 2)), p, 2).predicted_s
    assert t2 == pytest.approx(12 + 1.5 + 1.75)
    # Spatial root: a co-resident (stream) temporal pays no switch.
    # Spatial(Temporal(A,B) on 1, C on 1), m=4: F = P = (9 + 4) + 2.5 ... F = 13 + 2.5, K = 1
    t3 = evaluate(spatial(temporal(leaf("A", 1), leaf("B", 1)), leaf("C", 1)), p, 4).predicted_s
    assert t3 == pytest.approx(13 + 2.5)


def test_stream_temporal_adds_memory_and_phase_temporal_takes_max():
    p = three(devices=3, device_memory_gb=55)
    co = evaluate(spatial(temporal(leaf("A", 1), leaf("B", 1)), leaf("C", 1)), p, 2)
    assert not co.feasible and "60 GB" in co.reason  # 30 + 30 co-resident
    ok = evaluate(spatial(temporal(leaf("A", 2), leaf("B", 2)), leaf("C", 1)), p, 2)
    assert ok.feasible and ok.memory == 50  # max(20 + 20, 50)
    ph = evaluate(temporal(leaf("A", 1), leaf("B", 1)), two(device_memory_gb=35), 4)
    assert ph.feasible and ph.memory == 30


def test_stream_temporal_F_and_P_add():
    p = three(devices=3)
    # m=2, K=2: Temporal(A(1), B(1)): F = P = 5 + 2 = 7; C(1) at 2 items: 1.5
    # Spatial: F = 8.5, P = max(7, 1.5) = 7 -> 8.5 + 7 = 15.5
    ev = evaluate(spatial(temporal(leaf("A", 1), leaf("B", 1)), leaf("C", 1)), p, 2)
    assert ev.predicted_s == pytest.approx(15.5)


def test_idle_devices_leaf_uses_best_valid_count_that_fits():
    p = two(devices=3)
    ev = evaluate(temporal(leaf("A", 3), leaf("B", 3)), p, 4)
    assert ev.predicted_s == pytest.approx(7.75)  # both run on 2 of the 3 devices
    assert [x.used for x in ev.tree.leaves()] == [2, 2]
    # When 2 devices do not fit memory, the leaf falls back to 1 device and idles the other.
    p2 = load_profile({**two().to_dict(), "device_memory_gb": 25})
    p2c = p2.to_dict()
    p2c["components"]["A"]["memory_gb"] = {1: 20, 2: 30}
    p2 = load_profile(p2c)
    ev2 = evaluate(leaf_tree := temporal(leaf("A", 2), leaf("B", 2)), p2, 4)
    assert leaf_tree.n == 2
    assert ev2.tree.leaves()[0].used == 1
    assert ev2.predicted_s == pytest.approx(9 + 2 + 0.75)


def test_spatial_needs_two_devices_and_backward_cut_is_rejected():
    p = two()
    with pytest.raises(PlanError, match="swap the children"):
        evaluate(spatial(leaf("B", 1), leaf("A", 1)), p, 2)
    one = two(devices=1)
    with pytest.raises(PlanError):
        search(one, mode="spatial")
    assert search(one).predicted_s == pytest.approx(9 + 4 + 0.75)


def test_cycle_colocated_split_and_ring():
    raw = two(
        edges=[["A", "B"], ["B", "A"]], cycles=[{"members": ["A", "B"], "steps": 2}]
    ).to_dict()
    p = load_profile(raw)
    # co-located on 2: 2 * (5 + 2) = 14
    assert evaluate(cycle("A", "B", 2), p, 4).predicted_s == pytest.approx(14)
    # split 1 | 1, k = 1: 2 * (9 + 4) = 26
    assert evaluate(cycle("A", "B", 2, split=(1, 1), groups=1), p, 4).predicted_s == pytest.approx(
        26
    )
    # k = 2: a = t_A(1, 2) = 5, b = t_B(1, 2) = 2: 2 * 2 * 5 + 2 = 22
    assert evaluate(cycle("A", "B", 2, split=(1, 1), groups=2), p, 4).predicted_s == pytest.approx(
        22
    )
    # k = 4: a = 3, b = 1: 2 * 4 * 3 + 1 = 25
    assert evaluate(cycle("A", "B", 2, split=(1, 1), groups=4), p, 4).predicted_s == pytest.approx(
        25
    )
    best = search(p)
    assert best.predicted_s == pytest.approx(14) and best.tree.op == "cycle"


def test_cpu_cores_of_concurrent_components_are_capped():
    raw = two().to_dict()
    raw["cpu_cores_per_node"] = 8
    raw["components"]["A"]["cpu_cores"] = {1: 6, 2: 8}
    raw["components"]["B"]["cpu_cores"] = {1: 4, 2: 4}
    p = load_profile(raw)
    ev = evaluate(spatial(leaf("A", 1), leaf("B", 1)), p, 2)
    assert not ev.feasible and "10 CPU cores" in ev.reason
    assert evaluate(temporal(leaf("A", 2), leaf("B", 2)), p, 4).feasible
    with pytest.raises(PlanError, match="all-spatial"):
        search(p, mode="spatial")
    raw["components"]["A"]["cpu_cores"] = {1: 9, 2: 9}
    with pytest.raises(PlanError, match="component 'A' needs 9 CPU cores"):
        search(load_profile(raw))


def test_memory_error_names_component_and_constraint():
    raw = two().to_dict()
    raw["device_memory_gb"] = 40
    raw["components"]["A"]["memory_gb"] = {1: 80, 2: 70}
    with pytest.raises(PlanError) as ei:
        search(load_profile(raw))
    assert str(ei.value) == (
        "component 'A' needs 70 GB per device on every valid device count [1, 2], but device_memory_gb is 40"
    )
    raw["components"]["A"]["memory_gb"] = 10
    raw["components"]["A"]["valid_devices"] = [4]
    raw["components"]["A"]["time"]["per_item"] = {4: 1}
    with pytest.raises(PlanError, match="needs at least 4 devices"):
        search(load_profile(raw))


def test_overlap_slowdown_stretches_only_overlapping_ring_groups():
    from loomrl.errors import ConfigError
    from loomrl.plan import exhaustive, layout, simulate

    raw = two(
        edges=[["A", "B"], ["B", "A"]],
        cycles=[{"members": ["A", "B"], "steps": 2, "overlap_slowdown": 1.5}],
    ).to_dict()
    p = load_profile(raw)
    assert p.to_dict()["cycles"][0]["overlap_slowdown"] == 1.5
    # Co-located and k = 1 alternate: nothing overlaps, nothing is stretched.
    assert evaluate(cycle("A", "B", 2), p, 4).predicted_s == pytest.approx(14)
    assert evaluate(cycle("A", "B", 2, split=(1, 1), groups=1), p, 4).predicted_s == pytest.approx(
        26
    )
    # k = 2: 1.5 * (2 * 2 * 5 + 2) = 33 (22 without the slowdown), now worse than k = 1.
    ring = cycle("A", "B", 2, split=(1, 1), groups=2)
    assert evaluate(ring, p, 4).predicted_s == pytest.approx(33)
    assert simulate(layout(ring), p, micro_batch=4).times[0] == pytest.approx(33)
    assert search(p).predicted_s == pytest.approx(exhaustive(p).predicted_s)
    raw["cycles"][0]["overlap_slowdown"] = 0.5
    with pytest.raises(ConfigError, match=r"cycles\[0\]\.overlap_slowdown must be a number >= 1"):
        load_profile(raw)


def test_hop_latency_is_hidden_by_ring_groups_but_not_by_alternation():
    from loomrl.errors import ConfigError
    from loomrl.plan import exhaustive, layout, simulate

    raw = two(
        edges=[["A", "B"], ["B", "A"]], cycles=[{"members": ["A", "B"], "steps": 2, "hop_s": 8}]
    ).to_dict()
    p = load_profile(raw)
    assert p.to_dict()["cycles"][0]["hop_s"] == 8
    cases = {
        # Alternating, every step pays the round trip; the first step starts without one:
        # 2 * (5 + 2 + 8) - 4 and 2 * (9 + 4 + 8) - 4.
        cycle("A", "B", 2): 26,
        cycle("A", "B", 2, split=(1, 1), groups=1): 38,
        # k = 2 (a = 5, b = 2): a group's round trip (5 + 2 + 8 = 15) outlasts A's two calls
        # (10), so a step takes 15: 15 + (2 - 1) * 5 + 5 + 2 + 4 = 31 (22 without the hop).
        cycle("A", "B", 2, split=(1, 1), groups=2): 31,
        # k = 4 (a = 3, b = 1): four calls of A (12) now cover the round trip (12).
        cycle("A", "B", 2, split=(1, 1), groups=4): 12 + 3 * 3 + 3 + 1 + 4,
    }
    for tree, want in cases.items():
        assert evaluate(tree, p, 4).predicted_s == pytest.approx(want), tree
        assert simulate(layout(tree), p, micro_batch=4).times[0] == pytest.approx(want), tree
    assert search(p).predicted_s == pytest.approx(exhaustive(p).predicted_s)
    for bad in (-1, "fast", True):
        raw["cycles"][0]["hop_s"] = bad
        with pytest.raises(ConfigError, match=r"cycles\[0\]\.hop_s must be a number >= 0"):
            load_profile(raw)
    raw["cycles"][0]["hop_s"] = 0
    assert "hop_s" not in load_profile(raw).to_dict()["cycles"][0]  # the baseline model


def test_min_group_keeps_ring_groups_at_the_sizes_costs_were_measured_at():
    from loomrl.errors import ConfigError
    from loomrl.plan import exhaustive, fixed_plan

    raw = two(
        edges=[["A", "B"], ["B", "A"]], cycles=[{"members": ["A", "B"], "steps": 10, "hop_s": 8}]
    ).to_dict()
    # Without a limit the ring hides the hop best at k = 4 (a = 3, b = 1, a step takes
    # max(4 * 3, 3 + 1 + 8) = 12): 9 * 12 + 3 * 3 + 3 + 1 + 4 = 125 s.
    assert search(load_profile(raw)).predicted_s == pytest.approx(125)
    raw["cycles"][0]["min_group"] = 2  # groups of at least 2 of the 4 items: k in {1, 2}
    p = load_profile(raw)
    assert p.cycles[0].group_counts(4) == [1, 2] and p.cycles[0].group_counts(1) == [1]
    assert p.to_dict()["cycles"][0]["min_group"] == 2
    best = search(p)
    # Alternation on both devices (10 * 7 + 9 * 8 + 4 = 146) now beats k = 2 (a step takes
    # max(2 * 5, 5 + 2 + 8) = 15: 9 * 15 + 5 + 5 + 2 + 4 = 151).
    assert best.predicted_s == pytest.approx(146)
    assert exhaustive(p).predicted_s == pytest.approx(146)
    # An explicit tree is evaluated as asked: the limit bounds the search, not fixed plans.
    assert evaluate(cycle("A", "B", 2, split=(1, 1), groups=4), p, 4).predicted_s == 125
    assert fixed_plan(p, cycle("A", "B", 2, split=(1, 1), groups=4), 4).predicted_s == 125
    for bad in (0, 1.5, "2", True):
        raw["cycles"][0]["min_group"] = bad
        with pytest.raises(ConfigError, match=r"cycles\[0\]\.min_group must be an integer >= 1"):
            load_profile(raw)
    raw["cycles"][0]["min_group"] = 1
    assert "min_group" not in load_profile(raw).to_dict()["cycles"][0]  # the baseline model


def test_ring_span_played_out_equals_the_closed_form():
    import random

    from loomrl.plan.cost import cycle_time, ring_span
    from loomrl.plan.profile import ComponentProfile

    rng = random.Random(3)
    for _ in range(300):
        ta, tb, hop = rng.uniform(0.1, 5), rng.uniform(0.1, 5), rng.choice([0, rng.uniform(0, 4)])
        steps, k = rng.randint(1, 6), rng.choice([1, 2, 3, 4, 6])
        a = ComponentProfile("a", (1,), ta, {1: 0.0}, {1: 1.0})
        b = ComponentProfile("b", (1,), tb, {1: 0.0}, {1: 1.0})
        closed = cycle_time(a, b, steps, 12, ("split", 1, 1, k), hop=hop)
        assert ring_span(ta, tb, steps, k, hop) == pytest.approx(closed)
        # Ending on a: every group's last call of b is left out, nothing else moves.
        assert ring_span(ta, tb, steps, k, hop, last_b=False) <= closed - tb + 1e-9


def test_a_cycle_that_ends_with_its_first_member_skips_the_last_call_of_the_second():
    from loomrl.errors import ConfigError
    from loomrl.plan import exhaustive, layout, simulate

    raw = two(
        edges=[["A", "B"], ["B", "A"]],
        cycles=[{"members": ["A", "B"], "steps": 2, "ends_with": "A"}],
    ).to_dict()
    p = load_profile(raw)
    assert p.to_dict()["cycles"][0]["ends_with"] == "A" and not p.cycles[0].last_b
    cases = {
        # A, B, A: co-located on 2, 5 + 2 + 5; split k = 1 on 1 | 1, 9 + 4 + 9.
        cycle("A", "B", 2): 12,
        cycle("A", "B", 2, split=(1, 1), groups=1): 22,
        # k = 2 (a = 5, b = 2): A runs 0-5, 5-10 (group 0's B 5-7), then 10-15, 15-20.
        cycle("A", "B", 2, split=(1, 1), groups=2): 20,
        # k = 4 (a = 3, b = 1): A is never idle, 8 calls of 3.
        cycle("A", "B", 2, split=(1, 1), groups=4): 24,
    }
    for tree, want in cases.items():
        assert evaluate(tree, p, 4).predicted_s == pytest.approx(want), tree
        assert simulate(layout(tree), p, micro_batch=4).times[0] == pytest.approx(want), tree
    assert search(p).predicted_s == pytest.approx(12)
    assert exhaustive(p).predicted_s == pytest.approx(12)
    raw["cycles"][0]["ends_with"] = "B"  # the baseline, written out
    assert "ends_with" not in load_profile(raw).to_dict()["cycles"][0]
    assert evaluate(cycle("A", "B", 2), load_profile(raw), 4).predicted_s == pytest.approx(14)
    raw["cycles"][0]["ends_with"] = "C"
    with pytest.raises(ConfigError, match=r"cycles\[0\]\.ends_with must name one of the members"):
        load_profile(raw)


def test_hop_latency_from_probe_samples():
    from loomrl.cycle import hop_latency

    samples = {
        "env": [(4, 0.010), (4, 0.012), (8, 0.020)],
        "env_busy": [(4, 0.008), (4, 0.009), (8, 0.017)],
        "policy": [(4, 0.008), (8, 0.010)],
        "policy_busy": [(4, 0.0075), (8, 0.0085)],
    }
    # env: 4 -> 0.011 - 0.0085 = 0.0025, 8 -> 0.003: median 0.00275; policy: 0.0005, 0.0015:
    # 0.001. A step pays one hand-off each way.
    assert hop_latency(samples) == pytest.approx(0.00375)
    # Busy longer than the chain (clock noise) is no negative latency; no busy samples: 0.
    assert hop_latency({**samples, "policy_busy": [(4, 0.009), (8, 0.012)]}) == pytest.approx(
        0.00275
    )
    assert hop_latency({"env": samples["env"], "policy": samples["policy"]}) == 0.0


def test_overlap_slowdown_from_probe_samples():
    from loomrl.cycle import overlap_slowdown

    env = [(4, 0.010), (4, 0.012), (8, 0.020)]
    pol = [(4, 0.008), (8, 0.010)]
    # both / slower side: 4 -> 0.0165 / 0.011 = 1.5, 8 -> 0.024 / 0.020 = 1.2; median 1.35
    both = [(4, 0.0165), (8, 0.024)]
    assert overlap_slowdown({"env": env, "policy": pol, "both": both}) == pytest.approx(1.35)
    # Overlap never makes a side faster than alone; no overlap samples: 1.
    assert overlap_slowdown({"env": env, "policy": pol, "both": [(4, 0.005)]}) == 1.0
    assert overlap_slowdown({"env": env, "policy": pol}) == 1.0


def test_pipe_hop_from_probe_samples():
    from loomrl.cycle import pipe_hop

    samples = {
        "pipe": [(4, 0.006), (4, 0.008), (8, 0.009)],
        "pipe_env_busy": [(4, 0.003), (8, 0.005)],
        "pipe_policy_busy": [(4, 0.001), (8, 0.002)],
    }
    # 4 -> 0.007 - 0.003 - 0.001 = 0.003, 8 -> 0.009 - 0.005 - 0.002 = 0.002: median 0.0025
    assert pipe_hop(samples) == pytest.approx(0.0025)
    # Busy longer than the step (clock noise) is no negative latency; no pipe samples: 0.
    assert pipe_hop({**samples, "pipe": [(4, 0.001), (8, 0.002)]}) == 0.0
    assert pipe_hop({"env": [(4, 0.01)], "policy": [(4, 0.01)]}) == 0.0


def _pipe_costs(pipe: bool) -> dict:
    """Chains of 10 ms a call (both at once: twice that, busy the same as alone), and pipe
    rollouts whose env is busy 1 ms + 0.5 ms per env a step, the policy 1 ms, plus a 2 ms
    round trip."""
    sizes = (4, 8)
    samples = {
        "env": [(x, 0.010) for x in sizes],
        "policy": [(x, 0.010) for x in sizes],
        "both": [(x, 0.020) for x in sizes],
        "env_busy": [(x, 0.001 + 0.0005 * x) for x in sizes],
        "policy_busy": [(x, 0.001) for x in sizes],
        "both_busy": [(x, 0.001 + 0.0005 * x) for x in sizes],
    }
    if pipe:
        samples["pipe_env_busy"] = [(x, 0.001 + 0.0005 * x) for x in sizes]
        samples["pipe_policy_busy"] = [(x, 0.001) for x in sizes]
        samples["pipe"] = [(x, 0.001 + 0.0005 * x + 0.001 + 0.002) for x in sizes]
    return {"samples": samples, "update_s": 0.5, "env_workers": 1, "handoff": "pipe"}


@pytest.mark.parametrize(
    ("hops", "hop", "k1", "k2"),
    [
        # busy: env 5 ms at 8 envs, 3 at 4; policy 1; hop 2. k = 1: a step is the pipe's
        # 8 ms (the first without its half hop): 9 * 8 + 5 + 1 + 1; k = 2: a step is
        # max(2 * 3, 3 + 1 + 2) = 6 ms: 9 * 6 + 3 + 3 + 1 + 1.
        ("busy_hops", 0.002, 0.079, 0.062),
        # env's intercept (1 ms) joins the hop: env 4 / 2 ms, hop 3: 9 * 8 + 4 + 1 + 1.5 and
        # 9 * max(4, 6) + 2 + 2 + 1 + 1.5
        ("fixed_hops", 0.003, 0.0785, 0.0605),
        # each call carries half the round trip (env 6 / 4 ms, policy 2), hop 0:
        # 10 * (6 + 2) and 10 * 2 * 4 + 2
        ("chained", 0.0, 0.080, 0.082),
    ],
)
def test_a_pipe_probe_prices_the_pipe_not_the_chains(hops, hop, k1, k2):
    from loomrl.cycle import cycle_profile
    from loomrl.plan.cost import cycle_time

    prof = cycle_profile(_pipe_costs(True), 8, 10, 2, 1, 4, hops=hops)
    env, pol, cyc = prof.components["env"], prof.components["policy"], prof.cycles[0]
    assert cyc.hop_s == pytest.approx(hop)
    # the chains' busy times overlap without slowing (their calls' ratio, 2, is hand-offs)
    assert cyc.overlap_slowdown == 1.0
    for k, want in ((1, k1), (2, k2)):
        got = cycle_time(env, pol, 10, 8, ("split", 1, 1, k), cyc.overlap_slowdown, cyc.hop_s)
        assert got == pytest.approx(want), k
    # Without the pipe samples the 10 ms chains price every step (k = 1: at least 10 * 20 ms).
    chained = cycle_profile(_pipe_costs(False), 8, 10, 2, 1, 4, hops=hops)
    c = chained.cycles[0]
    e, p = chained.components["env"], chained.components["policy"]
    assert cycle_time(e, p, 10, 8, ("split", 1, 1, 1), c.overlap_slowdown, c.hop_s) > 0.19
