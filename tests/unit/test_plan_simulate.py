"""The discrete-event simulator agrees with the algebra at zero variance; timelines draw."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from loomrl.plan import Node, evaluate, layout, load_profile, search, simulate
from loomrl.plan.cost import node_options
from loomrl.plan.graph import WorkGraph
from loomrl.plan.search import _option_node
from loomrl.plan.timeline import draw_timeline

sys.path.insert(0, str(Path(__file__).parent))
from _plan_random import random_profile  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "profiles"


def random_tree(rng, prof, graph, s, n):
    """A random valid plan tree of sub-graph s on at most n devices, or None."""
    if s & (s - 1) == 0:
        opts = node_options(prof, graph.nodes[s.bit_length() - 1].name, n, prof.batch)
        if not opts:
            return None
        return _option_node(
            prof, graph.nodes[s.bit_length() - 1].name, opts[int(rng.integers(len(opts)))]
        )
    cuts = graph.cuts(s)
    a = cuts[int(rng.integers(len(cuts)))]
    b = s & ~a
    if n >= 2 and rng.random() < 0.5:
        na = int(rng.integers(1, n))
        ta, tb = random_tree(rng, prof, graph, a, na), random_tree(rng, prof, graph, b, n - na)
        if ta is None or tb is None:
            return None
        return Node("spatial", ta.n + tb.n, children=(ta, tb))
    ta, tb = random_tree(rng, prof, graph, a, n), random_tree(rng, prof, graph, b, n)
    if ta is None or tb is None:
        return None
    return Node("temporal", max(ta.n, tb.n), children=(ta, tb))


def test_simulator_equals_algebra_at_zero_variance_on_random_plans():
    rng = np.random.default_rng(11)
    checked = 0
    for _ in range(400):
        v = int(rng.integers(1, 5))
        prof = random_profile(
            rng, v, int(rng.integers(2, 10)), dag=rng.random() < 0.3, cycle=rng.random() < 0.3
        )
        prof = load_profile({**prof.to_dict(), "device_memory_gb": 1e9})
        graph = WorkGraph.from_profile(prof)
        tree = random_tree(rng, prof, graph, graph.full, prof.devices)
        if tree is None:
            continue
        tree = layout(tree)
        for m in prof.granularities:
            ev = evaluate(tree, prof, m)
            if not ev.feasible:  # e.g. a cycle's ring groups do not divide m
                continue
            sim = simulate(tree, prof, micro_batch=m)
            assert sim.times[0] == pytest.approx(ev.predicted_s, rel=1e-9, abs=1e-9), (tree, m)
            big = simulate(tree, prof, micro_batch=m, channel_capacity=prof.batch)
            assert big.times[0] == pytest.approx(ev.predicted_s, rel=1e-9, abs=1e-9)
            checked += 1
    assert checked > 300


def test_long_tails_slow_a_pipeline_and_small_channels_block():
    prof = load_profile(EXAMPLES / "ppo_actor_critic.yaml")
    plan = search(prof)
    det = simulate(plan, prof)
    assert det.mean_s == pytest.approx(plan.predicted_s, rel=1e-9)
    noisy = simulate(plan, prof, sigma=0.5, iterations=30, seed=1)
    assert noisy.mean_s > plan.predicted_s  # max over noisy stages exceeds the max of means
    assert noisy.p95_s >= noisy.mean_s
    tight = simulate(plan, prof, sigma=0.5, iterations=30, seed=1, channel_capacity=1)
    assert tight.mean_s >= noisy.mean_s - 1e-9


def test_timeline_intervals_and_drawing(tmp_path):
    prof = load_profile(EXAMPLES / "embodied_cycle_gpu_sim.yaml")
    plan = search(prof)
    comps = {i.component for i in plan.timeline}
    assert comps == {"env", "policy", "actor_train"}
    assert max(i.end for i in plan.timeline) == pytest.approx(plan.predicted_s)
    assert any(i.kind == "switch" for i in plan.timeline)
    out = draw_timeline(plan, tmp_path / "t.png", title="plan")
    assert out.stat().st_size > 1000
    rows = [("worker 0", "rollout", 0.0, 1.0, "0"), ("worker 1", "train", 1.0, 2.5, "0")]
    assert draw_timeline(rows, tmp_path / "m.png").exists()
