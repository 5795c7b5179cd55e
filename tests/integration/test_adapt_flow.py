"""Run-time adaptation on real workers: a stale profile is noticed and refreshed without
changing outputs; a redeploy carries worker state and keeps groups that do not move."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest

from loomrl import Worker, wait
from loomrl.adapt import AdaptConfig, refresh_profile
from loomrl.flow import Flow
from loomrl.plan import load_profile
from loomrl.plan.plan import leaf, spatial, temporal
from loomrl.plan.search import fixed_plan
from loomrl.recipes.demo import DemoConfig, build, make_items

ROOT = Path(__file__).resolve().parents[2]
SMALL = DemoConfig(size=64, encode_reps=2, transform_reps=3, reduce_reps=1, resident_mb=8)


def _steps(cluster, profile, adapt: bool, steps: int = 4, plans=None, **plan_kw):
    flow = Flow(cluster)
    build(flow, SMALL)
    flow.plan(plan_kw.pop("placement", "auto"), profile=profile, **plan_kw)
    outs, events = [], []
    try:
        for step in range(steps):
            res = flow.run(make_items(step, 8))
            outs.append(res.outputs)
            if adapt:
                ev = flow.adapt(res, steps - step - 1, AdaptConfig(window=2))
                if ev is not None:
                    events.append((step, ev, res.measured_s))
                if plans is not None:
                    plans.append(flow.plan_)
    finally:
        flow.shutdown()
    return outs, events


def test_a_stale_profile_is_detected_and_refreshed_outputs_unchanged(cluster):
    prof = load_profile(ROOT / "examples/profiles/demo_matmul.yaml")
    # Costs from "another workload": encode 100x too cheap, transform 100x too dear.
    stale = refresh_profile(prof, {"encode": 0.01, "transform": 100.0})
    static, none = _steps(cluster, stale, adapt=False)
    adaptive, events = _steps(cluster, stale, adapt=True)
    assert none == [] and adaptive == static
    step, ev, measured = events[0]
    # Iteration 0 is fresh workers' warm-up; iterations 1 and 2 fill the window of 2.
    assert step == 2
    assert len(ev["errors"]) == 2 and all(e < -0.15 for e in ev["errors"])
    assert ev["factors"]["encode"] > 100 * ev["factors"]["transform"]
    assert abs(ev["refreshed_s"] - measured) < abs(ev["predicted_s"] - measured)
    assert ev["action"] in ("replan", "recalibrate")


def test_adaptation_re_plans_within_the_mode_and_micro_batch_asked_for(cluster):
    """Planned from the stale profile, then refreshed: the best plan overall is a hybrid at
    micro-batch 4, but a run that asked for spatial plans (or for micro-batch 8) keeps to it."""
    prof = load_profile(ROOT / "examples/profiles/demo_matmul.yaml")
    stale = refresh_profile(prof, {"encode": 0.01, "transform": 100.0})
    for kw, check in (
        ({"placement": "spatial"}, lambda p: p.mode == "spatial"),
        ({"micro_batch": 8}, lambda p: p.micro_batch == 8),
    ):
        plans: list = []
        _, events = _steps(cluster, stale, adapt=True, steps=5, plans=plans, **kw)
        assert events, kw
        assert all(check(p) for p in plans), (kw, [(p.mode, p.micro_batch) for p in plans])
        for _, ev, _ in events:
            assert (ev["action"] == "replan") != ("kept_because" in ev), ev
            if "placement" in kw:
                assert ev["best_mode"] == "spatial", ev


class Counter(Worker):
    def __init__(self):
        super().__init__()
        self.total = 0

    def add(self, items):
        self.total += len(items)
        return items

    def count(self):
        return self.total

    def save_state(self):
        return {"total": self.total}

    def load_state(self, state):
        self.total = state["total"]


class Sink(Worker):
    def sink(self, items):
        return items


TWO = load_profile(
    {
        "devices": 2,
        "device_memory_gb": 8,
        "batch": 4,
        "granularities": [2, 4],
        "components": {
            "a": {
                "valid_devices": [1, 2],
                "time": {"alpha": 0, "per_item": {1: 0.01, 2: 0.005}},
                "memory_gb": {1: 0.1, 2: 0.1},
            },
            "b": {
                "valid_devices": [1],
                "time": {"alpha": 0, "per_item": {1: 0.01}},
                "memory_gb": {1: 0.1},
            },
        },
        "edges": [["a", "b"]],
    }
)


def _a_then_b(flow, counter=None):
    """Groups a (a ``counter``, default Counter) -> b (Sink) of ``flow``, with the plan they
    start on (spatial, one device each) and the one a redeploy moves them to (temporal, a on
    two devices, b to device 0)."""
    a = flow.group(counter or Counter, name="a")
    b = flow.group(Sink, name="b")
    flow.chain(a.add, b.sink)
    first = fixed_plan(TWO, spatial(leaf("a", 1), leaf("b", 1)), 2)
    moved = fixed_plan(TWO, temporal(leaf("a", 2), leaf("b", 2, used=1)), 4)
    return a, b, first, moved


def test_redeploy_carries_state_and_keeps_groups_in_place(cluster):
    flow = Flow(cluster)
    a, b, first, moved = _a_then_b(flow)
    try:
        flow.apply(first)
        assert flow.run([1, 2, 3, 4]).outputs == [1, 2, 3, 4]
        assert wait(a.count()) == [4]
        b_actor = b.group.actors[0]
        flow._launch(first, keep=first.assignment())  # nothing moves: nothing restarts
        assert b.group.actors[0] is b_actor
        flow._launch(moved, keep=first.assignment())
        assert a.group.world_size == 2
        assert wait(a.count()) == [4, 4]  # rank 0's state, loaded on every new rank
        assert b.group.actors[0] is not b_actor  # b moved from device 1 to device 0
        flow.plan_ = moved
        assert flow.run([5, 6, 7, 8]).outputs == [5, 6, 7, 8]
    finally:
        flow.shutdown()


class Stuck(Counter):
    def save_state(self):
        time.sleep(60)  # a hang, as far as a 1 s limit goes
        return super().save_state()


@pytest.mark.slow
def test_a_redeploy_whose_state_never_comes_stops_naming_the_component(cluster):
    from loomrl.errors import IterationTimeout

    flow = Flow(cluster, iteration_timeout_s=1)
    _, _, first, moved = _a_then_b(flow, Stuck)
    try:
        flow.apply(first)
        with pytest.raises(IterationTimeout, match=r"redeploy: a\.save_state\(\) still running"):
            flow._launch(moved, keep=first.assignment())
    finally:
        flow.shutdown()


def test_run_adapt_writes_events_and_counts_replans(cluster, tmp_path):
    from loomrl.cli import main as cli

    stale = refresh_profile(
        load_profile(ROOT / "examples/profiles/demo_matmul.yaml"),
        {"encode": 0.01, "transform": 100.0},
    )
    prof_path = tmp_path / "stale.json"
    prof_path.write_text(json.dumps(stale.to_dict()))
    out = tmp_path / "run"
    args = [
        "run",
        str(ROOT / "examples/demo_matmul.yaml"),
        "steps=4",
        "batch=8",
        f"output_dir={out}",
        f"run.profile={prof_path}",
        "run.adapt=true",
        "run.adapt_window=2",
        "run.progress=false",
        "run.tensorboard=false",
        "demo.size=64",
        "demo.encode_reps=2",
        "demo.transform_reps=3",
        "demo.reduce_reps=1",
    ]
    assert cli(args) == 0
    events = [json.loads(x) for x in (out / "adapt.jsonl").read_text().splitlines()]
    assert events and events[0]["step"] == 2
    s = json.loads((out / "run_summary.json").read_text())
    assert s["replans"] == sum(e["action"] == "replan" for e in events)
    # What adaptation did and cost, in the summary: as many decisions as adapt.jsonl rows, and
    # the redeploys' stall as their rows say (4 iterations leave no room to return to a plan).
    a = s["adapt"]
    assert a["decisions"] == len(events) and a["replans"] == s["replans"]
    assert a["oscillations"] == 0
    assert a["redeploy_stall_s"] == pytest.approx(sum(e.get("stall_s", 0.0) for e in events))
    assert s["planning_s"] > 0  # searching and starting the workers took time, and it is said
    # The summary's prediction is the refreshed one, not the stale profile's.
    assert s["predicted_iteration_s"] == json.loads((out / "plan.json").read_text())["predicted_s"]
    assert s["predicted_iteration_s"] != stale_prediction(stale)
    # ... and is judged against the iterations run since it was made (a re-plan's first one,
    # its warm-up, left out), not the whole plan's median.
    last = events[-1]
    since = s["iteration_s"][last["step"] + 1 + (last["action"] == "replan") :]
    assert s["measured_since_prediction_s"] == (statistics.median(since) if since else None)
    # A profile for another batch size is refused before any worker starts.
    rest = [a for a in args if not a.startswith(("batch=", "output_dir="))]
    assert cli([*rest, f"output_dir={tmp_path / 'bad'}"]) == 2


def stale_prediction(profile) -> float:
    from loomrl.plan.search import search_all

    return search_all(profile)["best"].predicted_s
